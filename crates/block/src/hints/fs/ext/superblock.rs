//! The ext2/3/4 superblock: parsing, sanity checks, and the group geometry it implies.
//!
//! Terms (from the ext4 on-disk format): a *block group* ("group") is a run of
//! `blocks_per_group` blocks starting at `first_data_block + group * blocks_per_group`; a
//! *group descriptor* records where a group's bitmaps and inode table are; a *meta group* is
//! the set of groups whose descriptors share one descriptor block (`meta_bg` feature).

use crate::hints::fs::layout::FileSystemKind;
use crate::hints::fs::FsMetaError;
use onecopy_core::bytes::{le16, le32, le64};

/// Volume offset of the primary ext superblock.
pub(crate) const EXT_SUPERBLOCK_OFFSET: u64 = 1024;
/// Size of the ext superblock structure.
pub(crate) const EXT_SUPERBLOCK_BYTES: usize = 1024;
const EXT_MAGIC: u16 = 0xEF53;

/// Most block groups a derivation accepts: 32 TiB with 4 KiB blocks. Bounds the descriptor
/// reads and the per-group work of one derivation.
pub const GROUPS_MAX: u64 = 1 << 18;

/// Largest block size ext4 defines (`s_log_block_size` at most 6).
const LOG_BLOCK_SIZE_MAX: u32 = 6;
/// Largest cluster-to-block ratio exponent the kernel accepts for bigalloc.
const LOG_CLUSTER_RATIO_MAX: u32 = 20;
const DESCRIPTOR_BYTES_32BIT: u16 = 32;
const DESCRIPTOR_BYTES_64BIT_MIN: u16 = 64;
const DESCRIPTOR_BYTES_MAX: u16 = 1024;
const INODE_BYTES_REVISION_0: u16 = 128;
const INODE_BYTES_MIN: u16 = 128;
const REVISION_DYNAMIC: u32 = 1;

pub(crate) const COMPAT_HAS_JOURNAL: u32 = 0x4;
pub(crate) const COMPAT_SPARSE_SUPER2: u32 = 0x200;
const INCOMPAT_FILETYPE: u32 = 0x2;
const INCOMPAT_RECOVER: u32 = 0x4;
pub(crate) const INCOMPAT_JOURNAL_DEV: u32 = 0x8;
pub(crate) const INCOMPAT_META_BG: u32 = 0x10;
pub(crate) const INCOMPAT_64BIT: u32 = 0x80;
pub(crate) const INCOMPAT_MMP: u32 = 0x100;
/// Every incompatible feature defined by e2fsprogs 1.47. An unknown one may change the layout,
/// so a superblock carrying it is refused.
const INCOMPAT_KNOWN: u32 = 0x0003_F7DF;
/// Incompatible features ext3 understands; any other makes the file system ext4.
const INCOMPAT_EXT3: u32 = INCOMPAT_FILETYPE | INCOMPAT_RECOVER | INCOMPAT_META_BG;
pub(crate) const RO_COMPAT_SPARSE_SUPER: u32 = 0x1;
const RO_COMPAT_LARGE_FILE: u32 = 0x2;
const RO_COMPAT_BTREE_DIR: u32 = 0x4;
pub(crate) const RO_COMPAT_BIGALLOC: u32 = 0x200;
const RO_COMPAT_ORPHAN_PRESENT: u32 = 0x1_0000;
/// Read-only-compatible features ext3 understands.
const RO_COMPAT_EXT3: u32 = RO_COMPAT_SPARSE_SUPER | RO_COMPAT_LARGE_FILE | RO_COMPAT_BTREE_DIR;

