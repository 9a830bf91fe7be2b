//! Recognising ext metadata blocks by content, for blocks outside the known metadata ranges.
//!
//! Recognised structures, each with checks strict enough that ordinary file contents do not
//! pass (the magic number alone would not do):
//! - *extent node*: header magic 0xF30A, `max` equal to what a whole block holds, `entries` in
//!   `1..=max`, depth at most 5, then index entries with increasing logical blocks and
//!   non-zero children, or leaf extents that are non-empty, non-zero, increasing and
//!   non-overlapping;
//! - *dx root*: the "." and ".." records of an indexed directory, followed by the
//!   `dx_root_info` (zero reserved word, known hash version, info length 8, at most 3 levels)
//!   and a count/limit pair whose limit is what the block holds (with or without the 8-byte
//!   checksum tail) and whose hashes increase;
//! - *dx node*: an empty record spanning the block, then a count/limit pair as above;
//! - *directory block*: a chain of records whose lengths are multiples of 4, at least 12,
//!   large enough for their names, ending exactly at the block's end (optionally with the
//!   12-byte `metadata_csum` tail, file type 0xDE), with live entries carrying non-empty
//!   names without NUL or '/', file types at most 7, and at least one live entry;
//! - *extended-attribute block*: magic 0xEA020000, one block, a non-zero reference count, and
//!   an entry table that ends with a zero word inside the block.
//!
//! Not recognised: ext2/3 indirect blocks (arrays of block numbers look like ordinary binary
//! data), inline-data and encrypted directory names, xfs btree blocks.

use super::ext::journal::{
    parse_extent_header, EXTENT_DEPTH_MAX, EXTENT_ENTRY_BYTES, EXTENT_HEADER_BYTES,
    EXTENT_INITIALISED_LENGTH_MAX,
};
use super::layout::{ClassifyBounds, MetadataKind};
use onecopy_core::bytes::{le16, le32};

/// Smallest and largest ext block sizes.
const BLOCK_BYTES_MIN: usize = 1024;
const BLOCK_BYTES_MAX: usize = 65536;
const DIRECTORY_RECORD_HEADER_BYTES: usize = 8;
/// Smallest record the kernel accepts (`EXT4_DIR_REC_LEN(1)`).
const DIRECTORY_RECORD_BYTES_MIN: usize = 12;
const DIRECTORY_TAIL_BYTES: usize = 12;
const DIRECTORY_TAIL_FILE_TYPE: u8 = 0xDE;
const FILE_TYPE_MAX: u8 = 7;
/// The disk encoding of a 64 KiB record length (`EXT4_MAX_REC_LEN`).
const RECORD_LENGTH_64K_ENCODED: u16 = 65535;
const DX_TAIL_BYTES: usize = 8;
const DX_ENTRY_BYTES: usize = 8;
const DX_ROOT_INFO_OFFSET: usize = 24;
const DX_ROOT_INFO_BYTES: u8 = 8;
const DX_ROOT_COUNT_LIMIT_OFFSET: usize = 32;
const DX_NODE_COUNT_LIMIT_OFFSET: usize = 8;
/// Hash versions ext4 defines: legacy, half-MD4, TEA, their unsigned forms, SipHash.
const DX_HASH_VERSION_MAX: u8 = 6;
/// Most index levels below the root (3 with `largedir`).
const DX_INDIRECT_LEVELS_MAX: u8 = 3;
const XATTR_MAGIC: u32 = 0xEA02_0000;
const XATTR_HEADER_BYTES: usize = 32;
const XATTR_ENTRY_HEADER_BYTES: usize = 16;

/// Classifies one file-system block by content: `Some(kind)` when it is an ext extent-tree
/// node, directory index block, directory block or extended-attribute block, `None`
/// otherwise (including when `block.len()` is not a power of two in 1024..=65536).
///
/// `block` must be exactly one block of the file system, aligned to the block size; the
/// directory checks depend on the block size. Cheap: one pass over at most the block, no
/// allocation; never panics. Without file-system context it cannot check block and inode
/// numbers against the file system's size; [`super::MetadataMap::classify_block`] does.
pub fn classify_block(block: &[u8]) -> Option<MetadataKind> {
    classify_with_bounds(block, None)
}

