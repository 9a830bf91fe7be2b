//! The file system engine: every file system of a repository over one chunk store.
//!
//! Layout of the face (`<repository>/fs/`):
//!
//! ```text
//! config.json         FaceConfig (fingerprint, containers), fixed at creation
//! meta/pages          chunk table, container table, fingerprint index
//! meta/manifest.0|1   page tables of the last two checkpoints; the user state holds the
//!                     CheckpointState and every file system's inodes (the namespace)
//! meta/journal-*      requests since the older of the two checkpoints
//! containers/         chunk data
//! control.sock        the mounting process's control socket (mode 0600)
//! ```
//!
//! The namespace (inodes, directory entries, extent maps, xattrs, monitor records) is held
//! in memory; each request changes it and the chunk store and appends one journal record of
//! all its changes ([`crate::changes`]). A checkpoint writes the whole namespace into the
//! manifest's user state, so replay after a crash starts from it.
//!
//! Write ordering (what makes an acknowledged fsync survive a crash):
//! 1. a write appends its data to the open container (buffered), then its journal record;
//! 2. fsync syncs the containers first, then the journal;
//! 3. replay applies a record only if the container bytes of every chunk it stores are
//!    intact ([`ChunkStore::stored_data_is_durable`]), and stops at the first that is not;
//! 4. a checkpoint syncs containers and journal, starts a new journal generation, then
//!    writes pages and the manifest; journals older than the previous checkpoint's are
//!    removed after it, retired containers two checkpoints later.

mod check;
mod compact;
mod data;
mod namespace;
pub(crate) mod pieces;
mod recovery;
mod repair;
mod salvage;
mod space;
mod stats;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use onecopy_core::chunk_store::{
    ChunkChange, ChunkId, ChunkStore, ChunkStoreState, NewChunk, StoreOutcome,
};
use onecopy_core::container::ContainerOptions;
use onecopy_core::fingerprint::{Fingerprint, FingerprintAlgorithm};
use onecopy_core::index::{FingerprintIndex, IndexOptions};
use onecopy_core::journal::Journal;
use onecopy_core::pages::PageStore;
use onecopy_core::storage::Storage;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::changes::{self, FileSystemRecord, FsChange, FsId};
use crate::error::{FsError, Result};
use crate::node::{Ino, Inode, Kind, Rank, LOST_CHUNK};
use crate::summary::SummaryBuilder;

pub use check::FACE_NAME;
pub(crate) use data::map_data;
pub use data::SeekWhence;
pub use namespace::{AttributeChanges, Caller, NewNode, NodeInfo, TimeChange, NAME_BYTES_MAX};
pub use recovery::OpenMode;
pub use repair::LOST_AND_FOUND;
pub use space::SpaceStats;
pub use stats::{ExtentPlace, FaceStats, FileRank, FsStats, RankStats};

pub(crate) const META_DIRECTORY: &str = "meta";
/// Changes in one journal record of a long operation (each encodes to at most about 150
/// bytes, so a record stays near 2.5 MiB, far below the journal's 16 MiB limit).
pub(crate) const CHANGES_PER_RECORD: usize = 16_384;
const _: () = assert!(CHANGES_PER_RECORD * 150 < onecopy_core::journal::RECORD_BYTES_MAX);
const CONFIG_FILE: &str = "config.json";

/// Settings fixed when the face is first used (`fs/config.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FaceConfig {
    pub fingerprint: FingerprintAlgorithm,
    pub containers: ContainerOptions,
}

impl Default for FaceConfig {
    fn default() -> Self {
        FaceConfig {
            fingerprint: FingerprintAlgorithm::Blake3,
            containers: ContainerOptions::default(),
        }
    }
}

/// Settings of one run.
#[derive(Clone, Debug)]
pub struct RuntimeOptions {
    pub index: IndexOptions,
    /// The piece index's ([`pieces`]): entries for the small pieces of big chunks.
    pub piece_index: IndexOptions,
    /// Clean metadata pages kept in memory.
    pub metadata_cache_pages: usize,
    /// A checkpoint starts once the journal holds this many bytes.
    pub checkpoint_journal_bytes: u64,
    /// Decoded chunks kept for reads (sequential reads of one big chunk read it once).
    pub chunk_cache_entries: usize,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        RuntimeOptions {
            index: IndexOptions::default(),
            piece_index: IndexOptions {
                // Pieces are looked up only by the deduplicator, in file order: a small
                // cache serves the runs of pieces a copied range brings.
                cache_bytes: 16 << 20,
                ..IndexOptions::default()
            },
            metadata_cache_pages: 4096,
            checkpoint_journal_bytes: 64 << 20,
            chunk_cache_entries: 64,
        }
    }
}

