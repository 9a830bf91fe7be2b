//! Dynamic replica retrieval and selective duplication (paper 4 §3.3 and §3.4).
//!
//! Terms:
//! - *copy*: a stored chunk holding some content. Deduplication leaves one copy of most
//!   content; blocks written without deduplication (hinted, deferred, or stored again past a
//!   limit) are copies of their own. Their *content key* is the content cache's
//!   ([`crate::cache::ContentKey`]).
//! - *copy table*: content key -> the chunks known to hold it (at most
//!   [`COPIES_PER_KEY`]), learned from writes that store a copy without deduplication and from
//!   reads, within a memory budget (LRU). Derived and in memory only.
//! - *duplicate*: a copy of popular content made by selective duplication in a *scratch
//!   region*, a file of `block/scratch/` with a modelled position spread over the device
//!   ([`device::region_positions`]); one per region, so each popular content has
//!   `duplicate_copies` duplicates. Derived and in memory only: the files are removed at the
//!   next open.
//! - *device profile*: the model the read planner costs copies with ([`device`]).
//!
//! Read path (a block that misses the content cache and is not in memory):
//! 1. its content key -> the copies the copy table lists and the duplicates of that key;
//! 2. the planner ([`planner::plan_run`]) chooses, over the whole request, the cheapest copy of
//!    each block under the device profile, the block's own copy on ties;
//! 3. a chosen chunk copy is checked in the chunk table under the engine lock (in use, at the
//!    same location: container bytes never change in place, so it holds the bytes it was
//!    listed for); one that fails is dropped from the table and the own copy is read;
//! 4. the bytes of a chosen duplicate are digested after reading and compared with the content
//!    key; a mismatch or a read error falls back to the own copy, and the duplicate is dropped.
//!
//! So a stale or damaged copy costs a read, never wrong data.
//!
//! Selective duplication (idle time, once per `duplication_interval`):
//! 1. the reads of the day were counted per content key ([`popularity`]); the day ends, and
//!    the ARC of days ranks content read on several days first;
//! 2. plan: the most popular content whose raw bytes fit a region's share of the scratch
//!    budget ([`plan_duplication`]);
//! 3. execute: each source chunk is checked in the chunk table and read, its bytes digested and
//!    compared with the key, then written to every region of a new generation of scratch
//!    files (never synced: losing them loses nothing);
//! 4. the new duplicates replace the old ones, whose files are then removed. A duplicate whose
//!    source chunk is freed is dropped at once ([`Replicas::chunk_freed`]).
//!
//! Not guaranteed: positions are a model of the layout (see [`device`]), not the device's
//! geometry; copies written before this process started are unknown until written or read
//! again; a duplicate round reads its sources under the engine lock in batches, so it delays
//! requests that arrive meanwhile by at most one batch.

pub mod device;
pub mod planner;
pub mod popularity;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use serde::Serialize;

use crate::cache::ContentKey;
use onecopy_core::chunk_store::ChunkId;
use onecopy_core::container::ChunkLocation;
use onecopy_core::fingerprint::FingerprintAlgorithm;
use onecopy_core::index::cache::{Cache, CachePolicy, EntryCache};
use onecopy_core::storage::{Storage, StorageFile};
use onecopy_core::Result;

use device::{DeviceProfile, DeviceState};
use popularity::{Candidate, Popularity};

/// Chunks the copy table lists per content key.
pub const COPIES_PER_KEY: usize = 4;
// The copy table counts a key's copies in a byte.
const _: () = assert!(COPIES_PER_KEY <= u8::MAX as usize);
/// Directory of the scratch regions, in the block face's storage.
pub const SCRATCH_DIRECTORY: &str = "scratch";
/// Content keys whose popularity is tracked at the least.
const POPULARITY_KEYS_MIN: usize = 1024;
/// Value of a copy-table entry between its insertion and the assignment of its slot.
const SLOT_PENDING: u64 = u64::MAX;

