//! [`WriteBehind`]: container bytes written after the metadata lock is released, and
//! durability deferred to the next sync.
//!
//! The block device appends every new chunk under its one metadata lock. Writing a full
//! write buffer to the container file (a 1 MiB `pwrite`, most of it the kernel allocating
//! and copying pages), syncing a container when it is sealed and syncing the shard directory
//! of a new one would all run under that lock, where the other worker cannot run its locked
//! work meanwhile (docs/BENCHMARKS.md, "Figures the design refers to"). With a
//! `WriteBehind`:
//!
//! - a full write buffer is *queued* instead of written; whoever appended it runs the queue
//!   ([`WriteBehind::run`]) after releasing its lock, so two workers write two buffers at
//!   once, each beside the other's locked work;
//! - a queued buffer stays readable from memory until its write has completed
//!   ([`WriteBehind::read`]), so a chunk is always in the writer's buffer, in the queue or in
//!   the file, never in between;
//! - sealing a container and creating one sync nothing; the container and the
//!   shard directory are recorded, and [`WriteBehind::sync`] (the data half of every FLUSH
//!   and checkpoint) writes what is still queued, then syncs the new shard directories and
//!   the sealed containers.
//!
//! What a crash can leave: the journal may reach the media before container bytes it refers
//! to, which replay checks for every stored chunk and every sealed container's trailer, and
//! treats as the torn tail.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use super::{ChunkLocation, ContainerId};
use crate::storage::{Storage, StorageFile};
use crate::{Error, Result};

/// Most bytes queued at once. Past it, a writer writes its buffer itself, under its lock as
/// without write-behind: this bounds the memory of a writer that appends much without
/// running the queue (a long maintenance pass).
pub const QUEUED_BYTES_MAX: usize = 16 << 20;
/// Buffers of completed writes kept for the next writers: a fresh 1 MiB buffer costs a
/// mapping and 256 page faults.
const SPARE_BUFFERS_MAX: usize = 4;

/// See the module documentation.
#[derive(Debug, Default)]
pub struct WriteBehind {
    state: Mutex<State>,
    /// Signalled whenever a queued write completes.
    completed: Condvar,
    /// Entries in `state.writes`, readable without the lock: most reads find none.
    queued: AtomicUsize,
}

#[derive(Debug, Default)]
struct State {
    /// In submission order.
    writes: Vec<QueuedWrite>,
    bytes: usize,
    /// The first failed write; every later sync fails with it. The failed write stays
    /// queued, so its bytes stay readable.
    failure: Option<String>,
    spare: Vec<Vec<u8>>,
    /// Sealed containers not yet synced.
    sealed: Vec<(ContainerId, Arc<dyn StorageFile>)>,
    /// Shard directories that gained a container not yet synced.
    shards: BTreeSet<String>,
}

#[derive(Debug)]
struct QueuedWrite {
    container: ContainerId,
    offset: u64,
    data: Arc<Vec<u8>>,
    file: Arc<dyn StorageFile>,
    /// A thread is writing it.
    taken: bool,
    failed: bool,
    /// It failed because the media is full: it stays queued (readable), the next sync tries
    /// it again, and no failure is recorded.
    full: bool,
}

impl WriteBehind {
    /// Queues `data` for writing at `offset` of container `container`. Gives `data` back when
    /// the queue is full: the caller then writes it itself.
    pub(crate) fn submit(
        &self,
        container: ContainerId,
        file: &Arc<dyn StorageFile>,
        offset: u64,
        data: Vec<u8>,
    ) -> Option<Vec<u8>> {
        let mut state = self.state.lock();
        if state.bytes + data.len() > QUEUED_BYTES_MAX {
            return Some(data);
        }
        state.bytes += data.len();
        state.writes.push(QueuedWrite {
            container,
            offset,
            data: Arc::new(data),
            file: Arc::clone(file),
            taken: false,
            failed: false,
            full: false,
        });
        self.queued.store(state.writes.len(), Ordering::Release);
        None
    }

    /// A buffer of a completed write, emptied, if one is kept.
    pub(crate) fn take_spare(&self) -> Option<Vec<u8>> {
        self.state.lock().spare.pop()
    }

    /// Writes every queued buffer no other thread is writing; call without holding the lock
    /// the buffers were appended under. Returns the first error of this call's writes.
    pub fn run(&self) -> Result<()> {
        // Most small writes fill no buffer: no lock to take then.
        if self.queued.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        let mut result = Ok(());
        while let Some(error) = self.write_one(|_| true) {
            if let Err(error) = error {
                if result.is_ok() {
                    result = Err(error);
                }
            }
        }
        result
    }

