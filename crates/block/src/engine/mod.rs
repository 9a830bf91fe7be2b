//! The block engine: volumes over one deduplicating chunk store.
//!
//! Layout of the block face of a repository (`<repository>/block/`):
//!
//! ```text
//! config.json         BlockConfig (fingerprint, container options), fixed at creation
//! meta/pages          metadata pages: block maps, chunk table, container table, index
//! meta/manifest.0|1   page tables of the last two checkpoints + CheckpointState (which
//!                     holds the volume records)
//! meta/journal-*      requests since the older of the two checkpoints
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

mod check;
mod io;
mod maintenance;
mod recovery;
mod space;
mod span;
mod volumes;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Mutex, MutexGuard};
use serde::{Deserialize, Serialize};

use crate::error::{BlockError, Result};
use onecopy_core::check::Finding;
use onecopy_core::chunk_store::{ChunkChange, ChunkId, ChunkStore, ChunkStoreState};
use onecopy_core::container::WriteBehind;
use onecopy_core::integer_hash::IntegerBuildHasher;
use onecopy_core::journal::Journal;
use onecopy_core::pages::{PageStore, RecordArea};
use onecopy_core::storage::{is_full, read_all, write_atomically, Storage};
use onecopy_core::Error;

use crate::cache::ContentCache;
use crate::changes::{self, BlockChange};
use crate::config::{BlockConfig, RuntimeOptions};
use crate::hints::fs::MetadataMap;
use crate::hints::{CopyDetector, NoDedupReason};
use crate::replicas::Replicas;
use crate::volume::{VolumeId, VolumeRecord};

pub use maintenance::{DedupReport, DuplicationOutcome};
pub use recovery::OpenMode;
pub use volumes::{EngineStats, VolumeDeletion, VolumeStats};

const CONFIG_FILE: &str = "config.json";
/// Block-map entries (u64 chunk ids) per metadata page.
pub(crate) const MAP_ENTRIES_PER_PAGE: u64 = (onecopy_core::pages::PAGE_BYTES / 8) as u64;
pub(crate) const META_DIRECTORY: &str = "meta";
/// Map entry of a block whose data a repair recorded as lost: reads of it fail, naming it,
/// until it is written or trimmed. Chunk ids never reach it (they are dense from 1).
pub const LOST_CHUNK: ChunkId = u64::MAX;

/// What every checkpoint saves besides pages.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct CheckpointState {
    chunk_store: ChunkStoreState,
    /// The journal generation to replay after this checkpoint.
    journal_generation: u64,
    /// The generation the checkpoint before this one named. Should this checkpoint's
    /// manifest be damaged, the one before it and every journal from this generation on
    /// rebuild the same state, so those journals are kept until the next checkpoint.
    previous_journal_generation: u64,
    /// Every volume, by id order.
    volumes: Vec<VolumeRecord>,
    /// The id the next volume gets.
    next_volume_id: VolumeId,
    /// A copy of `config.json`, which has no checksum of its own: should the file be damaged
    /// or lost, this copy (covered by the manifest's) is used and rewrites it. `None` only
    /// in the state of a store that has no checkpoint yet.
    config: Option<BlockConfig>,
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

impl EngineCounters {
    /// Counts one block stored without deduplication, by the hint that decided it.
    pub(crate) fn count_no_dedup(&mut self, reason: NoDedupReason) {
        match reason {
            NoDedupReason::Explicit => self.hint_explicit_blocks += 1,
            NoDedupReason::Metadata => self.hint_metadata_blocks += 1,
            NoDedupReason::Journal => self.hint_journal_blocks += 1,
            NoDedupReason::Classified => self.hint_classified_blocks += 1,
        }
    }
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
    /// The journal being appended to; `None` when the engine is open read-only.
    pub(crate) journal: Option<Journal>,
    pub(crate) chunks: ChunkStore,
    pub(crate) volumes: VolumeStates,
    pub(crate) names: BTreeMap<String, VolumeId>,
    pub(crate) next_volume_id: VolumeId,
    /// The generation the durable checkpoint names (the one the next checkpoint replaces as
    /// the newest): journals from it on are kept by the next checkpoint (see
    /// [`CheckpointState::previous_journal_generation`]). After an open that replayed
    /// journals it is older than the journal being appended to.
    previous_generation: u64,
    pub(crate) counters: EngineCounters,
    pub(crate) copies: CopyDetector,
    /// Chunk changes of the request being handled.
    pub(crate) chunk_changes: Vec<ChunkChange>,
    /// All changes of the request being handled.
    pub(crate) changes: Vec<BlockChange>,
    payload: Vec<u8>,
    /// Set when an operation failed half way; every later request fails until reopen
    /// ([`BlockError::EngineFailed`]).
    failure: Option<Arc<str>>,
    /// Free space and the reserve ([`space`]).
    pub(crate) space: onecopy_core::storage::space::FreeSpace,
}

