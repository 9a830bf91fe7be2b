//! The block engine: volumes over one deduplicating chunk store.
//!
//! Layout of the block face of a repository (`<repository>/block/`):
//!
//! ```text
//! config.json         BlockConfig (fingerprint, container options), fixed at creation
//! catalog.redb        volume records
//! meta/pages          metadata pages: block maps, chunk table, container table, index
//! meta/manifest.0|1   page tables of the last checkpoint + CheckpointState
//! meta/journal-*      requests since the last checkpoint
//! containers/         chunk data
//! ```
//!
//! Request path (one mutex guards the metadata; hashing and data reads run outside it):
//! write -> hints decide dedup / no-dedup / deferred -> fingerprints (outside the lock) ->
//! under the lock: index lookup, container append or reference, map update, old chunk
//! released, one journal record for the whole request -> full container buffers written
//! (outside the lock) -> acknowledged. FLUSH (and FUA) syncs the containers, then the
//! journal. A checkpoint syncs containers, starts a new journal generation and writes all
//! dirty pages atomically.

mod io;
mod maintenance;
mod volumes;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use onecopy_core::catalog::{Catalog, CatalogView, NamedTable};
use onecopy_core::chunk_store::{
    ChunkChange, ChunkId, ChunkStore, ChunkStoreOptions, ChunkStoreState,
};
use onecopy_core::container::{ContainerId, ContainerStore, WriteBehind};
use onecopy_core::integer_hash::IntegerBuildHasher;
use onecopy_core::journal::{Journal, ReplayControl};
use onecopy_core::pages::{PageStore, PageStoreOptions, RecordArea};
use onecopy_core::storage::{read_all, write_atomically, Storage};
use onecopy_core::{Error, Result};

use crate::cache::ContentCache;
use crate::config::{BlockConfig, RuntimeOptions};
use crate::hints::fs::MetadataMap;
use crate::hints::CopyDetector;
use crate::records::{self, BlockChange};
use crate::volume::{VolumeId, VolumeRecord};

pub use io::{BatchWrite, Extent};
pub use maintenance::{CheckReport, DedupReport};
pub use volumes::{EngineStats, VolumeStats};

const CONFIG_FILE: &str = "config.json";
/// Block-map entries (u64 chunk ids) per metadata page.
pub(crate) const MAP_ENTRIES_PER_PAGE: u64 = (onecopy_core::pages::PAGE_BYTES / 8) as u64;
const CATALOG_FILE: &str = "catalog.redb";
const META_DIRECTORY: &str = "meta";
pub(crate) const VOLUMES: NamedTable = NamedTable("volumes");
pub(crate) const ENGINE_META: NamedTable = NamedTable("block.meta");

/// What every checkpoint saves besides pages.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct CheckpointState {
    chunk_store: ChunkStoreState,
    /// The journal generation to replay after this checkpoint.
    journal_generation: u64,
}

/// Counters of the request path since open.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct EngineCounters {
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    pub trims: u64,
    pub blocks_written: u64,
    pub zero_blocks_written: u64,
    pub blocks_deduplicated: u64,
    pub blocks_stored: u64,
    /// Blocks written without deduplication because of an explicit range.
    pub hint_explicit_blocks: u64,
    /// Blocks written without deduplication as file-system metadata (fixed ranges).
    pub hint_metadata_blocks: u64,
    /// Blocks written without deduplication as file-system journal or log.
    pub hint_journal_blocks: u64,
    /// Blocks recognised as metadata by their content.
    pub hint_classified_blocks: u64,
    /// Blocks stored for deferred deduplication.
    pub deferred_blocks: u64,
    /// Fingerprints prefetched into the index cache (CACHE requests and copy detection).
    pub prefetched_fingerprints: u64,
    /// File-system metadata maps derived from superblock writes.
    pub filesystem_maps_derived: u64,
    pub checkpoints: u64,
    pub read_modify_writes: u64,
}

/// Per-volume runtime state.
pub(crate) struct VolumeState {
    pub(crate) record: Arc<VolumeRecord>,
    pub(crate) map: RecordArea,
    /// File-system metadata ranges derived from the last superblock written.
    pub(crate) filesystem: Option<Arc<MetadataMap>>,
}

