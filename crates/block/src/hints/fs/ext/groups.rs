//! Group descriptors and the fixed structures of each block group: superblock copies,
//! descriptor blocks (classic or `meta_bg`), reserved descriptor blocks, bitmaps, inode tables.

use super::superblock::ExtSuperblock;
use crate::hints::fs::builder::MapBuilder;
use crate::hints::fs::layout::MetadataKind;
use crate::hints::fs::{read_at, FsMetaError, ReadAt};
use onecopy_core::bytes::le32;

/// Most bytes of descriptor blocks read in one call to the reader.
const DESCRIPTOR_READ_BYTES_MAX: usize = 256 * 1024;

/// Where one group's bitmaps and inode table are, as its descriptor records them.
///
/// The descriptor's flags (INODE_UNINIT, BLOCK_UNINIT, ITABLE_ZEROED) are not kept: an
/// uninitialised group still owns its bitmaps and inode table (mke2fs allocates them and
/// dumpe2fs lists them), so the flags do not change the map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GroupDescriptor {
    pub(crate) block_bitmap: u64,
    pub(crate) inode_bitmap: u64,
    pub(crate) inode_table: u64,
}

/// The block that holds descriptor block `index` (the primary copy).
fn descriptor_block_location(superblock: &ExtSuperblock, index: u64) -> u64 {
    if !superblock.has_meta_bg() || index < u64::from(superblock.first_meta_bg) {
        superblock.superblock_block(0) + 1 + index
    } else {
        let group = index * superblock.descriptors_per_block();
        superblock.superblock_block(group) + u64::from(superblock.has_superblock(group))
    }
}

/// Reads every group descriptor through `read`, batching descriptor blocks that are
/// contiguous, and checks that each structure it names lies inside the file system.
pub(crate) fn read_descriptors(
    superblock: &ExtSuperblock,
    read: &mut ReadAt<'_>,
) -> Result<Vec<GroupDescriptor>, FsMetaError> {
    let groups_count = superblock.groups_count();
    let block_bytes = u64::from(superblock.block_bytes());
    let batch_blocks_max = (DESCRIPTOR_READ_BYTES_MAX as u64 / block_bytes).max(1);
    let descriptor_blocks = superblock.descriptor_blocks();
    let mut descriptors = Vec::with_capacity(usize::try_from(groups_count).unwrap_or(0));
    let mut buffer = Vec::new();
    let mut index = 0;
    while index < descriptor_blocks {
        let first_location = descriptor_block_location(superblock, index);
        let mut batch_blocks = 1;
        while index + batch_blocks < descriptor_blocks
            && batch_blocks < batch_blocks_max
            && descriptor_block_location(superblock, index + batch_blocks)
                == first_location + batch_blocks
        {
            batch_blocks += 1;
        }
        if first_location + batch_blocks > superblock.blocks_count {
            return Err(FsMetaError::OutsideFileSystem {
                kind: MetadataKind::GroupDescriptors,
                block: first_location,
                block_count: batch_blocks,
                blocks_count: superblock.blocks_count,
            });
        }
        // At most DESCRIPTOR_READ_BYTES_MAX bytes, or one block of at most 64 KiB.
        buffer.resize((batch_blocks * block_bytes) as usize, 0);
        read_at(read, first_location * block_bytes, &mut buffer)?;
        let groups_in_batch = (groups_count - descriptors.len() as u64)
            .min(batch_blocks * superblock.descriptors_per_block());
        for (slot, bytes) in buffer
            .chunks_exact(usize::from(superblock.descriptor_bytes))
            .take(groups_in_batch as usize)
            .enumerate()
        {
            let group = descriptors.len() as u64;
            debug_assert_eq!(
                group,
                index * superblock.descriptors_per_block() + slot as u64
            );
            descriptors.push(parse_descriptor(superblock, group, bytes)?);
        }
        index += batch_blocks;
    }
    assert_eq!(descriptors.len() as u64, groups_count);
    Ok(descriptors)
}

