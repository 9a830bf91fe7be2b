//! Salvage of damaged journals (`onecopy check --repair`): the intact records after a damaged
//! one are applied, and exactly what the damaged one changed is marked lost.
//!
//! Terms: the *damaged* record is one whose bytes fail their checks (or whose chunk bytes are
//! gone although an fsync acknowledged it); its tag still says what it changed
//! ([`RecordSummary`]), from its header or its footer. *Later* records are the intact ones
//! after it.
//!
//! 1. Each damaged record's byte range (a Data summary: one file, `[start, end)`; a File
//!    summary: the whole file) becomes a *lost range* of its file.
//! 2. Later records are applied leniently ([`Salvage::apply`]): the tables may disagree with
//!    them (the damaged record's changes are missing), so an inode a later record sets again
//!    is made first, a change that names an object the damage lost (an inode, a directory, a
//!    file system) and no later change makes again is skipped and counted, an extent
//!    replaces whatever it overlaps, and reference counts are left to the repair's rebuild
//!    (only chunk records and container records are applied, as the block device's salvage
//!    does). Before a later record with a Data summary is applied, its range is cleared: its
//!    changes then make that range exactly what it was when the record was written, so the
//!    range is no longer lost.
//! 3. At the end ([`Salvage::finish`]), every file's lost ranges are mapped to
//!    [`LOST_CHUNK`] (reads fail, naming the range, until it is written again), and so is
//!    every extent that maps a chunk not in use (its record was in the damaged record) or a
//!    chunk a later record stored afresh under an id the damaged record had freed (a *stale*
//!    extent: its bytes now belong to another file).
//!
//! What is not recovered: the names, attributes and xattrs a damaged record changed (the
//! namespace repair then links inodes no entry names into `/lost+found`); records after a
//! cut (a truncated journal) are gone, and what they changed is unknown.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use onecopy_core::chunk_store::{ChunkChange, ChunkId, ChunkStore};
use onecopy_core::index::FingerprintIndex;
use onecopy_core::pages::PageStore;

use crate::changes::{FsChange, FsId};
use crate::error::Result;
use crate::node::{Extent, Ino, Inode};
use crate::summary::{RangeSet, RecordSummary};

use super::{apply, FileSystem};

/// Largest lost extent: lost ranges are mapped in pieces of this size.
const LOST_EXTENT_BYTES_MAX: u64 = 1 << 30;
const _: () = assert!(LOST_EXTENT_BYTES_MAX <= u32::MAX as u64);

/// What a salvage tracks while it applies later records.
#[derive(Debug, Default)]
pub(crate) struct Salvage {
    /// Lost ranges by file.
    lost: BTreeMap<(FsId, Ino), RangeSet>,
    /// Each chunk id a later record stored, with the number of that record.
    stored: HashMap<ChunkId, u64>,
    /// The last record that mapped a chunk stored afresh, by file and chunk.
    mapped_fresh: HashMap<(FsId, Ino, ChunkId), u64>,
    /// Records applied so far.
    sequence: u64,
    /// Changes skipped because they named objects the damage lost.
    pub skipped_changes: u64,
}

/// A file's bytes marked lost by [`Salvage::finish`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LostRanges {
    pub fs: FsId,
    pub ino: Ino,
    /// The ranges from damaged records.
    pub damaged: Vec<(u64, u64)>,
    /// The ranges whose chunks the damage took (not in use, or stored afresh since).
    pub unmapped: Vec<(u64, u64)>,
}

impl Salvage {
    /// Notes a damaged record that changed what `summary` says.
    pub(crate) fn damaged(&mut self, summary: RecordSummary) {
        match summary {
            RecordSummary::Data {
                fs,
                ino,
                start,
                end,
            } => self.lost.entry((fs, ino)).or_default().add(start, end),
            RecordSummary::File { fs, ino } => {
                self.lost.entry((fs, ino)).or_default().add(0, u64::MAX)
            }
            _ => {}
        }
    }

