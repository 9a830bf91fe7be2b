//! Listing backups and store statistics.

use onecopy_core::catalog::CatalogView;
use serde::Serialize;

use crate::config::StoreOptions;
use crate::error::Result;
use crate::segment::{
    segment_records, ContainerKind, SegmentContainer, SegmentHead, SegmentRecord, SegmentState,
    CONTAINERS, SEGMENT_HEADS,
};
use crate::series::{load_backup, load_series, BackupRecord, BackupState, SeriesRecord, SERIES};
use crate::store::BackupStore;

/// Sizes and counts of the whole store.
#[derive(Clone, Debug, Serialize)]
pub struct StoreStats {
    pub options: StoreOptions,
    pub series: u64,
    pub backups: u64,
    pub live_backups: u64,
    pub archival_backups: u64,
    /// Sum of the backups' stream sizes.
    pub logical_bytes: u64,
    pub segments_shared: u64,
    pub segments_archival: u64,
    pub containers_shared: u64,
    pub containers_archival: u64,
    pub container_bytes_shared: u64,
    pub container_bytes_archival: u64,
    /// Bytes of chunks some record still needs (the rest of the container bytes is format
    /// overhead and garbage).
    pub referenced_bytes: u64,
    /// Container bytes over referenced bytes.
    pub garbage_bytes: u64,
    /// Bytes `backup compact` would free: removed chunks still in containers, with their
    /// headers and trailer entries.
    pub compactable_bytes: u64,
    /// 1 - container bytes / logical bytes.
    pub space_saving: f64,
    pub index_entries: u64,
    pub index_memory_bytes: u64,
}

impl BackupStore {
    /// Every series with its options, by name.
    pub fn series(&self) -> Result<Vec<SeriesRecord>> {
        let read = self.catalog.read()?;
        Ok(read
            .list_json::<SeriesRecord>(SERIES)?
            .into_iter()
            .map(|(_, record)| record)
            .collect())
    }

    /// The backups of `series` (every series when `None`), by series and version.
    pub fn list(&self, series: Option<&str>) -> Result<Vec<BackupRecord>> {
        let read = self.catalog.read()?;
        let records = match series {
            Some(name) => vec![load_series(&read, name)?],
            None => self.series()?,
        };
        let mut backups = Vec::new();
        for record in records {
            for &id in record.versions.values() {
                backups.push(load_backup(&read, id)?);
            }
        }
        Ok(backups)
    }

    /// Statistics of the whole store (reads every segment and container record).
    pub fn stats(&self) -> Result<StoreStats> {
        let read = self.catalog.read()?;
        let mut stats = StoreStats {
            options: self.state.options.clone(),
            series: 0,
            backups: 0,
            live_backups: 0,
            archival_backups: 0,
            logical_bytes: 0,
            segments_shared: 0,
            segments_archival: 0,
            containers_shared: 0,
            containers_archival: 0,
            container_bytes_shared: 0,
            container_bytes_archival: 0,
            referenced_bytes: 0,
            garbage_bytes: 0,
            compactable_bytes: 0,
            space_saving: 0.0,
            index_entries: self.index.as_ref().map_or(0, |index| index.len()),
            index_memory_bytes: self.index.as_ref().map_or(0, |index| index.memory_bytes()),
        };
        for record in self.series()? {
            stats.series += 1;
            for &id in record.versions.values() {
                let backup = load_backup(&read, id)?;
                stats.backups += 1;
                stats.logical_bytes += backup.logical_bytes;
                match backup.state {
                    BackupState::Live => stats.live_backups += 1,
                    BackupState::Archival => stats.archival_backups += 1,
                }
            }
        }
        for (id, bytes) in read.range_id(SEGMENT_HEADS, 0, u64::MAX)? {
            match SegmentHead::decode(&bytes, id)?.state {
                SegmentState::Shared => stats.segments_shared += 1,
                SegmentState::Archival => stats.segments_archival += 1,
            }
        }
        for (id, bytes) in segment_records(&read)? {
            stats.referenced_bytes += SegmentRecord::decode(&bytes, id)?.stored_bytes();
        }
        for (id, bytes) in read.range_id(CONTAINERS, 0, u64::MAX)? {
            let record = SegmentContainer::decode(&bytes, id)?;
            match record.kind {
                ContainerKind::Shared => {
                    stats.containers_shared += 1;
                    stats.container_bytes_shared += record.bytes;
                }
                ContainerKind::Archival => {
                    stats.containers_archival += 1;
                    stats.container_bytes_archival += record.bytes;
                }
            }
        }
        stats.compactable_bytes =
            crate::compact::plan_compact(&read, None, self.state.serial)?.reclaimable_bytes;
        let container_bytes = stats.container_bytes_shared + stats.container_bytes_archival;
        stats.garbage_bytes = container_bytes.saturating_sub(stats.referenced_bytes);
        if stats.logical_bytes > 0 {
            stats.space_saving = 1.0 - container_bytes as f64 / stats.logical_bytes as f64;
        }
        Ok(stats)
    }
}