/// The layout-relevant fields of an ext superblock, checked for consistency. Fields that
/// change in normal operation are not kept (see [`crate::hints::fs::LayoutKey`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ExtSuperblock {
    pub(crate) inodes_count: u32,
    pub(crate) blocks_count: u64,
    pub(crate) first_data_block: u32,
    pub(crate) log_block_size: u32,
    pub(crate) log_cluster_ratio: u32,
    pub(crate) blocks_per_group: u32,
    pub(crate) inodes_per_group: u32,
    pub(crate) inode_bytes: u16,
    pub(crate) feature_compat: u32,
    /// Without the "needs recovery" flag, which a mount sets and an unmount clears.
    pub(crate) feature_incompat: u32,
    /// Without the "orphans present" flag, which changes in normal operation.
    pub(crate) feature_ro_compat: u32,
    pub(crate) reserved_gdt_blocks: u16,
    pub(crate) journal_uuid: [u8; 16],
    pub(crate) journal_inode: u32,
    pub(crate) journal_device: u32,
    pub(crate) descriptor_bytes: u16,
    pub(crate) first_meta_bg: u32,
    pub(crate) mmp_block: u64,
    pub(crate) backup_groups: [u32; 2],
}

fn field<T>(value: Option<T>) -> Result<T, FsMetaError> {
    value.ok_or(FsMetaError::Truncated {
        what: "ext superblock",
    })
}

fn bad(reason: &'static str) -> FsMetaError {
    FsMetaError::BadSuperblock {
        file_system: "ext",
        reason,
    }
}

