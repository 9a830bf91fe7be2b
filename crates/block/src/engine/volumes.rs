//! Volume management and statistics.

use std::collections::HashSet;
use std::sync::Arc;

use serde::Serialize;

use crate::error::{BlockError, Result};
use onecopy_core::chunk_store::{unix_seconds, ChunkStoreCounters, ChunkStoreState, ZERO_CHUNK};
use onecopy_core::gc::{self, CompactionOptions};
use onecopy_core::index::IndexCounters;
use onecopy_core::Error;

pub use super::space::SpaceStats;
use super::{map_entry, set_volume, Engine, EngineCounters, EngineState, MAP_ENTRIES_PER_PAGE};
use crate::changes::{BlockChange, RECORD_RELEASED_BLOCKS_MAX};
use crate::config::HintSettings;
use crate::volume::{
    check_volume_geometry, check_volume_name, ByteRange, VolumeId, VolumeRecord, VOLUME_ID_MAX,
};

/// What `volume stats` reports.
#[derive(Clone, Debug, Serialize)]
pub struct VolumeStats {
    pub name: String,
    pub id: VolumeId,
    pub size_bytes: u64,
    pub block_bytes: u32,
    /// Logical bytes that hold non-zero data.
    pub mapped_bytes: u64,
    /// Bytes of chunk data this volume references, each distinct chunk counted once.
    pub stored_bytes: u64,
    /// Distinct chunks the volume references.
    pub distinct_chunks: u64,
    /// `mapped_bytes / stored_bytes`.
    pub dedup_ratio: f64,
    pub hints: HintSettings,
    pub no_dedup_ranges: Vec<ByteRange>,
    /// The file system recognised on the volume, if any.
    pub file_system: Option<String>,
    /// Bytes of file-system metadata and journal ranges derived from its superblock.
    pub file_system_metadata_bytes: u64,
    /// Engine-wide index and cache figures, for convenience.
    pub engine: EngineStats,
}

/// What deleting a volume freed.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct VolumeDeletion {
    /// Bytes of containers removed: those that held only chunks of the volume.
    pub freed_bytes: u64,
    /// Bytes `onecopy volume compact` would free now (containers whose live chunks it would
    /// copy elsewhere, this volume's dead chunks among them).
    pub compactable_bytes: u64,
}

/// Memory the engine holds, by part.
#[derive(Clone, Debug, Default, Serialize)]
pub struct MemoryStats {
    /// Page tables, dirty pages and the clean page cache of the metadata pages.
    pub metadata_pages_bytes: u64,
    pub index_filter_bytes: u64,
    pub index_cache_bytes: u64,
    pub index_directory_bytes: u64,
    pub content_cache_bytes: u64,
    /// The copy table, duplicates and popularity of replica retrieval and selective
    /// duplication.
    pub replicas_bytes: u64,
    pub total_bytes: u64,
    /// Memory that grows with the stored data (filter, index directory, page tables) per
    /// stored chunk; the caches are fixed budgets.
    pub proportional_bytes_per_chunk: f64,
    /// Projected RAM for 1 TiB of stored 4 KiB chunks: the proportional part times 2^28
    /// chunks, plus the fixed budgets as configured.
    pub projected_bytes_per_tib: f64,
    /// Page tables and the free-slot list of the metadata pages (part of
    /// `metadata_pages_bytes`, and of the proportional part).
    pub page_table_bytes: u64,
    /// Pages of each metadata area: what the page tables hold.
    pub page_areas: Vec<onecopy_core::pages::AreaUsage>,
}

/// Engine-wide statistics.
#[derive(Clone, Debug, Serialize)]
pub struct EngineStats {
    pub volumes: usize,
    /// Free space as the engine sees it, and whether writes are refused for lack of it.
    pub space: SpaceStats,
    pub store: ChunkStoreState,
    pub requests: EngineCounters,
    pub chunks: ChunkStoreCounters,
    pub index: IndexCounters,
    pub index_entries: u64,
    pub content_cache: crate::cache::ContentCacheStats,
    /// Dynamic replica retrieval and selective duplication.
    pub replicas: crate::replicas::ReplicaStats,
    pub memory: MemoryStats,
}

