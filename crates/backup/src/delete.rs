//! Deleting backups: by container time stamp (paper 2 §2.5) or by mark and sweep (the
//! baseline), and retention (`expire`).
//!
//! Both methods start with the same metadata step, which reads only the deleted backup's
//! recipe (and its predecessor's, when that one points into it):
//!
//! 1. the deleted backup's references are released: segment counts of a live backup, chunk
//!    counts of the direct references of an archival one;
//! 2. the predecessor's indirect references into the deleted backup are rewritten: to the
//!    chunk they resolve to in it (a direct reference, whose count moves to the predecessor)
//!    or, if that is indirect too, to the same ordinal of the successor, which becomes the
//!    predecessor's successor. A predecessor left without a successor waits for the next
//!    backup to be reverse-deduplicated again;
//! 3. the released segments are settled ([`crate::settle`]): segments and chunks nobody
//!    references are removed, and containers whose segments all died are dropped.
//!
//! **Time stamp deletion** stops there. Deleting the oldest archival backup (what retention
//! does) releases exactly the segments repackaged for it, so all the containers stamped with
//! its time die and are removed without being read. A container that still holds a chunk
//! another backup references directly stays; its dead chunks are garbage until then.
//!
//! **Mark and sweep** then reads every container of the store and rewrites those holding
//! chunks that no record references (the mark is the reference counts of step 1-3; the sweep
//! is the scan), as the paper's baseline does. It reclaims all garbage, at the cost of reading
//! the whole repository.

use std::collections::BTreeSet;
use std::time::Instant;

use onecopy_core::catalog::CatalogView;
use onecopy_core::container::ContainerId;
use serde::Serialize;

use crate::changes::Changes;
use crate::compact::{plan_compact, CompactReport};
use crate::config::DeleteMethod;
use crate::error::{BackupError, Result};
use crate::frames::repack;
use crate::recipe::{ChunkReference, Recipe};
use crate::retention::{plan_retention, KeptBackup, RetentionPolicy};
use crate::segment::{ChunkStorage, SegmentContainer, CONTAINERS};
use crate::series::{load_backup, load_series, BackupState};
use crate::settle::{execute_settlement, plan_settlement, CopyReport, Settlement};
use crate::store::{load_segment, now_unix_ns, BackupStore};

/// What deleting one backup will do.
#[derive(Clone, Debug, Serialize)]
pub struct DeletePlan {
    pub series: String,
    pub version: u32,
    pub logical_bytes: u64,
    pub was_live: bool,
    /// The predecessor whose indirect references were rewritten, if any.
    pub predecessor_rewritten: Option<u32>,
    pub settlement: Settlement,
    pub plan_seconds: f64,
    #[serde(skip)]
    pub(crate) serial: u64,
    #[serde(skip)]
    pub(crate) changes: Changes,
}

/// What expiring a series will do: the backups a [`RetentionPolicy`] keeps, and the
/// versions [`BackupStore::expire_with`] deletes ([`crate::retention`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ExpirePlan {
    pub series: String,
    pub policy: RetentionPolicy,
    /// Backups kept, newest first, with the rules that keep each.
    pub kept: Vec<KeptBackup>,
    /// Versions to delete, oldest first.
    pub versions: Vec<u32>,
}

/// What a sweep did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct SweepReport {
    pub containers_scanned: u64,
    pub scanned_bytes: u64,
    pub containers_rewritten: u64,
    pub containers_removed: u64,
    pub reclaimed_bytes: u64,
    pub seconds: f64,
}

/// What a deletion did, with per-phase timings.
#[derive(Clone, Debug, Serialize)]
pub struct DeleteReport {
    pub plan: DeletePlan,
    pub method: DeleteMethod,
    pub copy: CopyReport,
    pub commit_seconds: f64,
    /// Index update and container removal.
    pub cleanup_seconds: f64,
    pub sweep: Option<SweepReport>,
    /// The rewrite of the containers left with garbage where that frees at least
    /// [`crate::compact::GARBAGE_SHARE_MIN`] of one.
    pub compact: Option<CompactReport>,
    /// Why that rewrite stopped (the deletion is committed).
    pub compact_error: Option<String>,
    /// Container bytes the deletion freed (containers removed and rewritten, minus
    /// containers written).
    pub freed_bytes: u64,
    /// Bytes of removed chunks that stay allocated in containers still holding referenced
    /// chunks, which `backup compact` frees: exactly what compacting the containers this
    /// deletion left with garbage gives back.
    pub compactable_bytes: u64,
    /// Those containers.
    pub compactable_containers: u64,
    pub seconds: f64,
}