impl ExtSuperblock {
    /// Parses and checks the 1024 superblock bytes (starting at volume byte 1024). Refuses a
    /// superblock whose geometry is inconsistent, too large for [`GROUPS_MAX`], or that uses
    /// an incompatible feature this module does not know.
    pub(crate) fn parse(bytes: &[u8]) -> Result<ExtSuperblock, FsMetaError> {
        if bytes.len() < EXT_SUPERBLOCK_BYTES {
            return Err(FsMetaError::Truncated {
                what: "ext superblock",
            });
        }
        if field(le16(bytes, 0x38))? != EXT_MAGIC {
            return Err(bad("magic is not 0xEF53"));
        }
        let revision = field(le32(bytes, 0x4C))?;
        if revision > REVISION_DYNAMIC {
            return Err(bad("revision level above 1"));
        }
        let dynamic = revision == REVISION_DYNAMIC;
        let feature_compat = if dynamic {
            field(le32(bytes, 0x5C))?
        } else {
            0
        };
        let feature_incompat = if dynamic {
            field(le32(bytes, 0x60))?
        } else {
            0
        };
        let feature_ro_compat = if dynamic {
            field(le32(bytes, 0x64))?
        } else {
            0
        };
        if feature_incompat & !INCOMPAT_KNOWN != 0 {
            return Err(FsMetaError::Unsupported {
                what: "unknown incompatible ext feature",
            });
        }
        let log_block_size = field(le32(bytes, 0x18))?;
        if log_block_size > LOG_BLOCK_SIZE_MAX {
            return Err(bad("block size above 64 KiB"));
        }
        let block_bytes = 1024u32 << log_block_size;
        let is_64bit = feature_incompat & INCOMPAT_64BIT != 0;
        let blocks_count_high = if is_64bit {
            field(le32(bytes, 0x150))?
        } else {
            0
        };
        let blocks_count =
            u64::from(field(le32(bytes, 0x04))?) | (u64::from(blocks_count_high) << 32);
        let mut superblock = ExtSuperblock {
            inodes_count: field(le32(bytes, 0x00))?,
            blocks_count,
            first_data_block: field(le32(bytes, 0x14))?,
            log_block_size,
            log_cluster_ratio: 0,
            blocks_per_group: field(le32(bytes, 0x20))?,
            inodes_per_group: field(le32(bytes, 0x28))?,
            inode_bytes: if dynamic {
                field(le16(bytes, 0x58))?
            } else {
                INODE_BYTES_REVISION_0
            },
            feature_compat,
            feature_incompat: feature_incompat & !INCOMPAT_RECOVER,
            feature_ro_compat: feature_ro_compat & !RO_COMPAT_ORPHAN_PRESENT,
            reserved_gdt_blocks: field(le16(bytes, 0xCE))?,
            journal_uuid: field(bytes.get(0xD0..0xE0).and_then(|s| s.try_into().ok()))?,
            journal_inode: field(le32(bytes, 0xE0))?,
            journal_device: field(le32(bytes, 0xE4))?,
            descriptor_bytes: field(le16(bytes, 0xFE))?,
            first_meta_bg: field(le32(bytes, 0x104))?,
            mmp_block: 0,
            backup_groups: [field(le32(bytes, 0x24C))?, field(le32(bytes, 0x250))?],
        };
        if superblock.blocks_count == 0 {
            return Err(bad("block count is zero"));
        }
        if superblock.feature_incompat & INCOMPAT_JOURNAL_DEV != 0 {
            // An external journal device has no block groups: only its size matters.
            superblock.clear_group_fields();
            return Ok(superblock);
        }
        if superblock.feature_ro_compat & RO_COMPAT_BIGALLOC != 0 {
            let log_cluster_size = field(le32(bytes, 0x1C))?;
            if log_cluster_size < log_block_size
                || log_cluster_size - log_block_size > LOG_CLUSTER_RATIO_MAX
            {
                return Err(bad("cluster size inconsistent with block size"));
            }
            superblock.log_cluster_ratio = log_cluster_size - log_block_size;
            let clusters_per_group = field(le32(bytes, 0x24))?;
            if clusters_per_group == 0 || clusters_per_group > 8 * block_bytes {
                return Err(bad("clusters per group outside 1..=8 * block size"));
            }
            let expected = u64::from(clusters_per_group) << superblock.log_cluster_ratio;
            if u64::from(superblock.blocks_per_group) != expected {
                return Err(bad(
                    "blocks per group is not clusters per group times ratio",
                ));
            }
        } else if superblock.blocks_per_group == 0 || superblock.blocks_per_group > 8 * block_bytes
        {
            return Err(bad("blocks per group outside 1..=8 * block size"));
        }
        if superblock.inodes_per_group == 0 || superblock.inodes_per_group > 8 * block_bytes {
            return Err(bad("inodes per group outside 1..=8 * block size"));
        }
        let inode_bytes = superblock.inode_bytes;
        if inode_bytes < INODE_BYTES_MIN
            || !inode_bytes.is_power_of_two()
            || u32::from(inode_bytes) > block_bytes
        {
            return Err(bad("inode size not a power of two in 128..=block size"));
        }
        let expected_first_data_block =
            u32::from(block_bytes == 1024 && superblock.log_cluster_ratio == 0);
        if superblock.first_data_block != expected_first_data_block {
            return Err(bad("first data block inconsistent with block size"));
        }
        if superblock.blocks_count <= u64::from(superblock.first_data_block) {
            return Err(bad("block count does not exceed the first data block"));
        }
        let groups_count = superblock.groups_count();
        if groups_count > GROUPS_MAX {
            return Err(FsMetaError::LimitExceeded {
                limit: "GROUPS_MAX",
                value: groups_count,
                maximum: GROUPS_MAX,
            });
        }
        if groups_count * u64::from(superblock.inodes_per_group)
            != u64::from(superblock.inodes_count)
        {
            return Err(bad("inode count is not groups times inodes per group"));
        }
        superblock.descriptor_bytes = if is_64bit {
            let size = superblock.descriptor_bytes;
            if !(DESCRIPTOR_BYTES_64BIT_MIN..=DESCRIPTOR_BYTES_MAX).contains(&size)
                || !size.is_power_of_two()
            {
                return Err(bad(
                    "64-bit descriptor size not a power of two in 64..=1024",
                ));
            }
            size
        } else {
            DESCRIPTOR_BYTES_32BIT
        };
        if u32::from(superblock.reserved_gdt_blocks) > block_bytes / 4 {
            return Err(bad("reserved GDT blocks exceed block size / 4"));
        }
        if superblock.has_meta_bg() {
            if u64::from(superblock.first_meta_bg) > superblock.descriptor_blocks() {
                return Err(bad("first meta group beyond the descriptor blocks"));
            }
        } else {
            superblock.first_meta_bg = 0;
        }
        if superblock.feature_incompat & INCOMPAT_MMP != 0 {
            superblock.mmp_block = field(le64(bytes, 0x168))?;
            if superblock.mmp_block == 0 || superblock.mmp_block >= superblock.blocks_count {
                return Err(bad("MMP block outside the file system"));
            }
        }
        if superblock.feature_compat & COMPAT_SPARSE_SUPER2 == 0 {
            superblock.backup_groups = [0, 0];
        }
        if superblock.has_journal() && superblock.journal_inode > superblock.inodes_count {
            return Err(bad("journal inode number beyond the inode count"));
        }
        Ok(superblock)
    }