impl Engine {
    /// Creates a volume of `size_bytes` (a multiple of `block_bytes`, 512 or 4096).
    pub fn create_volume(
        &self,
        name: &str,
        size_bytes: u64,
        block_bytes: u32,
        hints: HintSettings,
    ) -> Result<VolumeRecord> {
        check_volume_name(name)?;
        check_volume_geometry(size_bytes, block_bytes)?;
        let mut state = self.lock_usable()?;
        if state.names.contains_key(name) {
            return Err(Error::AlreadyExists(format!("volume {name}")).into());
        }
        let id = state.next_volume_id;
        if id > VOLUME_ID_MAX {
            return Err(Error::Limit(format!(
                "volume ids are used up to {VOLUME_ID_MAX}, the most the chunk owner tags hold"
            ))
            .into());
        }
        let record = VolumeRecord {
            id,
            name: name.to_string(),
            size_bytes,
            block_bytes,
            created: unix_seconds(),
            hints,
            no_dedup_ranges: Vec::new(),
            deleting: false,
        };
        state.names.insert(name.to_string(), id);
        state.next_volume_id = id + 1;
        self.save_record(&mut state, record.clone())?;
        Ok(record)
    }

    /// Every volume, by name.
    pub fn volumes(&self) -> Vec<VolumeRecord> {
        let state = self.state.lock();
        state
            .names
            .values()
            .map(|id| (*state.volumes[id].record).clone())
            .collect()
    }

    /// The record of the volume called `name`.
    pub fn volume(&self, name: &str) -> Result<VolumeRecord> {
        let state = self.state.lock();
        let id = volume_id(&state, name)?;
        Ok((*state.volumes[&id].record).clone())
    }

    /// Deletes a volume, releasing its blocks, and frees the containers that held only
    /// chunks of it (on a full disk too: the commits that free space may use the reserve).
    /// Interrupted deletions finish at the next open.
    pub fn delete_volume(&self, name: &str) -> Result<VolumeDeletion> {
        let mut state = self.state.lock();
        let stored_before = self.guarded(&mut state, |state| {
            let id = volume_id(state, name)?;
            let mut record = (*state.volumes[&id].record).clone();
            record.deleting = true;
            let stored_before = self.stored_bytes(state)?;
            self.with_reserve(state, |engine, state| {
                engine.save_record(state, record.clone())
            })?;
            self.with_reserve(state, |engine, state| engine.delete_locked(state, id))?;
            self.remove_empty_containers(state)?;
            Ok(stored_before)
        })?;
        let freed_bytes = stored_before.saturating_sub(self.stored_bytes(&state)?);
        let EngineState { chunks, pages, .. } = &mut *state;
        let compactable_bytes =
            gc::plan_compaction(chunks, pages, &CompactionOptions::default())?.reclaim_bytes;
        Ok(VolumeDeletion {
            freed_bytes,
            compactable_bytes,
        })
    }

    /// Bytes of every container file.
    fn stored_bytes(&self, state: &EngineState) -> Result<u64> {
        let containers = state.chunks.containers();
        containers
            .list()?
            .into_iter()
            .map(|id| Ok(containers.container_bytes(id)?))
            .sum()
    }

    /// Retires the containers that hold no live chunk and checkpoints twice, after which
    /// they are removed (a retired container stays one checkpoint for a fallback's replay).
    fn remove_empty_containers(&self, state: &mut EngineState) -> Result<()> {
        let options = CompactionOptions {
            live_fraction_max: 0.0,
            copy_bytes_limit: 0,
        };
        let EngineState { chunks, pages, .. } = &mut *state;
        let plan = gc::plan_compaction(chunks, pages, &options)?;
        if plan.containers.is_empty() {
            return Ok(());
        }
        let mut chunk_changes = Vec::new();
        gc::execute_compaction(chunks, pages, &plan, &mut chunk_changes)?;
        state
            .changes
            .extend(chunk_changes.into_iter().map(BlockChange::Chunk));
        self.log_changes(state)?;
        for _ in 0..2 {
            self.with_reserve(state, |engine, state| engine.checkpoint_locked(state))?;
        }
        Ok(())
    }

    /// Releases every block of volume `id`, checkpoints, then removes its record.
    pub(crate) fn delete_locked(&self, state: &mut EngineState, id: VolumeId) -> Result<()> {
        let record = Arc::clone(&state.volumes[&id].record);
        self.release_blocks_from(state, &record, 0)?;
        state.changes.push(BlockChange::VolumeRemoved(id));
        self.log_changes(state)?;
        let area = state.pages.area(&record.map_area_name());
        state.pages.clear_area(area)?;
        state.names.remove(&record.name);
        state.volumes.remove(&id);
        self.checkpoint_locked(state)
    }

