//! The internal journal: the data blocks of the journal inode (normally inode 8), found through
//! its extent tree (ext4) or its block map of direct and indirect blocks (ext2/3 style).

use super::groups::GroupDescriptor;
use super::superblock::ExtSuperblock;
use crate::hints::fs::builder::MapBuilder;
use crate::hints::fs::layout::{JournalPlacement, MetadataKind};
use crate::hints::fs::{read_at, FsMetaError, ReadAt};
use onecopy_core::bytes::{le16, le32};

/// Deepest extent tree ext4 builds (`EXT4_MAX_EXTENT_DEPTH`).
pub const EXTENT_DEPTH_MAX: u16 = 5;
/// Most extent-tree or indirect blocks read while mapping the journal. With 1 KiB blocks an
/// indirect block maps 256 blocks, so this covers a 16 GiB journal; extent trees need far
/// fewer.
pub const JOURNAL_MAP_BLOCKS_MAX: u64 = 1 << 16;

pub(crate) const EXTENT_MAGIC: u16 = 0xF30A;
pub(crate) const EXTENT_HEADER_BYTES: usize = 12;
pub(crate) const EXTENT_ENTRY_BYTES: usize = 12;
/// Extent lengths above this mark an uninitialised extent of `length - 32768` blocks.
pub(crate) const EXTENT_INITIALISED_LENGTH_MAX: u16 = 32768;
const INODE_FLAG_EXTENTS: u32 = 0x8_0000;
const INODE_FLAG_INLINE_DATA: u32 = 0x1000_0000;
const INODE_MODE_TYPE_MASK: u16 = 0xF000;
const INODE_MODE_REGULAR: u16 = 0x8000;
/// Bytes of an inode this module reads: up to and including `i_size_high`.
const INODE_PREFIX_BYTES: usize = 0x70;
const INODE_BLOCK_OFFSET: usize = 0x28;
const INODE_BLOCK_BYTES: usize = 60;
const DIRECT_BLOCKS: usize = 12;

fn bad_inode(reason: &'static str) -> FsMetaError {
    FsMetaError::BadJournalInode { reason }
}

/// Records the journal's blocks and says where the journal is.
pub(crate) fn add_journal(
    superblock: &ExtSuperblock,
    descriptors: &[GroupDescriptor],
    read: &mut ReadAt<'_>,
    builder: &mut MapBuilder,
) -> Result<JournalPlacement, FsMetaError> {
    if !superblock.has_journal() {
        return Ok(JournalPlacement::None);
    }
    if superblock.journal_inode == 0 {
        if superblock.journal_device != 0 || superblock.journal_uuid != [0; 16] {
            return Ok(JournalPlacement::External);
        }
        return Err(bad_inode("has_journal without a journal inode or device"));
    }
    let inode = read_inode(superblock, descriptors, superblock.journal_inode, read)?;
    let mode = le16(&inode, 0x00).unwrap_or(0);
    if mode & INODE_MODE_TYPE_MASK != INODE_MODE_REGULAR {
        return Err(bad_inode("not a regular file"));
    }
    let size_bytes = u64::from(le32(&inode, 0x04).unwrap_or(0))
        | (u64::from(le32(&inode, 0x6C).unwrap_or(0)) << 32);
    let block_bytes = u64::from(superblock.block_bytes());
    let blocks_needed = size_bytes.div_ceil(block_bytes);
    if blocks_needed > superblock.blocks_count {
        return Err(bad_inode("size larger than the file system"));
    }
    let flags = le32(&inode, 0x20).unwrap_or(0);
    if flags & INODE_FLAG_INLINE_DATA != 0 {
        return Err(bad_inode("inline data"));
    }
    let block_map = &inode[INODE_BLOCK_OFFSET..INODE_BLOCK_OFFSET + INODE_BLOCK_BYTES];
    let mut walker = Walker {
        superblock,
        read,
        builder,
        blocks_read: 0,
        pending: None,
    };
    if flags & INODE_FLAG_EXTENTS != 0 {
        walker.walk_extent_node(block_map, None)?;
    } else {
        walker.walk_block_map(block_map, blocks_needed)?;
    }
    walker.flush()?;
    Ok(JournalPlacement::Internal {
        journal_bytes: size_bytes,
    })
}

