//! The metadata map: which byte ranges of a volume hold file-system metadata, and of what kind.
//!
//! A *range* is a half-open byte interval `[start, end)` of the volume. The map keeps its ranges
//! sorted by `start`, never overlapping, and merges neighbours of the same kind, so a lookup is
//! one binary search.

use super::detect::{FileSystemKind, LayoutKey};
use super::FsMetaError;

/// Most ranges one derivation may record before merging. A 32 TiB ext4 volume without
/// `flex_bg` (the worst common case: six separate structures in each of 262,144 groups) needs
/// about 1.6 million; the map costs 24 bytes a range.
pub const RANGES_MAX: usize = 1 << 21;

/// What a metadata range or block holds. Every kind means "do not deduplicate": paper 1's
/// hint 1 (metadata) or hint 2 (journal writes), see [`MetadataKind::is_journal`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MetadataKind {
    /// An ext superblock, primary or backup (the whole file-system block that holds it).
    Superblock,
    /// Group descriptor blocks, primary or backup, including `meta_bg` descriptor blocks.
    GroupDescriptors,
    /// Blocks reserved after the group descriptors for online growth (`resize_inode`).
    ReservedGroupDescriptors,
    /// A block group's block (cluster) allocation bitmap.
    BlockBitmap,
    /// A block group's inode allocation bitmap.
    InodeBitmap,
    /// A block group's inode table.
    InodeTable,
    /// The multi-mount protection block (`mmp` feature).
    MultiMountProtection,
    /// The blocks of a jbd2 journal: the journal inode's data blocks, or a whole external
    /// journal device.
    Journal,
    /// An ext4 extent-tree block (index or leaf node); found in the journal inode's tree or
    /// recognised by content.
    ExtentNode,
    /// An ext2/3 indirect block (single, double or triple) of the journal inode's block map.
    IndirectBlock,
    /// A directory block whose record chain checks out (classifier only).
    Directory,
    /// An htree directory index block: the dx root or an interior dx node (classifier only).
    DirectoryIndex,
    /// An ext extended-attribute block (classifier only).
    ExtendedAttributes,
    /// The internal xfs log.
    XfsLog,
    /// The first sectors of an xfs allocation group: superblock copy, AGF, AGI and AGFL.
    XfsAllocationGroupHeaders,
}

impl MetadataKind {
    /// True for journal writes (paper 1's hint 2); false for other metadata (hint 1).
    pub fn is_journal(self) -> bool {
        matches!(self, MetadataKind::Journal | MetadataKind::XfsLog)
    }
}

/// One metadata range: bytes `[start, end)` of the volume hold `kind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetadataRange {
    /// First byte of the range (volume offset).
    pub start: u64,
    /// One past the last byte of the range; always greater than `start`.
    pub end: u64,
    /// What the range holds.
    pub kind: MetadataKind,
}

/// Where the file system keeps its journal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JournalPlacement {
    /// The file system has no journal (ext2, or ext3/4 with `has_journal` cleared).
    None,
    /// The journal lives in the volume; its ranges are in the map as [`MetadataKind::Journal`]
    /// or [`MetadataKind::XfsLog`].
    Internal {
        /// Size of the journal's data in bytes.
        journal_bytes: u64,
    },
    /// The journal lives on another device, so no write to this volume is a journal write.
    External,
}

/// Bounds a file system places on plausible block and inode numbers, used to tighten the
/// content classifier (see [`MetadataMap::classify_block`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ClassifyBounds {
    /// Block size of the file system in bytes.
    pub(crate) block_bytes: u32,
    /// Blocks in the file system; an extent must end at or before this block.
    pub(crate) blocks_count: u64,
    /// Inodes in the file system; a directory entry must name an inode at or below this.
    pub(crate) inodes_count: u32,
}

/// The metadata ranges of one file system in a volume, with what the derivation learnt.
///
/// Guarantees: ranges are sorted by `start`, do not overlap, are non-empty, lie inside the
/// file system, and neighbours that touch have different kinds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetadataMap {
    pub(crate) file_system: FileSystemKind,
    pub(crate) block_bytes: u32,
    pub(crate) file_system_bytes: u64,
    pub(crate) layout: LayoutKey,
    pub(crate) journal: JournalPlacement,
    pub(crate) ranges: Vec<MetadataRange>,
    pub(crate) bounds: Option<ClassifyBounds>,
}

impl MetadataMap {
    /// The kind of the first metadata range that overlaps bytes `[offset, offset + len)`, or
    /// `None` when no byte of them is metadata (also when `len` is zero). One binary search.
    pub fn lookup(&self, offset: u64, len: u64) -> Option<MetadataKind> {
        self.overlapping(offset, len)
            .first()
            .map(|range| range.kind)
    }

