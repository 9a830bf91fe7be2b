//! File-system metadata hints: which writes to a volume are file-system metadata or journal
//! writes, learnt from the bytes the file system writes (paper 1, hints 1 and 2).
//!
//! Paper 1 changes the file system so that it flags metadata and journal writes "do not
//! deduplicate". We cannot change the kernel, so the block device derives the same knowledge:
//!
//! 1. When a write touches the start of the volume ([`write_touches_superblock`]), the engine
//!    reads the first [`SUPERBLOCK_PROBE_BYTES`] back and calls [`detect_superblock`].
//! 2. If a superblock is there and its [`LayoutKey`] differs from the current map's (or there
//!    is no map), the engine calls [`derive_metadata_map`], which reads the group descriptors
//!    and the journal's mapping through a callback and returns a [`MetadataMap`]: the sorted
//!    byte ranges of superblocks and their backups, group descriptors, reserved descriptor
//!    blocks, bitmaps, inode tables, the MMP block, the journal (ext) or log (xfs).
//! 3. On each write, [`MetadataMap::lookup`] says whether the written bytes are metadata (one
//!    binary search). For blocks outside the fixed ranges, [`MetadataMap::classify_block`]
//!    (or the context-free [`classify_block`]) recognises extent-tree nodes, directory
//!    blocks, directory index blocks and extended-attribute blocks by content.
//!
//! Terms: a *volume* is the block device the engine exports; a *file-system block* is the
//! file system's allocation unit (1 KiB to 64 KiB), distinct from the engine's block size;
//! the *journal* is the jbd2 journal of ext3/4 or the log of xfs.
//!
//! Guarantees: every function here parses untrusted bytes and never panics on any input; all
//! work is bounded by named limits ([`GROUPS_MAX`], [`RANGES_MAX`], [`EXTENT_DEPTH_MAX`],
//! [`JOURNAL_MAP_BLOCKS_MAX`]) and exceeding one is an error, not a truncated map. Not
//! guaranteed: that a damaged file system yields a map (it yields an error), or that every
//! metadata block outside the fixed ranges is recognised (indirect blocks and xfs btree
//! blocks are not).

mod builder;
mod classify;
mod detect;
mod ext;
mod layout;
mod map;
mod xfs;

pub use builder::RANGES_MAX;
pub use classify::classify_block;
pub use detect::{
    detect_superblock, write_touches_superblock, DetectedSuperblock, LayoutKey,
    SUPERBLOCK_PROBE_BYTES,
};
pub use ext::journal::{EXTENT_DEPTH_MAX, JOURNAL_MAP_BLOCKS_MAX};
pub use ext::superblock::GROUPS_MAX;
pub use layout::{FileSystemKind, JournalPlacement, MetadataKind, MetadataRange};
pub use map::MetadataMap;

use ext::superblock::{ExtSuperblock, EXT_SUPERBLOCK_BYTES, EXT_SUPERBLOCK_OFFSET};
use xfs::superblock::XfsSuperblock;

/// Reads exactly `buffer.len()` bytes at a volume byte offset, or fails.
pub type ReadAt<'a> = dyn FnMut(u64, &mut [u8]) -> std::io::Result<()> + 'a;