    /// Releases the blocks of `record` from block `first` to the end of its map.
    fn release_blocks_from(
        &self,
        state: &mut EngineState,
        record: &VolumeRecord,
        first: u64,
    ) -> Result<()> {
        let map = state.volumes[&record.id].map;
        let area = state.pages.area(&record.map_area_name());
        let written_blocks = state.pages.page_count(area) * MAP_ENTRIES_PER_PAGE;
        let mut released = 0;
        for block in first..written_blocks.min(record.block_count()) {
            if map_entry(&mut state.pages, &map, block)? != ZERO_CHUNK {
                self.remap(state, record, block, ZERO_CHUNK)?;
                released += 1;
                if released == RECORD_RELEASED_BLOCKS_MAX {
                    self.log_changes(state)?;
                    released = 0;
                }
            }
        }
        self.log_changes(state)
    }

    /// Changes the size of a volume; shrinking releases the blocks past the new end.
    pub fn resize_volume(&self, name: &str, size_bytes: u64) -> Result<VolumeRecord> {
        let mut state = self.lock_usable()?;
        let id = volume_id(&state, name)?;
        let mut record = (*state.volumes[&id].record).clone();
        check_volume_geometry(size_bytes, record.block_bytes)?;
        if size_bytes < record.size_bytes {
            let first = size_bytes / record.block_bytes as u64;
            let current = Arc::clone(&state.volumes[&id].record);
            self.guarded(&mut state, |state| {
                self.release_blocks_from(state, &current, first)?;
                self.checkpoint_locked(state)
            })?;
        }
        record.size_bytes = size_bytes;
        record
            .no_dedup_ranges
            .retain(|range| range.start < size_bytes);
        for range in &mut record.no_dedup_ranges {
            range.end = range.end.min(size_bytes);
        }
        self.save_record(&mut state, record.clone())?;
        Ok(record)
    }

    /// Adds or removes an explicit no-dedup range.
    pub fn set_no_dedup(
        &self,
        name: &str,
        range: ByteRange,
        no_dedup: bool,
    ) -> Result<VolumeRecord> {
        let mut state = self.state.lock();
        let id = volume_id(&state, name)?;
        let mut record = (*state.volumes[&id].record).clone();
        record.set_no_dedup(range, no_dedup)?;
        self.save_record(&mut state, record.clone())?;
        Ok(record)
    }

    /// Replaces the hint settings of a volume.
    pub fn set_hint_settings(&self, name: &str, hints: HintSettings) -> Result<VolumeRecord> {
        let mut state = self.state.lock();
        let id = volume_id(&state, name)?;
        let mut record = (*state.volumes[&id].record).clone();
        record.hints = hints;
        self.save_record(&mut state, record.clone())?;
        if record.hints.filesystem {
            self.derive_filesystem_map(&mut state, id);
        } else if let Some(volume) = state.volumes.get_mut(&id) {
            volume.filesystem = None;
        }
        Ok(record)
    }

    /// Adds or replaces a volume's record and makes it durable: journaled (so that a replay
    /// from an older checkpoint recreates it), then checkpointed (records live in the
    /// checkpoint state).
    fn save_record(&self, state: &mut EngineState, record: VolumeRecord) -> Result<()> {
        self.guarded(state, |state| {
            state
                .changes
                .push(BlockChange::VolumeSet(Box::new(record.clone())));
            let EngineState { pages, volumes, .. } = state;
            set_volume(pages, volumes, record);
            self.log_changes(state)?;
            self.checkpoint_locked(state)
        })
    }

