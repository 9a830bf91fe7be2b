//! Chains of chunks that share a weak fingerprint (paper 5 §3.5).
//!
//! Terms:
//! - a *weak* fingerprint ([`crate::fingerprint::FingerprintAlgorithm::is_weak`]) does not prove equal content:
//!   CRC-32C has 32 bits, so distinct chunks share one about once in 2^32 pairs, and a store of
//!   a few million chunks holds some;
//! - the *chain* of a weak fingerprint is every indexed chunk in use that has it. The index
//!   maps the fingerprint to the chain's *head*; each chunk's record names the next member
//!   (`ChunkRecord::chain_next`, 0 at the end). This is paper 5's "array of linked lists of
//!   chunk IDs", kept in the chunk table so that it is durable with it;
//! - a chain is *derived* data: the fingerprints in the chunk records say who belongs, and a
//!   rebuild ([`ChunkStore::rebuild`]) relinks every chain from them.
//!
//! Storing a chunk with a weak fingerprint ([`ChunkStore::place`]):
//! 1. the index gives the head (a filter negative or a miss means a new fingerprint);
//! 2. members are read and compared byte by byte with the new chunk, head first, at most
//!    [`CHAIN_COMPARISONS_MAX`] of them; equal bytes make the chunk a duplicate of that
//!    member (unless it has [`REFERENCES_MAX`] references);
//! 3. no member matched: the chunk is stored and indexed; applying its `Stored` change makes
//!    it the head, in front of the old head. A chain of [`CHAIN_COMPARISONS_MAX`] members
//!    without a match, or a member that is not what the chain says (a damaged record), stores
//!    the chunk unindexed instead, so a write never walks an unbounded chain.
//!
//! Freeing a member unlinks it: the head is replaced by its successor in the index, any other
//! member is cut out of its predecessor's record. Linking and unlinking happen in
//! [`ChunkStore::apply`], so journal replay rebuilds exactly the chains the live path built.
//!
//! Not guaranteed: the order of members (the newest is first while it lives; a rebuild orders
//! them by id); that a duplicate behind [`CHAIN_COMPARISONS_MAX`] members is found. A broken
//! chain (a damaged page of the chunk table) costs deduplication, never data: every member
//! is checked to be in use with the chain's fingerprint before its bytes are compared, and
//! `check` reports the members the chain does not reach.

use super::{ChunkId, ChunkRecord, ChunkStore, REFERENCES_MAX, ZERO_CHUNK};
use crate::fingerprint::Fingerprint;
use crate::pages::PageStore;
use crate::Result;

/// Most members of a chain whose bytes one store compares with the new chunk. Chains of a
/// 32-bit fingerprint hold one or two members until the store nears 2^32 chunks; a longer
/// chain is a sign of crafted collisions, and the bound keeps them from slowing every write.
pub const CHAIN_COMPARISONS_MAX: usize = 16;

/// Where a chunk about to be stored belongs ([`ChunkStore::place`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// The stored chunk `id` has the same bytes and can take one more reference.
    Duplicate(ChunkId),
    /// Store it and index it under its fingerprint (at the head of its chain when weak).
    Indexed,
    /// Store it without indexing it: the fingerprint is taken by other bytes (a strong
    /// fingerprint's index key collision), by a full chunk, or by a chain too long or broken.
    Unindexed,
}

impl ChunkStore {
    /// Decides where a chunk with `fingerprint` and bytes `data` belongs; see the module
    /// documentation. Strong fingerprints are trusted once the chunk record confirms the
    /// whole fingerprint; weak ones are confirmed by comparing bytes along the chain.
    pub fn place(
        &mut self,
        pages: &mut PageStore,
        fingerprint: &Fingerprint,
        data: &[u8],
    ) -> Result<Placement> {
        let Some(head) = self.index.lookup(pages, fingerprint)? else {
            return Ok(Placement::Indexed);
        };
        if !self.options.fingerprint.is_weak() {
            return self.place_strong(pages, head, fingerprint);
        }
        let mut member = head;
        for compared in 1..=CHAIN_COMPARISONS_MAX {
            let Some(record) = self.chain_member(pages, member, fingerprint)? else {
                self.counters.chain_breaks += 1;
                return Ok(Placement::Unindexed);
            };
            if self.same_bytes(pages, member, &record, data)? {
                if record.references < REFERENCES_MAX {
                    return Ok(Placement::Duplicate(member));
                }
                self.counters.reference_limit_copies += 1;
            } else {
                self.counters.weak_collisions += 1;
            }
            if record.chain_next == ZERO_CHUNK && compared < CHAIN_COMPARISONS_MAX {
                return Ok(Placement::Indexed);
            }
            member = record.chain_next;
        }
        // The chain holds CHAIN_COMPARISONS_MAX members (or more, linked by a deferred pass
        // or a rebuild), none of them this chunk.
        self.counters.chain_limit_copies += 1;
        Ok(Placement::Unindexed)
    }

