//! [`BackupStore`]: the opened backup face of a repository, and its recovery after a crash.
//!
//! Layout in the face's storage (`<repository>/backup/`):
//!
//! ```text
//! catalog.redb       series, backups, recipes, segment heads and records, container records,
//!                    recorded losses, and the store state (options, id counters, commit serial)
//! meta/              page store holding the persisted segment index (fingerprint -> segment)
//! containers/        the containers (core container format; trailer time stamp = paper 2's)
//! reserve            room kept for the catalog commit that frees space on a full disk
//! ```
//!
//! **Opening** an unencrypted store verifies the catalog's page checksums (a verified copy in
//! memory, which read-only opens keep and read from), so a damaged catalog is an error naming
//! it rather than wrong records; an encrypted store's catalog is opened in place, since every
//! block it reads is authenticated. The segment index is derived data (module `segment_index`): when it does
//! not open or verify, a writable open throws it away and rebuilds it from the catalog, a
//! read-only open goes on without it, and either says so in [`BackupStore::take_notices`].
//!
//! **Recovery** runs before the first change of every opened store ([`BackupStore::recover`]):
//! containers with no catalog record (written by an interrupted command, or left behind by one
//! interrupted after its catalog commit) are removed, and the segment index is reconciled with
//! the catalog when its checkpoint serial or size disagrees with the catalog's. The catalog is
//! the truth; the index is derived data that may be ahead (segments of a backup whose recipe
//! never committed) or behind (removals not yet checkpointed, or an index that was lost).
//!
//! **The reserve** is a file of [`RESERVE_BYTES_MIN`] or more bytes (see
//! [`RuntimeOptions::reserve_bytes_min`]), written at creation and
//! again whenever it is missing and there is room. Operations that free space (deletion,
//! expiry, compaction, repair) remove it just before their catalog commit, so that the commit
//! finds room even when containers filled the disk, and write it again once the containers
//! they freed are gone. Creating a backup never touches it: a full disk makes `create` fail,
//! never the deletion that would make room.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use onecopy_core::catalog::{
    Catalog, CatalogRead, CatalogView, CatalogWrite, CompactTrigger, NamedTable,
};
use onecopy_core::container::{ContainerId, ContainerStore};
use onecopy_core::fingerprint::{Fingerprint, Fingerprinter};
use onecopy_core::index::IndexKey;
use onecopy_core::storage::{parent_directory, Layout, Storage, UNORDERED_CREATIONS_MAX};
use onecopy_core::Error as CoreError;
use serde::{Deserialize, Serialize};

use crate::config::{RuntimeOptions, StoreOptions, RESERVE_BYTES_MIN};
use crate::error::{BackupError, Result};
use crate::frames::FrameCoding;
use crate::segment::{
    segment_record_bytes, SegmentContainer, SegmentHead, SegmentId, SegmentRecord, SegmentState,
    CONTAINERS, SEGMENT_HEADS,
};
use crate::segment_index::SegmentIndex;

pub(crate) const STORE: NamedTable = NamedTable("store");
pub(crate) const STATE_KEY: &str = "state";
/// Format of the backup store's records.
pub const STORE_FORMAT: u32 = 2;
/// The catalog's file.
pub const CATALOG_FILE: &str = "catalog.redb";
/// The directory of the containers.
pub const CONTAINERS_DIRECTORY: &str = "containers";

/// How each file of the store is kept when the store is sealed
/// ([`onecopy_core::storage::SealedStorage`]): the catalog (with the new catalog a store is
/// created in, `catalog.redb.new`) in the paged layout, since redb writes its pages
/// copy-on-write and rewrites only its header in place, which must survive a torn write;
/// everything else (containers written once, the derived segment index, the reserve) in the
/// single layout.
pub fn sealed_layout(name: &str) -> Layout {
    if name.starts_with(CATALOG_FILE) {
        Layout::Paged
    } else {
        Layout::Single
    }
}
/// The reserve file (see the module documentation).
pub(crate) const RESERVE_FILE: &str = "reserve";
/// Largest reserve.
pub const RESERVE_BYTES_MAX: u64 = 256 << 20;
/// Catalogs up to this size get a reserve as large as themselves.
const RESERVE_WHOLE_CATALOG_BYTES_MAX: u64 = 8 << 20;