    /// Applies the changes of a later (intact) record summarised by `summary`; see the module
    /// documentation.
    pub(crate) fn apply(
        &mut self,
        pages: &mut PageStore,
        chunks: &mut ChunkStore,
        pieces: &mut FingerprintIndex,
        systems: &mut BTreeMap<FsId, FileSystem>,
        changes: &[FsChange],
        summary: RecordSummary,
    ) -> Result<()> {
        self.sequence += 1;
        if let RecordSummary::Data {
            fs,
            ino,
            start,
            end,
        } = summary
        {
            if let Some(inode) = inode_mut(systems, fs, ino) {
                cut(inode, start, end);
            }
            if let Some(ranges) = self.lost.get_mut(&(fs, ino)) {
                ranges.remove(start, end);
            }
        }
        // An inode the damage lost that this record sets again (its head is whole in the
        // change) exists before the record's other changes name it: a write's extents come
        // before its inode change.
        for change in changes {
            if let FsChange::InodeSet { fs, ino, .. } = change {
                let missing = systems
                    .get(fs)
                    .is_some_and(|system| !system.inodes.contains_key(ino));
                if missing {
                    apply(pages, chunks, pieces, systems, change)?;
                }
            }
        }
        for change in changes {
            let known = match change {
                FsChange::Chunk(chunk) => {
                    chunks.salvage_apply(pages, chunk)?;
                    if let ChunkChange::Stored { id, .. } = chunk {
                        self.stored.insert(*id, self.sequence);
                    }
                    true
                }
                FsChange::FileSystemSet(_) | FsChange::FileSystemRemoved(_) => {
                    apply(pages, chunks, pieces, systems, change)?;
                    true
                }
                FsChange::InodeSet { fs, .. } if systems.contains_key(fs) => {
                    apply(pages, chunks, pieces, systems, change)?;
                    true
                }
                FsChange::InodeRemoved { fs, ino } => match systems.get_mut(fs) {
                    Some(system) => {
                        system.remove_inode(*ino);
                        true
                    }
                    None => false,
                },
                FsChange::Entry { fs, parent, .. }
                | FsChange::Xattr {
                    fs, ino: parent, ..
                } if systems
                    .get(fs)
                    .is_some_and(|system| system.inodes.contains_key(parent)) =>
                {
                    apply(pages, chunks, pieces, systems, change)?;
                    true
                }
                FsChange::Extent {
                    fs,
                    ino,
                    offset,
                    extent,
                } => match (inode_mut(systems, *fs, *ino), extent) {
                    (Some(inode), Some(extent)) => {
                        cut(inode, *offset, offset + extent.length as u64);
                        inode.extents.insert(*offset, *extent);
                        if self.stored.contains_key(&extent.chunk) {
                            self.mapped_fresh
                                .insert((*fs, *ino, extent.chunk), self.sequence);
                        }
                        true
                    }
                    (Some(inode), None) => {
                        inode.extents.remove(offset);
                        true
                    }
                    (None, _) => false,
                },
                // Derived data: an entry whose chunk the damage took is found stale by the
                // byte comparison before any use, and removed then.
                FsChange::Piece { .. } => {
                    apply(pages, chunks, pieces, systems, change)?;
                    true
                }
                _ => false,
            };
            if !known {
                self.skipped_changes += 1;
            }
        }
        Ok(())
    }

    /// Marks every lost range and every extent whose chunk the damage took as lost (see the
    /// module documentation); returns them by file. Files the damage or a later record
    /// removed have nothing to mark.
    pub(crate) fn finish(
        &self,
        pages: &mut PageStore,
        chunks: &ChunkStore,
        systems: &mut BTreeMap<FsId, FileSystem>,
    ) -> Vec<LostRanges> {
        let mut marked = Vec::new();
        for (&fs, system) in systems.iter_mut() {
            for (&ino, inode) in system.inodes.iter_mut() {
                let mut damaged = RangeSet::default();
                if let Some(ranges) = self.lost.get(&(fs, ino)) {
                    // A range that reaches past the end: the file was longer (a lost write
                    // extended it); it is made that long again, so the loss shows.
                    let mapped_end = inode
                        .extents
                        .iter()
                        .next_back()
                        .map_or(0, |(offset, extent)| offset + extent.length as u64);
                    let file_end = inode.attributes.size.max(mapped_end);
                    for (start, end) in ranges.iter() {
                        let end = if end == u64::MAX { file_end } else { end };
                        damaged.add(start, end);
                        if end != u64::MAX && end > inode.attributes.size {
                            inode.attributes.size = end;
                        }
                    }
                }
                let mut unmapped = RangeSet::default();
                for (&offset, extent) in &inode.extents {
                    if extent.is_lost() {
                        continue;
                    }
                    let stale = self.stored.get(&extent.chunk).is_some_and(|&stored| {
                        self.mapped_fresh
                            .get(&(fs, ino, extent.chunk))
                            .is_none_or(|&mapped| mapped < stored)
                    });
                    // A chunk record that does not read is as good as gone.
                    let in_use = chunks
                        .record(pages, extent.chunk)
                        .is_ok_and(|record| record.in_use);
                    if stale || !in_use {
                        unmapped.add(offset, offset + extent.length as u64);
                    }
                }
                if damaged.is_empty() && unmapped.is_empty() {
                    continue;
                }
                let mut all = damaged.clone();
                for (start, end) in unmapped.iter() {
                    all.add(start, end);
                }
                for (start, end) in all.iter() {
                    mark_lost(inode, start, end);
                }
                marked.push(LostRanges {
                    fs,
                    ino,
                    damaged: damaged.iter().collect(),
                    unmapped: unmapped.iter().collect(),
                });
            }
        }
        marked
    }
}