    /// Zeroes the fields a journal device leaves meaningless, so its layout key depends only
    /// on what its map uses.
    fn clear_group_fields(&mut self) {
        self.inodes_count = 0;
        self.blocks_per_group = 0;
        self.inodes_per_group = 0;
        self.reserved_gdt_blocks = 0;
        self.first_meta_bg = 0;
        self.backup_groups = [0, 0];
        self.journal_inode = 0;
    }

    pub(crate) fn file_system_kind(&self) -> FileSystemKind {
        if self.feature_incompat & INCOMPAT_JOURNAL_DEV != 0 {
            FileSystemKind::ExtJournalDevice
        } else if self.feature_incompat & !INCOMPAT_EXT3 != 0
            || self.feature_ro_compat & !RO_COMPAT_EXT3 != 0
        {
            FileSystemKind::Ext4
        } else if self.has_journal() {
            FileSystemKind::Ext3
        } else {
            FileSystemKind::Ext2
        }
    }

    pub(crate) fn block_bytes(&self) -> u32 {
        1024 << self.log_block_size
    }

    pub(crate) fn has_journal(&self) -> bool {
        self.feature_compat & COMPAT_HAS_JOURNAL != 0
    }

    pub(crate) fn has_meta_bg(&self) -> bool {
        self.feature_incompat & INCOMPAT_META_BG != 0
    }

    pub(crate) fn is_64bit(&self) -> bool {
        self.feature_incompat & INCOMPAT_64BIT != 0
    }

    /// Number of block groups; the last may be shorter than `blocks_per_group`.
    pub(crate) fn groups_count(&self) -> u64 {
        assert!(self.blocks_per_group > 0);
        (self.blocks_count - u64::from(self.first_data_block))
            .div_ceil(u64::from(self.blocks_per_group))
    }

    pub(crate) fn descriptors_per_block(&self) -> u64 {
        u64::from(self.block_bytes() / u32::from(self.descriptor_bytes))
    }

    /// Blocks the full descriptor table takes.
    pub(crate) fn descriptor_blocks(&self) -> u64 {
        self.groups_count().div_ceil(self.descriptors_per_block())
    }

    /// Blocks one group's inode table takes.
    pub(crate) fn inode_table_blocks(&self) -> u64 {
        (u64::from(self.inodes_per_group) * u64::from(self.inode_bytes))
            .div_ceil(u64::from(self.block_bytes()))
    }

    /// The block a group's superblock copy lives in when it has one: the group's first block,
    /// except that the primary superblock always sits at byte 1024 (block 1 with 1 KiB
    /// blocks, block 0 otherwise, also when bigalloc makes `first_data_block` 0).
    pub(crate) fn superblock_block(&self, group: u64) -> u64 {
        if group == 0 {
            EXT_SUPERBLOCK_OFFSET / u64::from(self.block_bytes())
        } else {
            u64::from(self.first_data_block) + group * u64::from(self.blocks_per_group)
        }
    }

    /// Whether `group` holds a superblock copy (and, outside `meta_bg`, a descriptor copy).
    pub(crate) fn has_superblock(&self, group: u64) -> bool {
        if group == 0 {
            return true;
        }
        if self.feature_compat & COMPAT_SPARSE_SUPER2 != 0 {
            return self
                .backup_groups
                .iter()
                .any(|&backup| u64::from(backup) == group);
        }
        if self.feature_ro_compat & RO_COMPAT_SPARSE_SUPER == 0 || group == 1 {
            return true;
        }
        is_power_of(group, 3) || is_power_of(group, 5) || is_power_of(group, 7)
    }
}

