//! The chunk store: deduplicated chunks with reference counts.
//!
//! A *chunk id* names one stored chunk; maps (volume block maps, recipes) refer to chunks by
//! id, and the *chunk table* translates an id to the chunk's location, fingerprint and
//! reference count. The extra indirection is what lets compaction move a chunk to another
//! container without touching any map: only the chunk's record changes.
//!
//! Id 0 ([`ZERO_CHUNK`]) is reserved for "all zeros": zero chunks are never stored.
//!
//! Every mutation is a [`ChunkChange`]. The live path *decides* (looks up the index, appends
//! data), then *applies* the change to the in-memory pages with [`ChunkStore::apply`] and hands
//! it to the owner, who writes it to its journal. Replay after a crash calls the same
//! [`apply`](ChunkStore::apply) with the same changes, so live execution and recovery cannot
//! drift apart. The owner also persists [`ChunkStore::state`] in every checkpoint.
//!
//! Write ordering the owner must keep (see docs/DESIGN.md): container data is synced before
//! the journal records that refer to it are synced, and before the checkpoint that refers to
//! it; containers are removed only after the checkpoint that stops referring to them.

mod chains;
mod changes;
mod rebuild;
mod records;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use chains::{Placement, CHAIN_COMPARISONS_MAX};
pub use changes::ChunkChange;
pub use rebuild::RebuildReport;
pub use records::{ChunkRecord, ContainerRecord, ContainerState};

use crate::check::{Finding, FindingKind};
use crate::container::{
    ChunkLocation, ContainerId, ContainerStore, ContainerWriter, CHUNK_UNFINGERPRINTED,
};
use crate::fingerprint::{Fingerprint, FingerprintAlgorithm};
use crate::index::{FingerprintIndex, IndexOptions};
use crate::pages::{PageStore, RecordArea};
use crate::storage::StorageFile;
use crate::{Error, Result};

/// Chunk id meaning "all zeros, nothing stored".
pub const ZERO_CHUNK: ChunkId = 0;
/// Most references one stored chunk takes; a further duplicate is stored again.
pub const REFERENCES_MAX: u32 = u32::MAX - 1;

/// Names a stored chunk.
pub type ChunkId = u64;

/// Durable scalars of the chunk store, saved in the owner's checkpoints.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkStoreState {
    /// Next never-used chunk id.
    pub chunk_id_next: ChunkId,
    /// Head of the list of freed chunk ids (linked through their records); 0 when empty.
    pub free_head: ChunkId,
    /// Next container id to allocate.
    pub container_id_next: ContainerId,
    /// The container receiving appends.
    pub open_container: Option<ContainerId>,
    /// Chunks in use.
    pub live_chunks: u64,
    /// Raw bytes of chunks in use.
    pub live_raw_bytes: u64,
    /// Bytes chunks in use occupy in containers, headers included.
    pub live_stored_bytes: u64,
}

/// How chunks are named and stored.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ChunkStoreOptions {
    pub fingerprint: FingerprintAlgorithm,
    pub index: IndexOptions,
}

/// The bytes of a chunk to store, and what the caller computed of them (outside its lock).
#[derive(Clone, Copy, Debug)]
pub struct NewChunk<'a> {
    pub data: &'a [u8],
    /// Deduplicate by this fingerprint of `data`; None stores the chunk without indexing it.
    pub fingerprint: Option<&'a Fingerprint>,
    /// CRC-32C of `data`, if the caller has it; computed on the way in otherwise.
    pub checksum: Option<u32>,
}

/// What [`ChunkStore::store`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreOutcome {
    pub id: ChunkId,
    /// True when an existing chunk was referenced instead of storing new bytes.
    pub deduplicated: bool,
}

/// Counters of the live path since open.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ChunkStoreCounters {
    pub chunks_stored: u64,
    pub chunks_deduplicated: u64,
    /// Chain members whose bytes differed from a new chunk with their weak fingerprint.
    pub weak_collisions: u64,
    /// Byte comparisons of a new chunk with a chain member (weak fingerprints).
    pub chain_comparisons: u64,
    /// Chunks stored unindexed because [`CHAIN_COMPARISONS_MAX`] members of their chain
    /// differed from them.
    pub chain_limit_copies: u64,
    /// Chunks stored unindexed because their chain was broken (a damaged record).
    pub chain_breaks: u64,
    /// Index hits whose chunk holds another fingerprint with the same first 16 bytes (the
    /// index key): stored as new, unindexed chunks. Expected to stay 0.
    pub index_key_collisions: u64,
    /// Duplicates stored again because the chunk had [`REFERENCES_MAX`] references.
    pub reference_limit_copies: u64,
    pub chunks_freed: u64,
}

