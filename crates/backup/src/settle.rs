//! Settling segments after their reference counts changed: chunk removal and repackaging
//! (paper 2 §2.4.3), shared by reverse deduplication and deletion.
//!
//! **Plan** ([`plan_settlement`]), for each candidate segment:
//!
//! - a *shared* segment whose segment count reached zero loses every stored chunk whose chunk
//!   count is zero (removed), becomes *archival* and leaves the segment index; its surviving
//!   chunks are repackaged into an archival container stamped with the given time; a segment
//!   left with no chunk dies;
//! - an *archival* segment marks chunks whose count reached zero as removed (their bytes stay
//!   in the container as garbage until it dies or a sweep rewrites it) and dies when none is
//!   left.
//!
//! Every shared container that held a repackaged segment is evacuated: its other segments,
//! still shared, are copied into new shared containers (time stamp 0), and it is dropped. So
//! each container holds only shared or only archival segments, and repackaged containers are
//! never read again by later reverse deduplications. A container whose last segment dies is
//! dropped without being read: that is deletion by time stamp.
//!
//! **Execution** ([`copy_segments`]) copies the planned segments' frames into new
//! containers ([`crate::frames::repack`]: whole frames as they are, frames that lost chunks
//! rebuilt from the stored ones and compressed again), reading several source containers in
//! parallel and asking the kernel to prefetch the next ones, and records the new locations in
//! the plan's [`Changes`]. Sealing syncs every new container before the caller commits.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use onecopy_core::catalog::CatalogView;
use onecopy_core::container::{ContainerId, ContainerWriter};
use onecopy_core::fingerprint::Fingerprint;
use rayon::prelude::*;
use serde::Serialize;

use crate::changes::Changes;
use crate::compact::CompactReport;
use crate::error::{BackupError, Result};
use crate::frames::{read_stored_frames, repack};
use crate::segment::{ChunkStorage, ContainerKind, SegmentContainer, SegmentId, SegmentState};
use crate::store::{now_unix_ns, BackupStore, StoreState};

/// Source containers read at once while copying. Their segments are read in parallel, so one
/// container keeps both cores busy, and its frames (at most `container_bytes`) are what a copy
/// holds in memory; the next container is advised to the kernel meanwhile.
const COPY_BATCH_CONTAINERS: usize = 1;

/// A segment to copy into a new container.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SegmentMove {
    pub segment: SegmentId,
    pub from: ContainerId,
    pub kind: ContainerKind,
}

/// What settling will do.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Settlement {
    /// Time stamp of the archival containers written.
    pub timestamp: u64,
    pub moves: Vec<SegmentMove>,
    /// Containers whose records go away; their files are removed after the commit.
    pub dropped_containers: Vec<ContainerId>,
    /// Fingerprints of segments leaving the segment index.
    #[serde(skip)]
    pub unindexed: Vec<(Fingerprint, SegmentId)>,
    pub segments_archived: u64,
    pub segments_died: u64,
    pub chunks_removed: u64,
    /// Container bytes of the removed chunks (their shares of their frames: estimated).
    pub removed_bytes: u64,
    pub copy_archival_bytes: u64,
    pub copy_shared_bytes: u64,
    /// Containers that keep chunks or segments this settlement removed: they stay allocated
    /// until the container is rewritten ([`execute_settlement`] rewrites those where that
    /// frees enough, `compact` the others).
    pub garbage_containers: BTreeSet<ContainerId>,
}

