//! File data: write (plain, rank 0), read (with the I/O monitor), truncate, holes.
//!
//! A write punches the range it covers out of the extent map (splitting extents at its ends:
//! the parts outside keep referencing their chunk, one reference each) and maps a new plain
//! chunk there: a write never changes a stored chunk, so a chunk another file shares stays as
//! it is (paper 3 §4.3, map replication). Data that is all zeros is not stored: its range
//! becomes a hole.

use std::sync::Arc;

use onecopy_core::chunk_store::{ChunkId, ChunkRead, StoreOutcome};
use onecopy_core::container::{is_zero, CHUNK_HEADER_BYTES};
use onecopy_core::storage::StorageFile;

use crate::changes::{FsChange, FsId};
use crate::error::{FsError, Result};
use crate::node::{Extent, Ino, Kind};
use crate::options::CHUNK_BYTES_MAX;

use super::update_inode;
use parking_lot::Mutex;

use super::{now_ns, ChunkCache, FsEngine, Loading, State};

/// Largest file (the kernel's limit for 64-bit offsets, rounded to what extents address).
pub const FILE_BYTES_MAX: u64 = 1 << 50;
/// Bytes of a file after a sequential read whose chunks are read ahead.
pub const READ_AHEAD_BYTES: u64 = 4 << 20;

/// `lseek` for data or holes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeekWhence {
    Data,
    Hole,
}

/// Removes the mapping of `[from, to)` of file `ino`, releasing or splitting extents. A range
/// of more than [`super::CHANGES_PER_RECORD`] extents is logged in several records (only
/// truncation and removal punch such ranges; a write's range holds at most 256).
pub(crate) fn punch(state: &mut State, fs: FsId, ino: Ino, from: u64, to: u64) -> Result<()> {
    if from >= to {
        return Ok(());
    }
    let overlapping: Vec<(u64, Extent)> = {
        let inode = state.system(fs)?.inode(ino)?;
        inode
            .extents
            .range(..to)
            .rev()
            .take_while(|(start, extent)| **start + extent.length as u64 > from)
            .map(|(start, extent)| (*start, *extent))
            .collect()
    };
    for (start, extent) in overlapping {
        state.log_if_large()?;
        let end = start + extent.length as u64;
        state.push(FsChange::Extent {
            fs,
            ino,
            offset: start,
            extent: None,
        })?;
        let mut kept = Vec::new();
        if start < from {
            kept.push(extent.slice(start, start, from));
        }
        if end > to {
            kept.push(extent.slice(start, to, end));
        }
        match kept.len() {
            0 => state.release_chunk(extent.chunk)?,
            1 => {}
            _ => state.reference_chunk(extent.chunk)?,
        }
        for (offset, piece) in kept {
            state.push(FsChange::Extent {
                fs,
                ino,
                offset,
                extent: Some(piece),
            })?;
        }
    }
    Ok(())
}

/// Maps `data` at `offset` of `ino` as a new chunk: plain, or deduplicated by `fingerprint`.
/// Returns what storing did (`None` for zeros, which become a hole).
pub(crate) fn map_data(
    state: &mut State,
    fs: FsId,
    ino: Ino,
    offset: u64,
    data: &[u8],
    fingerprint: Option<&onecopy_core::fingerprint::Fingerprint>,
) -> Result<Option<StoreOutcome>> {
    assert!(
        data.len() as u64 <= CHUNK_BYTES_MAX,
        "chunks are at most 1 MiB"
    );
    let end = offset + data.len() as u64;
    if data.is_empty() || is_zero(data) {
        punch(state, fs, ino, offset, end)?;
        return Ok(None);
    }
    // Stored (or referenced) before the old extents are released: a chunk the range maps
    // already keeps its bytes and index entry instead of being freed and stored again.
    let outcome = state.store_chunk(data, fingerprint, ino)?;
    punch(state, fs, ino, offset, end)?;
    state.push(FsChange::Extent {
        fs,
        ino,
        offset,
        extent: Some(Extent {
            chunk: outcome.id,
            chunk_offset: 0,
            length: data.len() as u32,
            plain: fingerprint.is_none(),
        }),
    })?;
    Ok(Some(outcome))
}

/// Marks file `ino` modified at `now`: back to rank 0, at the top of Q_Rank0 (paper 3 §4.2.2).
fn note_modified(state: &mut State, fs: FsId, ino: Ino, size: u64, now: i64) -> Result<()> {
    note_modified_times(state, fs, ino, size, now, true)
}

