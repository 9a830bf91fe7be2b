//! The request path: read, write, trim, write zeroes, block status, cache.

use std::sync::Arc;

use crate::error::{BlockError, Result};
use onecopy_core::chunk_store::{
    read_located, unix_seconds, ChunkId, ChunkRead, NewChunk, ZERO_CHUNK,
};
use onecopy_core::container::ChunkLocation;
use onecopy_core::fingerprint::Fingerprint;
use onecopy_core::index::warm::warm;
use onecopy_core::pages::RecordArea;
use onecopy_core::storage::StorageFile;
use onecopy_core::Error;
use onecopy_nbd::{AllocationExtent, WriteRequest};

use super::span::{block_spans, BlockSpan};
use super::{map_entry, set_map_entry, Engine, EngineState, LOST_CHUNK};
use crate::cache::ContentKey;
use crate::changes::{BlockChange, RECORD_RELEASED_BLOCKS_MAX};
use crate::hints::{decide_write, NoDedupReason, WriteDecision};
use crate::replicas::planner::{plan_run, BlockCandidates};
use crate::replicas::{Alternative, ChunkCopy};
use crate::volume::{VolumeId, VolumeRecord, VOLUME_BLOCKS_MAX, VOLUME_ID_BITS, VOLUME_ID_MAX};

/// Most blocks one block-status request examines; the protocol lets a reply cover less than
/// was asked, and clients ask again for the rest.
pub const BLOCK_STATUS_BLOCKS_MAX: u64 = 1 << 18;
/// Largest read or write the engine accepts (the NBD layer enforces its own, smaller limit).
pub const REQUEST_BYTES_MAX: u64 = 1 << 30;

/// A whole block's digest, computed before the engine lock is taken: its fingerprint and,
/// when chunks are stored uncompressed, the CRC-32C of its bytes (a compressed chunk's
/// checksum is of the compressed bytes, computed when it is stored).
#[derive(Clone, Copy, Debug)]
struct BlockDigest {
    fingerprint: Fingerprint,
    checksum: Option<u32>,
    /// The content key, when the content cache is on ([`ContentCache`]): the fingerprint
    /// itself unless that is weak.
    ///
    /// [`ContentCache`]: crate::cache::ContentCache
    content: Option<ContentKey>,
}

/// How [`Engine::store_block`] stores one block: the write decision, with the digest that
/// deduplicating the block needs.
#[derive(Clone, Copy, Debug)]
enum StoreAs {
    /// All zeros: nothing is stored.
    Zero,
    /// Looked up in the index by its digest; stored only when new.
    Deduplicate(BlockDigest),
    /// Stored now, owned by its block, deduplicated later if it stays unchanged; with its
    /// content key when the content cache is on.
    Deferred(Option<ContentKey>),
    /// Stored, owned by its block, never deduplicated; with its content key when the content
    /// cache is on.
    NoDedup(NoDedupReason, Option<ContentKey>),
}

impl StoreAs {
    /// How a block decided so is stored, unless it is to be deduplicated: that needs its
    /// digest.
    fn without_digest(decision: WriteDecision) -> Option<StoreAs> {
        match decision {
            WriteDecision::Zero => Some(StoreAs::Zero),
            WriteDecision::Deduplicate => None,
            WriteDecision::Deferred => Some(StoreAs::Deferred(None)),
            WriteDecision::NoDedup(reason) => Some(StoreAs::NoDedup(reason, None)),
        }
    }
}

/// How one block of a write is handled.
enum BlockPlan {
    /// Covers the whole block: stored so.
    Whole(StoreAs),
    /// Covers the whole block, to be deduplicated: [`Engine::digest_plans`] digests it, with
    /// every such block of the batch and before the lock is taken, and makes it `Whole`.
    Digest,
    /// Covers part of the block: read, merge and decide under the lock.
    Partial,
}

// The owner tag of a chunk stored without a fingerprint names the block that owns it, so
// that deferred deduplication finds the map entry to change. From the top bit down: a
// deferred flag (1 bit), the volume id (`VOLUME_ID_BITS`), the block (`OWNER_BLOCK_BITS`).
// Deduplicated chunks have owner 0.
/// Bits of the block number in an owner tag.
const OWNER_BLOCK_BITS: u32 = 42;
/// Where the volume id starts in an owner tag.
const OWNER_VOLUME_SHIFT: u32 = OWNER_BLOCK_BITS;
/// The bit of an owner tag that marks a chunk written for deferred deduplication.
const OWNER_DEFERRED_BIT: u32 = OWNER_VOLUME_SHIFT + VOLUME_ID_BITS;
const OWNER_BLOCK_MASK: u64 = (1 << OWNER_BLOCK_BITS) - 1;
const OWNER_VOLUME_MASK: u64 = (1 << VOLUME_ID_BITS) - 1;

// The three fields fill the 64-bit tag exactly.
const _: () = assert!(OWNER_DEFERRED_BIT == u64::BITS - 1);
// Every block of the largest volume, in the smallest blocks, has a block number that fits.
const _: () = assert!(VOLUME_BLOCKS_MAX <= 1 << OWNER_BLOCK_BITS);
// Every volume id `create_volume` hands out fits.
const _: () = assert!(VOLUME_ID_MAX as u64 == OWNER_VOLUME_MASK);

/// The owner tag of the chunk of block `block` of volume `volume`.
fn owner_tag(volume: VolumeId, block: u64, deferred: bool) -> u64 {
    // Volumes are created with ids up to VOLUME_ID_MAX and blocks below their block count.
    assert!(
        volume <= VOLUME_ID_MAX,
        "volume id {volume} exceeds its owner-tag field"
    );
    assert!(
        block < VOLUME_BLOCKS_MAX,
        "block {block} exceeds its owner-tag field"
    );
    (u64::from(deferred) << OWNER_DEFERRED_BIT) | (u64::from(volume) << OWNER_VOLUME_SHIFT) | block
}