/// Settings of replica retrieval and selective duplication (part of the runtime options).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ReplicaOptions {
    /// The device model of the read planner.
    pub device_profile: DeviceProfile,
    /// Memory of the copy table (0 turns replica retrieval off).
    pub copy_table_bytes: u64,
    /// Scratch space for selective duplication, in bytes (0 turns it off).
    pub scratch_bytes: u64,
    /// Duplicates of each popular content: the number of scratch regions (paper 4: ten).
    pub duplicate_copies: u32,
    /// A duplication round runs in idle time at most this often (paper 4: daily).
    pub duplication_interval_seconds: u64,
    /// Content keys whose popularity is tracked over days, at most: four times what one
    /// scratch region holds, within this bound (and today's reads, four times that).
    pub popularity_keys: usize,
}

impl Default for ReplicaOptions {
    fn default() -> Self {
        ReplicaOptions {
            device_profile: DeviceProfile::Ssd,
            copy_table_bytes: 4 << 20,
            scratch_bytes: 0,
            duplicate_copies: 10,
            duplication_interval_seconds: 24 * 3600,
            popularity_keys: 1 << 18,
        }
    }
}

/// Figures of replica retrieval and selective duplication.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ReplicaStats {
    pub device_profile: &'static str,
    /// Content keys in the copy table, and the most it keeps.
    pub copy_table_keys: u64,
    pub copy_table_keys_limit: u64,
    /// Blocks read from the media whose content had another copy to choose from.
    pub planned_reads: u64,
    /// Blocks read from another chunk than their own.
    pub redirected_reads: u64,
    /// Blocks read from a duplicate.
    pub duplicate_reads: u64,
    /// Copies the planner chose that were no longer live (read from the own copy instead).
    pub stale_copies: u64,
    /// Reads of a chosen copy that failed or returned other bytes (read from the own copy).
    pub fallback_reads: u64,
    /// Duplication rounds run, duplicates held now, and the bytes they take.
    pub duplication_rounds: u64,
    pub duplicates: u64,
    pub duplicate_bytes: u64,
    /// Duplicates dropped because their source chunk was freed.
    pub duplicates_dropped: u64,
    /// Memory of the copy table, the duplicates' bookkeeping and the popularity of content.
    pub memory_bytes: u64,
}

/// A chunk known to hold some content.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkCopy {
    pub chunk: ChunkId,
    pub location: ChunkLocation,
}

/// A duplicate in a scratch region.
#[derive(Clone)]
pub struct Duplicate {
    pub file: Arc<dyn StorageFile>,
    pub offset: u64,
    pub bytes: u32,
    /// The modelled position of its bytes.
    pub position: u64,
}

/// One copy the planner may choose for a block.
#[derive(Clone)]
pub enum Alternative {
    Chunk(ChunkCopy),
    Duplicate(Duplicate),
}

/// The duplicates of one content.
struct DuplicateSet {
    source: ChunkId,
    copies: Vec<Duplicate>,
}

/// What a duplication round does with one content: copy `source` into every region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DuplicationChoice {
    pub key: ContentKey,
    pub source: ChunkCopy,
}

/// What a duplication round did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DuplicationReport {
    /// Content ranked popular, and the content chosen for the budget.
    pub candidates: u64,
    pub chosen: u64,
    /// Chosen content whose source changed since it was read (not copied).
    pub stale_sources: u64,
    /// The disk lacked room for the copies beside the engine's headroom: nothing was written.
    pub skipped_for_space: bool,
    /// Content duplicated, and the duplicate blocks and bytes written.
    pub duplicated: u64,
    pub blocks_written: u64,
    pub bytes_written: u64,
}

/// Chooses the content to duplicate (the plan of a round): the ranked candidates in order,
/// as long as their raw bytes fit `region_bytes`, the share of one region.
pub fn plan_duplication<K: Copy, S: Copy>(
    ranked: &[Candidate<K, S>],
    region_bytes: u64,
    bytes_of: impl Fn(&S) -> u64,
) -> Vec<Candidate<K, S>> {
    let mut used = 0u64;
    let mut chosen = Vec::new();
    for candidate in ranked {
        let bytes = bytes_of(&candidate.source);
        if used + bytes > region_bytes {
            break;
        }
        used += bytes;
        chosen.push(*candidate);
    }
    chosen
}

struct CopyTable {
    keys: Cache<ContentKey>,
    slots: Vec<([ChunkCopy; COPIES_PER_KEY], u8)>,
    free: Vec<u32>,
}