/// The reserve for a catalog of `catalog_bytes`: room for a commit that rewrites every page of
/// a catalog of up to 8 MiB (a small store's deletion may touch most of its records), an
/// eighth of a larger one (a deletion touches the records of one backup, a small part of a
/// large catalog), and at least `minimum`; at most [`RESERVE_BYTES_MAX`].
pub fn reserve_bytes(catalog_bytes: u64, minimum: u64) -> u64 {
    catalog_bytes
        .min(RESERVE_WHOLE_CATALOG_BYTES_MAX)
        .max(catalog_bytes / 8)
        .max(minimum)
        .min(RESERVE_BYTES_MAX)
}

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
    /// commit replaces the list.
    pub containers_dropped: Vec<ContainerId>,
    /// Segments with lost chunks ([`crate::losses`]): never deduplicated against, kept out of
    /// the segment index.
    pub damaged_segments: BTreeSet<SegmentId>,
    /// Every container below this id has been through a recompression (or was written by
    /// one); `backup create` recompresses those from here up to its own first container
    /// ([`BackupStore::recompress_aged`]).
    pub recompress_from: ContainerId,
}

/// How to open a store.
#[derive(Clone, Debug, Default)]
pub struct OpenOptions {
    /// Options for a new store. For an existing store they must equal the recorded ones
    /// (`None` accepts whatever the store was created with).
    pub store: Option<StoreOptions>,
    pub runtime: RuntimeOptions,
    /// Open for reading only (list, restore, stats): nothing is written, at open or close,
    /// and a damaged segment index is left alone. Operations that change the store panic on
    /// such a store.
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
    /// `None` while the store runs without a segment index (see the module documentation).
    pub(crate) index: Option<SegmentIndex>,
    pub(crate) state: StoreState,
    /// The store's fingerprint algorithm, keyed when the storage seals its files.
    pub(crate) fingerprinter: Fingerprinter,
    pub(crate) runtime: RuntimeOptions,
    recovered: bool,
    /// What was wrong with the segment index when the store was opened, for `check`.
    pub(crate) index_damage: Option<String>,
    /// Messages for the user about derived data rebuilt or missing ([`Self::take_notices`]).
    notices: Vec<String>,
    /// Bytes of reserve this process wrote or found: while the file exists, a reserve that
    /// large needs no look at its length (a read of its last block on sealed storage).
    reserve_known: u64,
    /// Times the segment index was rebuilt from the catalog since the store was opened: an
    /// operation that added entries before a rebuild adds them again (the catalog does not
    /// have its segments yet).
    pub(crate) index_rebuilds: u64,
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
    /// Compacts the catalog when more than half of its file is unused
    /// ([`Catalog::compact_if_wasteful`]); for the end of the commands that add or drop many
    /// records (create, delete, expire, compact). Returns the file's length before and after.
    pub fn compact_catalog(&mut self, trigger: CompactTrigger) -> Result<Option<(u64, u64)>> {
        Ok(self.catalog.compact_if_wasteful(trigger)?)
    }

    /// Opens the store kept in `storage`, creating it when empty. Opening changes nothing
    /// but the creation of missing files (none when read-only) and the rebuild of a damaged
    /// segment index; call [`recover`](Self::recover) (every mutating operation does) to
    /// repair what an interrupted command left.
    ///
    /// A damaged catalog is an error naming it ([`onecopy_core::Error::Corrupt`] inside
    /// [`BackupError::Core`]); [`BackupStore::check_at`] reports and repairs it.
    pub fn open(storage: Arc<dyn Storage>, options: OpenOptions) -> Result<BackupStore> {
        if !storage.exists(CATALOG_FILE)? {
            if options.read_only {
                return Err(BackupError::InvalidArgument(format!(
                    "there is no backup store in {} yet; create a backup first",
                    storage.describe()
                )));
            }
            // A new catalog over existing containers would make them all look like
            // leftovers of an interrupted command, which recovery and repairs remove.
            let containers = ContainerStore::new(
                Arc::clone(&storage),
                CONTAINERS_DIRECTORY,
                onecopy_core::container::ContainerOptions::default(),
            )?
            .list()?;
            if !containers.is_empty() {
                return Err(BackupError::corrupt(
                    format!("backup store in {}", storage.describe()),
                    format!(
                        "its catalog ({CATALOG_FILE}) is missing while {} containers exist: \
                         restore the catalog from a copy (a new one would drop every backup)",
                        containers.len()
                    ),
                ));
            }
            create_catalog(&storage, &options)?;
        }
        let catalog = open_catalog(&storage, options.read_only)?;
        let state = load_state(&catalog, &storage)?;
        if let Some(wanted) = &options.store {
            if *wanted != state.options {
                return Err(BackupError::InvalidArgument(format!(
                    "the backup store was created with {}; its options cannot change \
                     (use another repository to try different ones)",
                    serde_json::to_string(&state.options).expect("options serialise")
                )));
            }
        }
        let mut store = BackupStore::with_catalog(storage, catalog, state, options.runtime)?;
        store.open_index(options.read_only)?;
        if !options.read_only {
            store.restore_reserve();
        }
        Ok(store)
    }