/// The deduplicating block device. Shared by all connections (`Arc<Engine>`).
pub struct Engine {
    storage: Arc<dyn Storage>,
    config: BlockConfig,
    runtime: RuntimeOptions,
    mode: OpenMode,
    /// What opening found: damage and leftovers in manifests and journals, what a repair
    /// salvaged and lost. Reported by [`Engine::check`].
    open_findings: Vec<Finding>,
    /// Blocks the salvage of this open marked lost (reported in `open_findings`).
    salvaged_lost: std::collections::BTreeMap<VolumeId, std::collections::BTreeSet<u64>>,
    pub(crate) state: Mutex<EngineState>,
    pub(crate) content_cache: ContentCache,
    /// Dynamic replica retrieval and selective duplication ([`crate::replicas`]).
    pub(crate) replicas: Replicas,
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
    /// Opens the block face stored in `storage` for serving, recovering from a crash if
    /// needed ([`OpenMode::ReadWrite`]). A new face is created with `config_for_new` (or the
    /// default); an existing one keeps its own configuration, and asking for a different one
    /// is an error. Damage to a manifest or journal is refused with an error naming it.
    pub fn open(
        storage: Arc<dyn Storage>,
        config_for_new: Option<BlockConfig>,
        runtime: RuntimeOptions,
    ) -> Result<Arc<Engine>> {
        Engine::open_with(storage, config_for_new, runtime, OpenMode::ReadWrite)
    }

    /// How the engine was opened.
    pub fn mode(&self) -> OpenMode {
        self.mode
    }

    /// The configuration fixed at creation.
    pub fn config(&self) -> &BlockConfig {
        &self.config
    }

    /// The options of this run, as the engine was opened with them.
    pub fn runtime(&self) -> &RuntimeOptions {
        &self.runtime
    }

    /// Sets the latency injected into on-disk index reads from now on (experiments inject it
    /// only while they measure, so that preparing a run does not wait for it).
    pub fn set_index_latency_ns(&self, latency_ns: u64) -> Result<()> {
        let mut state = self.state.lock();
        state.chunks.index().set_latency_ns(latency_ns)?;
        Ok(())
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
        self.change(|state| {
            state.counters.flushes += 1;
            // A full disk fails this FLUSH (ENOSPC) and leaves everything queued for the next
            // one; the reserve gives the data room first.
            self.with_reserve(state, |_, state| flush_locked(state))
        })
    }

    /// Writes a checkpoint now.
    pub fn checkpoint(&self) -> Result<()> {
        self.change(|state| self.checkpoint_locked(state))
    }

    /// Flushes and checkpoints, so that the next open needs no replay.
    pub fn shutdown(&self) -> Result<()> {
        self.checkpoint()
    }

    pub(crate) fn checkpoint_locked(&self, state: &mut EngineState) -> Result<()> {
        if state.journal.is_none() {
            return Err(read_only_error().into());
        }
        // A checkpoint that stops half way poisons the page store: it only starts with room
        // to finish.
        if !self.room_for_checkpoint(state)? {
            return Err(onecopy_core::storage::no_space(format!(
                "no room in {} for a checkpoint of {} metadata pages",
                self.storage.describe(),
                state.pages.dirty_page_count()
            ))
            .into());
        }
        let journal = state.journal.as_mut().expect("checked above");
        // Data first: everything the pages will refer to must be on the media before the
        // manifest that refers to it. The journal is synced whole too: should this
        // checkpoint's manifest be damaged later, the previous one and this journal rebuild
        // its state.
        state.chunks.sync_data()?;
        assert!(
            !state.chunks.has_unsynced(),
            "chunk data is durable before a checkpoint refers to it"
        );
        journal.sync()?;
        let current = journal.generation();
        journal.rotate(current + 1)?;
        let saved = CheckpointState {
            chunk_store: state.chunks.state().clone(),
            journal_generation: current + 1,
            previous_journal_generation: state.previous_generation,
            volumes: state
                .volumes
                .values()
                .map(|volume| (*volume.record).clone())
                .collect(),
            next_volume_id: state.next_volume_id,
            config: Some(self.config.clone()),
        };
        let bytes = serde_json::to_vec(&saved).expect("checkpoint state serialises");
        state.chunks.prepare_checkpoint(&mut state.pages)?;
        state.pages.checkpoint(&bytes)?;
        // The other manifest now is the one that was durable before, which names
        // `previous_generation`: falling back to it needs the journals from there on.
        let storage = self.storage.as_ref();
        for generation in Journal::generations(storage, META_DIRECTORY)? {
            if generation < state.previous_generation {
                Journal::remove(storage, META_DIRECTORY, generation)?;
            }
        }
        state.previous_generation = current + 1;
        // Containers retired two checkpoints ago are referenced by no journal that a fallback
        // could replay any more.
        state.chunks.remove_retired_containers(&mut state.pages)?;
        state.counters.checkpoints += 1;
        Ok(())
    }