impl BackupStore {
    /// Plans the deletion of `series@version`.
    pub fn plan_delete(&self, series: &str, version: u32) -> Result<DeletePlan> {
        let started = Instant::now();
        let read = self.catalog.read()?;
        let mut series_record = load_series(&read, series)?;
        let id =
            *series_record
                .versions
                .get(&version)
                .ok_or_else(|| BackupError::VersionNotFound {
                    series: series.to_string(),
                    version,
                })?;
        let backup = load_backup(&read, id)?;
        let what = format!("backup {series}@{version}");
        let recipe = Recipe::load(&read, backup.id, backup.recipe_parts)?;
        let mut changes = Changes::default();
        let mut candidates = BTreeSet::new();
        match &recipe {
            Recipe::Live(references) => {
                for reference in references {
                    changes.release_live_reference(&read, reference.segment, &what)?;
                    candidates.insert(reference.segment);
                }
            }
            Recipe::Archival(references) => {
                for reference in references {
                    if let ChunkReference::Direct { segment, index, .. } = *reference {
                        let chunk = changes
                            .record_mut(&read, segment)?
                            .chunks
                            .get_mut(index as usize)
                            .ok_or_else(|| {
                                BackupError::corrupt(
                                    &what,
                                    format!("segment {segment} has no chunk {index}"),
                                )
                            })?;
                        chunk.direct_references = chunk.direct_references.checked_sub(1).ok_or_else(|| {
                            BackupError::corrupt(&what, format!("chunk {index} of segment {segment} has no direct reference"))
                        })?;
                        candidates.insert(segment);
                    }
                }
            }
        }
        let mut stamp = backup.created_unix_ns;
        let mut predecessor_rewritten = None;
        if let Some((predecessor_version, predecessor_id)) = series_record.predecessor(version) {
            let mut predecessor = load_backup(&read, predecessor_id)?;
            stamp = predecessor.created_unix_ns;
            if predecessor.state == BackupState::Archival {
                let Recipe::Archival(entries) =
                    Recipe::load(&read, predecessor.id, predecessor.recipe_parts)?
                else {
                    return Err(BackupError::corrupt(
                        format!("backup {series}@{predecessor_version}"),
                        "archival backup with a live recipe",
                    ));
                };
                let starts = recipe.live_starts();
                let mut rewritten = Vec::with_capacity(entries.len());
                for entry in entries {
                    let ChunkReference::Indirect { ordinal } = entry else {
                        rewritten.push(entry);
                        continue;
                    };
                    let missing = || {
                        BackupError::corrupt(
                            format!("backup {series}@{predecessor_version}"),
                            format!("indirect reference to chunk {ordinal} of version {version}, which has none"),
                        )
                    };
                    let target = match &recipe {
                        Recipe::Live(_) => {
                            let position =
                                recipe.live_position(&starts, ordinal).ok_or_else(missing)?;
                            Some((position.segment, position.index))
                        }
                        Recipe::Archival(deleted) => match *deleted
                            .get(ordinal as usize)
                            .ok_or_else(missing)?
                        {
                            ChunkReference::Zero { raw_bytes } => {
                                rewritten.push(ChunkReference::Zero { raw_bytes });
                                None
                            }
                            ChunkReference::Direct { segment, index, .. } => Some((segment, index)),
                            ChunkReference::Indirect { ordinal } => {
                                rewritten.push(ChunkReference::Indirect { ordinal });
                                None
                            }
                        },
                    };
                    if let Some((segment, index)) = target {
                        let chunk = changes
                            .record_mut(&read, segment)?
                            .chunks
                            .get_mut(index as usize)
                            .ok_or_else(missing)?;
                        let raw_bytes = chunk.raw_bytes;
                        if matches!(chunk.storage, ChunkStorage::Zero) {
                            rewritten.push(ChunkReference::Zero { raw_bytes });
                        } else {
                            chunk.direct_references += 1;
                            rewritten.push(ChunkReference::Direct {
                                raw_bytes,
                                segment,
                                index,
                            });
                        }
                    }
                }
                if series_record.successor(version).is_none() {
                    predecessor.reverse_pending = true;
                }
                let rewritten = Recipe::Archival(rewritten);
                let previous_parts = predecessor.recipe_parts;
                predecessor.recipe_parts = rewritten.part_count();
                changes
                    .recipes
                    .insert(predecessor.id, (Some(rewritten), previous_parts));
                changes.backups.insert(predecessor.id, Some(predecessor));
                predecessor_rewritten = Some(predecessor_version);
            }
        }
        changes
            .recipes
            .insert(backup.id, (None, backup.recipe_parts));
        changes.backups.insert(backup.id, None);
        series_record.versions.remove(&version);
        changes.series.insert(series.to_string(), series_record);
        let settlement = plan_settlement(&mut changes, &read, &candidates, stamp)?;
        Ok(DeletePlan {
            series: series.to_string(),
            version,
            logical_bytes: backup.logical_bytes,
            was_live: backup.state == BackupState::Live,
            predecessor_rewritten,
            settlement,
            plan_seconds: started.elapsed().as_secs_f64(),
            serial: self.state.serial,
            changes,
        })
    }

