//! Fixed-size records of the chunk table and the container table, stored in page-store areas.
//!
//! Chunk record (64 bytes, little-endian), record index = chunk id:
//!
//! ```text
//!  0..32  fingerprint (indexed chunks) | owner u64, written_at u64, zeros (unfingerprinted)
//!         | fingerprint 0..16, next chunk of its chain u64 at 16..24, zeros (chained)
//! 32..40  container id               | next free chunk id (free records)
//! 40..44  offset of stored bytes     44..48 stored bytes     48..52 raw bytes
//! 52..54  container chunk flags      54..56 state bits: 1 in use, 2 indexed, 4 chained
//! 56..60  CRC-32C of stored bytes    60..64 reference count
//! ```
//!
//! *Chained* records (bit 4) are indexed chunks with a weak fingerprint that another chunk
//! shares and that is not the last of the chain (`chains`): weak fingerprints fill at most 16
//! bytes, so the next chunk id fits in the fingerprint's zero tail. The bit is clear at the end
//! of a chain, so records of chains of one are laid out as before chaining existed.
//!
//! Container record (64 bytes), record index = container id:
//!
//! ```text
//!  0..1   state   8..16 bytes (sealed size)   16..24 live bytes   24..28 live chunks
//! 32..40  created (unix seconds)
//! ```

use crate::bytes::{u16_at, u32_at, u64_at};
use crate::container::ChunkLocation;
use crate::fingerprint::Fingerprint;

use super::ChunkId;

pub(crate) const CHUNK_RECORD_BYTES: usize = 64;
pub(crate) const CONTAINER_RECORD_BYTES: usize = 64;

const STATE_IN_USE: u16 = 1;
const STATE_INDEXED: u16 = 2;
const STATE_CHAINED: u16 = 4;
/// Bytes of a fingerprint a chained record keeps (every weak fingerprint fits).
const CHAINED_FINGERPRINT_BYTES: usize = 16;

/// One decoded chunk-table record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChunkRecord {
    pub in_use: bool,
    /// The fingerprint is valid and present in the index.
    pub indexed: bool,
    pub fingerprint: Fingerprint,
    /// For unfingerprinted chunks: the owner's reference (for example volume and block).
    pub owner: u64,
    /// For unfingerprinted chunks: when the chunk was written (unix seconds).
    pub written_at: u64,
    pub location: ChunkLocation,
    pub references: u32,
    /// For free records: the next free chunk id.
    pub next_free: ChunkId,
    /// For indexed chunks with a weak fingerprint: the next chunk with the same fingerprint
    /// (`chains`), 0 at the end of the chain.
    pub chain_next: ChunkId,
}

impl ChunkRecord {
    pub(crate) fn decode(bytes: &[u8]) -> ChunkRecord {
        assert_eq!(bytes.len(), CHUNK_RECORD_BYTES);
        let state = u16_at(bytes, 54);
        let in_use = state & STATE_IN_USE != 0;
        let indexed = state & STATE_INDEXED != 0;
        let chained = indexed && state & STATE_CHAINED != 0;
        let mut fingerprint = Fingerprint::ZERO;
        let (mut owner, mut written_at, mut chain_next) = (0, 0, 0);
        if chained {
            fingerprint.0[..CHAINED_FINGERPRINT_BYTES]
                .copy_from_slice(&bytes[..CHAINED_FINGERPRINT_BYTES]);
            chain_next = u64_at(bytes, CHAINED_FINGERPRINT_BYTES);
        } else if indexed {
            fingerprint.0.copy_from_slice(&bytes[..32]);
        } else {
            owner = u64_at(bytes, 0);
            written_at = u64_at(bytes, 8);
        }
        let container = u64_at(bytes, 32);
        ChunkRecord {
            in_use,
            indexed,
            fingerprint,
            owner,
            written_at,
            location: ChunkLocation {
                container: if in_use { container } else { 0 },
                offset: u32_at(bytes, 40),
                stored_bytes: u32_at(bytes, 44),
                raw_bytes: u32_at(bytes, 48),
                flags: u16_at(bytes, 52) as u32,
                checksum: u32_at(bytes, 56),
            },
            references: u32_at(bytes, 60),
            next_free: if in_use { 0 } else { container },
            chain_next,
        }
    }

