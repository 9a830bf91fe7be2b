//! The xfs primary superblock: the fields the layout depends on, checked for consistency.

use crate::hints::fs::ext::superblock::GROUPS_MAX;
use crate::hints::fs::FsMetaError;
use onecopy_core::bytes::{be16, be32, be64};

/// Bytes of the xfs superblock this module reads (the first sector).
pub(crate) const XFS_SUPERBLOCK_BYTES: usize = 512;
pub(crate) const XFS_MAGIC: &[u8; 4] = b"XFSB";
const BLOCK_BYTES_MIN: u32 = 512;
const BLOCK_BYTES_MAX: u32 = 65536;
const SECTOR_BYTES_MIN: u16 = 512;
const SECTOR_BYTES_MAX: u16 = 32768;
/// Each AG starts with four sectors: superblock copy, AGF, AGI, AGFL.
pub(crate) const AG_HEADER_SECTORS: u64 = 4;

/// The layout-relevant fields of an xfs superblock, checked for consistency.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct XfsSuperblock {
    pub(crate) block_bytes: u32,
    pub(crate) data_blocks: u64,
    pub(crate) log_start: u64,
    pub(crate) log_blocks: u32,
    pub(crate) ag_blocks: u32,
    pub(crate) ag_count: u32,
    pub(crate) sector_bytes: u16,
    pub(crate) ag_block_log: u8,
}

fn bad(reason: &'static str) -> FsMetaError {
    FsMetaError::BadSuperblock {
        file_system: "xfs",
        reason,
    }
}

impl XfsSuperblock {
    /// Parses and checks the first sector of an xfs volume.
    pub(crate) fn parse(bytes: &[u8]) -> Result<XfsSuperblock, FsMetaError> {
        let truncated = || FsMetaError::Truncated {
            what: "xfs superblock",
        };
        if bytes.len() < XFS_SUPERBLOCK_BYTES {
            return Err(truncated());
        }
        if &bytes[0..4] != XFS_MAGIC {
            return Err(bad("magic is not XFSB"));
        }
        let superblock = XfsSuperblock {
            block_bytes: be32(bytes, 4).ok_or_else(truncated)?,
            data_blocks: be64(bytes, 8).ok_or_else(truncated)?,
            log_start: be64(bytes, 48).ok_or_else(truncated)?,
            ag_blocks: be32(bytes, 84).ok_or_else(truncated)?,
            ag_count: be32(bytes, 88).ok_or_else(truncated)?,
            log_blocks: be32(bytes, 96).ok_or_else(truncated)?,
            sector_bytes: be16(bytes, 102).ok_or_else(truncated)?,
            ag_block_log: bytes[124],
        };
        let block_log = bytes[120];
        let sector_log = bytes[121];
        let block_bytes = superblock.block_bytes;
        if !block_bytes.is_power_of_two()
            || !(BLOCK_BYTES_MIN..=BLOCK_BYTES_MAX).contains(&block_bytes)
            || u32::from(block_log) != block_bytes.trailing_zeros()
        {
            return Err(bad(
                "block size not a power of two in 512..=65536 matching blocklog",
            ));
        }
        let sector_bytes = superblock.sector_bytes;
        if !sector_bytes.is_power_of_two()
            || !(SECTOR_BYTES_MIN..=SECTOR_BYTES_MAX).contains(&sector_bytes)
            || u32::from(sector_log) != sector_bytes.trailing_zeros()
            || u32::from(sector_bytes) > block_bytes
        {
            return Err(bad("sector size not a power of two in 512..=block size"));
        }
        if superblock.ag_blocks == 0 || superblock.ag_count == 0 {
            return Err(bad("allocation group size or count is zero"));
        }
        if u64::from(superblock.ag_count) > GROUPS_MAX {
            return Err(FsMetaError::LimitExceeded {
                limit: "GROUPS_MAX",
                value: u64::from(superblock.ag_count),
                maximum: GROUPS_MAX,
            });
        }
        // agblklog is the number of bits needed for an AG-relative block number.
        let expected_log = 32 - (superblock.ag_blocks - 1).leading_zeros();
        if u32::from(superblock.ag_block_log) != expected_log {
            return Err(bad("agblklog does not match agblocks"));
        }
        let ag_blocks = u64::from(superblock.ag_blocks);
        let ag_count = u64::from(superblock.ag_count);
        if superblock.data_blocks <= (ag_count - 1) * ag_blocks
            || superblock.data_blocks > ag_count * ag_blocks
        {
            return Err(bad("data block count does not match the allocation groups"));
        }
        let header_bytes = AG_HEADER_SECTORS * u64::from(sector_bytes);
        if superblock.last_ag_blocks() * u64::from(block_bytes) < header_bytes {
            return Err(bad("last allocation group smaller than its headers"));
        }
        if superblock.log_start != 0 {
            let (ag, ag_block) = superblock.split(superblock.log_start);
            if ag >= ag_count
                || superblock.log_blocks == 0
                || ag_block + u64::from(superblock.log_blocks) > superblock.ag_length(ag)
            {
                return Err(bad("internal log does not fit in its allocation group"));
            }
        }
        Ok(superblock)
    }

    /// Splits fsblock `block` into (AG number, block inside the AG).
    fn split(&self, block: u64) -> (u64, u64) {
        let shift = u32::from(self.ag_block_log);
        (block >> shift, block & ((1u64 << shift) - 1))
    }

    fn last_ag_blocks(&self) -> u64 {
        self.data_blocks - u64::from(self.ag_count - 1) * u64::from(self.ag_blocks)
    }

    fn ag_length(&self, ag: u64) -> u64 {
        if ag + 1 == u64::from(self.ag_count) {
            self.last_ag_blocks()
        } else {
            u64::from(self.ag_blocks)
        }
    }

    /// Linear block number (from the volume's start) of fsblock `block`.
    pub(crate) fn linear_block(&self, block: u64) -> u64 {
        let (ag, ag_block) = self.split(block);
        ag * u64::from(self.ag_blocks) + ag_block
    }
}
