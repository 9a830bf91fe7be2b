//! Rebuilding the chunk store's derived tables from its primary ones.
//!
//! The chunk records (location and fingerprint of every chunk in use) and the owner's maps
//! (which chunks are referenced, and how often) are primary: nothing else says what they
//! say. Everything else is derived from them and from the container files: reference counts,
//! the free list and the store's scalars, the container table (state, size, live bytes) and
//! the fingerprint index with its filter. A repair rebuilds all of it in one pass
//! ([`ChunkStore::rebuild`]); the owner journals nothing for it and checkpoints right after.

use std::collections::HashMap;

use serde::Serialize;

use super::{ChunkId, ChunkRecord, ChunkStore, ContainerRecord, ContainerState, REFERENCES_MAX};
use crate::container::ContainerId;
use crate::pages::PageStore;
use crate::{Error, Result};

/// What [`ChunkStore::rebuild`] changed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RebuildReport {
    /// Chunks in use after the rebuild.
    pub chunks_in_use: u64,
    /// Reference counts that differed from the maps' and were set.
    pub references_corrected: u64,
    /// Chunks in use that no map referred to, freed.
    pub chunks_freed: u64,
    /// Chunks indexed under a strong fingerprint another chunk already had, kept unindexed
    /// (chunks sharing a weak fingerprint are chained instead).
    pub duplicate_fingerprints: u64,
    /// Container records that differed from their files and chunks, rewritten.
    pub containers_corrected: u64,
    /// Entries of the rebuilt fingerprint index.
    pub index_entries: u64,
}

/// What a container file says of itself.
struct ContainerFile {
    /// The file's length when it is sealed (a valid trailer at its end).
    sealed_bytes: Option<u64>,
    created_at: Option<u64>,
}

impl ChunkStore {
    /// Rebuilds every derived table from the chunk records, `counted` (the references the
    /// owner's maps hold, by chunk id; ids past its end count zero) and the container files:
    /// reference counts (a chunk nothing references is freed), the free list and the store's
    /// scalars, the container table, and the fingerprint index and filter. The open container
    /// is closed (appends continue in a new one).
    ///
    /// The owner must first make every chunk-table page readable (a damaged one replaced by
    /// free records) and every map entry point at a chunk in use: a referenced chunk that is
    /// not in use is an error here.
    pub fn rebuild(&mut self, pages: &mut PageStore, counted: &[u32]) -> Result<RebuildReport> {
        assert!(self.writer.is_none(), "a rebuild runs before any append");
        let mut report = RebuildReport::default();
        let end = self.state.chunk_id_next.max(counted.len() as u64).max(1);
        let mut live: HashMap<ContainerId, (u64, u32)> = HashMap::new();
        let mut highest_in_use = 0;
        let mut live_raw_bytes = 0;
        let mut live_stored_bytes = 0;

        // Reference counts, from the maps.
        for id in 1..end {
            let count = counted.get(id as usize).copied().unwrap_or(0);
            let mut record = self.record(pages, id)?;
            if !record.in_use {
                if count > 0 {
                    return Err(Error::InvalidArgument(format!(
                        "chunk {id} is referenced {count} times but not in use; the owner \
                         marks such references lost before a rebuild"
                    )));
                }
                continue;
            }
            if count == 0 {
                report.chunks_freed += 1;
                ChunkRecord::default().encode(self.chunks.get_mut(pages, id)?);
                continue;
            }
            let count = count.min(REFERENCES_MAX);
            if record.references != count {
                report.references_corrected += 1;
                record.references = count;
                record.encode(self.chunks.get_mut(pages, id)?);
            }
            highest_in_use = id;
            report.chunks_in_use += 1;
            live_raw_bytes += record.location.raw_bytes as u64;
            let footprint = record.location.footprint_bytes();
            live_stored_bytes += footprint;
            let entry = live.entry(record.location.container).or_default();
            entry.0 += footprint;
            entry.1 += 1;
        }

        // The free list: every id below the new end that is not in use, lowest first.
        let chunk_id_next = highest_in_use + 1;
        let mut free_head = 0;
        for id in (1..chunk_id_next).rev() {
            let record = self.record(pages, id)?;
            if record.in_use {
                continue;
            }
            let free = ChunkRecord {
                next_free: free_head,
                ..ChunkRecord::default()
            };
            free.encode(self.chunks.get_mut(pages, id)?);
            free_head = id;
        }
        for id in chunk_id_next..end {
            ChunkRecord::default().encode(self.chunks.get_mut(pages, id)?);
        }

        let container_end = self.rebuild_container_table(pages, &live, false, &mut report)?;
        self.rebuild_index(pages, chunk_id_next, &mut report)?;

        self.state.chunk_id_next = chunk_id_next;
        self.state.free_head = free_head;
        self.state.container_id_next = container_end;
        self.state.open_container = None;
        self.state.live_chunks = report.chunks_in_use;
        self.state.live_raw_bytes = live_raw_bytes;
        self.state.live_stored_bytes = live_stored_bytes;
        Ok(report)
    }

