//! `backup compact`: giving back the space of removed chunks.
//!
//! Deleting a backup by time stamp (and reverse deduplication) removes chunks from the
//! catalog, but a container whose other chunks are still referenced keeps them on disk: the
//! container is immutable, so its space comes back only when the container is rewritten
//! without them. Compaction does that, from the catalog alone:
//!
//! 1. **plan** (pure, [`BackupStore::plan_compact`]): for every container, the size it would
//!    have rewritten with only its referenced chunks ([`sealed_container_bytes`]): exact for
//!    frames that keep all their chunks (copied as they are), estimated for frames that lost
//!    some (their stored size in proportion to the raw bytes kept: they are compressed
//!    again); a container larger than that holds garbage, and the difference is what
//!    compaction frees. Nothing is read but catalog records, so a deletion can say what a
//!    compaction would free ([`crate::DeleteReport::compactable_bytes`]).
//! 2. **execute** ([`BackupStore::compact`]): containers are rewritten in batches of at most
//!    [`COMPACT_BATCH_BYTES`] of new containers; each batch is synced, committed (with the
//!    reserve released) and its old containers removed before the next starts, so compaction
//!    needs room for one batch at most, and a crash leaves only what recovery removes.
//!
//! Every copied or decoded frame is checked against its CRC (a damaged frame stops compaction
//! with an error pointing at `onecopy check --repair`, instead of being copied).

use std::collections::BTreeSet;
use std::time::Instant;

use onecopy_core::catalog::CatalogView;
use onecopy_core::container::format::{
    FOOTER_BYTES, HEADER_BYTES, TRAILER_ENTRY_BYTES, TRAILER_TAIL_BYTES,
};
use onecopy_core::container::{ContainerId, CHUNK_HEADER_BYTES};
use serde::Serialize;

use crate::changes::Changes;
use crate::error::Result;
use crate::frames::{read_stored_frames, repack, whole_frame, FrameCoding};
use crate::segment::{ChunkPlace, SegmentContainer, SegmentRecord, CONTAINERS};
use crate::store::{load_segment, now_unix_ns, BackupStore, StoreState};

/// New container bytes written per compaction commit.
pub const COMPACT_BATCH_BYTES: u64 = 256 << 20;

/// A container left with garbage by a deletion or reverse deduplication is rewritten at once
/// when that frees at least this share of it (numerator, denominator): a tenth, borg's
/// default threshold for compacting its segment files. Below it, rewriting costs more
/// writes than the space is worth; `backup compact` takes every container.
pub const GARBAGE_SHARE_MIN: (u64, u64) = (1, 10);

/// Size of a sealed container holding chunks of these stored sizes.
pub fn sealed_container_bytes(stored_bytes: impl IntoIterator<Item = u32>) -> u64 {
    let (count, bytes) = stored_bytes
        .into_iter()
        .fold((0u64, 0u64), |(count, bytes), stored| {
            (count + 1, bytes + stored as u64)
        });
    HEADER_BYTES as u64
        + count * CHUNK_HEADER_BYTES as u64
        + bytes
        + count * TRAILER_ENTRY_BYTES as u64
        + TRAILER_TAIL_BYTES as u64
        + FOOTER_BYTES as u64
}

/// One container a compaction rewrites (or removes, when nothing in it is referenced).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CompactContainer {
    pub id: ContainerId,
    /// Its size now.
    pub bytes: u64,
    /// Its size rewritten (0 when it is removed).
    pub bytes_after: u64,
    pub referenced_chunks: u64,
}

/// What a compaction will do.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CompactPlan {
    pub containers: Vec<CompactContainer>,
    /// Bytes the compaction frees: the containers' sizes minus their rewritten sizes.
    pub reclaimable_bytes: u64,
    /// Bytes it writes.
    pub rewrite_bytes: u64,
    /// Set when the rewrite is a recompression ([`crate::recompress`]).
    pub recompression: Option<Recompression>,
    #[serde(skip)]
    pub(crate) serial: u64,
}

/// What makes a compaction plan a recompression.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Recompression {
    /// zstd level of the frames written.
    pub level: i32,
    /// The store's `recompress_from` once the plan is carried out: below it, only the
    /// containers the plan covers waited for a recompression.
    pub recompress_from: ContainerId,
}

impl CompactPlan {
    /// The plan for those of its containers that `keep` accepts.
    fn retain(mut self, keep: impl Fn(&CompactContainer) -> bool) -> CompactPlan {
        self.containers.retain(keep);
        self.reclaimable_bytes = self
            .containers
            .iter()
            .map(|container| container.bytes - container.bytes_after)
            .sum();
        self.rewrite_bytes = self
            .containers
            .iter()
            .map(|container| container.bytes_after)
            .sum();
        self
    }
}

/// What a compaction did.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CompactReport {
    pub plan: CompactPlan,
    pub containers_rewritten: u64,
    pub containers_removed: u64,
    pub reclaimed_bytes: u64,
    pub commits: u64,
    pub seconds: f64,
}