/// How to read a chunk without holding the chunk store.
pub enum ChunkRead {
    /// The bytes were still in the open container's write buffer and are copied here.
    Copied,
    /// Read `location` from `file` (checking its CRC) outside any lock.
    File {
        file: Arc<dyn StorageFile>,
        location: ChunkLocation,
    },
}

/// Deduplicated chunks with reference counts; see the module documentation.
pub struct ChunkStore {
    containers: Arc<ContainerStore>,
    writer: Option<ContainerWriter>,
    chunks: RecordArea,
    container_records: RecordArea,
    index: FingerprintIndex,
    state: ChunkStoreState,
    options: ChunkStoreOptions,
    counters: ChunkStoreCounters,
    /// Scratch buffer for byte comparisons of weak fingerprints.
    scratch: Vec<u8>,
    /// Derived tables found damaged (at open or in use) and reset, for the owner to report
    /// and rebuild ([`ChunkStore::take_derived_damage`]).
    derived_damage: Vec<DerivedDamage>,
    /// A page of the container table was reset: its records are zeros until
    /// [`ChunkStore::rebuild_container_table_only`], and live figures saturate meanwhile.
    container_table_damaged: bool,
    /// The fingerprint index was reset at open and needs [`ChunkStore::rebuild_index_only`].
    index_reset: bool,
}