    /// Executes a deletion plan made from the current state.
    pub fn execute_delete(
        &mut self,
        plan: DeletePlan,
        method: DeleteMethod,
    ) -> Result<DeleteReport> {
        let what = format!("deleting backup {}@{}", plan.series, plan.version);
        self.mutate(&what, |store| store.execute_delete_unguarded(plan, method))
    }

    fn execute_delete_unguarded(
        &mut self,
        mut plan: DeletePlan,
        method: DeleteMethod,
    ) -> Result<DeleteReport> {
        let started = Instant::now();
        let dropped_bytes = {
            let read = self.catalog.read()?;
            let mut bytes = 0;
            for &id in &plan.settlement.dropped_containers {
                if let Some(record) = read.get_id(CONTAINERS, id)? {
                    bytes += SegmentContainer::decode(&record, id)?.bytes;
                }
            }
            bytes
        };
        let run = execute_settlement(
            self,
            plan.serial,
            "deletion",
            &plan.settlement,
            &mut plan.changes,
        )?;
        let sweep = match method {
            DeleteMethod::Timestamp => None,
            DeleteMethod::MarkAndSweep => Some(self.sweep()?),
        };
        let compactable = plan_compact(
            &self.catalog.read()?,
            Some(&plan.settlement.garbage_containers),
            self.state.serial,
        )?;
        let freed_bytes = dropped_bytes.saturating_sub(run.copy.written_bytes)
            + run
                .compact
                .as_ref()
                .map_or(0, |compact| compact.reclaimed_bytes)
            + sweep.map_or(0, |sweep| sweep.reclaimed_bytes);
        let seconds = plan.plan_seconds + started.elapsed().as_secs_f64();
        Ok(DeleteReport {
            plan,
            method,
            copy: run.copy,
            commit_seconds: run.commit_seconds,
            cleanup_seconds: run.cleanup_seconds,
            compact: run.compact,
            compact_error: run.compact_error,
            sweep,
            freed_bytes,
            compactable_bytes: compactable.reclaimable_bytes,
            compactable_containers: compactable.containers.len() as u64,
            seconds,
        })
    }

    /// Deletes `series@version` with `method` (the store's default when `None`).
    pub fn delete(
        &mut self,
        series: &str,
        version: u32,
        method: Option<DeleteMethod>,
    ) -> Result<DeleteReport> {
        self.recover()?;
        let method = method.unwrap_or(self.state.options.delete_method);
        let plan = self.plan_delete(series, version)?;
        self.execute_delete(plan, method)
    }

    /// Plans the expiry of `series` keeping the newest `keep` backups (the series' retention
    /// window when `keep` is `None`); see [`BackupStore::plan_expire_with`].
    pub fn plan_expire(&self, series: &str, keep: Option<u32>) -> Result<ExpirePlan> {
        let record = load_series(&self.catalog.read()?, series)?;
        let keep = keep.or(record.options.retention).ok_or_else(|| {
            BackupError::InvalidArgument(format!(
                "series {series:?} has no retention window: give the number of backups to keep"
            ))
        })?;
        self.plan_expire_with(series, &RetentionPolicy::last(keep))
    }

    /// Plans the expiry of `series` by `policy` ([`crate::retention`]). Reads only;
    /// `expire --dry-run` shows this plan and [`BackupStore::expire_with`] carries it out.
    pub fn plan_expire_with(&self, series: &str, policy: &RetentionPolicy) -> Result<ExpirePlan> {
        if policy.keeps_nothing() {
            return Err(BackupError::InvalidArgument(
                "keep at least one backup: give --keep-last, --keep-hourly, --keep-daily, \
                 --keep-weekly, --keep-monthly or --keep-yearly with a count of 1 or more"
                    .to_string(),
            ));
        }
        let read = self.catalog.read()?;
        let record = load_series(&read, series)?;
        let mut backups = Vec::with_capacity(record.versions.len());
        for (&version, &id) in &record.versions {
            backups.push((version, load_backup(&read, id)?.created_unix_ns));
        }
        let (kept, versions) = plan_retention(&backups, policy);
        Ok(ExpirePlan {
            series: series.to_string(),
            policy: *policy,
            kept,
            versions,
        })
    }

    /// Deletes the oldest backups of `series` until `keep` remain (the series' retention
    /// window when `keep` is `None`): carries out [`BackupStore::plan_expire`]'s plan.
    pub fn expire(
        &mut self,
        series: &str,
        keep: Option<u32>,
        method: Option<DeleteMethod>,
    ) -> Result<Vec<DeleteReport>> {
        self.recover()?;
        let plan = self.plan_expire(series, keep)?;
        self.execute_expire(plan, method)
    }