/// [`note_modified`]; with `set_times` false, the POSIX modification and change times stay
/// (the kernel's writeback cache keeps them and sends them with a setattr).
fn note_modified_times(
    state: &mut State,
    fs: FsId,
    ino: Ino,
    size: u64,
    now: i64,
    set_times: bool,
) -> Result<()> {
    let stamp = state.next_stamp();
    state.system_mut(fs)?.bump_version(ino);
    update_inode(state, fs, ino, |inode| {
        inode.attributes.size = size;
        if set_times {
            inode.attributes.mtime_ns = now;
            inode.attributes.ctime_ns = now;
        }
        inode.monitor.modify_ns = now;
        inode.monitor.access_ns = now;
        inode.monitor.rank = 0;
        inode.monitor.stamp = stamp;
    })
}

/// Truncates or extends file `ino` to `size` (extension leaves a hole).
pub(crate) fn truncate_locked(
    state: &mut State,
    fs: FsId,
    ino: Ino,
    size: u64,
    now: i64,
) -> Result<()> {
    if size > FILE_BYTES_MAX {
        return Err(FsError::posix(libc::EFBIG, "truncate"));
    }
    let old = state.system(fs)?.inode(ino)?.attributes.size;
    // The size first: removing a big file's extents takes several records, and a crash
    // between them leaves extents past the end, which opening removes.
    note_modified(state, fs, ino, size, now)?;
    if size < old {
        punch(state, fs, ino, size, old)?;
    }
    Ok(())
}

fn file(state: &State, fs: FsId, ino: Ino) -> Result<()> {
    match state.system(fs)?.inode(ino)?.attributes.kind {
        Kind::File => Ok(()),
        Kind::Directory => Err(FsError::posix(libc::EISDIR, "file data")),
        _ => Err(FsError::posix(libc::EINVAL, "file data")),
    }
}

/// One piece of a read: where in the output, and how to get the chunk's bytes.
enum Piece {
    /// Bytes of a chunk already in memory.
    Ready {
        at: usize,
        bytes: Arc<Vec<u8>>,
        from: usize,
        length: usize,
    },
    /// A chunk to read from its container outside the lock; other reads of it wait.
    File {
        at: usize,
        read: ChunkRead,
        raw: Vec<u8>,
        from: usize,
        length: usize,
        loading: Loader,
    },
    /// A chunk another read is reading: its bytes once that read has them.
    Wait {
        at: usize,
        loading: Arc<Loading>,
        from: usize,
        length: usize,
    },
}

/// The read that reads a chunk for all that want it: whatever happens to it (an error, an
/// earlier piece failing), the chunk stops loading when it goes, so no reader waits for
/// ever.
struct Loader {
    cache: Arc<Mutex<ChunkCache>>,
    key: (u64, u32),
    loading: Arc<Loading>,
    finished: bool,
}

impl Loader {
    /// Hands `bytes` to the cache and to the reads waiting for them.
    fn finish(mut self, bytes: Arc<Vec<u8>>) {
        {
            let mut cache = self.cache.lock();
            cache.finish_loading(self.key, &self.loading);
            cache.put(self.key, Arc::clone(&bytes));
        }
        self.loading.finish(Ok(bytes));
        self.finished = true;
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        self.cache.lock().finish_loading(self.key, &self.loading);
        self.loading
            .finish(Err("the read that was reading the chunk failed".to_string()));
    }
}

/// A range to read ahead: the container file, the offset and the bytes.
type ReadAhead = (Arc<dyn StorageFile>, u64, u64);

impl FsEngine {
    /// Writes `data` at `offset` of file `ino` plainly (rank 0); returns the bytes written.
    pub fn write(&self, fs: FsId, ino: Ino, offset: u64, data: &[u8]) -> Result<usize> {
        self.write_with_times(fs, ino, offset, data, true)
    }