impl CopyTable {
    fn new(memory_bytes: u64) -> Option<CopyTable> {
        let per_key = std::mem::size_of::<([ChunkCopy; COPIES_PER_KEY], u8)>() as u64
            + CachePolicy::Lru.memory_bytes_with_keys::<ContentKey>(1) as u64;
        let entries = (memory_bytes / per_key) as usize;
        if entries == 0 {
            return None;
        }
        let empty = ChunkCopy {
            chunk: 0,
            location: ChunkLocation::default(),
        };
        Some(CopyTable {
            keys: Cache::with_entries(CachePolicy::Lru, entries),
            slots: vec![([empty; COPIES_PER_KEY], 0); entries],
            free: (0..entries as u32).rev().collect(),
        })
    }

    fn copies(&self, key: &ContentKey) -> &[ChunkCopy] {
        match self.keys.peek(key) {
            Some(slot) => {
                let (copies, count) = &self.slots[slot as usize];
                &copies[..*count as usize]
            }
            None => &[],
        }
    }

    /// Lists `copy` for `key`; with `create` false, only when the key is listed already.
    fn add(&mut self, key: ContentKey, copy: ChunkCopy, create: bool) {
        let slot = match self.keys.get(&key) {
            Some(slot) => slot,
            None if !create => return,
            None => {
                if let Some(evicted) = self.keys.insert_evicting(&key, SLOT_PENDING) {
                    assert_ne!(
                        evicted, SLOT_PENDING,
                        "the key inserted is never the victim"
                    );
                    self.free.push(evicted as u32);
                }
                let slot = self.free.pop().expect("an insertion leaves a free slot");
                self.keys.set_value(&key, u64::from(slot));
                self.slots[slot as usize].1 = 0;
                u64::from(slot)
            }
        };
        let (copies, count) = &mut self.slots[slot as usize];
        let listed = &mut copies[..*count as usize];
        if let Some(same) = listed.iter_mut().find(|listed| listed.chunk == copy.chunk) {
            *same = copy;
            return;
        }
        if (*count as usize) < COPIES_PER_KEY {
            copies[*count as usize] = copy;
            *count += 1;
        } else {
            // The oldest copy leaves.
            copies.rotate_left(1);
            copies[COPIES_PER_KEY - 1] = copy;
        }
    }

    fn remove(&mut self, key: &ContentKey, chunk: ChunkId) {
        let Some(slot) = self.keys.peek(key) else {
            return;
        };
        let (copies, count) = &mut self.slots[slot as usize];
        if let Some(index) = copies[..*count as usize]
            .iter()
            .position(|copy| copy.chunk == chunk)
        {
            copies.copy_within(index + 1..*count as usize, index);
            *count -= 1;
        }
    }
}

struct Inner {
    copies: Option<CopyTable>,
    duplicates: HashMap<ContentKey, DuplicateSet>,
    /// Content keys of duplicated content, by source chunk.
    duplicated_sources: HashMap<ChunkId, ContentKey>,
    popularity: Option<Popularity<ContentKey, ChunkCopy>>,
    /// Scratch files of the current generation.
    scratch_files: Vec<String>,
    generation: u64,
    last_round: Option<Instant>,
    stats: ReplicaStats,
}

impl Inner {
    /// Drops every duplicate of `key`.
    fn drop_duplicates(&mut self, key: &ContentKey) {
        if let Some(set) = self.duplicates.remove(key) {
            self.duplicated_sources.remove(&set.source);
            let blocks = set.copies.len() as u64;
            let bytes: u64 = set.copies.iter().map(|copy| u64::from(copy.bytes)).sum();
            self.stats.duplicates_dropped += blocks;
            self.stats.duplicates = self.stats.duplicates.saturating_sub(blocks);
            self.stats.duplicate_bytes = self.stats.duplicate_bytes.saturating_sub(bytes);
        }
    }
}

/// Replica retrieval and selective duplication of one engine; internally locked, so the read
/// path uses it without the engine lock.
pub struct Replicas {
    options: ReplicaOptions,
    device: DeviceState,
    container_bytes: u64,
    key_algorithm: FingerprintAlgorithm,
    /// True while any duplicate exists.
    duplicates_held: AtomicBool,
    inner: Mutex<Inner>,
}

