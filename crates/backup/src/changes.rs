//! [`Changes`]: the catalog records an offline operation will replace, built by its plan and
//! written by its execution in one catalog transaction.
//!
//! A plan reads records through the catalog snapshot it was made from and keeps the ones it
//! changes here (`None` = delete). Nothing is written until [`Changes::apply`], so a plan can
//! be shown (`--dry-run`) and dropped without effect.

use std::collections::BTreeMap;

use onecopy_core::catalog::{CatalogView, CatalogWrite};
use onecopy_core::container::ContainerId;

use crate::error::{BackupError, Result};
use crate::recipe::Recipe;
use crate::segment::{
    put_segment_record, remove_segment_record, SegmentContainer, SegmentHead, SegmentId,
    SegmentRecord, CONTAINERS, SEGMENT_HEADS,
};
use crate::series::{encode_backup, BackupId, BackupRecord, SeriesRecord, BACKUPS, SERIES};
use crate::store::{load_container, load_head, load_segment};

/// Records to write or delete.
#[derive(Clone, Debug, Default)]
pub struct Changes {
    pub heads: BTreeMap<SegmentId, Option<SegmentHead>>,
    pub records: BTreeMap<SegmentId, Option<SegmentRecord>>,
    pub containers: BTreeMap<ContainerId, Option<SegmentContainer>>,
    pub backups: BTreeMap<BackupId, Option<BackupRecord>>,
    /// New recipes (with the part count of the one replaced), or removal of `parts` parts.
    pub recipes: BTreeMap<BackupId, (Option<Recipe>, u32)>,
    pub series: BTreeMap<String, SeriesRecord>,
}

impl Changes {
    /// The head of `id` as it will be (`None` if deleted or missing).
    pub fn head(&mut self, view: &impl CatalogView, id: SegmentId) -> Result<Option<SegmentHead>> {
        if let Some(head) = self.heads.get(&id) {
            return Ok(*head);
        }
        let head = load_head(view, id)?;
        self.heads.insert(id, head);
        Ok(head)
    }

    /// The head of `id` for modification; it must exist.
    pub fn head_mut(&mut self, view: &impl CatalogView, id: SegmentId) -> Result<&mut SegmentHead> {
        self.head(view, id)?;
        self.heads
            .get_mut(&id)
            .and_then(Option::as_mut)
            .ok_or_else(|| BackupError::corrupt(format!("segment {id}"), "head missing"))
    }

    /// Drops one live (recipe) reference to segment `id`; a segment without one left is
    /// corruption of `what` (the backup whose recipe held the reference).
    pub fn release_live_reference(
        &mut self,
        view: &impl CatalogView,
        id: SegmentId,
        what: &str,
    ) -> Result<()> {
        let head = self.head_mut(view, id)?;
        head.live_references = head.live_references.checked_sub(1).ok_or_else(|| {
            BackupError::corrupt(what, format!("segment {id} has no live reference left"))
        })?;
        Ok(())
    }

    /// The record of `id` for reading or modification; it must exist.
    pub fn record_mut(
        &mut self,
        view: &impl CatalogView,
        id: SegmentId,
    ) -> Result<&mut SegmentRecord> {
        if let std::collections::btree_map::Entry::Vacant(entry) = self.records.entry(id) {
            entry.insert(Some(load_segment(view, id)?));
        }
        self.records
            .get_mut(&id)
            .and_then(Option::as_mut)
            .ok_or_else(|| BackupError::corrupt(format!("segment {id}"), "record deleted"))
    }

    /// The record of container `id` for modification; it must exist.
    pub fn container_mut(
        &mut self,
        view: &impl CatalogView,
        id: ContainerId,
    ) -> Result<&mut SegmentContainer> {
        if let std::collections::btree_map::Entry::Vacant(entry) = self.containers.entry(id) {
            entry.insert(Some(load_container(view, id)?));
        }
        self.containers
            .get_mut(&id)
            .and_then(Option::as_mut)
            .ok_or_else(|| BackupError::corrupt(format!("container {id:016x}"), "record deleted"))
    }

    /// Deletes segment `id`: its head and record, and its entry in its container's record,
    /// deleting the container record too when it becomes empty. Returns that container when
    /// it became empty.
    pub fn delete_segment(
        &mut self,
        view: &impl CatalogView,
        id: SegmentId,
    ) -> Result<Option<ContainerId>> {
        let container = self.record_mut(view, id)?.container;
        self.heads.insert(id, None);
        self.records.insert(id, None);
        let Some(container) = container else {
            return Ok(None);
        };
        if matches!(self.containers.get(&container), Some(None)) {
            return Ok(None); // Already going away with its segments.
        }
        let record = self.container_mut(view, container)?;
        record.segments.retain(|&segment| segment != id);
        if record.segments.is_empty() {
            self.containers.insert(container, None);
            return Ok(Some(container));
        }
        Ok(None)
    }

    /// Takes segment `id` out of its container (it keeps no stored chunk: only lost ones),
    /// deleting the container record when it becomes empty. Returns that container when it
    /// became empty.
    pub fn detach_segment(
        &mut self,
        view: &impl CatalogView,
        id: SegmentId,
    ) -> Result<Option<ContainerId>> {
        let record = self.record_mut(view, id)?;
        assert!(
            !record.has_stored(),
            "a segment with stored chunks stays in its container"
        );
        record.frames.clear();
        let Some(container) = record.container.take() else {
            return Ok(None);
        };
        if matches!(self.containers.get(&container), Some(None)) {
            return Ok(None);
        }
        let held = self.container_mut(view, container)?;
        held.segments.retain(|&segment| segment != id);
        if held.segments.is_empty() {
            self.containers.insert(container, None);
            return Ok(Some(container));
        }
        Ok(None)
    }

    /// Writes every change into `write`.
    pub fn apply(&self, write: &mut CatalogWrite) -> Result<()> {
        for (&id, head) in &self.heads {
            match head {
                Some(head) => write.put_id(SEGMENT_HEADS, id, &head.encode())?,
                None => {
                    write.remove_id(SEGMENT_HEADS, id)?;
                }
            }
        }
        for (&id, record) in &self.records {
            match record {
                Some(record) => put_segment_record(write, id, record)?,
                None => remove_segment_record(write, id)?,
            }
        }
        for (&id, record) in &self.containers {
            match record {
                Some(record) => write.put_id(CONTAINERS, id, &record.encode())?,
                None => {
                    write.remove_id(CONTAINERS, id)?;
                }
            }
        }
        for (&id, (recipe, previous_parts)) in &self.recipes {
            match recipe {
                Some(recipe) => {
                    recipe.store(write, id, *previous_parts)?;
                }
                None => Recipe::remove(write, id, *previous_parts)?,
            }
        }
        for (&id, record) in &self.backups {
            match record {
                Some(record) => write.put_id(BACKUPS, id, &encode_backup(record))?,
                None => {
                    write.remove_id(BACKUPS, id)?;
                }
            }
        }
        for (name, record) in &self.series {
            if record.versions.is_empty() {
                write.remove(SERIES, name)?;
            } else {
                write.put_json(SERIES, name, record)?;
            }
        }
        Ok(())
    }
}
