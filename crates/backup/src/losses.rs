//! Recorded losses: data a repair found damaged with no intact copy anywhere.
//!
//! When `check --repair` finds a stored chunk whose bytes fail their checks (or whose
//! container is gone) and no other container stores a chunk with the same fingerprint, it
//! marks the chunk **lost** in its segment record ([`crate::segment::ChunkStorage::Lost`]): the chunk keeps
//! its fingerprint and references, the damaged bytes are no longer pointed at, and the
//! segment joins the store state's damaged segments, which inline deduplication never
//! matches. The repair also writes a [`LossRecord`] in catalog table `losses`: which object
//! was damaged, how, when, and what it cost (backups, files, byte ranges).
//!
//! What follows from a lost chunk:
//!
//! - **restore** ([`crate::restore`]) finds the lost ranges of the backup's stream before it
//!   writes anything (`stream_losses`). An image or stream restore fails naming the lost
//!   byte ranges. A directory restore leaves out the files whose contents are lost (and their
//!   hard links), restores everything else, and then fails naming those files. Never wrong
//!   bytes, never zeros in place of lost data.
//! - **check** reports every backup with lost chunks as [`FindingKind::Lost`] (exit status 3),
//!   naming the files, from the segment records themselves; the loss records add what the
//!   damage was. Damage a repair could not fix (an unreadable recipe, say) is recorded by
//!   object name, and later checks report it as lost rather than as new damage.
//! - **reverse deduplication** may still turn a lost chunk's reference into an indirect one
//!   when the successor stores the same fingerprint intact: the backup heals.
//! - **deletion** releases lost chunks like stored ones; a lost chunk nothing references is
//!   forgotten.
//!
//! [`FindingKind::Lost`]: onecopy_core::check::FindingKind::Lost

use std::collections::BTreeSet;

use onecopy_core::catalog::{CatalogView, CatalogWrite, IdTable};
use serde::{Deserialize, Serialize};

use crate::error::{BackupError, Result};
use crate::resolve::{locate, ChunkBytes, ChunkSource, SegmentCache};
use crate::segment::SegmentId;
use crate::series::{BackupRecord, SourceKind};
use crate::store::BackupStore;
use crate::tree::{EntryKind, Tree, TreeEntry};

/// Catalog table of loss records, by id.
pub(crate) const LOSSES: IdTable = IdTable("losses");
/// Files or ranges named in one message before the rest are counted.
const NAMED_MAX: usize = 20;

/// What one repair recorded about one damaged object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LossRecord {
    pub recorded_unix_ns: u64,
    /// The damaged object, as `check` names it.
    pub object: String,
    /// What was wrong with it.
    pub damage: String,
    /// Chunks marked lost because of it: (segment, chunk index).
    pub chunks: Vec<(SegmentId, u32)>,
    /// What was lost, as the repair reported it (backups, files, byte ranges).
    pub lost: Vec<String>,
}

/// Every loss record that decodes, by id (they only describe losses; the segment records
/// say what is lost).
pub fn load_losses(view: &impl CatalogView) -> Result<Vec<(u64, LossRecord)>> {
    Ok(view
        .range_id(LOSSES, 0, u64::MAX)?
        .into_iter()
        .filter_map(|(id, bytes)| Some((id, serde_json::from_slice(&bytes).ok()?)))
        .collect())
}

/// Adds `records` to the catalog after the existing ones.
pub(crate) fn put_losses(write: &mut CatalogWrite, records: &[LossRecord]) -> Result<()> {
    let next = write
        .range_id(LOSSES, 0, u64::MAX)?
        .last()
        .map_or(1, |(id, _)| id + 1);
    for (offset, record) in records.iter().enumerate() {
        let bytes = serde_json::to_vec(record).expect("loss records serialise");
        write.put_id(LOSSES, next + offset as u64, &bytes)?;
    }
    Ok(())
}

/// A unix time in nanoseconds as `YYYY-MM-DD HH:MM:SS UTC`, for messages.
pub fn format_time(unix_ns: u64) -> String {
    format!("{} UTC", onecopy_core::units::format_time(unix_ns))
}

/// A lost chunk of a backup's stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LostRange {
    pub start: u64,
    pub end: u64,
    pub segment: SegmentId,
    pub index: u32,
}

