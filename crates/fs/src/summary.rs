//! The summary of a journal record, kept in its tag (the core journal keeps a record's tag in
//! its header and its footer, so it survives damage to the payload): what the record changed,
//! for a salvage to say, and mark, exactly what a damaged record lost.
//!
//! The summary is derived from the record's changes as they are made ([`SummaryBuilder`]),
//! so no operation can forget to describe itself:
//!
//! - **Data**: the bytes `[start, end)` of one file changed: written, punched, truncated, or
//!   re-mapped by deduplication (same bytes, other chunks). The range is exact: the parts of
//!   an extent that a split keeps are not counted; a change of size counts from the old size
//!   to the new one.
//! - **File**: bytes of one file changed, but the range does not fit the tag: the whole file
//!   counts.
//! - **Inode**: attributes or xattrs of one inode changed, or it was removed; no bytes.
//! - **Entries**: entries of a directory (and of a second one, for a rename) changed for one
//!   inode: created, linked, unlinked, renamed.
//! - **FileSystem**: a file system's record changed (created, configured, its deletion
//!   started), or files of several inodes changed at once.
//! - **Chunks**: only the chunk store changed (compaction, reference counts).
//!
//! Encoding (16 bytes): kind u8, then the kind's fields as LEB128 integers, zero padded. A
//! summary whose fields do not fit falls back to a coarser kind (Data to File, then
//! FileSystem).

use std::collections::{BTreeMap, BTreeSet};

use onecopy_core::journal::{RecordTag, TAG_BYTES};

use crate::changes::{FsChange, FsId};
use crate::node::{Extent, Ino};

/// What one journal record changed; see the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordSummary {
    /// Nothing that names an object (an empty or untagged record).
    Unknown,
    Data {
        fs: FsId,
        ino: Ino,
        start: u64,
        end: u64,
    },
    File {
        fs: FsId,
        ino: Ino,
    },
    Inode {
        fs: FsId,
        ino: Ino,
    },
    Entries {
        fs: FsId,
        parent: Ino,
        /// The second directory of a rename, 0 when there is none.
        other_parent: Ino,
        ino: Ino,
    },
    FileSystem {
        fs: FsId,
    },
    Chunks,
}

const KIND_UNKNOWN: u8 = 0;
const KIND_DATA: u8 = 1;
const KIND_FILE: u8 = 2;
const KIND_INODE: u8 = 3;
const KIND_ENTRIES: u8 = 4;
const KIND_FILE_SYSTEM: u8 = 5;
const KIND_CHUNKS: u8 = 6;

impl RecordSummary {
    /// The tag that holds this summary (or a coarser one, when its fields do not fit).
    pub fn tag(&self) -> RecordTag {
        let (kind, fields): (u8, Vec<u64>) = match *self {
            RecordSummary::Unknown => (KIND_UNKNOWN, vec![]),
            RecordSummary::Data {
                fs,
                ino,
                start,
                end,
            } => (KIND_DATA, vec![fs as u64, ino, start, end - start]),
            RecordSummary::File { fs, ino } => (KIND_FILE, vec![fs as u64, ino]),
            RecordSummary::Inode { fs, ino } => (KIND_INODE, vec![fs as u64, ino]),
            RecordSummary::Entries {
                fs,
                parent,
                other_parent,
                ino,
            } => (KIND_ENTRIES, vec![fs as u64, parent, other_parent, ino]),
            RecordSummary::FileSystem { fs } => (KIND_FILE_SYSTEM, vec![fs as u64]),
            RecordSummary::Chunks => (KIND_CHUNKS, vec![]),
        };
        let mut tag = [0u8; TAG_BYTES];
        tag[0] = kind;
        let mut at = 1;
        for field in fields {
            let mut value = field;
            loop {
                if at == TAG_BYTES {
                    return self.coarser().tag();
                }
                let low = (value & 0x7f) as u8;
                value >>= 7;
                tag[at] = if value == 0 { low } else { low | 0x80 };
                at += 1;
                if value == 0 {
                    break;
                }
            }
        }
        tag
    }