    pub(crate) fn encode(&self, out: &mut [u8]) {
        assert_eq!(out.len(), CHUNK_RECORD_BYTES);
        assert!(self.location.flags <= u16::MAX as u32);
        assert!(
            self.chain_next == 0 || self.indexed,
            "only indexed chunks are chained"
        );
        out.fill(0);
        let chained = self.chain_next != 0;
        if chained {
            assert!(
                self.fingerprint.0[CHAINED_FINGERPRINT_BYTES..]
                    .iter()
                    .all(|&byte| byte == 0),
                "only weak fingerprints (at most 16 bytes) are chained"
            );
            out[..CHAINED_FINGERPRINT_BYTES]
                .copy_from_slice(&self.fingerprint.0[..CHAINED_FINGERPRINT_BYTES]);
            out[CHAINED_FINGERPRINT_BYTES..CHAINED_FINGERPRINT_BYTES + 8]
                .copy_from_slice(&self.chain_next.to_le_bytes());
        } else if self.indexed {
            out[..32].copy_from_slice(&self.fingerprint.0);
        } else {
            out[..8].copy_from_slice(&self.owner.to_le_bytes());
            out[8..16].copy_from_slice(&self.written_at.to_le_bytes());
        }
        let container = if self.in_use {
            self.location.container
        } else {
            self.next_free
        };
        out[32..40].copy_from_slice(&container.to_le_bytes());
        out[40..44].copy_from_slice(&self.location.offset.to_le_bytes());
        out[44..48].copy_from_slice(&self.location.stored_bytes.to_le_bytes());
        out[48..52].copy_from_slice(&self.location.raw_bytes.to_le_bytes());
        out[52..54].copy_from_slice(&(self.location.flags as u16).to_le_bytes());
        let state = (self.in_use as u16 * STATE_IN_USE)
            | (self.indexed as u16 * STATE_INDEXED)
            | (chained as u16 * STATE_CHAINED);
        out[54..56].copy_from_slice(&state.to_le_bytes());
        out[56..60].copy_from_slice(&self.location.checksum.to_le_bytes());
        out[60..64].copy_from_slice(&self.references.to_le_bytes());
    }
}

/// Life cycle of a container in the chunk store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ContainerState {
    /// No such container.
    #[default]
    None,
    /// Receiving appends.
    Open,
    /// Was open at a crash: holds valid chunks but is never appended to or sealed again.
    Closed,
    /// Sealed: immutable, with a trailer.
    Sealed,
    /// Holds no live chunk any more, by a change made since the last checkpoint.
    Retired,
    /// Retired by a change that a checkpoint made durable; removed after the next one, when
    /// no journal that a fallback to the previous checkpoint replays refers to it any more.
    Expired,
    /// Removed from storage.
    Removed,
}

impl ContainerState {
    fn code(self) -> u8 {
        match self {
            ContainerState::None => 0,
            ContainerState::Open => 1,
            ContainerState::Closed => 2,
            ContainerState::Sealed => 3,
            ContainerState::Retired => 4,
            ContainerState::Removed => 5,
            ContainerState::Expired => 6,
        }
    }

    fn from_code(code: u8) -> ContainerState {
        match code {
            1 => ContainerState::Open,
            2 => ContainerState::Closed,
            3 => ContainerState::Sealed,
            4 => ContainerState::Retired,
            5 => ContainerState::Removed,
            6 => ContainerState::Expired,
            _ => ContainerState::None,
        }
    }

    /// True for containers whose file exists and may hold live chunks.
    pub fn holds_chunks(self) -> bool {
        matches!(
            self,
            ContainerState::Open | ContainerState::Closed | ContainerState::Sealed
        )
    }
}

/// One decoded container-table record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ContainerRecord {
    pub state: ContainerState,
    /// Size of the sealed container file (0 until sealed).
    pub bytes: u64,
    /// Bytes of live chunks, headers included.
    pub live_bytes: u64,
    pub live_chunks: u32,
    pub created_at: u64,
}

impl ContainerRecord {
    pub(crate) fn decode(bytes: &[u8]) -> ContainerRecord {
        assert_eq!(bytes.len(), CONTAINER_RECORD_BYTES);
        ContainerRecord {
            state: ContainerState::from_code(bytes[0]),
            bytes: u64_at(bytes, 8),
            live_bytes: u64_at(bytes, 16),
            live_chunks: u32_at(bytes, 24),
            created_at: u64_at(bytes, 32),
        }
    }

    pub(crate) fn encode(&self, out: &mut [u8]) {
        assert_eq!(out.len(), CONTAINER_RECORD_BYTES);
        out.fill(0);
        out[0] = self.state.code();
        out[8..16].copy_from_slice(&self.bytes.to_le_bytes());
        out[16..24].copy_from_slice(&self.live_bytes.to_le_bytes());
        out[24..28].copy_from_slice(&self.live_chunks.to_le_bytes());
        out[32..40].copy_from_slice(&self.created_at.to_le_bytes());
    }
}
