//! Series and backups (paper 2 §2.1).
//!
//! A **series** is the sequence of backups taken of one source; its backups are numbered 1,
//! 2, ... by *version*, and deleting a version never renumbers the others. Within a series the
//! newest [`SeriesOptions::live_window`] backups are **live** (live recipes: segments only,
//! fast to restore); older ones are **archival** (archival recipes: direct and indirect chunk
//! references). The *successor* of a backup is the next existing version of its series;
//! indirect references always point into the successor.
//!
//! Records are JSON in catalog tables `series` (by name) and `backups` (by backup id).

use std::collections::BTreeMap;

use onecopy_core::catalog::{CatalogView, IdTable, NamedTable};
use serde::{Deserialize, Serialize};

use crate::config::SeriesOptions;
use crate::error::{BackupError, Result};

pub(crate) const SERIES: NamedTable = NamedTable("series");
pub(crate) const BACKUPS: IdTable = IdTable("backups");

/// Names a backup across the store; allocated increasing, never reused.
pub type BackupId = u64;

/// What a backup was taken of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceKind {
    /// A directory tree with its metadata; restored into a directory.
    Directory,
    /// A regular file or disk image.
    File,
    /// A byte stream (standard input).
    Stream,
}

/// Whether the backup's recipe is segment-level or chunk-level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackupState {
    Live,
    Archival,
}

/// Where a directory backup's tree metadata lies in its stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeRange {
    pub offset: u64,
    pub bytes: u64,
}

/// A stored backup.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupRecord {
    pub id: BackupId,
    pub series: String,
    pub version: u32,
    /// Creation time, unix nanoseconds: the time stamp of the containers it is archived in.
    pub created_unix_ns: u64,
    pub source: SourceKind,
    /// The path or description given at creation, for display.
    pub source_name: String,
    /// Bytes of the backup's stream (for a directory: contents, then the tree).
    pub logical_bytes: u64,
    pub chunk_count: u64,
    pub recipe_parts: u32,
    pub state: BackupState,
    /// True while the backup still has to be reverse-deduplicated against its successor: live
    /// backups in RevDedup mode, and archival ones whose successor was deleted.
    pub reverse_pending: bool,
    pub tree: Option<TreeRange>,
    /// Stored bytes (after compression) of the segments this backup added at creation.
    pub added_bytes: u64,
    /// Stored bytes of the archival containers stamped with this backup's time.
    pub archival_bytes: u64,
    /// The machine backed up (`backup create --host`, the host name by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Labels given at creation (`backup create --tag`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// A directory backup's given paths, absolute.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    /// The directory a directory backup's tree is rooted at: the deepest directory holding
    /// every given path ([`crate::tree::capture::Selection`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
    /// The exclude patterns of a directory backup.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub excludes: Vec<String>,
}

impl BackupRecord {
    /// The stored path (relative to the tree's root) that `text` names in this directory
    /// backup: an absolute path beneath the backup's root has the root taken off (so the
    /// paths as they were on the backed-up machine work); otherwise leading and trailing `/`
    /// are dropped, and `.` or nothing names the root.
    pub fn tree_path(&self, text: &str) -> Vec<u8> {
        let mut path = text;
        if let Some(root) = &self.root {
            let root = root.trim_end_matches('/');
            if path == root {
                return Vec::new();
            }
            if let Some(rest) = path.strip_prefix(root).filter(|rest| rest.starts_with('/')) {
                path = rest;
            }
        }
        let path = path.trim_matches('/');
        let path = path.strip_prefix("./").unwrap_or(path);
        if path == "." {
            return Vec::new();
        }
        path.as_bytes().to_vec()
    }
}

/// A series: its options and versions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeriesRecord {
    pub name: String,
    pub options: SeriesOptions,
    /// Version number to backup id, ascending.
    pub versions: BTreeMap<u32, BackupId>,
    pub version_next: u32,
}

