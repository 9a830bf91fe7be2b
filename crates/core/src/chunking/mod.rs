//! Chunking: cutting a byte stream into chunks, the units of duplicate detection.
//!
//! Terms used throughout onecopy:
//!
//! - A **chunk** is a run of consecutive stream bytes that is fingerprinted and stored once.
//! - A **cut** is the end of a chunk: the chunker looks at the bytes at the start of the
//!   unprocessed stream and says how long the next chunk is ([`Cut::len`]).
//! - A **segment** is a run of consecutive chunks (paper 2, RevDedup §2.2.2): only the two-level
//!   chunker produces segments, and every segment boundary is also a chunk boundary.
//! - **Content-defined** chunkers (FastCDC, Rabin) cut where a rolling hash of the last few
//!   bytes matches a pattern, so an insertion shifts only the chunks around it; the chunk
//!   sequence after the edit re-synchronises with the old one. **Fixed** chunking cuts every
//!   `N` bytes, which is what a block device does (paper 1 §3.3.1), and loses every later
//!   match after an insertion.
//!
//! The chunkers, each documented in its module:
//!
//! | spec                        | module        | cut rule                                         |
//! |-----------------------------|---------------|--------------------------------------------------|
//! | `fixed:4096`                | [`fixed`]     | every 4096 bytes                                 |
//! | `fastcdc:8192`, `fastcdc:2048/8192/32768` | [`fastcdc`] | gear hash, normalized chunking (two masks) |
//! | `rabin:8192`, `rabin:4096/8192/16384`     | [`rabin`]   | Rabin fingerprint of a 48-byte window     |
//! | `segment:4MiB/4KiB`         | [`segment`]   | Rabin, chunk and segment boundaries in one pass  |
//!
//! Every chunker implements the object-safe [`Chunker`] trait; a [`ChunkerSpec`] names one and
//! builds it. [`ChunkReader`] chunks any [`std::io::Read`] through a bounded buffer, and
//! [`SliceChunks`] chunks a slice in memory; both give the same chunks for the same bytes.
//! [`chunk_and_fingerprint_parallel`] cuts and fingerprints a buffer in memory on several cores
//! with exactly the serial result ([`parallel`] explains how pieces cut independently are
//! spliced).
//!
//! ```
//! use onecopy_core::chunking::{ChunkerSpec, SliceChunks};
//!
//! let spec: ChunkerSpec = "fastcdc:8192".parse().unwrap();
//! let data = vec![7u8; 100_000];
//! let total: usize = SliceChunks::new(spec.build(), &data).map(|chunk| chunk.data.len()).sum();
//! assert_eq!(total, data.len());
//! ```

pub mod fastcdc;
pub mod fixed;
pub mod parallel;
pub mod rabin;
mod reader;
pub mod segment;
mod spec;

#[cfg(test)]
mod tests;

pub use parallel::{chunk_and_fingerprint, chunk_and_fingerprint_parallel, FingerprintedChunk};
pub use reader::{ChunkReader, SliceChunks, READ_BUFFER_BYTES_DEFAULT};
pub use segment::RollingHash;
pub use spec::{ChunkerSpec, SizeRange};

/// The largest chunk any chunker may produce. [`ChunkReader`] buffers hold at least one chunk
/// of the chunker's maximum size, so this bounds their memory.
pub const CHUNK_BYTES_LIMIT: usize = 16 << 20;

/// The largest segment the two-level chunker may produce.
pub const SEGMENT_BYTES_LIMIT: usize = 64 << 20;

/// The end of one chunk, as decided by [`Chunker::next_cut`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cut {
    /// Length of the chunk in bytes, counted from the start of the data passed in.
    pub len: usize,
    /// True when this chunk is the last of a segment (two-level chunking only; always false
    /// for the other chunkers).
    pub ends_segment: bool,
}

/// A chunk of a stream: its bytes, where it starts, and whether it ends a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk<'a> {
    /// Offset of the chunk's first byte from the start of the stream.
    pub offset: u64,
    /// The chunk's bytes; never empty.
    pub data: &'a [u8],
    /// True when this chunk ends a segment (see [`Cut::ends_segment`]).
    pub ends_segment: bool,
}

/// Decides where chunks end. One chunker serves one stream: it may keep state between cuts (the
/// two-level chunker counts the bytes of the current segment), so build a new one for every
/// stream with [`ChunkerSpec::build`].
///
/// The cut depends only on the bytes passed in (and, for the two-level chunker, on the bytes
/// of the current segment already cut), never on how the stream was split into reads, as long
/// as callers keep the contract of [`next_cut`](Chunker::next_cut).
pub trait Chunker: Send {
    /// Length of the next chunk at the start of `data`.
    ///
    /// Contract: `data` holds at least [`chunk_bytes_max`](Chunker::chunk_bytes_max) bytes
    /// unless `end_of_stream` is true, in which case `data` is all that is left of the stream.
    /// The returned length is at least 1 and at most `min(data.len(), chunk_bytes_max())` for
    /// non-empty `data`. At end of stream the two-level chunker ends a segment when the last
    /// chunk reaches the end of `data`.
    fn next_cut(&mut self, data: &[u8], end_of_stream: bool) -> Cut;

    /// The longest chunk this chunker produces.
    fn chunk_bytes_max(&self) -> usize;

    /// Everything besides the bytes that the next cut depends on: two chunkers built from the
    /// same spec, at the same stream position and with equal states, cut the rest of the stream
    /// identically. This is what lets [`parallel`] splice independently cut pieces of a stream.
    /// Chunkers without state return 0; the two-level chunker returns the bytes of the current
    /// segment already cut.
    fn cut_state(&self) -> u64;
}

/// Checks the [`Chunker::next_cut`] contract on entry; every chunker calls it.
#[inline]
fn assert_cut_input(data: &[u8], end_of_stream: bool, chunk_bytes_max: usize) {
    assert!(!data.is_empty(), "next_cut needs at least one byte");
    assert!(
        end_of_stream || data.len() >= chunk_bytes_max,
        "next_cut needs chunk_bytes_max ({chunk_bytes_max}) of data before the end of stream, got {}",
        data.len()
    );
}
