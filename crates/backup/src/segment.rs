//! Segments, their two-level reference counts, and container records (paper 2 §2.4.2, §3.1).
//!
//! A **segment** is a run of whole chunks cut by the two-level chunker and the unit of inline
//! deduplication. Each segment lives in exactly one container (or none, when every chunk is
//! null or removed). Its catalog records:
//!
//! - a **head** (`segment_heads`, small, rewritten often): fingerprint, state, and the
//!   *segment reference count* — occurrences of the segment in live recipes;
//! - a **record** (`segments`): fingerprint, state, container, and one entry per chunk with its
//!   fingerprint, size, where it is stored, and its *chunk reference count* — archival recipes
//!   holding a direct reference to it.
//!
//! States: a **shared** segment is in a shared container (timestamp 0), complete, and in the
//! segment index, so new backups may deduplicate against it. When its reference count drops
//! to zero it is *settled*: chunks with no direct reference are removed, and the others are
//! repackaged into an **archival** container stamped with the time of the backup that released
//! it; an archival segment is out of the index and never gains live references again. A chunk
//! may be removed only when its segment's count is zero and its own count is zero; a segment
//! whose chunks are all removed or null dies (its records are deleted).
//!
//! **Containers.** A container record lists the segments stored in it, its kind and time
//! stamp (also in the container's trailer). A container is removed when its last segment
//! dies or moves out, which is how deleting a backup drops its containers without reading them.
//!
//! Formats (all integers little-endian, each record ends with a CRC-32C):
//!
//! ```text
//! head:      fingerprint [32] | state u8 | live references u32
//! record:    "SEG2" | fingerprint [32] | state u8 | container+1 varint (0 = none) |
//!            chunk count varint | chunk*
//! chunk:     kind u8 (0 zero, 1 stored, 2 removed, 3 lost) | raw bytes varint |
//!            [stored: fingerprint [32] | direct references varint | offset varint |
//!             stored bytes varint | flags varint | crc u32]
//!            [lost: fingerprint [32] | direct references varint]
//! container: "CNT1" | kind u8 (1 shared, 2 archival) | timestamp u64 | bytes u64 |
//!            segment count u32 | segment id u64*
//! ```
//!
//! `varint` is unsigned LEB128 ([`crate::codec`]). A zero or removed chunk keeps only its
//! size: nothing looks its fingerprint up (reverse deduplication matches stored chunks, and
//! a removed chunk can never be referenced directly), and after reverse deduplication most
//! chunks of a series are removed ones, so they are most of the catalog: 2-3 bytes each,
//! where fixed-width fields with every chunk's fingerprint and reference count would take 41.
//!
//! A **lost** chunk is one whose stored bytes a repair found damaged with no intact copy
//! anywhere ([`crate::losses`]): it keeps its fingerprint and its references, so that reads of
//! it fail naming the loss, reference counts stay right, and reverse deduplication can still
//! point a backup at an intact copy the successor stores.

use onecopy_core::catalog::IdTable;
use onecopy_core::container::{ChunkLocation, ContainerId};
use onecopy_core::fingerprint::Fingerprint;

use crate::codec::{Decoder, Encoder};
use crate::error::Result;

/// Names a segment; allocated increasing, never reused while the segment exists.
pub type SegmentId = u64;

pub(crate) const SEGMENT_HEADS: IdTable = IdTable("segment_heads");
pub(crate) const SEGMENTS: IdTable = IdTable("segments");
pub(crate) const CONTAINERS: IdTable = IdTable("containers");

/// Magic of segment records.
const SEGMENT_MAGIC: &[u8; 4] = b"SEG2";

/// Whether a segment may still be deduplicated against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentState {
    /// Complete, in a shared container and in the segment index.
    Shared,
    /// Settled: out of the index, possibly with removed chunks.
    Archival,
}

impl SegmentState {
    fn code(self) -> u8 {
        match self {
            SegmentState::Shared => 1,
            SegmentState::Archival => 2,
        }
    }
    fn decode(decoder: &Decoder, code: u8) -> Result<Self> {
        match code {
            1 => Ok(SegmentState::Shared),
            2 => Ok(SegmentState::Archival),
            _ => decoder.invalid(format!("unknown segment state {code}")),
        }
    }
}