/// Whether `value` is `base` raised to some power of at least 1.
fn is_power_of(mut value: u64, base: u64) -> bool {
    assert!(base > 1);
    if value < base {
        return false;
    }
    while value.checked_rem(base) == Some(0) {
        value /= base;
    }
    value == 1
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: sparse_super backup groups are 0, 1 and powers of 3, 5, 7, checked against the list
    // the ext4 documentation gives.
    #[test]
    fn sparse_super_backup_groups() {
        let superblock = ExtSuperblock {
            inodes_count: 0,
            blocks_count: 0,
            first_data_block: 0,
            log_block_size: 2,
            log_cluster_ratio: 0,
            blocks_per_group: 32768,
            inodes_per_group: 8192,
            inode_bytes: 256,
            feature_compat: 0,
            feature_incompat: 0,
            feature_ro_compat: RO_COMPAT_SPARSE_SUPER,
            reserved_gdt_blocks: 0,
            journal_uuid: [0; 16],
            journal_inode: 0,
            journal_device: 0,
            descriptor_bytes: 32,
            first_meta_bg: 0,
            mmp_block: 0,
            backup_groups: [0, 0],
        };
        let backups: Vec<u64> = (0..400).filter(|&g| superblock.has_superblock(g)).collect();
        assert_eq!(
            backups,
            vec![0, 1, 3, 5, 7, 9, 25, 27, 49, 81, 125, 243, 343]
        );
        assert!(!is_power_of(1, 3));
        assert!(is_power_of(2187, 3));
    }

    /// A consistent superblock: 1 KiB blocks, one group of 8192 blocks, 2048 inodes.
    fn superblock_bytes() -> Vec<u8> {
        let mut bytes = vec![0u8; EXT_SUPERBLOCK_BYTES];
        let mut put32 = |offset: usize, value: u32| {
            bytes[offset..offset + 4].copy_from_slice(&value.to_le_bytes());
        };
        put32(0x00, 2048);
        put32(0x04, 8192);
        put32(0x14, 1);
        put32(0x18, 0);
        put32(0x20, 8192);
        put32(0x28, 2048);
        put32(0x4C, 1);
        put32(0x64, RO_COMPAT_SPARSE_SUPER);
        bytes[0x38..0x3A].copy_from_slice(&EXT_MAGIC.to_le_bytes());
        bytes[0x58..0x5A].copy_from_slice(&256u16.to_le_bytes());
        bytes
    }

    // Goal: each inconsistency the parser checks is refused; method: one field broken at a
    // time in an otherwise consistent superblock.
    #[test]
    fn inconsistent_superblocks_are_refused() {
        let superblock = ExtSuperblock::parse(&superblock_bytes()).unwrap();
        assert_eq!(superblock.groups_count(), 1);
        assert_eq!(superblock.file_system_kind(), FileSystemKind::Ext2);
        let breakages: [(usize, u32); 13] = [
            (0x38, 0xEF54),      // magic
            (0x4C, 2),           // revision
            (0x18, 7),           // block size 128 KiB
            (0x18, 2),           // 4 KiB blocks with first data block 1
            (0x20, 0),           // no blocks per group
            (0x20, 8193),        // more blocks per group than a bitmap holds
            (0x28, 0),           // no inodes per group
            (0x00, 2047),        // inode count not groups times inodes per group
            (0x58, 100),         // inode size not a power of two
            (0x60, 0x4000_0000), // unknown incompatible feature
            (0xCE, 300),         // reserved GDT blocks beyond block size / 4
            (0x04, 1),           // block count not beyond the first data block
            (0x14, 0),           // first data block 0 with 1 KiB blocks
        ];
        for (offset, value) in breakages {
            let mut bytes = superblock_bytes();
            let width = if offset == 0x38 || offset == 0x58 || offset == 0xCE {
                2
            } else {
                4
            };
            bytes[offset..offset + width].copy_from_slice(&value.to_le_bytes()[..width]);
            assert!(
                ExtSuperblock::parse(&bytes).is_err(),
                "offset {offset:#x} value {value}"
            );
        }
        let mut wide = superblock_bytes();
        wide[0x60..0x64].copy_from_slice(&INCOMPAT_64BIT.to_le_bytes());
        wide[0xFE..0x100].copy_from_slice(&48u16.to_le_bytes());
        assert!(
            ExtSuperblock::parse(&wide).is_err(),
            "64-bit descriptor size 48"
        );
        wide[0xFE..0x100].copy_from_slice(&64u16.to_le_bytes());
        assert_eq!(ExtSuperblock::parse(&wide).unwrap().descriptor_bytes, 64);
        assert!(ExtSuperblock::parse(&superblock_bytes()[..1000]).is_err());
    }
}