impl SeriesRecord {
    /// A series without backups.
    pub fn new(name: &str, options: SeriesOptions) -> Self {
        SeriesRecord {
            name: name.to_string(),
            options,
            versions: BTreeMap::new(),
            version_next: 1,
        }
    }

    /// The version after `version`, if any.
    pub fn successor(&self, version: u32) -> Option<(u32, BackupId)> {
        self.versions
            .range(version + 1..)
            .next()
            .map(|(&version, &id)| (version, id))
    }

    /// The version before `version`, if any.
    pub fn predecessor(&self, version: u32) -> Option<(u32, BackupId)> {
        self.versions
            .range(..version)
            .next_back()
            .map(|(&version, &id)| (version, id))
    }

    /// True when `version` is among the newest `live_window` versions.
    pub fn in_live_window(&self, version: u32) -> bool {
        self.versions
            .range(version..)
            .count()
            .le(&(self.options.live_window as usize))
    }

    /// The newest version.
    pub fn newest(&self) -> Option<u32> {
        self.versions.keys().next_back().copied()
    }
}

/// Checks a series name: non-empty, printable, without `@` or `/`.
pub fn validate_series_name(name: &str) -> Result<()> {
    let valid = !name.is_empty()
        && name.len() <= 200
        && !name.contains(['@', '/'])
        && !name.chars().any(char::is_control);
    if valid {
        Ok(())
    } else {
        Err(BackupError::InvalidArgument(format!(
            "series name {name:?} must be 1 to 200 printable characters without '@' or '/'"
        )))
    }
}

/// Reads a series record.
pub(crate) fn load_series(view: &impl CatalogView, name: &str) -> Result<SeriesRecord> {
    view.get_json(SERIES, name)?
        .ok_or_else(|| BackupError::SeriesNotFound(name.to_string()))
}

/// Reads a backup record by id.
pub(crate) fn load_backup(view: &impl CatalogView, id: BackupId) -> Result<BackupRecord> {
    let bytes = view
        .get_id(BACKUPS, id)?
        .ok_or_else(|| BackupError::corrupt(format!("backup {id}"), "record missing"))?;
    serde_json::from_slice(&bytes)
        .map_err(|error| BackupError::corrupt(format!("record of backup {id}"), error.to_string()))
}

/// Reads the backup `series@version` (the newest when `version` is `None`).
pub(crate) fn find_backup(
    view: &impl CatalogView,
    series: &str,
    version: Option<u32>,
) -> Result<(SeriesRecord, BackupRecord)> {
    let record = load_series(view, series)?;
    let version = match version {
        Some(version) => version,
        None => record.newest().ok_or_else(|| {
            BackupError::InvalidArgument(format!("series {series:?} has no backups"))
        })?,
    };
    let id = *record
        .versions
        .get(&version)
        .ok_or_else(|| BackupError::VersionNotFound {
            series: series.to_string(),
            version,
        })?;
    let backup = load_backup(view, id)?;
    Ok((record, backup))
}

pub(crate) fn encode_backup(record: &BackupRecord) -> Vec<u8> {
    serde_json::to_vec(record).expect("backup records serialise")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: successor, predecessor and the live window follow existing versions only.
    #[test]
    fn windows_follow_existing_versions() {
        let mut series = SeriesRecord::new(
            "s",
            SeriesOptions {
                live_window: 2,
                retention: None,
            },
        );
        for (version, id) in [(1, 10), (2, 20), (4, 40), (5, 50)] {
            series.versions.insert(version, id);
        }
        assert_eq!(series.successor(2), Some((4, 40)));
        assert_eq!(series.predecessor(4), Some((2, 20)));
        assert_eq!(series.successor(5), None);
        assert!(series.in_live_window(4));
        assert!(!series.in_live_window(2));
        assert!(validate_series_name("a@b").is_err());
        assert!(validate_series_name("home").is_ok());
    }
}