/// The small, often-updated part of a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentHead {
    pub fingerprint: Fingerprint,
    pub state: SegmentState,
    /// Occurrences in live recipes.
    pub live_references: u32,
}

impl SegmentHead {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut encoder = Encoder::with_capacity(44);
        encoder.fingerprint(&self.fingerprint);
        encoder.u8(self.state.code());
        encoder.u32(self.live_references);
        encoder.finish()
    }

    pub(crate) fn decode(bytes: &[u8], id: SegmentId) -> Result<Self> {
        let what = format!("head of segment {id}");
        let mut decoder = Decoder::new_checked(bytes, &what)?;
        let fingerprint = decoder.fingerprint()?;
        let code = decoder.u8()?;
        let state = SegmentState::decode(&decoder, code)?;
        let live_references = decoder.u32()?;
        decoder.finish()?;
        Ok(SegmentHead {
            fingerprint,
            state,
            live_references,
        })
    }
}

/// Where a chunk of a segment is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkStorage {
    /// A null chunk: never stored.
    Zero,
    /// In the segment's container.
    Stored(ChunkLocation),
    /// Removed by reverse deduplication or deletion; nothing may reference it directly.
    Removed,
    /// Its stored bytes were damaged and no intact copy was found; a repair recorded the loss
    /// ([`crate::losses`]). Referenced like a stored chunk; every read of it fails.
    Lost,
}

/// One chunk of a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentChunk {
    /// The fingerprint of a stored or lost chunk. Zero and removed chunks do not keep theirs:
    /// read back from the catalog, it is all zeros.
    pub fingerprint: Fingerprint,
    pub raw_bytes: u32,
    pub storage: ChunkStorage,
    /// Archival recipes holding a direct reference to this chunk.
    pub direct_references: u32,
}

/// The full record of a segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentRecord {
    pub fingerprint: Fingerprint,
    pub state: SegmentState,
    pub container: Option<ContainerId>,
    pub chunks: Vec<SegmentChunk>,
}