    /// The next coarser summary that still describes what this one does.
    fn coarser(&self) -> RecordSummary {
        match *self {
            RecordSummary::Data { fs, ino, .. } => RecordSummary::File { fs, ino },
            RecordSummary::File { fs, .. }
            | RecordSummary::Inode { fs, .. }
            | RecordSummary::Entries { fs, .. } => RecordSummary::FileSystem { fs },
            // Every field of a file system id fits (5 bytes at most).
            RecordSummary::FileSystem { .. } | RecordSummary::Chunks | RecordSummary::Unknown => {
                unreachable!("these summaries always fit a tag")
            }
        }
    }

    /// The summary a tag holds; `Unknown` for tags that do not decode.
    pub fn of_tag(tag: &RecordTag) -> RecordSummary {
        let mut fields = Vec::new();
        let mut at = 1;
        while at < TAG_BYTES && fields.len() < 4 {
            let mut value = 0u64;
            let mut shift = 0;
            loop {
                let Some(&byte) = tag.get(at) else {
                    return RecordSummary::Unknown;
                };
                at += 1;
                if shift >= 64 {
                    return RecordSummary::Unknown;
                }
                value |= ((byte & 0x7f) as u64) << shift;
                shift += 7;
                if byte & 0x80 == 0 {
                    break;
                }
            }
            fields.push(value);
        }
        let summary = summary_of_fields(tag[0], &fields);
        summary.unwrap_or(RecordSummary::Unknown)
    }
}

/// The summary of kind `kind` with `fields`, if they fit it.
fn summary_of_fields(kind: u8, fields: &[u64]) -> Option<RecordSummary> {
    let fs = |index: usize| {
        fields
            .get(index)
            .and_then(|&value| u32::try_from(value).ok())
    };
    let field = |index: usize| fields.get(index).copied();
    Some(match kind {
        KIND_UNKNOWN => RecordSummary::Unknown,
        KIND_DATA => {
            let start = field(2)?;
            RecordSummary::Data {
                fs: fs(0)?,
                ino: field(1)?,
                start,
                end: start.checked_add(field(3)?)?,
            }
        }
        KIND_FILE => RecordSummary::File {
            fs: fs(0)?,
            ino: field(1)?,
        },
        KIND_INODE => RecordSummary::Inode {
            fs: fs(0)?,
            ino: field(1)?,
        },
        KIND_ENTRIES => RecordSummary::Entries {
            fs: fs(0)?,
            parent: field(1)?,
            other_parent: field(2)?,
            ino: field(3)?,
        },
        KIND_FILE_SYSTEM => RecordSummary::FileSystem { fs: fs(0)? },
        KIND_CHUNKS => RecordSummary::Chunks,
        _ => return None,
    })
}

/// Byte ranges, disjoint and sorted: start -> end.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeSet {
    ranges: BTreeMap<u64, u64>,
}

impl RangeSet {
    /// Adds `[start, end)`.
    pub fn add(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let (mut start, mut end) = (start, end);
        let touching: Vec<(u64, u64)> = self
            .ranges
            .range(..=end)
            .rev()
            .take_while(|(_, &to)| to >= start)
            .map(|(&from, &to)| (from, to))
            .collect();
        for (from, to) in touching {
            self.ranges.remove(&from);
            start = start.min(from);
            end = end.max(to);
        }
        self.ranges.insert(start, end);
    }

