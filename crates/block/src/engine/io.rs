//! The request path: read, write, trim, write zeroes, block status, cache.

use std::sync::Arc;

use onecopy_core::chunk_store::{
    read_located, unix_seconds, ChunkId, ChunkRead, NewChunk, ZERO_CHUNK,
};
use onecopy_core::container::ChunkLocation;
use onecopy_core::fingerprint::Fingerprint;
use onecopy_core::index::warm::warm;
use onecopy_core::pages::RecordArea;
use onecopy_core::storage::StorageFile;
use onecopy_core::{Error, Result};

use super::{map_entry, set_map_entry, Engine, EngineState, LOST_CHUNK};
use crate::cache::CacheKey;
use crate::hints::{decide_write, WriteDecision};
use crate::records::BlockChange;
use crate::volume::{VolumeId, VolumeRecord};

/// Most blocks one block-status request examines; the protocol lets a reply cover less than
/// was asked, and clients ask again for the rest.
pub const BLOCK_STATUS_BLOCKS_MAX: u64 = 1 << 18;
/// Blocks an unmap reads, then changes and journals as one record, at a time: bounds the
/// record (at most about 30 bytes a block) and the memory of a whole-device discard.
const UNMAP_WINDOW_BLOCKS: u64 = 1 << 16;
/// Largest read or write the engine accepts (the NBD layer enforces its own, smaller limit).
pub const REQUEST_BYTES_MAX: u64 = 1 << 30;

/// A run of bytes with one allocation state (NBD `base:allocation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub length: u64,
    /// Nothing is stored for these bytes.
    pub hole: bool,
    /// The bytes read as zeros.
    pub zero: bool,
}

/// One write of an [`Engine::write_batch`].
#[derive(Clone, Copy, Debug)]
pub struct BatchWrite<'a> {
    pub offset: u64,
    pub data: &'a [u8],
    /// Force unit access: durable when the batch returns.
    pub fua: bool,
}

/// Whole blocks of a plan that are fingerprinted for deduplication.
fn deduplicated_blocks(plan: &[BlockPlan]) -> usize {
    plan.iter()
        .filter(|plan| matches!(plan, BlockPlan::Whole(WriteDecision::Deduplicate)))
        .count()
}

/// Fingerprints of a batch's deduplicated whole blocks, in order, and their CRC-32C (empty
/// when chunks are compressed: the checksum is then of the compressed bytes).
struct Digests {
    fingerprints: Vec<Fingerprint>,
    checksums: Vec<u32>,
}

impl Digests {
    /// The `count` digests from `start`, one write's share.
    fn range(&self, start: usize, count: usize) -> DigestSlice<'_> {
        DigestSlice {
            fingerprints: &self.fingerprints[start..start + count],
            checksums: self.checksums.get(start..start + count).unwrap_or_default(),
        }
    }
}

/// One write's share of [`Digests`].
#[derive(Clone, Copy, Default)]
struct DigestSlice<'a> {
    fingerprints: &'a [Fingerprint],
    checksums: &'a [u32],
}

impl DigestSlice<'_> {
    /// The fingerprint and checksum of the `index`-th deduplicated block.
    fn get(&self, index: usize) -> (Fingerprint, Option<u32>) {
        (self.fingerprints[index], self.checksums.get(index).copied())
    }
}

/// How one block of a write is handled.
enum BlockPlan {
    /// Covers the whole block: store this decision.
    Whole(WriteDecision),
    /// Covers part of the block: read, merge and decide under the lock.
    Partial,
}

/// Owner tag of a chunk written for deferred deduplication: bit 63 set, volume and block.
pub(crate) fn deferred_owner(volume: VolumeId, block: u64) -> u64 {
    assert!(block < 1 << 42 && volume < 1 << 21);
    (1 << 63) | ((volume as u64) << 42) | block
}

