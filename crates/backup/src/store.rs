//! [`BackupStore`]: the opened backup face of a repository, and its recovery after a crash.
//!
//! Layout in the face's storage (`<repository>/backup/`):
//!
//! ```text
//! catalog.redb       series, backups, recipes, segment heads and records, container records,
//!                    and the store state (options, id counters, commit serial)
//! meta/              page store holding the persisted segment index (fingerprint -> segment)
//! containers/        the containers (core container format; trailer time stamp = paper 2's)
//! ```
//!
//! **Recovery** runs before the first change of every opened store ([`BackupStore::recover`]):
//! containers with no catalog record (written by an interrupted command, or left behind by one
//! interrupted after its catalog commit) are removed, and the segment index is reconciled with
//! the catalog when its checkpoint serial or size disagrees with the catalog's. The catalog is
//! the truth; the index is derived data that may be ahead (segments of a backup whose recipe
//! never committed) or behind (removals not yet checkpointed, or an index that was lost).

use std::collections::HashMap;
use std::sync::Arc;

use onecopy_core::catalog::{Catalog, CatalogRead, CatalogView, CatalogWrite, NamedTable};
use onecopy_core::container::{ContainerId, ContainerStore};
use onecopy_core::fingerprint::Fingerprint;
use onecopy_core::index::{FingerprintIndex, IndexKey};
use onecopy_core::pages::{PageStore, PageStoreOptions};
use onecopy_core::storage::{parent_directory, Storage};
use serde::{Deserialize, Serialize};

use crate::config::{RuntimeOptions, StoreOptions};
use crate::error::{BackupError, Result};
use crate::segment::{
    ContainerRecord, SegmentHead, SegmentId, SegmentRecord, SegmentState, CONTAINERS, SEGMENTS,
    SEGMENT_HEADS,
};

pub(crate) const STORE: NamedTable = NamedTable("store");
const STATE_KEY: &str = "state";
/// Format of the backup store's records.
pub const STORE_FORMAT: u32 = 1;
const CATALOG_FILE: &str = "catalog.redb";
const PAGES_DIRECTORY: &str = "meta";
const CONTAINERS_DIRECTORY: &str = "containers";
const INDEX_NAME: &str = "segments";

/// Counters and options kept in the catalog.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct StoreState {
    pub format: u32,
    pub options: StoreOptions,
    pub backup_id_next: u64,
    pub segment_id_next: u64,
    pub container_id_next: u64,
    /// Incremented by every catalog commit; the index checkpoint records the serial it matches.
    pub serial: u64,
    /// Containers the last commit dropped from the catalog. They are removed right after the
    /// commit; a crash before that leaves files that [`BackupStore::recover`] removes. Each
    /// commit replaces the list (absent in states written before stop 9).
    #[serde(default)]
    pub containers_dropped: Vec<ContainerId>,
}

/// How to open a store.
#[derive(Clone, Debug, Default)]
pub struct OpenOptions {
    /// Options for a new store. For an existing store they must equal the recorded ones
    /// (`None` accepts whatever the store was created with).
    pub store: Option<StoreOptions>,
    pub runtime: RuntimeOptions,
    /// Open the catalog for reading only (list, restore, stats): no disk flush at open or
    /// close. Operations that change the store panic on such a store.
    pub read_only: bool,
}

/// What [`BackupStore::recover`] repaired.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RecoveryReport {
    /// Containers without a catalog record that were removed.
    pub orphan_containers_removed: u64,
    /// Index entries added or corrected from the catalog.
    pub index_entries_added: u64,
    /// Index entries removed because the catalog does not hold them.
    pub index_entries_removed: u64,
}

/// The backup store of one repository; see the crate documentation for the operations.
pub struct BackupStore {
    pub(crate) storage: Arc<dyn Storage>,
    pub(crate) catalog: Catalog,
    pub(crate) containers: ContainerStore,
    pub(crate) pages: PageStore,
    pub(crate) index: FingerprintIndex,
    pub(crate) state: StoreState,
    pub(crate) runtime: RuntimeOptions,
    /// Serial recorded by the index's last checkpoint.
    index_serial: u64,
    recovered: bool,
}

impl std::fmt::Debug for BackupStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackupStore")
            .field("storage", &self.storage.describe())
            .field("serial", &self.state.serial)
            .finish()
    }
}