    fn place_strong(
        &mut self,
        pages: &mut PageStore,
        id: ChunkId,
        fingerprint: &Fingerprint,
    ) -> Result<Placement> {
        let record = match self.record_in_use(pages, id) {
            Ok(record) => record,
            // The hit's record is unreadable (its page is damaged): store this copy anew.
            Err(error) if error.is_corrupt() => return Ok(Placement::Unindexed),
            Err(error) => return Err(error),
        };
        // The index compares only the first 16 bytes of fingerprints
        // ([`crate::index::IndexKey`]): the chunk's record must hold the whole one.
        if record.fingerprint != *fingerprint {
            self.counters.index_key_collisions += 1;
            return Ok(Placement::Unindexed);
        }
        if record.references >= REFERENCES_MAX {
            self.counters.reference_limit_copies += 1;
            return Ok(Placement::Unindexed);
        }
        Ok(Placement::Duplicate(id))
    }

    /// The record of chain member `id` if it is one: in use, indexed, with `fingerprint`.
    /// None for anything else, an unreadable record included: the chain is broken there.
    fn chain_member(
        &self,
        pages: &mut PageStore,
        id: ChunkId,
        fingerprint: &Fingerprint,
    ) -> Result<Option<ChunkRecord>> {
        if id == ZERO_CHUNK || id >= self.state.chunk_id_next {
            return Ok(None);
        }
        match self.record(pages, id) {
            Ok(record) if record.in_use && record.indexed && record.fingerprint == *fingerprint => {
                Ok(Some(record))
            }
            Ok(_) => Ok(None),
            Err(error) if error.is_corrupt() => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// True when stored chunk `id` (whose record is `record`) holds exactly `data`. A chunk
    /// whose stored bytes are damaged holds nothing a new chunk can share.
    fn same_bytes(
        &mut self,
        pages: &mut PageStore,
        id: ChunkId,
        record: &ChunkRecord,
        data: &[u8],
    ) -> Result<bool> {
        if record.location.raw_bytes as usize != data.len() {
            return Ok(false);
        }
        self.counters.chain_comparisons += 1;
        let mut stored = std::mem::take(&mut self.scratch);
        stored.resize(data.len(), 0);
        let read = self.read_into(pages, id, &mut stored);
        let equal = read.is_ok() && stored == data;
        self.scratch = stored;
        match read {
            Ok(()) => Ok(equal),
            Err(error) if error.is_corrupt() => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// Indexes chunk `id` under `fingerprint` and returns what its record's `chain_next`
    /// becomes: the old head of the chain for weak fingerprints, 0 otherwise. Part of
    /// [`ChunkStore::apply`].
    pub(super) fn link(
        &mut self,
        pages: &mut PageStore,
        fingerprint: &Fingerprint,
        id: ChunkId,
    ) -> Result<ChunkId> {
        let previous = self.index.insert(pages, fingerprint, id)?;
        assert_ne!(previous, Some(id), "chunk {id} is linked once");
        if self.options.fingerprint.is_weak() {
            Ok(previous.unwrap_or(ZERO_CHUNK))
        } else {
            Ok(ZERO_CHUNK)
        }
    }

    /// Removes indexed chunk `id`, whose record is `record`, from the index: from its chain
    /// for weak fingerprints. Part of freeing a chunk in [`ChunkStore::apply`]. A chain found
    /// broken is left as it is (the index may have been reset after damage): a rebuild
    /// relinks it, and walkers stop at the break.
    pub(super) fn unlink(
        &mut self,
        pages: &mut PageStore,
        id: ChunkId,
        record: &ChunkRecord,
    ) -> Result<()> {
        assert!(record.indexed, "only indexed chunks are unlinked");
        let fingerprint = record.fingerprint;
        if !self.options.fingerprint.is_weak() {
            self.index.remove(pages, &fingerprint)?;
            return Ok(());
        }
        let Some(head) = self.index.get(pages, &fingerprint)? else {
            return Ok(());
        };
        if head == id {
            if record.chain_next == ZERO_CHUNK {
                self.index.remove(pages, &fingerprint)?;
            } else {
                self.index.insert(pages, &fingerprint, record.chain_next)?;
            }
            return Ok(());
        }
        let mut member = head;
        // Every step moves to another chunk in use, so a chain longer than that is a cycle.
        for _ in 0..=self.state.live_chunks {
            let Some(mut previous) = self.chain_member(pages, member, &fingerprint)? else {
                return Ok(());
            };
            if previous.chain_next == id {
                previous.chain_next = record.chain_next;
                previous.encode(self.chunks.get_mut(pages, member)?);
                return Ok(());
            }
            if previous.chain_next == ZERO_CHUNK {
                return Ok(());
            }
            member = previous.chain_next;
        }
        Ok(())
    }

    /// The chunks the chain of `fingerprint` reaches from its head, in order, up to the first
    /// break (for `check`, which compares them with the chunk records, and for tests). For a
    /// strong fingerprint, the one indexed chunk.
    pub fn chain(
        &mut self,
        pages: &mut PageStore,
        fingerprint: &Fingerprint,
    ) -> Result<Vec<ChunkId>> {
        let mut members = Vec::new();
        let Some(mut member) = self.index.get(pages, fingerprint)? else {
            return Ok(members);
        };
        if !self.options.fingerprint.is_weak() {
            members.push(member);
            return Ok(members);
        }
        for _ in 0..=self.state.live_chunks {
            let Some(record) = self.chain_member(pages, member, fingerprint)? else {
                break;
            };
            members.push(member);
            if record.chain_next == ZERO_CHUNK {
                break;
            }
            member = record.chain_next;
        }
        Ok(members)
    }
}