/// Owner tag of a chunk written with a no-dedup hint (never deduplicated later).
fn permanent_owner(volume: VolumeId, block: u64) -> u64 {
    ((volume as u64) << 42) | block
}

/// The volume and block of a deferred chunk's owner tag.
pub(crate) fn deferred_owner_parts(owner: u64) -> Option<(VolumeId, u64)> {
    (owner >> 63 == 1).then_some((
        ((owner >> 42) & ((1 << 21) - 1)) as VolumeId,
        owner & ((1 << 42) - 1),
    ))
}

/// Checks that `[offset, offset + length)` lies inside the volume.
fn check_range(record: &VolumeRecord, offset: u64, length: u64) -> Result<()> {
    let end = offset.checked_add(length);
    if end.is_none_or(|end| end > record.size_bytes) {
        return Err(Error::InvalidArgument(format!(
            "request of {length} bytes at offset {offset} is outside volume {} ({} bytes)",
            record.name, record.size_bytes
        )));
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
        )));
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
        return Err(Error::corrupt(
            format!("block {block} of volume {}", record.name),
            "its data was recorded lost by a repair of damage (see `onecopy check`); it reads \
             again once written",
        ));
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

/// Puts the block a failure concerns into a corruption error.
fn block_error(record: &VolumeRecord, block: u64, error: Error) -> Error {
    match error {
        Error::Corrupt { what, detail } => Error::corrupt(
            format!("block {block} of volume {} ({what})", record.name),
            detail,
        ),
        other => other,
    }
}

/// A chunk to read outside the lock.
struct PendingRead {
    file: Arc<dyn StorageFile>,
    location: ChunkLocation,
    /// Where in the request buffer the block starts, and which part of it is wanted.
    request_offset: usize,
    skip: usize,
    take: usize,
}

impl Engine {
    fn volume_record(&self, state: &EngineState, volume: VolumeId) -> Result<Arc<VolumeRecord>> {
        state
            .volumes
            .get(&volume)
            .map(|volume| Arc::clone(&volume.record))
            .ok_or_else(|| Error::NotFound(format!("volume {volume}")))
    }