/// Everything guarded by the engine mutex.
pub(crate) struct EngineState {
    pub(crate) pages: PageStore,
    pub(crate) journal: Journal,
    pub(crate) chunks: ChunkStore,
    pub(crate) volumes: HashMap<VolumeId, VolumeState, IntegerBuildHasher>,
    pub(crate) names: BTreeMap<String, VolumeId>,
    pub(crate) counters: EngineCounters,
    pub(crate) copies: CopyDetector,
    /// Chunk changes of the request being handled.
    pub(crate) chunk_changes: Vec<ChunkChange>,
    /// All changes of the request being handled.
    pub(crate) changes: Vec<BlockChange>,
    payload: Vec<u8>,
    /// Set when an operation failed half way; every later request fails until reopen.
    failure: Option<String>,
}

/// The deduplicating block device. Shared by all connections (`Arc<Engine>`).
pub struct Engine {
    storage: Arc<dyn Storage>,
    config: BlockConfig,
    runtime: RuntimeOptions,
    pub(crate) catalog: Catalog,
    pub(crate) state: Mutex<EngineState>,
    pub(crate) content_cache: ContentCache,
    /// Container bytes appended under the lock, written after it is released
    /// ([`WriteBehind`]): by the request that appended them, or by the next FLUSH.
    write_behind: Arc<WriteBehind>,
    opened: Instant,
    /// Milliseconds after `opened` of the last request, for idle detection.
    last_request_ms: AtomicU64,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("storage", &self.storage.describe())
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// Opens the block face stored in `storage`, recovering from a crash if needed. A new
    /// face is created with `config_for_new` (or the default); an existing one keeps its own
    /// configuration, and asking for a different one is an error.
    pub fn open(
        storage: Arc<dyn Storage>,
        config_for_new: Option<BlockConfig>,
        runtime: RuntimeOptions,
    ) -> Result<Arc<Engine>> {
        let config = load_or_create_config(storage.as_ref(), config_for_new)?;
        let (mut pages, saved) = PageStore::open(
            storage.clone(),
            META_DIRECTORY,
            PageStoreOptions {
                cache_pages: runtime.metadata_cache_pages,
            },
        )?;
        let saved: CheckpointState = if saved.is_empty() {
            CheckpointState::default()
        } else {
            serde_json::from_slice(&saved)
                .map_err(|error| Error::corrupt("block checkpoint state", error.to_string()))?
        };
        let containers = Arc::new(ContainerStore::with_write_behind(
            storage.clone(),
            "containers",
            config.containers,
        )?);
        let mut chunks = ChunkStore::open(
            &mut pages,
            Arc::clone(&containers),
            saved.chunk_store,
            ChunkStoreOptions {
                fingerprint: config.fingerprint,
                index: runtime.index.clone(),
            },
        )?;
        let catalog = Catalog::open(&storage, CATALOG_FILE)?;
        let mut volumes = HashMap::default();
        let mut names = BTreeMap::new();
        for (_, record) in catalog.read()?.list_json::<VolumeRecord>(VOLUMES)? {
            let map = RecordArea::new(pages.area(&record.map_area_name()), 8);
            names.insert(record.name.clone(), record.id);
            volumes.insert(
                record.id,
                VolumeState {
                    record: Arc::new(record),
                    map,
                    filesystem: None,
                },
            );
        }

        // Redo what happened after the last checkpoint. A request whose new chunks did not
        // reach the media was never acknowledged by a FLUSH; it and everything after it are
        // dropped as the torn tail.
        let (journal, _summary) = Journal::open(
            storage.clone(),
            META_DIRECTORY,
            saved.journal_generation,
            |payload| {
                let changes = records::decode(payload)?;
                for change in &changes {
                    if let BlockChange::Chunk(chunk_change) = change {
                        if !chunks.stored_data_is_durable(chunk_change)? {
                            return Ok(ReplayControl::Stop);
                        }
                    }
                }
                for change in &changes {
                    apply_change(&mut pages, &mut chunks, &volumes, change)?;
                }
                Ok(ReplayControl::Continue)
            },
        )?;
        chunks.close_recovered_container(&mut pages)?;
        remove_orphan_containers(&containers, chunks.state().next_container_id)?;

        let copies = CopyDetector::default();
        let write_behind = Arc::clone(
            containers
                .write_behind()
                .expect("the block device's containers are written behind"),
        );
        let engine = Arc::new(Engine {
            write_behind,
            content_cache: ContentCache::new(
                runtime.content_cache_bytes,
                &runtime.content_cache_policy,
            )?,
            storage,
            config,
            runtime,
            catalog,
            state: Mutex::new(EngineState {
                pages,
                journal,
                chunks,
                volumes,
                names,
                counters: EngineCounters::default(),
                copies,
                chunk_changes: Vec::new(),
                changes: Vec::new(),
                payload: Vec::new(),
                failure: None,
            }),
            opened: Instant::now(),
            last_request_ms: AtomicU64::new(0),
        });
        {
            let mut state = engine.state.lock();
            // Make recovery durable before serving anything.
            engine.checkpoint_locked(&mut state)?;
            engine.finish_deletions(&mut state)?;
            let ids: Vec<VolumeId> = state.volumes.keys().copied().collect();
            for id in ids {
                engine.derive_filesystem_map(&mut state, id);
            }
        }
        onecopy_core::memory::return_freed_heap();
        Ok(engine)
    }