fn parse_descriptor(
    superblock: &ExtSuperblock,
    group: u64,
    bytes: &[u8],
) -> Result<GroupDescriptor, FsMetaError> {
    let truncated = || FsMetaError::Truncated {
        what: "group descriptor",
    };
    let wide = superblock.is_64bit() && superblock.descriptor_bytes >= 64;
    let location = |low: usize, high: usize| -> Option<u64> {
        let high = if wide { le32(bytes, high)? } else { 0 };
        Some(u64::from(le32(bytes, low)?) | (u64::from(high) << 32))
    };
    let descriptor = GroupDescriptor {
        block_bitmap: location(0x00, 0x20).ok_or_else(truncated)?,
        inode_bitmap: location(0x04, 0x24).ok_or_else(truncated)?,
        inode_table: location(0x08, 0x28).ok_or_else(truncated)?,
    };
    let first_data_block = u64::from(superblock.first_data_block);
    let inside = |block: u64, count: u64| {
        block >= first_data_block
            && block
                .checked_add(count)
                .is_some_and(|end| end <= superblock.blocks_count)
    };
    if !inside(descriptor.block_bitmap, 1) {
        return Err(FsMetaError::BadDescriptor {
            group,
            reason: "block bitmap outside the file system",
        });
    }
    if !inside(descriptor.inode_bitmap, 1) {
        return Err(FsMetaError::BadDescriptor {
            group,
            reason: "inode bitmap outside the file system",
        });
    }
    if !inside(descriptor.inode_table, superblock.inode_table_blocks()) {
        return Err(FsMetaError::BadDescriptor {
            group,
            reason: "inode table outside the file system",
        });
    }
    Ok(descriptor)
}

/// Records every group's superblock copy, descriptor blocks, reserved descriptor blocks,
/// bitmaps and inode table.
pub(crate) fn add_group_structures(
    superblock: &ExtSuperblock,
    descriptors: &[GroupDescriptor],
    builder: &mut MapBuilder,
) -> Result<(), FsMetaError> {
    let descriptors_per_block = superblock.descriptors_per_block();
    // Outside meta_bg every superblock copy is followed by the whole descriptor table and the
    // reserved descriptor blocks; with meta_bg only the first `first_meta_bg` descriptor
    // blocks keep that classic placement (in the groups of the first `first_meta_bg` meta
    // groups). The reserved blocks follow them there too, as the kernel counts them
    // (`ext4_num_base_meta_blocks`); mke2fs refuses resize_inode with meta_bg, so the count
    // is zero unless a resize converted the file system.
    let classic_descriptor_blocks = if superblock.has_meta_bg() {
        u64::from(superblock.first_meta_bg)
    } else {
        superblock.descriptor_blocks()
    };
    let inode_table_blocks = superblock.inode_table_blocks();
    for (group, descriptor) in (0u64..).zip(descriptors) {
        let has_superblock = superblock.has_superblock(group);
        let base = superblock.superblock_block(group);
        if has_superblock {
            builder.add_blocks(base, 1, MetadataKind::Superblock)?;
        }
        let meta_group = group / descriptors_per_block;
        if !superblock.has_meta_bg() || meta_group < u64::from(superblock.first_meta_bg) {
            if has_superblock {
                builder.add_blocks(
                    base + 1,
                    classic_descriptor_blocks,
                    MetadataKind::GroupDescriptors,
                )?;
                builder.add_blocks(
                    base + 1 + classic_descriptor_blocks,
                    u64::from(superblock.reserved_gdt_blocks),
                    MetadataKind::ReservedGroupDescriptors,
                )?;
            }
        } else {
            // A meta group's descriptor block sits in its first, second and last group.
            let position = group % descriptors_per_block;
            if position == 0 || position == 1 || position == descriptors_per_block - 1 {
                builder.add_blocks(
                    base + u64::from(has_superblock),
                    1,
                    MetadataKind::GroupDescriptors,
                )?;
            }
        }
        builder.add_blocks(descriptor.block_bitmap, 1, MetadataKind::BlockBitmap)?;
        builder.add_blocks(descriptor.inode_bitmap, 1, MetadataKind::InodeBitmap)?;
        builder.add_blocks(
            descriptor.inode_table,
            inode_table_blocks,
            MetadataKind::InodeTable,
        )?;
    }
    Ok(())
}