    /// Checkpoints when the journal or the dirty pages passed their limits.
    pub(crate) fn checkpoint_if_due(&self, state: &mut EngineState) -> Result<()> {
        let journal_bytes = state.journal.as_ref().map_or(0, Journal::bytes);
        if journal_bytes >= self.runtime.checkpoint_journal_bytes
            || state.pages.dirty_page_count() >= self.runtime.checkpoint_dirty_pages
        {
            match self.checkpoint_locked(state) {
                // Put off: the journal holds the changes, and new writes are refused until
                // there is room.
                Err(error) if error.is_full() => state.space.refuse(),
                other => other?,
            }
        }
        Ok(())
    }

    /// Appends the changes of the request just handled to the journal, as one record.
    pub(crate) fn log_changes(&self, state: &mut EngineState) -> Result<()> {
        if state.changes.is_empty() {
            return Ok(());
        }
        let journal = state.journal.as_mut().ok_or_else(read_only_error)?;
        let mut payload = std::mem::take(&mut state.payload);
        changes::encode(&state.changes, &mut payload);
        let tag = changes::tag(&state.changes);
        let result = journal.append(&tag, &payload);
        state.payload = payload;
        // Changes stay listed until their record is in the journal: a failure to append it
        // leaves them there, and the engine fails ([`Engine::fail_on_error`]).
        if result.is_ok() {
            state.changes.clear();
        }
        Ok(result?)
    }

    /// Writes the container buffers queued by appends (see [`WriteBehind`]); call after
    /// releasing the lock. A failed write fails the engine, like a failed write under the
    /// lock: the data of acknowledged requests is in memory only.
    ///
    /// A write that found the disk full is the exception: its bytes stay queued (readable,
    /// written by the next FLUSH), the request succeeds (it is applied and journaled), and
    /// new writes are refused with ENOSPC until there is room ([`space`]).
    pub(crate) fn write_queued(&self) -> Result<()> {
        match self.write_behind.run() {
            Ok(()) => Ok(()),
            Err(error) if is_full(&error) => {
                self.state.lock().space.refuse();
                Ok(())
            }
            Err(error) => {
                let mut state = self.state.lock();
                state.failure = Some(error.to_string().into());
                Err(error.into())
            }
        }
    }

    /// The engine's state, locked, for an operation that only reads it: refused when an
    /// earlier operation failed the engine.
    pub(crate) fn lock_usable(&self) -> Result<MutexGuard<'_, EngineState>> {
        let state = self.state.lock();
        self.check_usable(&state)?;
        Ok(state)
    }

    /// Runs `operation`, which may change the locked `state`, as every such operation runs:
    /// refused when an earlier operation failed the engine, and failing the engine when it
    /// fails with changes that its journal record does not hold ([`Engine::fail_on_error`]).
    #[inline]
    pub(crate) fn guarded<T>(
        &self,
        state: &mut EngineState,
        operation: impl FnOnce(&mut EngineState) -> Result<T>,
    ) -> Result<T> {
        self.check_usable(state)?;
        let result = operation(state);
        self.fail_on_error(state, result)
    }

    /// [`Engine::guarded`] under a lock taken for the operation.
    pub(crate) fn change<T>(
        &self,
        operation: impl FnOnce(&mut EngineState) -> Result<T>,
    ) -> Result<T> {
        self.guarded(&mut self.state.lock(), operation)
    }

    fn check_usable(&self, state: &EngineState) -> Result<()> {
        match &state.failure {
            Some(reason) => Err(BlockError::EngineFailed {
                reason: Arc::clone(reason),
            }),
            None => Ok(()),
        }
    }

    /// After an operation failed with changes made in memory that its journal record does
    /// not hold, the tables are ahead of the journal: refuse all further work so nothing
    /// inconsistent becomes durable (the journal and last checkpoint are intact, and
    /// reopening recovers). A failure before anything changed (a damaged page read by a
    /// request's preparation, a lost block, a bad argument) fails that operation alone.
    fn fail_on_error<T>(&self, state: &mut EngineState, result: Result<T>) -> Result<T> {
        if let Err(error) = &result {
            if !state.changes.is_empty() || !state.chunk_changes.is_empty() {
                state.failure = Some(error.to_string().into());
            }
        }
        result
    }
}