    /// Deletes the backups of `series` that `policy` does not keep: carries out
    /// [`BackupStore::plan_expire_with`]'s plan.
    pub fn expire_with(
        &mut self,
        series: &str,
        policy: &RetentionPolicy,
        method: Option<DeleteMethod>,
    ) -> Result<Vec<DeleteReport>> {
        self.recover()?;
        let plan = self.plan_expire_with(series, policy)?;
        self.execute_expire(plan, method)
    }

    /// Deletes the versions of an expiry plan, oldest first.
    pub fn execute_expire(
        &mut self,
        plan: ExpirePlan,
        method: Option<DeleteMethod>,
    ) -> Result<Vec<DeleteReport>> {
        let mut reports = Vec::new();
        for version in plan.versions {
            reports.push(self.delete(&plan.series, version, method)?);
        }
        Ok(reports)
    }

    /// Mark and sweep's sweep: reads every container and rewrites those holding chunks no
    /// segment record references (removing those holding none).
    pub fn sweep(&mut self) -> Result<SweepReport> {
        self.mutate("sweeping", BackupStore::sweep_unguarded)
    }

    fn sweep_unguarded(&mut self) -> Result<SweepReport> {
        self.recover()?;
        let started = Instant::now();
        let mut report = SweepReport::default();
        let read = self.catalog.read()?;
        let mut changes = Changes::default();
        let mut state = self.state.clone();
        let mut dropped: Vec<ContainerId> = Vec::new();
        for (id, bytes) in read.range_id(CONTAINERS, 0, u64::MAX)? {
            let record = SegmentContainer::decode(&bytes, id)?;
            let file = self.containers.file(id)?;
            let length = file.len()?;
            let mut data = vec![0u8; length as usize];
            file.read_at(0, &mut data)?;
            report.containers_scanned += 1;
            report.scanned_bytes += length;
            let contents = self.containers.read_contents(id)?;
            // The frames the segment records place here and that still hold stored chunks;
            // the container is rewritten when it holds anything else.
            let mut segments = Vec::new();
            let mut live_frames = 0usize;
            let mut garbage = false;
            for &segment in &record.segments {
                let segment_record = load_segment(&read, segment)?;
                if segment_record.container != Some(id) {
                    continue;
                }
                let used = segment_record.frame_chunks();
                live_frames += used.iter().filter(|chunks| !chunks.is_empty()).count();
                garbage |= segment_record.has_garbage();
                segments.push((segment, used));
            }
            if live_frames == contents.chunks.len() && !garbage {
                continue;
            }
            report.reclaimed_bytes += record.bytes;
            dropped.push(id);
            changes.containers.insert(id, None);
            if live_frames == 0 {
                report.containers_removed += 1;
                for (segment, _) in segments {
                    let segment_record = changes.record_mut(&read, segment)?;
                    segment_record.container = None;
                    segment_record.frames.clear();
                }
                continue;
            }
            report.containers_rewritten += 1;
            let new_id = state.container_id_next;
            state.container_id_next += 1;
            let mut writer = self
                .containers
                .create(new_id, now_unix_ns() / 1_000_000_000)?;
            for (segment, used) in segments {
                let segment_record = changes.record_mut(&read, segment)?;
                if !segment_record.has_stored() {
                    segment_record.container = None;
                    segment_record.frames.clear();
                    continue;
                }
                let mut stored = Vec::with_capacity(used.len());
                for (frame, chunks) in segment_record.frames.iter().zip(&used) {
                    if chunks.is_empty() {
                        stored.push(None);
                        continue;
                    }
                    let start = frame.offset as usize;
                    let bytes = data
                        .get(start..start + frame.stored_bytes as usize)
                        .ok_or_else(|| {
                            BackupError::corrupt(
                                format!("container {id:016x}"),
                                "a frame lies past its end",
                            )
                        })?;
                    stored.push(Some(bytes.to_vec()));
                }
                repack(
                    segment_record,
                    &stored,
                    &mut writer,
                    &self.fingerprinter,
                    self.rewrite_coding(),
                )?;
            }
            let sealed = writer.seal(record.timestamp)?;
            report.reclaimed_bytes -= sealed.bytes;
            changes.containers.insert(
                new_id,
                Some(SegmentContainer {
                    bytes: sealed.bytes,
                    ..record
                }),
            );
        }
        drop(read);
        self.release_reserve()?;
        let mut write = self.catalog.write()?;
        changes.apply(&mut write)?;
        self.commit(write, state, &dropped)?;
        self.remove_containers(&dropped)?;
        self.restore_reserve();
        report.seconds = started.elapsed().as_secs_f64();
        Ok(report)
    }
}