impl Replicas {
    /// Replica state for an engine whose containers are `container_bytes` long and whose
    /// content keys are digests of `key_algorithm`.
    pub fn new(
        options: ReplicaOptions,
        container_bytes: u64,
        key_algorithm: FingerprintAlgorithm,
    ) -> Replicas {
        let retrieval = options.device_profile != DeviceProfile::None;
        let copies = if retrieval {
            CopyTable::new(options.copy_table_bytes)
        } else {
            None
        };
        let duplicating = retrieval && options.scratch_bytes > 0 && options.duplicate_copies > 0;
        let popularity = duplicating.then(|| {
            // Four times the content one region holds, as 4 KiB blocks: enough to rank, and a
            // memory that follows the scratch budget.
            let region_blocks = options.scratch_bytes / u64::from(options.duplicate_copies) / 4096;
            let keys = (region_blocks.saturating_mul(4) as usize).clamp(
                POPULARITY_KEYS_MIN,
                options.popularity_keys.max(POPULARITY_KEYS_MIN),
            );
            Popularity::new(keys, keys.saturating_mul(4))
        });
        Replicas {
            device: DeviceState::new(options.device_profile),
            container_bytes,
            key_algorithm,
            duplicates_held: AtomicBool::new(false),
            inner: Mutex::new(Inner {
                copies,
                duplicates: HashMap::new(),
                duplicated_sources: HashMap::new(),
                popularity,
                scratch_files: Vec::new(),
                generation: 0,
                last_round: None,
                stats: ReplicaStats {
                    device_profile: options.device_profile.name(),
                    ..ReplicaStats::default()
                },
            }),
            options,
        }
    }

    /// True when reads may go to other copies than their own.
    pub fn retrieval_enabled(&self) -> bool {
        self.options.device_profile != DeviceProfile::None
    }

    /// True when selective duplication runs.
    pub fn duplication_enabled(&self) -> bool {
        self.inner.lock().popularity.is_some()
    }

    pub fn options(&self) -> &ReplicaOptions {
        &self.options
    }

    pub fn device(&self) -> &DeviceState {
        &self.device
    }

    /// The modelled position of a chunk at `location` (see [`device`]).
    pub fn position(&self, location: &ChunkLocation) -> u64 {
        location.container * self.container_bytes + u64::from(location.offset)
    }

    /// Records the layout's span: containers up to `container_id_next` (the `hdd` profile's
    /// stroke).
    pub fn set_layout(&self, container_id_next: u64) {
        self.device
            .set_stroke(container_id_next.saturating_mul(self.container_bytes));
    }

    /// The digest of content keys (for checking duplicates).
    pub fn key_algorithm(&self) -> FingerprintAlgorithm {
        self.key_algorithm
    }

    /// Removes the scratch files a previous run left (duplicates are never trusted across
    /// runs). Called by an open for writing.
    pub fn remove_leftovers(storage: &dyn Storage) -> Result<usize> {
        let names = storage.list(SCRATCH_DIRECTORY)?;
        for name in &names {
            storage.remove(name)?;
        }
        Ok(names.len())
    }

    /// Records a copy stored by a write (a block stored without deduplication, with its
    /// content key): listed in the copy table.
    pub fn note_stored(&self, key: ContentKey, copy: ChunkCopy) {
        if !self.retrieval_enabled() {
            return;
        }
        if let Some(copies) = self.inner.lock().copies.as_mut() {
            copies.add(key, copy, true);
        }
    }

    /// Records a new chunk appended by a write: on a disk the head goes there.
    pub fn note_appended(&self, location: &ChunkLocation) {
        self.device.moved_to(self.position(location));
    }

    /// The other copies of content `key` than `own`, for a block read from the media; counts
    /// the read for selective duplication, and lists `own` beside the copies when the copy
    /// table knows the key already.
    pub fn alternatives(&self, key: ContentKey, own: ChunkCopy) -> Vec<Alternative> {
        if !self.retrieval_enabled() {
            return Vec::new();
        }
        let mut inner = self.inner.lock();
        if let Some(popularity) = inner.popularity.as_mut() {
            popularity.note(key, own);
        }
        let mut alternatives: Vec<Alternative> = Vec::new();
        if let Some(copies) = inner.copies.as_mut() {
            let listed = copies.copies(&key);
            let known = !listed.is_empty();
            alternatives.extend(
                listed
                    .iter()
                    .filter(|copy| copy.chunk != own.chunk)
                    .map(|copy| Alternative::Chunk(*copy)),
            );
            if known {
                copies.add(key, own, false);
            }
        }
        if let Some(set) = inner.duplicates.get(&key) {
            alternatives.extend(set.copies.iter().cloned().map(Alternative::Duplicate));
        }
        if !alternatives.is_empty() {
            inner.stats.planned_reads += 1;
        }
        alternatives
    }