/// Owner tag of a chunk written for deferred deduplication.
pub(crate) fn deferred_owner(volume: VolumeId, block: u64) -> u64 {
    owner_tag(volume, block, true)
}

/// Owner tag of a chunk written with a no-dedup hint (never deduplicated later).
fn permanent_owner(volume: VolumeId, block: u64) -> u64 {
    owner_tag(volume, block, false)
}

/// The volume and block of a deferred chunk's owner tag.
pub(crate) fn deferred_owner_parts(owner: u64) -> Option<(VolumeId, u64)> {
    (owner >> OWNER_DEFERRED_BIT == 1).then_some((
        ((owner >> OWNER_VOLUME_SHIFT) & OWNER_VOLUME_MASK) as VolumeId,
        owner & OWNER_BLOCK_MASK,
    ))
}

/// Checks that `[offset, offset + length)` lies inside the volume.
fn check_range(record: &VolumeRecord, offset: u64, length: u64) -> Result<()> {
    let end = offset.checked_add(length);
    if end.is_none_or(|end| end > record.size_bytes) {
        return Err(Error::InvalidArgument(format!(
            "request of {length} bytes at offset {offset} is outside volume {} ({} bytes)",
            record.name, record.size_bytes
        ))
        .into());
    }
    Ok(())
}

/// Like [`check_range`], for requests that carry data in memory (read and write), which are
/// also bounded by [`REQUEST_BYTES_MAX`]. Trim, write-zeroes, block status and cache carry no
/// data and may span the whole volume.
fn check_payload_range(record: &VolumeRecord, offset: u64, length: u64) -> Result<()> {
    if length > REQUEST_BYTES_MAX {
        return Err(Error::InvalidArgument(format!(
            "request of {length} bytes exceeds the {REQUEST_BYTES_MAX}-byte limit"
        ))
        .into());
    }
    check_range(record, offset, length)
}

/// The chunk block `block` of `record` maps to, for reading it: a lost block or a damaged
/// map page is an error naming the block.
fn readable_chunk(
    state: &mut EngineState,
    record: &VolumeRecord,
    map: &RecordArea,
    block: u64,
) -> Result<ChunkId> {
    let chunk = mapped_chunk(state, record, map, block)?;
    if chunk == LOST_CHUNK {
        return Err(BlockError::Block {
            volume: record.name.clone(),
            block,
            source: Error::corrupt(
                "data",
                "a repair of damage recorded it lost (see `onecopy check`); it reads again \
                 once written",
            ),
        });
    }
    Ok(chunk)
}

/// The map entry of block `block` of `record` (which may be [`LOST_CHUNK`]); a damaged map
/// page is an error naming the block.
fn mapped_chunk(
    state: &mut EngineState,
    record: &VolumeRecord,
    map: &RecordArea,
    block: u64,
) -> Result<ChunkId> {
    map_entry(&mut state.pages, map, block).map_err(|error| block_error(record, block, error))
}

/// The file of chunk copy `copy` when it is still live where the copy table says and its
/// bytes are in a file (not in the write buffer or queue), with the size of the block's own
/// chunk; `None` otherwise.
fn live_copy_file(
    state: &mut EngineState,
    copy: &ChunkCopy,
    own: &ChunkLocation,
) -> Option<Arc<dyn StorageFile>> {
    if copy.location.raw_bytes != own.raw_bytes {
        return None;
    }
    let record = state.chunks.record(&mut state.pages, copy.chunk).ok()?;
    if !record.in_use || record.location != copy.location {
        return None;
    }
    if state.chunks.state().open_container == Some(copy.location.container) {
        // Its bytes may still be buffered; the own copy is read instead.
        return None;
    }
    state.chunks.containers().file(copy.location.container).ok()
}

/// The record of chunk `chunk`, which block `block` of `record` maps to.
fn chunk_record(
    state: &mut EngineState,
    record: &VolumeRecord,
    block: u64,
    chunk: ChunkId,
) -> Result<onecopy_core::chunk_store::ChunkRecord> {
    state
        .chunks
        .record(&mut state.pages, chunk)
        .map_err(|error| block_error(record, block, error))
}

/// Says which block a failure of the engine core concerns.
fn block_error(record: &VolumeRecord, block: u64, error: impl Into<BlockError>) -> BlockError {
    match error.into() {
        BlockError::Core(source) => BlockError::Block {
            volume: record.name.clone(),
            block,
            source,
        },
        other => other,
    }
}

/// A chunk to read outside the lock.
struct PendingRead {
    file: Arc<dyn StorageFile>,
    location: ChunkLocation,
    chunk: ChunkId,
    /// The block, and which part of it the request wants where.
    span: BlockSpan,
    /// The chunk's content key, when known; else it is digested once read, and the copy named.
    key: Option<ContentKey>,
    /// Another copy of the content that the read planner chose (replica retrieval); the own
    /// copy is read when it fails.
    copy: Option<ChosenCopy>,
}

/// A copy chosen instead of a block's own chunk.
struct ChosenCopy {
    file: Arc<dyn StorageFile>,
    kind: ChosenKind,
    /// Its modelled position, for the device model.
    position: u64,
}

enum ChosenKind {
    /// Another chunk, checked live in the chunk table; read with its CRC.
    Chunk(ChunkLocation),
    /// A duplicate: its raw bytes, digested after reading and compared with the key.
    Duplicate { offset: u64 },
}

