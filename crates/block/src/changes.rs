//! The changes a block-device request makes ([`BlockChange`]), and their journal records.
//!
//! One record per request (or background step) holds every change it made, so a request is
//! replayed entirely or not at all: its chunk changes and the map updates that reference them
//! can never be separated by a crash. Encoding: change count u32, then per change a tag byte
//! (0 chunk change, 1 map update) and its fields little-endian; a map update is volume u32,
//! block u64, chunk id u64.
//!
//! Each record's journal tag ([`tag`]) names the blocks its map updates fall in: volume u32 |
//! first block u64 | block count u32, or all zeros for a record without map updates. The
//! journal keeps the tag twice, so a damaged record still says which blocks it wrote, and a
//! repair marks exactly those lost.

use std::ops::Range;

use crate::error::Result;
use onecopy_core::bytes::{u32_at, u64_at, ByteReader};
use onecopy_core::chunk_store::{ChunkChange, ChunkId};
use onecopy_core::journal::{RecordTag, RECORD_BYTES_MAX, TAG_BYTES};
use onecopy_core::Error;

use crate::volume::{VolumeId, VolumeRecord};

/// Bytes of the record header: the change count.
const COUNT_BYTES: usize = 4;
/// Bytes of an encoded map update: tag, volume, block, chunk id.
const MAP_UPDATE_BYTES: usize = 1 + 4 + 8 + 8;
/// Bytes of an encoded chunk release: tag, the chunk change's own tag, chunk id.
const CHUNK_RELEASE_BYTES: usize = 1 + 1 + 8;
/// Most blocks an operation that releases many (a trim or write-zeroes, a volume's deletion
/// or shrink) changes per journal record: it journals every this many, which bounds the
/// record's size and the memory its changes take.
pub const RECORD_RELEASED_BLOCKS_MAX: u64 = 1 << 16;

// A block released is a map update and the release of its old chunk; that many fit in a
// record.
const _: () = assert!(
    COUNT_BYTES + RECORD_RELEASED_BLOCKS_MAX as usize * (MAP_UPDATE_BYTES + CHUNK_RELEASE_BYTES)
        <= RECORD_BYTES_MAX
);

/// One change made by a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BlockChange {
    Chunk(ChunkChange),
    /// Block `block` of `volume` now refers to `chunk` (0: zeros).
    Map {
        volume: VolumeId,
        block: u64,
        chunk: ChunkId,
    },
    /// A volume was created or its record changed (name, size, hints, deletion under way).
    VolumeSet(Box<VolumeRecord>),
    /// A volume's deletion finished: its record is gone.
    VolumeRemoved(VolumeId),
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
            BlockChange::VolumeSet(record) => {
                let json = serde_json::to_vec(record).expect("volume records serialise");
                out.push(2);
                out.extend_from_slice(&(json.len() as u32).to_le_bytes());
                out.extend_from_slice(&json);
            }
            BlockChange::VolumeRemoved(volume) => {
                out.push(3);
                out.extend_from_slice(&volume.to_le_bytes());
            }
        }
    }
}

/// The journal tag of a record holding `changes`: the span of blocks its map updates touch,
/// in the volume of the first one. A request changes one volume; a background step that
/// remaps blocks of several volumes (deferred deduplication) replaces chunks by identical
/// ones, so losing it loses no data, and its tag is the zero tag.
pub fn tag(changes: &[BlockChange]) -> RecordTag {
    let mut span: Option<(VolumeId, u64, u64)> = None;
    let mut one_volume = true;
    for change in changes {
        if let BlockChange::Map { volume, block, .. } = *change {
            span = Some(match span {
                None => (volume, block, block),
                Some((first_volume, low, high)) => {
                    one_volume &= first_volume == volume;
                    (first_volume, low.min(block), high.max(block))
                }
            });
        }
    }
    let mut tag = [0u8; TAG_BYTES];
    if let (Some((volume, low, high)), true) = (span, one_volume) {
        let count = (high - low + 1).min(u32::MAX as u64) as u32;
        tag[..4].copy_from_slice(&volume.to_le_bytes());
        tag[4..12].copy_from_slice(&low.to_le_bytes());
        tag[12..16].copy_from_slice(&count.to_le_bytes());
    }
    tag
}

/// The volume and blocks a record's tag names; `None` for the zero tag.
pub fn tag_blocks(tag: &RecordTag) -> Option<(VolumeId, Range<u64>)> {
    let volume = u32_at(tag, 0);
    let first = u64_at(tag, 4);
    let count = u32_at(tag, 12);
    (volume != 0 && count > 0).then(|| (volume, first..first.saturating_add(count as u64)))
}

/// Decodes a journal record payload.
pub fn decode(payload: &[u8]) -> Result<Vec<BlockChange>> {
    let malformed = || Error::corrupt("block journal record", "malformed");
    let mut reader = ByteReader::new(payload);
    let count = reader.u32().ok_or_else(malformed)? as usize;
    // Each change takes at least 5 bytes, which bounds the allocation for corrupt counts.
    if count > payload.len() / 5 {
        return Err(malformed().into());
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
            2 => {
                let length = reader.u32().ok_or_else(malformed)? as usize;
                let json = reader.take(length).ok_or_else(malformed)?;
                let record = serde_json::from_slice(json).map_err(|_| malformed())?;
                changes.push(BlockChange::VolumeSet(Box::new(record)));
            }
            3 => changes.push(BlockChange::VolumeRemoved(
                reader.u32().ok_or_else(malformed)?,
            )),
            _ => return Err(malformed().into()),
        }
    }
    if !reader.is_empty() {
        return Err(malformed().into());
    }
    Ok(changes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the sizes that bound a record of released blocks are those of the encoding.
    /// Method: encode one map update and one chunk release.
    #[test]
    fn released_block_sizes_match_the_encoding() {
        let mut payload = Vec::new();
        encode(&[], &mut payload);
        assert_eq!(payload.len(), COUNT_BYTES);
        let map = BlockChange::Map {
            volume: 1,
            block: 2,
            chunk: 0,
        };
        encode(&[map], &mut payload);
        assert_eq!(payload.len(), COUNT_BYTES + MAP_UPDATE_BYTES);
        let release = BlockChange::Chunk(ChunkChange::Released { id: 3 });
        encode(&[release], &mut payload);
        assert_eq!(payload.len(), COUNT_BYTES + CHUNK_RELEASE_BYTES);
    }

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

    /// Goal: a tag names the span of blocks a record's map updates touch in its volume, and
    /// records without map updates or spanning volumes have the zero tag.
    #[test]
    fn tags_name_the_blocks_written() {
        let map = |volume, block| BlockChange::Map {
            volume,
            block,
            chunk: 9,
        };
        let changes = [
            BlockChange::Chunk(ChunkChange::Referenced { id: 4 }),
            map(3, 100),
            map(3, 97),
            map(3, 101),
        ];
        assert_eq!(tag_blocks(&tag(&changes)), Some((3, 97..102)));
        assert_eq!(tag_blocks(&tag(&changes[..1])), None);
        assert_eq!(tag_blocks(&tag(&[map(1, 5), map(2, 5)])), None);
    }
}