    /// Records a copy whose content key was found by digesting its bytes (a read of a chunk
    /// whose record carries no key): listed in the copy table.
    pub fn note_named(&self, key: ContentKey, copy: ChunkCopy) {
        if !self.retrieval_enabled() {
            return;
        }
        if let Some(copies) = self.inner.lock().copies.as_mut() {
            copies.add(key, copy, true);
        }
    }

    /// The modelled position of an alternative.
    pub fn alternative_position(&self, alternative: &Alternative) -> u64 {
        match alternative {
            Alternative::Chunk(copy) => self.position(&copy.location),
            Alternative::Duplicate(duplicate) => duplicate.position,
        }
    }

    /// Drops a copy found no longer live.
    pub fn stale_copy(&self, key: ContentKey, chunk: ChunkId) {
        let mut inner = self.inner.lock();
        inner.stats.stale_copies += 1;
        if let Some(copies) = inner.copies.as_mut() {
            copies.remove(&key, chunk);
        }
    }

    /// Counts a read served by another copy than the block's own.
    pub fn note_redirected(&self, duplicate: bool) {
        let mut inner = self.inner.lock();
        inner.stats.redirected_reads += 1;
        inner.stats.duplicate_reads += u64::from(duplicate);
    }

    /// Counts a chosen copy that could not be used (read error, other bytes); a duplicate is
    /// dropped with every other duplicate of its content.
    pub fn note_fallback(&self, key: ContentKey, duplicate: bool) {
        let mut inner = self.inner.lock();
        inner.stats.fallback_reads += 1;
        if duplicate {
            inner.drop_duplicates(&key);
        }
    }

    /// Drops the duplicates of content whose source chunk `chunk` was freed.
    pub fn chunk_freed(&self, chunk: ChunkId) {
        // Called for every chunk an overwrite frees: without duplicates, no lock is taken.
        if !self.duplicates_held.load(Ordering::Relaxed) {
            return;
        }
        let mut inner = self.inner.lock();
        if let Some(key) = inner.duplicated_sources.get(&chunk).copied() {
            inner.drop_duplicates(&key);
            if let Some(popularity) = inner.popularity.as_mut() {
                popularity.forget(&key);
            }
        }
    }

    /// True when a duplication round is due: duplication on, and the interval passed since
    /// the last round (or none ran yet and the interval passed since `opened`).
    pub fn duplication_due(&self, opened: Instant) -> bool {
        let inner = self.inner.lock();
        if inner.popularity.is_none() {
            return false;
        }
        let since = inner.last_round.unwrap_or(opened);
        since.elapsed().as_secs() >= self.options.duplication_interval_seconds
    }

    /// Ends the day of popularity and plans a round: the content to duplicate, within one
    /// region's share of the scratch budget.
    pub fn plan_round(&self) -> (u64, Vec<DuplicationChoice>) {
        let mut inner = self.inner.lock();
        inner.last_round = Some(Instant::now());
        let Some(popularity) = inner.popularity.as_mut() else {
            return (0, Vec::new());
        };
        popularity.end_day();
        let ranked = popularity.ranked();
        let region_bytes = self.options.scratch_bytes / u64::from(self.options.duplicate_copies);
        let chosen = plan_duplication(&ranked, region_bytes, |source: &ChunkCopy| {
            u64::from(source.location.raw_bytes)
        });
        (
            ranked.len() as u64,
            chosen
                .into_iter()
                .map(|candidate| DuplicationChoice {
                    key: candidate.key,
                    source: candidate.source,
                })
                .collect(),
        )
    }