    /// The configuration fixed at creation.
    pub fn config(&self) -> &BlockConfig {
        &self.config
    }

    /// The options of this run.
    pub fn runtime(&self) -> &RuntimeOptions {
        &self.runtime
    }

    /// Where the block face lives.
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    pub(crate) fn note_request(&self) {
        let elapsed = self.opened.elapsed().as_millis() as u64;
        self.last_request_ms.store(elapsed, Ordering::Relaxed);
    }

    /// Milliseconds since the last request.
    pub fn idle_milliseconds(&self) -> u64 {
        let now = self.opened.elapsed().as_millis() as u64;
        now.saturating_sub(self.last_request_ms.load(Ordering::Relaxed))
    }

    /// Makes every acknowledged write durable: the data half first (the open container),
    /// then the journal that refers to it.
    pub fn flush(&self) -> Result<()> {
        let mut state = self.state.lock();
        self.check_usable(&state)?;
        state.counters.flushes += 1;
        let result = flush_locked(&mut state);
        self.fail_on_error(&mut state, result)
    }

    /// Writes a checkpoint now.
    pub fn checkpoint(&self) -> Result<()> {
        let mut state = self.state.lock();
        self.check_usable(&state)?;
        let result = self.checkpoint_locked(&mut state);
        self.fail_on_error(&mut state, result)
    }

    /// Flushes and checkpoints, so that the next open needs no replay.
    pub fn shutdown(&self) -> Result<()> {
        self.checkpoint()
    }

    pub(crate) fn checkpoint_locked(&self, state: &mut EngineState) -> Result<()> {
        // Data first: everything the pages will refer to must be on the media before the
        // manifest that refers to it.
        state.chunks.sync_data()?;
        let old_generation = state.journal.rotate()?;
        let saved = CheckpointState {
            chunk_store: state.chunks.state().clone(),
            journal_generation: state.journal.generation(),
        };
        let bytes = serde_json::to_vec(&saved).expect("checkpoint state serialises");
        state.chunks.prepare_checkpoint(&mut state.pages)?;
        state.pages.checkpoint(&bytes)?;
        state.journal.remove_generation(old_generation)?;
        // Retired containers are referenced by nothing durable any more.
        state.chunks.remove_retired_containers(&mut state.pages)?;
        state.counters.checkpoints += 1;
        Ok(())
    }

    /// Checkpoints when the journal or the dirty pages passed their limits.
    pub(crate) fn checkpoint_if_due(&self, state: &mut EngineState) -> Result<()> {
        if state.journal.bytes() >= self.runtime.checkpoint_journal_bytes
            || state.pages.dirty_page_count() >= self.runtime.checkpoint_dirty_pages
        {
            self.checkpoint_locked(state)?;
        }
        Ok(())
    }

    /// Appends the changes of the request just handled to the journal, as one record.
    pub(crate) fn log_changes(&self, state: &mut EngineState) -> Result<()> {
        if state.changes.is_empty() {
            return Ok(());
        }
        let mut payload = std::mem::take(&mut state.payload);
        records::encode(&state.changes, &mut payload);
        state.changes.clear();
        let result = state.journal.append(&payload);
        state.payload = payload;
        result
    }

    /// Writes the container buffers queued by appends (see [`WriteBehind`]); call after
    /// releasing the lock. A failed write fails the engine, like a failed write under the
    /// lock: the data of acknowledged requests is in memory only.
    pub(crate) fn write_queued(&self) -> Result<()> {
        let result = self.write_behind.run();
        if result.is_err() {
            let mut state = self.state.lock();
            return self.fail_on_error(&mut state, result);
        }
        result
    }