    /// [`FsEngine::write`]; with `set_times` false the file's modification and change times
    /// stay as they are (the kernel's writeback cache sends them itself; a write it sends
    /// late must not overwrite a time a program set since). The I/O monitor's modification
    /// time is set either way.
    pub fn write_with_times(
        &self,
        fs: FsId,
        ino: Ino,
        offset: u64,
        data: &[u8],
        set_times: bool,
    ) -> Result<usize> {
        let end = offset
            .checked_add(data.len() as u64)
            .filter(|&end| end <= FILE_BYTES_MAX)
            .ok_or_else(|| FsError::posix(libc::EFBIG, "write"))?;
        self.mutate(|state| {
            file(state, fs, ino)?;
            self.admit(state, data.len() as u64)?;
            for (index, piece) in data.chunks(CHUNK_BYTES_MAX as usize).enumerate() {
                let at = offset + (index as u64) * CHUNK_BYTES_MAX;
                map_data(state, fs, ino, at, piece, None)?;
            }
            let size = state.system(fs)?.inode(ino)?.attributes.size.max(end);
            note_modified_times(state, fs, ino, size, now_ns(), set_times)?;
            Ok(data.len())
        })
    }

    /// Removes the mapping of `[offset, offset + length)` (FALLOC_FL_PUNCH_HOLE), or with
    /// `extend` makes the file at least that long (plain fallocate: holes stay holes).
    pub fn allocate(
        &self,
        fs: FsId,
        ino: Ino,
        offset: u64,
        length: u64,
        punch_hole: bool,
    ) -> Result<()> {
        let end = offset
            .checked_add(length)
            .filter(|&end| end <= FILE_BYTES_MAX)
            .ok_or_else(|| FsError::posix(libc::EFBIG, "fallocate"))?;
        self.mutate(|state| {
            file(state, fs, ino)?;
            let size = state.system(fs)?.inode(ino)?.attributes.size;
            if punch_hole {
                punch(state, fs, ino, offset, end.min(size))?;
                note_modified(state, fs, ino, size, now_ns())
            } else if end > size {
                note_modified(state, fs, ino, end, now_ns())
            } else {
                Ok(())
            }
        })
    }

    /// Reads up to `size` bytes at `offset` of file `ino`, noting the read in the I/O
    /// monitor. Chunk bytes are read outside the engine lock.
    pub fn read(&self, fs: FsId, ino: Ino, offset: u64, size: u32) -> Result<Vec<u8>> {
        Ok(self.read_range(fs, ino, offset, size as u64, true)?.0)
    }

    /// [`FsEngine::read`] without the I/O monitor: for measuring the monitor's cost.
    pub fn read_unmonitored(&self, fs: FsId, ino: Ino, offset: u64, size: u32) -> Result<Vec<u8>> {
        Ok(self.read_range(fs, ino, offset, size as u64, false)?.0)
    }

    /// Reads `[offset, offset + length)` of file `ino` for the deduplicator (not noted by the
    /// monitor), with the file's data version; `None` when the file is gone.
    pub(crate) fn read_for_dedup(
        &self,
        fs: FsId,
        ino: Ino,
        offset: u64,
        length: u64,
    ) -> Result<Option<(Vec<u8>, u64)>> {
        match self.read_range(fs, ino, offset, length, false) {
            Ok(found) => Ok(Some(found)),
            // A file with lost bytes is left alone until they are written again.
            Err(FsError::Posix { errno, .. }) if errno == libc::ENOENT => Ok(None),
            Err(FsError::Lost(_)) => Ok(None),
            Err(error) => Err(error),
        }
    }