/// Syncs containers, then the journal.
pub(crate) fn flush_locked(state: &mut EngineState) -> Result<()> {
    let Some(journal) = state.journal.as_mut() else {
        // Read-only: nothing was written.
        return Ok(());
    };
    state.chunks.sync_data()?;
    // The documented write ordering: the journal's records refer to chunks, which must be
    // durable first.
    assert!(
        !state.chunks.has_unsynced(),
        "chunk data is durable before the journal that refers to it"
    );
    Ok(journal.sync()?)
}

/// The error of a change asked of an engine opened read-only.
pub(crate) fn read_only_error() -> Error {
    Error::InvalidArgument(
        "the block device is open read-only (a check, or a full disk); nothing can change"
            .to_string(),
    )
}

/// Applies one journaled change during replay (the request path makes the same changes
/// directly).
pub(crate) fn apply_change(
    pages: &mut PageStore,
    chunks: &mut ChunkStore,
    volumes: &mut VolumeStates,
    change: &BlockChange,
) -> Result<()> {
    match change {
        BlockChange::Chunk(chunk_change) => Ok(chunks.apply(pages, chunk_change)?),
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
                )
                .into());
            }
            set_map_entry(pages, &state.map, *block, *chunk)
        }
        BlockChange::VolumeSet(record) => {
            set_volume(pages, volumes, (**record).clone());
            Ok(())
        }
        BlockChange::VolumeRemoved(volume) => match volumes.remove(volume) {
            Some(removed) => {
                let area = pages.area(&removed.record.map_area_name());
                Ok(pages.clear_area(area)?)
            }
            None => Ok(()),
        },
    }
}

/// The runtime state of every volume, by id.
pub(crate) type VolumeStates = HashMap<VolumeId, VolumeState, IntegerBuildHasher>;

/// Adds or replaces the state of `record`'s volume, keeping its derived file-system map.
pub(crate) fn set_volume(pages: &mut PageStore, volumes: &mut VolumeStates, record: VolumeRecord) {
    let map = RecordArea::new(pages.area(&record.map_area_name()), 8);
    let filesystem = volumes
        .get(&record.id)
        .and_then(|volume| volume.filesystem.clone());
    volumes.insert(
        record.id,
        VolumeState {
            record: Arc::new(record),
            map,
            filesystem,
        },
    );
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

pub(crate) fn load_or_create_config(
    storage: &dyn Storage,
    config_for_new: Option<BlockConfig>,
) -> Result<BlockConfig> {
    if let Some(stored) = stored_config(storage)? {
        refuse_other_config(&stored, config_for_new.as_ref())?;
        return Ok(stored);
    }
    let config = config_for_new.unwrap_or_default();
    config.containers.validate()?;
    let bytes = serde_json::to_vec_pretty(&config).expect("config serialises");
    write_atomically(storage, CONFIG_FILE, &bytes)?;
    Ok(config)
}

/// Refuses a configuration `wanted` for a block face created with `stored`.
pub(crate) fn refuse_other_config(
    stored: &BlockConfig,
    wanted: Option<&BlockConfig>,
) -> Result<()> {
    match wanted {
        Some(wanted) if wanted != stored => Err(Error::InvalidArgument(format!(
            "the block device of this repository was created with {} fingerprints and {} \
             containers; these settings cannot change",
            stored.fingerprint,
            onecopy_core::units::format_size(stored.containers.container_bytes)
        ))
        .into()),
        _ => Ok(()),
    }
}