/// What every checkpoint saves besides pages and the namespace.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct CheckpointState {
    pub chunk_store: ChunkStoreState,
    /// The journal generation to replay after this checkpoint.
    pub journal_generation: u64,
    /// The generation the checkpoint before this one named: kept so that a fallback to the
    /// older manifest replays from there.
    pub previous_journal_generation: u64,
    pub next_fs_id: FsId,
    /// Next rank-queue stamp.
    pub stamp_next: u64,
    pub config: FaceConfig,
}

/// One file system in memory.
pub(crate) struct FileSystem {
    pub record: FileSystemRecord,
    pub inodes: HashMap<Ino, Inode>,
    pub next_ino: Ino,
    /// Rank queues Q_Rank0..Q_Rank2 (paper 3, Fig. 6): stamp -> inode, the largest stamp is
    /// the most recently used. Rank-3 files are in none (Q_Rank3 is virtual).
    pub queues: [BTreeMap<u64, Ino>; 3],
    /// Open handles per inode: an unlinked file lives until its last handle is released.
    pub open_handles: HashMap<Ino, u32>,
    /// Where the last read of each file ended (the I/O monitor's file position).
    pub read_positions: HashMap<Ino, u64>,
    /// How far the chunks of each file being read sequentially were read ahead (file
    /// offset): each range of a file is advised once.
    pub read_ahead_until: HashMap<Ino, u64>,
    /// Bumped by every change of a file's data, so that deduplication notices writes made
    /// while it read the file.
    pub data_versions: HashMap<Ino, u64>,
}

impl FileSystem {
    pub(crate) fn new(record: FileSystemRecord) -> FileSystem {
        FileSystem {
            record,
            inodes: HashMap::new(),
            next_ino: crate::node::ROOT + 1,
            queues: Default::default(),
            open_handles: HashMap::new(),
            read_positions: HashMap::new(),
            read_ahead_until: HashMap::new(),
            data_versions: HashMap::new(),
        }
    }

    pub(crate) fn inode(&self, ino: Ino) -> Result<&Inode> {
        self.inodes
            .get(&ino)
            .ok_or_else(|| FsError::posix(libc::ENOENT, format!("inode {ino}")))
    }

    /// Puts `inode` in place of what `ino` held, keeping the rank queues in step.
    pub(crate) fn set_inode(&mut self, ino: Ino, inode: Inode) {
        if let Some(old) = self.inodes.get(&ino) {
            let (rank, stamp) = (old.monitor.rank, old.monitor.stamp);
            self.dequeue(ino, rank, stamp);
        }
        if inode.attributes.kind == Kind::File && inode.monitor.rank < 3 {
            self.queues[inode.monitor.rank as usize].insert(inode.monitor.stamp, ino);
        }
        self.next_ino = self.next_ino.max(ino + 1);
        self.inodes.insert(ino, inode);
    }

    pub(crate) fn remove_inode(&mut self, ino: Ino) {
        if let Some(old) = self.inodes.remove(&ino) {
            self.dequeue(ino, old.monitor.rank, old.monitor.stamp);
        }
        self.read_positions.remove(&ino);
        self.read_ahead_until.remove(&ino);
        self.data_versions.remove(&ino);
    }

    /// Moves file `ino` from queue position `old` (rank, stamp) to `new`.
    pub(crate) fn requeue(&mut self, ino: Ino, old: (Rank, u64), new: (Rank, u64)) {
        self.dequeue(ino, old.0, old.1);
        if new.0 < 3 {
            self.queues[new.0 as usize].insert(new.1, ino);
        }
    }

    fn dequeue(&mut self, ino: Ino, rank: Rank, stamp: u64) {
        if rank < 3 && self.queues[rank as usize].get(&stamp) == Some(&ino) {
            self.queues[rank as usize].remove(&stamp);
        }
    }