    /// Takes the first queued write that `wanted` accepts, no one is writing and whose
    /// container no one is writing to, writes it and retires it; None when there is none.
    ///
    /// Writes to one file take its inode lock in the kernel, so a second writer of the same
    /// container would only wait for the first (spinning, at first): it leaves the write to
    /// the thread writing that container, which takes it next, and goes back to requests.
    fn write_one(&self, wanted: impl Fn(ContainerId) -> bool) -> Option<Result<()>> {
        let (data, file, offset) = {
            let mut state = self.state.lock();
            let busy = |container| {
                state
                    .writes
                    .iter()
                    .any(|write| write.taken && write.container == container)
            };
            let position = state.writes.iter().position(|write| {
                !write.taken && !write.failed && wanted(write.container) && !busy(write.container)
            })?;
            let write = &mut state.writes[position];
            write.taken = true;
            (
                Arc::clone(&write.data),
                Arc::clone(&write.file),
                write.offset,
            )
        };
        let result = file.write_at(offset, &data);
        let mut state = self.state.lock();
        let position = state
            .writes
            .iter()
            .position(|write| Arc::ptr_eq(&write.data, &data))
            .expect("a taken write stays queued until its writer retires it");
        match &result {
            Ok(()) => {
                let write = state.writes.remove(position);
                state.bytes -= write.data.len();
                drop(data);
                if let Ok(mut buffer) = Arc::try_unwrap(write.data) {
                    if state.spare.len() < SPARE_BUFFERS_MAX {
                        buffer.clear();
                        state.spare.push(buffer);
                    }
                }
            }
            Err(error) => {
                let full = crate::storage::is_full(error);
                let write = &mut state.writes[position];
                write.taken = false;
                write.failed = true;
                write.full = full;
                if !full && state.failure.is_none() {
                    state.failure = Some(error.to_string());
                }
            }
        }
        self.queued.store(state.writes.len(), Ordering::Release);
        drop(state);
        self.completed.notify_all();
        Some(result)
    }

    /// Calls `read` with the stored bytes of the chunk at `location` if they are in a queued
    /// buffer; None when they are not (in the file, or in a writer's buffer).
    pub(crate) fn read_queued<R>(
        &self,
        location: &ChunkLocation,
        read: impl FnOnce(&[u8]) -> R,
    ) -> Option<R> {
        if self.queued.load(Ordering::Acquire) == 0 {
            return None;
        }
        let state = self.state.lock();
        let start = location.offset as u64;
        let end = start + location.stored_bytes as u64;
        let write = state.writes.iter().find(|write| {
            write.container == location.container
                && write.offset <= start
                && end <= write.offset + write.data.len() as u64
        })?;
        let from = (start - write.offset) as usize;
        Some(read(
            &write.data[from..from + location.stored_bytes as usize],
        ))
    }

    /// Waits until nothing of container `container` (or of any container, with None) is
    /// queued, writing what no one is writing. Fails if any queued write failed.
    pub(crate) fn wait(&self, container: Option<ContainerId>) -> Result<()> {
        let wanted = |id: ContainerId| container.is_none_or(|wanted| wanted == id);
        loop {
            // Write what no one is writing ourselves; errors are recorded in the failure.
            while self.write_one(wanted).is_some() {}
            let mut state = self.state.lock();
            if let Some(failure) = &state.failure {
                return Err(Error::io(
                    "writing container data",
                    std::io::Error::other(failure.clone()),
                ));
            }
            if state
                .writes
                .iter()
                .any(|write| write.full && wanted(write.container))
            {
                return Err(Error::io(
                    "writing container data",
                    std::io::Error::from_raw_os_error(libc::ENOSPC),
                ));
            }
            if !state.writes.iter().any(|write| wanted(write.container)) {
                return Ok(());
            }
            // Another thread is writing to a container we wait for.
            self.completed.wait(&mut state);
        }
    }

    /// Records a sealed container whose bytes are written (or queued) but not synced.
    pub(crate) fn sealed_unsynced(&self, container: ContainerId, file: Arc<dyn StorageFile>) {
        self.state.lock().sealed.push((container, file));
    }

    /// Records a shard directory that gained a container name not yet synced.
    pub(crate) fn created_in(&self, shard: String) {
        self.state.lock().shards.insert(shard);
    }

    /// True when anything is queued or awaits a sync.
    pub fn has_unsynced(&self) -> bool {
        let state = self.state.lock();
        !state.writes.is_empty() || !state.sealed.is_empty() || !state.shards.is_empty()
    }

    /// Makes everything handed over so far durable: writes what is queued, then syncs the
    /// new shard directories and the sealed containers. The open container's own bytes are
    /// its writer's to sync.
    pub(crate) fn sync(&self, storage: &dyn Storage) -> Result<()> {
        // Writes that found the media full are tried again: room may have come back.
        for write in &mut self.state.lock().writes {
            if write.full {
                write.failed = false;
                write.full = false;
            }
        }
        self.wait(None)?;
        let shards = std::mem::take(&mut self.state.lock().shards);
        for (index, shard) in shards.iter().enumerate() {
            if let Err(error) = storage.sync_directory(shard) {
                // Keep the rest pending, so a retry syncs them.
                self.state
                    .lock()
                    .shards
                    .extend(shards.iter().skip(index).cloned());
                return Err(error);
            }
        }
        let sealed = std::mem::take(&mut self.state.lock().sealed);
        for (index, (_, file)) in sealed.iter().enumerate() {
            if let Err(error) = file.sync_data() {
                self.state
                    .lock()
                    .sealed
                    .extend(sealed.iter().skip(index).cloned());
                return Err(error);
            }
        }
        Ok(())
    }
}