/// What container `id` keeps once compacted: the stored size of each frame holding a
/// referenced chunk (estimated for frames that lost chunks, see the module documentation),
/// and the number of referenced chunks.
pub(crate) fn referenced_frames(
    view: &impl CatalogView,
    record: &SegmentContainer,
    id: ContainerId,
) -> Result<(Vec<u32>, u64)> {
    let mut frames = Vec::new();
    let mut chunk_count = 0u64;
    for_each_used_frame(view, (id, record), |segment_record, number, chunks| {
        chunk_count += chunks.len() as u64;
        let frame = segment_record.frames[number];
        if whole_frame(segment_record, number as u32).is_some() {
            frames.push(frame.stored_bytes);
        } else {
            let kept: u64 = chunks
                .iter()
                .map(|&(index, _)| segment_record.chunks[index as usize].raw_bytes as u64)
                .sum();
            let estimate = frame.stored_bytes as u64 * kept / (frame.raw_bytes as u64).max(1);
            frames.push(estimate.max(1) as u32);
        }
    })?;
    Ok((frames, chunk_count))
}

/// Calls `each` with every frame of container `id` (whose record is `record`) that holds a
/// stored chunk: the record of the segment it belongs to, its number, and its stored chunks.
pub(crate) fn for_each_used_frame(
    view: &impl CatalogView,
    (id, record): (ContainerId, &SegmentContainer),
    mut each: impl FnMut(&SegmentRecord, usize, &[(u32, ChunkPlace)]),
) -> Result<()> {
    for &segment in &record.segments {
        let segment_record = load_segment(view, segment)?;
        if segment_record.container != Some(id) {
            continue;
        }
        for (number, chunks) in segment_record.frame_chunks().iter().enumerate() {
            if !chunks.is_empty() {
                each(&segment_record, number, chunks);
            }
        }
    }
    Ok(())
}

/// Plans compaction of `only` (every container when `None`).
pub(crate) fn plan_compact(
    view: &impl CatalogView,
    only: Option<&BTreeSet<ContainerId>>,
    serial: u64,
) -> Result<CompactPlan> {
    let mut plan = CompactPlan {
        serial,
        ..CompactPlan::default()
    };
    let records: Vec<(ContainerId, Vec<u8>)> = match only {
        None => view.range_id(CONTAINERS, 0, u64::MAX)?,
        Some(ids) => ids
            .iter()
            .filter_map(|&id| {
                view.get_id(CONTAINERS, id)
                    .transpose()
                    .map(|bytes| bytes.map(|bytes| (id, bytes)))
            })
            .collect::<onecopy_core::Result<_>>()?,
    };
    for (id, bytes) in records {
        let record = SegmentContainer::decode(&bytes, id)?;
        let (frames, chunk_count) = referenced_frames(view, &record, id)?;
        let bytes_after = if frames.is_empty() {
            0
        } else {
            sealed_container_bytes(frames)
        };
        if record.bytes > bytes_after {
            plan.reclaimable_bytes += record.bytes - bytes_after;
            plan.rewrite_bytes += bytes_after;
            plan.containers.push(CompactContainer {
                id,
                bytes: record.bytes,
                bytes_after,
                referenced_chunks: chunk_count,
            });
        }
    }
    Ok(plan)
}

impl BackupStore {
    /// Plans a compaction of every container (reads catalog records only).
    pub fn plan_compact(&self) -> Result<CompactPlan> {
        plan_compact(&self.catalog.read()?, None, self.state.serial)
    }

    /// Rewrites those of `containers` (left with removed chunks or segments by a settlement)
    /// where that frees at least [`GARBAGE_SHARE_MIN`] of the container; `None` when none
    /// does.
    pub(crate) fn compact_garbage(
        &mut self,
        containers: &BTreeSet<ContainerId>,
    ) -> Result<Option<CompactReport>> {
        if containers.is_empty() {
            return Ok(None);
        }
        let (share, of) = GARBAGE_SHARE_MIN;
        let plan = plan_compact(&self.catalog.read()?, Some(containers), self.state.serial)?
            .retain(|container| {
                (container.bytes - container.bytes_after) * of >= container.bytes * share
            });
        if plan.containers.is_empty() {
            return Ok(None);
        }
        self.compact_unguarded(plan).map(Some)
    }

    /// Executes `plan` (made from the current state); see the module documentation.
    pub fn compact(&mut self, plan: CompactPlan) -> Result<CompactReport> {
        self.mutate("compacting", |store| store.compact_unguarded(plan))
    }

