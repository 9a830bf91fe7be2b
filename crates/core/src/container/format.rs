//! Byte layout of a container file. All integers are little-endian.
//!
//! ```text
//! header   (64 B)  magic "OCCNTR01" | version u32 | flags u32 | container id u64 |
//!                  created unix seconds u64 | zeros
//! record*          chunk header (52 B) | stored bytes
//!                  chunk header = fingerprint [32] | stored_bytes u32 | raw_bytes u32 |
//!                                 flags u32 | crc32c(stored bytes) u32 |
//!                                 crc32c(the 48 header bytes before it) u32
//! trailer          (only once sealed) entry* | timestamp u64 | chunk count u32 | zeros u32
//!                  entry = data offset u32 | chunk header (52 B)
//! footer   (32 B)  magic "OCCNTEND" | trailer offset u64 | trailer bytes u32 |
//!                  crc32c(trailer) u32 | chunk count u32 | zeros u32
//! ```
//!
//! Every record carries its own header so an unsealed container (the open one after a crash)
//! can be scanned from the front; the trailer repeats the headers with their offsets so a
//! sealed container's fingerprints load with one read of its tail. A header carries its own
//! checksum: a changed fingerprint, size or flag is damage, found by a scan, never a chunk
//! described wrongly.

use crate::bytes::{le32, u32_at, u64_at, ByteReader};
use crate::fingerprint::{Fingerprint, FINGERPRINT_BYTES};

pub(crate) const HEADER_MAGIC: &[u8; 8] = b"OCCNTR01";
pub(crate) const FOOTER_MAGIC: &[u8; 8] = b"OCCNTEND";
pub(crate) const FORMAT_VERSION: u32 = 2;
/// Bytes of the container header.
pub const HEADER_BYTES: usize = 64;
/// Bytes of the header in front of every chunk's stored bytes.
pub const CHUNK_HEADER_BYTES: usize = 52;
/// Bytes of one trailer entry.
pub const TRAILER_ENTRY_BYTES: usize = 4 + CHUNK_HEADER_BYTES;
/// Bytes of the trailer after its entries.
pub const TRAILER_TAIL_BYTES: usize = 16;
/// Bytes of the footer.
pub const FOOTER_BYTES: usize = 32;

/// Chunk flag: the stored bytes are a zstd frame of the raw bytes.
pub const CHUNK_COMPRESSED: u32 = 1 << 0;
/// Chunk flag: the chunk was stored without a fingerprint (a no-dedup write); its fingerprint
/// field holds zeros.
pub const CHUNK_UNFINGERPRINTED: u32 = 1 << 1;
/// Chunk flag, only beside [`CHUNK_COMPRESSED`]: the zstd frame was made by a recompression
/// at a stronger level (the backup store's, docs/DESIGN.md, "Recompression"), which leaves
/// such chunks alone from then on.
pub const CHUNK_RECOMPRESSED: u32 = 1 << 2;
const KNOWN_CHUNK_FLAGS: u32 = CHUNK_COMPRESSED | CHUNK_UNFINGERPRINTED | CHUNK_RECOMPRESSED;

/// The header stored in front of a chunk and repeated in the trailer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkHeader {
    pub fingerprint: Fingerprint,
    pub stored_bytes: u32,
    pub raw_bytes: u32,
    pub flags: u32,
    pub checksum: u32,
}

