//! Volumes: named virtual disks whose blocks are deduplicated in the shared chunk store.

use serde::{Deserialize, Serialize};

use crate::error::Result;
use onecopy_core::Error;

use crate::config::HintSettings;

/// Names a volume inside the engine; never reused after deletion.
pub type VolumeId = u32;

/// Bits of a volume id in the owner tag of a chunk stored without a fingerprint (see the
/// block engine's write path): volume ids stay below 2^21.
pub const VOLUME_ID_BITS: u32 = 21;
/// Largest volume id.
pub const VOLUME_ID_MAX: VolumeId = (1 << VOLUME_ID_BITS) - 1;

/// Largest volume: 1 PiB.
pub const VOLUME_BYTES_MAX: u64 = 1 << 50;
/// The block sizes a volume may have: the smallest (a disk sector) and the largest (a page).
pub const BLOCK_BYTES_MIN: u32 = 512;
pub const BLOCK_BYTES_MAX: u32 = 4096;
/// Most blocks a volume has.
pub const VOLUME_BLOCKS_MAX: u64 = VOLUME_BYTES_MAX / BLOCK_BYTES_MIN as u64;

const _: () = assert!(VOLUME_BYTES_MAX.is_multiple_of(BLOCK_BYTES_MAX as u64));
const _: () = assert!(VOLUME_ID_BITS < VolumeId::BITS);
/// Longest volume name (it is also the NBD export name).
pub const VOLUME_NAME_BYTES_MAX: usize = 64;
/// Most explicit no-dedup ranges per volume.
pub const HINT_RANGES_MAX: usize = 4096;

/// A half-open byte range `[start, end)` of a volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ByteRange {
    pub start: u64,
    pub end: u64,
}

impl ByteRange {
    /// True when the ranges share at least one byte.
    pub fn overlaps(&self, start: u64, end: u64) -> bool {
        self.start < end && start < self.end
    }

    /// Parses `START..END` with sizes in bytes or units (`0..1GiB`).
    pub fn parse(text: &str) -> Result<ByteRange> {
        let (start, end) = text.split_once("..").ok_or_else(|| {
            Error::InvalidArgument(format!("range {text:?} must look like START..END"))
        })?;
        let range = ByteRange {
            start: onecopy_core::units::parse_size(start)?,
            end: onecopy_core::units::parse_size(end)?,
        };
        if range.start >= range.end {
            return Err(Error::InvalidArgument(format!(
                "range {text:?} is empty: START must be below END"
            ))
            .into());
        }
        Ok(range)
    }
}

/// The catalog record of a volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    pub id: VolumeId,
    pub name: String,
    pub size_bytes: u64,
    /// Deduplication unit and the smallest write that needs no read-modify-write.
    pub block_bytes: u32,
    /// Unix seconds.
    pub created: u64,
    pub hints: HintSettings,
    /// Explicit "do not deduplicate" ranges (`onecopy volume hint --no-dedup`), sorted and
    /// merged.
    pub no_dedup_ranges: Vec<ByteRange>,
    /// Set while a deletion is under way; a volume found so at open is deleted then.
    pub deleting: bool,
}

impl VolumeRecord {
    /// Blocks in the volume (the last one may be partial when the size is not a multiple).
    pub fn block_count(&self) -> u64 {
        self.size_bytes.div_ceil(self.block_bytes as u64)
    }

    /// The page-store area holding the volume's block map.
    pub fn map_area_name(&self) -> String {
        format!("volume.{}.map", self.id)
    }

    /// Adds (or with `no_dedup == false` removes) an explicit no-dedup range.
    pub fn set_no_dedup(&mut self, range: ByteRange, no_dedup: bool) -> Result<()> {
        if range.end > self.size_bytes {
            return Err(Error::InvalidArgument(format!(
                "range {}..{} reaches past the end of volume {} ({} bytes)",
                range.start, range.end, self.name, self.size_bytes
            ))
            .into());
        }
        let mut ranges = Vec::new();
        for existing in &self.no_dedup_ranges {
            // Keep the parts of existing ranges outside the new one.
            if existing.start < range.start {
                ranges.push(ByteRange {
                    start: existing.start,
                    end: existing.end.min(range.start),
                });
            }
            if existing.end > range.end {
                ranges.push(ByteRange {
                    start: existing.start.max(range.end),
                    end: existing.end,
                });
            }
        }
        if no_dedup {
            ranges.push(range);
        }
        ranges.sort();
        let mut merged: Vec<ByteRange> = Vec::new();
        for next in ranges {
            match merged.last_mut() {
                Some(last) if last.end >= next.start => last.end = last.end.max(next.end),
                _ => merged.push(next),
            }
        }
        if merged.len() > HINT_RANGES_MAX {
            return Err(Error::Limit(format!(
                "volume {} would have more than {HINT_RANGES_MAX} no-dedup ranges",
                self.name
            ))
            .into());
        }
        self.no_dedup_ranges = merged;
        Ok(())
    }