    pub(crate) fn bump_version(&mut self, ino: Ino) {
        *self.data_versions.entry(ino).or_default() += 1;
    }

    pub(crate) fn version(&self, ino: Ino) -> u64 {
        self.data_versions.get(&ino).copied().unwrap_or(0)
    }
}

/// Sets the head of inode `ino` to `update`'s change of it, as one `InodeSet`.
pub(crate) fn update_inode(
    state: &mut State,
    fs: FsId,
    ino: Ino,
    update: impl FnOnce(&mut Inode),
) -> Result<()> {
    let mut head = state.system(fs)?.inode(ino)?.head();
    update(&mut head);
    state.push(FsChange::InodeSet {
        fs,
        ino,
        inode: Box::new(head),
    })
}

/// Everything guarded by the engine mutex.
pub(crate) struct State {
    pub pages: PageStore,
    /// `None` when opened read-only.
    pub journal: Option<Journal>,
    pub chunks: ChunkStore,
    /// Fingerprints of the small pieces of big chunks ([`pieces`]); derived data.
    pub pieces: FingerprintIndex,
    pub systems: BTreeMap<FsId, FileSystem>,
    pub next_fs_id: FsId,
    pub stamp_next: u64,
    /// Changes of the request being handled, in the order they were made.
    pub changes: Vec<FsChange>,
    /// What those changes change, for the record's tag.
    pub(crate) summary: SummaryBuilder,
    chunk_changes: Vec<ChunkChange>,
    payload: Vec<u8>,
    pub previous_generation: u64,
    /// Set when a request failed half way; every later request fails until reopen.
    failure: Option<String>,
    /// The free space, for refusing writes before the disk is full.
    pub(crate) space: space::SpaceGuard,
}

impl State {
    pub(crate) fn system(&self, fs: FsId) -> Result<&FileSystem> {
        self.systems
            .get(&fs)
            .ok_or_else(|| FsError::posix(libc::ENODEV, format!("file system {fs}")))
    }

    pub(crate) fn system_mut(&mut self, fs: FsId) -> Result<&mut FileSystem> {
        self.systems
            .get_mut(&fs)
            .ok_or_else(|| FsError::posix(libc::ENODEV, format!("file system {fs}")))
    }

    /// Lists `change` and applies it (listed first: should applying fail, the engine sees a
    /// change its journal does not hold and stops). The record's summary notes it first.
    pub(crate) fn push(&mut self, change: FsChange) -> Result<()> {
        let inode = |fs: &FsId, ino: &Ino| {
            self.systems
                .get(fs)
                .and_then(|system| system.inodes.get(ino))
        };
        let (removed, size_before, entry_before) = match &change {
            FsChange::Extent {
                fs,
                ino,
                offset,
                extent: None,
            } => (
                inode(fs, ino).and_then(|inode| inode.extents.get(offset).copied()),
                None,
                None,
            ),
            FsChange::InodeSet { fs, ino, .. } => (
                None,
                inode(fs, ino).map(|inode| inode.attributes.size),
                None,
            ),
            FsChange::Entry {
                fs, parent, name, ..
            } => (
                None,
                None,
                inode(fs, parent).and_then(|directory| directory.entries.get(name).copied()),
            ),
            _ => (None, None, None),
        };
        self.summary
            .note(&change, removed, size_before, entry_before);
        self.changes.push(change);
        let change = self.changes.last().expect("just pushed");
        apply(
            &mut self.pages,
            &mut self.chunks,
            &mut self.pieces,
            &mut self.systems,
            change,
        )
    }

    fn take_chunk_changes(&mut self) {
        for change in std::mem::take(&mut self.chunk_changes) {
            let change = FsChange::Chunk(change);
            self.summary.note(&change, None, None, None);
            self.changes.push(change);
        }
    }

    /// Lists chunk changes made outside [`State::push`] (compaction, a check's sweep).
    pub(crate) fn push_chunk_changes(&mut self, changes: Vec<ChunkChange>) {
        self.chunk_changes.extend(changes);
        self.take_chunk_changes();
    }