impl BackupStore {
    /// Opens the store kept in `storage`, creating it when empty. Opening changes nothing
    /// but the creation of missing files; call [`recover`](Self::recover) (every mutating
    /// operation does) to repair what an interrupted command left.
    pub fn open(storage: Arc<dyn Storage>, options: OpenOptions) -> Result<BackupStore> {
        if !storage.exists(CATALOG_FILE)? {
            create_catalog(&storage, &options)?;
        }
        let catalog = if options.read_only {
            Catalog::open_read_only(&storage, CATALOG_FILE)?
        } else {
            Catalog::open(&storage, CATALOG_FILE)?
        };
        let stored: Option<StoreState> = catalog.read()?.get_json(STORE, STATE_KEY)?;
        let state = match stored {
            Some(state) => {
                if state.format != STORE_FORMAT {
                    return Err(BackupError::InvalidArgument(format!(
                        "the backup store has format {}, this onecopy reads format {STORE_FORMAT}",
                        state.format
                    )));
                }
                if let Some(wanted) = &options.store {
                    if *wanted != state.options {
                        return Err(BackupError::InvalidArgument(format!(
                            "the backup store was created with {}; its options cannot change \
                             (use another repository to try different ones)",
                            serde_json::to_string(&state.options).expect("options serialise")
                        )));
                    }
                }
                state
            }
            None => {
                return Err(BackupError::corrupt(
                    format!("backup store in {}", storage.describe()),
                    "the catalog holds no store state",
                ))
            }
        };
        let containers = ContainerStore::new(
            Arc::clone(&storage),
            CONTAINERS_DIRECTORY,
            state.options.container_options(),
        )?;
        let (mut pages, user_state) = PageStore::open(
            Arc::clone(&storage),
            PAGES_DIRECTORY,
            PageStoreOptions::default(),
        )?;
        let index_serial =
            match user_state.as_slice() {
                [] => 0,
                bytes => u64::from_le_bytes(bytes.try_into().map_err(|_| {
                    BackupError::corrupt("segment index checkpoint", "bad user state")
                })?),
            };
        let index = FingerprintIndex::open(&mut pages, INDEX_NAME, options.runtime.index.clone())?;
        Ok(BackupStore {
            storage,
            catalog,
            containers,
            pages,
            index,
            state,
            runtime: options.runtime,
            index_serial,
            recovered: false,
        })
    }

    /// The options the store was created with.
    pub fn options(&self) -> &StoreOptions {
        &self.state.options
    }

    /// The runtime options in use.
    pub fn runtime(&self) -> &RuntimeOptions {
        &self.runtime
    }

    /// Removes containers no catalog record names and reconciles the segment index with the
    /// catalog. Runs once per opened store; later calls return an empty report.
    ///
    /// Orphan containers come from two places only, so recovery looks there instead of
    /// listing every container (which made every mutating command, a deletion included,
    /// slower as the repository grew): the containers the last commit dropped
    /// ([`StoreState::containers_dropped`]), and containers of an operation that never
    /// committed. The latter hold ids from the committed `container_id_next` up, with no gap:
    /// ids are allocated one at a time and [`ContainerStore::create`] makes each name durable
    /// before it returns, so probing upward until the first missing id finds them all.
    /// `backup check` still lists every container and warns about any other file.
    pub fn recover(&mut self) -> Result<RecoveryReport> {
        if self.recovered {
            return Ok(RecoveryReport::default());
        }
        assert!(
            !self.catalog.is_read_only(),
            "a store opened read-only is never changed"
        );
        let mut report = RecoveryReport::default();
        let mut orphans: Vec<ContainerId> = Vec::new();
        for &id in &self.state.containers_dropped {
            if self.storage.exists(&self.containers.name(id))? {
                orphans.push(id);
            }
        }
        let mut id = self.state.container_id_next;
        while self.storage.exists(&self.containers.name(id))? {
            orphans.push(id);
            id += 1;
        }
        self.remove_containers(&orphans)?;
        report.orphan_containers_removed = orphans.len() as u64;
        let read = self.catalog.read()?;
        let expected = indexable_segments(&read)?;
        if self.index_serial != self.state.serial || self.index.len() != expected.len() as u64 {
            let (added, removed) = self.reconcile_index(&expected)?;
            report.index_entries_added = added;
            report.index_entries_removed = removed;
            self.checkpoint_index(self.state.serial)?;
        }
        self.recovered = true;
        Ok(report)
    }

    fn reconcile_index(
        &mut self,
        expected: &HashMap<Fingerprint, SegmentId>,
    ) -> Result<(u64, u64)> {
        let mut added = 0;
        for (fingerprint, &id) in expected {
            if self.index.lookup(&mut self.pages, fingerprint)? != Some(id) {
                self.index.insert(&mut self.pages, fingerprint, id)?;
                added += 1;
            }
        }
        let expected = by_index_key(expected);
        let mut stale = Vec::new();
        self.index.for_each_entry(&mut self.pages, |key, id| {
            if expected.get(key) != Some(&id) {
                stale.push(*key);
            }
        })?;
        for key in &stale {
            self.index.remove_key(&mut self.pages, key)?;
        }
        Ok((added, stale.len() as u64))
    }

    /// Removes containers and makes the removals durable by syncing the directories that held
    /// them. (`ContainerStore::sync_removals` skips shard directories left empty, whose
    /// removals would then not be durable.)
    pub(crate) fn remove_containers(&self, ids: &[ContainerId]) -> Result<()> {
        let mut directories = std::collections::BTreeSet::new();
        for &id in ids {
            self.containers.remove(id)?;
            directories.insert(parent_directory(&self.containers.name(id)).to_string());
        }
        for directory in directories {
            self.storage.sync_directory(&directory)?;
        }
        Ok(())
    }

