//! The stored-chunk codec: how a chunk's raw bytes become the bytes a container holds, and
//! back. Every face stores and reads chunks through these functions, so there is one rule for
//! when compression is kept, one checksum and one place that reads the compression flag.
//!
//! Terms:
//! - *raw bytes*: the chunk as the face sees it.
//! - *stored bytes*: what the container holds after the chunk header: the raw bytes, or a
//!   zstd frame of them when the chunk header's
//!   [`CHUNK_COMPRESSED`](super::format::CHUNK_COMPRESSED) flag is set.
//! - *checksum*: CRC-32C of the stored bytes, recorded in the chunk header and in every
//!   [`ChunkLocation`].
//!
//! The path:
//! 1. [`encode`] compresses at the configured zstd level and keeps the frame only when it
//!    saves at least an eighth of the raw size ([`compression_pays`]): a smaller saving costs
//!    a decompression on every read for little space.
//! 2. The container writer records the stored bytes with their flags and [`checksum`].
//! 3. [`decode`] checks the checksum, then copies the stored bytes or decompresses them.
//!
//! zstd contexts are kept per thread and reused: creating one costs more than compressing a
//! 4 KiB chunk. Each level runs with zstd's own parameters for the input's size: the backup
//! store's write path wants level 1 at its fastest, and its recompression (a stronger level,
//! later) takes care of the size (docs/BENCHMARKS.md, "Recompression"). Not guaranteed: two
//! encodings of the same raw bytes at the same level give the same stored bytes only with
//! the same zstd library version.

use std::cell::RefCell;

use super::ChunkLocation;
use crate::{Error, Result};

/// A chunk's stored form: decided by [`encode`] when it is first stored, kept when its
/// stored bytes are copied or reused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Encoded {
    /// The stored bytes are the raw bytes.
    Raw,
    /// The stored bytes are this zstd frame of the raw bytes.
    Compressed(Vec<u8>),
}

impl Encoded {
    /// The stored bytes of the chunk whose raw bytes are `raw`.
    pub fn stored<'a>(&'a self, raw: &'a [u8]) -> &'a [u8] {
        match self {
            Encoded::Raw => raw,
            Encoded::Compressed(frame) => frame,
        }
    }
}

/// The checksum a chunk header records for `stored` bytes: CRC-32C.
#[inline]
pub fn checksum(stored: &[u8]) -> u32 {
    crc32c::crc32c(stored)
}

/// True when a zstd frame of `compressed_bytes` is worth storing for `raw_bytes`: it saves at
/// least an eighth.
#[inline]
pub fn compression_pays(raw_bytes: usize, compressed_bytes: usize) -> bool {
    compressed_bytes <= raw_bytes - raw_bytes / 8
}

thread_local! {
    /// The thread's zstd compression context and the level it is set to.
    static COMPRESSOR: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> =
        const { RefCell::new(None) };
    /// The thread's zstd decompression context.
    static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { RefCell::new(None) };
}

/// The most bytes a zstd frame of `raw_bytes` can take: room enough for [`compress_into`].
pub fn compressed_bytes_max(raw_bytes: usize) -> usize {
    zstd::zstd_safe::compress_bound(raw_bytes)
}

/// Compresses `raw` at zstd `level` with the thread's context into `frame` (cleared first);
/// true when the frame is worth storing ([`compression_pays`]).
pub fn compress_into(raw: &[u8], level: i32, frame: &mut Vec<u8>) -> Result<bool> {
    assert!(!raw.is_empty(), "empty chunks are never stored");
    frame.clear();
    frame.reserve(compressed_bytes_max(raw.len()));
    let written = with_compressor(level, |compressor| {
        compressor
            .compress_to_buffer(raw, frame)
            .map_err(|error| Error::io("compressing a chunk", error))
    })?;
    assert_eq!(written, frame.len(), "zstd reports what it wrote");
    Ok(compression_pays(raw.len(), written))
}

fn with_compressor<T>(
    level: i32,
    compress: impl FnOnce(&mut zstd::bulk::Compressor<'static>) -> Result<T>,
) -> Result<T> {
    COMPRESSOR.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.as_ref().is_none_or(|(cached, _)| *cached != level) {
            let compressor = zstd::bulk::Compressor::new(level)
                .map_err(|error| Error::io("creating a zstd compressor", error))?;
            *cell = Some((level, compressor));
        }
        let (_, compressor) = cell.as_mut().expect("set above");
        compress(compressor)
    })
}

/// The stored form of `raw` at zstd `level` (`None`: stored as it is). Compressed only when
/// that saves at least an eighth.
pub fn encode(raw: &[u8], level: Option<i32>) -> Result<Encoded> {
    let Some(level) = level else {
        return Ok(Encoded::Raw);
    };
    let mut frame = Vec::new();
    Ok(if compress_into(raw, level, &mut frame)? {
        Encoded::Compressed(frame)
    } else {
        Encoded::Raw
    })
}

/// Checks `stored` against the checksum `location` records: a corruption error naming the
/// chunk otherwise.
pub fn verify(location: &ChunkLocation, stored: &[u8]) -> Result<()> {
    let found = checksum(stored);
    if found == location.checksum {
        Ok(())
    } else {
        Err(Error::corrupt(
            describe(location),
            format!("checksum {found:08x}, expected {:08x}", location.checksum),
        ))
    }
}

/// Decodes the stored bytes of the chunk at `location` into `raw` (exactly its raw size):
/// checks the checksum, then copies or decompresses.
pub fn decode(location: &ChunkLocation, stored: &[u8], raw: &mut [u8]) -> Result<()> {
    verify(location, stored)?;
    expand(location, stored, raw)
}

/// Like [`decode`], into a new buffer.
pub fn decode_to_vec(location: &ChunkLocation, stored: &[u8]) -> Result<Vec<u8>> {
    let mut raw = vec![0u8; location.raw_bytes as usize];
    decode(location, stored, &mut raw)?;
    Ok(raw)
}

/// Copies or decompresses stored bytes into `raw` (exactly the raw size) without checking
/// the checksum: for bytes that never left memory (a write buffer, the write-behind queue).
pub(crate) fn expand(location: &ChunkLocation, stored: &[u8], raw: &mut [u8]) -> Result<()> {
    assert_eq!(
        raw.len(),
        location.raw_bytes as usize,
        "buffer fits the chunk"
    );
    if stored.len() != location.stored_bytes as usize {
        return Err(Error::corrupt(
            describe(location),
            format!(
                "{} stored bytes, expected {}",
                stored.len(),
                location.stored_bytes
            ),
        ));
    }
    if !location.is_compressed() {
        if stored.len() != raw.len() {
            return Err(Error::corrupt(
                describe(location),
                format!(
                    "stored uncompressed in {} bytes, but {} raw bytes",
                    stored.len(),
                    raw.len()
                ),
            ));
        }
        raw.copy_from_slice(stored);
        return Ok(());
    }
    let written = DECOMPRESSOR.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.is_none() {
            *cell = Some(
                zstd::bulk::Decompressor::new()
                    .map_err(|error| Error::io("creating a zstd decompressor", error))?,
            );
        }
        cell.as_mut()
            .expect("set above")
            .decompress_to_buffer(stored, raw)
            .map_err(|error| Error::corrupt(describe(location), error.to_string()))
    })?;
    if written != raw.len() {
        return Err(Error::corrupt(
            describe(location),
            format!("decompressed to {written} bytes, expected {}", raw.len()),
        ));
    }
    Ok(())
}

fn describe(location: &ChunkLocation) -> String {
    format!(
        "chunk at offset {} of container {:016x}",
        location.offset, location.container
    )
}