    pub(crate) fn check_usable(&self, state: &EngineState) -> Result<()> {
        match &state.failure {
            Some(reason) => Err(Error::io(
                "block engine",
                std::io::Error::other(format!(
                    "an earlier operation failed ({reason}); restart onecopy to recover"
                )),
            )),
            None => Ok(()),
        }
    }

    /// After a failed mutation the in-memory tables may be ahead of the journal; refuse all
    /// further work so nothing inconsistent becomes durable (the journal and last checkpoint
    /// are intact, and reopening recovers).
    pub(crate) fn fail_on_error<T>(&self, state: &mut EngineState, result: Result<T>) -> Result<T> {
        if let Err(error) = &result {
            if !matches!(error, Error::InvalidArgument(_) | Error::NotFound(_)) {
                state.failure = Some(error.to_string());
            }
        }
        result
    }
}

/// Syncs containers, then the journal.
pub(crate) fn flush_locked(state: &mut EngineState) -> Result<()> {
    state.chunks.sync_data()?;
    state.journal.sync()
}

/// Applies one journaled change: shared by the request path and replay.
pub(crate) fn apply_change(
    pages: &mut PageStore,
    chunks: &mut ChunkStore,
    volumes: &HashMap<VolumeId, VolumeState, IntegerBuildHasher>,
    change: &BlockChange,
) -> Result<()> {
    match change {
        BlockChange::Chunk(chunk_change) => chunks.apply(pages, chunk_change),
        BlockChange::Map {
            volume,
            block,
            chunk,
        } => {
            let state = volumes.get(volume).ok_or_else(|| {
                Error::corrupt(
                    "block journal",
                    format!("a map update names unknown volume {volume}"),
                )
            })?;
            if *block >= state.record.block_count() {
                return Err(Error::corrupt(
                    "block journal",
                    format!("block {block} is beyond volume {}", state.record.name),
                ));
            }
            set_map_entry(pages, &state.map, *block, *chunk)
        }
    }
}

pub(crate) fn map_entry(pages: &mut PageStore, map: &RecordArea, block: u64) -> Result<ChunkId> {
    let bytes = map.get(pages, block)?;
    Ok(u64::from_le_bytes(
        bytes.try_into().expect("8-byte map entries"),
    ))
}

pub(crate) fn set_map_entry(
    pages: &mut PageStore,
    map: &RecordArea,
    block: u64,
    chunk: ChunkId,
) -> Result<()> {
    map.get_mut(pages, block)?
        .copy_from_slice(&chunk.to_le_bytes());
    Ok(())
}

/// The configuration a block face in `storage` was created with, if it exists yet.
pub fn stored_config(storage: &dyn Storage) -> Result<Option<BlockConfig>> {
    if !storage.exists(CONFIG_FILE)? {
        return Ok(None);
    }
    let config = serde_json::from_slice(&read_all(storage, CONFIG_FILE)?)
        .map_err(|error| Error::corrupt("block/config.json", error.to_string()))?;
    Ok(Some(config))
}

/// Removes the container files at or past `next_container_id`. They were created for requests
/// whose journal records did not survive a crash (never acknowledged by a FLUSH), so nothing
/// durable refers to them, and their ids are about to be handed out again: left in place, the
/// next container creation would fail with "already exists" and fail every later write.
fn remove_orphan_containers(
    containers: &ContainerStore,
    next_container_id: ContainerId,
) -> Result<()> {
    let orphans: Vec<ContainerId> = containers
        .list()?
        .into_iter()
        .filter(|id| *id >= next_container_id)
        .collect();
    if orphans.is_empty() {
        return Ok(());
    }
    for id in orphans {
        containers.remove(id)?;
    }
    containers.sync_removals()
}

fn load_or_create_config(
    storage: &dyn Storage,
    config_for_new: Option<BlockConfig>,
) -> Result<BlockConfig> {
    if let Some(stored) = stored_config(storage)? {
        if let Some(wanted) = config_for_new {
            if wanted != stored {
                return Err(Error::InvalidArgument(format!(
                    "the block device of this repository was created with {} fingerprints and \
                     {} containers; these settings cannot change",
                    stored.fingerprint,
                    onecopy_core::units::format_size(stored.containers.container_bytes)
                )));
            }
        }
        return Ok(stored);
    }
    let config = config_for_new.unwrap_or_default();
    config.containers.validate()?;
    let bytes = serde_json::to_vec_pretty(&config).expect("config serialises");
    write_atomically(storage, CONFIG_FILE, &bytes)?;
    Ok(config)
}