pub(crate) fn classify_with_bounds(
    block: &[u8],
    bounds: Option<&ClassifyBounds>,
) -> Option<MetadataKind> {
    let block_bytes = block.len();
    if !block_bytes.is_power_of_two() || !(BLOCK_BYTES_MIN..=BLOCK_BYTES_MAX).contains(&block_bytes)
    {
        return None;
    }
    if bounds.is_some_and(|bounds| bounds.block_bytes as usize != block_bytes) {
        return None;
    }
    if is_extent_node(block, bounds) {
        return Some(MetadataKind::ExtentNode);
    }
    if is_extended_attribute_block(block) {
        return Some(MetadataKind::ExtendedAttributes);
    }
    if is_dx_root(block, bounds) || is_dx_node(block) {
        return Some(MetadataKind::DirectoryIndex);
    }
    if is_directory_block(block, bounds) {
        return Some(MetadataKind::Directory);
    }
    None
}

fn is_extent_node(block: &[u8], bounds: Option<&ClassifyBounds>) -> bool {
    let Some(header) = parse_extent_header(block) else {
        return false;
    };
    let capacity = (block.len() - EXTENT_HEADER_BYTES) / EXTENT_ENTRY_BYTES;
    if usize::from(header.capacity) != capacity
        || header.entries == 0
        || header.depth > EXTENT_DEPTH_MAX
    {
        return false;
    }
    let blocks_count = bounds.map_or(u64::MAX, |bounds| bounds.blocks_count);
    // The first logical block the next entry may start at.
    let mut next_logical = 0u64;
    for entry in 0..usize::from(header.entries) {
        let at = EXTENT_HEADER_BYTES + entry * EXTENT_ENTRY_BYTES;
        let Some(logical) = le32(block, at).map(u64::from) else {
            return false;
        };
        if logical < next_logical {
            return false;
        }
        if header.depth > 0 {
            // Index entry: ei_block (u32), ei_leaf_lo (u32), ei_leaf_hi (u16), unused (u16).
            let (Some(low), Some(high)) = (le32(block, at + 4), le16(block, at + 8)) else {
                return false;
            };
            let child = u64::from(low) | (u64::from(high) << 32);
            if child == 0 || child >= blocks_count {
                return false;
            }
            next_logical = logical + 1;
        } else {
            // Leaf entry: ee_block (u32), ee_len (u16), ee_start_hi (u16), ee_start_lo (u32).
            let (Some(raw_length), Some(high), Some(low)) = (
                le16(block, at + 4),
                le16(block, at + 6),
                le32(block, at + 8),
            ) else {
                return false;
            };
            let length = if raw_length > EXTENT_INITIALISED_LENGTH_MAX {
                raw_length - EXTENT_INITIALISED_LENGTH_MAX
            } else {
                raw_length
            };
            let start = u64::from(low) | (u64::from(high) << 32);
            if length == 0 || start == 0 || start + u64::from(length) > blocks_count {
                return false;
            }
            next_logical = logical + u64::from(length);
            if next_logical > 1 << 32 {
                return false;
            }
        }
    }
    true
}

/// Decodes a directory record length (`ext4_rec_len_from_disk`).
fn record_length(raw: u16, block_bytes: usize) -> usize {
    if block_bytes < BLOCK_BYTES_MAX {
        usize::from(raw)
    } else if raw == RECORD_LENGTH_64K_ENCODED || raw == 0 {
        block_bytes
    } else {
        usize::from(raw & 0xFFFC) | (usize::from(raw & 3) << 16)
    }
}

/// Bytes a record with a name of `name_bytes` bytes needs (`EXT4_DIR_REC_LEN`).
fn record_bytes_needed(name_bytes: usize) -> usize {
    (DIRECTORY_RECORD_HEADER_BYTES + name_bytes + 3) & !3
}

fn is_directory_tail(block: &[u8], at: usize) -> bool {
    at + DIRECTORY_TAIL_BYTES == block.len()
        && le32(block, at) == Some(0)
        && le16(block, at + 4) == Some(DIRECTORY_TAIL_BYTES as u16)
        && block.get(at + 6) == Some(&0)
        && block.get(at + 7) == Some(&DIRECTORY_TAIL_FILE_TYPE)
}

