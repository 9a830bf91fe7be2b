//! ext2, ext3 and ext4: the metadata map from the superblock, the group descriptors and the
//! journal inode.

pub(crate) mod groups;
pub(crate) mod journal;
pub(crate) mod superblock;

use super::builder::MapBuilder;
use super::detect::{LayoutFields, LayoutKey};
use super::layout::{ClassifyBounds, FileSystemKind, JournalPlacement, MetadataKind};
use super::map::MetadataMap;
use super::{FsMetaError, ReadAt};
use superblock::ExtSuperblock;

/// Derives the metadata map of the ext file system whose checked superblock is `superblock`,
/// in a volume of `volume_bytes` bytes.
pub(crate) fn derive(
    superblock: ExtSuperblock,
    volume_bytes: u64,
    read: &mut ReadAt<'_>,
) -> Result<MetadataMap, FsMetaError> {
    let block_bytes = superblock.block_bytes();
    let file_system_bytes = superblock
        .blocks_count
        .checked_mul(u64::from(block_bytes))
        .filter(|&bytes| bytes <= volume_bytes)
        .ok_or(FsMetaError::VolumeTooSmall {
            blocks_count: superblock.blocks_count,
            block_bytes,
            volume_bytes,
        })?;
    let file_system = superblock.file_system_kind();
    let mut builder = MapBuilder::new(block_bytes, superblock.blocks_count);
    let (journal, bounds) = if file_system == FileSystemKind::ExtJournalDevice {
        builder.add_blocks(0, superblock.blocks_count, MetadataKind::Journal)?;
        let placement = JournalPlacement::Internal {
            journal_bytes: file_system_bytes,
        };
        (placement, None)
    } else {
        let descriptors = groups::read_descriptors(&superblock, read)?;
        groups::add_group_structures(&superblock, &descriptors, &mut builder)?;
        if superblock.mmp_block != 0 {
            builder.add_blocks(superblock.mmp_block, 1, MetadataKind::MultiMountProtection)?;
        }
        let placement = journal::add_journal(&superblock, &descriptors, read, &mut builder)?;
        let bounds = ClassifyBounds {
            block_bytes,
            blocks_count: superblock.blocks_count,
            inodes_count: superblock.inodes_count,
        };
        (placement, Some(bounds))
    };
    Ok(MetadataMap {
        file_system,
        block_bytes,
        file_system_bytes,
        layout: LayoutKey(LayoutFields::Ext(superblock)),
        journal,
        ranges: builder.finish(),
        bounds,
    })
}