    /// Stores `data` (never all zeros); plain (no fingerprint) or deduplicated against the
    /// index by `fingerprint`. Returns the chunk id (with one new reference) and whether an
    /// existing chunk was referenced.
    pub(crate) fn store_chunk(
        &mut self,
        data: &[u8],
        fingerprint: Option<&Fingerprint>,
        owner: u64,
    ) -> Result<StoreOutcome> {
        let outcome = self.chunks.store(
            &mut self.pages,
            NewChunk {
                data,
                fingerprint,
                checksum: None,
            },
            owner,
            onecopy_core::chunk_store::unix_seconds(),
            &mut self.chunk_changes,
        );
        self.take_chunk_changes();
        Ok(outcome?)
    }

    /// Takes one more reference to chunk `id` (none for [`LOST_CHUNK`]).
    pub(crate) fn reference_chunk(&mut self, id: ChunkId) -> Result<()> {
        if id == LOST_CHUNK {
            return Ok(());
        }
        let result = self
            .chunks
            .reference(&mut self.pages, id, &mut self.chunk_changes);
        self.take_chunk_changes();
        Ok(result?)
    }

    /// Drops one reference to chunk `id` (none for [`LOST_CHUNK`]).
    pub(crate) fn release_chunk(&mut self, id: ChunkId) -> Result<()> {
        if id == LOST_CHUNK {
            return Ok(());
        }
        let result = self
            .chunks
            .release(&mut self.pages, id, &mut self.chunk_changes);
        self.take_chunk_changes();
        Ok(result?)
    }

    /// Appends the changes listed so far to the journal as one record.
    pub(crate) fn log_changes(&mut self) -> Result<()> {
        if self.changes.is_empty() {
            return Ok(());
        }
        let mut payload = std::mem::take(&mut self.payload);
        changes::encode(&self.changes, &mut payload);
        let tag = self.summary.finish().tag();
        let journal = self.journal.as_mut().expect("changes need a journal");
        let result = journal.append(&tag, &payload);
        self.payload = payload;
        result?;
        self.changes.clear();
        Ok(())
    }

    /// Ends the record being built when it holds [`CHANGES_PER_RECORD`] changes. Long
    /// operations (removing a big file's extents, deleting a file system) call it only where
    /// a crash leaves a state that opening completes: keeps every record far below the
    /// journal's record limit.
    pub(crate) fn log_if_large(&mut self) -> Result<()> {
        if self.changes.len() >= CHANGES_PER_RECORD {
            self.log_changes()?;
        }
        Ok(())
    }

    pub(crate) fn next_stamp(&mut self) -> u64 {
        self.stamp_next += 1;
        self.stamp_next
    }
}