    /// All metadata ranges that overlap bytes `[offset, offset + len)`, in volume order; empty
    /// when `len` is zero. Lets a caller treat each block of a large write on its own.
    pub fn overlapping(&self, offset: u64, len: u64) -> &[MetadataRange] {
        if len == 0 {
            return &[];
        }
        let end = offset.saturating_add(len);
        let first = self.ranges.partition_point(|range| range.end <= offset);
        let after_last = first + self.ranges[first..].partition_point(|range| range.start < end);
        &self.ranges[first..after_last]
    }

    /// Every range of the map, sorted by `start`.
    pub fn ranges(&self) -> &[MetadataRange] {
        &self.ranges
    }

    /// The file system the map describes.
    pub fn file_system(&self) -> FileSystemKind {
        self.file_system
    }

    /// The file system's block size in bytes.
    pub fn block_bytes(&self) -> u32 {
        self.block_bytes
    }

    /// Bytes of the volume the file system spans (its block count times its block size).
    pub fn file_system_bytes(&self) -> u64 {
        self.file_system_bytes
    }

    /// Where the journal is.
    pub fn journal(&self) -> JournalPlacement {
        self.journal
    }

    /// The superblock fields the map was derived from. When a new superblock is written, the
    /// map is stale exactly when [`super::detect_superblock`] returns a different key.
    pub fn layout(&self) -> &LayoutKey {
        &self.layout
    }

    /// Total bytes covered by the map's ranges.
    pub fn metadata_bytes(&self) -> u64 {
        self.ranges
            .iter()
            .map(|range| range.end - range.start)
            .sum()
    }

    /// Classifies one file-system block by content like [`super::classify_block`],
    /// additionally requiring that `block.len()` is this file system's block size and that
    /// block and inode numbers found in it lie inside this file system. The classes are ext
    /// structures, so for xfs and for an ext journal device (all of which is in the map
    /// already) this returns `None`.
    pub fn classify_block(&self, block: &[u8]) -> Option<MetadataKind> {
        let bounds = self.bounds.as_ref()?;
        super::classify::classify_with_bounds(block, Some(bounds))
    }
}

/// Collects ranges during a derivation, checking each against the file system's size and the
/// [`RANGES_MAX`] limit, then sorts and merges them into a map.
pub(crate) struct MapBuilder {
    ranges: Vec<MetadataRange>,
    block_bytes: u64,
    blocks_count: u64,
}

impl MapBuilder {
    /// A builder for a file system of `blocks_count` blocks of `block_bytes` bytes.
    pub(crate) fn new(block_bytes: u32, blocks_count: u64) -> MapBuilder {
        assert!(block_bytes.is_power_of_two());
        MapBuilder {
            ranges: Vec::new(),
            block_bytes: u64::from(block_bytes),
            blocks_count,
        }
    }

    /// Records blocks `[first_block, first_block + block_count)` as `kind`. Fails when they
    /// reach past the file system or the range limit is exceeded; zero blocks record nothing.
    pub(crate) fn add_blocks(
        &mut self,
        first_block: u64,
        block_count: u64,
        kind: MetadataKind,
    ) -> Result<(), FsMetaError> {
        if block_count == 0 {
            return Ok(());
        }
        let end_block = first_block.checked_add(block_count);
        match end_block {
            Some(end_block) if end_block <= self.blocks_count => {}
            _ => {
                return Err(FsMetaError::OutsideFileSystem {
                    kind,
                    block: first_block,
                    block_count,
                    blocks_count: self.blocks_count,
                })
            }
        }
        // Both products fit: end_block <= blocks_count, and blocks_count * block_bytes was
        // checked against the volume size when the superblock was parsed.
        let start = first_block * self.block_bytes;
        let end = start + block_count * self.block_bytes;
        self.add_bytes(start, end, kind)
    }

    /// Records bytes `[start, end)` as `kind`; the caller has checked they lie inside the file
    /// system. Extends the previous range when this one continues it.
    pub(crate) fn add_bytes(
        &mut self,
        start: u64,
        end: u64,
        kind: MetadataKind,
    ) -> Result<(), FsMetaError> {
        assert!(start < end);
        assert!(end <= self.blocks_count.saturating_mul(self.block_bytes));
        if let Some(last) = self.ranges.last_mut() {
            if last.kind == kind && last.end == start {
                last.end = end;
                return Ok(());
            }
        }
        if self.ranges.len() >= RANGES_MAX {
            return Err(FsMetaError::LimitExceeded {
                limit: "RANGES_MAX",
                value: self.ranges.len() as u64 + 1,
                maximum: RANGES_MAX as u64,
            });
        }
        self.ranges.push(MetadataRange { start, end, kind });
        Ok(())
    }

