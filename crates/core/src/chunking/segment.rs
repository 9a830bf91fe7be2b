//! Two-level chunking: chunks and segments in one pass (paper 2, RevDedup §2.2.2).
//!
//! One rolling hash serves both levels with the same target pattern. A chunk ends where `n`
//! pattern bits match; that chunk end is also a segment end when `m` pattern bits match too
//! (`m > n`, the `n` bits among them) and the segment has reached its minimum size. So every
//! segment boundary is a chunk boundary, as the paper requires, and segments are runs of whole
//! chunks.
//!
//! Two rolling hashes ([`RollingHash`]), both content-defined over a sliding window:
//! - **Rabin** ([`super::rabin`], `segment:S/C`), the paper's: a 48-byte window, the pattern is
//!   the low bits all ones. Each byte costs two dependent table lookups.
//! - **Gear** (`segment-gear:S/C`), the hash of FastCDC ([`super::fastcdc`]):
//!   `hash = (hash << 1) + GEAR[byte]`, whose top bits depend on the last 64 bytes; the
//!   pattern is the top bits all zeros. A byte costs a shift and an add on the critical path
//!   (2.8 GB/s against 0.84 GB/s for Rabin here); the backup store uses it by default
//!   (docs/DESIGN.md).
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

use super::fastcdc::GEAR;
use super::rabin::{self, pattern_bits, pattern_mask, WINDOW_BYTES};
use super::{assert_cut_input, Chunker, Cut, SizeRange};

/// Bytes of the gear hash's window: older bytes have been shifted out of all 64 bits.
const GEAR_WINDOW_BYTES: usize = 64;

/// The rolling hash of a [`SegmentChunker`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RollingHash {
    /// Paper 2's Rabin fingerprint over a 48-byte window.
    Rabin,
    /// The gear hash over a 64-byte window.
    Gear,
}

impl RollingHash {
    /// The name used in options and output: `rabin` or `gear`.
    pub fn name(self) -> &'static str {
        match self {
            RollingHash::Rabin => "rabin",
            RollingHash::Gear => "gear",
        }
    }
}

impl std::str::FromStr for RollingHash {
    type Err = crate::Error;

    fn from_str(text: &str) -> crate::Result<Self> {
        match text.to_ascii_lowercase().as_str() {
            "rabin" => Ok(RollingHash::Rabin),
            "gear" => Ok(RollingHash::Gear),
            _ => Err(crate::Error::InvalidArgument(format!(
                "rolling hash {text:?}: use gear or rabin"
            ))),
        }
    }
}

/// The two-level chunker. It counts the bytes of the current segment, so use one per stream.
#[derive(Clone, Debug)]
pub struct SegmentChunker {
    segment: SizeRange,
    chunk: SizeRange,
    hash: RollingHash,
    chunk_mask: u64,
    segment_mask: u64,
    /// Bytes already cut in the current segment.
    segment_bytes: usize,
}

impl SegmentChunker {
    /// A Rabin chunker for the given segment and chunk size ranges (validated by
    /// [`super::ChunkerSpec`]).
    pub fn new(segment: SizeRange, chunk: SizeRange) -> Self {
        SegmentChunker::with_hash(segment, chunk, RollingHash::Rabin)
    }

    /// A chunker with the given rolling hash.
    pub fn with_hash(segment: SizeRange, chunk: SizeRange, hash: RollingHash) -> Self {
        assert!(chunk.bytes_min >= WINDOW_BYTES.max(GEAR_WINDOW_BYTES));
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
        let mask = |bits: u32| match hash {
            RollingHash::Rabin => pattern_mask(bits),
            // The top bits: they mix the whole window (the low bits only the last few bytes).
            RollingHash::Gear => pattern_mask(bits).reverse_bits(),
        };
        SegmentChunker {
            segment,
            chunk,
            hash,
            chunk_mask: mask(chunk_bits),
            segment_mask: mask(segment_bits),
            segment_bytes: 0,
        }
    }

    /// Finds the first chunk end in `data[min..end]`: its length and the hash there.
    fn scan(&self, data: &[u8], min: usize, end: usize) -> Option<(usize, u64)> {
        match self.hash {
            RollingHash::Rabin => rabin::scan(data, min, end, self.chunk_mask),
            RollingHash::Gear => gear_scan(data, min, end, self.chunk_mask),
        }
    }

    /// True if the hash at a chunk end also matches the segment pattern.
    fn matches_segment(&self, hash: u64) -> bool {
        match self.hash {
            RollingHash::Rabin => hash & self.segment_mask == self.segment_mask,
            RollingHash::Gear => hash & self.segment_mask == 0,
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
            self.scan(data, self.chunk.bytes_min, limit)
        } else {
            None
        };
        let (len, pattern_ends_segment) = match found {
            Some((len, hash)) => {
                let segment_long_enough = self.segment_bytes + len >= self.segment.bytes_min;
                (len, segment_long_enough && self.matches_segment(hash))
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

    fn chunk_bytes_max(&self) -> usize {
        self.chunk.bytes_max
    }

    fn cut_state(&self) -> u64 {
        self.segment_bytes as u64
    }
}

/// Gear counterpart of [`rabin::scan`]: the first length `L` in `min..=end` whose hash over
/// `data[L - 64..L]` has the `mask` bits all zero. The hash starts from zero 64 bytes before
/// `min`, which gives the same value as rolling from the start of the stream: every older
/// byte has been shifted out.
#[inline]
fn gear_scan(data: &[u8], min: usize, end: usize, mask: u64) -> Option<(usize, u64)> {
    assert!(
        min >= GEAR_WINDOW_BYTES,
        "the window must fit before the minimum size"
    );
    assert!(min <= end && end <= data.len());
    let mut hash = 0u64;
    for &byte in &data[min - GEAR_WINDOW_BYTES..min] {
        hash = (hash << 1).wrapping_add(GEAR[byte as usize]);
    }
    if hash & mask == 0 {
        return Some((min, hash));
    }
    for (index, &byte) in data[min..end].iter().enumerate() {
        hash = (hash << 1).wrapping_add(GEAR[byte as usize]);
        if hash & mask == 0 {
            return Some((min + index + 1, hash));
        }
    }
    None
}
