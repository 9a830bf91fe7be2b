//! Work beside the request path: file-system map derivation, deferred deduplication and
//! compaction.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde::Serialize;

use crate::error::Result;
use onecopy_core::chunk_store::{
    read_located, unix_seconds, ChunkChange, ChunkId, ChunkRead, Placement,
};
use onecopy_core::gc::{self, CompactionOptions, CompactionPlan, CompactionReport};
use onecopy_core::Error;

use super::{map_entry, Engine, EngineState};
use crate::cache::ContentKey;
use crate::changes::BlockChange;
pub use crate::replicas::DuplicationReport as DuplicationOutcome;
use crate::volume::{VolumeId, VolumeRecord};

use super::io::deferred_owner_parts;
use super::span::block_spans;

/// Chunk ids examined per lock hold by deferred deduplication, so requests keep flowing.
const DEDUP_BATCH_CHUNKS: u64 = 4096;
/// Sources checked per lock hold by a duplication round.
const DUPLICATION_BATCH_CHUNKS: usize = 1024;
/// How often the background thread looks for idle time.
const BACKGROUND_TICK: Duration = Duration::from_millis(250);

/// What a deferred-deduplication pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DedupReport {
    /// Chunks written for deferred deduplication that were looked at.
    pub examined: u64,
    /// Chunks found to duplicate a stored chunk and merged into it.
    pub deduplicated: u64,
    /// Chunks found unique and added to the index.
    pub indexed: u64,
    /// Chunks changed too recently to deduplicate yet.
    pub too_recent: u64,
}

/// When the background thread runs the next deferred-deduplication pass.
#[derive(Default)]
struct DeferredSchedule {
    /// The deferred-block counter at the last pass.
    deferred_blocks_seen: u64,
    /// When blocks found too recent by the last pass become old enough.
    retry_at: Option<std::time::Instant>,
}

/// Stops the background thread when dropped.
pub struct BackgroundHandle {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for BackgroundHandle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Engine {
    /// Re-reads the start of volume `id` and derives its file-system metadata map when a
    /// superblock with a new layout is there. Failures leave the volume without a map (all
    /// blocks deduplicated as data), which is safe.
    pub(crate) fn derive_filesystem_map(&self, state: &mut EngineState, id: VolumeId) {
        let Some(volume) = state.volumes.get(&id) else {
            return;
        };
        let record = Arc::clone(&volume.record);
        if !record.hints.filesystem {
            return;
        }
        let probe_bytes = crate::hints::fs::SUPERBLOCK_PROBE_BYTES.min(record.size_bytes as usize);
        let mut probe = vec![0u8; probe_bytes];
        if self
            .read_bytes_locked(state, &record, 0, &mut probe)
            .is_err()
        {
            return;
        }
        let Some(detected) = crate::hints::fs::detect_superblock(0, &probe) else {
            state
                .volumes
                .get_mut(&id)
                .expect("volume exists")
                .filesystem = None;
            return;
        };
        let current = state.volumes[&id].filesystem.clone();
        if current.is_some_and(|map| *map.layout() == detected.layout) {
            return;
        }
        // The file-system reader takes any byte source, as an I/O reader; the engine's error
        // travels inside the I/O error, whole.
        let mut read = |offset: u64, buffer: &mut [u8]| -> std::io::Result<()> {
            self.read_bytes_locked(state, &record, offset, buffer)
                .map_err(std::io::Error::other)
        };
        let derived = crate::hints::fs::derive_metadata_map(record.size_bytes, &mut read);
        let map = derived.ok().map(Arc::new);
        if map.is_some() {
            state.counters.filesystem_maps_derived += 1;
        }
        state
            .volumes
            .get_mut(&id)
            .expect("volume exists")
            .filesystem = map;
    }

    /// Reads any byte range of a volume under the lock.
    fn read_bytes_locked(
        &self,
        state: &mut EngineState,
        record: &VolumeRecord,
        offset: u64,
        out: &mut [u8],
    ) -> Result<()> {
        if offset + out.len() as u64 > record.size_bytes {
            return Err(Error::InvalidArgument(format!(
                "read past the end of volume {}",
                record.name
            ))
            .into());
        }
        let mut block = vec![0u8; record.block_bytes as usize];
        for span in block_spans(offset, out.len() as u64, record.block_bytes) {
            self.read_block_locked(state, record, span.block, &mut block)?;
            out[span.in_request()].copy_from_slice(&block[span.in_block()]);
        }
        Ok(())
    }

    /// Deduplicates chunks written for deferred deduplication that stayed unchanged at least
    /// `minimum_age_seconds` (default: each volume's own setting). `volume` limits the pass
    /// to one volume. Works in batches, releasing the lock between them.
    pub fn deduplicate_deferred(
        &self,
        volume: Option<VolumeId>,
        minimum_age_seconds: Option<u64>,
    ) -> Result<DedupReport> {
        let mut report = DedupReport::default();
        let mut next = 1;
        loop {
            // One batch per lock hold.
            let done = self.change(|state| {
                let end = state.chunks.state().chunk_id_next;
                if next >= end {
                    return Ok(true);
                }
                let batch_end = (next + DEDUP_BATCH_CHUNKS).min(end);
                let ids = next..batch_end;
                self.deduplicate_batch(state, ids, volume, minimum_age_seconds, &mut report)?;
                next = batch_end;
                Ok(false)
            })?;
            if done {
                break;
            }
        }
        self.change(|state| self.checkpoint_if_due(state))?;
        Ok(report)
    }