impl SegmentRecord {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut encoder = Encoder::with_capacity(64 + self.chunks.len() * 8);
        encoder.raw(SEGMENT_MAGIC);
        encoder.fingerprint(&self.fingerprint);
        encoder.u8(self.state.code());
        encoder.varint(self.container.map_or(0, |id| id + 1));
        encoder.varint(self.chunks.len() as u64);
        for chunk in &self.chunks {
            match chunk.storage {
                ChunkStorage::Zero | ChunkStorage::Removed => {
                    assert_eq!(
                        chunk.direct_references, 0,
                        "only stored chunks are referenced directly"
                    );
                    encoder.u8(if chunk.storage == ChunkStorage::Zero {
                        0
                    } else {
                        2
                    });
                    encoder.varint(chunk.raw_bytes.into());
                }
                ChunkStorage::Stored(location) => {
                    assert_eq!(Some(location.container), self.container);
                    encoder.u8(1);
                    encoder.varint(chunk.raw_bytes.into());
                    encoder.fingerprint(&chunk.fingerprint);
                    encoder.varint(chunk.direct_references.into());
                    encoder.varint(location.offset.into());
                    encoder.varint(location.stored_bytes.into());
                    encoder.varint(location.flags.into());
                    encoder.u32(location.checksum);
                }
                ChunkStorage::Lost => {
                    encoder.u8(3);
                    encoder.varint(chunk.raw_bytes.into());
                    encoder.fingerprint(&chunk.fingerprint);
                    encoder.varint(chunk.direct_references.into());
                }
            }
        }
        encoder.finish()
    }

    pub(crate) fn decode(bytes: &[u8], id: SegmentId) -> Result<Self> {
        let what = format!("record of segment {id}");
        let mut decoder = Decoder::new_checked(bytes, &what)?;
        let magic = [decoder.u8()?, decoder.u8()?, decoder.u8()?, decoder.u8()?];
        if &magic != SEGMENT_MAGIC {
            return decoder.invalid("bad magic");
        }
        let fingerprint = decoder.fingerprint()?;
        let code = decoder.u8()?;
        let state = SegmentState::decode(&decoder, code)?;
        let container = decoder.varint()?.checked_sub(1);
        let count = decoder.varint()?;
        let mut chunks = Vec::with_capacity(count.min(1 << 20) as usize);
        for _ in 0..count {
            let kind = decoder.u8()?;
            let raw_bytes = decoder.varint_u32()?;
            let (storage, fingerprint, direct_references) = match (kind, container) {
                (0, _) => (ChunkStorage::Zero, Fingerprint::ZERO, 0),
                (2, _) => (ChunkStorage::Removed, Fingerprint::ZERO, 0),
                (1, Some(container)) => {
                    let fingerprint = decoder.fingerprint()?;
                    let direct_references = decoder.varint_u32()?;
                    let location = ChunkLocation {
                        container,
                        offset: decoder.varint_u32()?,
                        stored_bytes: decoder.varint_u32()?,
                        raw_bytes,
                        flags: decoder.varint_u32()?,
                        checksum: decoder.u32()?,
                    };
                    (
                        ChunkStorage::Stored(location),
                        fingerprint,
                        direct_references,
                    )
                }
                (1, None) => return decoder.invalid("a stored chunk without a container"),
                (3, _) => {
                    let fingerprint = decoder.fingerprint()?;
                    (ChunkStorage::Lost, fingerprint, decoder.varint_u32()?)
                }
                _ => return decoder.invalid(format!("unknown chunk kind {kind}")),
            };
            chunks.push(SegmentChunk {
                fingerprint,
                raw_bytes,
                storage,
                direct_references,
            });
        }
        decoder.finish()?;
        Ok(SegmentRecord {
            fingerprint,
            state,
            container,
            chunks,
        })
    }

    /// Bytes of the segment's stream.
    pub fn raw_bytes(&self) -> u64 {
        self.chunks.iter().map(|chunk| chunk.raw_bytes as u64).sum()
    }

    /// Bytes the segment occupies in its container (stored chunks, headers included).
    pub fn stored_bytes(&self) -> u64 {
        self.chunks
            .iter()
            .filter_map(|chunk| match chunk.storage {
                ChunkStorage::Stored(location) => Some(location.footprint_bytes()),
                _ => None,
            })
            .sum()
    }

    /// True when no chunk is stored or lost any more: nothing can reference the segment.
    pub fn is_empty(&self) -> bool {
        !self
            .chunks
            .iter()
            .any(|chunk| matches!(chunk.storage, ChunkStorage::Stored(_) | ChunkStorage::Lost))
    }

    /// True when some chunk is stored (the segment needs a container).
    pub fn has_stored(&self) -> bool {
        self.chunks
            .iter()
            .any(|chunk| matches!(chunk.storage, ChunkStorage::Stored(_)))
    }

    /// True when some chunk is lost.
    pub fn has_lost(&self) -> bool {
        self.chunks
            .iter()
            .any(|chunk| chunk.storage == ChunkStorage::Lost)
    }
}

/// What a container holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ContainerKind {
    /// Segments with live references (time stamp 0: undefined).
    Shared,
    /// Settled segments, stamped with the time of the backup that released them.
    Archival,
}

/// The catalog's record of a container of the backup store: its kind, its time stamp and the
/// segments it holds (the core's chunk store keeps a different, fixed-size
/// `chunk_store::records::ContainerRecord` for the block device's containers).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentContainer {
    pub kind: ContainerKind,
    /// Paper 2's container time stamp (unix nanoseconds; 0 for shared containers).
    pub timestamp: u64,
    /// Size of the container file.
    pub bytes: u64,
    /// Segments stored in it, ascending.
    pub segments: Vec<SegmentId>,
}