/// Plans the settlement of `candidates` (segments whose counts changed in `changes`).
pub(crate) fn plan_settlement(
    changes: &mut Changes,
    view: &impl CatalogView,
    candidates: &BTreeSet<SegmentId>,
    timestamp: u64,
) -> Result<Settlement> {
    let mut settlement = Settlement {
        timestamp,
        ..Settlement::default()
    };
    let mut evacuate = BTreeSet::new();
    let mut moved = BTreeSet::new();
    // Highest id first: a chunk borrows only from a segment with a lower id (written earlier
    // by the same backup), so every borrower is settled before its lender, and a lender
    // whose chunk a settled borrower released joins the candidates in time.
    let mut pending = candidates.clone();
    while let Some(segment) = pending.pop_last() {
        let Some(head) = changes.head(view, segment)? else {
            continue;
        };
        let transition = head.state == SegmentState::Shared && head.live_references == 0;
        if head.state == SegmentState::Shared && !transition {
            continue;
        }
        let record = changes.record_mut(view, segment)?;
        let mut removed_any = false;
        let mut released = Vec::new();
        for index in 0..record.chunks.len() {
            let footprint = record.chunk_footprint(index);
            let chunk = &mut record.chunks[index];
            match (chunk.storage, chunk.direct_references) {
                (ChunkStorage::Stored(_), 0) => {
                    chunk.storage = ChunkStorage::Removed;
                    settlement.chunks_removed += 1;
                    settlement.removed_bytes += footprint;
                    removed_any = true;
                }
                // A lost chunk nothing references any more is simply gone.
                (ChunkStorage::Lost, 0) => chunk.storage = ChunkStorage::Removed,
                // A borrowed one gives its lender's chunk back.
                (
                    ChunkStorage::Borrowed {
                        segment: lender,
                        index,
                    },
                    0,
                ) => {
                    assert!(lender < segment, "chunks borrow from earlier segments");
                    chunk.storage = ChunkStorage::Removed;
                    released.push((lender, index));
                }
                _ => {}
            }
        }
        for (lender, index) in released {
            let lent = changes
                .record_mut(view, lender)?
                .chunks
                .get_mut(index as usize)
                .ok_or_else(|| {
                    BackupError::corrupt(format!("segment {lender}"), format!("no chunk {index}"))
                })?;
            lent.direct_references = lent.direct_references.checked_sub(1).ok_or_else(|| {
                BackupError::corrupt(
                    format!("chunk {index} of segment {lender}"),
                    "lent to a chunk it does not count",
                )
            })?;
            pending.insert(lender);
        }
        let record = changes.record_mut(view, segment)?;
        let empty = record.is_empty();
        let has_stored = record.has_stored();
        let container = record.container;
        let stored_bytes = record.stored_bytes();
        if transition {
            record.state = SegmentState::Archival;
            settlement.unindexed.push((head.fingerprint, segment));
            changes.head_mut(view, segment)?.state = SegmentState::Archival;
        }
        if empty || !has_stored {
            let dropped = if empty {
                settlement.segments_died += 1;
                changes.delete_segment(view, segment)?
            } else {
                // Only lost chunks are left: the segment needs no container any more.
                changes.detach_segment(view, segment)?
            };
            match (dropped, container) {
                (Some(dropped), _) => settlement.dropped_containers.push(dropped),
                // The segment's frames stay in a container its other segments keep.
                (None, Some(container)) => {
                    settlement.garbage_containers.insert(container);
                }
                (None, None) => {}
            }
        } else if transition {
            let from = container.expect("a segment with stored chunks has a container");
            settlement.segments_archived += 1;
            settlement.copy_archival_bytes += stored_bytes;
            settlement.moves.push(SegmentMove {
                segment,
                from,
                kind: ContainerKind::Archival,
            });
            moved.insert(segment);
            evacuate.insert(from);
        } else if removed_any {
            if let Some(container) = container {
                settlement.garbage_containers.insert(container);
            }
        }
    }
    for container in evacuate {
        let record = changes.container_mut(view, container)?.clone();
        assert_eq!(
            record.kind,
            ContainerKind::Shared,
            "only shared containers hold shared segments"
        );
        for &segment in &record.segments {
            if moved.contains(&segment) {
                continue;
            }
            let head = changes.head(view, segment)?.ok_or_else(|| {
                BackupError::corrupt(format!("segment {segment}"), "head missing")
            })?;
            assert!(
                head.state == SegmentState::Shared && head.live_references > 0,
                "a shared container's other segments are still shared"
            );
            settlement.copy_shared_bytes += changes.record_mut(view, segment)?.stored_bytes();
            settlement.moves.push(SegmentMove {
                segment,
                from: container,
                kind: ContainerKind::Shared,
            });
        }
        changes.containers.insert(container, None);
        settlement.dropped_containers.push(container);
    }
    settlement
        .moves
        .sort_by_key(|planned| (planned.from, planned.segment));
    settlement.dropped_containers.sort_unstable();
    settlement.dropped_containers.dedup();
    for dropped in &settlement.dropped_containers {
        settlement.garbage_containers.remove(dropped);
    }
    Ok(settlement)
}

