//! The map builder: collects the ranges a derivation finds, within the file system's size and
//! [`RANGES_MAX`], and sorts and merges them.

use super::layout::{MetadataKind, MetadataRange};
use super::FsMetaError;

/// Most ranges one derivation may record before merging. A 32 TiB ext4 volume without
/// `flex_bg` (the worst common case: six separate structures in each of 262,144 groups) needs
/// about 1.6 million; the map costs 24 bytes a range.
pub const RANGES_MAX: usize = 1 << 21;

/// Collects ranges during a derivation, checking each against the file system's size and the
/// [`RANGES_MAX`] limit, then sorts and merges them into a map.
pub(crate) struct MapBuilder {
    ranges: Vec<MetadataRange>,
    block_bytes: u64,
    blocks_count: u64,
}

impl MapBuilder {
    /// A builder for a file system of `blocks_count` blocks of `block_bytes` bytes.
    pub(crate) fn new(block_bytes: u32, blocks_count: u64) -> MapBuilder {
        assert!(block_bytes.is_power_of_two());
        MapBuilder {
            ranges: Vec::new(),
            block_bytes: u64::from(block_bytes),
            blocks_count,
        }
    }

    /// Records blocks `[first_block, first_block + block_count)` as `kind`. Fails when they
    /// reach past the file system or the range limit is exceeded; zero blocks record nothing.
    pub(crate) fn add_blocks(
        &mut self,
        first_block: u64,
        block_count: u64,
        kind: MetadataKind,
    ) -> Result<(), FsMetaError> {
        if block_count == 0 {
            return Ok(());
        }
        let end_block = first_block.checked_add(block_count);
        match end_block {
            Some(end_block) if end_block <= self.blocks_count => {}
            _ => {
                return Err(FsMetaError::OutsideFileSystem {
                    kind,
                    block: first_block,
                    block_count,
                    blocks_count: self.blocks_count,
                })
            }
        }
        // Both products fit: end_block <= blocks_count, and blocks_count * block_bytes was
        // checked against the volume size when the superblock was parsed.
        let start = first_block * self.block_bytes;
        let end = start + block_count * self.block_bytes;
        self.add_bytes(start, end, kind)
    }

    /// Records bytes `[start, end)` as `kind`; the caller has checked they lie inside the file
    /// system. Extends the previous range when this one continues it.
    pub(crate) fn add_bytes(
        &mut self,
        start: u64,
        end: u64,
        kind: MetadataKind,
    ) -> Result<(), FsMetaError> {
        assert!(start < end);
        assert!(end <= self.blocks_count.saturating_mul(self.block_bytes));
        if let Some(last) = self.ranges.last_mut() {
            if last.kind == kind && last.end == start {
                last.end = end;
                return Ok(());
            }
        }
        if self.ranges.len() >= RANGES_MAX {
            return Err(FsMetaError::LimitExceeded {
                limit: "RANGES_MAX",
                value: self.ranges.len() as u64 + 1,
                maximum: RANGES_MAX as u64,
            });
        }
        self.ranges.push(MetadataRange { start, end, kind });
        Ok(())
    }

    /// Sorts the ranges, resolves overlaps and merges touching ranges of one kind.
    ///
    /// A sound file system never has overlapping structures; in a damaged one, a byte keeps
    /// the kind of the range that starts first (ties: the longer range), so the result is
    /// deterministic and every recorded byte stays covered.
    pub(crate) fn finish(mut self) -> Vec<MetadataRange> {
        self.ranges
            .sort_unstable_by(|a, b| a.start.cmp(&b.start).then(b.end.cmp(&a.end)));
        let mut merged: Vec<MetadataRange> = Vec::with_capacity(self.ranges.len());
        for mut range in self.ranges {
            if let Some(last) = merged.last_mut() {
                if range.start < last.end {
                    if range.end <= last.end {
                        continue;
                    }
                    range.start = last.end;
                }
                if range.start == last.end && range.kind == last.kind {
                    last.end = range.end;
                    continue;
                }
            }
            merged.push(range);
        }
        debug_assert!(merged.windows(2).all(|pair| pair[0].end <= pair[1].start));
        merged
    }
}