    /// A store over an open catalog, without a segment index yet.
    pub(crate) fn with_catalog(
        storage: Arc<dyn Storage>,
        catalog: Catalog,
        state: StoreState,
        runtime: RuntimeOptions,
    ) -> Result<BackupStore> {
        let containers = ContainerStore::new(
            Arc::clone(&storage),
            CONTAINERS_DIRECTORY,
            state.options.container_options(),
        )?;
        let fingerprinter =
            Fingerprinter::new(state.options.fingerprint, storage.fingerprint_key())?;
        Ok(BackupStore {
            storage,
            catalog,
            containers,
            index: None,
            fingerprinter,
            state,
            runtime,
            recovered: false,
            index_damage: None,
            notices: Vec::new(),
            reserve_known: 0,
            index_rebuilds: 0,
        })
    }

    /// Opens the segment index. Read-only: without creating anything; a missing or
    /// unreadable index leaves the store without one. Writable: an index whose open fails
    /// (damaged manifests, directory, missing files) is thrown away and recreated empty, and
    /// recovery fills it from the catalog.
    ///
    /// Neither verifies every page: that would make every backup read the whole index. Each
    /// page is checked when it is loaded; a damaged bucket page found by a lookup makes the
    /// store rebuild the index ([`Self::lookup_segment`]), and `check` verifies them all.
    pub(crate) fn open_index(&mut self, read_only: bool) -> Result<()> {
        let options = self.runtime.index.clone();
        let opened = if read_only && !SegmentIndex::exists(&self.storage)? {
            Err(BackupError::corrupt(
                "segment index in backup/meta",
                "its files are missing",
            ))
        } else {
            SegmentIndex::open(&self.storage, &options)
        };
        match opened {
            Ok(index) => self.index = Some(index),
            Err(error) if read_only => self.index_damage = Some(error.to_string()),
            Err(error) if is_full(&error) => self.notices.push(format!(
                "the segment index could not be opened on a full disk ({error}); running \
                 without it: new backups are not deduplicated against stored ones"
            )),
            Err(error) => {
                self.index_damage = Some(error.to_string());
                match SegmentIndex::recreate(&self.storage, &options) {
                    Ok(index) => {
                        self.notices.push(format!(
                            "the segment index (derived data in backup/meta) was damaged \
                             ({error}); rebuilding it from the catalog"
                        ));
                        self.index = Some(index);
                    }
                    Err(recreate_error) => self.notices.push(format!(
                        "the segment index (derived data in backup/meta) was damaged \
                         ({error}) and could not be rebuilt ({recreate_error}); running \
                         without it: new backups are not deduplicated against stored ones"
                    )),
                }
            }
        }
        Ok(())
    }