    /// Sorts the ranges, resolves overlaps and merges touching ranges of one kind.
    ///
    /// A sound file system never has overlapping structures; in a damaged one, a byte keeps
    /// the kind of the range that starts first (ties: the longer range), so the result is
    /// deterministic and every recorded byte stays covered.
    pub(crate) fn finish(mut self) -> Vec<MetadataRange> {
        self.ranges
            .sort_unstable_by(|a, b| a.start.cmp(&b.start).then(b.end.cmp(&a.end)));
        let mut merged: Vec<MetadataRange> = Vec::with_capacity(self.ranges.len());
        for mut range in self.ranges {
            if let Some(last) = merged.last_mut() {
                if range.start < last.end {
                    if range.end <= last.end {
                        continue;
                    }
                    range.start = last.end;
                }
                if range.start == last.end && range.kind == last.kind {
                    last.end = range.end;
                    continue;
                }
            }
            merged.push(range);
        }
        debug_assert!(merged.windows(2).all(|pair| pair[0].end <= pair[1].start));
        merged
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map_of(ranges: Vec<MetadataRange>) -> MetadataMap {
        MetadataMap {
            file_system: FileSystemKind::Ext4,
            block_bytes: 4096,
            file_system_bytes: 1 << 30,
            layout: LayoutKey::for_tests(),
            journal: JournalPlacement::None,
            ranges,
            bounds: None,
        }
    }

    // Goal: the builder merges touching same-kind ranges, keeps distinct kinds apart, and
    // resolves overlaps in favour of the range that starts first (the journal at block 11
    // overlaps the inode table 10..15 and takes over from block 12); method: hand-made ranges.
    #[test]
    fn builder_sorts_merges_and_trims_overlaps() {
        let mut builder = MapBuilder::new(1024, 100);
        builder.add_blocks(10, 2, MetadataKind::InodeTable).unwrap();
        builder.add_blocks(0, 1, MetadataKind::Superblock).unwrap();
        builder.add_blocks(12, 3, MetadataKind::InodeTable).unwrap();
        builder
            .add_blocks(1, 1, MetadataKind::GroupDescriptors)
            .unwrap();
        builder.add_blocks(11, 6, MetadataKind::Journal).unwrap();
        builder.add_blocks(0, 0, MetadataKind::Journal).unwrap();
        let ranges = builder.finish();
        assert_eq!(
            ranges,
            vec![
                MetadataRange {
                    start: 0,
                    end: 1024,
                    kind: MetadataKind::Superblock
                },
                MetadataRange {
                    start: 1024,
                    end: 2048,
                    kind: MetadataKind::GroupDescriptors
                },
                MetadataRange {
                    start: 10240,
                    end: 12288,
                    kind: MetadataKind::InodeTable
                },
                MetadataRange {
                    start: 12288,
                    end: 17408,
                    kind: MetadataKind::Journal
                },
            ]
        );
    }

    // Goal: ranges reaching past the file system are refused with a typed error.
    #[test]
    fn builder_refuses_ranges_outside_the_file_system() {
        let mut builder = MapBuilder::new(1024, 100);
        assert!(matches!(
            builder.add_blocks(99, 2, MetadataKind::BlockBitmap),
            Err(FsMetaError::OutsideFileSystem { block: 99, .. })
        ));
        assert!(builder
            .add_blocks(u64::MAX, 2, MetadataKind::BlockBitmap)
            .is_err());
        assert!(builder.add_blocks(99, 1, MetadataKind::BlockBitmap).is_ok());
    }

    // Goal: lookup and overlapping find exactly the ranges a byte interval touches, at edges.
    #[test]
    fn lookup_finds_overlaps_at_range_edges() {
        let map = map_of(vec![
            MetadataRange {
                start: 4096,
                end: 8192,
                kind: MetadataKind::Superblock,
            },
            MetadataRange {
                start: 8192,
                end: 12288,
                kind: MetadataKind::GroupDescriptors,
            },
            MetadataRange {
                start: 40960,
                end: 81920,
                kind: MetadataKind::Journal,
            },
        ]);
        assert_eq!(map.lookup(0, 4096), None);
        assert_eq!(map.lookup(0, 4097), Some(MetadataKind::Superblock));
        assert_eq!(map.lookup(8191, 2), Some(MetadataKind::Superblock));
        assert_eq!(map.lookup(8192, 1), Some(MetadataKind::GroupDescriptors));
        assert_eq!(map.lookup(12288, 28672), None);
        assert_eq!(map.lookup(12288, 28673), Some(MetadataKind::Journal));
        assert_eq!(map.lookup(81919, 10), Some(MetadataKind::Journal));
        assert_eq!(map.lookup(81920, u64::MAX), None);
        assert_eq!(map.lookup(5000, 0), None);
        assert_eq!(map.overlapping(0, u64::MAX).len(), 3);
        assert_eq!(map.overlapping(8000, 4000).len(), 2);
        assert_eq!(map.overlapping(8000, 40000).len(), 3);
        assert_eq!(map.metadata_bytes(), 8192 + 40960);
        assert!(MetadataKind::Journal.is_journal());
        assert!(!MetadataKind::InodeTable.is_journal());
    }
}