    fn deduplicate_batch(
        &self,
        state: &mut EngineState,
        ids: std::ops::Range<ChunkId>,
        only_volume: Option<VolumeId>,
        minimum_age_seconds: Option<u64>,
        report: &mut DedupReport,
    ) -> Result<()> {
        let now = unix_seconds();
        let algorithm = self.config().fingerprint;
        let mut data = Vec::new();
        for id in ids {
            let record = state.chunks.record(&mut state.pages, id)?;
            if !record.in_use || record.indexed {
                continue;
            }
            let Some((volume_id, block)) = deferred_owner_parts(record.owner) else {
                continue;
            };
            if only_volume.is_some_and(|only| only != volume_id) {
                continue;
            }
            let Some(volume) = state.volumes.get(&volume_id) else {
                continue;
            };
            let volume_record = Arc::clone(&volume.record);
            let age = minimum_age_seconds
                .or(volume_record.hints.deferred_seconds)
                .unwrap_or(0);
            report.examined += 1;
            if now.saturating_sub(record.written_at) < age {
                report.too_recent += 1;
                continue;
            }
            let map = volume.map;
            if map_entry(&mut state.pages, &map, block)? != id {
                return Err(Error::corrupt(
                    format!("chunk {id}"),
                    format!(
                        "its owner, block {block} of volume {}, no longer maps to it",
                        volume_record.name
                    ),
                )
                .into());
            }
            data.resize(record.location.raw_bytes as usize, 0);
            state.chunks.read_into(&mut state.pages, id, &mut data)?;
            let fingerprint = algorithm.hash(&data);
            match state.chunks.place(&mut state.pages, &fingerprint, &data)? {
                Placement::Duplicate(existing) => {
                    state
                        .chunks
                        .reference(&mut state.pages, existing, &mut state.chunk_changes)?;
                    self.remap(state, &volume_record, block, existing)?;
                    report.deduplicated += 1;
                }
                // A chunk that cannot be placed in the index (a chain too long or broken, a
                // full chunk) is indexed anyway: this pass would otherwise examine it again
                // every time.
                Placement::Indexed | Placement::Unindexed => {
                    let change = ChunkChange::Indexed { id, fingerprint };
                    state.chunks.apply(&mut state.pages, &change)?;
                    state.changes.push(BlockChange::Chunk(change));
                    report.indexed += 1;
                }
            }
            self.log_changes(state)?;
        }
        Ok(())
    }

    /// Runs a round of selective duplication now (see [`crate::replicas`]): ends the day of
    /// popularity, copies the most popular content into every scratch region within the
    /// scratch budget, and replaces the previous duplicates. Reads its sources under the lock
    /// in batches. Does nothing when selective duplication is off, and skips the copies when
    /// the disk lacks room for them beside the engine's own headroom.
    pub fn duplicate_popular(&self) -> Result<DuplicationOutcome> {
        let (candidates, chosen) = self.replicas.plan_round();
        let mut report = DuplicationOutcome {
            candidates,
            chosen: chosen.len() as u64,
            ..DuplicationOutcome::default()
        };
        if !self.replicas.duplication_enabled() {
            return Ok(report);
        }
        let copies = u64::from(self.replicas.options().duplicate_copies);
        let needed: u64 = chosen
            .iter()
            .map(|choice| u64::from(choice.source.location.raw_bytes) * copies)
            .sum();
        if let Some(free) = self.storage().available_bytes()? {
            if free < needed.saturating_add(super::space::DUPLICATION_HEADROOM_BYTES) {
                report.skipped_for_space = true;
                return Ok(report);
            }
        }
        let key_algorithm = self.replicas.key_algorithm();
        let mut contents = Vec::with_capacity(chosen.len());
        let mut span = 0;
        for batch in chosen.chunks(DUPLICATION_BATCH_CHUNKS) {
            let mut files = Vec::new();
            {
                let mut guard = self.lock_usable()?;
                let state = &mut *guard;
                span = state.chunks.state().container_id_next
                    * self.config().containers.container_bytes;
                for choice in batch {
                    let source = choice.source;
                    let live = state
                        .chunks
                        .record(&mut state.pages, source.chunk)
                        .is_ok_and(|record| record.in_use && record.location == source.location);
                    if !live {
                        report.stale_sources += 1;
                        continue;
                    }
                    let mut bytes = vec![0u8; source.location.raw_bytes as usize];
                    match state
                        .chunks
                        .plan_read(&mut state.pages, source.chunk, &mut bytes)?
                    {
                        ChunkRead::Copied => contents.push((choice.key, source, bytes)),
                        ChunkRead::File { file, location } => {
                            files.push((choice.key, source, file, location, bytes))
                        }
                    }
                }
            }
            // Outside the lock: requests go on while the sources are read.
            for (key, source, file, location, mut bytes) in files {
                if read_located(file.as_ref(), &location, &mut bytes).is_ok() {
                    contents.push((key, source, bytes));
                } else {
                    report.stale_sources += 1;
                }
            }
        }
        // A duplicate holds exactly its content's bytes: checked once here, and again at
        // every read.
        contents.retain(|(key, _, bytes)| {
            let same = ContentKey(key_algorithm.hash(bytes)) == *key;
            report.stale_sources += u64::from(!same);
            same
        });
        report.duplicated = contents.len() as u64;
        // Written in the order of their sources, so content read together lies together.
        contents.sort_by_key(|(_, source, _)| (source.location.container, source.location.offset));
        let contents: Vec<(ContentKey, ChunkId, Vec<u8>)> = contents
            .into_iter()
            .map(|(key, source, bytes)| (key, source.chunk, bytes))
            .collect();
        let (blocks, bytes) =
            self.replicas
                .install_generation(self.storage().as_ref(), span, &contents)?;
        report.blocks_written = blocks;
        report.bytes_written = bytes;
        Ok(report)
    }

