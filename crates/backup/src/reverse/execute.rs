//! Executing a reverse deduplication plan; see the [module documentation](super).
//!
//! Order: (1) copy the repackaged segments into new containers, sealed and synced; (2) commit
//! the catalog: the archival recipe, counts, segment locations and container records, all at
//! once; (3) drop settled segments from the index and checkpoint it; (4) remove the evacuated
//! containers. A crash before (2) leaves the old state plus unreferenced new containers; after
//! (2), the new state plus unreferenced old containers and stale index entries. Recovery
//! removes both kinds of leftovers ([`BackupStore::recover`]). (5) Rewrite the containers the
//! removed chunks leave with enough garbage, like `backup compact`.

use std::time::Instant;

use serde::Serialize;

use super::plan::ReversePlan;
use crate::compact::CompactReport;
use crate::error::Result;
use crate::settle::{execute_settlement, CopyReport};
use crate::store::BackupStore;

/// What a reverse deduplication did, with per-phase timings.
#[derive(Clone, Debug, Serialize)]
pub struct ReverseReport {
    pub plan: ReversePlan,
    pub copy: CopyReport,
    pub commit_seconds: f64,
    /// Index update and container removal.
    pub cleanup_seconds: f64,
    /// The rewrite of the containers left with garbage where that frees at least
    /// [`crate::compact::GARBAGE_SHARE_MIN`] of one.
    pub compact: Option<CompactReport>,
    /// Why that rewrite stopped (the reverse deduplication is committed).
    pub compact_error: Option<String>,
    /// Whole operation, plan included.
    pub seconds: f64,
}

impl BackupStore {
    /// Executes `plan`, which must have been made from the current state of the store.
    pub fn execute_reverse(&mut self, plan: ReversePlan) -> Result<ReverseReport> {
        let what = format!(
            "reverse-deduplicating backup {}@{}",
            plan.series, plan.version
        );
        self.mutate(&what, |store| store.execute_reverse_unguarded(plan))
    }

    fn execute_reverse_unguarded(&mut self, mut plan: ReversePlan) -> Result<ReverseReport> {
        let started = Instant::now();
        let run = execute_settlement(
            self,
            plan.serial,
            "reverse deduplication",
            &plan.settlement,
            &mut plan.changes,
        )?;
        let seconds = plan.plan_seconds + started.elapsed().as_secs_f64();
        Ok(ReverseReport {
            plan,
            copy: run.copy,
            commit_seconds: run.commit_seconds,
            cleanup_seconds: run.cleanup_seconds,
            compact: run.compact,
            compact_error: run.compact_error,
            seconds,
        })
    }

    /// Plans and executes the reverse deduplication of `series@version`.
    pub fn reverse(&mut self, series: &str, version: u32) -> Result<ReverseReport> {
        self.recover()?;
        let plan = self.plan_reverse(series, version)?;
        self.execute_reverse(plan)
    }

    /// Reverse-deduplicates every pending backup of `series`, oldest first.
    pub fn reverse_pending_backups(&mut self, series: &str) -> Result<Vec<ReverseReport>> {
        self.recover()?;
        let mut reports = Vec::new();
        for version in self.pending_reverse(series)? {
            reports.push(self.reverse(series, version)?);
        }
        Ok(reports)
    }
}