fn is_directory_block(block: &[u8], bounds: Option<&ClassifyBounds>) -> bool {
    let block_bytes = block.len();
    let inodes_count = bounds.map_or(u32::MAX, |bounds| bounds.inodes_count);
    let mut at = 0usize;
    let mut live_entries = 0usize;
    while at < block_bytes {
        if is_directory_tail(block, at) {
            break;
        }
        let (Some(inode), Some(raw_length)) = (le32(block, at), le16(block, at + 4)) else {
            return false;
        };
        let name_bytes = usize::from(block[at + 6]);
        let file_type = block[at + 7];
        let length = record_length(raw_length, block_bytes);
        if length < DIRECTORY_RECORD_BYTES_MIN
            || length & 3 != 0
            || length < record_bytes_needed(name_bytes)
            || at + length > block_bytes
        {
            return false;
        }
        if inode != 0 {
            if inode > inodes_count || name_bytes == 0 || file_type > FILE_TYPE_MAX {
                return false;
            }
            let name = &block[at + DIRECTORY_RECORD_HEADER_BYTES..][..name_bytes];
            if name.iter().any(|&byte| byte == 0 || byte == b'/') {
                return false;
            }
            live_entries += 1;
        }
        at += length;
    }
    live_entries > 0
}

/// Whether the count/limit pair at `at` and the entries after it form a valid dx index for a
/// block whose entries may start at `at` and run to the block's end (less a checksum tail).
fn is_dx_entries(block: &[u8], at: usize) -> bool {
    let (Some(limit), Some(count)) = (le16(block, at), le16(block, at + 2)) else {
        return false;
    };
    let room = (block.len() - at) / DX_ENTRY_BYTES;
    let room_with_tail = (block.len() - at - DX_TAIL_BYTES) / DX_ENTRY_BYTES;
    let limit = usize::from(limit);
    let count = usize::from(count);
    if (limit != room && limit != room_with_tail) || count == 0 || count > limit {
        return false;
    }
    // Entry 0 has no hash (its slot holds count and limit); the others are sorted by hash.
    let mut previous_hash = 0u32;
    for entry in 1..count {
        let Some(hash) = le32(block, at + entry * DX_ENTRY_BYTES) else {
            return false;
        };
        if hash < previous_hash {
            return false;
        }
        previous_hash = hash;
    }
    true
}

fn is_dx_root(block: &[u8], bounds: Option<&ClassifyBounds>) -> bool {
    let inodes_count = bounds.map_or(u32::MAX, |bounds| bounds.inodes_count);
    let dot_inode = le32(block, 0).unwrap_or(0);
    let dot_dot_inode = le32(block, 12).unwrap_or(0);
    let dot_ok = dot_inode != 0
        && dot_inode <= inodes_count
        && le16(block, 4) == Some(12)
        && block[6] == 1
        && block[8] == b'.';
    let dot_dot_length = le16(block, 16).map(|raw| record_length(raw, block.len()));
    let dot_dot_ok = dot_dot_inode != 0
        && dot_dot_inode <= inodes_count
        && dot_dot_length == Some(block.len() - 12)
        && block[18] == 2
        && block[20] == b'.'
        && block[21] == b'.';
    let info = &block[DX_ROOT_INFO_OFFSET..DX_ROOT_INFO_OFFSET + 8];
    let info_ok = le32(info, 0) == Some(0)
        && info[4] <= DX_HASH_VERSION_MAX
        && info[5] == DX_ROOT_INFO_BYTES
        && info[6] <= DX_INDIRECT_LEVELS_MAX;
    dot_ok && dot_dot_ok && info_ok && is_dx_entries(block, DX_ROOT_COUNT_LIMIT_OFFSET)
}

fn is_dx_node(block: &[u8]) -> bool {
    let spans_block =
        le16(block, 4).map(|raw| record_length(raw, block.len())) == Some(block.len());
    le32(block, 0) == Some(0)
        && spans_block
        && block[6] == 0
        && block[7] == 0
        && is_dx_entries(block, DX_NODE_COUNT_LIMIT_OFFSET)
}