    /// Rewrites the container table from the container files and `live` (bytes and count
    /// of the chunks in use, by container); returns the next container id. `incomplete`
    /// says some chunk records could not be read: no container is retired then, since chunks
    /// of those records may live in any of them (a repair decides).
    fn rebuild_container_table(
        &mut self,
        pages: &mut PageStore,
        live: &HashMap<ContainerId, (u64, u32)>,
        incomplete: bool,
        report: &mut RebuildReport,
    ) -> Result<ContainerId> {
        let files = self.containers.list()?;
        let container_end = files
            .iter()
            .copied()
            .chain(live.keys().copied())
            .max()
            .map_or(1, |highest| highest + 1)
            .max(self.state.container_id_next);
        for id in 1..container_end {
            let old = self.container_record(pages, id)?;
            let (live_bytes, live_chunks) = live.get(&id).copied().unwrap_or_default();
            let record = if files.binary_search(&id).is_ok() {
                let file = self.inspect_container(id)?;
                let state = if live_chunks == 0 && !incomplete {
                    ContainerState::Retired
                } else if file.sealed_bytes.is_some() {
                    ContainerState::Sealed
                } else {
                    ContainerState::Closed
                };
                ContainerRecord {
                    state,
                    bytes: file.sealed_bytes.unwrap_or(0),
                    live_bytes,
                    live_chunks,
                    created_at: file.created_at.unwrap_or(old.created_at),
                }
            } else {
                if live_chunks > 0 {
                    return Err(Error::InvalidArgument(format!(
                        "container {id} is missing but {live_chunks} chunks in use live in it; \
                         the owner marks them lost before a rebuild"
                    )));
                }
                ContainerRecord {
                    state: if old.state == ContainerState::None {
                        ContainerState::None
                    } else {
                        ContainerState::Removed
                    },
                    created_at: old.created_at,
                    ..ContainerRecord::default()
                }
            };
            if record != old {
                report.containers_corrected += 1;
                record.encode(self.container_records.get_mut(pages, id)?);
            }
        }
        Ok(container_end)
    }