    /// True when `[start, end)` overlaps an explicit no-dedup range.
    pub fn in_no_dedup_range(&self, start: u64, end: u64) -> bool {
        let after = self
            .no_dedup_ranges
            .partition_point(|range| range.end <= start);
        self.no_dedup_ranges
            .get(after)
            .is_some_and(|range| range.overlaps(start, end))
    }
}

/// Checks a volume name: 1 to 64 bytes of letters, digits, `.`, `_` and `-`, not starting
/// with `.` or `-`.
pub fn check_volume_name(name: &str) -> Result<()> {
    let valid = !name.is_empty()
        && name.len() <= VOLUME_NAME_BYTES_MAX
        && !name.starts_with(['.', '-'])
        && name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-'));
    if valid {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "volume name {name:?} must be 1 to {VOLUME_NAME_BYTES_MAX} letters, digits, '.', \
             '_' or '-', not starting with '.' or '-'"
        ))
        .into())
    }
}

/// Checks a volume size and block size.
pub fn check_volume_geometry(size_bytes: u64, block_bytes: u32) -> Result<()> {
    if block_bytes != BLOCK_BYTES_MIN && block_bytes != BLOCK_BYTES_MAX {
        return Err(Error::InvalidArgument(format!(
            "block size {block_bytes} must be {BLOCK_BYTES_MIN} or {BLOCK_BYTES_MAX}"
        ))
        .into());
    }
    if size_bytes == 0
        || size_bytes > VOLUME_BYTES_MAX
        || !size_bytes.is_multiple_of(block_bytes as u64)
    {
        return Err(Error::InvalidArgument(format!(
            "volume size {size_bytes} must be a positive multiple of the block size \
             ({block_bytes}) and at most {}",
            onecopy_core::units::format_size(VOLUME_BYTES_MAX)
        ))
        .into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> VolumeRecord {
        VolumeRecord {
            id: 1,
            name: "v".into(),
            size_bytes: 1 << 20,
            block_bytes: 4096,
            created: 0,
            hints: HintSettings::default(),
            no_dedup_ranges: Vec::new(),
            deleting: false,
        }
    }

    /// Goal: no-dedup ranges merge, split on removal, and answer overlap queries.
    #[test]
    fn no_dedup_ranges_merge_and_split() {
        let mut volume = record();
        volume
            .set_no_dedup(ByteRange::parse("0..8KiB").unwrap(), true)
            .unwrap();
        volume
            .set_no_dedup(ByteRange::parse("4KiB..16KiB").unwrap(), true)
            .unwrap();
        assert_eq!(
            volume.no_dedup_ranges,
            vec![ByteRange {
                start: 0,
                end: 16384
            }]
        );
        volume
            .set_no_dedup(
                ByteRange {
                    start: 4096,
                    end: 8192,
                },
                false,
            )
            .unwrap();
        assert_eq!(
            volume.no_dedup_ranges,
            vec![
                ByteRange {
                    start: 0,
                    end: 4096
                },
                ByteRange {
                    start: 8192,
                    end: 16384
                }
            ]
        );
        assert!(volume.in_no_dedup_range(0, 1));
        assert!(!volume.in_no_dedup_range(4096, 8192));
        assert!(volume.in_no_dedup_range(8000, 8193));
        assert!(volume
            .set_no_dedup(
                ByteRange {
                    start: 0,
                    end: 2 << 20
                },
                true
            )
            .is_err());
        assert!(ByteRange::parse("5..5").is_err());
    }

    /// Goal: names and geometry outside the documented limits are refused with reasons.
    #[test]
    fn names_and_geometry() {
        check_volume_name("vm-01.disk_A").unwrap();
        for bad in ["", ".hidden", "-x", "a/b", "sp ace", &"x".repeat(65)] {
            assert!(check_volume_name(bad).is_err(), "{bad}");
        }
        check_volume_geometry(1 << 30, 4096).unwrap();
        assert!(check_volume_geometry(1000, 512).is_err());
        assert!(check_volume_geometry(1 << 20, 1024).is_err());
        assert!(check_volume_geometry(0, 4096).is_err());
    }
}