impl ChunkHeader {
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&self.fingerprint.0);
        out.extend_from_slice(&self.stored_bytes.to_le_bytes());
        out.extend_from_slice(&self.raw_bytes.to_le_bytes());
        out.extend_from_slice(&self.flags.to_le_bytes());
        out.extend_from_slice(&self.checksum.to_le_bytes());
        let header_checksum = crc32c::crc32c(&out[start..]);
        out.extend_from_slice(&header_checksum.to_le_bytes());
        debug_assert_eq!(out.len() - start, CHUNK_HEADER_BYTES);
    }

    /// The fields in which this header differs from `expected`, by name ("fingerprint",
    /// "stored size", "raw size", "flags", "checksum"); empty when they agree.
    pub fn differences(&self, expected: &ChunkHeader) -> Vec<&'static str> {
        let mut differing = Vec::new();
        if self.fingerprint != expected.fingerprint {
            differing.push("fingerprint");
        }
        if self.stored_bytes != expected.stored_bytes {
            differing.push("stored size");
        }
        if self.raw_bytes != expected.raw_bytes {
            differing.push("raw size");
        }
        if self.flags != expected.flags {
            differing.push("flags");
        }
        if self.checksum != expected.checksum {
            differing.push("checksum");
        }
        differing
    }

    /// Decodes the record header at the front of `bytes` as stored in a container body;
    /// `None` when it fails its checksum or cannot be a header.
    pub fn parse(bytes: &[u8]) -> Option<ChunkHeader> {
        ChunkHeader::decode(bytes, super::CHUNK_BYTES_MAX)
    }

    /// Decodes a header; `None` when the bytes cannot be a header (a header checksum that
    /// does not match, unknown flags, a compressed size larger than the raw size allows, or
    /// sizes over `chunk_bytes_max`).
    pub(crate) fn decode(bytes: &[u8], chunk_bytes_max: u32) -> Option<ChunkHeader> {
        let covered = bytes.get(..CHUNK_HEADER_BYTES - 4)?;
        let stored_checksum = le32(bytes, CHUNK_HEADER_BYTES - 4)?;
        if crc32c::crc32c(covered) != stored_checksum {
            return None;
        }
        let mut reader = ByteReader::new(covered);
        let fingerprint = Fingerprint(reader.take(FINGERPRINT_BYTES)?.try_into().ok()?);
        let header = ChunkHeader {
            fingerprint,
            stored_bytes: reader.u32()?,
            raw_bytes: reader.u32()?,
            flags: reader.u32()?,
            checksum: reader.u32()?,
        };
        let plausible = header.flags & !KNOWN_CHUNK_FLAGS == 0
            && header.raw_bytes > 0
            && header.raw_bytes <= chunk_bytes_max
            && header.stored_bytes > 0
            && header.stored_bytes <= chunk_bytes_max.saturating_add(chunk_bytes_max / 8 + 64)
            && (header.flags & CHUNK_COMPRESSED != 0 || header.stored_bytes == header.raw_bytes)
            && (header.flags & CHUNK_RECOMPRESSED == 0 || header.flags & CHUNK_COMPRESSED != 0);
        plausible.then_some(header)
    }
}

pub(crate) fn encode_header(id: u64, created_unix_seconds: u64) -> [u8; HEADER_BYTES] {
    let mut header = [0u8; HEADER_BYTES];
    header[..8].copy_from_slice(HEADER_MAGIC);
    header[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    header[16..24].copy_from_slice(&id.to_le_bytes());
    header[24..32].copy_from_slice(&created_unix_seconds.to_le_bytes());
    header
}

/// Decodes a container header into (container id, created unix seconds).
pub(crate) fn decode_header(bytes: &[u8; HEADER_BYTES]) -> Option<(u64, u64)> {
    if &bytes[..8] != HEADER_MAGIC || u32_at(bytes, 8) != FORMAT_VERSION {
        return None;
    }
    Some((u64_at(bytes, 16), u64_at(bytes, 24)))
}

/// The decoded footer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Footer {
    pub trailer_offset: u64,
    pub trailer_bytes: u32,
    pub trailer_checksum: u32,
    pub chunk_count: u32,
}

impl Footer {
    pub(crate) fn encode(&self) -> [u8; FOOTER_BYTES] {
        let mut footer = [0u8; FOOTER_BYTES];
        footer[..8].copy_from_slice(FOOTER_MAGIC);
        footer[8..16].copy_from_slice(&self.trailer_offset.to_le_bytes());
        footer[16..20].copy_from_slice(&self.trailer_bytes.to_le_bytes());
        footer[20..24].copy_from_slice(&self.trailer_checksum.to_le_bytes());
        footer[24..28].copy_from_slice(&self.chunk_count.to_le_bytes());
        footer
    }

    pub(crate) fn decode(bytes: &[u8]) -> Option<Footer> {
        if bytes.len() != FOOTER_BYTES || &bytes[..8] != FOOTER_MAGIC {
            return None;
        }
        Some(Footer {
            trailer_offset: u64_at(bytes, 8),
            trailer_bytes: u32_at(bytes, 16),
            trailer_checksum: u32_at(bytes, 20),
            chunk_count: u32_at(bytes, 24),
        })
    }
}
