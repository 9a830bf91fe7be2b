//! Fixed-size chunking: a cut every `chunk_bytes` bytes (the last chunk of a stream may be
//! shorter). This is what a block device sees (paper 1 §3.3.1 uses 512-byte sectors); it costs
//! nothing to compute but an insertion shifts every later chunk.

use super::{assert_cut_input, Chunker, Cut};

/// Smallest fixed chunk size: one disk sector.
pub const FIXED_BYTES_MIN: usize = 512;
/// Largest fixed chunk size.
pub const FIXED_BYTES_MAX: usize = 4 << 20;

/// Cuts every `chunk_bytes` bytes.
#[derive(Clone, Debug)]
pub struct FixedChunker {
    chunk_bytes: usize,
}

impl FixedChunker {
    /// A chunker cutting every `chunk_bytes`; a power of two within
    /// [`FIXED_BYTES_MIN`]..=[`FIXED_BYTES_MAX`] (checked by [`super::ChunkerSpec`]).
    pub fn new(chunk_bytes: usize) -> Self {
        assert!(
            chunk_bytes.is_power_of_two(),
            "fixed chunk size must be a power of two"
        );
        assert!((FIXED_BYTES_MIN..=FIXED_BYTES_MAX).contains(&chunk_bytes));
        FixedChunker { chunk_bytes }
    }
}

impl Chunker for FixedChunker {
    #[inline]
    fn next_cut(&mut self, data: &[u8], end_of_stream: bool) -> Cut {
        assert_cut_input(data, end_of_stream, self.chunk_bytes);
        Cut {
            len: data.len().min(self.chunk_bytes),
            ends_segment: false,
        }
    }

    fn chunk_bytes_max(&self) -> usize {
        self.chunk_bytes
    }

    fn cut_state(&self) -> u64 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunking::SliceChunks;

    /// Goal: every chunk is exactly the fixed size except a shorter last one; method: chunk
    /// lengths that are and are not multiples of the size.
    #[test]
    fn cuts_every_chunk_bytes() {
        for (total, expected) in [
            (0usize, vec![]),
            (4096, vec![4096]),
            (10_000, vec![4096, 4096, 1808]),
        ] {
            let data = vec![1u8; total];
            let lengths: Vec<usize> = SliceChunks::new(Box::new(FixedChunker::new(4096)), &data)
                .map(|chunk| chunk.data.len())
                .collect();
            assert_eq!(lengths, expected);
        }
    }
}
