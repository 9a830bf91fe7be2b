//! Journal records of the block device.
//!
//! One record per request (or background step) holds every change it made, so a request is
//! replayed entirely or not at all: its chunk changes and the map updates that reference them
//! can never be separated by a crash. Encoding: change count u32, then per change a tag byte
//! (0 chunk change, 1 map update) and its fields little-endian; a map update is volume u32,
//! block u64, chunk id u64.

use onecopy_core::chunk_store::{ChunkChange, ChunkId};
use onecopy_core::pages::ByteReader;
use onecopy_core::{Error, Result};

use crate::volume::VolumeId;

/// One change made by a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockChange {
    Chunk(ChunkChange),
    /// Block `block` of `volume` now refers to `chunk` (0: zeros).
    Map {
        volume: VolumeId,
        block: u64,
        chunk: ChunkId,
    },
}

/// Encodes the changes of one request as a journal record payload.
pub fn encode(changes: &[BlockChange], out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&(changes.len() as u32).to_le_bytes());
    for change in changes {
        match change {
            BlockChange::Chunk(chunk_change) => {
                out.push(0);
                chunk_change.encode(out);
            }
            BlockChange::Map {
                volume,
                block,
                chunk,
            } => {
                out.push(1);
                out.extend_from_slice(&volume.to_le_bytes());
                out.extend_from_slice(&block.to_le_bytes());
                out.extend_from_slice(&chunk.to_le_bytes());
            }
        }
    }
}

/// Decodes a journal record payload.
pub fn decode(payload: &[u8]) -> Result<Vec<BlockChange>> {
    let malformed = || Error::corrupt("block journal record", "malformed");
    let mut reader = ByteReader { bytes: payload };
    let count = reader.u32().ok_or_else(malformed)? as usize;
    // Each change takes at least 9 bytes, which bounds the allocation for corrupt counts.
    if count > payload.len() / 9 {
        return Err(malformed());
    }
    let mut changes = Vec::with_capacity(count);
    for _ in 0..count {
        match reader.take(1).ok_or_else(malformed)?[0] {
            0 => changes.push(BlockChange::Chunk(ChunkChange::decode(&mut reader)?)),
            1 => changes.push(BlockChange::Map {
                volume: reader.u32().ok_or_else(malformed)?,
                block: reader.u64().ok_or_else(malformed)?,
                chunk: reader.u64().ok_or_else(malformed)?,
            }),
            _ => return Err(malformed()),
        }
    }
    if !reader.bytes.is_empty() {
        return Err(malformed());
    }
    Ok(changes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: records round-trip, and truncated or padded payloads are rejected.
    #[test]
    fn round_trip_and_rejects_garbage() {
        let changes = vec![
            BlockChange::Chunk(ChunkChange::Referenced { id: 4 }),
            BlockChange::Map {
                volume: 2,
                block: 77,
                chunk: 4,
            },
            BlockChange::Chunk(ChunkChange::Released { id: 3 }),
        ];
        let mut payload = Vec::new();
        encode(&changes, &mut payload);
        assert_eq!(decode(&payload).unwrap(), changes);
        assert!(decode(&payload[..payload.len() - 1]).is_err());
        payload.push(0);
        assert!(decode(&payload).is_err());
        assert!(decode(&[255, 255, 255, 255]).is_err());
    }
}