    /// Reads `out.len()` bytes at `offset` of `volume`.
    pub fn read(&self, volume: VolumeId, offset: u64, out: &mut [u8]) -> Result<()> {
        self.note_request();
        let mut pending = Vec::new();
        let record = {
            let mut state = self.state.lock();
            self.check_usable(&state)?;
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
            let whole = read.skip == 0 && read.take == block_bytes;
            let target: &mut [u8] = if whole {
                &mut out[read.request_offset..read.request_offset + block_bytes]
            } else {
                // Only reads of partial blocks need a whole block to read into.
                block.resize(block_bytes, 0);
                &mut block
            };
            read_located(read.file.as_ref(), &read.location, target).map_err(|error| {
                let block = (offset + read.request_offset as u64) / block_bytes as u64;
                block_error(&record, block, error)
            })?;
            self.content_cache
                .insert(CacheKey::of(&read.location), target);
            if !whole {
                out[read.request_offset..read.request_offset + read.take]
                    .copy_from_slice(&block[read.skip..read.skip + read.take]);
            }
        }
        Ok(())
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
        let block_bytes = record.block_bytes as u64;
        let map = state.volumes[&record.id].map;
        let prefetch = record.hints.prefetch && state.copies.prefetch_active();
        // Room for a partial block; allocated by the first one (most reads are whole blocks).
        let mut scratch = Vec::new();
        let mut position = offset;
        let end = offset + out.len() as u64;
        while position < end {
            let block = position / block_bytes;
            let skip = (position % block_bytes) as usize;
            let take = ((block_bytes - skip as u64).min(end - position)) as usize;
            let request_offset = (position - offset) as usize;
            let target = &mut out[request_offset..request_offset + take];
            let chunk = readable_chunk(state, record, &map, block)?;
            if chunk == ZERO_CHUNK {
                target.fill(0);
            } else {
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
                let location = chunk_record.location;
                let whole = take == block_bytes as usize;
                let buffer: &mut [u8] = if whole {
                    target
                } else {
                    scratch.resize(block_bytes as usize, 0);
                    &mut scratch
                };
                if self.content_cache.get(CacheKey::of(&location), buffer) {
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
                                request_offset,
                                skip,
                                take,
                            });
                            position += take as u64;
                            continue;
                        }
                    }
                }
                if !whole {
                    out[request_offset..request_offset + take]
                        .copy_from_slice(&scratch[skip..skip + take]);
                }
            }
            position += take as u64;
        }
        Ok(())
    }

    /// Writes `data` at `offset` of `volume`; with `fua` the data is durable on return.
    pub fn write(&self, volume: VolumeId, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        let mut results = Vec::with_capacity(1);
        self.write_batch(volume, &[BatchWrite { offset, data, fua }], &mut results);
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
        writes: &[BatchWrite<'_>],
        results: &mut Vec<Result<()>>,
    ) {
        results.clear();
        self.note_request();
        // Decide and fingerprint outside the lock; only the map, index and containers need it.
        let bytes = writes.iter().map(|write| write.data.len() as u64).sum();
        let (record, filesystem) = match self.write_target(volume, bytes) {
            Ok(target) => target,
            Err(error) => {
                // Each write gets its own copy of the error (errors are not `Clone`): asking
                // again gives one of the same kind. Should the volume have become usable
                // meanwhile, the write still fails: it was not executed.
                let message = error.to_string();
                results.push(Err(error));
                for _ in 1..writes.len() {
                    results.push(match self.write_target(volume, 0) {
                        Err(error) => Err(error),
                        Ok(_) => Err(Error::io(
                            "block engine",
                            std::io::Error::other(message.clone()),
                        )),
                    });
                }
                return;
            }
        };
        let plans: Vec<Result<Vec<BlockPlan>>> = writes
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
        let digests = self.digest_plans(&plans, &record, writes);
        let mut next_digest = 0;
        let mut flush_wanted = false;
        {
            let mut state = self.state.lock();
            // The batch's index lookups then overlap their memory latencies.
            state.chunks.index().warm(&digests.fingerprints);
            let released = overwritten_chunks(&state, &record, writes, &plans);
            let EngineState { chunks, pages, .. } = &mut *state;
            chunks.index().warm_buckets(pages, &digests.fingerprints);
            chunks.warm_release(pages, &released);
            for (write, plan) in writes.iter().zip(plans) {
                let result = match plan {
                    Err(error) => Err(error),
                    Ok(_) if write.data.is_empty() => Ok(()),
                    Ok(plan) => {
                        let count = deduplicated_blocks(&plan);
                        let digests = digests.range(next_digest, count);
                        next_digest += count;
                        self.check_usable(&state).and_then(|()| {
                            state.counters.writes += 1;
                            let result = self.write_locked(
                                &mut state,
                                &record,
                                write.offset,
                                write.data,
                                &plan,
                                digests,
                            );
                            self.fail_on_error(&mut state, result)
                        })
                    }
                };
                flush_wanted |= write.fua && result.is_ok();
                results.push(result);
            }
        }
        assert_eq!(next_digest, digests.fingerprints.len());
        if let Err(error) = self.write_queued() {
            let message = error.to_string();
            for result in results.iter_mut().filter(|result| result.is_ok()) {
                *result = Err(Error::io(
                    "writing container data",
                    std::io::Error::other(message.clone()),
                ));
            }
            return;
        }
        if flush_wanted {
            if let Err(error) = self.flush() {
                let message = error.to_string();
                for (write, result) in writes.iter().zip(results.iter_mut()) {
                    if write.fua && result.is_ok() {
                        *result = Err(Error::io(
                            "flushing a FUA write",
                            std::io::Error::other(message.clone()),
                        ));
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
        let mut state = self.state.lock();
        self.check_usable(&state)?;
        if state.journal.is_none() {
            return Err(super::read_only_error());
        }
        let record = self.volume_record(&state, volume)?;
        self.admit_write(&mut state, bytes)?;
        let filesystem = state.volumes[&volume].filesystem.clone();
        Ok((record, filesystem))
    }

    /// Fingerprints the whole blocks of every planned write that will be deduplicated, as
    /// one batch, in order, and computes their checksums for the containers (when chunks are
    /// stored uncompressed): both outside the lock.
    fn digest_plans(
        &self,
        plans: &[Result<Vec<BlockPlan>>],
        record: &VolumeRecord,
        writes: &[BatchWrite<'_>],
    ) -> Digests {
        let block_bytes = record.block_bytes as usize;
        let mut inputs = Vec::new();
        for (write, plan) in writes.iter().zip(plans) {
            let Ok(plan) = plan else { continue };
            let first = (block_bytes - (write.offset % block_bytes as u64) as usize) % block_bytes;
            for (index, plan) in plan.iter().enumerate() {
                if let BlockPlan::Whole(WriteDecision::Deduplicate) = plan {
                    let start = block_start_in_request(index, first, write.offset, block_bytes);
                    inputs.push(&write.data[start..start + block_bytes]);
                }
            }
        }
        let mut fingerprints = vec![Fingerprint::ZERO; inputs.len()];
        self.config
            .fingerprint
            .hash_batch(&inputs, &mut fingerprints);
        let checksums = if self.config.containers.compression_level.is_none() {
            inputs.iter().map(|input| crc32c::crc32c(input)).collect()
        } else {
            Vec::new()
        };
        Digests {
            fingerprints,
            checksums,
        }
    }

    fn write_locked(
        &self,
        state: &mut EngineState,
        record: &VolumeRecord,
        offset: u64,
        data: &[u8],
        plans: &[BlockPlan],
        digests: DigestSlice<'_>,
    ) -> Result<()> {
        let block_bytes = record.block_bytes as u64;
        let first_block = offset / block_bytes;
        let first = ((block_bytes - offset % block_bytes) % block_bytes) as usize;
        let mut next_digest = 0;
        let mut merged = self.prepare_write(state, record, offset, data, plans)?;
        let filesystem = state.volumes[&record.id].filesystem.clone();
        let now = unix_seconds();
        for (index, plan) in plans.iter().enumerate() {
            let block = first_block + index as u64;
            let new_chunk = match plan {
                BlockPlan::Whole(decision) => {
                    let start = block_start_in_request(index, first, offset, block_bytes as usize);
                    let content = &data[start..start + block_bytes as usize];
                    let digest = match decision {
                        WriteDecision::Deduplicate => {
                            next_digest += 1;
                            Some(digests.get(next_digest - 1))
                        }
                        _ => None,
                    };
                    self.store_block(state, record, block, content, *decision, digest, now)?
                }
                BlockPlan::Partial => {
                    state.counters.read_modify_writes += 1;
                    let content = merged
                        .iter_mut()
                        .find(|(at, _)| *at == index)
                        .map(|(_, content)| std::mem::take(content))
                        .expect("partial blocks are merged before the write");
                    let block_start = block * block_bytes;
                    let decision =
                        decide_write(record, filesystem.as_deref(), block_start, &content);
                    let digest = match decision {
                        WriteDecision::Deduplicate => {
                            Some((self.config.fingerprint.hash(&content), None))
                        }
                        _ => None,
                    };
                    self.store_block(state, record, block, &content, decision, digest, now)?
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
        let block_bytes = record.block_bytes as u64;
        let first_block = offset / block_bytes;
        let map = state.volumes[&record.id].map;
        let mut merged = Vec::new();
        for (index, plan) in plans.iter().enumerate() {
            let block = first_block + index as u64;
            let old = mapped_chunk(state, record, &map, block)?;
            if old != ZERO_CHUNK && old != LOST_CHUNK {
                chunk_record(state, record, block, old)?;
            }
            if let BlockPlan::Partial = plan {
                readable_chunk(state, record, &map, block)?;
                let mut content = vec![0u8; block_bytes as usize];
                self.read_block_locked(state, record, block, &mut content)
                    .map_err(|error| block_error(record, block, error))?;
                let block_start = block * block_bytes;
                let from = offset.max(block_start);
                let to = (offset + data.len() as u64).min(block_start + block_bytes);
                content[(from - block_start) as usize..(to - block_start) as usize]
                    .copy_from_slice(&data[(from - offset) as usize..(to - offset) as usize]);
                merged.push((index, content));
            }
        }
        Ok(merged)
    }

    /// Stores one block's content as decided and returns its chunk id; counts the decision.
    #[allow(clippy::too_many_arguments)]
    fn store_block(
        &self,
        state: &mut EngineState,
        record: &VolumeRecord,
        block: u64,
        content: &[u8],
        decision: WriteDecision,
        digest: Option<(Fingerprint, Option<u32>)>,
        now: u64,
    ) -> Result<ChunkId> {
        state.counters.blocks_written += 1;
        let checksum = digest.and_then(|(_, checksum)| checksum);
        let (fingerprint, owner) = match decision {
            WriteDecision::Zero => {
                state.counters.zero_blocks_written += 1;
                return Ok(ZERO_CHUNK);
            }
            WriteDecision::Deduplicate => {
                let (fingerprint, _) = digest.expect("deduplicated blocks are fingerprinted");
                state.copies.observe_write(&fingerprint);
                (Some(fingerprint), 0)
            }
            WriteDecision::Deferred => {
                state.counters.deferred_blocks += 1;
                (None, deferred_owner(record.id, block))
            }
            WriteDecision::NoDedup(reason) => {
                reason.count(&mut state.counters);
                (None, permanent_owner(record.id, block))
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
            state
                .chunks
                .release(&mut state.pages, old_chunk, &mut state.chunk_changes)?;
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
        state.chunks.read_into(&mut state.pages, chunk, out)
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
        {
            let mut state = self.state.lock();
            self.check_usable(&state)?;
            state.counters.trims += 1;
            let record = self.volume_record(&state, volume)?;
            check_range(&record, offset, length)?;
            let result = self.unmap_locked(&mut state, &record, offset, length, zero_partial);
            self.fail_on_error(&mut state, result)?;
        }
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
            let zeros = vec![0u8; block_bytes as usize];
            let head_end = end.min(whole_start * block_bytes);
            if head_end > offset {
                self.write_partial_zeros(
                    state,
                    record,
                    offset,
                    &zeros[..(head_end - offset) as usize],
                )?;
            }
            let tail_start = (whole_end * block_bytes).max(offset);
            if whole_end >= whole_start && end > tail_start {
                self.write_partial_zeros(
                    state,
                    record,
                    tail_start,
                    &zeros[..(end - tail_start) as usize],
                )?;
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
            let window_end = (window_start + UNMAP_WINDOW_BLOCKS).min(end);
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
        self.write_locked(state, record, offset, zeros, &plans, DigestSlice::default())
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
    pub fn block_status(&self, volume: VolumeId, offset: u64, length: u64) -> Result<Vec<Extent>> {
        self.note_request();
        let mut state = self.state.lock();
        self.check_usable(&state)?;
        let record = self.volume_record(&state, volume)?;
        check_range(&record, offset, length)?;
        let block_bytes = record.block_bytes as u64;
        let map = state.volumes[&volume].map;
        let end = (offset + length)
            .min(offset - offset % block_bytes + BLOCK_STATUS_BLOCKS_MAX * block_bytes);
        let mut extents: Vec<Extent> = Vec::new();
        let mut position = offset;
        while position < end {
            let block = position / block_bytes;
            let piece = (block_bytes - position % block_bytes).min(end - position);
            let hole = mapped_chunk(&mut state, &record, &map, block)? == ZERO_CHUNK;
            match extents.last_mut() {
                Some(last) if last.hole == hole => last.length += piece,
                _ => extents.push(Extent {
                    length: piece,
                    hole,
                    zero: hole,
                }),
            }
            position += piece;
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
            let mut guard = self.state.lock();
            let state = &mut *guard;
            self.check_usable(state)?;
            let record = self.volume_record(state, volume)?;
            check_range(&record, offset, length)?;
            block_bytes = record.block_bytes as u64;
            let map = state.volumes[&volume].map;
            let first = offset / block_bytes;
            let last = (offset + length).div_ceil(block_bytes);
            for block in first..last {
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
                if self.content_cache.enabled()
                    && !self
                        .content_cache
                        .contains(CacheKey::of(&chunk_record.location))
                {
                    // A chunk still in memory (the open container's buffer or the write
                    // queue) is copied here and cached now; one in a file is read outside
                    // the lock.
                    let mut buffer = vec![0u8; block_bytes as usize];
                    match state
                        .chunks
                        .plan_read(&mut state.pages, chunk, &mut buffer)?
                    {
                        ChunkRead::File { file, location } => pending.push((file, location)),
                        ChunkRead::Copied => self
                            .content_cache
                            .insert(CacheKey::of(&chunk_record.location), &buffer),
                    }
                }
            }
        }
        let mut buffer = vec![0u8; block_bytes as usize];
        for (file, location) in pending {
            read_located(file.as_ref(), &location, &mut buffer)?;
            self.content_cache.insert(CacheKey::of(&location), &buffer);
        }
        Ok(())
    }
}

/// The chunks that the whole blocks of a batch's writes will replace, as far as their map
/// pages are in memory: for warming what releasing them reads. Changes nothing.
fn overwritten_chunks(
    state: &EngineState,
    record: &VolumeRecord,
    writes: &[BatchWrite<'_>],
    plans: &[Result<Vec<BlockPlan>>],
) -> Vec<ChunkId> {
    let map = state.volumes[&record.id].map;
    let block_bytes = record.block_bytes as u64;
    let blocks = writes
        .iter()
        .zip(plans)
        .filter(|(_, plan)| plan.is_ok())
        .flat_map(|(write, _)| {
            let first = write.offset.div_ceil(block_bytes);
            let end = (write.offset + write.data.len() as u64) / block_bytes;
            first..end.max(first)
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

/// Offset in the request buffer of the `index`-th block a request touches, where the first
/// whole block starts `first` bytes into the request.
fn block_start_in_request(index: usize, first: usize, offset: u64, block_bytes: usize) -> usize {
    if offset.is_multiple_of(block_bytes as u64) {
        index * block_bytes
    } else {
        // Block 0 is the partial head; whole blocks start at `first`.
        first + (index - 1) * block_bytes
    }
}

/// Splits a write into per-block plans, deciding whole blocks from the hints.
fn plan_blocks(
    record: &VolumeRecord,
    filesystem: Option<&crate::hints::fs::MetadataMap>,
    offset: u64,
    data: &[u8],
) -> Vec<BlockPlan> {
    let block_bytes = record.block_bytes as u64;
    let end = offset + data.len() as u64;
    let mut plans = Vec::new();
    let mut position = offset;
    while position < end {
        let block_start = position - position % block_bytes;
        let block_end = block_start + block_bytes;
        if position == block_start && block_end <= end {
            let content = &data[(position - offset) as usize..(block_end - offset) as usize];
            plans.push(BlockPlan::Whole(decide_write(
                record,
                filesystem,
                block_start,
                content,
            )));
        } else {
            plans.push(BlockPlan::Partial);
        }
        position = block_end.min(end);
    }
    plans
}