    /// Plans (and unless `dry_run`, runs) container compaction.
    pub fn compact(
        &self,
        options: &CompactionOptions,
        dry_run: bool,
    ) -> Result<(CompactionPlan, Option<CompactionReport>)> {
        self.change(|state| {
            let EngineState { pages, chunks, .. } = &mut *state;
            let plan = gc::plan_compaction(chunks, pages, options)?;
            if dry_run || plan.containers.is_empty() {
                return Ok((plan, None));
            }
            let mut chunk_changes = Vec::new();
            let report = gc::execute_compaction(chunks, pages, &plan, &mut chunk_changes)?;
            state
                .changes
                .extend(chunk_changes.into_iter().map(BlockChange::Chunk));
            self.log_changes(state)?;
            // The checkpoint makes the relocations durable and then removes the old
            // containers.
            self.checkpoint_locked(state)?;
            Ok((plan, Some(report)))
        })
    }

    /// Starts a thread that, whenever the engine has been idle for
    /// [`RuntimeOptions::idle_milliseconds`](crate::config::RuntimeOptions), runs deferred
    /// deduplication for volumes that use it and checkpoints a non-empty journal.
    pub fn start_background(self: &Arc<Self>) -> BackgroundHandle {
        let stop = Arc::new(AtomicBool::new(false));
        let engine = Arc::clone(self);
        let stopping = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("onecopy-background".into())
            .spawn(move || {
                let mut schedule = DeferredSchedule::default();
                while !stopping.load(Ordering::Relaxed) {
                    std::thread::sleep(BACKGROUND_TICK);
                    if engine.idle_milliseconds() < engine.runtime().idle_milliseconds {
                        continue;
                    }
                    engine.background_step(&mut schedule);
                }
            })
            .expect("spawning the background thread");
        BackgroundHandle {
            stop,
            thread: Some(thread),
        }
    }

    fn background_step(&self, schedule: &mut DeferredSchedule) {
        // A deferred pass reads the whole chunk table, so it runs only when deferred blocks
        // were written since the last pass, or when the last pass left blocks that were too
        // recent and the shortest deferral has passed since.
        let (deferred, written, shortest) = {
            let state = self.state.lock();
            let volumes: Vec<(VolumeId, u64)> = state
                .volumes
                .values()
                .filter_map(|volume| {
                    volume
                        .record
                        .hints
                        .deferred_seconds
                        .map(|age| (volume.record.id, age))
                })
                .collect();
            let shortest = volumes.iter().map(|(_, age)| *age).min().unwrap_or(0);
            (volumes, state.counters.deferred_blocks, shortest)
        };
        let now = std::time::Instant::now();
        let due = written != schedule.deferred_blocks_seen
            || schedule.retry_at.is_some_and(|at| now >= at);
        if !deferred.is_empty() && due {
            let mut too_recent = 0;
            for (volume, _) in &deferred {
                match self.deduplicate_deferred(Some(*volume), None) {
                    Ok(report) => too_recent += report.too_recent,
                    Err(error) => {
                        eprintln!("onecopy: deferred deduplication failed: {error}");
                        return;
                    }
                }
            }
            schedule.deferred_blocks_seen = written;
            schedule.retry_at =
                (too_recent > 0).then(|| now + Duration::from_secs(shortest.max(1)));
        }
        if self.replicas.duplication_due(self.opened) {
            if let Err(error) = self.duplicate_popular() {
                eprintln!("onecopy: selective duplication failed: {error}");
            }
        }
        let mut state = self.state.lock();
        if state.failure.is_none()
            && state
                .journal
                .as_ref()
                .is_some_and(|journal| journal.bytes() > 0)
        {
            let result = self.guarded(&mut state, |state| self.checkpoint_locked(state));
            if let Err(error) = result {
                eprintln!("onecopy: background checkpoint failed: {error}");
            }
        }
    }
}
