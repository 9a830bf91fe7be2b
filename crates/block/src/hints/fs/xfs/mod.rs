//! xfs: the internal log and the allocation-group headers, from the primary superblock.
//!
//! Terms: an *allocation group* (AG) is a run of `agblocks` blocks; a file-system block
//! number ("fsblock") packs an AG number above `agblklog` bits and a block inside the AG
//! below them, so fsblock `f` lies at byte
//! `((f >> agblklog) * agblocks + (f & ((1 << agblklog) - 1))) * blocksize`.
//! All xfs fields are big-endian.

pub(crate) mod superblock;

use super::builder::MapBuilder;
use super::detect::{LayoutFields, LayoutKey};
use super::layout::{FileSystemKind, JournalPlacement, MetadataKind};
use super::map::MetadataMap;
use super::FsMetaError;
use superblock::{XfsSuperblock, AG_HEADER_SECTORS};

/// Derives the metadata map of the xfs file system whose checked superblock is `superblock`.
pub(crate) fn derive(
    superblock: XfsSuperblock,
    volume_bytes: u64,
) -> Result<MetadataMap, FsMetaError> {
    let block_bytes = superblock.block_bytes;
    let file_system_bytes = superblock
        .data_blocks
        .checked_mul(u64::from(block_bytes))
        .filter(|&bytes| bytes <= volume_bytes)
        .ok_or(FsMetaError::VolumeTooSmall {
            blocks_count: superblock.data_blocks,
            block_bytes,
            volume_bytes,
        })?;
    let mut builder = MapBuilder::new(block_bytes, superblock.data_blocks);
    let header_blocks =
        (AG_HEADER_SECTORS * u64::from(superblock.sector_bytes)).div_ceil(u64::from(block_bytes));
    for ag in 0..u64::from(superblock.ag_count) {
        builder.add_blocks(
            ag * u64::from(superblock.ag_blocks),
            header_blocks,
            MetadataKind::XfsAllocationGroupHeaders,
        )?;
    }
    let journal = if superblock.log_start == 0 {
        JournalPlacement::External
    } else {
        let log_blocks = u64::from(superblock.log_blocks);
        builder.add_blocks(
            superblock.linear_block(superblock.log_start),
            log_blocks,
            MetadataKind::XfsLog,
        )?;
        JournalPlacement::Internal {
            journal_bytes: log_blocks * u64::from(block_bytes),
        }
    };
    Ok(MetadataMap {
        file_system: FileSystemKind::Xfs,
        block_bytes,
        file_system_bytes,
        layout: LayoutKey(LayoutFields::Xfs(superblock)),
        journal,
        ranges: builder.finish(),
        bounds: None,
    })
}

#[cfg(test)]
mod tests {
    use super::superblock::{XFS_MAGIC, XFS_SUPERBLOCK_BYTES};
    use super::*;

    /// A consistent superblock: 4 KiB blocks, 5 AGs of 30720 blocks, log in AG 2.
    fn superblock_bytes() -> Vec<u8> {
        let mut bytes = vec![0u8; XFS_SUPERBLOCK_BYTES];
        bytes[0..4].copy_from_slice(XFS_MAGIC);
        bytes[4..8].copy_from_slice(&4096u32.to_be_bytes());
        bytes[8..16].copy_from_slice(&153_600u64.to_be_bytes());
        bytes[48..56].copy_from_slice(&((2u64 << 15) | 6).to_be_bytes());
        bytes[84..88].copy_from_slice(&30_720u32.to_be_bytes());
        bytes[88..92].copy_from_slice(&5u32.to_be_bytes());
        bytes[96..100].copy_from_slice(&16_384u32.to_be_bytes());
        bytes[102..104].copy_from_slice(&512u16.to_be_bytes());
        bytes[120] = 12;
        bytes[121] = 9;
        bytes[124] = 15;
        bytes
    }

    // Goal: the log start is split at agblklog and rebased on agblocks (not 1 << agblklog).
    #[test]
    fn log_start_is_split_by_allocation_group() {
        let superblock = XfsSuperblock::parse(&superblock_bytes()).unwrap();
        assert_eq!(
            superblock.linear_block(superblock.log_start),
            2 * 30_720 + 6
        );
        let map = derive(superblock, 1 << 30).unwrap();
        let log = map
            .ranges()
            .iter()
            .find(|r| r.kind == MetadataKind::XfsLog)
            .unwrap();
        assert_eq!(
            (log.start, log.end),
            (251_682_816, 251_682_816 + 16_384 * 4096)
        );
        assert_eq!(map.ranges().len(), 6);
    }

    // Goal: each inconsistency the parser checks is refused; method: one field broken at a time.
    #[test]
    fn inconsistent_superblocks_are_refused() {
        let breakages: [(usize, &[u8]); 7] = [
            (120, &[11]),                            // blocklog does not match
            (124, &[16]),                            // agblklog does not match
            (88, &0u32.to_be_bytes()),               // no AGs
            (8, &200_000u64.to_be_bytes()),          // more blocks than the AGs hold
            (48, &((5u64 << 15) | 6).to_be_bytes()), // log in a missing AG
            (96, &30_715u32.to_be_bytes()),          // log beyond its AG
            (102, &1000u16.to_be_bytes()),           // sector size not a power of two
        ];
        for (offset, value) in breakages {
            let mut bytes = superblock_bytes();
            bytes[offset..offset + value.len()].copy_from_slice(value);
            assert!(XfsSuperblock::parse(&bytes).is_err(), "offset {offset}");
        }
        assert!(derive(XfsSuperblock::parse(&superblock_bytes()).unwrap(), 1 << 20).is_err());
    }
}
