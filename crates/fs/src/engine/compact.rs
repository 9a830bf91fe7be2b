//! `onecopy fs compact`: reclaims the space of freed chunks (plain copies a deduplication
//! run released, overwritten data) with the core's compaction (`onecopy_core::gc`): a pure
//! plan of the emptiest containers, then their live chunks copied to the open container
//! (a `Relocated` change each, so no extent map changes) and the containers retired. Retired
//! containers are removed two checkpoints later, which this command writes at once. It also
//! removes the piece index's entries of freed chunks (`super::pieces`).
//!
//! On a full disk a compaction copies only what the free space beyond the headroom holds
//! (nothing when writes are refused): containers without live chunks are still retired,
//! which gives room back without taking any.
//!
//! Not guaranteed: the moved chunks of a rank-1 file stay in file order only as far as
//! their chunk ids are (compaction copies in chunk-id order).

use onecopy_core::gc::{self, CompactionOptions, CompactionPlan, CompactionReport};

use crate::error::Result;

use super::{FsEngine, State};

impl FsEngine {
    /// Plans a compaction and, unless `dry_run`, executes it and removes the retired
    /// containers.
    pub fn compact(&self, dry_run: bool) -> Result<(CompactionPlan, Option<CompactionReport>)> {
        // Copies only as much as the disk has room for (see `room_for_copies`).
        let options = |engine: &FsEngine, state: &State| -> Result<CompactionOptions> {
            let defaults = CompactionOptions::default();
            Ok(CompactionOptions {
                copy_bytes_limit: defaults
                    .copy_bytes_limit
                    .min(engine.room_for_copies(state)?),
                ..defaults
            })
        };
        if dry_run {
            let mut state = self.state.lock();
            let options = options(self, &state)?;
            let state = &mut *state;
            let plan = gc::plan_compaction(&state.chunks, &mut state.pages, &options)?;
            return Ok((plan, None));
        }
        let (plan, report) = self.mutate(|state| {
            let options = options(self, state)?;
            let plan = gc::plan_compaction(&state.chunks, &mut state.pages, &options)?;
            let mut changes = Vec::new();
            let report =
                gc::execute_compaction(&mut state.chunks, &mut state.pages, &plan, &mut changes);
            state.push_chunk_changes(changes);
            let report = report?;
            super::pieces::sweep_stale(state)?;
            Ok((plan, report))
        })?;
        // Retired containers go after the checkpoint that makes their retirement durable and
        // the next one (see `ChunkStore::remove_retired_containers`).
        self.checkpoint()?;
        self.checkpoint()?;
        Ok((plan, Some(report)))
    }
}
