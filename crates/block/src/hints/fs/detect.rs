//! Recognising a superblock in a write: which file system a volume holds, and the superblock
//! fields its layout depends on.

use super::ext::superblock::{ExtSuperblock, EXT_SUPERBLOCK_BYTES, EXT_SUPERBLOCK_OFFSET};
use super::layout::FileSystemKind;
use super::xfs::superblock::{XfsSuperblock, XFS_SUPERBLOCK_BYTES};

/// Bytes at the start of a volume that hold every superblock this module recognises: the xfs
/// superblock at byte 0 and the ext superblock at bytes 1024..2048.
pub const SUPERBLOCK_PROBE_BYTES: usize = 2048;

/// The superblock fields a metadata map depends on. Two keys are equal exactly when the
/// layout they describe is the same: fields that change in normal operation (free counts,
/// times, the "needs recovery" and "orphans present" flags) are left out, so a mount or a
/// commit does not make a map stale, while growing, converting or re-creating the file system
/// does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayoutKey(pub(crate) LayoutFields);

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum LayoutFields {
    Ext(ExtSuperblock),
    Xfs(XfsSuperblock),
    #[cfg(test)]
    ForTests,
}

impl LayoutKey {
    #[cfg(test)]
    pub(crate) fn for_tests() -> LayoutKey {
        LayoutKey(LayoutFields::ForTests)
    }
}

/// A superblock seen in a write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DetectedSuperblock {
    /// The file system the superblock belongs to.
    pub file_system: FileSystemKind,
    /// Its layout fields; compare with [`super::MetadataMap::layout`] to decide whether a
    /// map must be derived again.
    pub layout: LayoutKey,
}

/// True when a write of `len` bytes at volume offset `offset` touches the bytes where a
/// superblock lives (`[0, SUPERBLOCK_PROBE_BYTES)`). A caller then reads those bytes back
/// (after applying the write) and passes them to [`detect_superblock`], which also handles
/// writes that cover a superblock only in part.
pub fn write_touches_superblock(offset: u64, len: u64) -> bool {
    len > 0 && offset < SUPERBLOCK_PROBE_BYTES as u64
}

/// Recognises a file-system superblock in bytes written to a volume.
///
/// `offset` is the volume byte offset of `data`. Returns the file system when `data` covers
/// a whole superblock at its fixed place and that superblock passes the sanity checks a
/// derivation needs (ext: bytes 1024..2048 with magic 0xEF53; xfs: the first 512 bytes with
/// magic "XFSB"); `None` otherwise, including for partial coverage and damaged superblocks.
/// Cheap (reads about 300 bytes, no allocation) and never panics.
///
/// When both an xfs and an ext superblock are present (a stale signature left by an earlier
/// format), xfs wins: its superblock sits in sector 0, and mkfs.xfs overwrites bytes
/// 1024..2048 with its AGI, whereas mke2fs wipes foreign signatures.
pub fn detect_superblock(offset: u64, data: &[u8]) -> Option<DetectedSuperblock> {
    if let Some(bytes) = covered(offset, data, 0, XFS_SUPERBLOCK_BYTES) {
        if let Ok(superblock) = XfsSuperblock::parse(bytes) {
            return Some(DetectedSuperblock {
                file_system: FileSystemKind::Xfs,
                layout: LayoutKey(LayoutFields::Xfs(superblock)),
            });
        }
    }
    let bytes = covered(offset, data, EXT_SUPERBLOCK_OFFSET, EXT_SUPERBLOCK_BYTES)?;
    let superblock = ExtSuperblock::parse(bytes).ok()?;
    Some(DetectedSuperblock {
        file_system: superblock.file_system_kind(),
        layout: LayoutKey(LayoutFields::Ext(superblock)),
    })
}

/// The part of `data` (written at volume offset `offset`) holding volume bytes
/// `[start, start + len)`, when `data` covers all of them.
fn covered(offset: u64, data: &[u8], start: u64, len: usize) -> Option<&[u8]> {
    let skip = usize::try_from(start.checked_sub(offset)?).ok()?;
    data.get(skip..skip.checked_add(len)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the superblock window test is exact at its edges.
    #[test]
    fn superblock_window_edges() {
        assert!(write_touches_superblock(0, 1));
        assert!(write_touches_superblock(2047, 1));
        assert!(!write_touches_superblock(2048, 4096));
        assert!(!write_touches_superblock(0, 0));
    }

    // Goal: `covered` returns the requested slice only when the write spans all of it.
    #[test]
    fn covered_requires_full_span() {
        let data = [7u8; 4096];
        assert_eq!(covered(0, &data, 1024, 1024).map(<[u8]>::len), Some(1024));
        assert_eq!(
            covered(1024, &data[..1024], 1024, 1024).map(<[u8]>::len),
            Some(1024)
        );
        assert!(covered(1024, &data[..1023], 1024, 1024).is_none());
        assert!(covered(1025, &data, 1024, 1024).is_none());
        assert!(covered(u64::MAX, &data, 1024, 1024).is_none());
    }

    // Goal: zeros, random-looking bytes and a bare magic number are not superblocks.
    #[test]
    fn garbage_is_not_a_superblock() {
        let mut data = vec![0u8; 4096];
        assert!(detect_superblock(0, &data).is_none());
        data[1024 + 56] = 0x53;
        data[1024 + 57] = 0xEF;
        assert!(detect_superblock(0, &data).is_none());
        data[..4].copy_from_slice(b"XFSB");
        assert!(detect_superblock(0, &data).is_none());
    }
}