/// Reads the first [`INODE_PREFIX_BYTES`] of inode `inode_number`.
fn read_inode(
    superblock: &ExtSuperblock,
    descriptors: &[GroupDescriptor],
    inode_number: u32,
    read: &mut ReadAt<'_>,
) -> Result<Vec<u8>, FsMetaError> {
    assert!(inode_number > 0);
    let index = u64::from(inode_number - 1);
    let group = index / u64::from(superblock.inodes_per_group);
    let slot = index % u64::from(superblock.inodes_per_group);
    let descriptor = usize::try_from(group)
        .ok()
        .and_then(|group| descriptors.get(group))
        .ok_or(bad_inode("inode number beyond the last group"))?;
    // The descriptor check guaranteed the inode table lies inside the file system.
    let offset = descriptor.inode_table * u64::from(superblock.block_bytes())
        + slot * u64::from(superblock.inode_bytes);
    let mut inode = vec![0u8; INODE_PREFIX_BYTES];
    read_at(read, offset, &mut inode)?;
    Ok(inode)
}

/// Walks a journal's mapping structures, coalescing contiguous data blocks into runs.
struct Walker<'a, 'r> {
    superblock: &'a ExtSuperblock,
    read: &'a mut ReadAt<'r>,
    builder: &'a mut MapBuilder,
    blocks_read: u64,
    /// A run of journal data blocks not yet recorded: (first block, block count).
    pending: Option<(u64, u64)>,
}

impl Walker<'_, '_> {
    fn add_data(&mut self, first_block: u64, block_count: u64) -> Result<(), FsMetaError> {
        if let Some((start, count)) = self.pending.as_mut() {
            if *start + *count == first_block {
                *count += block_count;
                return Ok(());
            }
        }
        self.flush()?;
        self.pending = Some((first_block, block_count));
        Ok(())
    }

    fn flush(&mut self) -> Result<(), FsMetaError> {
        if let Some((start, count)) = self.pending.take() {
            self.builder
                .add_blocks(start, count, MetadataKind::Journal)?;
        }
        Ok(())
    }

    /// Reads mapping block `block` (an extent node or an indirect block) and records it.
    fn read_mapping_block(
        &mut self,
        block: u64,
        kind: MetadataKind,
    ) -> Result<Vec<u8>, FsMetaError> {
        if block == 0 || block >= self.superblock.blocks_count {
            return Err(FsMetaError::OutsideFileSystem {
                kind,
                block,
                block_count: 1,
                blocks_count: self.superblock.blocks_count,
            });
        }
        self.blocks_read += 1;
        if self.blocks_read > JOURNAL_MAP_BLOCKS_MAX {
            return Err(FsMetaError::LimitExceeded {
                limit: "JOURNAL_MAP_BLOCKS_MAX",
                value: self.blocks_read,
                maximum: JOURNAL_MAP_BLOCKS_MAX,
            });
        }
        self.builder.add_blocks(block, 1, kind)?;
        let block_bytes = u64::from(self.superblock.block_bytes());
        let mut bytes = vec![0u8; block_bytes as usize];
        read_at(self.read, block * block_bytes, &mut bytes)?;
        Ok(bytes)
    }