/// The lost chunks of a resolved stream, in stream order. Lost chunks exist only in
/// `damaged` segments, so a store without any costs nothing here.
pub(crate) fn stream_losses(
    view: &impl CatalogView,
    sources: &[ChunkSource],
    damaged: &BTreeSet<SegmentId>,
    cache: &mut SegmentCache,
) -> Result<Vec<LostRange>> {
    let mut lost = Vec::new();
    let touches_damage = sources.iter().any(
        |source| matches!(source, ChunkSource::Stored { segment, .. } if damaged.contains(segment)),
    );
    if !touches_damage {
        return Ok(lost);
    }
    let mut offset = 0u64;
    for &source in sources {
        let raw_bytes = match source {
            ChunkSource::Zero { raw_bytes } => raw_bytes,
            ChunkSource::Stored { segment, index } => {
                let (bytes, raw_bytes) = locate(view, cache, segment, index)?;
                if bytes == ChunkBytes::Lost {
                    lost.push(LostRange {
                        start: offset,
                        end: offset + raw_bytes as u64,
                        segment,
                        index,
                    });
                }
                raw_bytes
            }
        };
        offset += raw_bytes as u64;
    }
    Ok(lost)
}

/// `ranges` merged where they touch, as (start, end).
pub fn merged(ranges: &[LostRange]) -> Vec<(u64, u64)> {
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for range in ranges {
        match merged.last_mut() {
            Some(last) if last.1 >= range.start => last.1 = last.1.max(range.end),
            _ => merged.push((range.start, range.end)),
        }
    }
    merged
}

/// "bytes a-b, c-d, ..." for messages (inclusive ends, at most [`NAMED_MAX`] named).
pub(crate) fn describe_ranges(ranges: &[(u64, u64)]) -> String {
    let mut parts: Vec<String> = ranges
        .iter()
        .take(NAMED_MAX)
        .map(|(start, end)| format!("{start}-{}", end - 1))
        .collect();
    if ranges.len() > NAMED_MAX {
        parts.push(format!("and {} more ranges", ranges.len() - NAMED_MAX));
    }
    format!("bytes {}", parts.join(", "))
}

/// True when `[start, end)` overlaps one of `ranges` (sorted by start).
fn overlaps(ranges: &[(u64, u64)], start: u64, end: u64) -> bool {
    let first = ranges.partition_point(|&(_, range_end)| range_end <= start);
    ranges
        .get(first)
        .is_some_and(|&(range_start, _)| range_start < end)
}

/// The path of an entry, for messages.
pub fn entry_name(entry: &TreeEntry) -> String {
    if entry.path.is_empty() {
        ".".to_string()
    } else {
        String::from_utf8_lossy(&entry.path).into_owned()
    }
}

/// What a directory restore leaves out because of lost data.
pub(crate) struct LostFiles {
    /// The tree without the entries whose contents are lost.
    pub tree: Tree,
    /// Their paths.
    pub paths: Vec<String>,
    /// Stream ranges of the files left out, sorted: their bytes go nowhere.
    pub excluded: Vec<(u64, u64)>,
}

/// Takes the files whose stream bytes overlap `lost` out of `tree`, with the hard links to
/// them (hard link targets are renumbered).
pub(crate) fn exclude_lost_files(tree: Tree, lost: &[LostRange]) -> LostFiles {
    let lost = merged(lost);
    let mut excluded_entries = vec![false; tree.entries.len()];
    let mut excluded = Vec::new();
    for (index, entry) in tree.entries.iter().enumerate() {
        match &entry.kind {
            EntryKind::File { stream_offset, .. } => {
                let end = stream_offset + entry.stream_bytes();
                if end > *stream_offset && overlaps(&lost, *stream_offset, end) {
                    excluded_entries[index] = true;
                    excluded.push((*stream_offset, end));
                }
            }
            EntryKind::HardLink { target }
                if excluded_entries.get(*target as usize) == Some(&true) =>
            {
                excluded_entries[index] = true;
            }
            _ => {}
        }
    }
    excluded.sort_unstable();
    let mut renumbered = vec![0u32; tree.entries.len()];
    let mut paths = Vec::new();
    let mut entries = Vec::with_capacity(tree.entries.len());
    for (index, mut entry) in tree.entries.into_iter().enumerate() {
        if excluded_entries[index] {
            paths.push(entry_name(&entry));
            continue;
        }
        if let EntryKind::HardLink { target } = &mut entry.kind {
            *target = renumbered[*target as usize];
        }
        renumbered[index] = entries.len() as u32;
        entries.push(entry);
    }
    LostFiles {
        tree: Tree { entries },
        paths,
        excluded,
    }
}