    fn read_range(
        &self,
        fs: FsId,
        ino: Ino,
        offset: u64,
        size: u64,
        monitored: bool,
    ) -> Result<(Vec<u8>, u64)> {
        let mut pieces = Vec::new();
        let mut read_ahead = Vec::new();
        let version;
        let length = {
            let mut state = self.state.lock();
            self.check_usable(&state)?;
            file(&state, fs, ino)?;
            let now = now_ns();
            let file_size = state.system(fs)?.inode(ino)?.attributes.size;
            let end = offset.saturating_add(size).min(file_size);
            version = state.system(fs)?.version(ino);
            // Where the last read of the file ended (the monitor's file position): a read
            // continuing it, or a first read from the start, reads ahead.
            let position = state.system(fs)?.read_positions.get(&ino).copied();
            let sequential = position == Some(offset) || (position.is_none() && offset == 0);
            if monitored {
                self.note_read(&mut state, fs, ino, offset, end, now)?;
            } else {
                state
                    .system_mut(fs)?
                    .read_positions
                    .insert(ino, end.max(offset));
            }
            if end <= offset {
                return Ok((Vec::new(), version));
            }
            let extents: Vec<(u64, Extent)> = {
                let inode = state.system(fs)?.inode(ino)?;
                let mut found: Vec<(u64, Extent)> = inode
                    .extents
                    .range(..end)
                    .rev()
                    .take_while(|(start, extent)| **start + extent.length as u64 > offset)
                    .map(|(start, extent)| (*start, *extent))
                    .collect();
                found.reverse();
                found
            };
            let mut cache = self.cache.lock();
            for (start, extent) in extents {
                let from = start.max(offset);
                let to = (start + extent.length as u64).min(end);
                let at = (from - offset) as usize;
                let chunk_from = extent.chunk_offset as usize + (from - start) as usize;
                let length = (to - from) as usize;
                let state = &mut *state;
                if extent.is_lost() {
                    // A read changes nothing durable, so failing it (after the monitor noted
                    // it) leaves the engine usable.
                    let name = &state.system(fs)?.record.name;
                    return Err(FsError::Lost(format!(
                        "file system {name}: inode {ino} bytes {start}..{}",
                        start + extent.length as u64
                    )));
                }
                let record = state.chunks.record(&mut state.pages, extent.chunk)?;
                let key = (record.location.container, record.location.offset);
                if let Some(bytes) = cache.get(key) {
                    pieces.push(Piece::Ready {
                        at,
                        bytes,
                        from: chunk_from,
                        length,
                    });
                    continue;
                }
                // Concurrent sequential reads (the kernel's read-ahead requests) often want
                // the same chunk: one reads it, the others wait for its bytes.
                if let Some(loading) = cache.loading(key) {
                    pieces.push(Piece::Wait {
                        at,
                        loading,
                        from: chunk_from,
                        length,
                    });
                    continue;
                }
                let mut raw = vec![0u8; record.location.raw_bytes as usize];
                let read = state
                    .chunks
                    .plan_read(&mut state.pages, extent.chunk, &mut raw)?;
                let loading = Loader {
                    cache: Arc::clone(&self.cache),
                    key,
                    loading: cache.start_loading(key),
                    finished: false,
                };
                pieces.push(Piece::File {
                    at,
                    read,
                    raw,
                    from: chunk_from,
                    length,
                    loading,
                });
            }
            if sequential {
                // Read ahead in steps of half the window: each range of the file once.
                let system = state.system_mut(fs)?;
                let window = end..end + READ_AHEAD_BYTES;
                let until = system
                    .read_ahead_until
                    .get(&ino)
                    .copied()
                    .filter(|until| window.contains(until))
                    .unwrap_or(end);
                if until < end + READ_AHEAD_BYTES / 2 {
                    system.read_ahead_until.insert(ino, window.end);
                    read_ahead =
                        self.read_ahead_plan(&mut state, &cache, fs, ino, until, window.end)?;
                }
            }
            (end - offset) as usize
        };
        // Hints only: the kernel starts reading the next chunks while this one is served.
        for (file, at, bytes) in read_ahead {
            file.advise_will_need(at, bytes)?;
        }
        assert!(
            length as u64 <= size,
            "a read returns at most what was asked"
        );
        let mut out = vec![0u8; length];
        for piece in pieces {
            match piece {
                Piece::Ready {
                    at,
                    bytes,
                    from,
                    length,
                } => out[at..at + length].copy_from_slice(&bytes[from..from + length]),
                Piece::File {
                    at,
                    read,
                    mut raw,
                    from,
                    length,
                    loading,
                } => {
                    if let ChunkRead::File { file, location } = read {
                        onecopy_core::chunk_store::read_located(
                            file.as_ref(),
                            &location,
                            &mut raw,
                        )?;
                    }
                    out[at..at + length].copy_from_slice(&raw[from..from + length]);
                    loading.finish(Arc::new(raw));
                }
                Piece::Wait {
                    at,
                    loading,
                    from,
                    length,
                } => {
                    let bytes = loading
                        .wait()
                        .map_err(|detail| FsError::posix(libc::EIO, detail))?;
                    out[at..at + length].copy_from_slice(&bytes[from..from + length]);
                }
            }
        }
        Ok((out, version))
    }

