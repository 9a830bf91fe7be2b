//! The metadata map: which byte ranges of a volume hold file-system metadata, and of what kind.
//!
//! A *range* is a half-open byte interval `[start, end)` of the volume. The map keeps its ranges
//! sorted by `start`, never overlapping, and merges neighbours of the same kind, so a lookup is
//! one binary search.

use super::detect::LayoutKey;
use super::layout::{
    ClassifyBounds, FileSystemKind, JournalPlacement, MetadataKind, MetadataRange,
};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hints::fs::builder::MapBuilder;
    use crate::hints::fs::FsMetaError;

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