/// Applies one change to the tables: the live path ([`State::push`]) and replay both come
/// here, so they cannot drift apart.
pub(crate) fn apply(
    pages: &mut PageStore,
    chunks: &mut ChunkStore,
    pieces: &mut FingerprintIndex,
    systems: &mut BTreeMap<FsId, FileSystem>,
    change: &FsChange,
) -> Result<()> {
    let corrupt =
        |detail: String| FsError::Core(onecopy_core::Error::corrupt("fs journal", detail));
    fn system_of(systems: &mut BTreeMap<FsId, FileSystem>, fs: FsId) -> Result<&mut FileSystem> {
        systems.get_mut(&fs).ok_or_else(|| {
            FsError::Core(onecopy_core::Error::corrupt(
                "fs journal",
                format!("a change names unknown file system {fs}"),
            ))
        })
    }
    match change {
        FsChange::Chunk(chunk) => chunks.apply(pages, chunk)?,
        FsChange::FileSystemSet(record) => match systems.get_mut(&record.id) {
            Some(system) => system.record = (**record).clone(),
            None => {
                systems.insert(record.id, FileSystem::new((**record).clone()));
            }
        },
        FsChange::FileSystemRemoved(fs) => {
            systems.remove(fs);
        }
        FsChange::InodeSet { fs, ino, inode } => {
            let target = system_of(systems, *fs)?;
            // The change carries the inode's head only; its maps stay as they are.
            let mut updated = (**inode).clone();
            if let Some(existing) = target.inodes.get_mut(ino) {
                updated.extents = std::mem::take(&mut existing.extents);
                updated.entries = std::mem::take(&mut existing.entries);
                updated.xattrs = std::mem::take(&mut existing.xattrs);
            }
            target.set_inode(*ino, updated);
        }
        FsChange::InodeRemoved { fs, ino } => {
            system_of(systems, *fs)?.remove_inode(*ino);
        }
        FsChange::Entry {
            fs,
            parent,
            name,
            child,
        } => {
            let target = system_of(systems, *fs)?;
            let directory = target
                .inodes
                .get_mut(parent)
                .ok_or_else(|| corrupt(format!("an entry names unknown directory {parent}")))?;
            match child {
                Some(child) => {
                    directory.entries.insert(name.clone(), *child);
                }
                None => {
                    directory.entries.remove(name);
                }
            }
        }
        FsChange::Extent {
            fs,
            ino,
            offset,
            extent,
        } => {
            let target = system_of(systems, *fs)?;
            let inode = target
                .inodes
                .get_mut(ino)
                .ok_or_else(|| corrupt(format!("an extent names unknown inode {ino}")))?;
            match extent {
                Some(extent) => {
                    assert!(extent.length > 0, "extents are never empty");
                    // The live path removes what a new extent covers first: extents never
                    // overlap.
                    let end = offset + extent.length as u64;
                    assert!(
                        inode
                            .extents
                            .range(..*offset)
                            .next_back()
                            .is_none_or(|(start, before)| start + before.length as u64 <= *offset),
                        "inode {ino}: the extent at {offset} overlaps the one before"
                    );
                    assert!(
                        inode.extents.range(*offset..end).next().is_none(),
                        "inode {ino}: the extent at {offset} overlaps the one after"
                    );
                    inode.extents.insert(*offset, *extent);
                }
                None => {
                    inode.extents.remove(offset);
                }
            }
        }
        FsChange::Xattr {
            fs,
            ino,
            name,
            value,
        } => {
            let target = system_of(systems, *fs)?;
            let inode = target
                .inodes
                .get_mut(ino)
                .ok_or_else(|| corrupt(format!("an xattr names unknown inode {ino}")))?;
            match value {
                Some(value) => {
                    inode.xattrs.insert(name.clone(), value.clone());
                }
                None => {
                    inode.xattrs.remove(name);
                }
            }
        }
        FsChange::Piece { fingerprint, value } => match value {
            Some(value) => {
                pieces.insert(pages, fingerprint, *value)?;
            }
            None => {
                pieces.remove(pages, fingerprint)?;
            }
        },
    }
    Ok(())
}

/// Where a chunk's bytes are: container and offset.
type ChunkKey = (u64, u32);

/// Decoded chunks kept for reads, keyed by location (container, offset): a location holds
/// one chunk's bytes for ever (containers are append-only and their ids never reused).
#[derive(Default)]
pub(crate) struct ChunkCache {
    entries: VecDeque<(ChunkKey, Arc<Vec<u8>>)>,
    limit: usize,
    /// Chunks a read is reading from their containers now.
    loading: HashMap<ChunkKey, Arc<Loading>>,
}

/// A chunk being read by one read for others: its bytes, or why there are none.
#[derive(Default)]
pub(crate) struct Loading {
    outcome: Mutex<Option<std::result::Result<Arc<Vec<u8>>, String>>>,
    ready: parking_lot::Condvar,
}

impl Loading {
    /// The bytes, once the reading read has them.
    pub(crate) fn wait(&self) -> std::result::Result<Arc<Vec<u8>>, String> {
        let mut outcome = self.outcome.lock();
        while outcome.is_none() {
            self.ready.wait(&mut outcome);
        }
        outcome.clone().expect("finished")
    }

    /// Ends the loading (the first outcome stays) and wakes the waiting reads.
    pub(crate) fn finish(&self, outcome: std::result::Result<Arc<Vec<u8>>, String>) {
        let mut current = self.outcome.lock();
        if current.is_none() {
            *current = Some(outcome);
        }
        self.ready.notify_all();
    }
}

impl ChunkCache {
    fn loading(&self, key: ChunkKey) -> Option<Arc<Loading>> {
        self.loading.get(&key).cloned()
    }

    fn start_loading(&mut self, key: ChunkKey) -> Arc<Loading> {
        let loading = Arc::new(Loading::default());
        let previous = self.loading.insert(key, Arc::clone(&loading));
        assert!(previous.is_none(), "one read loads a chunk at a time");
        loading
    }

    fn finish_loading(&mut self, key: ChunkKey, loading: &Arc<Loading>) {
        if self
            .loading
            .get(&key)
            .is_some_and(|current| Arc::ptr_eq(current, loading))
        {
            self.loading.remove(&key);
        }
    }

