//! Two-level chunking: chunks and segments in one pass (paper 2, RevDedup §2.2.2).
//!
//! One Rabin rolling hash ([`super::rabin`]) serves both levels with the same target pattern
//! (low bits all ones). A chunk ends where the low `n` bits match; that chunk end is also a
//! segment end when the low `m` bits match too (`m > n`) and the segment has reached its
//! minimum size. So every segment boundary is a chunk boundary, as the paper requires, and
//! segments are runs of whole chunks.
//!
//! Sizes (paper 2's assumption): chunk min/max are half and twice the average chunk size, and
//! segment min/max half and twice the average segment size. `n` is chosen as in
//! [`super::rabin`] (`n = log2(average chunk / 2)`). A segment end is tested only at chunk ends
//! found by the pattern, about one chunk in `2^(m - n)`; past the segment minimum the expected
//! tail is then `2^(m - n)` chunks, so `m = n + round(log2((average segment - segment min) /
//! average chunk))` makes segments average close to the configured size. The segment average
//! must be at least four chunk averages, so that `m > n` and the segment minimum holds at least
//! one maximum-size chunk.
//!
//! **Maximum-size segments.** When the current segment would grow past the segment maximum, the
//! chunk being cut is cut short at exactly the segment maximum and ends the segment, even if it
//! is then shorter than the chunk minimum; the next segment and its first chunk start right
//! there. Such a forced cut is not content-defined, so the chunks after it may take a few
//! chunks to fall back onto the boundaries that unforced chunking would find (the same
//! resynchronisation as after an insertion). A chunk cut at the chunk maximum never ends a
//! segment unless it also reaches the segment maximum or the end of the stream.

use super::rabin::{pattern_bits, pattern_mask, scan, WINDOW_BYTES};
use super::{assert_cut_input, Chunker, Cut, SizeRange};

/// The two-level chunker. It counts the bytes of the current segment, so use one per stream.
#[derive(Clone, Debug)]
pub struct SegmentChunker {
    segment: SizeRange,
    chunk: SizeRange,
    chunk_mask: u64,
    segment_mask: u64,
    /// Bytes already cut in the current segment.
    segment_bytes: usize,
}

impl SegmentChunker {
    /// A chunker for the given segment and chunk size ranges (validated by
    /// [`super::ChunkerSpec`]).
    pub fn new(segment: SizeRange, chunk: SizeRange) -> Self {
        assert!(chunk.bytes_min >= WINDOW_BYTES);
        assert!(
            chunk.bytes_max <= segment.bytes_min,
            "a segment holds at least one chunk"
        );
        let chunk_bits = pattern_bits(chunk.bytes_average - chunk.bytes_min);
        let segment_bits = chunk_bits
            + pattern_bits((segment.bytes_average - segment.bytes_min) / chunk.bytes_average);
        assert!(
            segment_bits > chunk_bits,
            "segments must be longer than chunks"
        );
        SegmentChunker {
            segment,
            chunk,
            chunk_mask: pattern_mask(chunk_bits),
            segment_mask: pattern_mask(segment_bits),
            segment_bytes: 0,
        }
    }

    /// Paper 2's sizes for the given averages: half, the average, twice, at both levels.
    pub fn default_sizes(
        segment_bytes_average: usize,
        chunk_bytes_average: usize,
    ) -> (SizeRange, SizeRange) {
        let range = |average: usize| SizeRange {
            bytes_min: average / 2,
            bytes_average: average,
            bytes_max: average * 2,
        };
        (range(segment_bytes_average), range(chunk_bytes_average))
    }
}

impl Chunker for SegmentChunker {
    fn next_cut(&mut self, data: &[u8], end_of_stream: bool) -> Cut {
        assert_cut_input(data, end_of_stream, self.chunk.bytes_max);
        assert!(self.segment_bytes < self.segment.bytes_max);
        let segment_room = self.segment.bytes_max - self.segment_bytes;
        let limit = data.len().min(self.chunk.bytes_max).min(segment_room);
        let found = if limit > self.chunk.bytes_min {
            scan(data, self.chunk.bytes_min, limit, self.chunk_mask)
        } else {
            None
        };
        let (len, pattern_ends_segment) = match found {
            Some((len, hash)) => {
                let segment_long_enough = self.segment_bytes + len >= self.segment.bytes_min;
                (
                    len,
                    segment_long_enough && hash & self.segment_mask == self.segment_mask,
                )
            }
            None => (limit, false),
        };
        let ends_segment =
            pattern_ends_segment || len == segment_room || (end_of_stream && len == data.len());
        self.segment_bytes = if ends_segment {
            0
        } else {
            self.segment_bytes + len
        };
        assert!(len >= 1 && len <= limit);
        Cut { len, ends_segment }
    }

    fn max_chunk_bytes(&self) -> usize {
        self.chunk.bytes_max
    }
}