    /// Writes a new generation of duplicates, `contents` (key, source chunk, bytes) into every
    /// region of a layout spanning `span` positions, and replaces the current duplicates with
    /// them; the old generation's files are removed. Nothing is synced: duplicates are derived.
    /// On failure, the new files are removed and the current duplicates stay.
    pub fn install_generation(
        &self,
        storage: &dyn Storage,
        span: u64,
        contents: &[(ContentKey, ChunkId, Vec<u8>)],
    ) -> Result<(u64, u64)> {
        let regions = self.options.duplicate_copies;
        let positions = device::region_positions(span, regions);
        let generation = {
            let mut inner = self.inner.lock();
            inner.generation += 1;
            inner.generation
        };
        let mut files = Vec::new();
        let mut sets: HashMap<ContentKey, DuplicateSet> = HashMap::new();
        let mut written = (0u64, 0u64);
        let result = (|| -> Result<()> {
            if contents.is_empty() {
                return Ok(());
            }
            // Every region holds the same bytes, in the same order.
            let mut buffer = Vec::new();
            let mut offsets = Vec::with_capacity(contents.len());
            for (_, _, bytes) in contents {
                offsets.push(buffer.len() as u64);
                buffer.extend_from_slice(bytes);
            }
            for (region, &anchor) in positions.iter().enumerate() {
                let name = format!("{SCRATCH_DIRECTORY}/{generation:016x}.{region:04}");
                let file = storage.open(&name, true)?;
                files.push(name);
                file.write_at(0, &buffer)?;
                for ((key, source, bytes), &offset) in contents.iter().zip(&offsets) {
                    sets.entry(*key)
                        .or_insert_with(|| DuplicateSet {
                            source: *source,
                            copies: Vec::new(),
                        })
                        .copies
                        .push(Duplicate {
                            file: Arc::clone(&file),
                            offset,
                            bytes: bytes.len() as u32,
                            position: anchor + offset,
                        });
                }
                written.0 += contents.len() as u64;
                written.1 += buffer.len() as u64;
            }
            Ok(())
        })();
        if let Err(error) = result {
            for name in &files {
                let _ = storage.remove(name);
            }
            return Err(error);
        }
        let old_files = {
            let mut inner = self.inner.lock();
            inner.duplicated_sources = sets.iter().map(|(key, set)| (set.source, *key)).collect();
            self.duplicates_held
                .store(!sets.is_empty(), Ordering::Relaxed);
            inner.duplicates = sets;
            inner.stats.duplication_rounds += 1;
            inner.stats.duplicates = written.0;
            inner.stats.duplicate_bytes = written.1;
            std::mem::replace(&mut inner.scratch_files, files)
        };
        // Readers holding a handle of an old file still read its bytes; new reads no longer
        // find it.
        for name in old_files {
            storage.remove(&name)?;
        }
        Ok(written)
    }

    /// Drops every duplicate and removes their files (the disk is full: derived data gives
    /// its room back first).
    pub fn drop_all(&self, storage: &dyn Storage) -> Result<()> {
        let files = {
            let mut inner = self.inner.lock();
            let dropped = inner.stats.duplicates;
            inner.stats.duplicates_dropped += dropped;
            inner.stats.duplicates = 0;
            inner.stats.duplicate_bytes = 0;
            inner.duplicates.clear();
            inner.duplicated_sources.clear();
            self.duplicates_held.store(false, Ordering::Relaxed);
            std::mem::take(&mut inner.scratch_files)
        };
        for name in files {
            storage.remove(&name)?;
        }
        Ok(())
    }

    /// Current figures.
    pub fn stats(&self) -> ReplicaStats {
        let inner = self.inner.lock();
        let mut stats = inner.stats.clone();
        if let Some(copies) = &inner.copies {
            stats.copy_table_keys = copies.keys.len() as u64;
            stats.copy_table_keys_limit = copies.keys.entries_limit() as u64;
        }
        let copy_table = inner.copies.as_ref().map_or(0, |copies| {
            copies.keys.memory_bytes()
                + copies.slots.capacity() * std::mem::size_of::<([ChunkCopy; COPIES_PER_KEY], u8)>()
                + copies.free.capacity() * 4
        });
        let duplicates = inner.duplicates.len()
            * (std::mem::size_of::<(ContentKey, DuplicateSet)>()
                + self.options.duplicate_copies as usize * std::mem::size_of::<Duplicate>());
        stats.memory_bytes = (copy_table
            + duplicates
            + inner
                .popularity
                .as_ref()
                .map_or(0, |popularity| popularity.memory_bytes()))
            as u64;
        stats
    }
}