impl Engine {
    fn volume_record(&self, state: &EngineState, volume: VolumeId) -> Result<Arc<VolumeRecord>> {
        state
            .volumes
            .get(&volume)
            .map(|volume| Arc::clone(&volume.record))
            .ok_or(BlockError::VolumeIdNotFound(volume))
    }

    /// Reads `out.len()` bytes at `offset` of `volume`.
    pub fn read(&self, volume: VolumeId, offset: u64, out: &mut [u8]) -> Result<()> {
        self.note_request();
        let mut pending = Vec::new();
        let record = {
            let mut state = self.lock_usable()?;
            state.counters.reads += 1;
            let record = self.volume_record(&state, volume)?;
            check_payload_range(&record, offset, out.len() as u64)?;
            // A read changes nothing durable, so its failure (a damaged page, a lost block)
            // fails this request alone.
            self.plan_reads(&mut state, &record, offset, out, &mut pending)?;
            record
        };
        let block_bytes = record.block_bytes as usize;
        if pending.is_empty() {
            return Ok(());
        }
        let mut block = Vec::new();
        for read in pending {
            let span = read.span;
            let whole = span.is_whole(block_bytes);
            let target: &mut [u8] = if whole {
                &mut out[span.in_request()]
            } else {
                // Only reads of partial blocks need a whole block to read into.
                block.resize(block_bytes, 0);
                &mut block
            };
            let from_copy = read
                .copy
                .as_ref()
                .is_some_and(|copy| self.read_chosen_copy(copy, read.key, target));
            if !from_copy {
                let position = self.replicas.position(&read.location);
                self.replicas.device().read_started(position);
                let result = read_located(read.file.as_ref(), &read.location, target);
                self.replicas.device().read_done(position);
                self.replicas
                    .device()
                    .moved_to(position + u64::from(read.location.stored_bytes));
                result.map_err(|error| block_error(&record, span.block, error))?;
            }
            let key = self.cache_read(read.key, &read.location, target);
            if read.key.is_none() {
                if let Some(key) = key {
                    // A copy named by its bytes: the copy table learns it too.
                    self.replicas.note_named(
                        key,
                        ChunkCopy {
                            chunk: read.chunk,
                            location: read.location,
                        },
                    );
                }
            }
            if !whole {
                out[span.in_request()].copy_from_slice(&block[span.in_block()]);
            }
        }
        Ok(())
    }

    /// Reads the copy the planner chose into `target`; false when it cannot be used (a read
    /// error, or a duplicate whose bytes are not the content's), so the own copy is read.
    fn read_chosen_copy(
        &self,
        copy: &ChosenCopy,
        key: Option<ContentKey>,
        target: &mut [u8],
    ) -> bool {
        let key = key.expect("copies are chosen only for content with a key");
        let device = self.replicas.device();
        device.read_started(copy.position);
        let (usable, duplicate) = match copy.kind {
            ChosenKind::Chunk(location) => (
                read_located(copy.file.as_ref(), &location, target).is_ok(),
                false,
            ),
            ChosenKind::Duplicate { offset } => (
                copy.file.read_at(offset, target).is_ok()
                    && ContentKey(self.replicas.key_algorithm().hash(target)) == key,
                true,
            ),
        };
        device.read_done(copy.position);
        device.moved_to(copy.position + target.len() as u64);
        if usable {
            self.replicas.note_redirected(duplicate);
        } else {
            self.replicas.note_fallback(key, duplicate);
        }
        usable
    }

    /// Resolves every block of a read under the lock: zeros and cached or buffered blocks are
    /// copied now, the rest becomes pending file reads.
    fn plan_reads(
        &self,
        state: &mut EngineState,
        record: &VolumeRecord,
        offset: u64,
        out: &mut [u8],
        pending: &mut Vec<PendingRead>,
    ) -> Result<()> {
        let block_bytes = record.block_bytes as usize;
        let map = state.volumes[&record.id].map;
        let prefetch = record.hints.prefetch && state.copies.prefetch_active();
        // Room for a partial block; allocated by the first one (most reads are whole blocks).
        let mut scratch = Vec::new();
        for span in block_spans(offset, out.len() as u64, record.block_bytes) {
            let block = span.block;
            let target = &mut out[span.in_request()];
            let chunk = readable_chunk(state, record, &map, block)?;
            if chunk == ZERO_CHUNK {
                target.fill(0);
                continue;
            }
            let chunk_record = chunk_record(state, record, block, chunk)?;
            if chunk_record.indexed {
                state.copies.observe_read(&chunk_record.fingerprint);
                if prefetch {
                    state
                        .chunks
                        .index()
                        .prefetch_known(&chunk_record.fingerprint, chunk);
                    state.counters.prefetched_fingerprints += 1;
                }
            }
            let whole = span.is_whole(block_bytes);
            let buffer: &mut [u8] = if whole {
                target
            } else {
                scratch.resize(block_bytes, 0);
                &mut scratch
            };
            let key = self.content_cache.key_of(&chunk_record);
            if self.content_cache.get(key, buffer) {
                // Served from memory.
            } else {
                match state
                    .chunks
                    .plan_read(&mut state.pages, chunk, buffer)
                    .map_err(|error| block_error(record, block, error))?
                {
                    ChunkRead::Copied => {}
                    ChunkRead::File { file, location } => {
                        pending.push(PendingRead {
                            file,
                            location,
                            chunk,
                            span,
                            key,
                            copy: None,
                        });
                        continue;
                    }
                }
            }
            if !whole {
                out[span.in_request()].copy_from_slice(&scratch[span.in_block()]);
            }
        }
        if self.replicas.retrieval_enabled() && !pending.is_empty() {
            self.plan_copies(state, pending);
        }
        Ok(())
    }