fn is_extended_attribute_block(block: &[u8]) -> bool {
    if le32(block, 0) != Some(XATTR_MAGIC)
        || le32(block, 4).is_none_or(|references| references == 0)
        || le32(block, 8) != Some(1)
    {
        return false;
    }
    let mut at = XATTR_HEADER_BYTES;
    loop {
        let Some(word) = le32(block, at) else {
            return false;
        };
        if word == 0 {
            return true;
        }
        let name_bytes = usize::from(block[at]);
        let (Some(value_offset), Some(value_inode), Some(value_bytes)) = (
            le16(block, at + 2),
            le32(block, at + 4),
            le32(block, at + 8),
        ) else {
            return false;
        };
        if name_bytes == 0 {
            return false;
        }
        if value_inode == 0 {
            let value_end = usize::from(value_offset).saturating_add(value_bytes as usize);
            if value_end > block.len() {
                return false;
            }
        }
        at += (XATTR_ENTRY_HEADER_BYTES + name_bytes + 3) & !3;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn directory_record(block: &mut [u8], at: usize, inode: u32, length: u16, name: &[u8]) {
        block[at..at + 4].copy_from_slice(&inode.to_le_bytes());
        block[at + 4..at + 6].copy_from_slice(&length.to_le_bytes());
        block[at + 6] = name.len() as u8;
        block[at + 7] = 1;
        block[at + 8..at + 8 + name.len()].copy_from_slice(name);
    }

    // Goal: a hand-built directory block is recognised, and breaking its chain in any of the
    // ways the checks cover makes it unrecognised.
    #[test]
    fn directory_chain_checks() {
        let mut block = vec![0u8; 1024];
        directory_record(&mut block, 0, 11, 20, b"hello.txt");
        directory_record(&mut block, 20, 12, 1004, b"b");
        assert_eq!(classify_block(&block), Some(MetadataKind::Directory));
        let mut short_chain = block.clone();
        short_chain[24..26].copy_from_slice(&1000u16.to_le_bytes());
        assert_eq!(classify_block(&short_chain), None);
        let mut slash = block.clone();
        slash[8] = b'/';
        assert_eq!(classify_block(&slash), None);
        let mut bad_type = block.clone();
        bad_type[7] = 9;
        assert_eq!(classify_block(&bad_type), None);
        let mut empty = vec![0u8; 1024];
        directory_record(&mut empty, 0, 0, 1024, b"");
        assert_eq!(classify_block(&empty), None);
        let bounds = ClassifyBounds {
            block_bytes: 1024,
            blocks_count: 1000,
            inodes_count: 11,
        };
        assert_eq!(classify_with_bounds(&block, Some(&bounds)), None);
    }

    // Goal: an extent leaf is recognised only with a consistent header and sorted extents.
    #[test]
    fn extent_leaf_checks() {
        let mut block = vec![0u8; 4096];
        block[0..2].copy_from_slice(&EXTENT_MAGIC_BYTES);
        block[2..4].copy_from_slice(&2u16.to_le_bytes());
        block[4..6].copy_from_slice(&340u16.to_le_bytes());
        for (slot, (logical, length, start)) in
            [(0u32, 8u16, 5000u32), (8, 4, 9000)].iter().enumerate()
        {
            let at = 12 + slot * 12;
            block[at..at + 4].copy_from_slice(&logical.to_le_bytes());
            block[at + 4..at + 6].copy_from_slice(&length.to_le_bytes());
            block[at + 8..at + 12].copy_from_slice(&start.to_le_bytes());
        }
        assert_eq!(classify_block(&block), Some(MetadataKind::ExtentNode));
        let mut overlapping = block.clone();
        overlapping[24..28].copy_from_slice(&7u32.to_le_bytes());
        assert_eq!(classify_block(&overlapping), None);
        let mut wrong_capacity = block.clone();
        wrong_capacity[4..6].copy_from_slice(&339u16.to_le_bytes());
        assert_eq!(classify_block(&wrong_capacity), None);
        assert_eq!(classify_block(&block[..2048]), None);
    }

    const EXTENT_MAGIC_BYTES: [u8; 2] = super::super::ext::journal::EXTENT_MAGIC.to_le_bytes();

    // Goal: zero blocks, blocks of one repeated byte and odd sizes are never metadata.
    #[test]
    fn uniform_blocks_are_not_metadata() {
        for byte in [0u8, 0xFF, b'a', 0x0A] {
            for size in [1024, 2048, 4096, 65536] {
                assert_eq!(classify_block(&vec![byte; size]), None);
            }
        }
        assert_eq!(classify_block(&[0u8; 512]), None);
        assert_eq!(classify_block(&[0u8; 3000]), None);
    }
}
