//! Recompression: the frames a backup wrote, compressed again at a stronger level by the next
//! backup (docs/DESIGN.md, "Recompression").
//!
//! The write path compresses new frames at the repository's level (zstd 1 by default), fast
//! enough that compression is not what a backup waits for. Once a later backup commits, those
//! frames are what the series keeps, and `backup create` compresses them again at the
//! recompression level (zstd 7 by default) after its own work. Decompression runs at the
//! same speed whatever the level, so restores do not pay for it; the first backup never
//! does, and each later one pays in proportion to what it stores new.
//!
//! 1. **plan** ([`plan_recompression`], catalog records only): the containers from the
//!    store's `recompress_from` up, except those the running backup's inline phase wrote,
//!    that hold a frame the write path compressed and no recompression has touched
//!    ([`crate::frames::awaits_recompression`]), oldest first, within the backup's budget
//!    ([`RECOMPRESSION_BUDGET_SHARE`]). Settlements and compactions recompress the frames
//!    they rewrite as they go, so what is left is mostly the previous backup's new
//!    containers.
//! 2. **execute**: a compaction of those containers ([`crate::compact`]) whose frames are
//!    written with [`FrameCoding::Recompress`](crate::frames::FrameCoding): batches synced
//!    and committed one at a time, old containers removed after each commit; the last
//!    commit moves `recompress_from` up to where the plan stopped, so what is left or
//!    interrupted is taken up by the next backup.

use std::ops::Range;

use onecopy_core::catalog::CatalogView;
use onecopy_core::container::ContainerId;

use crate::compact::{
    for_each_used_frame, CompactContainer, CompactPlan, CompactReport, Recompression,
};
use crate::error::Result;
use crate::frames::{awaits_recompression, FrameCoding};
use crate::segment::{SegmentContainer, CONTAINERS};
use crate::store::BackupStore;

/// A backup recompresses at most this many times the bytes it stored new: its work, and the
/// bytes it reads, grow with its own change (an unchanged backup recompresses nothing), and
/// a series recompresses as fast as it stores.
pub const RECOMPRESSION_BUDGET_SHARE: u64 = 2;

/// Plans the recompression at `level` of the containers with ids in `range` but not in
/// `newest` (the running backup's own) that wait for it, in id order, up to `budget` bytes
/// of them: the plan stops before the first that would exceed it, where the next
/// recompression starts.
pub(crate) fn plan_recompression(
    view: &impl CatalogView,
    range: Range<ContainerId>,
    newest: Range<ContainerId>,
    (level, budget): (i32, u64),
    serial: u64,
) -> Result<CompactPlan> {
    let mut plan = CompactPlan {
        serial,
        ..CompactPlan::default()
    };
    let mut recompress_from = newest.start;
    for (id, bytes) in view.range_id(CONTAINERS, range.start, range.end)? {
        if newest.contains(&id) {
            continue;
        }
        let record = SegmentContainer::decode(&bytes, id)?;
        let (mut waiting, mut chunks) = (false, 0u64);
        for_each_used_frame(view, (id, &record), |segment_record, number, used| {
            chunks += used.len() as u64;
            waiting |= awaits_recompression(&segment_record.frames[number]);
        })?;
        if !waiting {
            continue;
        }
        if plan.rewrite_bytes + record.bytes > budget {
            recompress_from = id;
            break;
        }
        plan.rewrite_bytes += record.bytes;
        plan.containers.push(CompactContainer {
            id,
            bytes: record.bytes,
            // Unknown until the frames are compressed again.
            bytes_after: record.bytes,
            referenced_chunks: chunks,
        });
    }
    plan.recompression = Some(Recompression {
        level,
        recompress_from,
    });
    Ok(plan)
}

impl BackupStore {
    /// Recompresses the containers that wait for it, oldest first, up to
    /// [`RECOMPRESSION_BUDGET_SHARE`] times `stored_bytes` (what the running backup stored
    /// new) of them, except `newest` (the running backup's inline phase wrote them); see the
    /// module documentation. `None` when recompression is off or nothing was rewritten.
    pub(crate) fn recompress_aged(
        &mut self,
        newest: Range<ContainerId>,
        stored_bytes: u64,
    ) -> Result<Option<CompactReport>> {
        let FrameCoding::Recompress(level) = self.rewrite_coding() else {
            return Ok(None); // Off, or the write path compresses nothing.
        };
        let range = self.state.recompress_from..self.state.container_id_next;
        assert!(
            range.start <= newest.start && newest.end <= range.end,
            "the running backup's containers are the newest not yet seen"
        );
        let budget = stored_bytes * RECOMPRESSION_BUDGET_SHARE;
        if range == newest || budget == 0 {
            return Ok(None);
        }
        let plan = plan_recompression(
            &self.catalog.read()?,
            range,
            newest,
            (level, budget),
            self.state.serial,
        )?;
        let moved = plan.recompression.is_some_and(|recompression| {
            recompression.recompress_from != self.state.recompress_from
        });
        if plan.containers.is_empty() && !moved {
            return Ok(None);
        }
        let report = self.compact_unguarded(plan)?;
        Ok((!report.plan.containers.is_empty()).then_some(report))
    }
}