impl std::fmt::Debug for ChunkStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkStore")
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl ChunkStore {
    /// Opens the chunk store whose tables live in `pages` (areas `chunks`, `containers` and
    /// the index's) with the durable `state` of the last checkpoint (default for a new store).
    pub fn open(
        pages: &mut PageStore,
        containers: Arc<ContainerStore>,
        state: ChunkStoreState,
        options: ChunkStoreOptions,
    ) -> Result<ChunkStore> {
        let chunks = RecordArea::new(pages.area("chunks"), records::CHUNK_RECORD_BYTES);
        let container_area = pages.area("containers");
        let container_records = RecordArea::new(container_area, records::CONTAINER_RECORD_BYTES);
        // The container table and the index are derived: damage found now is reset, reported
        // and rebuilt by the owner once the journal is replayed.
        let mut derived_damage = Vec::new();
        let mut container_table_damaged = false;
        for page in 0..pages.page_count(container_area) {
            match pages.read(container_area, page) {
                Ok(_) => {}
                Err(error) if error.is_corrupt() => {
                    pages.overwrite(container_area, page)?;
                    derived_damage.push(DerivedDamage::new("container table", error));
                    container_table_damaged = true;
                }
                Err(error) => return Err(error),
            }
        }
        let (index, index_damage) =
            FingerprintIndex::open_or_reset(pages, "index", options.index.clone())?;
        let index_reset = index_damage.is_some();
        derived_damage
            .extend(index_damage.map(|error| DerivedDamage::new("fingerprint index", error)));
        let mut state = state;
        if state.chunk_id_next == 0 {
            state.chunk_id_next = 1;
            state.container_id_next = 1;
        }
        Ok(ChunkStore {
            containers,
            writer: None,
            chunks,
            container_records,
            index,
            state,
            options,
            counters: ChunkStoreCounters::default(),
            scratch: Vec::new(),
            derived_damage,
            container_table_damaged,
            index_reset,
        })
    }

    /// Damage to derived tables found since the last call (at open, or reset in use), for
    /// the owner's report; each was reset, and [`Self::rebuild_damaged`] rebuilds them.
    pub fn take_derived_damage(&mut self) -> Vec<DerivedDamage> {
        std::mem::take(&mut self.derived_damage)
    }

    /// Rebuilds the derived tables that were reset after damage (the container table, the
    /// fingerprint index). Returns what it rebuilt, for messages.
    pub fn rebuild_damaged(&mut self, pages: &mut PageStore) -> Result<Vec<String>> {
        let mut rebuilt = Vec::new();
        if self.container_table_damaged {
            let records = self.rebuild_container_table_only(pages)?;
            rebuilt.push(format!(
                "container table rebuilt ({records} records written)"
            ));
        }
        if self.index_reset {
            let entries = self.rebuild_index_only(pages)?;
            self.index_reset = false;
            rebuilt.push(format!("fingerprint index rebuilt ({entries} entries)"));
        }
        Ok(rebuilt)
    }

    /// The record of container `id` for an update: a damaged page of the container table
    /// (derived data) is reset instead of failing the update, and noted.
    fn container_record_for_update(
        &mut self,
        pages: &mut PageStore,
        id: ContainerId,
    ) -> Result<ContainerRecord> {
        match self.container_record(pages, id) {
            Err(error) if error.is_corrupt() => {
                let page = id / self.container_records.records_per_page();
                let area = pages
                    .find_area("containers")
                    .expect("the container table exists");
                pages.overwrite(area, page)?;
                self.derived_damage
                    .push(DerivedDamage::new("container table", error));
                self.container_table_damaged = true;
                Ok(ContainerRecord::default())
            }
            other => other,
        }
    }

    /// The durable scalars to save in the next checkpoint.
    pub fn state(&self) -> &ChunkStoreState {
        &self.state
    }

    /// Live-path counters since open.
    pub fn counters(&self) -> &ChunkStoreCounters {
        &self.counters
    }

    /// The fingerprint index (for counters, prefetch and memory figures).
    pub fn index(&mut self) -> &mut FingerprintIndex {
        &mut self.index
    }

    /// The container set.
    pub fn containers(&self) -> &Arc<ContainerStore> {
        &self.containers
    }

    /// The options the store was opened with.
    pub fn options(&self) -> &ChunkStoreOptions {
        &self.options
    }

    /// Chunk records in one page of the chunk table.
    pub fn records_per_page(&self) -> u64 {
        self.chunks.records_per_page()
    }

    /// The record of chunk `id`.
    pub fn record(&self, pages: &mut PageStore, id: ChunkId) -> Result<ChunkRecord> {
        assert_ne!(id, ZERO_CHUNK, "the zero chunk has no record");
        Ok(ChunkRecord::decode(self.chunks.get(pages, id)?))
    }

    /// Warms what releasing chunks `ids` reads, for those whose pages are in memory: their
    /// records, then (once the records have loaded) the index entries of the indexed ones.
    /// An overwrite releases the chunk it replaces, and each of these reads was a cache miss
    /// in tables of megabytes. Changes nothing.
    pub fn warm_release(&self, pages: &PageStore, ids: &[ChunkId]) {
        for &id in ids {
            if let Some(bytes) = self.chunks.resident(pages, id) {
                crate::index::warm::warm(&bytes[0]);
            }
        }
        for &id in ids {
            if let Some(bytes) = self.chunks.resident(pages, id) {
                let record = ChunkRecord::decode(bytes);
                if record.in_use && record.indexed {
                    self.index.warm_removal(pages, &record.fingerprint);
                }
            }
        }
    }

    fn record_in_use(&self, pages: &mut PageStore, id: ChunkId) -> Result<ChunkRecord> {
        let record = self.record(pages, id)?;
        if !record.in_use {
            return Err(Error::corrupt(
                format!("chunk {id}"),
                "a reference points to a chunk that is not in use",
            ));
        }
        Ok(record)
    }

    /// The record of container `id`.
    pub fn container_record(
        &self,
        pages: &mut PageStore,
        id: ContainerId,
    ) -> Result<ContainerRecord> {
        Ok(ContainerRecord::decode(
            self.container_records.get(pages, id)?,
        ))
    }

    /// Stores `data` (never all zeros) and returns its chunk id. With a fingerprint the chunk
    /// is deduplicated against the index (weak fingerprints are confirmed by comparing bytes);
    /// without one it is stored unindexed, remembering `owner` and `written_at` so deferred
    /// deduplication can find it later. The changes made are appended to `changes`.
    pub fn store(
        &mut self,
        pages: &mut PageStore,
        chunk: NewChunk<'_>,
        owner: u64,
        written_at: u64,
        changes: &mut Vec<ChunkChange>,
    ) -> Result<StoreOutcome> {
        let NewChunk {
            data,
            fingerprint,
            checksum,
        } = chunk;
        debug_assert!(
            !crate::container::is_zero(data),
            "zero chunks are never stored"
        );
        let placement = match fingerprint {
            Some(fingerprint) => self.place(pages, fingerprint, data)?,
            None => Placement::Unindexed,
        };
        let indexable = match placement {
            Placement::Duplicate(id) => {
                self.push_applied(pages, ChunkChange::Referenced { id }, changes)?;
                self.counters.chunks_deduplicated += 1;
                return Ok(StoreOutcome {
                    id,
                    deduplicated: true,
                });
            }
            Placement::Indexed => fingerprint.copied(),
            Placement::Unindexed => None,
        };
        let id = self.append_new(
            pages,
            NewChunk {
                data,
                fingerprint: indexable.as_ref(),
                checksum,
            },
            fingerprint.is_none(),
            owner,
            written_at,
            changes,
        )?;
        self.counters.chunks_stored += 1;
        Ok(StoreOutcome {
            id,
            deduplicated: false,
        })
    }

    fn append_new(
        &mut self,
        pages: &mut PageStore,
        chunk: NewChunk<'_>,
        unfingerprinted: bool,
        owner: u64,
        written_at: u64,
        changes: &mut Vec<ChunkChange>,
    ) -> Result<ChunkId> {
        let NewChunk {
            data,
            fingerprint,
            checksum,
        } = chunk;
        let fingerprint = fingerprint.copied();
        self.ensure_room(pages, data.len(), changes)?;
        let flags = if unfingerprinted {
            CHUNK_UNFINGERPRINTED
        } else {
            0
        };
        let writer = self
            .writer
            .as_mut()
            .expect("ensure_room opened a container");
        let location = writer.append_checked(
            &fingerprint.unwrap_or(Fingerprint::ZERO),
            data,
            flags,
            checksum,
        )?;
        let id = self.next_free_id(pages)?;
        self.push_applied(
            pages,
            ChunkChange::Stored {
                id,
                fingerprint,
                owner,
                written_at,
                location,
            },
            changes,
        )?;
        Ok(id)
    }

    /// The id the next stored chunk gets: the head of the free list, or a new id when the
    /// list is empty or its head's record is unreadable (a damaged page: the list is rebuilt
    /// by a repair, and replay accepts either id).
    fn next_free_id(&mut self, pages: &mut PageStore) -> Result<ChunkId> {
        if self.state.free_head == ZERO_CHUNK {
            return Ok(self.state.chunk_id_next);
        }
        match self.record(pages, self.state.free_head) {
            Ok(_) => Ok(self.state.free_head),
            Err(error) if error.is_corrupt() => Ok(self.state.chunk_id_next),
            Err(error) => Err(error),
        }
    }

    /// Makes sure the open container has room for `raw_bytes`, sealing it and opening the
    /// next one when needed.
    fn ensure_room(
        &mut self,
        pages: &mut PageStore,
        raw_bytes: usize,
        changes: &mut Vec<ChunkChange>,
    ) -> Result<()> {
        if let Some(writer) = &self.writer {
            if writer.has_room(raw_bytes) {
                return Ok(());
            }
        }
        self.seal_open_container(pages, changes)?;
        let id = self.state.container_id_next;
        let created_at = unix_seconds();
        self.writer = Some(self.containers.create(id, created_at)?);
        self.push_applied(
            pages,
            ChunkChange::ContainerOpened { id, created_at },
            changes,
        )
    }

    /// Seals the open container, if any.
    pub fn seal_open_container(
        &mut self,
        pages: &mut PageStore,
        changes: &mut Vec<ChunkChange>,
    ) -> Result<()> {
        if let Some(writer) = self.writer.take() {
            let sealed = writer.seal(0)?;
            self.push_applied(
                pages,
                ChunkChange::ContainerSealed {
                    id: sealed.id,
                    bytes: sealed.bytes,
                },
                changes,
            )?;
        }
        Ok(())
    }

    /// Adds one reference to chunk `id` (a map now refers to it twice).
    pub fn reference(
        &mut self,
        pages: &mut PageStore,
        id: ChunkId,
        changes: &mut Vec<ChunkChange>,
    ) -> Result<()> {
        self.push_applied(pages, ChunkChange::Referenced { id }, changes)
    }

    /// Drops one reference to chunk `id`; the chunk is freed when none remain.
    pub fn release(
        &mut self,
        pages: &mut PageStore,
        id: ChunkId,
        changes: &mut Vec<ChunkChange>,
    ) -> Result<()> {
        self.push_applied(pages, ChunkChange::Released { id }, changes)
    }

    fn push_applied(
        &mut self,
        pages: &mut PageStore,
        change: ChunkChange,
        changes: &mut Vec<ChunkChange>,
    ) -> Result<()> {
        // Listed first: should applying fail half way, the owner sees a change that its
        // journal does not hold and stops.
        changes.push(change);
        self.apply(pages, &change)
    }

    /// Applies one change to the tables. The live path and journal replay both come here.
    pub fn apply(&mut self, pages: &mut PageStore, change: &ChunkChange) -> Result<()> {
        match *change {
            ChunkChange::Stored {
                id,
                fingerprint,
                owner,
                written_at,
                location,
            } => {
                if id == self.state.free_head && id != ZERO_CHUNK {
                    self.state.free_head = self.record(pages, id)?.next_free;
                } else if id == self.state.chunk_id_next {
                    self.state.chunk_id_next += 1;
                } else {
                    return Err(Error::corrupt(
                        format!("journal record storing chunk {id}"),
                        format!(
                            "the next free ids are {} and {}",
                            self.state.free_head, self.state.chunk_id_next
                        ),
                    ));
                }
                let chain_next = match fingerprint {
                    Some(fingerprint) => self.link(pages, &fingerprint, id)?,
                    None => ZERO_CHUNK,
                };
                let record = ChunkRecord {
                    in_use: true,
                    indexed: fingerprint.is_some(),
                    fingerprint: fingerprint.unwrap_or(Fingerprint::ZERO),
                    owner,
                    written_at,
                    location,
                    references: 1,
                    next_free: ZERO_CHUNK,
                    chain_next,
                };
                record.encode(self.chunks.get_mut(pages, id)?);
                self.account(pages, &location, 1)?;
            }
            ChunkChange::Referenced { id } => {
                let mut record = self.record_in_use(pages, id)?;
                assert!(record.references < u32::MAX);
                record.references += 1;
                record.encode(self.chunks.get_mut(pages, id)?);
            }
            ChunkChange::Released { id } => {
                let mut record = self.record_in_use(pages, id)?;
                record.references -= 1;
                if record.references == 0 {
                    self.free(pages, id, record)?;
                } else {
                    record.encode(self.chunks.get_mut(pages, id)?);
                }
            }
            ChunkChange::ReferencesSet { id, references } => {
                let mut record = self.record_in_use(pages, id)?;
                if references == 0 {
                    self.free(pages, id, record)?;
                } else {
                    record.references = references;
                    record.encode(self.chunks.get_mut(pages, id)?);
                }
            }
            ChunkChange::Relocated { id, location } => {
                let mut record = self.record_in_use(pages, id)?;
                self.account(pages, &record.location, -1)?;
                self.account(pages, &location, 1)?;
                record.location = location;
                record.encode(self.chunks.get_mut(pages, id)?);
            }
            ChunkChange::Indexed { id, fingerprint } => {
                let mut record = self.record_in_use(pages, id)?;
                if record.indexed {
                    return Err(Error::corrupt(
                        format!("journal record indexing chunk {id}"),
                        "the chunk is indexed already",
                    ));
                }
                record.indexed = true;
                record.fingerprint = fingerprint;
                record.location.flags &= !CHUNK_UNFINGERPRINTED;
                record.chain_next = self.link(pages, &fingerprint, id)?;
                record.encode(self.chunks.get_mut(pages, id)?);
            }
            ChunkChange::ContainerOpened { id, created_at } => {
                self.state.container_id_next = id + 1;
                self.state.open_container = Some(id);
                let record = ContainerRecord {
                    state: ContainerState::Open,
                    created_at,
                    ..ContainerRecord::default()
                };
                record.encode(self.container_records.get_mut(pages, id)?);
            }
            ChunkChange::ContainerSealed { id, bytes } => {
                if self.state.open_container == Some(id) {
                    self.state.open_container = None;
                }
                let mut record = self.container_record_for_update(pages, id)?;
                record.state = ContainerState::Sealed;
                record.bytes = bytes;
                record.encode(self.container_records.get_mut(pages, id)?);
            }
            ChunkChange::ContainerRetired { id } => {
                let mut record = self.container_record_for_update(pages, id)?;
                record.state = ContainerState::Retired;
                record.encode(self.container_records.get_mut(pages, id)?);
            }
        }
        Ok(())
    }

    /// Applies a change found after damage in a journal, during a repair: the tables may
    /// already disagree with the change (an earlier record was lost), and the repair
    /// rebuilds reference counts, the free list, the index and the container table from the
    /// chunk records and the maps afterwards ([`ChunkStore::rebuild`]). So only what those
    /// are rebuilt from is applied: chunk records (location, fingerprint) and container
    /// records; reference changes are dropped.
    pub fn salvage_apply(&mut self, pages: &mut PageStore, change: &ChunkChange) -> Result<()> {
        match *change {
            ChunkChange::Stored {
                id,
                fingerprint,
                owner,
                written_at,
                location,
            } => {
                let record = ChunkRecord {
                    in_use: true,
                    indexed: fingerprint.is_some(),
                    fingerprint: fingerprint.unwrap_or(Fingerprint::ZERO),
                    owner,
                    written_at,
                    location,
                    references: 1,
                    next_free: ZERO_CHUNK,
                    // The repair's rebuild links chains afresh.
                    chain_next: ZERO_CHUNK,
                };
                record.encode(self.chunks.get_mut(pages, id)?);
                self.state.chunk_id_next = self.state.chunk_id_next.max(id + 1);
            }
            ChunkChange::Relocated { id, location } => {
                let mut record = self.record(pages, id)?;
                if record.in_use {
                    record.location = location;
                    record.encode(self.chunks.get_mut(pages, id)?);
                }
            }
            ChunkChange::Indexed { id, fingerprint } => {
                let mut record = self.record(pages, id)?;
                if record.in_use {
                    record.indexed = true;
                    record.fingerprint = fingerprint;
                    record.location.flags &= !CHUNK_UNFINGERPRINTED;
                    record.encode(self.chunks.get_mut(pages, id)?);
                }
            }
            // Containers are opened and sealed in id order whatever was lost before.
            ChunkChange::ContainerOpened { .. } | ChunkChange::ContainerSealed { .. } => {
                self.apply(pages, change)?;
            }
            ChunkChange::Referenced { .. }
            | ChunkChange::Released { .. }
            | ChunkChange::ReferencesSet { .. }
            | ChunkChange::ContainerRetired { .. } => {}
        }
        Ok(())
    }

    fn free(&mut self, pages: &mut PageStore, id: ChunkId, record: ChunkRecord) -> Result<()> {
        if record.indexed {
            self.unlink(pages, id, &record)?;
        }
        self.account(pages, &record.location, -1)?;
        let freed = ChunkRecord {
            next_free: self.state.free_head,
            ..ChunkRecord::default()
        };
        freed.encode(self.chunks.get_mut(pages, id)?);
        self.state.free_head = id;
        self.counters.chunks_freed += 1;
        Ok(())
    }

    /// Adds (`sign` = 1) or removes (-1) a chunk's bytes from its container's live figures and
    /// the store totals.
    fn account(
        &mut self,
        pages: &mut PageStore,
        location: &ChunkLocation,
        sign: i64,
    ) -> Result<()> {
        let footprint = location.footprint_bytes();
        let mut container = self.container_record_for_update(pages, location.container)?;
        if sign > 0 {
            container.live_bytes += footprint;
            container.live_chunks += 1;
            self.state.live_chunks += 1;
            self.state.live_raw_bytes += location.raw_bytes as u64;
            self.state.live_stored_bytes += footprint;
        } else {
            // Exact unless a damaged page of the container table was reset; the figures are
            // then rebuilt.
            assert!(
                self.container_table_damaged
                    || (container.live_chunks > 0 && container.live_bytes >= footprint),
                "container {} accounts for the chunks it holds",
                location.container
            );
            container.live_bytes = container.live_bytes.saturating_sub(footprint);
            container.live_chunks = container.live_chunks.saturating_sub(1);
            self.state.live_chunks = self.state.live_chunks.saturating_sub(1);
            self.state.live_raw_bytes = self
                .state
                .live_raw_bytes
                .saturating_sub(location.raw_bytes as u64);
            self.state.live_stored_bytes = self.state.live_stored_bytes.saturating_sub(footprint);
        }
        container.encode(self.container_records.get_mut(pages, location.container)?);
        Ok(())
    }

    /// Reads chunk `id` into `out` (exactly its raw size).
    pub fn read_into(&mut self, pages: &mut PageStore, id: ChunkId, out: &mut [u8]) -> Result<()> {
        match self.plan_read(pages, id, out)? {
            ChunkRead::Copied => Ok(()),
            ChunkRead::File { file, location } => read_located(file.as_ref(), &location, out),
        }
    }

    /// Prepares a read of chunk `id` that can finish without the chunk store: bytes still in
    /// the write buffer are copied into `out` now; otherwise the caller reads the returned
    /// file handle (which stays valid even if the container is removed meanwhile).
    pub fn plan_read(
        &mut self,
        pages: &mut PageStore,
        id: ChunkId,
        out: &mut [u8],
    ) -> Result<ChunkRead> {
        let record = self.record_in_use(pages, id)?;
        let location = record.location;
        // The record passed its page's checksum, so a size that differs from the caller's
        // buffer is the caller's bug, not damage.
        assert_eq!(
            out.len(),
            location.raw_bytes as usize,
            "chunk {id} is read into a buffer of another size"
        );
        if let Some(writer) = &self.writer {
            if writer.id() == location.container && writer.read_buffered(&location, out)? {
                return Ok(ChunkRead::Copied);
            }
        }
        if self.containers.read_queued(&location, out)? {
            return Ok(ChunkRead::Copied);
        }
        Ok(ChunkRead::File {
            file: self.containers.file(location.container)?,
            location,
        })
    }

    /// Writes buffered container bytes to the file (not durable yet).
    pub fn write_out(&mut self) -> Result<()> {
        match self.writer.as_mut() {
            Some(writer) => writer.write_out(),
            None => Ok(()),
        }
    }

    /// Makes every stored chunk durable (the data half of a FLUSH).
    pub fn sync_data(&mut self) -> Result<()> {
        self.containers.sync_deferred()?;
        match self.writer.as_mut() {
            Some(writer) => writer.sync(),
            None => Ok(()),
        }
    }

    /// True when stored chunks are not yet durable.
    pub fn has_unsynced(&self) -> bool {
        self.writer
            .as_ref()
            .is_some_and(ContainerWriter::has_unsynced)
            || self
                .containers
                .write_behind()
                .is_some_and(|write_behind| write_behind.has_unsynced())
    }

    /// Finishes recovery after journal replay: the container that was open at the crash may
    /// hold bytes of writes that were never acknowledged after our last durable record, so it
    /// is closed (never appended to again, never sealed) and a new one is opened on demand.
    pub fn close_recovered_container(&mut self, pages: &mut PageStore) -> Result<()> {
        assert!(self.writer.is_none(), "recovery runs before any append");
        if let Some(id) = self.state.open_container.take() {
            let mut record = self.container_record_for_update(pages, id)?;
            record.state = ContainerState::Closed;
            record.encode(self.container_records.get_mut(pages, id)?);
        }
        Ok(())
    }

    /// Checks, during replay, that the container bytes a change refers to reached the media:
    /// the chunk of a `Stored` or `Relocated` change, the trailer of a `ContainerSealed` one.
    /// The journal can reach the media before them (containers are synced only by a FLUSH or
    /// a checkpoint), and a change without them is part of the torn tail.
    pub fn stored_data_is_durable(&self, change: &ChunkChange) -> Result<bool> {
        let result = match change {
            ChunkChange::Stored { location, .. } | ChunkChange::Relocated { location, .. } => {
                let mut stored = Vec::new();
                self.containers.read_stored(location, &mut stored)
            }
            ChunkChange::ContainerSealed { id, bytes } => {
                self.containers.verify_sealed(*id, *bytes)
            }
            _ => return Ok(true),
        };
        match result {
            Ok(()) => Ok(true),
            Err(error) if error.is_corrupt() => Ok(false),
            Err(Error::NotFound(_)) => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// Container files at or past the recovered next container id: created for requests
    /// whose journal records did not survive a crash (never acknowledged by a sync), so
    /// nothing durable refers to them, and their ids are about to be handed out again. They
    /// are removed, or with `read_only` reported as leftovers of the face `face`.
    pub fn leftover_containers(&self, face: &str, read_only: bool) -> Result<Vec<Finding>> {
        let next = self.state.container_id_next;
        let orphans: Vec<u64> = self
            .containers
            .list()?
            .into_iter()
            .filter(|&id| id >= next)
            .collect();
        if read_only {
            return Ok(orphans
                .into_iter()
                .map(|id| {
                    Finding::new(
                        FindingKind::Leftover,
                        format!("{face}/{}", self.containers.name(id)),
                        "a container of writes never acknowledged (removed by the next open \
                         for writing)",
                    )
                })
                .collect());
        }
        if !orphans.is_empty() {
            for id in orphans {
                self.containers.remove(id)?;
            }
            self.containers.sync_removals()?;
        }
        Ok(Vec::new())
    }

    /// Saves in-memory state that lives in pages (the index filter) into the page store; call
    /// right before [`PageStore::checkpoint`].
    pub fn prepare_checkpoint(&mut self, pages: &mut PageStore) -> Result<()> {
        self.index.prepare_checkpoint(pages)
    }

    /// Call right after a checkpoint: removes the containers retired (emptied or compacted)
    /// by changes that the checkpoint before it made durable, and marks those retired since
    /// for removal after the next one. Their chunks moved by changes in the journal of the
    /// checkpoint before, which a fallback to that checkpoint replays, so they stay until
    /// that journal is gone.
    pub fn remove_retired_containers(&mut self, pages: &mut PageStore) -> Result<u64> {
        let mut removed = 0;
        for id in 1..self.state.container_id_next {
            let mut record = self.container_record_for_update(pages, id)?;
            match record.state {
                ContainerState::Retired => record.state = ContainerState::Expired,
                ContainerState::Expired => {
                    self.containers.remove(id)?;
                    record.state = ContainerState::Removed;
                    removed += 1;
                }
                _ => continue,
            }
            record.encode(self.container_records.get_mut(pages, id)?);
        }
        if removed > 0 {
            self.containers.sync_removals()?;
        }
        Ok(removed)
    }

    pub(crate) fn ensure_room_for(
        &mut self,
        pages: &mut PageStore,
        raw_bytes: usize,
        changes: &mut Vec<ChunkChange>,
    ) -> Result<()> {
        self.ensure_room(pages, raw_bytes, changes)
    }

    pub(crate) fn writer_mut(&mut self) -> Option<&mut ContainerWriter> {
        self.writer.as_mut()
    }

    pub(crate) fn push_change(
        &mut self,
        pages: &mut PageStore,
        change: ChunkChange,
        changes: &mut Vec<ChunkChange>,
    ) -> Result<()> {
        self.push_applied(pages, change, changes)
    }
}

/// A derived table found damaged and reset ([`ChunkStore::take_derived_damage`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DerivedDamage {
    /// The table: `container table` or `fingerprint index`.
    pub table: String,
    /// What was damaged, precisely (the page of an area, for checksum failures).
    pub object: String,
    /// What is wrong with it.
    pub detail: String,
}

impl DerivedDamage {
    fn new(table: &str, error: Error) -> DerivedDamage {
        let (object, detail) = match error {
            Error::Corrupt { what, detail } => (what, detail),
            other => (table.to_string(), other.to_string()),
        };
        DerivedDamage {
            table: table.to_string(),
            object,
            detail,
        }
    }
}

/// Reads a chunk located in `file` into `out` (its raw size), checking the CRC and
/// decompressing when needed.
pub fn read_located(
    file: &dyn StorageFile,
    location: &ChunkLocation,
    out: &mut [u8],
) -> Result<()> {
    crate::container::read_chunk_from(file, location, out)
}

/// Seconds since the Unix epoch.
pub fn unix_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs())
}

#[cfg(test)]
mod tests;