    /// Removes `[start, end)`.
    pub fn remove(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let overlapping: Vec<(u64, u64)> = self
            .ranges
            .range(..end)
            .rev()
            .take_while(|(_, &to)| to > start)
            .map(|(&from, &to)| (from, to))
            .collect();
        for (from, to) in overlapping {
            self.ranges.remove(&from);
            if from < start {
                self.ranges.insert(from, start);
            }
            if to > end {
                self.ranges.insert(end, to);
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The ranges in order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.ranges.iter().map(|(&start, &end)| (start, end))
    }

    /// From the first start to the last end.
    pub fn span(&self) -> Option<(u64, u64)> {
        let start = *self.ranges.keys().next()?;
        let end = *self.ranges.values().next_back()?;
        Some((start, end))
    }
}

/// Builds the summary of the record being made, from its changes as they are pushed.
#[derive(Debug, Default)]
pub(crate) struct SummaryBuilder {
    /// Bytes whose mapping changed, per file.
    data: BTreeMap<(FsId, Ino), RangeSet>,
    /// Extents removed by this record, per file: a later extent that maps the same bytes of
    /// the same chunk at the same place is a piece a split kept, not a change.
    removed_extents: BTreeMap<(FsId, Ino), BTreeMap<u64, Extent>>,
    inodes: BTreeSet<(FsId, Ino)>,
    removed_inodes: BTreeSet<(FsId, Ino)>,
    /// Directory entry changes: file system, directory, inode named.
    entries: Vec<(FsId, Ino, Ino)>,
    systems: BTreeSet<FsId>,
    chunks: bool,
}

impl SummaryBuilder {
    /// Notes `change`, about to be applied; `removed` is the extent an extent removal
    /// removes, `size_before` the size of the inode an `InodeSet` changes, `entry_before`
    /// the inode an entry change replaces or removes.
    pub(crate) fn note(
        &mut self,
        change: &FsChange,
        removed: Option<Extent>,
        size_before: Option<u64>,
        entry_before: Option<Ino>,
    ) {
        match change {
            // Piece entries are derived data about chunks: a record of them alone changes no file.
            FsChange::Chunk(_) | FsChange::Piece { .. } => self.chunks = true,
            FsChange::FileSystemSet(record) => {
                self.systems.insert(record.id);
            }
            FsChange::FileSystemRemoved(fs) => {
                self.systems.insert(*fs);
            }
            FsChange::InodeSet { fs, ino, inode } => {
                self.inodes.insert((*fs, *ino));
                if let Some(before) = size_before {
                    let after = inode.attributes.size;
                    if before != after {
                        self.data
                            .entry((*fs, *ino))
                            .or_default()
                            .add(before.min(after), before.max(after));
                    }
                }
            }
            FsChange::InodeRemoved { fs, ino } => {
                self.removed_inodes.insert((*fs, *ino));
            }
            FsChange::Entry {
                fs, parent, child, ..
            } => {
                if let Some(child) = child {
                    self.entries.push((*fs, *parent, *child));
                }
                if let Some(before) = entry_before.filter(|before| Some(*before) != *child) {
                    self.entries.push((*fs, *parent, before));
                }
            }
            FsChange::Extent {
                fs,
                ino,
                offset,
                extent,
            } => {
                let key = (*fs, *ino);
                match (extent, removed) {
                    (Some(extent), _) => {
                        let end = offset + extent.length as u64;
                        let kept = self.removed_extents.get(&key).is_some_and(|removed| {
                            removed
                                .range(..=*offset)
                                .next_back()
                                .is_some_and(|(start, old)| {
                                    old.chunk == extent.chunk
                                        && start + old.length as u64 >= end
                                        && old.chunk_offset as u64 + (offset - start)
                                            == extent.chunk_offset as u64
                                })
                        });
                        let ranges = self.data.entry(key).or_default();
                        if kept {
                            ranges.remove(*offset, end);
                        } else {
                            ranges.add(*offset, end);
                        }
                    }
                    (None, Some(old)) => {
                        self.data
                            .entry(key)
                            .or_default()
                            .add(*offset, offset + old.length as u64);
                        self.removed_extents
                            .entry(key)
                            .or_default()
                            .insert(*offset, old);
                    }
                    (None, None) => {}
                }
            }
            FsChange::Xattr { fs, ino, .. } => {
                self.inodes.insert((*fs, *ino));
            }
        }
    }

    /// The summary of everything noted, and a fresh start.
    pub(crate) fn finish(&mut self) -> RecordSummary {
        let built = std::mem::take(self);
        if let Some(&fs) = built.systems.iter().next() {
            return RecordSummary::FileSystem { fs };
        }
        if let Some(&(fs, first_parent, ino)) = built.entries.first() {
            let mut parents: Vec<Ino> = built
                .entries
                .iter()
                .filter(|(entry_fs, _, _)| *entry_fs == fs)
                .map(|(_, parent, _)| *parent)
                .collect();
            parents.dedup();
            let other_parent = parents
                .iter()
                .copied()
                .find(|&parent| parent != first_parent)
                .unwrap_or(0);
            return RecordSummary::Entries {
                fs,
                parent: first_parent,
                other_parent,
                ino,
            };
        }
        // Files whose bytes changed (a removed file's do not count: it is gone).
        let changed: Vec<(FsId, Ino, u64, u64)> = built
            .data
            .iter()
            .filter(|(key, _)| !built.removed_inodes.contains(key))
            .filter_map(|(&(fs, ino), ranges)| {
                ranges.span().map(|(start, end)| (fs, ino, start, end))
            })
            .collect();
        match changed.as_slice() {
            &[(fs, ino, start, end)] => {
                return RecordSummary::Data {
                    fs,
                    ino,
                    start,
                    end,
                }
            }
            &[(fs, ..), ..] => return RecordSummary::FileSystem { fs },
            [] => {}
        }
        if let Some(&(fs, ino)) = built
            .removed_inodes
            .iter()
            .next()
            .or(built.inodes.iter().next())
        {
            let several = built
                .inodes
                .iter()
                .chain(&built.removed_inodes)
                .any(|&(other_fs, other)| other_fs != fs || other != ino);
            return if several {
                RecordSummary::FileSystem { fs }
            } else {
                RecordSummary::Inode { fs, ino }
            };
        }
        if built.chunks {
            return RecordSummary::Chunks;
        }
        RecordSummary::Unknown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: every summary survives its tag, a Data summary too large for the tag falls back
    /// to File, and a tag of garbage decodes to Unknown. Method: round trips.
    #[test]
    fn summaries_round_trip_through_tags() {
        let summaries = [
            RecordSummary::Unknown,
            RecordSummary::Data {
                fs: 3,
                ino: 1_000_000,
                start: 1 << 40,
                end: (1 << 40) + (1 << 20),
            },
            RecordSummary::File { fs: 1, ino: 2 },
            RecordSummary::Inode { fs: 1, ino: 99 },
            RecordSummary::Entries {
                fs: 2,
                parent: 1,
                other_parent: 7,
                ino: 12_345,
            },
            RecordSummary::FileSystem { fs: u32::MAX },
            RecordSummary::Chunks,
        ];
        for summary in summaries {
            assert_eq!(RecordSummary::of_tag(&summary.tag()), summary);
        }
        let huge = RecordSummary::Data {
            fs: u32::MAX,
            ino: u64::MAX,
            start: 1 << 49,
            end: 1 << 50,
        };
        assert_eq!(
            RecordSummary::of_tag(&huge.tag()),
            RecordSummary::File {
                fs: u32::MAX,
                ino: u64::MAX
            }
        );
        assert_eq!(RecordSummary::of_tag(&[0xff; 16]), RecordSummary::Unknown);
        let mut unterminated = [0xff; 16];
        unterminated[0] = 1;
        assert_eq!(RecordSummary::of_tag(&unterminated), RecordSummary::Unknown);
    }

    /// Goal: a range set merges what touches and splits what a removal cuts. Method: a small
    /// sequence against the expected ranges.
    #[test]
    fn range_sets_merge_and_split() {
        let mut set = RangeSet::default();
        set.add(10, 20);
        set.add(30, 40);
        set.add(20, 30);
        assert_eq!(set.iter().collect::<Vec<_>>(), vec![(10, 40)]);
        set.remove(15, 25);
        assert_eq!(set.iter().collect::<Vec<_>>(), vec![(10, 15), (25, 40)]);
        set.add(0, 12);
        set.remove(35, 100);
        assert_eq!(set.iter().collect::<Vec<_>>(), vec![(0, 15), (25, 35)]);
        assert_eq!(set.span(), Some((0, 35)));
        set.remove(0, 100);
        assert!(set.is_empty());
    }
}