    /// Empties the fingerprint index and inserts every indexed chunk in use below
    /// `chunk_id_next`. A chunk whose strong fingerprint another already holds stays,
    /// unindexed; chunks sharing a weak fingerprint are linked into its chain, in id order
    /// (each new one in front), which sets every record's `chain_next` afresh.
    fn rebuild_index(
        &mut self,
        pages: &mut PageStore,
        chunk_id_next: ChunkId,
        report: &mut RebuildReport,
    ) -> Result<()> {
        self.index.clear(pages)?;
        for id in 1..chunk_id_next {
            // A damaged page of the chunk table (found when the index alone is rebuilt at
            // open) leaves its chunks out: a repair rebuilds the index again once it has
            // dealt with them.
            let mut record = match self.record(pages, id) {
                Ok(record) => record,
                Err(error) if error.is_corrupt() => continue,
                Err(error) => return Err(error),
            };
            if !record.in_use || !record.indexed {
                continue;
            }
            if self.options.fingerprint.is_weak() {
                let previous = self.index.insert(pages, &record.fingerprint, id)?;
                let chain_next = previous.unwrap_or(super::ZERO_CHUNK);
                if record.chain_next != chain_next {
                    record.chain_next = chain_next;
                    record.encode(self.chunks.get_mut(pages, id)?);
                }
                report.index_entries += u64::from(previous.is_none());
                continue;
            }
            if self.index.lookup(pages, &record.fingerprint)?.is_some() {
                report.duplicate_fingerprints += 1;
                record.indexed = false;
                record.owner = 0;
                record.written_at = 0;
                record.fingerprint = Default::default();
                record.encode(self.chunks.get_mut(pages, id)?);
                continue;
            }
            self.index.insert(pages, &record.fingerprint, id)?;
            report.index_entries += 1;
        }
        Ok(())
    }

    /// Rebuilds the container table alone, from the chunk records and the files: after its
    /// pages were found damaged at open or in use (it is derived data). The live totals of the
    /// store are recomputed too.
    pub fn rebuild_container_table_only(&mut self, pages: &mut PageStore) -> Result<u64> {
        let mut live: HashMap<ContainerId, (u64, u32)> = HashMap::new();
        let (mut chunks, mut raw, mut stored) = (0, 0, 0);
        let mut incomplete = false;
        for id in 1..self.state.chunk_id_next {
            // A damaged page of the chunk table: its chunks are left for a repair.
            let record = match self.record(pages, id) {
                Ok(record) => record,
                Err(error) if error.is_corrupt() => {
                    incomplete = true;
                    continue;
                }
                Err(error) => return Err(error),
            };
            if !record.in_use {
                continue;
            }
            let footprint = record.location.footprint_bytes();
            let entry = live.entry(record.location.container).or_default();
            entry.0 += footprint;
            entry.1 += 1;
            chunks += 1;
            raw += record.location.raw_bytes as u64;
            stored += footprint;
        }
        let mut report = RebuildReport::default();
        let open = self.state.open_container;
        let container_end = self.rebuild_container_table(pages, &live, incomplete, &mut report)?;
        if let Some(open) = open {
            // The open container stays open: the writer appends to it.
            let mut record = self.container_record(pages, open)?;
            record.state = ContainerState::Open;
            record.encode(self.container_records.get_mut(pages, open)?);
        }
        self.state.container_id_next = container_end;
        self.state.live_chunks = chunks;
        self.state.live_raw_bytes = raw;
        self.state.live_stored_bytes = stored;
        self.container_table_damaged = false;
        Ok(report.containers_corrected)
    }

    /// Rebuilds the fingerprint index alone from the chunk records: after its areas were
    /// found damaged (it is derived data).
    pub fn rebuild_index_only(&mut self, pages: &mut PageStore) -> Result<u64> {
        let mut report = RebuildReport::default();
        self.rebuild_index(pages, self.state.chunk_id_next, &mut report)?;
        Ok(report.index_entries)
    }

    /// Whether container `id`'s file is sealed, and when it was created, from its header and
    /// tail. A damaged trailer reads as not sealed.
    fn inspect_container(&self, id: ContainerId) -> Result<ContainerFile> {
        let sealed_bytes = match self.containers.read_contents(id) {
            Ok(_) => Some(self.containers.container_bytes(id)?),
            Err(error) if error.is_corrupt() => None,
            Err(error) => return Err(error),
        };
        let created_at = self.containers.created_at(id)?;
        Ok(ContainerFile {
            sealed_bytes,
            created_at,
        })
    }
}