/// Counters of a copy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct CopyReport {
    pub containers_read: u64,
    pub containers_written: u64,
    pub read_bytes: u64,
    pub written_bytes: u64,
    pub seconds: f64,
}

struct OpenWriter {
    writer: ContainerWriter,
    segments: Vec<SegmentId>,
}

/// Copies the planned segments into new containers and records their new locations in
/// `changes` (and the new container records); `state` allocates the container ids.
fn copy_segments(
    store: &BackupStore,
    settlement: &Settlement,
    changes: &mut Changes,
    state: &mut StoreState,
) -> Result<CopyReport> {
    let started = Instant::now();
    let mut report = CopyReport::default();
    let mut by_source: BTreeMap<ContainerId, Vec<&SegmentMove>> = BTreeMap::new();
    for planned in &settlement.moves {
        by_source.entry(planned.from).or_default().push(planned);
    }
    let sources: Vec<ContainerId> = by_source.keys().copied().collect();
    let mut writers: [Option<OpenWriter>; 2] = [None, None];
    for (batch_number, batch) in sources.chunks(COPY_BATCH_CONTAINERS).enumerate() {
        if store.runtime.prefetch {
            if let Some(next) = sources.chunks(COPY_BATCH_CONTAINERS).nth(batch_number + 1) {
                for &id in next {
                    let _ = store.containers.advise_will_need(id);
                }
            }
        }
        // Read the frames of every planned segment of the batch in parallel.
        let jobs: Vec<&SegmentMove> = batch
            .iter()
            .flat_map(|id| by_source[id].iter())
            .copied()
            .collect();
        let containers = &store.containers;
        let loaded: Vec<Vec<Option<Vec<u8>>>> = jobs
            .par_iter()
            .map(|planned| {
                let record = changes.records[&planned.segment]
                    .as_ref()
                    .expect("moved segments live");
                read_stored_frames(containers, record)
            })
            .collect::<Result<_>>()?;
        report.containers_read += batch.len() as u64;
        for (planned, stored) in jobs.into_iter().zip(loaded) {
            let slot = match planned.kind {
                ContainerKind::Shared => 0,
                ContainerKind::Archival => 1,
            };
            let footprint: u64 = changes.records[&planned.segment]
                .as_ref()
                .expect("moved segments live")
                .stored_bytes();
            report.read_bytes += footprint;
            let needs_new = writers[slot].as_ref().is_some_and(|open| {
                open.writer.chunk_count() > 0
                    && open.writer.bytes() + footprint > store.state.options.container_bytes
            });
            if needs_new {
                let open = writers[slot].take().expect("checked");
                seal(
                    open,
                    planned.kind,
                    settlement.timestamp,
                    changes,
                    &mut report,
                )?;
            }
            if writers[slot].is_none() {
                let id = state.container_id_next;
                state.container_id_next += 1;
                let writer = store.containers.create(id, now_unix_ns() / 1_000_000_000)?;
                writers[slot] = Some(OpenWriter {
                    writer,
                    segments: Vec::new(),
                });
            }
            let open = writers[slot].as_mut().expect("opened");
            let record = changes
                .records
                .get_mut(&planned.segment)
                .and_then(Option::as_mut)
                .expect("moved segments live");
            report.written_bytes += repack(
                record,
                &stored,
                &mut open.writer,
                &store.fingerprinter,
                store.rewrite_coding(),
            )?;
            open.segments.push(planned.segment);
        }
    }
    for (slot, open) in writers.into_iter().enumerate() {
        if let Some(open) = open {
            let kind = if slot == 0 {
                ContainerKind::Shared
            } else {
                ContainerKind::Archival
            };
            seal(open, kind, settlement.timestamp, changes, &mut report)?;
        }
    }
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

fn seal(
    open: OpenWriter,
    kind: ContainerKind,
    timestamp: u64,
    changes: &mut Changes,
    report: &mut CopyReport,
) -> Result<()> {
    let id = open.writer.id();
    let stamp = match kind {
        ContainerKind::Shared => 0,
        ContainerKind::Archival => timestamp,
    };
    let sealed = open.writer.seal(stamp)?;
    report.containers_written += 1;
    let mut segments = open.segments;
    segments.sort_unstable();
    changes.containers.insert(
        id,
        Some(SegmentContainer {
            kind,
            timestamp: stamp,
            bytes: sealed.bytes,
            segments,
        }),
    );
    Ok(())
}

/// What [`execute_settlement`] did, timed in parts.
pub(crate) struct SettlementRun {
    pub copy: CopyReport,
    pub commit_seconds: f64,
    pub cleanup_seconds: f64,
    /// The rewrite of the containers the settlement left with enough garbage.
    pub compact: Option<CompactReport>,
    /// Why that rewrite stopped (the settlement itself is committed).
    pub compact_error: Option<String>,
}

/// The execution shared by deletion and reverse deduplication, in the write order: copy the
/// segments `settlement` repackages, commit `changes` with the new store state (with the
/// reserve released, so that the commit finds room on a full disk), then remove containers
/// and index entries ([`finish_settlement`]), write the reserve again and rewrite the
/// containers left with garbage where that frees enough ([`BackupStore::compact_garbage`]).
/// `serial` is the store state the plan was made from; a plan made from another state is
/// refused (`what` names it).
pub(crate) fn execute_settlement(
    store: &mut BackupStore,
    serial: u64,
    what: &str,
    settlement: &Settlement,
    changes: &mut Changes,
) -> Result<SettlementRun> {
    store.recover()?;
    if serial != store.state.serial {
        return Err(BackupError::InvalidArgument(format!(
            "the {what} plan is stale: make a new one"
        )));
    }
    let mut state = store.state.clone();
    for (segment, record) in &changes.records {
        if record.is_none() {
            state.damaged_segments.remove(segment);
        }
    }
    let copy = copy_segments(store, settlement, changes, &mut state)?;
    let commit_started = Instant::now();
    store.release_reserve()?;
    let mut write = store.catalog.write()?;
    changes.apply(&mut write)?;
    store.commit(write, state, &settlement.dropped_containers)?;
    let commit_seconds = commit_started.elapsed().as_secs_f64();
    let cleanup_seconds = finish_settlement(store, settlement)?;
    store.restore_reserve();
    *changes = Changes::default();
    let (compact, compact_error) = match store.compact_garbage(&settlement.garbage_containers) {
        Ok(report) => (report, None),
        Err(error) => {
            // The settlement is committed; a compaction that stops leaves only what recovery
            // removes, and `backup compact` can give the space back later.
            store.recover_again()?;
            store.restore_reserve();
            (None, Some(error.to_string()))
        }
    };
    Ok(SettlementRun {
        copy,
        commit_seconds,
        cleanup_seconds,
        compact,
        compact_error,
    })
}

/// After the catalog commit: removes the dropped containers, then drops the settled
/// segments from the index and checkpoints it. Deletion order: recipe and records first
/// (the commit), then the data, then the index: the index names segments, not containers,
/// and every hit is confirmed against the catalog, so the containers may go first, which
/// frees their space before the index checkpoint needs any on a full disk.
fn finish_settlement(store: &mut BackupStore, settlement: &Settlement) -> Result<f64> {
    let started = Instant::now();
    store.remove_containers(&settlement.dropped_containers)?;
    for (fingerprint, segment) in &settlement.unindexed {
        store.index_remove(fingerprint, *segment);
    }
    store.checkpoint_index(store.state.serial);
    Ok(started.elapsed().as_secs_f64())
}