    /// Dynamic replica retrieval (see [`crate::replicas`]): chooses, for the blocks of one
    /// read that go to the media, the copy of each that costs least under the device profile,
    /// and checks every chosen chunk copy in the chunk table.
    fn plan_copies(&self, state: &mut EngineState, pending: &mut [PendingRead]) {
        let replicas = &self.replicas;
        let alternatives: Vec<Vec<Alternative>> = pending
            .iter()
            .map(|read| match read.key {
                Some(key) => replicas.alternatives(
                    key,
                    ChunkCopy {
                        chunk: read.chunk,
                        location: read.location,
                    },
                ),
                None => Vec::new(),
            })
            .collect();
        if alternatives.iter().all(Vec::is_empty) {
            return;
        }
        let blocks: Vec<BlockCandidates> = pending
            .iter()
            .zip(&alternatives)
            .map(|(read, alternatives)| BlockCandidates {
                positions: std::iter::once(replicas.position(&read.location))
                    .chain(
                        alternatives
                            .iter()
                            .map(|alternative| replicas.alternative_position(alternative)),
                    )
                    .collect(),
                length: u64::from(read.location.raw_bytes),
            })
            .collect();
        replicas.set_layout(state.chunks.state().container_id_next);
        let plan = plan_run(replicas.device(), &blocks);
        for ((read, alternatives), choice) in pending.iter_mut().zip(alternatives).zip(plan.choices)
        {
            if choice == 0 {
                continue;
            }
            let key = read.key.expect("alternatives come from a key");
            let position = replicas.alternative_position(&alternatives[choice - 1]);
            read.copy = match &alternatives[choice - 1] {
                Alternative::Chunk(copy) => match live_copy_file(state, copy, &read.location) {
                    Some(file) => Some(ChosenCopy {
                        file,
                        kind: ChosenKind::Chunk(copy.location),
                        position,
                    }),
                    None => {
                        replicas.stale_copy(key, copy.chunk);
                        None
                    }
                },
                Alternative::Duplicate(duplicate) => (duplicate.bytes == read.location.raw_bytes)
                    .then(|| ChosenCopy {
                        file: Arc::clone(&duplicate.file),
                        kind: ChosenKind::Duplicate {
                            offset: duplicate.offset,
                        },
                        position,
                    }),
            };
        }
    }

    /// Writes `data` at `offset` of `volume`; with `fua` the data is durable on return.
    pub fn write(&self, volume: VolumeId, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        let mut results = Vec::with_capacity(1);
        self.write_batch(volume, &[WriteRequest { offset, data, fua }], &mut results);
        results.pop().expect("one result per write")
    }