    pub(crate) fn compact_unguarded(&mut self, plan: CompactPlan) -> Result<CompactReport> {
        self.recover()?;
        if plan.serial != self.state.serial {
            return Err(crate::error::BackupError::InvalidArgument(
                "the compaction plan is stale: make a new one".to_string(),
            ));
        }
        let started = Instant::now();
        let mut report = CompactReport {
            plan: plan.clone(),
            ..CompactReport::default()
        };
        let mut batches: Vec<Vec<&CompactContainer>> = Vec::new();
        let mut batch_bytes = COMPACT_BATCH_BYTES;
        for container in &plan.containers {
            if batch_bytes >= COMPACT_BATCH_BYTES {
                batches.push(Vec::new());
                batch_bytes = 0;
            }
            batches.last_mut().expect("pushed above").push(container);
            batch_bytes += container.bytes_after;
        }
        if batches.is_empty() && plan.recompression.is_some() {
            batches.push(Vec::new()); // Its commit records that the range is done.
        }
        let coding = match plan.recompression {
            Some(recompression) => FrameCoding::Recompress(recompression.level),
            None => self.rewrite_coding(),
        };
        let count = batches.len();
        for (number, batch) in batches.iter().enumerate() {
            // The last commit records that the recompression is done: a crash before it
            // leaves the range to the next one.
            let recompress_from = plan
                .recompression
                .filter(|_| number + 1 == count)
                .map(|recompression| recompression.recompress_from);
            self.compact_batch(batch, coding, recompress_from, &mut report)?;
        }
        // The segment index holds what it held (segments keep their ids and fingerprints):
        // checkpointed with the new serial, it is trusted by the next open.
        self.checkpoint_index(self.state.serial);
        self.restore_reserve();
        report.seconds = started.elapsed().as_secs_f64();
        Ok(report)
    }

    /// Rewrites one batch: new containers synced, one commit (recording `recompress_from`
    /// when given), old containers removed.
    fn compact_batch(
        &mut self,
        batch: &[&CompactContainer],
        coding: FrameCoding,
        recompress_from: Option<ContainerId>,
        report: &mut CompactReport,
    ) -> Result<()> {
        let read = self.catalog.read()?;
        let mut changes = Changes::default();
        let mut state = self.state.clone();
        if let Some(from) = recompress_from {
            state.recompress_from = from;
        }
        let mut dropped = Vec::new();
        for planned in batch {
            let record = crate::store::load_container(&read, planned.id)?;
            let rewritten = rewrite_container(
                self,
                &read,
                &mut changes,
                &mut state,
                (planned.id, &record),
                coding,
            )?;
            dropped.push(planned.id);
            // What the rewritten container takes (frames compressed again may differ from the
            // plan's estimate).
            let bytes_after = match rewritten {
                Some(new_id) => changes.containers[&new_id]
                    .as_ref()
                    .map_or(0, |container| container.bytes),
                None => 0,
            };
            if bytes_after == 0 {
                report.containers_removed += 1;
            } else {
                report.containers_rewritten += 1;
            }
            report.reclaimed_bytes += planned.bytes.saturating_sub(bytes_after);
        }
        drop(read);
        self.release_reserve()?;
        let mut write = self.catalog.write()?;
        changes.apply(&mut write)?;
        self.commit(write, state, &dropped)?;
        self.remove_containers(&dropped)?;
        report.commits += 1;
        Ok(())
    }
}

/// Copies the referenced chunks of container `id` (whose record is `record`) into a new
/// container of the same kind and time stamp (none when nothing is referenced), its frames
/// written as `coding` says, and records the new locations in `changes`, with `id`'s record
/// deleted. `state` allocates the new id. Returns the new container's id.
pub(crate) fn rewrite_container(
    store: &BackupStore,
    view: &impl CatalogView,
    changes: &mut Changes,
    state: &mut StoreState,
    (id, record): (ContainerId, &SegmentContainer),
    coding: FrameCoding,
) -> Result<Option<ContainerId>> {
    changes.containers.insert(id, None);
    let mut writer = None;
    for &segment in &record.segments {
        let segment_record = changes.record_mut(view, segment)?;
        if segment_record.container != Some(id) {
            continue;
        }
        if !segment_record.has_stored() {
            // Only lost, removed or null chunks: the segment needs no container any more.
            segment_record.container = None;
            segment_record.frames.clear();
            continue;
        }
        let stored = read_stored_frames(&store.containers, segment_record)?;
        if writer.is_none() {
            let new_id = state.container_id_next;
            state.container_id_next += 1;
            writer = Some(
                store
                    .containers
                    .create(new_id, now_unix_ns() / 1_000_000_000)?,
            );
        }
        let writer = writer.as_mut().expect("created above");
        // The checksum of every frame copied or decoded is checked: damage stops the rewrite
        // instead of being copied.
        repack(
            segment_record,
            &stored,
            writer,
            &store.fingerprinter,
            coding,
        )?;
    }
    let Some(writer) = writer else {
        return Ok(None);
    };
    let new_id = writer.id();
    let sealed = writer.seal(record.timestamp)?;
    changes.containers.insert(
        new_id,
        Some(SegmentContainer {
            bytes: sealed.bytes,
            ..record.clone()
        }),
    );
    Ok(Some(new_id))
}