    /// Makes the segment index durable, recording `serial`: the catalog serial it matches
    /// (the current one, or the next when the index goes first, as in `create`).
    pub(crate) fn checkpoint_index(&mut self, serial: u64) -> Result<()> {
        self.index.prepare_checkpoint(&mut self.pages)?;
        self.pages.checkpoint(&serial.to_le_bytes())?;
        self.index_serial = serial;
        Ok(())
    }

    /// The segment the index names for `fingerprint`, if the catalog confirms it is a shared
    /// segment with that fingerprint (stale entries are treated as absent).
    pub(crate) fn lookup_segment(
        &mut self,
        read: &CatalogRead,
        fingerprint: &Fingerprint,
    ) -> Result<Option<SegmentId>> {
        let Some(id) = self.index.lookup(&mut self.pages, fingerprint)? else {
            return Ok(None);
        };
        Ok(load_head(read, id)?
            .filter(|head| head.fingerprint == *fingerprint && head.state == SegmentState::Shared)
            .map(|_| id))
    }

    /// Commits `write` with `state` as the new store state (serial incremented); the
    /// in-memory state changes only once the commit succeeded. `dropped` are the containers
    /// the commit drops from the catalog, which the caller removes next: recorded in the
    /// state, so that recovery finishes the removal if the process dies first.
    pub(crate) fn commit(
        &mut self,
        mut write: CatalogWrite,
        mut state: StoreState,
        dropped: &[ContainerId],
    ) -> Result<()> {
        state.serial = self.state.serial + 1;
        state.containers_dropped = dropped.to_vec();
        write.put_json(STORE, STATE_KEY, &state)?;
        write.commit()?;
        self.state = state;
        Ok(())
    }

    /// Asserts that [`recover`](Self::recover) ran: mutating operations must not allocate
    /// container ids that an orphan file still holds.
    pub(crate) fn assert_recovered(&self) {
        assert!(self.recovered, "mutating operations run recover() first");
    }

    /// The storage the store lives in (for statistics and tests).
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }
}

/// Creates the catalog with its first state under a temporary name and renames it into
/// place, so that a crash during creation leaves no catalog (and the next open starts over)
/// rather than a half-initialised one.
fn create_catalog(storage: &Arc<dyn Storage>, options: &OpenOptions) -> Result<()> {
    let temporary = format!("{CATALOG_FILE}.new");
    storage.remove(&temporary)?;
    let store_options = options.store.clone().unwrap_or_default();
    store_options.validate()?;
    let state = StoreState {
        format: STORE_FORMAT,
        options: store_options,
        backup_id_next: 1,
        segment_id_next: 1,
        container_id_next: 1,
        containers_dropped: Vec::new(),
        serial: 1,
    };
    let catalog = Catalog::open(storage, &temporary)?;
    let mut write = catalog.write()?;
    write.put_json(STORE, STATE_KEY, &state)?;
    write.commit()?;
    drop(catalog);
    storage.rename(&temporary, CATALOG_FILE)?;
    storage.sync_directory("")?;
    Ok(())
}

/// Shared segments by fingerprint: what the segment index must hold.
pub(crate) fn indexable_segments(
    view: &impl CatalogView,
) -> Result<HashMap<Fingerprint, SegmentId>> {
    let mut expected = HashMap::new();
    for (id, bytes) in view.range_id(SEGMENT_HEADS, 0, u64::MAX)? {
        let head = SegmentHead::decode(&bytes, id)?;
        if head.state == SegmentState::Shared {
            expected.entry(head.fingerprint).or_insert(id);
        }
    }
    Ok(expected)
}

/// `expected` keyed as the index stores it: by the first 16 bytes of each fingerprint.
pub(crate) fn by_index_key(
    expected: &HashMap<Fingerprint, SegmentId>,
) -> HashMap<IndexKey, SegmentId> {
    expected
        .iter()
        .map(|(fingerprint, &id)| (IndexKey::of(fingerprint), id))
        .collect()
}

pub(crate) fn load_head(view: &impl CatalogView, id: SegmentId) -> Result<Option<SegmentHead>> {
    view.get_id(SEGMENT_HEADS, id)?
        .map(|bytes| SegmentHead::decode(&bytes, id))
        .transpose()
}

pub(crate) fn load_segment(view: &impl CatalogView, id: SegmentId) -> Result<SegmentRecord> {
    let bytes = view
        .get_id(SEGMENTS, id)?
        .ok_or_else(|| BackupError::corrupt(format!("segment {id}"), "record missing"))?;
    SegmentRecord::decode(&bytes, id)
}

pub(crate) fn load_container(view: &impl CatalogView, id: ContainerId) -> Result<ContainerRecord> {
    let bytes = view
        .get_id(CONTAINERS, id)?
        .ok_or_else(|| BackupError::corrupt(format!("container {id:016x}"), "record missing"))?;
    ContainerRecord::decode(&bytes, id)
}

/// Current time in unix nanoseconds.
pub(crate) fn now_unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos() as u64)
}