    /// Executes several independent writes to `volume`, as if one after the other, and puts
    /// one result per write into `results` (cleared first). One batch costs one fingerprint
    /// batch (SIMD lanes across all its blocks) and one engine lock, instead of one each per
    /// write: the NBD server hands queued writes over together, because on a machine with
    /// few cores the hand-offs between threads cost more than the work. With `fua` on any
    /// write, the batch is flushed before its results are returned.
    pub fn write_batch(
        &self,
        volume: VolumeId,
        writes: &[WriteRequest<'_>],
        results: &mut Vec<Result<()>>,
    ) {
        results.clear();
        self.note_request();
        // Decide and fingerprint outside the lock; only the map, index and containers need it.
        let bytes = writes.iter().map(|write| write.data.len() as u64).sum();
        let (record, filesystem) = match self.write_target(volume, bytes) {
            Ok(target) => target,
            Err(error) => {
                // Every write of the batch fails with the same error: none was executed.
                for _ in 1..writes.len() {
                    results.push(Err(error.duplicate()));
                }
                results.push(Err(error));
                return;
            }
        };
        let mut plans: Vec<Result<Vec<BlockPlan>>> = writes
            .iter()
            .map(|write| {
                check_payload_range(&record, write.offset, write.data.len() as u64)?;
                Ok(plan_blocks(
                    &record,
                    filesystem.as_deref(),
                    write.offset,
                    write.data,
                ))
            })
            .collect();
        let fingerprints = self.digest_plans(&mut plans, &record, writes);
        let mut flush_wanted = false;
        {
            let mut state = self.state.lock();
            // The batch's index lookups then overlap their memory latencies.
            state.chunks.index().warm(&fingerprints);
            let released = overwritten_chunks(&state, &record, writes, &plans);
            let EngineState { chunks, pages, .. } = &mut *state;
            chunks.index().warm_buckets(pages, &fingerprints);
            chunks.warm_release(pages, &released);
            for (write, plan) in writes.iter().zip(plans) {
                let result = match plan {
                    Err(error) => Err(error),
                    Ok(_) if write.data.is_empty() => Ok(()),
                    Ok(plan) => self.guarded(&mut state, |state| {
                        state.counters.writes += 1;
                        self.write_locked(state, &record, write.offset, write.data, &plan)
                    }),
                };
                flush_wanted |= write.fua && result.is_ok();
                results.push(result);
            }
        }
        // A failure after the writes were applied fails each of them that succeeded so far
        // (and, for the flush, asked for durability), with a copy of the error.
        if let Err(error) = self.write_queued() {
            for result in results.iter_mut().filter(|result| result.is_ok()) {
                *result = Err(error.duplicate());
            }
            return;
        }
        if flush_wanted {
            if let Err(error) = self.flush() {
                for (write, result) in writes.iter().zip(results.iter_mut()) {
                    if write.fua && result.is_ok() {
                        *result = Err(error.duplicate());
                    }
                }
            }
        }
    }

    /// The volume's record and file-system map, if the engine and the volume are usable and
    /// the disk has room for `bytes` more ([`Engine::admit_write`]).
    fn write_target(
        &self,
        volume: VolumeId,
        bytes: u64,
    ) -> Result<(
        Arc<VolumeRecord>,
        Option<Arc<crate::hints::fs::MetadataMap>>,
    )> {
        let mut state = self.lock_usable()?;
        if state.journal.is_none() {
            return Err(super::read_only_error().into());
        }
        let record = self.volume_record(&state, volume)?;
        self.admit_write(&mut state, bytes)?;
        let filesystem = state.volumes[&volume].filesystem.clone();
        Ok((record, filesystem))
    }

    /// Digests the whole blocks of every planned write that are to be deduplicated, as one
    /// fingerprint batch (SIMD lanes across the blocks of all writes), outside the lock, and
    /// puts each digest into its block's plan. With the content cache on, also gives every
    /// whole block stored its content key ([`Engine::key_plans`]). Returns the fingerprints,
    /// in order, for warming the index.
    fn digest_plans(
        &self,
        plans: &mut [Result<Vec<BlockPlan>>],
        record: &VolumeRecord,
        writes: &[WriteRequest<'_>],
    ) -> Vec<Fingerprint> {
        let mut inputs = Vec::new();
        for (write, plan) in writes.iter().zip(plans.iter()) {
            let Ok(plan) = plan else { continue };
            let spans = block_spans(write.offset, write.data.len() as u64, record.block_bytes);
            for (plan, span) in plan.iter().zip(spans) {
                if let BlockPlan::Digest = plan {
                    inputs.push(&write.data[span.in_request()]);
                }
            }
        }
        let mut fingerprints = vec![Fingerprint::ZERO; inputs.len()];
        self.config
            .fingerprint
            .hash_batch(&inputs, &mut fingerprints);
        let checksummed = self.config.containers.compression_level.is_none();
        let mut digests = inputs
            .iter()
            .zip(&fingerprints)
            .map(|(input, &fingerprint)| BlockDigest {
                fingerprint,
                checksum: checksummed.then(|| crc32c::crc32c(input)),
                content: None,
            });
        for plan in plans.iter_mut().flatten().flatten() {
            if let BlockPlan::Digest = plan {
                let digest = digests.next().expect("one digest per block to digest");
                *plan = BlockPlan::Whole(StoreAs::Deduplicate(digest));
            }
        }
        assert!(digests.next().is_none(), "every digest has its block");
        // A weak fingerprint is chosen to keep writes cheap (paper 5), so under one the write
        // path adds no digest: the content cache names those copies at their first read. The
        // copy table of replica retrieval takes the same keys; without the content cache,
        // hinted writes stay undigested (paper 1's point) and their copies unlisted.
        if self.content_cache.enabled() && self.content_cache.fingerprints_are_keys() {
            self.key_plans(plans, record, writes);
        }
        fingerprints
    }

    /// Puts the content key of each whole block into its plan (the store's fingerprints are
    /// content keys): deduplicated blocks have theirs; blocks stored without deduplication are
    /// digested, in one batch.
    fn key_plans(
        &self,
        plans: &mut [Result<Vec<BlockPlan>>],
        record: &VolumeRecord,
        writes: &[WriteRequest<'_>],
    ) {
        assert!(self.content_cache.fingerprints_are_keys());
        let needs_digest =
            |store: &StoreAs| matches!(store, StoreAs::Deferred(_) | StoreAs::NoDedup(..));
        let mut inputs = Vec::new();
        for (write, plan) in writes.iter().zip(plans.iter()) {
            let Ok(plan) = plan else { continue };
            let spans = block_spans(write.offset, write.data.len() as u64, record.block_bytes);
            for (plan, span) in plan.iter().zip(spans) {
                if let BlockPlan::Whole(store) = plan {
                    if needs_digest(store) {
                        inputs.push(&write.data[span.in_request()]);
                    }
                }
            }
        }
        let mut keys = vec![Fingerprint::ZERO; inputs.len()];
        self.content_cache
            .key_algorithm()
            .hash_batch(&inputs, &mut keys);
        let mut keys = keys.into_iter().map(ContentKey);
        for plan in plans.iter_mut().flatten().flatten() {
            let BlockPlan::Whole(store) = plan else {
                continue;
            };
            match store {
                StoreAs::Zero => {}
                StoreAs::Deduplicate(digest) => {
                    digest.content = Some(ContentKey(digest.fingerprint))
                }
                StoreAs::Deferred(content) | StoreAs::NoDedup(_, content) => {
                    *content = Some(keys.next().expect("one key per block to digest"));
                }
            }
        }
        assert!(keys.next().is_none(), "every key has its block");
    }

    fn write_locked(
        &self,
        state: &mut EngineState,
        record: &VolumeRecord,
        offset: u64,
        data: &[u8],
        plans: &[BlockPlan],
    ) -> Result<()> {
        let mut merged = self.prepare_write(state, record, offset, data, plans)?;
        let filesystem = state.volumes[&record.id].filesystem.clone();
        let now = unix_seconds();
        let spans = block_spans(offset, data.len() as u64, record.block_bytes);
        for (index, (plan, span)) in plans.iter().zip(spans).enumerate() {
            let block = span.block;
            let new_chunk = match plan {
                BlockPlan::Whole(store) => {
                    let content = &data[span.in_request()];
                    self.store_block(state, record, block, content, *store, now)?
                }
                BlockPlan::Digest => {
                    unreachable!("digest_plans digests every whole block to deduplicate")
                }
                BlockPlan::Partial => {
                    state.counters.read_modify_writes += 1;
                    let content = merged
                        .iter_mut()
                        .find(|(at, _)| *at == index)
                        .map(|(_, content)| std::mem::take(content))
                        .expect("partial blocks are merged before the write");
                    let block_start = block * u64::from(record.block_bytes);
                    let decision =
                        decide_write(record, filesystem.as_deref(), block_start, &content);
                    let store = StoreAs::without_digest(decision).unwrap_or_else(|| {
                        let fingerprint = self.config.fingerprint.hash(&content);
                        StoreAs::Deduplicate(BlockDigest {
                            fingerprint,
                            checksum: None,
                            content: self
                                .content_cache
                                .fingerprints_are_keys()
                                .then_some(ContentKey(fingerprint)),
                        })
                    });
                    self.store_block(state, record, block, &content, store, now)?
                }
            };
            self.remap(state, record, block, new_chunk)?;
        }
        self.log_changes(state)?;
        if record.hints.filesystem
            && crate::hints::fs::write_touches_superblock(offset, data.len() as u64)
        {
            self.derive_filesystem_map(state, record.id);
        }
        self.checkpoint_if_due(state)
    }

    /// Reads everything a write reads before it changes anything, so that a damaged page or
    /// a lost block fails the write alone, with nothing changed: each block's map entry and
    /// the record of the chunk it replaces, and the stored bytes of partially written blocks,
    /// which are returned merged with the write's bytes (by block index in the write).
    fn prepare_write(
        &self,
        state: &mut EngineState,
        record: &VolumeRecord,
        offset: u64,
        data: &[u8],
        plans: &[BlockPlan],
    ) -> Result<Vec<(usize, Vec<u8>)>> {
        let map = state.volumes[&record.id].map;
        let mut merged = Vec::new();
        let spans = block_spans(offset, data.len() as u64, record.block_bytes);
        for (index, (plan, span)) in plans.iter().zip(spans).enumerate() {
            let block = span.block;
            let old = mapped_chunk(state, record, &map, block)?;
            if old != ZERO_CHUNK && old != LOST_CHUNK {
                chunk_record(state, record, block, old)?;
            }
            if let BlockPlan::Partial = plan {
                readable_chunk(state, record, &map, block)?;
                let mut content = vec![0u8; record.block_bytes as usize];
                self.read_block_locked(state, record, block, &mut content)
                    .map_err(|error| block_error(record, block, error))?;
                content[span.in_block()].copy_from_slice(&data[span.in_request()]);
                merged.push((index, content));
            }
        }
        Ok(merged)
    }

    /// Stores one block's content as `store` says and returns its chunk id; counts how it
    /// was stored.
    fn store_block(
        &self,
        state: &mut EngineState,
        record: &VolumeRecord,
        block: u64,
        content: &[u8],
        store: StoreAs,
        now: u64,
    ) -> Result<ChunkId> {
        state.counters.blocks_written += 1;
        let (fingerprint, checksum, owner, content_key) = match store {
            StoreAs::Zero => {
                state.counters.zero_blocks_written += 1;
                return Ok(ZERO_CHUNK);
            }
            StoreAs::Deduplicate(digest) => {
                state.copies.observe_write(&digest.fingerprint);
                (Some(digest.fingerprint), digest.checksum, 0, digest.content)
            }
            StoreAs::Deferred(key) => {
                state.counters.deferred_blocks += 1;
                (None, None, deferred_owner(record.id, block), key)
            }
            StoreAs::NoDedup(reason, key) => {
                state.counters.count_no_dedup(reason);
                (None, None, permanent_owner(record.id, block), key)
            }
        };
        let outcome = state.chunks.store(
            &mut state.pages,
            NewChunk {
                data: content,
                fingerprint: fingerprint.as_ref(),
                checksum,
            },
            owner,
            now,
            &mut state.chunk_changes,
        )?;
        if outcome.deduplicated {
            state.counters.blocks_deduplicated += 1;
        } else {
            state.counters.blocks_stored += 1;
        }
        // A copy whose record does not carry its content key is named now, so its first read
        // can hit, and listed in the copy table for replica retrieval; on a disk the head
        // goes to a new chunk.
        let named = content_key.filter(|_| self.content_cache.needs_name(fingerprint.is_some()));
        let track_head = !outcome.deduplicated && self.replicas.device().tracks_head();
        if let Some(key) = content_key {
            self.content_cache.note_write(key);
        }
        if named.is_some() || track_head {
            let location = state.chunks.record(&mut state.pages, outcome.id)?.location;
            self.replicas.note_appended(&location);
            if let Some(key) = named {
                self.content_cache.name(&location, key);
                self.replicas.note_stored(
                    key,
                    ChunkCopy {
                        chunk: outcome.id,
                        location,
                    },
                );
            }
        }
        Ok(outcome.id)
    }

    /// Points `block` at `new_chunk` (already referenced for it) and releases the old chunk.
    /// Moves the request's chunk changes and the map change into the change list, in order.
    pub(crate) fn remap(
        &self,
        state: &mut EngineState,
        record: &VolumeRecord,
        block: u64,
        new_chunk: ChunkId,
    ) -> Result<()> {
        let map = state.volumes[&record.id].map;
        let old_chunk = map_entry(&mut state.pages, &map, block)?;
        let EngineState {
            chunk_changes,
            changes,
            ..
        } = state;
        changes.extend(chunk_changes.drain(..).map(BlockChange::Chunk));
        if old_chunk != new_chunk {
            set_map_entry(&mut state.pages, &map, block, new_chunk)?;
            state.changes.push(BlockChange::Map {
                volume: record.id,
                block,
                chunk: new_chunk,
            });
        }
        if old_chunk != ZERO_CHUNK && old_chunk != LOST_CHUNK {
            // Storing first and releasing second keeps a rewrite of the same content from
            // freeing the chunk it is about to reference.
            let freed_before = state.chunks.counters().chunks_freed;
            state
                .chunks
                .release(&mut state.pages, old_chunk, &mut state.chunk_changes)?;
            if state.chunks.counters().chunks_freed != freed_before {
                // Duplicates of a freed chunk's content are dropped with it.
                self.replicas.chunk_freed(old_chunk);
            }
            let EngineState {
                chunk_changes,
                changes,
                ..
            } = state;
            changes.extend(chunk_changes.drain(..).map(BlockChange::Chunk));
        }
        Ok(())
    }

    /// Reads one whole block under the lock (for read-modify-write and file-system probes).
    pub(crate) fn read_block_locked(
        &self,
        state: &mut EngineState,
        record: &VolumeRecord,
        block: u64,
        out: &mut [u8],
    ) -> Result<()> {
        assert_eq!(out.len(), record.block_bytes as usize);
        let map = state.volumes[&record.id].map;
        let chunk = readable_chunk(state, record, &map, block)?;
        if chunk == ZERO_CHUNK {
            out.fill(0);
            return Ok(());
        }
        Ok(state.chunks.read_into(&mut state.pages, chunk, out)?)
    }

    /// Releases whole blocks in `[offset, offset + length)`; partial blocks are left as they
    /// are (TRIM is advisory). With `zero_partial`, partial blocks are overwritten with zeros
    /// instead (WRITE_ZEROES).
    fn unmap(
        &self,
        volume: VolumeId,
        offset: u64,
        length: u64,
        zero_partial: bool,
        fua: bool,
    ) -> Result<()> {
        self.note_request();
        self.change(|state| {
            state.counters.trims += 1;
            let record = self.volume_record(state, volume)?;
            check_range(&record, offset, length)?;
            self.unmap_locked(state, &record, offset, length, zero_partial)
        })?;
        // Partial blocks zeroed were appended as new chunks.
        self.write_queued()?;
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    fn unmap_locked(
        &self,
        state: &mut EngineState,
        record: &VolumeRecord,
        offset: u64,
        length: u64,
        zero_partial: bool,
    ) -> Result<()> {
        let block_bytes = record.block_bytes as u64;
        let end = offset + length;
        let whole_start = offset.div_ceil(block_bytes);
        let whole_end = end / block_bytes;
        if zero_partial {
            // Only the first and the last block of the range can be partial.
            let mut spans = block_spans(offset, length, record.block_bytes);
            let ends = [spans.next(), spans.next_back()];
            let zeros = vec![0u8; block_bytes as usize];
            for span in ends.into_iter().flatten() {
                if !span.is_whole(block_bytes as usize) {
                    let at = offset + span.request_offset;
                    self.write_partial_zeros(state, record, at, &zeros[..span.take])?;
                }
            }
        }
        // Blocks past the last map page ever written are zeros already; a whole-device
        // discard of a large, mostly empty volume must not visit them.
        let area = state.pages.area(&record.map_area_name());
        let written_end = state.pages.page_count(area) * super::MAP_ENTRIES_PER_PAGE;
        let map = state.volumes[&record.id].map;
        let end = whole_end.min(written_end).max(whole_start);
        let mut window_start = whole_start;
        let mut mapped = Vec::new();
        while window_start < end {
            // Each window is read before it changes and then journaled as one record, so a
            // damaged page fails the request with every earlier window complete.
            let window_end = (window_start + RECORD_RELEASED_BLOCKS_MAX).min(end);
            mapped.clear();
            for block in window_start..window_end {
                let chunk = mapped_chunk(state, record, &map, block)?;
                if chunk == ZERO_CHUNK {
                    continue;
                }
                if chunk != LOST_CHUNK {
                    chunk_record(state, record, block, chunk)?;
                }
                mapped.push(block);
            }
            for &block in &mapped {
                self.remap(state, record, block, ZERO_CHUNK)?;
            }
            self.log_changes(state)?;
            window_start = window_end;
        }
        self.checkpoint_if_due(state)
    }

    fn write_partial_zeros(
        &self,
        state: &mut EngineState,
        record: &VolumeRecord,
        offset: u64,
        zeros: &[u8],
    ) -> Result<()> {
        let plans = plan_blocks(record, None, offset, zeros);
        debug_assert!(plans.iter().all(|plan| matches!(plan, BlockPlan::Partial)));
        self.write_locked(state, record, offset, zeros, &plans)
    }

    /// Discards whole blocks of `[offset, offset + length)` (NBD TRIM).
    pub fn trim(&self, volume: VolumeId, offset: u64, length: u64, fua: bool) -> Result<()> {
        self.unmap(volume, offset, length, false, fua)
    }

    /// Makes `[offset, offset + length)` read as zeros, storing nothing for whole blocks.
    pub fn write_zeroes(
        &self,
        volume: VolumeId,
        offset: u64,
        length: u64,
        fua: bool,
    ) -> Result<()> {
        self.unmap(volume, offset, length, true, fua)
    }

    /// Allocation state of `[offset, offset + length)`, as runs; may cover less than asked
    /// (at most [`BLOCK_STATUS_BLOCKS_MAX`] blocks) but always at least one block.
    pub fn block_status(
        &self,
        volume: VolumeId,
        offset: u64,
        length: u64,
    ) -> Result<Vec<AllocationExtent>> {
        self.note_request();
        let mut state = self.lock_usable()?;
        let record = self.volume_record(&state, volume)?;
        check_range(&record, offset, length)?;
        let block_bytes = record.block_bytes as u64;
        let map = state.volumes[&volume].map;
        let end = (offset + length)
            .min(offset - offset % block_bytes + BLOCK_STATUS_BLOCKS_MAX * block_bytes);
        let mut extents: Vec<AllocationExtent> = Vec::new();
        for span in block_spans(offset, end - offset, record.block_bytes) {
            let piece = span.take as u64;
            let hole = mapped_chunk(&mut state, &record, &map, span.block)? == ZERO_CHUNK;
            match extents.last_mut() {
                Some(last) if last.hole == hole => last.length += piece,
                _ => extents.push(AllocationExtent {
                    length: piece,
                    hole,
                    zero: hole,
                }),
            }
        }
        Ok(extents)
    }

    /// Prefetch hint (NBD CACHE): loads the fingerprints of the range into the index cache and
    /// its data into the content cache.
    pub fn cache(&self, volume: VolumeId, offset: u64, length: u64) -> Result<()> {
        self.note_request();
        let mut pending = Vec::new();
        let block_bytes;
        {
            let mut guard = self.lock_usable()?;
            let state = &mut *guard;
            let record = self.volume_record(state, volume)?;
            check_range(&record, offset, length)?;
            block_bytes = record.block_bytes as u64;
            let map = state.volumes[&volume].map;
            for span in block_spans(offset, length, record.block_bytes) {
                let block = span.block;
                let chunk = mapped_chunk(state, &record, &map, block)?;
                if chunk == ZERO_CHUNK || chunk == LOST_CHUNK {
                    continue;
                }
                let chunk_record = chunk_record(state, &record, block, chunk)?;
                if record.hints.prefetch && chunk_record.indexed {
                    state
                        .chunks
                        .index()
                        .prefetch_known(&chunk_record.fingerprint, chunk);
                    state.counters.prefetched_fingerprints += 1;
                }
                let key = self.content_cache.key_of(&chunk_record);
                if self.content_cache.enabled()
                    && !key.is_some_and(|key| self.content_cache.contains(key))
                {
                    // A chunk still in memory (the open container's buffer or the write
                    // queue) is copied here and cached now; one in a file is read outside
                    // the lock.
                    let mut buffer = vec![0u8; block_bytes as usize];
                    match state
                        .chunks
                        .plan_read(&mut state.pages, chunk, &mut buffer)?
                    {
                        ChunkRead::File { file, location } => pending.push((file, location, key)),
                        ChunkRead::Copied => {
                            self.cache_read(key, &chunk_record.location, &buffer);
                        }
                    }
                }
            }
        }
        let mut buffer = vec![0u8; block_bytes as usize];
        for (file, location, key) in pending {
            read_located(file.as_ref(), &location, &mut buffer)?;
            self.cache_read(key, &location, &buffer);
        }
        Ok(())
    }
}

impl Engine {
    /// Caches `data`, just read from the copy at `location`: under `key` when known, else
    /// under its digest, naming the copy so that its next read finds the entry.
    /// Returns the key, when known or digested.
    fn cache_read(
        &self,
        key: Option<ContentKey>,
        location: &ChunkLocation,
        data: &[u8],
    ) -> Option<ContentKey> {
        if !self.content_cache.enabled() {
            return key;
        }
        let key = key.unwrap_or_else(|| {
            let key = self.content_cache.key_of_bytes(data);
            self.content_cache.name(location, key);
            key
        });
        self.content_cache.insert(key, data);
        Some(key)
    }
}

/// The chunks that the whole blocks of a batch's writes will replace, as far as their map
/// pages are in memory: for warming what releasing them reads. Changes nothing.
fn overwritten_chunks(
    state: &EngineState,
    record: &VolumeRecord,
    writes: &[WriteRequest<'_>],
    plans: &[Result<Vec<BlockPlan>>],
) -> Vec<ChunkId> {
    let map = state.volumes[&record.id].map;
    let block_bytes = record.block_bytes as usize;
    let blocks = writes
        .iter()
        .zip(plans)
        .filter(|(_, plan)| plan.is_ok())
        .flat_map(|(write, _)| {
            block_spans(write.offset, write.data.len() as u64, record.block_bytes)
                .filter(move |span| span.is_whole(block_bytes))
                .map(|span| span.block)
        });
    // The map entries first, all of them, then the ids they hold.
    for block in blocks.clone() {
        if let Some(entry) = map.resident(&state.pages, block) {
            warm(&entry[0]);
        }
    }
    blocks
        .filter_map(|block| map.resident(&state.pages, block))
        .map(|entry| u64::from_le_bytes(entry.try_into().expect("8-byte map entries")))
        .filter(|&chunk| chunk != ZERO_CHUNK)
        .collect()
}

/// Splits a write into per-block plans, deciding whole blocks from the hints.
fn plan_blocks(
    record: &VolumeRecord,
    filesystem: Option<&crate::hints::fs::MetadataMap>,
    offset: u64,
    data: &[u8],
) -> Vec<BlockPlan> {
    let block_bytes = record.block_bytes as usize;
    block_spans(offset, data.len() as u64, record.block_bytes)
        .map(|span| {
            if !span.is_whole(block_bytes) {
                return BlockPlan::Partial;
            }
            let block_start = span.block * block_bytes as u64;
            let decision = decide_write(record, filesystem, block_start, &data[span.in_request()]);
            StoreAs::without_digest(decision).map_or(BlockPlan::Digest, BlockPlan::Whole)
        })
        .collect()
}