/// Why a metadata map could not be derived.
#[derive(Debug, thiserror::Error)]
pub enum FsMetaError {
    /// The reader failed; the volume may be shorter than the file system claims.
    #[error("reading {len} bytes at volume offset {offset} failed: {source}")]
    Read {
        offset: u64,
        len: usize,
        #[source]
        source: std::io::Error,
    },
    /// Neither an ext nor an xfs superblock magic is at its fixed place.
    #[error("no ext or xfs superblock at the start of the volume")]
    NoFileSystem,
    /// A structure was shorter than its format requires.
    #[error("{what} is truncated")]
    Truncated { what: &'static str },
    /// The superblock's fields are inconsistent: damaged, or not a file system at all.
    #[error("{file_system} superblock refused: {reason}")]
    BadSuperblock {
        file_system: &'static str,
        reason: &'static str,
    },
    /// The file system uses a feature whose layout this module does not know.
    #[error("unsupported: {what}")]
    Unsupported { what: &'static str },
    /// The file system claims more blocks than the volume holds.
    #[error(
        "file system of {blocks_count} blocks of {block_bytes} bytes does not fit in a volume \
         of {volume_bytes} bytes"
    )]
    VolumeTooSmall {
        blocks_count: u64,
        block_bytes: u32,
        volume_bytes: u64,
    },
    /// A group descriptor names a structure outside the file system.
    #[error("group descriptor {group} refused: {reason}")]
    BadDescriptor { group: u64, reason: &'static str },
    /// The journal inode is not a usable regular file.
    #[error("journal inode refused: {reason}")]
    BadJournalInode { reason: &'static str },
    /// A node of the journal inode's extent tree is damaged.
    #[error("journal extent tree refused: {reason}")]
    BadExtentNode { reason: &'static str },
    /// A structure would lie (partly) outside the file system.
    #[error(
        "{kind:?} at block {block} ({block_count} blocks) lies outside the file system of \
         {blocks_count} blocks"
    )]
    OutsideFileSystem {
        kind: MetadataKind,
        block: u64,
        block_count: u64,
        blocks_count: u64,
    },
    /// A named work limit was exceeded; the map would be incomplete, so none is returned.
    #[error("limit {limit} exceeded: {value} > {maximum}")]
    LimitExceeded {
        limit: &'static str,
        value: u64,
        maximum: u64,
    },
}

/// Calls `read` and attaches the offset and length to its error.
pub(crate) fn read_at(
    read: &mut ReadAt<'_>,
    offset: u64,
    buffer: &mut [u8],
) -> Result<(), FsMetaError> {
    read(offset, buffer).map_err(|source| FsMetaError::Read {
        offset,
        len: buffer.len(),
        source,
    })
}

/// Derives the metadata map of the ext2/3/4 file system, ext journal device or xfs file
/// system at the start of a volume of `volume_bytes` bytes, reading what it needs through
/// `read` (the superblock, the group descriptors, the journal inode and its extent tree or
/// indirect blocks; for xfs only the superblock).
///
/// Call it after the write that carried the superblock has been applied, and off the hot
/// path: for ext it reads every group descriptor (a 1 TiB ext4 volume has 8,192 groups, 512
/// KiB of descriptors). Reads are at most 256 KiB each. Returns a typed error for a missing,
/// damaged or oversized file system; never panics and never loops without bound.
pub fn derive_metadata_map(
    volume_bytes: u64,
    read: &mut ReadAt<'_>,
) -> Result<MetadataMap, FsMetaError> {
    if volume_bytes < SUPERBLOCK_PROBE_BYTES as u64 {
        return Err(FsMetaError::NoFileSystem);
    }
    let mut head = vec![0u8; SUPERBLOCK_PROBE_BYTES];
    read_at(read, 0, &mut head)?;
    // The same precedence as detect_superblock: a valid xfs superblock first, then ext.
    let xfs_superblock = head
        .starts_with(b"XFSB")
        .then(|| XfsSuperblock::parse(&head));
    if let Some(Ok(superblock)) = xfs_superblock {
        return xfs::derive(superblock, volume_bytes);
    }
    let ext_bytes = &head[EXT_SUPERBLOCK_OFFSET as usize..][..EXT_SUPERBLOCK_BYTES];
    if onecopy_core::bytes::le16(ext_bytes, 0x38) == Some(0xEF53) {
        let superblock = ExtSuperblock::parse(ext_bytes)?;
        return ext::derive(superblock, volume_bytes, read);
    }
    match xfs_superblock {
        Some(Err(error)) => Err(error),
        _ => Err(FsMetaError::NoFileSystem),
    }
}