fn inode_mut(systems: &mut BTreeMap<FsId, FileSystem>, fs: FsId, ino: Ino) -> Option<&mut Inode> {
    systems.get_mut(&fs)?.inodes.get_mut(&ino)
}

/// Removes the mapping of `[from, to)` from `inode`, keeping the parts of extents outside it
/// (no reference counts: a salvage's repair rebuilds them).
pub(crate) fn cut(inode: &mut Inode, from: u64, to: u64) {
    if from >= to {
        return;
    }
    let overlapping: Vec<(u64, Extent)> = inode
        .extents
        .range(..to)
        .rev()
        .take_while(|(start, extent)| **start + extent.length as u64 > from)
        .map(|(start, extent)| (*start, *extent))
        .collect();
    for (start, extent) in overlapping {
        inode.extents.remove(&start);
        let end = start + extent.length as u64;
        if start < from {
            let (offset, piece) = extent.slice(start, start, from);
            inode.extents.insert(offset, piece);
        }
        if end > to {
            let (offset, piece) = extent.slice(start, to, end);
            inode.extents.insert(offset, piece);
        }
    }
}

/// Maps `[from, to)` of `inode` to [`LOST_CHUNK`], in pieces of at most
/// [`LOST_EXTENT_BYTES_MAX`].
pub(crate) fn mark_lost(inode: &mut Inode, from: u64, to: u64) {
    cut(inode, from, to);
    let mut at = from;
    while at < to {
        let length = (to - at).min(LOST_EXTENT_BYTES_MAX);
        inode.extents.insert(at, Extent::lost(length as u32));
        at += length;
    }
}

/// Byte ranges as text: `bytes 0..4096, 8192..12288`.
pub(crate) fn ranges_text(ranges: &[(u64, u64)]) -> String {
    let listed: Vec<String> = ranges
        .iter()
        .map(|(start, end)| format!("{start}..{end}"))
        .collect();
    format!("bytes {}", listed.join(", "))
}

/// Inodes named by the salvage's findings, so that the check of the same run does not
/// report their lost ranges a second time.
pub(crate) fn files_of(marked: &[LostRanges]) -> BTreeSet<(FsId, Ino)> {
    marked.iter().map(|lost| (lost.fs, lost.ino)).collect()
}

/// What a record summarised by `summary` changed, in words, with the names the tables know
/// now.
pub(crate) fn describe(systems: &BTreeMap<FsId, FileSystem>, summary: &RecordSummary) -> String {
    let system_name = |fs: FsId| match systems.get(&fs) {
        Some(system) => format!("file system {}", system.record.name),
        None => format!("file system id {fs}"),
    };
    let inode_name = |fs: FsId, ino: Ino| match systems.get(&fs) {
        Some(system) => inode_label(system, ino),
        None => format!("inode {ino}"),
    };
    match *summary {
        RecordSummary::Unknown => "what it changed is unknown (no tag)".to_string(),
        RecordSummary::Data {
            fs,
            ino,
            start,
            end,
        } => format!(
            "{}: {} bytes {start}..{end}",
            system_name(fs),
            inode_name(fs, ino)
        ),
        RecordSummary::File { fs, ino } => {
            format!(
                "{}: {} (bytes unknown)",
                system_name(fs),
                inode_name(fs, ino)
            )
        }
        RecordSummary::Inode { fs, ino } => format!(
            "{}: the attributes or xattrs of {}, or its removal",
            system_name(fs),
            inode_name(fs, ino)
        ),
        RecordSummary::Entries {
            fs,
            parent,
            other_parent,
            ino,
        } => {
            let mut directories = inode_name(fs, parent);
            if other_parent != 0 {
                directories = format!("{directories} and {}", inode_name(fs, other_parent));
            }
            format!(
                "{}: the entries of directory {directories} for {} (a create, link, unlink \
                 or rename)",
                system_name(fs),
                inode_name(fs, ino)
            )
        }
        RecordSummary::FileSystem { fs } => format!(
            "{}: its record (created, configured, its deletion started) or several of its \
             files",
            system_name(fs)
        ),
        RecordSummary::Chunks => {
            "only chunk locations or reference counts (compaction, a repair), which a repair \
             rebuilds"
                .to_string()
        }
    }
}

/// `/path (inode N)`, or `inode N` when no directory names it.
pub(crate) fn inode_label(system: &FileSystem, ino: Ino) -> String {
    if ino == crate::node::ROOT {
        return "/ (inode 1)".to_string();
    }
    match crate::dedup::paths_of(system).remove(&ino) {
        Some(path) => format!("{path} (inode {ino})"),
        None => format!("inode {ino}"),
    }
}
