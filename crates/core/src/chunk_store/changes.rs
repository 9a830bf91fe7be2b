//! [`ChunkChange`]: every mutation of the chunk store, and its journal encoding.
//!
//! Encoding: a tag byte, then the fields in declaration order, little-endian; a fingerprint
//! option is a presence byte followed by 32 bytes when present; a location is container u64,
//! offset u32, stored bytes u32, raw bytes u32, flags u32, checksum u32.

use crate::bytes::ByteReader;
use crate::container::{ChunkLocation, ContainerId};
use crate::fingerprint::Fingerprint;
use crate::{Error, Result};

use super::ChunkId;

/// One mutation of the chunk store (see the module documentation of `chunk_store`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkChange {
    /// A new chunk was appended at `location` and given id `id` with one reference; indexed
    /// under `fingerprint` when present.
    Stored {
        id: ChunkId,
        fingerprint: Option<Fingerprint>,
        owner: u64,
        written_at: u64,
        location: ChunkLocation,
    },
    /// One more reference to `id`.
    Referenced { id: ChunkId },
    /// One reference fewer to `id`; at zero the chunk is freed.
    Released { id: ChunkId },
    /// The reference count of `id` was set (repair by `check`); zero frees the chunk.
    ReferencesSet { id: ChunkId, references: u32 },
    /// Compaction copied `id` to `location`.
    Relocated {
        id: ChunkId,
        location: ChunkLocation,
    },
    /// Deferred deduplication fingerprinted an unindexed chunk and indexed it.
    Indexed {
        id: ChunkId,
        fingerprint: Fingerprint,
    },
    /// A container was created for appends.
    ContainerOpened { id: ContainerId, created_at: u64 },
    /// The open container was sealed at `bytes`.
    ContainerSealed { id: ContainerId, bytes: u64 },
    /// A container holds no live chunk any more and will be removed after the next checkpoint.
    ContainerRetired { id: ContainerId },
}

fn put_location(out: &mut Vec<u8>, location: &ChunkLocation) {
    out.extend_from_slice(&location.container.to_le_bytes());
    out.extend_from_slice(&location.offset.to_le_bytes());
    out.extend_from_slice(&location.stored_bytes.to_le_bytes());
    out.extend_from_slice(&location.raw_bytes.to_le_bytes());
    out.extend_from_slice(&location.flags.to_le_bytes());
    out.extend_from_slice(&location.checksum.to_le_bytes());
}

fn take_location(reader: &mut ByteReader<'_>) -> Option<ChunkLocation> {
    Some(ChunkLocation {
        container: reader.u64()?,
        offset: reader.u32()?,
        stored_bytes: reader.u32()?,
        raw_bytes: reader.u32()?,
        flags: reader.u32()?,
        checksum: reader.u32()?,
    })
}

fn take_fingerprint(reader: &mut ByteReader<'_>) -> Option<Fingerprint> {
    Some(Fingerprint(reader.take(32)?.try_into().ok()?))
}

impl ChunkChange {
    /// Appends the encoding of this change to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            ChunkChange::Stored {
                id,
                fingerprint,
                owner,
                written_at,
                location,
            } => {
                out.push(1);
                out.extend_from_slice(&id.to_le_bytes());
                match fingerprint {
                    Some(fingerprint) => {
                        out.push(1);
                        out.extend_from_slice(&fingerprint.0);
                    }
                    None => out.push(0),
                }
                out.extend_from_slice(&owner.to_le_bytes());
                out.extend_from_slice(&written_at.to_le_bytes());
                put_location(out, location);
            }
            ChunkChange::Referenced { id } => {
                out.push(2);
                out.extend_from_slice(&id.to_le_bytes());
            }
            ChunkChange::Released { id } => {
                out.push(3);
                out.extend_from_slice(&id.to_le_bytes());
            }
            ChunkChange::ReferencesSet { id, references } => {
                out.push(4);
                out.extend_from_slice(&id.to_le_bytes());
                out.extend_from_slice(&references.to_le_bytes());
            }
            ChunkChange::Relocated { id, location } => {
                out.push(5);
                out.extend_from_slice(&id.to_le_bytes());
                put_location(out, location);
            }
            ChunkChange::Indexed { id, fingerprint } => {
                out.push(6);
                out.extend_from_slice(&id.to_le_bytes());
                out.extend_from_slice(&fingerprint.0);
            }
            ChunkChange::ContainerOpened { id, created_at } => {
                out.push(7);
                out.extend_from_slice(&id.to_le_bytes());
                out.extend_from_slice(&created_at.to_le_bytes());
            }
            ChunkChange::ContainerSealed { id, bytes } => {
                out.push(8);
                out.extend_from_slice(&id.to_le_bytes());
                out.extend_from_slice(&bytes.to_le_bytes());
            }
            ChunkChange::ContainerRetired { id } => {
                out.push(9);
                out.extend_from_slice(&id.to_le_bytes());
            }
        }
    }

    /// Decodes one change from the front of `reader`.
    pub fn decode(reader: &mut ByteReader<'_>) -> Result<ChunkChange> {
        Self::decode_inner(reader)
            .ok_or_else(|| Error::corrupt("journal record", "malformed chunk change"))
    }

    fn decode_inner(reader: &mut ByteReader<'_>) -> Option<ChunkChange> {
        let tag = reader.take(1)?[0];
        Some(match tag {
            1 => {
                let id = reader.u64()?;
                let fingerprint = match reader.take(1)?[0] {
                    0 => None,
                    1 => Some(take_fingerprint(reader)?),
                    _ => return None,
                };
                ChunkChange::Stored {
                    id,
                    fingerprint,
                    owner: reader.u64()?,
                    written_at: reader.u64()?,
                    location: take_location(reader)?,
                }
            }
            2 => ChunkChange::Referenced { id: reader.u64()? },
            3 => ChunkChange::Released { id: reader.u64()? },
            4 => ChunkChange::ReferencesSet {
                id: reader.u64()?,
                references: reader.u32()?,
            },
            5 => ChunkChange::Relocated {
                id: reader.u64()?,
                location: take_location(reader)?,
            },
            6 => ChunkChange::Indexed {
                id: reader.u64()?,
                fingerprint: take_fingerprint(reader)?,
            },
            7 => ChunkChange::ContainerOpened {
                id: reader.u64()?,
                created_at: reader.u64()?,
            },
            8 => ChunkChange::ContainerSealed {
                id: reader.u64()?,
                bytes: reader.u64()?,
            },
            9 => ChunkChange::ContainerRetired { id: reader.u64()? },
            _ => return None,
        })
    }
}