    fn contains(&self, key: ChunkKey) -> bool {
        self.entries.iter().any(|(k, _)| *k == key)
    }

    fn get(&mut self, key: ChunkKey) -> Option<Arc<Vec<u8>>> {
        let position = self.entries.iter().position(|(k, _)| *k == key)?;
        let entry = self.entries.remove(position).expect("found");
        let bytes = Arc::clone(&entry.1);
        self.entries.push_front(entry);
        Some(bytes)
    }

    fn put(&mut self, key: ChunkKey, bytes: Arc<Vec<u8>>) {
        if self.limit == 0 {
            return;
        }
        if self.entries.len() >= self.limit {
            self.entries.pop_back();
        }
        self.entries.push_front((key, bytes));
    }
}

/// The file system face of a repository. Shared by the FUSE threads, the control socket
/// and the deduplicator (`Arc<FsEngine>`).
pub struct FsEngine {
    storage: Arc<dyn Storage>,
    config: FaceConfig,
    mode: OpenMode,
    runtime: RuntimeOptions,
    pub(crate) state: Mutex<State>,
    cache: Arc<Mutex<ChunkCache>>,
    opened: Instant,
    /// Milliseconds after `opened` of the last foreground request.
    last_request_ms: AtomicU64,
    /// Foreground requests since open (the deduplicator yields when it changes).
    requests: AtomicU64,
    findings: Vec<onecopy_core::check::Finding>,
    /// Files whose lost bytes this open's repair reported (with its findings).
    salvaged_files: std::collections::BTreeSet<(FsId, Ino)>,
}

impl std::fmt::Debug for FsEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FsEngine")
            .field("storage", &self.storage.describe())
            .finish_non_exhaustive()
    }
}

/// Nanoseconds since the epoch now.
pub fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos() as i64)
}

impl FsEngine {
    /// True when opened read-only: every change is refused.
    pub fn is_read_only(&self) -> bool {
        self.mode == OpenMode::ReadOnly
    }

    /// The configuration fixed at creation.
    pub fn config(&self) -> &FaceConfig {
        &self.config
    }

    /// Where the face lives.
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    /// What opening found (damage and leftovers of journals and containers).
    pub fn open_findings(&self) -> &[onecopy_core::check::Finding] {
        &self.findings
    }

