//! The blocks a byte range of a volume covers, one [`BlockSpan`] each: the arithmetic every
//! request that walks blocks shares (reads, writes, block status, reads under the lock).

use std::ops::Range;

/// One block's share of a byte range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BlockSpan {
    /// The block's number in the volume.
    pub(crate) block: u64,
    /// Bytes of the block before the range's part of it.
    pub(crate) skip: usize,
    /// Bytes of the block in the range (at least one).
    pub(crate) take: usize,
    /// Where the range's part of the block starts, in bytes from the start of the range
    /// (in a request's buffer, for requests that carry one).
    pub(crate) request_offset: u64,
}

impl BlockSpan {
    /// True when the range covers the whole block.
    pub(crate) fn is_whole(&self, block_bytes: usize) -> bool {
        self.take == block_bytes
    }

    /// The span's bytes in the request buffer.
    pub(crate) fn in_request(&self) -> Range<usize> {
        let start = self.request_offset as usize;
        start..start + self.take
    }

    /// The span's bytes in the block.
    pub(crate) fn in_block(&self) -> Range<usize> {
        self.skip..self.skip + self.take
    }
}

/// The blocks of `[offset, offset + length)` in order, for blocks of `block_bytes`.
pub(crate) fn block_spans(offset: u64, length: u64, block_bytes: u32) -> BlockSpans {
    assert!(block_bytes > 0, "blocks have bytes");
    let end = offset.checked_add(length).expect("ranges end within u64");
    BlockSpans {
        block_bytes: u64::from(block_bytes),
        start: offset,
        position: offset,
        end,
    }
}

/// Iterator of [`block_spans`], from either end: `[position, end)` is what is left.
#[derive(Clone, Debug)]
pub(crate) struct BlockSpans {
    block_bytes: u64,
    start: u64,
    position: u64,
    end: u64,
}

impl BlockSpans {
    fn span(&self, from: u64, to: u64) -> BlockSpan {
        BlockSpan {
            block: from / self.block_bytes,
            skip: (from % self.block_bytes) as usize,
            take: (to - from) as usize,
            request_offset: from - self.start,
        }
    }
}

impl Iterator for BlockSpans {
    type Item = BlockSpan;

    #[inline]
    fn next(&mut self) -> Option<BlockSpan> {
        if self.position >= self.end {
            return None;
        }
        let block_end = self.position - self.position % self.block_bytes + self.block_bytes;
        let to = block_end.min(self.end);
        let span = self.span(self.position, to);
        self.position = to;
        Some(span)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let remaining = if self.position >= self.end {
            0
        } else {
            let first = self.position / self.block_bytes;
            let last = (self.end - 1) / self.block_bytes;
            (last - first + 1) as usize
        };
        (remaining, Some(remaining))
    }
}

impl DoubleEndedIterator for BlockSpans {
    #[inline]
    fn next_back(&mut self) -> Option<BlockSpan> {
        if self.position >= self.end {
            return None;
        }
        let last_block_start = (self.end - 1) - (self.end - 1) % self.block_bytes;
        let from = last_block_start.max(self.position);
        let span = self.span(from, self.end);
        self.end = from;
        Some(span)
    }
}

impl ExactSizeIterator for BlockSpans {}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: spans tile the range exactly, each inside one block, with the right offsets.
    /// Method: compare against a byte-by-byte walk for aligned, unaligned and empty ranges.
    #[test]
    fn spans_tile_the_range() {
        for (offset, length, block_bytes) in [
            (0u64, 0u64, 512u32),
            (0, 4096, 4096),
            (0, 3 * 4096, 4096),
            (100, 10, 512),
            (100, 5000, 512),
            (4095, 2, 4096),
            (4096 * 7 + 1, 4096 * 3 - 2, 4096),
        ] {
            let spans: Vec<BlockSpan> = block_spans(offset, length, block_bytes).collect();
            assert_eq!(spans.len(), block_spans(offset, length, block_bytes).len());
            let mut expected_offset = 0u64;
            for span in &spans {
                assert_eq!(span.request_offset, expected_offset);
                let position = offset + span.request_offset;
                assert_eq!(span.block, position / u64::from(block_bytes));
                assert_eq!(span.skip as u64, position % u64::from(block_bytes));
                assert!(span.take >= 1);
                assert!(span.skip + span.take <= block_bytes as usize);
                expected_offset += span.take as u64;
            }
            assert_eq!(expected_offset, length, "{offset} {length} {block_bytes}");
            let whole = spans
                .iter()
                .filter(|span| span.is_whole(block_bytes as usize))
                .count() as u64;
            let first_whole = offset.div_ceil(u64::from(block_bytes));
            let end_whole = (offset + length) / u64::from(block_bytes);
            assert_eq!(whole, end_whole.saturating_sub(first_whole));
            let mut backwards: Vec<BlockSpan> =
                block_spans(offset, length, block_bytes).rev().collect();
            backwards.reverse();
            assert_eq!(backwards, spans, "from the back");
            let mut both = block_spans(offset, length, block_bytes);
            let (first, last) = (both.next(), both.next_back());
            assert_eq!(first, spans.first().copied());
            assert_eq!(last, spans.get(1..).and_then(<[BlockSpan]>::last).copied());
        }
    }
}
