//! `onecopy fs stats` and `onecopy fs ranks`: figures read from the live state.

use std::collections::HashSet;

use serde::Serialize;

use crate::changes::FsId;
use crate::error::Result;
use crate::node::{Chunking, Kind, Rank};

use super::FsEngine;

/// Files and bytes of one rank.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RankStats {
    pub files: u64,
    pub bytes: u64,
}

/// Figures of the whole face (every file system of the repository).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FaceStats {
    pub file_systems: u64,
    pub live_chunks: u64,
    /// Raw bytes of the chunks in use.
    pub live_raw_bytes: u64,
    /// Bytes the chunks in use occupy in containers.
    pub live_stored_bytes: u64,
    /// Bytes of container files, garbage (freed chunks waiting for compaction) included;
    /// the open container's appends still in memory are not counted.
    pub container_bytes: u64,
    /// Free space and whether writes are refused for lack of it.
    pub space: super::SpaceStats,
    /// Entries of the piece index (the small pieces of big chunks; entries of chunks freed
    /// since the last `fs compact` included).
    pub piece_entries: u64,
}

/// Figures of one file system.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct FsStats {
    pub name: String,
    pub files: u64,
    pub directories: u64,
    /// Bytes of file data (sizes of regular files, holes excluded).
    pub logical_bytes: u64,
    /// Bytes of the distinct chunks this file system's files use (a chunk shared with
    /// another file system is counted in both).
    pub stored_bytes: u64,
    /// Bytes written plainly, waiting for deduplication.
    pub pending_bytes: u64,
    /// logical_bytes / stored_bytes.
    pub dedup_ratio: f64,
    /// Files and bytes by rank 0..3.
    pub ranks: [RankStats; 4],
    pub face: FaceStats,
}

/// Where one extent of a file lies ([`FsEngine::file_layout`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ExtentPlace {
    pub offset: u64,
    pub length: u64,
    pub chunk: u64,
    pub container: u64,
    pub container_offset: u64,
    /// The chunk's reference count.
    pub references: u32,
    pub plain: bool,
}

/// One file in `onecopy fs ranks`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FileRank {
    pub ino: u64,
    pub path: String,
    pub rank: Rank,
    pub chunking: Option<Chunking>,
    pub sequential_reads: u64,
    pub random_reads: u64,
    /// Seconds since the last access and the last modification the monitor saw.
    pub accessed_seconds_ago: f64,
    pub modified_seconds_ago: f64,
    pub bytes: u64,
    pub pending_bytes: u64,
    pub extents: u64,
}

impl FsEngine {
    /// Figures of file system `fs` and of the face.
    pub fn stats(&self, fs: FsId) -> Result<FsStats> {
        let mut state = self.state.lock();
        let state = &mut *state;
        let system = state.system(fs)?;
        let mut stats = FsStats {
            name: system.record.name.clone(),
            ..FsStats::default()
        };
        let mut chunks = HashSet::new();
        for inode in system.inodes.values() {
            match inode.attributes.kind {
                Kind::File => {
                    stats.files += 1;
                    let bytes = inode.mapped_bytes();
                    stats.logical_bytes += bytes;
                    stats.pending_bytes += inode.plain_bytes();
                    let rank = &mut stats.ranks[inode.monitor.rank.min(3) as usize];
                    rank.files += 1;
                    rank.bytes += bytes;
                    chunks.extend(
                        inode
                            .extents
                            .values()
                            .filter(|extent| !extent.is_lost())
                            .map(|extent| extent.chunk),
                    );
                }
                Kind::Directory => stats.directories += 1,
                _ => {}
            }
        }
        for chunk in chunks {
            let record = state.chunks.record(&mut state.pages, chunk)?;
            stats.stored_bytes += record.location.stored_bytes as u64;
        }
        stats.dedup_ratio = if stats.stored_bytes == 0 {
            1.0
        } else {
            stats.logical_bytes as f64 / stats.stored_bytes as f64
        };
        let chunk_state = state.chunks.state().clone();
        let mut container_bytes = 0;
        for id in 1..chunk_state.container_id_next {
            let record = state.chunks.container_record(&mut state.pages, id)?;
            use onecopy_core::chunk_store::ContainerState;
            container_bytes += match record.state {
                ContainerState::Sealed => record.bytes,
                // Not sealed: the file's current length (buffered appends not yet included).
                ContainerState::Open | ContainerState::Closed => {
                    state.chunks.containers().container_bytes(id)?
                }
                _ => 0,
            };
        }
        stats.face = FaceStats {
            file_systems: state.systems.len() as u64,
            live_chunks: chunk_state.live_chunks,
            live_raw_bytes: chunk_state.live_raw_bytes,
            live_stored_bytes: chunk_state.live_stored_bytes,
            container_bytes,
            space: state.space.stats(),
            piece_entries: state.pieces.len(),
        };
        Ok(stats)
    }

    /// Where each extent of file `ino` lies: file offset, length, container and offset in
    /// it (for tests and the lab's layout measurements).
    pub fn file_layout(&self, fs: FsId, ino: u64) -> Result<Vec<ExtentPlace>> {
        let mut state = self.state.lock();
        let state = &mut *state;
        let extents: Vec<(u64, crate::node::Extent)> = state
            .system(fs)?
            .inode(ino)?
            .extents
            .iter()
            .map(|(offset, extent)| (*offset, *extent))
            .collect();
        let mut places = Vec::with_capacity(extents.len());
        for (offset, extent) in extents.into_iter().filter(|(_, extent)| !extent.is_lost()) {
            let record = state.chunks.record(&mut state.pages, extent.chunk)?;
            places.push(ExtentPlace {
                offset,
                length: extent.length as u64,
                chunk: extent.chunk,
                container: record.location.container,
                container_offset: record.location.offset as u64,
                references: record.references,
                plain: extent.plain,
            });
        }
        Ok(places)
    }

    /// Inodes of file system `fs` (for `statfs`).
    pub fn stats_inodes(&self, fs: FsId) -> Result<u64> {
        Ok(self.state.lock().system(fs)?.inodes.len() as u64)
    }

    /// Every file's rank, counters and chunking, by path.
    pub fn ranks(&self, fs: FsId) -> Result<Vec<FileRank>> {
        let state = self.state.lock();
        let system = state.system(fs)?;
        let paths = crate::dedup::paths_of(system);
        let now = super::now_ns();
        let mut files: Vec<FileRank> = system
            .inodes
            .iter()
            .filter(|(_, inode)| inode.attributes.kind == Kind::File)
            .map(|(ino, inode)| FileRank {
                ino: *ino,
                path: paths
                    .get(ino)
                    .cloned()
                    .unwrap_or_else(|| format!("<inode {ino}>")),
                rank: inode.monitor.rank,
                chunking: inode.monitor.chunking,
                sequential_reads: inode.monitor.sequential_reads,
                random_reads: inode.monitor.random_reads,
                accessed_seconds_ago: (now - inode.monitor.access_ns) as f64 / 1e9,
                modified_seconds_ago: (now - inode.monitor.modify_ns) as f64 / 1e9,
                bytes: inode.mapped_bytes(),
                pending_bytes: inode.plain_bytes(),
                extents: inode.extents.len() as u64,
            })
            .collect();
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(files)
    }
}
