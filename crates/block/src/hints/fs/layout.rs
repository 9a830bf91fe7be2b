//! The plain types the file-system hints share: which file system, what a metadata range
//! holds, where the journal lives, and the bounds the content classifier checks. A leaf
//! module: the parsers, the map builder, the classifier and the map all use it, and it uses
//! none of them.

/// The file systems whose layout this module derives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileSystemKind {
    /// ext2: no journal, no ext4 features.
    Ext2,
    /// ext3: a jbd2 journal and no feature beyond those ext3 understands.
    Ext3,
    /// ext4: any feature ext3 does not understand (extents, flex_bg, 64bit, checksums, ...).
    Ext4,
    /// An external ext3/4 journal device (`mke2fs -O journal_dev`): the whole volume is journal.
    ExtJournalDevice,
    /// xfs.
    Xfs,
}

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
/// content classifier (see [`MetadataMap::classify_block`](super::MetadataMap::classify_block)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ClassifyBounds {
    /// Block size of the file system in bytes.
    pub(crate) block_bytes: u32,
    /// Blocks in the file system; an extent must end at or before this block.
    pub(crate) blocks_count: u64,
    /// Inodes in the file system; a directory entry must name an inode at or below this.
    pub(crate) inodes_count: u32,
}