    /// Walks the extent node in `node`; `expected_depth` is `None` for the root (in the inode)
    /// and the parent's depth minus one below it.
    fn walk_extent_node(
        &mut self,
        node: &[u8],
        expected_depth: Option<u16>,
    ) -> Result<(), FsMetaError> {
        let header = parse_extent_header(node).ok_or(FsMetaError::BadExtentNode {
            reason: "bad header",
        })?;
        if header.depth > EXTENT_DEPTH_MAX {
            return Err(FsMetaError::LimitExceeded {
                limit: "EXTENT_DEPTH_MAX",
                value: u64::from(header.depth),
                maximum: u64::from(EXTENT_DEPTH_MAX),
            });
        }
        if expected_depth.is_some_and(|depth| depth != header.depth) {
            return Err(FsMetaError::BadExtentNode {
                reason: "child depth is not parent depth minus one",
            });
        }
        for entry in 0..usize::from(header.entries) {
            let at = EXTENT_HEADER_BYTES + entry * EXTENT_ENTRY_BYTES;
            let truncated = || FsMetaError::BadExtentNode {
                reason: "truncated",
            };
            if header.depth > 0 {
                let child = u64::from(le32(node, at + 4).ok_or_else(truncated)?)
                    | (u64::from(le16(node, at + 8).ok_or_else(truncated)?) << 32);
                let child_node = self.read_mapping_block(child, MetadataKind::ExtentNode)?;
                self.walk_extent_node(&child_node, Some(header.depth - 1))?;
            } else {
                let raw_length = le16(node, at + 4).ok_or_else(truncated)?;
                let length = if raw_length > EXTENT_INITIALISED_LENGTH_MAX {
                    raw_length - EXTENT_INITIALISED_LENGTH_MAX
                } else {
                    raw_length
                };
                if length == 0 {
                    return Err(FsMetaError::BadExtentNode {
                        reason: "empty extent",
                    });
                }
                let start = u64::from(le32(node, at + 8).ok_or_else(truncated)?)
                    | (u64::from(le16(node, at + 6).ok_or_else(truncated)?) << 32);
                self.add_data(start, u64::from(length))?;
            }
        }
        Ok(())
    }

    /// Walks an ext2/3 block map: 12 direct pointers, then single, double and triple
    /// indirect blocks, up to the `blocks_needed` logical blocks the inode's size covers.
    fn walk_block_map(&mut self, block_map: &[u8], blocks_needed: u64) -> Result<(), FsMetaError> {
        let mut logical = 0u64;
        for slot in 0..DIRECT_BLOCKS + 3 {
            if logical >= blocks_needed {
                break;
            }
            let pointer = u64::from(le32(block_map, slot * 4).unwrap_or(0));
            if slot < DIRECT_BLOCKS {
                if pointer != 0 {
                    self.add_data(pointer, 1)?;
                }
                logical += 1;
            } else {
                let level = (slot - DIRECT_BLOCKS + 1) as u32;
                self.walk_indirect(pointer, level, &mut logical, blocks_needed)?;
            }
        }
        Ok(())
    }

    fn walk_indirect(
        &mut self,
        pointer: u64,
        level: u32,
        logical: &mut u64,
        blocks_needed: u64,
    ) -> Result<(), FsMetaError> {
        assert!((1..=3).contains(&level));
        let pointers_per_block = u64::from(self.superblock.block_bytes() / 4);
        if pointer == 0 {
            // A hole: skip the logical blocks this pointer would have mapped.
            *logical = logical.saturating_add(pointers_per_block.saturating_pow(level));
            return Ok(());
        }
        let block = self.read_mapping_block(pointer, MetadataKind::IndirectBlock)?;
        for entry in block.chunks_exact(4) {
            if *logical >= blocks_needed {
                break;
            }
            let child = u64::from(u32::from_le_bytes([entry[0], entry[1], entry[2], entry[3]]));
            if level == 1 {
                if child != 0 {
                    self.add_data(child, 1)?;
                }
                *logical += 1;
            } else {
                self.walk_indirect(child, level - 1, logical, blocks_needed)?;
            }
        }
        Ok(())
    }
}

/// The fields of an extent-tree node header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ExtentHeader {
    pub(crate) entries: u16,
    pub(crate) capacity: u16,
    pub(crate) depth: u16,
}

/// Parses the header of the extent node in `node` (60 bytes in an inode, or a whole block)
/// and checks magic, `entries <= capacity` and that `capacity` entries fit in the node.
pub(crate) fn parse_extent_header(node: &[u8]) -> Option<ExtentHeader> {
    if le16(node, 0)? != EXTENT_MAGIC {
        return None;
    }
    let header = ExtentHeader {
        entries: le16(node, 2)?,
        capacity: le16(node, 4)?,
        depth: le16(node, 6)?,
    };
    let fits = EXTENT_HEADER_BYTES + usize::from(header.capacity) * EXTENT_ENTRY_BYTES;
    if header.entries > header.capacity || fits > node.len() {
        return None;
    }
    Some(header)
}