    /// Notes a foreground request (for idle detection and for the deduplicator to yield).
    pub fn note_request(&self) {
        let elapsed = self.opened.elapsed().as_millis() as u64;
        self.last_request_ms.store(elapsed, Ordering::Relaxed);
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Milliseconds since the last foreground request.
    pub fn idle_milliseconds(&self) -> u64 {
        let now = self.opened.elapsed().as_millis() as u64;
        now.saturating_sub(self.last_request_ms.load(Ordering::Relaxed))
    }

    /// Foreground requests since open.
    pub fn request_count(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Runs a change under the lock: `change` pushes its changes, which are then logged as
    /// one journal record. A failure after a change was made stops the engine (the journal
    /// and last checkpoint are intact and reopening recovers).
    pub(crate) fn mutate<T>(&self, change: impl FnOnce(&mut State) -> Result<T>) -> Result<T> {
        let mut state = self.state.lock();
        self.check_usable(&state)?;
        if state.journal.is_none() {
            return Err(FsError::posix(
                libc::EROFS,
                "the file system face is open read-only",
            ));
        }
        let result = change(&mut state).and_then(|value| {
            self.log_changes(&mut state)?;
            Ok(value)
        });
        match result {
            Ok(value) => {
                self.checkpoint_if_due(&mut state)?;
                Ok(value)
            }
            Err(error) => {
                if !state.changes.is_empty() {
                    state.failure = Some(error.to_string());
                }
                Err(error)
            }
        }
    }

    fn check_usable(&self, state: &State) -> Result<()> {
        match &state.failure {
            Some(reason) => Err(FsError::Failed(reason.clone())),
            None => Ok(()),
        }
    }

    fn log_changes(&self, state: &mut State) -> Result<()> {
        state.log_changes()
    }

    /// Makes every completed request durable: containers first, then the journal (with
    /// the reserve's room when the disk is full).
    pub fn flush(&self) -> Result<()> {
        let mut state = self.state.lock();
        self.check_usable(&state)?;
        self.with_reserve(&mut state, |_, state| flush_locked(state))
    }

    /// Writes a checkpoint now.
    pub fn checkpoint(&self) -> Result<()> {
        let mut state = self.state.lock();
        self.check_usable(&state)?;
        if state.journal.is_none() {
            return Ok(());
        }
        let result = self.with_reserve(&mut state, |engine, state| engine.checkpoint_locked(state));
        if let Err(error) = &result {
            state.failure = Some(error.to_string());
        }
        result
    }

    fn checkpoint_if_due(&self, state: &mut State) -> Result<()> {
        let journal_bytes = state.journal.as_ref().map_or(0, Journal::bytes);
        // Without room the checkpoint waits; the journal holds the changes meanwhile.
        if journal_bytes >= self.runtime.checkpoint_journal_bytes
            && self.room_for_checkpoint(state)?
        {
            let result = self.checkpoint_locked(state);
            if let Err(error) = &result {
                state.failure = Some(error.to_string());
            }
            result?;
        }
        Ok(())
    }

    pub(crate) fn checkpoint_locked(&self, state: &mut State) -> Result<()> {
        let journal = state.journal.as_mut().expect("checkpoints need a journal");
        // Data first: everything the pages and namespace refer to must be on the media
        // before the manifest that refers to it; the journal too, for a fallback.
        state.chunks.sync_data()?;
        journal.sync()?;
        let current = journal.generation();
        journal.rotate(current + 1)?;
        let saved = CheckpointState {
            chunk_store: state.chunks.state().clone(),
            journal_generation: current + 1,
            previous_journal_generation: state.previous_generation,
            next_fs_id: state.next_fs_id,
            stamp_next: state.stamp_next,
            config: self.config.clone(),
        };
        let bytes = recovery::encode_checkpoint(&saved, &state.systems);
        state.space.namespace_bytes = bytes.len() as u64;
        state.chunks.prepare_checkpoint(&mut state.pages)?;
        state.pieces.prepare_checkpoint(&mut state.pages)?;
        state.pages.checkpoint(&bytes)?;
        let storage = self.storage.as_ref();
        for generation in Journal::generations(storage, META_DIRECTORY)? {
            if generation < state.previous_generation {
                Journal::remove(storage, META_DIRECTORY, generation)?;
            }
        }
        state.previous_generation = current + 1;
        state.chunks.remove_retired_containers(&mut state.pages)?;
        Ok(())
    }

    /// Checkpoints so that the next open replays nothing.
    pub fn shutdown(&self) -> Result<()> {
        self.checkpoint()
    }

    /// The id of the file system named `name`.
    pub fn find(&self, name: &str) -> Result<FsId> {
        let state = self.state.lock();
        state
            .systems
            .values()
            .find(|system| system.record.name == name && !system.record.deleting)
            .map(|system| system.record.id)
            .ok_or_else(|| FsError::NoFileSystem {
                name: name.to_string(),
            })
    }

    /// Every file system's record, by name.
    pub fn list(&self) -> Vec<FileSystemRecord> {
        let state = self.state.lock();
        let mut records: Vec<FileSystemRecord> = state
            .systems
            .values()
            .filter(|system| !system.record.deleting)
            .map(|system| system.record.clone())
            .collect();
        records.sort_by(|a, b| a.name.cmp(&b.name));
        records
    }

    /// True when inode `ino` of `fs` existed and was removed (its last link and handle
    /// gone): the kernel's writeback cache may still send its times or pages.
    pub fn was_removed(&self, fs: FsId, ino: Ino) -> bool {
        let state = self.state.lock();
        state
            .systems
            .get(&fs)
            .is_some_and(|system| ino < system.next_ino && !system.inodes.contains_key(&ino))
    }

    /// The record of file system `fs`.
    pub fn record(&self, fs: FsId) -> Result<FileSystemRecord> {
        Ok(self.state.lock().system(fs)?.record.clone())
    }
}

/// Syncs containers, then the journal.
pub(crate) fn flush_locked(state: &mut State) -> Result<()> {
    let Some(journal) = state.journal.as_mut() else {
        return Ok(());
    };
    state.chunks.sync_data()?;
    journal.sync()?;
    Ok(())
}