/// Hands `data`, stream bytes from `offset`, to `sink` except the parts inside `excluded`
/// (sorted, disjoint).
pub(crate) fn write_outside(
    excluded: &[(u64, u64)],
    offset: u64,
    data: &[u8],
    mut sink: impl FnMut(u64, &[u8]) -> Result<()>,
) -> Result<()> {
    let end = offset + data.len() as u64;
    let mut position = offset;
    let mut next = excluded.partition_point(|&(_, range_end)| range_end <= offset);
    while position < end {
        match excluded.get(next) {
            Some(&(start, range_end)) if start < end => {
                if position < start {
                    sink(
                        position,
                        &data[(position - offset) as usize..(start - offset) as usize],
                    )?;
                }
                position = position.max(range_end);
                next += 1;
            }
            _ => {
                sink(position, &data[(position - offset) as usize..])?;
                position = end;
            }
        }
    }
    Ok(())
}

/// The error of a directory restore that left out `paths` (their contents are lost).
pub(crate) fn lost_files_error(label: &str, paths: &[String]) -> BackupError {
    let mut named: Vec<&str> = paths.iter().take(NAMED_MAX).map(String::as_str).collect();
    let more = paths.len().saturating_sub(NAMED_MAX);
    let more = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    named.sort_unstable();
    BackupError::Lost {
        what: label.to_string(),
        detail: format!(
            "{} files were not restored because their contents are lost: {}{more}; \
             everything else was restored",
            paths.len(),
            named.join(", ")
        ),
    }
}

/// Reads stream bytes `[start, end)` of a resolved stream chunk by chunk (for the trees of
/// damaged backups, which check and repair read): CRCs checked, lost chunks an error.
pub(crate) fn read_stream(
    store: &BackupStore,
    view: &impl CatalogView,
    sources: &[ChunkSource],
    start: u64,
    end: u64,
) -> Result<Vec<u8>> {
    let mut cache = SegmentCache::new();
    let mut out = Vec::with_capacity((end - start) as usize);
    let mut offset = 0u64;
    let mut buffer = Vec::new();
    for &source in sources {
        if offset >= end {
            break;
        }
        let (bytes, raw_bytes, name) = match source {
            ChunkSource::Zero { raw_bytes } => (ChunkBytes::Zero, raw_bytes, None),
            ChunkSource::Stored { segment, index } => {
                let (bytes, raw_bytes) = locate(view, &mut cache, segment, index)?;
                (bytes, raw_bytes, Some((segment, index)))
            }
        };
        let chunk_end = offset + raw_bytes as u64;
        if chunk_end <= start {
            offset = chunk_end;
            continue;
        }
        buffer.clear();
        buffer.resize(raw_bytes as usize, 0);
        match bytes {
            ChunkBytes::Zero => {}
            ChunkBytes::Frame { frame, within } => {
                let raw = crate::frames::read_frame(&store.containers, &frame)?;
                let within = within as usize;
                buffer.copy_from_slice(&raw[within..within + raw_bytes as usize]);
            }
            ChunkBytes::Lost => {
                let (segment, index) = name.expect("only stored sources are lost");
                return Err(BackupError::Lost {
                    what: format!("chunk {index} of segment {segment}"),
                    detail: "its bytes are not stored".to_string(),
                });
            }
        }
        let from = start.saturating_sub(offset) as usize;
        let to = (end.min(chunk_end) - offset) as usize;
        out.extend_from_slice(&buffer[from..to]);
        offset = chunk_end;
    }
    if out.len() as u64 != end - start {
        return Err(BackupError::corrupt(
            "backup stream",
            format!("bytes {start}-{end} lie past its end"),
        ));
    }
    Ok(out)
}