    /// The container ranges of the chunks of the extents of file `ino` that start in
    /// `[from, to)`, except those in the chunk cache: a sequential read asks the kernel to
    /// read these (`posix_fadvise` WILLNEED) up to [`READ_AHEAD_BYTES`] ahead of it, so that
    /// the disk works on the next chunks while the requests before them are served instead
    /// of after the next request arrives.
    fn read_ahead_plan(
        &self,
        state: &mut State,
        cache: &ChunkCache,
        fs: FsId,
        ino: Ino,
        from: u64,
        to: u64,
    ) -> Result<Vec<ReadAhead>> {
        let extents: Vec<Extent> = state
            .system(fs)?
            .inode(ino)?
            .extents
            .range(from..to)
            .map(|(_, extent)| *extent)
            .collect();
        // Container, offset and bytes of each range.
        let mut ranges: Vec<(u64, u64, u64)> = Vec::new();
        let mut seen: Vec<ChunkId> = Vec::new();
        for extent in extents {
            if seen.contains(&extent.chunk) {
                continue;
            }
            seen.push(extent.chunk);
            let record = state.chunks.record(&mut state.pages, extent.chunk)?;
            let location = record.location;
            if !record.in_use || cache.contains((location.container, location.offset)) {
                continue;
            }
            let (at, bytes) = (location.offset as u64, location.stored_bytes as u64);
            // Chunks one after the other in a container (a header between) make one range.
            if let Some(last) = ranges.last_mut() {
                let last_end = last.1 + last.2;
                if last.0 == location.container
                    && last_end <= at
                    && at <= last_end + CHUNK_HEADER_BYTES as u64
                {
                    last.2 = at + bytes - last.1;
                    continue;
                }
            }
            ranges.push((location.container, at, bytes));
        }
        ranges
            .into_iter()
            .map(|(container, at, bytes)| {
                Ok((state.chunks.containers().file(container)?, at, bytes))
            })
            .collect()
    }

    /// The I/O monitor (paper 3 §4.2.1): a read that starts where the previous read of the
    /// file ended is sequential, any other random; the access time is updated and the file
    /// moves to the top of its rank queue (a cold, rank-3 file to the top of Q_Rank0). Held
    /// in memory; checkpoints persist it.
    fn note_read(
        &self,
        state: &mut State,
        fs: FsId,
        ino: Ino,
        offset: u64,
        end: u64,
        now: i64,
    ) -> Result<()> {
        let stamp = state.next_stamp();
        let system = state.system_mut(fs)?;
        let previous_end = system.read_positions.insert(ino, end.max(offset));
        let inode = system
            .inodes
            .get_mut(&ino)
            .ok_or_else(|| FsError::posix(libc::ENOENT, "read"))?;
        let monitor = &mut inode.monitor;
        if previous_end == Some(offset) || (previous_end.is_none() && offset == 0) {
            monitor.sequential_reads += 1;
        } else {
            monitor.random_reads += 1;
        }
        monitor.access_ns = now;
        let old = (monitor.rank, monitor.stamp);
        if monitor.rank == 3 {
            monitor.rank = 0;
        }
        monitor.stamp = stamp;
        let new = (monitor.rank, monitor.stamp);
        // Relative atime, as Linux mounts by default: updated when older than the last
        // change or than a day.
        let attributes = &mut inode.attributes;
        let atime = attributes.atime_ns;
        if atime <= attributes.mtime_ns
            || atime <= attributes.ctime_ns
            || now - atime > 24 * 3600 * 1_000_000_000
        {
            attributes.atime_ns = now;
        }
        system.requeue(ino, old, new);
        Ok(())
    }

    /// The next offset at or after `offset` in data (or in a hole) of file `ino`; ENXIO
    /// when there is none (data) or `offset` is past the end.
    pub fn seek(&self, fs: FsId, ino: Ino, offset: u64, whence: SeekWhence) -> Result<u64> {
        let state = self.state.lock();
        let inode = state.system(fs)?.inode(ino)?;
        let size = inode.attributes.size;
        if offset >= size {
            return Err(FsError::posix(libc::ENXIO, "seek"));
        }
        // Extents in order from the one that may contain `offset`.
        let mut position = offset;
        let start_key = inode
            .extents
            .range(..=offset)
            .next_back()
            .map_or(offset, |(start, _)| *start);
        for (start, extent) in inode.extents.range(start_key..) {
            let end = start + extent.length as u64;
            if end <= position {
                continue;
            }
            match whence {
                SeekWhence::Data => return Ok((*start).max(position)),
                SeekWhence::Hole => {
                    if *start > position {
                        return Ok(position);
                    }
                    position = end;
                }
            }
        }
        match whence {
            SeekWhence::Data => Err(FsError::posix(libc::ENXIO, "seek")),
            SeekWhence::Hole => Ok(position.min(size)),
        }
    }
}