impl SegmentContainer {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut encoder = Encoder::with_capacity(32 + self.segments.len() * 8);
        encoder.raw(b"CNT1");
        encoder.u8(match self.kind {
            ContainerKind::Shared => 1,
            ContainerKind::Archival => 2,
        });
        encoder.u64(self.timestamp);
        encoder.u64(self.bytes);
        encoder.u32(self.segments.len() as u32);
        for &segment in &self.segments {
            encoder.u64(segment);
        }
        encoder.finish()
    }

    pub(crate) fn decode(bytes: &[u8], id: ContainerId) -> Result<Self> {
        let what = format!("record of container {id:016x}");
        let mut decoder = Decoder::new_checked(bytes, &what)?;
        if [decoder.u8()?, decoder.u8()?, decoder.u8()?, decoder.u8()?] != *b"CNT1" {
            return decoder.invalid("bad magic");
        }
        let kind = match decoder.u8()? {
            1 => ContainerKind::Shared,
            2 => ContainerKind::Archival,
            other => return decoder.invalid(format!("unknown container kind {other}")),
        };
        let timestamp = decoder.u64()?;
        let bytes = decoder.u64()?;
        let count = decoder.u32()? as usize;
        let mut segments = Vec::with_capacity(count.min(1 << 20));
        for _ in 0..count {
            segments.push(decoder.u64()?);
        }
        decoder.finish()?;
        Ok(SegmentContainer {
            kind,
            timestamp,
            bytes,
            segments,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: records of every chunk kind round-trip; heads and containers too.
    #[test]
    fn records_round_trip() {
        let location = ChunkLocation {
            container: 5,
            offset: 112,
            stored_bytes: 900,
            raw_bytes: 4000,
            flags: 1,
            checksum: 0xdead,
        };
        let record = SegmentRecord {
            fingerprint: Fingerprint([3; 32]),
            state: SegmentState::Archival,
            container: Some(5),
            chunks: vec![
                SegmentChunk {
                    fingerprint: Fingerprint([1; 32]),
                    raw_bytes: 4000,
                    storage: ChunkStorage::Stored(location),
                    direct_references: 2,
                },
                SegmentChunk {
                    fingerprint: Fingerprint::ZERO,
                    raw_bytes: 8192,
                    storage: ChunkStorage::Zero,
                    direct_references: 0,
                },
                SegmentChunk {
                    fingerprint: Fingerprint::ZERO,
                    raw_bytes: 100,
                    storage: ChunkStorage::Removed,
                    direct_references: 0,
                },
                SegmentChunk {
                    fingerprint: Fingerprint([6; 32]),
                    raw_bytes: 3000,
                    storage: ChunkStorage::Lost,
                    direct_references: 4,
                },
            ],
        };
        let encoded = record.encode();
        assert_eq!(&encoded[..4], SEGMENT_MAGIC);
        assert_eq!(SegmentRecord::decode(&encoded, 1).unwrap(), record);
        // A zero or removed chunk's fingerprint is not kept.
        let mut forgetful = record.clone();
        forgetful.chunks[1].fingerprint = Fingerprint([2; 32]);
        forgetful.chunks[2].fingerprint = Fingerprint([4; 32]);
        assert_eq!(forgetful.encode(), encoded);
        // Only `SEG2` records are read: a record under another magic (`SEG1`, a format that
        // was never released) is refused, checksum intact or not.
        // Here: a well-formed `SEG1` record of no chunks and no container.
        let mut other_magic = Encoder::default();
        other_magic.raw(b"SEG1");
        other_magic.fingerprint(&Fingerprint([5; 32]));
        other_magic.u8(SegmentState::Archival.code());
        other_magic.u64(u64::MAX);
        other_magic.u32(0);
        assert!(SegmentRecord::decode(&other_magic.finish(), 1).is_err());
        let empty = SegmentRecord {
            fingerprint: Fingerprint([5; 32]),
            state: SegmentState::Archival,
            container: None,
            chunks: vec![record.chunks[2]],
        };
        assert_eq!(SegmentRecord::decode(&empty.encode(), 2).unwrap(), empty);
        // Damage inside the checksum is caught; a record that lies about its chunks is an
        // error, not a wrong record.
        let mut damaged = encoded.clone();
        damaged[40] ^= 1;
        assert!(SegmentRecord::decode(&damaged, 1).is_err());
        let mut encoder = Encoder::default();
        encoder.raw(&encoded[..encoded.len() - 4]);
        encoder.u8(0); // a chunk more than the count says
        assert!(SegmentRecord::decode(&encoder.finish(), 1).is_err());
        let head = SegmentHead {
            fingerprint: Fingerprint([9; 32]),
            state: SegmentState::Shared,
            live_references: 7,
        };
        assert_eq!(SegmentHead::decode(&head.encode(), 1).unwrap(), head);
        let container = SegmentContainer {
            kind: ContainerKind::Archival,
            timestamp: 123,
            bytes: 4096,
            segments: vec![1, 5, 9],
        };
        assert_eq!(
            SegmentContainer::decode(&container.encode(), 1).unwrap(),
            container
        );
    }
}