    /// Messages about derived data rebuilt or missing since the last call, for the user
    /// (the command line prints them on standard error).
    pub fn take_notices(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notices)
    }

    /// The options the store was created with.
    pub fn options(&self) -> &StoreOptions {
        &self.state.options
    }

    /// The runtime options in use.
    pub fn runtime(&self) -> &RuntimeOptions {
        &self.runtime
    }

    /// Runs recovery again after a step failed, even though it ran at the start of the
    /// operation: the failed step may have left containers with ids the next step would
    /// allocate.
    pub(crate) fn recover_again(&mut self) -> Result<RecoveryReport> {
        self.recovered = false;
        self.recover()
    }

    /// Removes containers no catalog record names and reconciles the segment index with the
    /// catalog. Runs once per opened store (again after an operation failed); later calls
    /// return an empty report.
    ///
    /// Orphan containers come from two places only, so recovery looks there instead of
    /// listing every container (which made every mutating command, a deletion included,
    /// slower as the repository grew): the containers the last commit dropped
    /// ([`StoreState::containers_dropped`]), and containers of an operation that never
    /// committed. The latter hold ids from the committed `container_id_next` up: ids are
    /// allocated one at a time and [`ContainerStore::create`] makes each name durable before it
    /// returns on a directory, while object storage may leave up to
    /// [`UNORDERED_CREATIONS_MAX`] ids of a run missing (parallel uploads), so probing upward
    /// until that many ids in a row are missing finds them all. They are removed highest id
    /// first, each removal durable before the next, so that a crash during recovery leaves a
    /// run the next recovery finds the rest of.
    /// `check` lists every container and reports (and `--repair` removes) any other file.
    pub fn recover(&mut self) -> Result<RecoveryReport> {
        if self.recovered {
            return Ok(RecoveryReport::default());
        }
        assert!(
            !self.catalog.is_read_only(),
            "a store opened read-only is never changed"
        );
        let mut report = RecoveryReport::default();
        let mut dropped: Vec<ContainerId> = Vec::new();
        for &id in &self.state.containers_dropped {
            if self.storage.exists(&self.containers.name(id))? {
                dropped.push(id);
            }
        }
        self.remove_containers(&dropped)?;
        let mut uncommitted = Vec::new();
        let mut id = self.state.container_id_next;
        let mut missing = 0;
        while missing < UNORDERED_CREATIONS_MAX {
            if self.storage.exists(&self.containers.name(id))? {
                uncommitted.push(id);
                missing = 0;
            } else {
                missing += 1;
            }
            id += 1;
        }
        for &id in uncommitted.iter().rev() {
            self.remove_containers(&[id])?;
        }
        report.orphan_containers_removed = (dropped.len() + uncommitted.len()) as u64;
        let (added, removed) = self.reconcile_index_if_needed()?;
        report.index_entries_added = added;
        report.index_entries_removed = removed;
        if self.index.is_some() {
            // An index thrown away at open is whole again.
            self.index_damage = None;
        }
        self.recovered = true;
        Ok(report)
    }

    /// Reconciles the segment index with the catalog when its checkpoint serial disagrees,
    /// or it changed since its checkpoint (an operation failed part way, or a damaged bucket
    /// was emptied), and checkpoints it; rebuilds it from scratch when that fails. Returns
    /// the entries added and removed.
    ///
    /// An index checkpoint records the catalog serial whose shared segments it holds: the
    /// next one when the index goes first (`create`), the current one when it follows the
    /// commit (settlement). A crash between the two leaves different serials. An equal serial
    /// and no change since is trusted, which spares a writable open a scan of every segment
    /// head, a read that grows with the store.
    pub(crate) fn reconcile_index_if_needed(&mut self) -> Result<(u64, u64)> {
        let Some(index) = &self.index else {
            return Ok((0, 0));
        };
        if index.serial() == self.state.serial && index.as_checkpointed() {
            return Ok((0, 0));
        }
        let expected = indexable_segments(&self.catalog.read()?, &self.state.damaged_segments)?;
        let serial = self.state.serial;
        let index = self.index.as_mut().expect("checked above");
        let reconciled = reconcile_index(index, &expected).and_then(|counts| {
            index.checkpoint(serial)?;
            Ok(counts)
        });
        match reconciled {
            Ok(counts) => Ok(counts),
            Err(error) if is_full(&error) => {
                self.index_failed(&error, "reconciling it with the catalog");
                Ok((0, 0))
            }
            Err(error) => {
                self.index_failed(&error, "reconciling it with the catalog");
                self.rebuild_index()?;
                Ok((expected.len() as u64, 0))
            }
        }
    }

    /// Throws the segment index away and builds it again from the catalog. A failure leaves
    /// the store without an index (said in the notices) rather than failing the command.
    pub(crate) fn rebuild_index(&mut self) -> Result<()> {
        let expected = indexable_segments(&self.catalog.read()?, &self.state.damaged_segments)?;
        let serial = self.state.serial;
        let rebuilt =
            SegmentIndex::recreate(&self.storage, &self.runtime.index).and_then(|mut index| {
                for (fingerprint, &id) in &expected {
                    index.insert(fingerprint, id)?;
                }
                index.checkpoint(serial)?;
                Ok(index)
            });
        self.index_rebuilds += 1;
        match rebuilt {
            Ok(index) => self.index = Some(index),
            Err(error) => {
                self.index = None;
                self.notices.push(format!(
                    "the segment index could not be rebuilt ({error}); running without it: new \
                     backups are not deduplicated against stored ones"
                ));
            }
        }
        Ok(())
    }

    /// Drops the segment index after `error` while `doing`: the store goes on without it
    /// (derived data; the next open reconciles or rebuilds it) and the user is told.
    pub(crate) fn index_failed(&mut self, error: &BackupError, doing: &str) {
        self.index = None;
        self.notices.push(format!(
            "the segment index failed while {doing} ({error}); going on without it (the next \
             command or `onecopy check --repair` rebuilds it from the catalog)"
        ));
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

    /// How settlements, compactions and sweeps write the frames they rewrite: what they
    /// rewrite is earlier backups' data, so with recompression on its frames are compressed
    /// again as they go ([`crate::recompress`]).
    pub(crate) fn rewrite_coding(&self) -> FrameCoding {
        match self.state.options {
            StoreOptions {
                compression_level: Some(_),
                recompression_level: Some(level),
                ..
            } => FrameCoding::Recompress(level),
            StoreOptions {
                compression_level, ..
            } => FrameCoding::Keep(compression_level),
        }
    }

    /// Makes the segment index durable, recording `serial`: the catalog serial it matches
    /// (the current one, or the next when the index goes first, as in `create`). A failure
    /// drops the index ([`Self::index_failed`]) instead of failing the operation.
    pub(crate) fn checkpoint_index(&mut self, serial: u64) {
        if let Some(index) = self.index.as_mut() {
            if let Err(error) = index.checkpoint(serial) {
                self.index_failed(&error, "checkpointing it");
            }
        }
    }

    /// Adds `fingerprint -> segment` to the index (nothing without one).
    pub(crate) fn index_insert(&mut self, fingerprint: &Fingerprint, segment: SegmentId) {
        if let Some(index) = self.index.as_mut() {
            if let Err(error) = index.insert(fingerprint, segment) {
                self.index_failed(&error, "adding a segment");
            }
        }
    }

    /// Removes the entry of `fingerprint` if it names `segment`.
    pub(crate) fn index_remove(&mut self, fingerprint: &Fingerprint, segment: SegmentId) {
        if let Some(index) = self.index.as_mut() {
            if let Err(error) = index.remove_if(fingerprint, segment) {
                self.index_failed(&error, "removing a segment");
            }
        }
    }

    /// The segment the index names for `fingerprint`, if the catalog confirms it is a shared
    /// segment with that fingerprint and no lost chunks (stale entries are treated as absent;
    /// without an index, everything is absent).
    pub(crate) fn lookup_segment(
        &mut self,
        read: &CatalogRead,
        fingerprint: &Fingerprint,
    ) -> Result<Option<SegmentId>> {
        let Some(index) = self.index.as_mut() else {
            return Ok(None);
        };
        let mut found = index.lookup(fingerprint);
        if index.damaged_buckets() > 0 && !self.catalog.is_read_only() {
            // A bucket page failed its checks and was emptied: its entries are gone until
            // the index is rebuilt, and a backup would store their segments again.
            self.notices.push(
                "the segment index (derived data in backup/meta) has a damaged page; \
                 rebuilding it from the catalog"
                    .to_string(),
            );
            self.rebuild_index()?;
            let Some(index) = self.index.as_mut() else {
                return Ok(None);
            };
            found = index.lookup(fingerprint);
        }
        let id = match found {
            Ok(Some(id)) => id,
            Ok(None) => return Ok(None),
            Err(error) => {
                self.index_failed(&error, "looking a segment up");
                return Ok(None);
            }
        };
        if self.state.damaged_segments.contains(&id) {
            return Ok(None);
        }
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

    /// Runs the mutating operation `what`. When it fails the store needs recovery again
    /// before the next one (containers the failed operation wrote hold ids the next would
    /// allocate, and the index may hold entries the catalog never confirmed), and recovery
    /// runs at once, so that a full disk gets back the space of a failed attempt. A full file
    /// system becomes [`BackupError::Full`].
    pub(crate) fn mutate<T>(
        &mut self,
        what: &str,
        operation: impl FnOnce(&mut BackupStore) -> Result<T>,
    ) -> Result<T> {
        let outcome = operation(self);
        let Err(error) = outcome else {
            return outcome;
        };
        // Best effort: when it fails too, the next command's recovery finishes the job.
        let _ = self.recover_again();
        if is_full(&error) {
            let hint = if what.starts_with("creating") {
                "delete old backups (`onecopy backup expire` or `delete` work on a full disk), \
                 then run `onecopy backup compact`"
            } else {
                "this operation repackages data still referenced and needs room for it: delete \
                 the oldest backups first (their deletion needs no room), or free space"
            };
            return Err(BackupError::Full {
                operation: what.to_string(),
                detail: error.to_string(),
                hint: hint.to_string(),
            });
        }
        Err(error)
    }

    /// Removes the reserve file, to make room for a commit that frees space, when the disk
    /// is short of room for that commit: with plenty of room (more than twice the reserve
    /// free), or on a storage that cannot tell its free space, the reserve stays, and the
    /// commit costs no removal and no rewrite of it.
    pub(crate) fn release_reserve(&self) -> Result<()> {
        if !self.storage.exists(RESERVE_FILE)? {
            return Ok(());
        }
        let reserve_bytes = self.storage.open(RESERVE_FILE, false)?.len()?;
        let plenty = self
            .storage
            .available_bytes()?
            .is_none_or(|free| free > 2 * reserve_bytes.max(RESERVE_BYTES_MIN));
        if plenty {
            return Ok(());
        }
        self.storage.remove(RESERVE_FILE)?;
        self.storage.sync_directory("")?;
        Ok(())
    }

    /// Writes the reserve file when it is missing or smaller than it should be. Best effort:
    /// on a full disk the store goes on without it (said in the notices), and the next
    /// writable open tries again.
    pub(crate) fn restore_reserve(&mut self) {
        if let Err(error) = self.write_reserve() {
            let _ = self.storage.remove(RESERVE_FILE);
            self.notices.push(format!(
                "could not write the space reserve backup/{RESERVE_FILE} ({error}); deleting \
                 backups on a full disk may fail until some space is free"
            ));
        }
    }

    fn write_reserve(&mut self) -> Result<()> {
        let catalog_bytes = self.storage.open(CATALOG_FILE, false)?.len()?;
        let wanted = reserve_bytes(catalog_bytes, self.runtime.reserve_bytes_min);
        if self.storage.exists(RESERVE_FILE)?
            && (self.reserve_known >= wanted
                || self.storage.open(RESERVE_FILE, false)?.len()? >= wanted)
        {
            self.reserve_known = self.reserve_known.max(wanted);
            return Ok(());
        }
        self.reserve_known = 0;
        let file = self.storage.open(RESERVE_FILE, true)?;
        // Written, not merely sized: a sparse file reserves nothing.
        let block = vec![0u8; 1 << 20];
        let mut offset = file.len()?;
        while offset < wanted {
            let count = block.len().min((wanted - offset) as usize);
            file.write_at(offset, &block[..count])?;
            offset += count as u64;
        }
        file.sync_data()?;
        self.storage.sync_directory("")?;
        self.reserve_known = wanted;
        Ok(())
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
        damaged_segments: BTreeSet::new(),
        serial: 1,
        recompress_from: 1,
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

/// Opens the catalog after verifying its pages: read-only opens read from the verified copy
/// itself; writable ones open the file once the copy verified. A catalog too large for a
/// copy is opened unverified.
fn open_catalog(storage: &Arc<dyn Storage>, read_only: bool) -> Result<Catalog> {
    if storage.authenticates_reads() {
        // Every page is authenticated as it is read (a sealed store): a damaged page is an
        // error naming the catalog, never a wrong record, so the catalog is read page by page
        // as commands need it instead of whole and verified first.
        return Ok(if read_only {
            Catalog::open_read_only(storage, CATALOG_FILE)?
        } else {
            Catalog::open(storage, CATALOG_FILE)?
        });
    }
    match Catalog::open_verified_copy(storage, CATALOG_FILE) {
        Ok(copy) if read_only => Ok(copy),
        Ok(_) => Ok(Catalog::open(storage, CATALOG_FILE)?),
        Err(CoreError::Limit(_)) if read_only => {
            Ok(Catalog::open_read_only(storage, CATALOG_FILE)?)
        }
        Err(CoreError::Limit(_)) => Ok(Catalog::open(storage, CATALOG_FILE)?),
        Err(error) => Err(error.into()),
    }
}

/// The store state recorded in `catalog`.
pub(crate) fn load_state(catalog: &Catalog, storage: &Arc<dyn Storage>) -> Result<StoreState> {
    let state: StoreState = catalog.read()?.get_json(STORE, STATE_KEY)?.ok_or_else(|| {
        BackupError::corrupt(
            format!("backup store in {}", storage.describe()),
            "the catalog holds no store state",
        )
    })?;
    if state.format != STORE_FORMAT {
        return Err(BackupError::InvalidArgument(format!(
            "the backup store has format {}, this onecopy reads format {STORE_FORMAT}",
            state.format
        )));
    }
    Ok(state)
}

/// True when `error` says the file system is full: an I/O error of the engine, or one under
/// a catalog error (a commit that found no room).
pub fn is_full(error: &BackupError) -> bool {
    let BackupError::Core(error) = error else {
        return false;
    };
    error.io_source().is_some_and(|source| {
        source.raw_os_error() == Some(libc::ENOSPC)
            || source.kind() == std::io::ErrorKind::StorageFull
    })
}

/// Shared segments by fingerprint, except the `damaged` ones: what the segment index must
/// hold. A head that does not decode is left out (a missed deduplication at worst; `check`
/// reports it and a repair rebuilds it).
pub(crate) fn indexable_segments(
    view: &impl CatalogView,
    damaged: &BTreeSet<SegmentId>,
) -> Result<HashMap<Fingerprint, SegmentId>> {
    let mut expected = HashMap::new();
    for (id, bytes) in view.range_id(SEGMENT_HEADS, 0, u64::MAX)? {
        let Ok(head) = SegmentHead::decode(&bytes, id) else {
            continue;
        };
        if head.state == SegmentState::Shared && !damaged.contains(&id) {
            expected.entry(head.fingerprint).or_insert(id);
        }
    }
    Ok(expected)
}

/// Makes `index` hold exactly `expected`; returns the entries added and removed.
fn reconcile_index(
    index: &mut SegmentIndex,
    expected: &HashMap<Fingerprint, SegmentId>,
) -> Result<(u64, u64)> {
    let mut added = 0;
    for (fingerprint, &id) in expected {
        if index.lookup(fingerprint)? != Some(id) {
            index.insert(fingerprint, id)?;
            added += 1;
        }
    }
    let expected = by_index_key(expected);
    let mut stale = Vec::new();
    index.for_each_entry(|key, id| {
        if expected.get(key) != Some(&id) {
            stale.push(*key);
        }
    })?;
    for key in &stale {
        index.remove_key(key)?;
    }
    Ok((added, stale.len() as u64))
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
    let bytes = segment_record_bytes(view, id)?
        .ok_or_else(|| BackupError::corrupt(format!("segment {id}"), "record missing"))?;
    SegmentRecord::decode(&bytes, id)
}

pub(crate) fn load_container(view: &impl CatalogView, id: ContainerId) -> Result<SegmentContainer> {
    let bytes = view
        .get_id(CONTAINERS, id)?
        .ok_or_else(|| BackupError::corrupt(format!("container {id:016x}"), "record missing"))?;
    SegmentContainer::decode(&bytes, id)
}

/// Current time in unix nanoseconds.
pub(crate) fn now_unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos() as u64)
}