    /// Statistics of one volume (scans its map: cost grows with the volume's written size).
    pub fn volume_stats(&self, name: &str) -> Result<VolumeStats> {
        let (record, mapped_blocks, distinct, stored_bytes, file_system, metadata_bytes) = {
            let mut guard = self.state.lock();
            let state = &mut *guard;
            let id = volume_id(state, name)?;
            let record = Arc::clone(&state.volumes[&id].record);
            let map = state.volumes[&id].map;
            let area = state.pages.area(&record.map_area_name());
            let written_blocks = state.pages.page_count(area) * MAP_ENTRIES_PER_PAGE;
            let mut distinct = HashSet::new();
            let mut mapped_blocks = 0u64;
            let mut stored_bytes = 0u64;
            for block in 0..written_blocks.min(record.block_count()) {
                let chunk = map_entry(&mut state.pages, &map, block)?;
                if chunk == ZERO_CHUNK {
                    continue;
                }
                mapped_blocks += 1;
                if distinct.insert(chunk) {
                    stored_bytes += state
                        .chunks
                        .record(&mut state.pages, chunk)?
                        .location
                        .raw_bytes as u64;
                }
            }
            let filesystem = state.volumes[&id].filesystem.clone();
            (
                record,
                mapped_blocks,
                distinct.len() as u64,
                stored_bytes,
                filesystem
                    .as_ref()
                    .map(|map| format!("{:?}", map.file_system())),
                filesystem.as_ref().map_or(0, |map| map.metadata_bytes()),
            )
        };
        let mapped_bytes = mapped_blocks * record.block_bytes as u64;
        Ok(VolumeStats {
            name: record.name.clone(),
            id: record.id,
            size_bytes: record.size_bytes,
            block_bytes: record.block_bytes,
            mapped_bytes,
            stored_bytes,
            distinct_chunks: distinct,
            dedup_ratio: if stored_bytes == 0 {
                1.0
            } else {
                mapped_bytes as f64 / stored_bytes as f64
            },
            hints: record.hints.clone(),
            no_dedup_ranges: record.no_dedup_ranges.clone(),
            file_system,
            file_system_metadata_bytes: metadata_bytes,
            engine: self.stats(),
        })
    }

    /// Engine-wide statistics.
    pub fn stats(&self) -> EngineStats {
        let mut state = self.state.lock();
        let index_memory = state.chunks.index().memory();
        let index_counters = state.chunks.index().counters();
        let index_entries = state.chunks.index().len();
        let content_cache = self.content_cache.stats();
        let replicas = self.replicas.stats();
        let pages_bytes = state.pages.memory_bytes();
        let store = state.chunks.state().clone();
        let mut memory = MemoryStats {
            metadata_pages_bytes: pages_bytes,
            index_filter_bytes: index_memory.filter_bytes,
            index_cache_bytes: index_memory.cache_bytes,
            index_directory_bytes: index_memory.directory_bytes,
            content_cache_bytes: content_cache.memory_bytes,
            replicas_bytes: replicas.memory_bytes,
            ..MemoryStats::default()
        };
        memory.total_bytes = memory.metadata_pages_bytes
            + memory.index_filter_bytes
            + memory.index_cache_bytes
            + memory.index_directory_bytes
            + memory.content_cache_bytes
            + memory.replicas_bytes;
        memory.page_table_bytes = state.pages.table_bytes();
        memory.page_areas = state.pages.area_usage();
        let proportional =
            memory.index_filter_bytes + memory.index_directory_bytes + memory.page_table_bytes;
        if store.live_chunks > 0 {
            memory.proportional_bytes_per_chunk = proportional as f64 / store.live_chunks as f64;
        }
        let fixed_budgets = self.runtime().index.cache_bytes
            + self.runtime().content_cache_bytes
            + self.runtime().replicas.copy_table_bytes
            + self.runtime().metadata_cache_pages as u64 * 4096;
        memory.projected_bytes_per_tib =
            memory.proportional_bytes_per_chunk * (1u64 << 28) as f64 + fixed_budgets as f64;
        EngineStats {
            volumes: state.volumes.len(),
            space: SpaceStats::of(&state.space),
            store,
            requests: state.counters.clone(),
            chunks: state.chunks.counters().clone(),
            index: index_counters,
            index_entries,
            content_cache,
            replicas,
            memory,
        }
    }

    /// Finishes deletions interrupted by a crash.
    pub(crate) fn finish_deletions(&self, state: &mut EngineState) -> Result<()> {
        let pending: Vec<VolumeId> = state
            .volumes
            .values()
            .filter(|volume| volume.record.deleting)
            .map(|volume| volume.record.id)
            .collect();
        for id in pending {
            self.delete_locked(state, id)?;
        }
        Ok(())
    }

    /// The id of the volume called `name`, for the NBD exports.
    pub fn volume_id(&self, name: &str) -> Result<VolumeId> {
        volume_id(&self.state.lock(), name)
    }
}

fn volume_id(state: &EngineState, name: &str) -> Result<VolumeId> {
    state.names.get(name).copied().ok_or_else(|| {
        BlockError::from(Error::NotFound(format!(
            "volume {name} (list volumes with `onecopy volume list`)"
        )))
    })
}