/// What `backup` lost, one line per lost file (directory backups) or one line of byte
/// ranges, each starting with `label` (`backup SERIES@VERSION`).
pub(crate) fn describe_backup_losses(
    store: &BackupStore,
    view: &impl CatalogView,
    backup: &BackupRecord,
    sources: &[ChunkSource],
    lost: &[LostRange],
    label: &str,
) -> Vec<String> {
    let ranges = merged(lost);
    let lost_bytes: u64 = ranges.iter().map(|(start, end)| end - start).sum();
    let whole = || {
        vec![format!(
            "{label}: {} ({lost_bytes} bytes)",
            describe_ranges(&ranges)
        )]
    };
    if backup.source != SourceKind::Directory {
        return whole();
    }
    let Some(tree_range) = backup.tree else {
        return whole();
    };
    if overlaps(
        &ranges,
        tree_range.offset,
        tree_range.offset + tree_range.bytes,
    ) {
        return vec![format!(
            "{label}: its directory tree (no file can be restored; {lost_bytes} bytes lost)"
        )];
    }
    let tree = read_stream(
        store,
        view,
        sources,
        tree_range.offset,
        tree_range.offset + tree_range.bytes,
    )
    .and_then(|bytes| Tree::decode(&bytes));
    let Ok(tree) = tree else {
        return vec![format!(
            "{label}: {} ({lost_bytes} bytes; its directory tree does not read back to name \
             the files)",
            describe_ranges(&ranges)
        )];
    };
    let files = exclude_lost_files(tree, lost);
    files
        .paths
        .iter()
        .map(|path| format!("{label}: file {path}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::Extent;

    fn file(path: &str, stream_offset: u64, length: u64) -> TreeEntry {
        TreeEntry {
            path: path.as_bytes().to_vec(),
            kind: EntryKind::File {
                size: length,
                stream_offset,
                extents: vec![Extent { offset: 0, length }],
            },
            mode: 0o644,
            uid: 0,
            gid: 0,
            atime: (0, 0),
            mtime: (0, 0),
            xattrs: Vec::new(),
            stamp: None,
        }
    }

    /// Goal: a lost range takes out exactly the files it overlaps and the hard links to them,
    /// and the remaining hard links are renumbered; bytes of excluded files never reach the
    /// sink. Method: a tree of three files and two links, one lost chunk across two files.
    #[test]
    fn lost_files_are_left_out() {
        let mut link_to_b = file("link-b", 0, 0);
        link_to_b.kind = EntryKind::HardLink { target: 2 };
        let mut link_to_c = file("link-c", 0, 0);
        link_to_c.kind = EntryKind::HardLink { target: 3 };
        let mut root = file("", 0, 0);
        root.kind = EntryKind::Directory;
        let tree = Tree {
            entries: vec![
                root,
                file("a", 0, 100),
                file("b", 100, 100),
                file("c", 200, 100),
                link_to_b,
                link_to_c,
            ],
        };
        let lost = [LostRange {
            start: 50,
            end: 150,
            segment: 1,
            index: 0,
        }];
        let files = exclude_lost_files(tree, &lost);
        assert_eq!(files.paths, ["a", "b", "link-b"]);
        assert_eq!(files.excluded, [(0, 100), (100, 200)]);
        let names: Vec<String> = files.tree.entries.iter().map(entry_name).collect();
        assert_eq!(names, [".", "c", "link-c"]);
        assert_eq!(
            files.tree.entries[2].kind,
            EntryKind::HardLink { target: 1 }
        );

        let data: Vec<u8> = (0..=255u8).cycle().take(300).collect();
        let mut seen = Vec::new();
        write_outside(&files.excluded, 0, &data, |offset, bytes| {
            seen.push((offset, bytes.to_vec()));
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, [(200, data[200..].to_vec())]);
        let mut lengths = Vec::new();
        write_outside(&[(10, 20)], 5, &data[..30], |offset, bytes| {
            lengths.push((offset, bytes.len()));
            Ok(())
        })
        .unwrap();
        assert_eq!(lengths, [(5, 5), (20, 15)]);
        assert_eq!(describe_ranges(&merged(&lost)), "bytes 50-149");
    }
}
