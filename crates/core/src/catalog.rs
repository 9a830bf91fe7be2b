//! The catalog: named, transactional records (volumes, series, recipes, segment tables).
//!
//! The catalog is a [redb](https://docs.rs/redb) database (copy-on-write B-trees with
//! checksummed pages and atomic, durable commits) stored through our own [`Storage`] trait, so
//! the crash simulator exercises it like every other file. Faces see only two table shapes —
//! [`NamedTable`] (string keys) and [`IdTable`] (u64 keys) — with byte values; JSON helpers
//! cover small, evolving records, while large ones (recipes) use their own binary encoding.
//!
//! Versioning: the `catalog.meta` table records [`SCHEMA_VERSION`]; opening a catalog written
//! by a newer onecopy fails with a clear message instead of misreading it.
//!
//! Per-write metadata of the block device does *not* go here: a B-tree commit per 4 KiB write
//! would cap throughput far below the disk. Block maps live in the page store and journal;
//! the catalog holds the volume records.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use serde::{de::DeserializeOwned, Serialize};

use crate::bytes::u64_at;
use crate::storage::{Storage, StorageFile};
use crate::{Error, Result};

/// Format version of the catalog's tables.
pub const SCHEMA_VERSION: u64 = 1;
/// Memory redb may use for its page cache.
const CACHE_BYTES: usize = 16 << 20;
/// A catalog up to this size is read ahead whole by [`Catalog::read_ahead`] (`posix_fadvise`
/// WILLNEED), in one sequential read the disk serves at full speed, rather than in the
/// scattered reads a cold `backup create` would otherwise wait for before its inline phase
/// (docs/BENCHMARKS.md, "Figures the design refers to", gives the times). Larger catalogs are read page by
/// page.
const READ_AHEAD_BYTES_MAX: u64 = 64 << 20;

const META: TableDefinition<&str, u64> = TableDefinition::new("catalog.meta");

/// A table with string keys.
#[derive(Clone, Copy, Debug)]
pub struct NamedTable(pub &'static str);

/// A table with u64 keys, iterated in key order.
#[derive(Clone, Copy, Debug)]
pub struct IdTable(pub &'static str);

impl NamedTable {
    fn definition(self) -> TableDefinition<'static, &'static str, &'static [u8]> {
        TableDefinition::new(self.0)
    }
}

impl IdTable {
    fn definition(self) -> TableDefinition<'static, u64, &'static [u8]> {
        TableDefinition::new(self.0)
    }
}

/// An error of redb, kept as the source.
fn catalog_error(error: impl Into<redb::Error>) -> Error {
    Error::catalog("", error)
}

/// A verified copy is read in pieces of this size.
const VERIFIED_READ_BYTES: usize = 1 << 20;
/// The unit a storage that authenticates reads fails in ([`crate::storage::sealed::BLOCK_BYTES`]).
const AUTHENTICATED_BLOCK_BYTES: usize = crate::storage::sealed::BLOCK_BYTES;
const _: () = assert!(VERIFIED_READ_BYTES.is_multiple_of(AUTHENTICATED_BLOCK_BYTES));

/// Largest catalog [`Catalog::open_verified_copy`] copies into memory.
pub const VERIFIED_COPY_BYTES_MAX: u64 = 1 << 30;

/// An open catalog.
pub struct Catalog {
    database: Database,
    /// The file under `database`, for [`Catalog::read_ahead`] (`None` for a verified copy,
    /// which lives in memory).
    file: Option<Arc<dyn StorageFile>>,
    /// Commits make their pages durable before the header names them (redb's two-phase
    /// commit), for storages that authenticate reads: there a page torn by a crash reads as
    /// an error, not as a checksum mismatch from which redb's one-phase recovery falls back to
    /// the previous commit.
    two_phase: bool,
    /// A verified copy's blocks that failed authentication although no committed page uses
    /// them ([`Catalog::open_verified_copy`]).
    unused_unreadable_blocks: Vec<u64>,
    /// Bytes redb read from `file` since the catalog was opened (its cache misses).
    read_bytes: Arc<AtomicU64>,
}

/// How the catalog is open. Read-only opening exists because opening for writing costs disk
/// flushes even when nothing changes: redb records its allocator state and a clean-shutdown
/// header when a writable database closes (four flushes), which is most of the time a small
/// restore or a `list` takes.
enum Database {
    Writable(redb::Database),
    ReadOnly(redb::ReadOnlyDatabase),
    /// A copy in memory whose every page checksum was verified ([`Catalog::open_verified_copy`]);
    /// read only, like `ReadOnly`.
    VerifiedCopy(redb::Database),
}

/// When [`Catalog::compact_if_wasteful`] measures the catalog's waste.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompactTrigger {
    /// After commands that remove records (deletion, expiry, compaction): always.
    AfterRemovals,
    /// After commands that mostly add records (a backup): once the file has doubled since
    /// it was last measured, by a command that read most of it.
    AfterGrowth,
}

/// The `catalog.meta` key recording the file's length when its waste was last measured.
const MEASURED_KEY: &str = "compaction.measured_bytes";

/// Smaller catalogs are not compacted: redb grows a new file in steps of this order, and
/// shrinking them only makes the next commit grow them again.
pub const COMPACT_FILE_BYTES_MIN: u64 = 4 << 20;

impl std::fmt::Debug for Catalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Catalog")
    }
}

impl Catalog {
    /// Opens (creating if needed) the catalog stored in file `name` of `storage`.
    pub fn open(storage: &Arc<dyn Storage>, name: &str) -> Result<Catalog> {
        let existed = storage.exists(name)?;
        let file = storage.open(name, true)?;
        if !existed {
            storage.sync_directory(crate::storage::parent_directory(name))?;
        }
        let read_bytes = Arc::new(AtomicU64::new(0));
        let database = redb::Builder::new()
            .set_cache_size(CACHE_BYTES)
            .create_with_backend(CatalogBackend {
                file: file.clone(),
                read_bytes: Arc::clone(&read_bytes),
            })
            .map_err(|error| {
                Error::catalog(
                    format!("opening catalog {name} in {}", storage.describe()),
                    error,
                )
            })?;
        let catalog = Catalog {
            database: Database::Writable(database),
            file: Some(file),
            two_phase: storage.authenticates_reads(),
            unused_unreadable_blocks: Vec::new(),
            read_bytes,
        };
        catalog.check_schema()?;
        Ok(catalog)
    }

    /// Opens the existing catalog in file `name` for reading only: nothing is written, at open
    /// or at close. A catalog that was not closed cleanly (a crash) needs a repair, which
    /// only a writable open performs, so such a catalog is opened for writing instead.
    /// [`write`](Self::write) on a read-only catalog is an error.
    pub fn open_read_only(storage: &Arc<dyn Storage>, name: &str) -> Result<Catalog> {
        // A missing file is `Error::NotFound` (the storage contract).
        let file = storage.open(name, false)?;
        let opened = redb::Builder::new()
            .set_cache_size(CACHE_BYTES)
            .open_read_only_with_backend(CatalogBackend {
                file: file.clone(),
                read_bytes: Arc::default(),
            });
        let database = match opened {
            Ok(database) => database,
            Err(redb::DatabaseError::RepairAborted) => return Catalog::open(storage, name),
            Err(error) => {
                return Err(Error::catalog(
                    format!(
                        "opening catalog {name} in {} for reading",
                        storage.describe()
                    ),
                    error,
                ))
            }
        };
        let catalog = Catalog {
            database: Database::ReadOnly(database),
            file: Some(file),
            two_phase: storage.authenticates_reads(),
            unused_unreadable_blocks: Vec::new(),
            read_bytes: Arc::default(),
        };
        catalog.check_schema()?;
        Ok(catalog)
    }

    /// Reads the catalog in file `name` into memory and opens the copy after verifying the
    /// checksum of every page of its committed trees, for reading only. Nothing is written to
    /// the file, not even for a catalog a crash left unclean (the copy is repaired in memory).
    ///
    /// Why: redb checks page checksums only when it repairs after a crash or when asked to;
    /// a plain open trusts the file, so a damaged page can read back as a wrong value or make
    /// redb panic. A catalog whose checks fail is [`Error::Corrupt`] naming the file and what
    /// redb found; a missing file is [`Error::NotFound`]; a catalog larger than
    /// [`VERIFIED_COPY_BYTES_MAX`] is [`Error::Limit`]. Cost: one sequential read of the file
    /// and a check that grows linearly with its size (docs/BENCHMARKS.md).
    ///
    /// On a storage that authenticates reads, blocks that fail authentication are copied as
    /// zeros: a page a committed tree uses then fails redb's checksum (the catalog is
    /// damaged), while a block no commit uses (a write a crash interrupted) is harmless;
    /// [`Catalog::unused_unreadable_blocks`] lists those of a copy that verified.
    pub fn open_verified_copy(storage: &Arc<dyn Storage>, name: &str) -> Result<Catalog> {
        let file = storage.open(name, false)?;
        let length = file.len()?;
        if length > VERIFIED_COPY_BYTES_MAX {
            return Err(Error::Limit(format!(
                "catalog {name} in {} has {length} bytes, more than the {VERIFIED_COPY_BYTES_MAX} \
                 a verified copy may hold",
                storage.describe()
            )));
        }
        let what = || format!("catalog {name} in {}", storage.describe());
        if length == 0 {
            // redb would initialise an empty file as a new database.
            return Err(Error::corrupt(what(), "the file is empty"));
        }
        let mut bytes = vec![0u8; length as usize];
        let mut unreadable = Vec::new();
        for (piece, range) in bytes.chunks_mut(VERIFIED_READ_BYTES).enumerate() {
            let at = (piece * VERIFIED_READ_BYTES) as u64;
            match file.read_at(at, range) {
                Ok(()) => {}
                Err(Error::Corrupt { .. }) if storage.authenticates_reads() => {
                    for (block, content) in range.chunks_mut(AUTHENTICATED_BLOCK_BYTES).enumerate()
                    {
                        let offset = at + (block * AUTHENTICATED_BLOCK_BYTES) as u64;
                        if let Err(error) = file.read_at(offset, content) {
                            if !matches!(error, Error::Corrupt { .. }) {
                                return Err(error);
                            }
                            content.fill(0);
                            unreadable.push(offset / AUTHENTICATED_BLOCK_BYTES as u64);
                        }
                    }
                }
                Err(error) => return Err(error),
            }
        }
        drop(file);
        let backend = MemoryBackend {
            bytes: parking_lot::RwLock::new(bytes),
        };
        // redb promises errors, not panics, for a damaged file opened with an integrity check;
        // the unwind guard keeps that promise for the cases it misses.
        let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            redb::Builder::new()
                .set_cache_size(CACHE_BYTES)
                .set_check_integrity_on_open(true)
                .create_with_backend(backend)
        }));
        let database = match opened {
            Ok(Ok(database)) => database,
            Ok(Err(error)) => return Err(Error::corrupt(what(), error.to_string())),
            Err(panic) => {
                return Err(Error::corrupt(
                    what(),
                    format!("redb failed on a damaged page: {}", panic_message(&panic)),
                ))
            }
        };
        let catalog = Catalog {
            database: Database::VerifiedCopy(database),
            file: None,
            two_phase: false,
            unused_unreadable_blocks: unreadable,
            read_bytes: Arc::default(),
        };
        // The schema table is part of the verified trees; a catalog without one was never
        // initialised.
        catalog.check_schema().map_err(|error| match error {
            error @ Error::Catalog { .. } => {
                let detail = error.to_string();
                Error::corrupt(what(), detail.trim_start_matches("catalog: "))
            }
            other => other,
        })?;
        Ok(catalog)
    }

    /// Asks the media to read the whole catalog ahead when it is small (see
    /// [`READ_AHEAD_BYTES_MAX`]); best effort, a failure changes only speed. For operations
    /// that read much of the catalog (a backup's predecessor, a restore, a check). Opening
    /// does not do it: a command that reads a few records (a deletion) would then wait for
    /// reads that grow with the repository.
    pub fn read_ahead(&self) {
        let Some(file) = &self.file else {
            return; // A verified copy is in memory already.
        };
        if let Ok(length) = file.len() {
            if length <= READ_AHEAD_BYTES_MAX {
                let _ = file.advise_will_need(0, length);
            }
        }
    }

    /// True when the catalog was opened for reading only (a verified copy included).
    pub fn is_read_only(&self) -> bool {
        !matches!(self.database, Database::Writable(_))
    }

    /// Blocks (of [`crate::storage::sealed::BLOCK_BYTES`]) of a verified copy's file that
    /// failed authentication although no committed page uses them: writes a crash
    /// interrupted, which later writes of those pages replace.
    pub fn unused_unreadable_blocks(&self) -> &[u64] {
        &self.unused_unreadable_blocks
    }

    /// True when the catalog is a verified copy ([`Catalog::open_verified_copy`]).
    pub fn is_verified_copy(&self) -> bool {
        matches!(self.database, Database::VerifiedCopy(_))
    }

    fn begin_read(&self) -> Result<redb::ReadTransaction> {
        match &self.database {
            Database::Writable(database) | Database::VerifiedCopy(database) => {
                database.begin_read()
            }
            Database::ReadOnly(database) => database.begin_read(),
        }
        .map_err(catalog_error)
    }

    fn begin_write(&self) -> Result<redb::WriteTransaction> {
        let mut transaction = self.writable()?.begin_write().map_err(catalog_error)?;
        transaction.set_two_phase_commit(self.two_phase);
        Ok(transaction)
    }

    fn writable(&self) -> Result<&redb::Database> {
        match &self.database {
            Database::Writable(database) => Ok(database),
            Database::ReadOnly(_) | Database::VerifiedCopy(_) => Err(Error::catalog_refused(
                "the catalog was opened read-only; this operation changes it",
            )),
        }
    }

    /// Checks the recorded schema version, recording it in a new catalog. A read transaction
    /// comes first because a write commit costs a disk flush, and most opens find the version.
    fn check_schema(&self) -> Result<()> {
        let stored = {
            let transaction = self.begin_read()?;
            match transaction.open_table(META) {
                Ok(meta) => meta
                    .get("schema_version")
                    .map_err(catalog_error)?
                    .map(|value| value.value()),
                Err(redb::TableError::TableDoesNotExist(_)) => None,
                Err(error) => return Err(catalog_error(error)),
            }
        };
        match stored {
            Some(version) if version > SCHEMA_VERSION => Err(Error::catalog_refused(format!(
                "the catalog has schema version {version}, newer than this onecopy \
                 understands ({SCHEMA_VERSION}); upgrade onecopy"
            ))),
            Some(_) => Ok(()),
            None => {
                let transaction = self.begin_write()?;
                {
                    let mut meta = transaction.open_table(META).map_err(catalog_error)?;
                    meta.insert("schema_version", SCHEMA_VERSION)
                        .map_err(catalog_error)?;
                }
                transaction.commit().map_err(catalog_error)
            }
        }
    }

    /// Starts a read-only snapshot.
    pub fn read(&self) -> Result<CatalogRead> {
        Ok(CatalogRead {
            transaction: self.begin_read()?,
        })
    }

    /// Starts a write transaction; nothing is visible or durable until
    /// [`commit`](CatalogWrite::commit). One write transaction runs at a time.
    pub fn write(&self) -> Result<CatalogWrite> {
        Ok(CatalogWrite {
            transaction: self.begin_write()?,
        })
    }

    /// Compacts the catalog when it is [`COMPACT_FILE_BYTES_MIN`] or larger and its unused
    /// bytes (pages freed by later commits, room inside pages) exceed half its used ones:
    /// redb moves the pages to the front of the file and shortens it, in commits each of which
    /// a crash leaves consistent. Returns the file's length before and after, or `None` when
    /// it was not worth it. A no-op (`None`) on a catalog opened for reading.
    ///
    /// Measuring the waste walks every page of the catalog, and so does compacting. With
    /// [`CompactTrigger::AfterGrowth`] the waste is measured only once redb has doubled the
    /// file since it was last measured (the length then is recorded in the catalog), and then
    /// only by a command that has read at least half that length already (a backup that
    /// settles its predecessor reads the records of most segments), so that measuring costs
    /// it a few times what it read; a command that read less (an unchanged backup) leaves it
    /// to the next one unless the file has doubled twice. redb grows a file by doubling it:
    /// a catalog compacted to what it uses doubles at the next commit that adds records, so
    /// measuring at every doubling would read the whole catalog after most backups.
    pub fn compact_if_wasteful(&mut self, trigger: CompactTrigger) -> Result<Option<(u64, u64)>> {
        if !matches!(self.database, Database::Writable(_)) {
            return Ok(None);
        }
        let length =
            |file: &Option<Arc<dyn StorageFile>>| file.as_ref().map_or(Ok(0), |file| file.len());
        let before = length(&self.file)?;
        if before < COMPACT_FILE_BYTES_MIN {
            return Ok(None);
        }
        if trigger == CompactTrigger::AfterGrowth {
            let measured = {
                let transaction = self.begin_read()?;
                match transaction.open_table(META) {
                    Ok(meta) => meta
                        .get(MEASURED_KEY)
                        .map_err(catalog_error)?
                        .map(|value| value.value()),
                    Err(redb::TableError::TableDoesNotExist(_)) => None,
                    Err(error) => return Err(catalog_error(error)),
                }
            }
            .unwrap_or(0);
            // Against the length last measured: the file, doubled since, is mostly unused.
            let read_most = self.read_bytes.load(Ordering::Relaxed).saturating_mul(2) >= measured;
            // redb doubles its usable bytes, so a doubled file is a few pages short of twice
            // its length: one doubling is a file half again as long, two are three times.
            let grown = |numerator: u64, denominator: u64| {
                before.saturating_mul(denominator) >= measured.saturating_mul(numerator)
            };
            if !(grown(3, 2) && read_most || grown(3, 1)) {
                return Ok(None);
            }
        }
        let database = self.writable()?;
        let stats = {
            let transaction = database.begin_write().map_err(catalog_error)?;
            let stats = transaction.stats().map_err(catalog_error)?;
            transaction.abort().map_err(catalog_error)?;
            stats
        };
        let used = stats.stored_bytes() + stats.metadata_bytes();
        let compacted = stats.fragmented_bytes().saturating_mul(2) > used;
        if compacted {
            let Database::Writable(database) = &mut self.database else {
                unreachable!("checked writable above");
            };
            database
                .compact()
                .map_err(|error| Error::catalog("compacting the catalog", error))?;
        }
        let after = length(&self.file)?;
        let transaction = self.begin_write()?;
        transaction
            .open_table(META)
            .map_err(catalog_error)?
            .insert(MEASURED_KEY, after)
            .map_err(catalog_error)?;
        transaction.commit().map_err(catalog_error)?;
        Ok(compacted.then_some((before, after)))
    }

    /// Verifies every page checksum of the catalog.
    pub fn verify(&mut self) -> Result<bool> {
        match &mut self.database {
            Database::Writable(database) => database.check_integrity().map_err(catalog_error),
            Database::VerifiedCopy(_) => Ok(true),
            Database::ReadOnly(_) => Err(Error::catalog_refused(
                "verifying the catalog needs it opened for writing (a repair may follow)",
            )),
        }
    }
}

/// Reading operations shared by snapshots and write transactions.
pub trait CatalogView {
    /// The value stored under `key`.
    fn get(&self, table: NamedTable, key: &str) -> Result<Option<Vec<u8>>>;
    /// The value stored under `id`.
    fn get_id(&self, table: IdTable, id: u64) -> Result<Option<Vec<u8>>>;
    /// Every entry, in key order.
    fn list(&self, table: NamedTable) -> Result<Vec<(String, Vec<u8>)>>;
    /// Entries with ids in `[start, end)`, in order.
    fn range_id(&self, table: IdTable, start: u64, end: u64) -> Result<Vec<(u64, Vec<u8>)>>;

    /// The JSON value stored under `key`.
    fn get_json<T: DeserializeOwned>(&self, table: NamedTable, key: &str) -> Result<Option<T>> {
        self.get(table, key)?
            .map(|bytes| decode_json(table.0, key, &bytes))
            .transpose()
    }

    /// Every JSON value, in key order.
    fn list_json<T: DeserializeOwned>(&self, table: NamedTable) -> Result<Vec<(String, T)>> {
        self.list(table)?
            .into_iter()
            .map(|(key, bytes)| Ok((key.clone(), decode_json(table.0, &key, &bytes)?)))
            .collect()
    }
}

fn decode_json<T: DeserializeOwned>(table: &str, key: &str, bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes)
        .map_err(|error| Error::corrupt(format!("catalog record {table}/{key}"), error.to_string()))
}

macro_rules! impl_view {
    ($type:ty) => {
        impl CatalogView for $type {
            fn get(&self, table: NamedTable, key: &str) -> Result<Option<Vec<u8>>> {
                match self.transaction.open_table(table.definition()) {
                    Ok(opened) => Ok(opened
                        .get(key)
                        .map_err(catalog_error)?
                        .map(|value| value.value().to_vec())),
                    Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
                    Err(error) => Err(catalog_error(error)),
                }
            }

            fn get_id(&self, table: IdTable, id: u64) -> Result<Option<Vec<u8>>> {
                match self.transaction.open_table(table.definition()) {
                    Ok(opened) => Ok(opened
                        .get(id)
                        .map_err(catalog_error)?
                        .map(|value| value.value().to_vec())),
                    Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
                    Err(error) => Err(catalog_error(error)),
                }
            }

            fn list(&self, table: NamedTable) -> Result<Vec<(String, Vec<u8>)>> {
                let opened = match self.transaction.open_table(table.definition()) {
                    Ok(opened) => opened,
                    Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                    Err(error) => return Err(catalog_error(error)),
                };
                let mut entries = Vec::new();
                for entry in opened.iter().map_err(catalog_error)? {
                    let (key, value) = entry.map_err(catalog_error)?;
                    entries.push((key.value().to_string(), value.value().to_vec()));
                }
                Ok(entries)
            }

            fn range_id(
                &self,
                table: IdTable,
                start: u64,
                end: u64,
            ) -> Result<Vec<(u64, Vec<u8>)>> {
                let opened = match self.transaction.open_table(table.definition()) {
                    Ok(opened) => opened,
                    Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                    Err(error) => return Err(catalog_error(error)),
                };
                let mut entries = Vec::new();
                for entry in opened.range(start..end).map_err(catalog_error)? {
                    let (key, value) = entry.map_err(catalog_error)?;
                    entries.push((key.value(), value.value().to_vec()));
                }
                Ok(entries)
            }
        }
    };
}

/// A consistent read-only snapshot of the catalog.
pub struct CatalogRead {
    transaction: redb::ReadTransaction,
}

/// A write transaction.
pub struct CatalogWrite {
    transaction: redb::WriteTransaction,
}

impl_view!(CatalogRead);
impl_view!(CatalogWrite);

impl CatalogWrite {
    /// Stores `value` under `key`, replacing any previous value.
    pub fn put(&mut self, table: NamedTable, key: &str, value: &[u8]) -> Result<()> {
        let mut opened = self
            .transaction
            .open_table(table.definition())
            .map_err(catalog_error)?;
        opened.insert(key, value).map_err(catalog_error)?;
        Ok(())
    }

    /// Stores `value` as JSON under `key`.
    pub fn put_json<T: Serialize>(
        &mut self,
        table: NamedTable,
        key: &str,
        value: &T,
    ) -> Result<()> {
        let bytes = serde_json::to_vec(value).map_err(|error| {
            Error::InvalidArgument(format!(
                "catalog record {}/{key} cannot be stored as JSON: {error}",
                table.0
            ))
        })?;
        self.put(table, key, &bytes)
    }

    /// Stores `value` under `id`.
    pub fn put_id(&mut self, table: IdTable, id: u64, value: &[u8]) -> Result<()> {
        let mut opened = self
            .transaction
            .open_table(table.definition())
            .map_err(catalog_error)?;
        opened.insert(id, value).map_err(catalog_error)?;
        Ok(())
    }

    /// Removes `key`; true when it existed.
    pub fn remove(&mut self, table: NamedTable, key: &str) -> Result<bool> {
        let mut opened = self
            .transaction
            .open_table(table.definition())
            .map_err(catalog_error)?;
        let existed = opened.remove(key).map_err(catalog_error)?.is_some();
        Ok(existed)
    }

    /// Removes `id`; true when it existed.
    pub fn remove_id(&mut self, table: IdTable, id: u64) -> Result<bool> {
        let mut opened = self
            .transaction
            .open_table(table.definition())
            .map_err(catalog_error)?;
        let existed = opened.remove(id).map_err(catalog_error)?.is_some();
        Ok(existed)
    }

    /// Makes the transaction's changes visible and durable at once.
    pub fn commit(self) -> Result<()> {
        self.transaction.commit().map_err(catalog_error)
    }
}

/// What [`Catalog::repair_header`] changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeaderRepair {
    /// What was wrong and put right, one line each; empty when the header was intact.
    pub repaired: Vec<String>,
    /// The newest commit could not be recovered and the catalog now holds the one before:
    /// what the last command committed is lost.
    pub rolled_back: bool,
    /// Where the file as it was before the repair was kept.
    pub kept_as: Option<String>,
}

// redb's super-header (redb 4, file format 3; `tree_store/page_store/header.rs`): the
// magic number, the god byte (primary slot bit, recovery-required, two-phase-commit and
// primary-unflushed flags), two bytes of padding, then constants of the file's geometry
// (page size, region header pages, region data pages), then the region counts, which redb
// recomputes from the file length when recovery is required. Two commit slots of 128 bytes
// follow, each ending in an XXH3-128 checksum of its first 112 bytes, with the transaction
// id at bytes 104-112 and the file format version in byte 0.
const HEADER_MAGIC_BYTES: usize = 9;
const HEADER_GOD_BYTE: usize = 9;
const HEADER_GEOMETRY: std::ops::Range<usize> = 12..24;
const HEADER_UNUSED: std::ops::Range<usize> = 32..64;
const HEADER_SLOTS: [usize; 2] = [64, 192];
const HEADER_BYTES: usize = 320;
const SLOT_BYTES: usize = 128;
const SLOT_CHECKED_BYTES: usize = 112;
/// Byte offset of a commit slot's transaction id (u64).
const SLOT_TRANSACTION: usize = 104;
const SLOT_FORMAT_VERSION: u8 = 3;
const GOD_PRIMARY_SLOT_1: u8 = 1;
const GOD_RECOVERY_REQUIRED: u8 = 2;
const GOD_TWO_PHASE_COMMIT: u8 = 4;
const GOD_PRIMARY_UNFLUSHED: u8 = 8;

/// True when `slot` is a commit slot whose checksum holds.
fn slot_valid(slot: &[u8]) -> bool {
    let stored = u128::from_le_bytes(slot[SLOT_CHECKED_BYTES..SLOT_BYTES].try_into().expect("16"));
    slot[0] == SLOT_FORMAT_VERSION
        && xxhash_rust::xxh3::xxh3_128(&slot[..SLOT_CHECKED_BYTES]) == stored
}

/// Puts right one damaged byte of `slot` if one change makes its checksum hold (a 128-bit
/// checksum: a wrong match is not a practical concern); true when `slot` is valid after.
fn correct_slot(slot: &mut [u8]) -> bool {
    if slot_valid(slot) {
        return true;
    }
    for position in 0..SLOT_BYTES {
        let original = slot[position];
        for value in 0..=u8::MAX {
            if value == original {
                continue;
            }
            slot[position] = value;
            if slot_valid(slot) {
                return true;
            }
        }
        slot[position] = original;
    }
    false
}

impl Catalog {
    /// What is wrong with the super-header of the catalog in file `name`, read only: fields
    /// that differ from a new catalog's constants, commit slots whose checksum fails, flags
    /// no redb writes. A damaged slot that is not the primary one does not stop opens (it
    /// holds the commit before, and the next commit overwrites it), but it is damage.
    pub fn inspect_header(storage: &Arc<dyn Storage>, name: &str) -> Result<Vec<String>> {
        let file = storage.open(name, false)?;
        if file.len()? < HEADER_BYTES as u64 {
            return Ok(vec![
                "the file is too short to hold redb's header".to_string()
            ]);
        }
        let mut header = [0u8; HEADER_BYTES];
        file.read_at(0, &mut header)?;
        let template = template_header()?;
        let mut problems = Vec::new();
        if header[..HEADER_MAGIC_BYTES] != template[..HEADER_MAGIC_BYTES] {
            problems.push("redb's magic number is damaged".to_string());
        }
        if header[HEADER_GEOMETRY] != template[HEADER_GEOMETRY] || header[10..12] != [0, 0] {
            problems.push("the page size or region geometry is damaged".to_string());
        }
        let known_flags = GOD_RECOVERY_REQUIRED
            | GOD_TWO_PHASE_COMMIT
            | GOD_PRIMARY_SLOT_1
            | GOD_PRIMARY_UNFLUSHED;
        if header[HEADER_GOD_BYTE] & !known_flags != 0 {
            problems.push("the god byte holds flags redb never writes".to_string());
        }
        if header[HEADER_UNUSED].iter().any(|&byte| byte != 0) {
            problems.push("bytes redb leaves zero are not (harmless to redb)".to_string());
        }
        let primary = usize::from(header[HEADER_GOD_BYTE] & GOD_PRIMARY_SLOT_1 != 0);
        let transaction = |index: usize| {
            let at = HEADER_SLOTS[index];
            u64_at(&header[at..at + SLOT_BYTES], SLOT_TRANSACTION)
        };
        let both_valid = HEADER_SLOTS
            .iter()
            .all(|&at| slot_valid(&header[at..at + SLOT_BYTES]));
        // A clean file's primary holds the newest commit; only a commit interrupted between
        // its two flushes (which leaves recovery required) has it the other way round.
        if both_valid
            && transaction(primary) < transaction(1 - primary)
            && header[HEADER_GOD_BYTE] & GOD_RECOVERY_REQUIRED == 0
        {
            problems.push("the god byte names the older commit slot as the primary".to_string());
        }
        for (index, &at) in HEADER_SLOTS.iter().enumerate() {
            if !slot_valid(&header[at..at + SLOT_BYTES]) {
                problems.push(format!(
                    "commit slot {index} ({}) fails its checksum",
                    if index == primary {
                        "the primary"
                    } else {
                        "the previous commit's, which the next commit overwrites"
                    }
                ));
            }
        }
        Ok(problems)
    }

    /// Repairs the super-header of the catalog in file `name`, the part of redb's file no
    /// page checksum covers and whose damage makes every open fail:
    ///
    /// - the magic number and the geometry constants are written as a new catalog of this
    ///   build has them;
    /// - a commit slot whose checksum fails gets the one-byte correction that makes it hold,
    ///   if there is one;
    /// - the god byte is written again: the primary is the valid slot with the newest
    ///   transaction, two-phase commit is set (so that redb trusts nothing older silently),
    ///   and recovery is required, so that the next writable open recomputes the region
    ///   counts from the file's length and verifies every page of the primary's trees.
    ///
    /// When the newest slot cannot be put right, the older one is used: the catalog goes
    /// back to the commit before ([`HeaderRepair::rolled_back`]). Nothing changes for a
    /// catalog whose verified copy opens and whose header [`Catalog::inspect_header`] finds
    /// intact. Otherwise the file as it was is kept as
    /// `<name>.damaged` first, and when the repaired header does not make a verified copy
    /// open either, the old header is put back. Errors: [`Error::Corrupt`] when no slot is
    /// valid, the file is too short to hold a header, or the damage is not in the header.
    pub fn repair_header(storage: &Arc<dyn Storage>, name: &str) -> Result<HeaderRepair> {
        let what = || format!("catalog {name} in {}", storage.describe());
        if Catalog::open_verified_copy(storage, name).is_ok()
            && Catalog::inspect_header(storage, name)?.is_empty()
        {
            return Ok(HeaderRepair::default());
        }
        let file = storage.open(name, false)?;
        let length = file.len()?;
        if length < 4096 {
            return Err(Error::corrupt(
                what(),
                format!("{length} bytes: too short to hold redb's header page"),
            ));
        }
        let mut header = [0u8; HEADER_BYTES];
        file.read_at(0, &mut header)?;
        let template = template_header()?;
        let mut repaired = HeaderRepair::default();
        let mut fixed = header;
        if fixed[..HEADER_MAGIC_BYTES] != template[..HEADER_MAGIC_BYTES] {
            fixed[..HEADER_MAGIC_BYTES].copy_from_slice(&template[..HEADER_MAGIC_BYTES]);
            repaired.repaired.push("redb's magic number".to_string());
        }
        if fixed[HEADER_GEOMETRY] != template[HEADER_GEOMETRY] || fixed[10..12] != [0, 0] {
            fixed[HEADER_GEOMETRY].copy_from_slice(&template[HEADER_GEOMETRY]);
            fixed[10..12].fill(0);
            repaired
                .repaired
                .push("the page size and region geometry".to_string());
        }
        if fixed[HEADER_UNUSED].iter().any(|&byte| byte != 0) {
            fixed[HEADER_UNUSED].fill(0);
            repaired
                .repaired
                .push("unused bytes set to zero".to_string());
        }
        let mut valid = [false; 2];
        let mut transaction = [0u64; 2];
        for (index, &at) in HEADER_SLOTS.iter().enumerate() {
            let slot = &mut fixed[at..at + SLOT_BYTES];
            let was_valid = slot_valid(slot);
            valid[index] = correct_slot(slot);
            if valid[index] && !was_valid {
                repaired
                    .repaired
                    .push(format!("a damaged byte of commit slot {index}"));
            }
            transaction[index] = u64_at(slot, SLOT_TRANSACTION);
        }
        let current_primary = usize::from(header[HEADER_GOD_BYTE] & GOD_PRIMARY_SLOT_1 != 0);
        let primary = match valid {
            [false, false] => {
                return Err(Error::corrupt(
                    what(),
                    "both of redb's commit slots are damaged beyond a one-byte correction",
                ))
            }
            [true, false] => 0,
            [false, true] => 1,
            [true, true] => usize::from(transaction[1] > transaction[0]),
        };
        // A damaged slot's transaction id means nothing: the god byte says which slot held
        // the newest commit when only one slot is left.
        if !valid[current_primary] {
            repaired.rolled_back = true;
            repaired.repaired.push(format!(
                "the newest commit slot is damaged beyond repair: back to transaction {}",
                transaction[primary]
            ));
        }
        let current_primary = usize::from(header[HEADER_GOD_BYTE] & GOD_PRIMARY_SLOT_1 != 0);
        let primary_bit = if primary == 1 { GOD_PRIMARY_SLOT_1 } else { 0 };
        let god = primary_bit | GOD_RECOVERY_REQUIRED | GOD_TWO_PHASE_COMMIT;
        let known_flags = GOD_RECOVERY_REQUIRED | GOD_TWO_PHASE_COMMIT | GOD_PRIMARY_SLOT_1;
        if current_primary != primary || header[HEADER_GOD_BYTE] & !known_flags != 0 {
            repaired
                .repaired
                .push("the flags naming the primary commit slot".to_string());
        }
        if repaired.repaired.is_empty() {
            // The region counts, which no checksum covers: recovery recomputes them.
            repaired
                .repaired
                .push("the region counts (recomputed from the file's length)".to_string());
        }
        fixed[HEADER_GOD_BYTE] = god;
        let kept = format!("{name}.damaged");
        let mut whole = vec![0u8; length as usize];
        file.read_at(0, &mut whole)?;
        crate::storage::write_atomically(storage.as_ref(), &kept, &whole)?;
        repaired.kept_as = Some(kept);
        file.write_at(0, &fixed)?;
        file.sync_data()?;
        if let Err(error) = Catalog::open_verified_copy(storage, name) {
            file.write_at(0, &header)?;
            file.sync_data()?;
            return Err(Error::corrupt(
                what(),
                format!(
                    "the damage is not (only) in redb's header, which was left as it was: \
                     {error}"
                ),
            ));
        }
        Ok(repaired)
    }
}

/// The super-header of a new catalog of this build, with one commit, to take redb's
/// constants from. Checks that its slots verify the way [`slot_valid`] computes, so that a
/// redb whose header differs from the one described above refuses a repair instead of
/// writing a wrong header.
fn template_header() -> Result<[u8; HEADER_BYTES]> {
    let backend = Arc::new(MemoryBackend {
        bytes: parking_lot::RwLock::new(Vec::new()),
    });
    let database = redb::Builder::new()
        .set_cache_size(CACHE_BYTES)
        .create_with_backend(SharedMemory(Arc::clone(&backend)))
        .map_err(catalog_error)?;
    let transaction = database.begin_write().map_err(catalog_error)?;
    transaction
        .open_table(META)
        .map_err(catalog_error)?
        .insert("schema_version", SCHEMA_VERSION)
        .map_err(catalog_error)?;
    transaction.commit().map_err(catalog_error)?;
    drop(database);
    let bytes = backend.bytes.read()[..HEADER_BYTES].to_vec();
    let header: [u8; HEADER_BYTES] = bytes.try_into().expect("a header's bytes");
    let layout_known = &header[..HEADER_MAGIC_BYTES] == b"redb\x1a\x0a\xa9\x0d\x0a"
        && HEADER_SLOTS
            .iter()
            .any(|&at| slot_valid(&header[at..at + SLOT_BYTES]));
    if !layout_known {
        return Err(Error::catalog_refused(
            "this build's redb writes a header the catalog repair does not know; \
             the header was left as it is",
        ));
    }
    Ok(header)
}

/// A memory backend shared with the caller, who reads the bytes after the database closed.
#[derive(Debug)]
struct SharedMemory(Arc<MemoryBackend>);

impl redb::StorageBackend for SharedMemory {
    fn len(&self) -> std::result::Result<u64, std::io::Error> {
        self.0.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> std::result::Result<(), std::io::Error> {
        self.0.read(offset, out)
    }
    fn set_len(&self, length: u64) -> std::result::Result<(), std::io::Error> {
        self.0.set_len(length)
    }
    fn sync_data(&self) -> std::result::Result<(), std::io::Error> {
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::result::Result<(), std::io::Error> {
        self.0.write(offset, data)
    }
}

/// The text of a caught panic, for an error message.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        text.to_string()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic without a message".to_string()
    }
}

/// redb's storage backend over bytes in memory, for a verified copy.
#[derive(Debug)]
struct MemoryBackend {
    bytes: parking_lot::RwLock<Vec<u8>>,
}

fn out_of_range() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        "read past the end of the catalog copy",
    )
}

impl redb::StorageBackend for MemoryBackend {
    fn len(&self) -> std::result::Result<u64, std::io::Error> {
        Ok(self.bytes.read().len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> std::result::Result<(), std::io::Error> {
        let bytes = self.bytes.read();
        let start = usize::try_from(offset).map_err(|_| out_of_range())?;
        let end = start.checked_add(out.len()).ok_or_else(out_of_range)?;
        out.copy_from_slice(bytes.get(start..end).ok_or_else(out_of_range)?);
        Ok(())
    }

    fn set_len(&self, length: u64) -> std::result::Result<(), std::io::Error> {
        let length = usize::try_from(length).map_err(std::io::Error::other)?;
        self.bytes.write().resize(length, 0);
        Ok(())
    }

    fn sync_data(&self) -> std::result::Result<(), std::io::Error> {
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> std::result::Result<(), std::io::Error> {
        let mut bytes = self.bytes.write();
        let start = usize::try_from(offset).map_err(std::io::Error::other)?;
        let end = start + data.len();
        if bytes.len() < end {
            bytes.resize(end, 0);
        }
        bytes[start..end].copy_from_slice(data);
        Ok(())
    }
}

/// redb's storage backend over one of our storage files.
#[derive(Debug)]
struct CatalogBackend {
    file: Arc<dyn StorageFile>,
    /// Bytes read, for [`Catalog::compact_if_wasteful`].
    read_bytes: Arc<AtomicU64>,
}

fn to_io(error: Error) -> std::io::Error {
    match error {
        Error::Io { source, .. } => source,
        other => std::io::Error::other(other.to_string()),
    }
}

impl redb::StorageBackend for CatalogBackend {
    fn len(&self) -> std::result::Result<u64, std::io::Error> {
        self.file.len().map_err(to_io)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> std::result::Result<(), std::io::Error> {
        self.file.read_at(offset, out).map_err(to_io)?;
        self.read_bytes
            .fetch_add(out.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn set_len(&self, length: u64) -> std::result::Result<(), std::io::Error> {
        self.file.set_len(length).map_err(to_io)
    }

    fn sync_data(&self) -> std::result::Result<(), std::io::Error> {
        self.file.sync_data().map_err(to_io)
    }

    fn write(&self, offset: u64, data: &[u8]) -> std::result::Result<(), std::io::Error> {
        self.file.write_at(offset, data).map_err(to_io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{CrashMode, SimulatedStorage};
    use std::collections::BTreeMap;

    const THINGS: NamedTable = NamedTable("things");
    const NUMBERS: IdTable = IdTable("numbers");

    /// Goal: values round-trip, and snapshots are isolated from later writes.
    #[test]
    fn put_get_list_remove() {
        let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
        let catalog = Catalog::open(&storage, "catalog.redb").unwrap();
        let mut write = catalog.write().unwrap();
        write.put_json(THINGS, "b", &vec![1, 2]).unwrap();
        write.put(THINGS, "a", b"raw").unwrap();
        write.put_id(NUMBERS, 7, b"seven").unwrap();
        write.put_id(NUMBERS, 3, b"three").unwrap();
        write.commit().unwrap();
        let snapshot = catalog.read().unwrap();
        let mut write = catalog.write().unwrap();
        assert!(write.remove(THINGS, "a").unwrap());
        write.commit().unwrap();
        assert_eq!(snapshot.get(THINGS, "a").unwrap().unwrap(), b"raw");
        let now = catalog.read().unwrap();
        assert_eq!(now.get(THINGS, "a").unwrap(), None);
        assert_eq!(
            now.get_json::<Vec<i32>>(THINGS, "b").unwrap(),
            Some(vec![1, 2])
        );
        assert_eq!(
            now.range_id(NUMBERS, 0, 10).unwrap(),
            vec![(3, b"three".to_vec()), (7, b"seven".to_vec())]
        );
        assert!(now.list(NamedTable("never")).unwrap().is_empty());
    }

    /// Goal: after growth, a catalog that doubled is measured (and compacted, a doubled file
    /// being half unused) by a command that has read most of it, not by one that read
    /// little. Method: 1,000 records of 8,000 bytes measured; reopened (nothing read since), more
    /// records committed until the file doubles: nothing; counted as read whole: compacted;
    /// reopened, every record reads back and the reads are counted.
    #[test]
    fn growth_is_measured_by_commands_that_read_most_of_the_catalog() {
        // The size of the backup store's record parts.
        const RECORD: usize = 8000;
        let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
        let length = |catalog: &Catalog| catalog.file.as_ref().unwrap().len().unwrap();
        let mut catalog = Catalog::open(&storage, "catalog.redb").unwrap();
        let mut write = catalog.write().unwrap();
        for id in 0..1000u64 {
            write.put_id(NUMBERS, id, &[id as u8; RECORD]).unwrap();
        }
        write.commit().unwrap();
        catalog
            .compact_if_wasteful(CompactTrigger::AfterGrowth)
            .unwrap();
        let measured = length(&catalog);
        drop(catalog);
        let mut catalog = Catalog::open(&storage, "catalog.redb").unwrap();
        let mut next = 1000u64;
        while length(&catalog) < measured * 3 / 2 {
            let mut write = catalog.write().unwrap();
            for id in next..next + 5 {
                write.put_id(NUMBERS, id, &[id as u8; RECORD]).unwrap();
            }
            write.commit().unwrap();
            next += 5;
            assert!(next < 20_000, "the file doubles");
        }
        let doubled = length(&catalog);
        assert!(
            doubled < measured * 3,
            "{measured} -> {doubled}: doubled once"
        );
        assert_eq!(
            catalog
                .compact_if_wasteful(CompactTrigger::AfterGrowth)
                .unwrap(),
            None
        );
        assert_eq!(length(&catalog), doubled);
        // As a command that read the whole file (what this one wrote is in redb's cache, and
        // closing it may shorten the file).
        catalog.read_bytes.store(doubled, Ordering::Relaxed);
        let (before, after) = catalog
            .compact_if_wasteful(CompactTrigger::AfterGrowth)
            .unwrap()
            .expect("compacted");
        assert_eq!(before, doubled);
        assert!(after < before * 3 / 4, "{before} -> {after}");
        drop(catalog);
        let catalog = Catalog::open(&storage, "catalog.redb").unwrap();
        let left = catalog
            .read()
            .unwrap()
            .range_id(NUMBERS, 0, u64::MAX)
            .unwrap();
        assert_eq!(left.len() as u64, next);
        // What redb reads is counted.
        assert!(catalog.read_bytes.load(Ordering::Relaxed) * 2 >= length(&catalog));
        assert!(left
            .iter()
            .all(|(id, value)| *value == vec![*id as u8; RECORD]));
    }

    /// Goal: a catalog whose records were mostly removed is compacted (its file shrinks and
    /// every remaining record reads back) and one without waste is left alone. Method: write
    /// 4,000 records of 2 KiB, remove nine in ten, compact after removals, then again; on
    /// sealed storage too.
    #[test]
    fn wasteful_catalogs_are_compacted() {
        let plain: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
        let sealed: Arc<dyn Storage> = Arc::new(crate::storage::SealedStorage::new(
            Arc::new(SimulatedStorage::new()),
            crate::storage::SealingKey::from_bytes(&[3; 32]),
            |_| crate::storage::Layout::Paired,
        ));
        for storage in [plain, sealed] {
            let mut catalog = Catalog::open(&storage, "catalog.redb").unwrap();
            assert_eq!(
                catalog
                    .compact_if_wasteful(CompactTrigger::AfterRemovals)
                    .unwrap(),
                None
            );
            let mut write = catalog.write().unwrap();
            for id in 0..4000u64 {
                write.put_id(NUMBERS, id, &[id as u8; 2048]).unwrap();
            }
            write.commit().unwrap();
            let mut write = catalog.write().unwrap();
            for id in (0..4000u64).filter(|id| id % 10 != 0) {
                write.remove_id(NUMBERS, id).unwrap();
            }
            write.commit().unwrap();
            let (before, after) = catalog
                .compact_if_wasteful(CompactTrigger::AfterRemovals)
                .unwrap()
                .expect("compacted");
            assert!(after < before / 2, "{before} -> {after}");
            assert_eq!(
                catalog
                    .compact_if_wasteful(CompactTrigger::AfterRemovals)
                    .unwrap(),
                None
            );
            drop(catalog);
            let catalog = Catalog::open(&storage, "catalog.redb").unwrap();
            let left = catalog.read().unwrap().range_id(NUMBERS, 0, 4000).unwrap();
            assert_eq!(left.len(), 400);
            assert!(left
                .iter()
                .all(|(id, value)| *value == vec![*id as u8; 2048]));
        }
    }

    /// Goal: after a crash at every sync point (torn writes included) the catalog reopens and
    /// holds exactly the state of a committed transaction, at least the last one that returned.
    #[test]
    fn crash_recovers_committed_state() {
        for sealed in [false, true] {
            crash_recovers_committed_state_on(sealed);
        }
    }

    /// The storage a test catalog lives in: `simulated` itself, or sealed over it in the paged
    /// layout the backup store's catalog uses.
    fn catalog_storage(simulated: &SimulatedStorage, sealed: bool) -> Arc<dyn Storage> {
        let inner: Arc<dyn Storage> = Arc::new(simulated.clone());
        if sealed {
            Arc::new(crate::storage::SealedStorage::new(
                inner,
                crate::storage::SealingKey::from_bytes(&[5; 32]),
                |_| crate::storage::Layout::Paged,
            ))
        } else {
            inner
        }
    }

    /// Goal of [`crash_recovers_committed_state`], on plain or sealed storage. On sealed
    /// storage every block torn by the crash must be one no commit uses: a verified copy (torn
    /// blocks as zeros) opens, and a writable open reads every record.
    fn crash_recovers_committed_state_on(sealed: bool) {
        let commits = 8u64;
        let total_syncs = {
            let storage = SimulatedStorage::new();
            run_commits(&catalog_storage(&storage, sealed), commits, &mut 0);
            storage.sync_count()
        };
        for crash_at in 1..=total_syncs {
            let storage = SimulatedStorage::new();
            storage.crash_after_syncs(crash_at);
            let mut completed = 0;
            run_commits(&catalog_storage(&storage, sealed), commits, &mut completed);
            let after = catalog_storage(&storage.crash(CrashMode::Torn { seed: crash_at }), sealed);
            if sealed && completed > 0 {
                Catalog::open_verified_copy(&after, "catalog.redb").unwrap_or_else(|error| {
                    panic!("crash at sync {crash_at}: a committed page was torn: {error}")
                });
            }
            // Half the rounds open read-only: after a crash that falls back to a writable
            // open, which repairs the catalog.
            let opened = if crash_at % 2 == 0 {
                Catalog::open_read_only(&after, "catalog.redb")
            } else {
                Catalog::open(&after, "catalog.redb")
            };
            let Ok(catalog) = opened else {
                // Only acceptable if not even the creation finished.
                assert_eq!(completed, 0, "sealed {sealed}, crash at sync {crash_at}");
                continue;
            };
            let read = catalog.read().unwrap();
            let round = read
                .get_id(NUMBERS, 0)
                .unwrap()
                .map_or(0, |bytes| u64::from_le_bytes(bytes.try_into().unwrap()));
            assert!(
                round >= completed && round <= completed + 1,
                "crash at {crash_at}"
            );
            let expected = model(round);
            let actual: BTreeMap<u64, Vec<u8>> = read
                .range_id(NUMBERS, 1, u64::MAX)
                .unwrap()
                .into_iter()
                .collect();
            assert_eq!(
                actual, expected,
                "sealed {sealed}, crash at sync {crash_at}"
            );
            drop(read);
            drop(catalog);
            // A writable open after the read-only one (which may have repaired nothing), then
            // more commits: torn blocks are free pages that later writes replace.
            let catalog = Catalog::open(&after, "catalog.redb").unwrap();
            let mut write = catalog.write().unwrap();
            for id in 100..140u64 {
                write.put_id(NUMBERS, id, &[id as u8; 700]).unwrap();
            }
            write.commit().unwrap();
            assert_eq!(
                catalog
                    .read()
                    .unwrap()
                    .range_id(NUMBERS, 100, 140)
                    .unwrap()
                    .len(),
                40
            );
        }
    }

    /// Goal: a read-only open of a cleanly closed catalog reads everything and writes nothing,
    /// not even when it closes, and refuses changes. Method: count syncs of the simulator.
    #[test]
    fn read_only_open_writes_nothing() {
        let simulated = SimulatedStorage::new();
        let storage: Arc<dyn Storage> = Arc::new(simulated.clone());
        {
            let catalog = Catalog::open(&storage, "catalog.redb").unwrap();
            let mut write = catalog.write().unwrap();
            write.put_id(NUMBERS, 1, b"one").unwrap();
            write.commit().unwrap();
        }
        let syncs_before = simulated.sync_count();
        {
            let catalog = Catalog::open_read_only(&storage, "catalog.redb").unwrap();
            assert!(catalog.is_read_only());
            assert_eq!(
                catalog.read().unwrap().get_id(NUMBERS, 1).unwrap(),
                Some(b"one".to_vec())
            );
            assert!(
                catalog.write().is_err(),
                "a read-only catalog refuses writes"
            );
        }
        assert_eq!(simulated.sync_count(), syncs_before, "nothing was synced");
        let missing = Catalog::open_read_only(&storage, "absent.redb");
        assert!(matches!(missing, Err(Error::NotFound(_))));
    }

    /// Goal: a catalog error keeps redb's error as its source, for programs that walk the
    /// chain, and says what was being done. Method: open a file of garbage as a catalog; a
    /// write to a read-only catalog is refused without a source.
    #[test]
    fn catalog_errors_keep_the_redb_source() {
        let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
        let file = storage.open("garbage.redb", true).unwrap();
        file.write_at(0, &[0x5a; 8192]).unwrap();
        drop(file);
        let error = Catalog::open_read_only(&storage, "garbage.redb").unwrap_err();
        assert!(matches!(error, Error::Catalog { .. }), "{error:?}");
        let source = std::error::Error::source(&error).expect("redb's error is the source");
        // The source is boxed (the error stays small); the box shows redb's error.
        let redb_error = source.downcast_ref::<Box<redb::Error>>();
        assert!(redb_error.is_some(), "{source:?}");
        assert!(error.to_string().contains("garbage.redb"), "{error}");

        let catalog = Catalog::open(&storage, "catalog.redb").unwrap();
        drop(catalog);
        let catalog = Catalog::open_read_only(&storage, "catalog.redb").unwrap();
        let Err(refused) = catalog.write() else {
            panic!("a read-only catalog refuses writes");
        };
        assert!(matches!(refused, Error::Catalog { source: None, .. }));
        assert!(refused.to_string().contains("read-only"), "{refused}");
    }

    /// Goal: a verified copy reads what the file holds and writes nothing to it; a damaged
    /// page, which a plain open reads back as a wrong value (or panics on), makes the verified
    /// copy fail as corruption naming the file. Method: flip one byte of each page of a
    /// catalog in turn and compare a plain read-only open with the verified copy.
    #[test]
    fn verified_copy_detects_damaged_pages() {
        let simulated = SimulatedStorage::new();
        let storage: Arc<dyn Storage> = Arc::new(simulated.clone());
        {
            let catalog = Catalog::open(&storage, "catalog.redb").unwrap();
            for round in 1..=3u64 {
                let mut write = catalog.write().unwrap();
                for id in 0..200u64 {
                    write
                        .put_id(
                            NUMBERS,
                            id,
                            format!("value {id} of round {round}").as_bytes(),
                        )
                        .unwrap();
                }
                write.commit().unwrap();
            }
        }
        let expected: Vec<(u64, Vec<u8>)> = (0..200u64)
            .map(|id| (id, format!("value {id} of round 3").into_bytes()))
            .collect();
        let syncs_before = simulated.sync_count();
        let copy = Catalog::open_verified_copy(&storage, "catalog.redb").unwrap();
        assert!(copy.is_read_only() && copy.is_verified_copy());
        assert_eq!(
            copy.read().unwrap().range_id(NUMBERS, 0, u64::MAX).unwrap(),
            expected
        );
        assert!(copy.write().is_err(), "a verified copy refuses writes");
        drop(copy);
        assert_eq!(simulated.sync_count(), syncs_before, "nothing was synced");

        let file = storage.open("catalog.redb", false).unwrap();
        let length = file.len().unwrap();
        let mut original = vec![0u8; length as usize];
        file.read_at(0, &mut original).unwrap();
        let (mut wrong_plain, mut detected) = (0, 0);
        // One byte in the middle of each used page; the super-header page is tested apart.
        for page in 1..length / 4096 {
            let offset = page * 4096 + 1000;
            let mut damaged = original.clone();
            damaged[offset as usize] ^= 0x10;
            file.write_at(0, &damaged).unwrap();
            match Catalog::open_verified_copy(&storage, "catalog.redb") {
                Ok(copy) => assert_eq!(
                    copy.read().unwrap().range_id(NUMBERS, 0, u64::MAX).unwrap(),
                    expected,
                    "page {page}: a verified copy reads only what was written"
                ),
                Err(error) => {
                    assert!(error.is_corrupt(), "page {page}: {error}");
                    assert!(error.to_string().contains("catalog.redb"), "{error}");
                    detected += 1;
                }
            }
            let plain = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                Catalog::open_read_only(&storage, "catalog.redb")
                    .and_then(|catalog| catalog.read()?.range_id(NUMBERS, 0, u64::MAX))
            }));
            if matches!(&plain, Ok(Ok(entries)) if *entries != expected) {
                wrong_plain += 1;
            }
        }
        file.write_at(0, &original).unwrap();
        assert!(detected > 0, "some pages are in use");
        assert!(
            wrong_plain > 0,
            "a plain open trusts damaged pages (the reason for verified copies)"
        );
        file.set_len(0).unwrap();
        assert!(Catalog::open_verified_copy(&storage, "catalog.redb")
            .unwrap_err()
            .is_corrupt());
    }

    /// Goal: any single damaged byte of redb's super-header (which no page checksum covers
    /// and which makes every open fail) is put right by `repair_header`, and the catalog then
    /// reads its newest commit; when the newest commit slot is beyond repair the catalog goes
    /// back to the commit before and says so. Method: flip each of the first 320 bytes in
    /// turn (two patterns), repair, open, compare with the committed values.
    #[test]
    fn header_repair_restores_the_newest_commit() {
        let simulated = SimulatedStorage::new();
        let storage: Arc<dyn Storage> = Arc::new(simulated.clone());
        {
            let catalog = Catalog::open(&storage, "catalog.redb").unwrap();
            for round in 1..=3u64 {
                let mut write = catalog.write().unwrap();
                write.put_id(NUMBERS, 0, &round.to_le_bytes()).unwrap();
                write.commit().unwrap();
            }
        }
        let file = storage.open("catalog.redb", false).unwrap();
        let mut original = vec![0u8; file.len().unwrap() as usize];
        file.read_at(0, &mut original).unwrap();
        let round_of = |catalog: &Catalog| {
            let bytes = catalog.read().unwrap().get_id(NUMBERS, 0).unwrap().unwrap();
            u64::from_le_bytes(bytes.try_into().unwrap())
        };
        let mut broken = 0;
        for offset in 0..HEADER_BYTES {
            for mask in [0x01u8, 0xff] {
                file.write_at(0, &original).unwrap();
                file.set_len(original.len() as u64).unwrap();
                let mut damaged = original[..HEADER_BYTES].to_vec();
                damaged[offset] ^= mask;
                file.write_at(0, &damaged).unwrap();
                let problems = Catalog::inspect_header(&storage, "catalog.redb").unwrap();
                // Only the region counts, which nothing can check, go unnoticed.
                assert!(
                    !problems.is_empty() || (24..32).contains(&offset),
                    "byte {offset} ^ {mask:#x}"
                );
                let opened = Catalog::open_verified_copy(&storage, "catalog.redb");
                if opened.is_err() {
                    broken += 1;
                }
                let repair = Catalog::repair_header(&storage, "catalog.redb")
                    .unwrap_or_else(|error| panic!("byte {offset} ^ {mask:#x}: {error}"));
                assert!(
                    !repair.rolled_back,
                    "byte {offset}: one byte is always correctable"
                );
                let catalog = Catalog::open(&storage, "catalog.redb")
                    .unwrap_or_else(|error| panic!("byte {offset} ^ {mask:#x}: {error}"));
                assert_eq!(round_of(&catalog), 3, "byte {offset} ^ {mask:#x}");
                drop(catalog);
                assert!(Catalog::open_verified_copy(&storage, "catalog.redb").is_ok());
                let problems = Catalog::inspect_header(&storage, "catalog.redb").unwrap();
                assert!(problems.is_empty(), "{offset}: {problems:?}");
            }
        }
        assert!(broken > 100, "most header bytes matter: {broken}");

        // Two bytes of the primary slot: no one-byte correction. The commit before is used
        // only if its pages still verify; otherwise the repair fails and leaves the header
        // as it was (never a header that opens something unverified).
        file.write_at(0, &original).unwrap();
        let primary = if original[HEADER_GOD_BYTE] & GOD_PRIMARY_SLOT_1 != 0 {
            HEADER_SLOTS[1]
        } else {
            HEADER_SLOTS[0]
        };
        let mut damaged = original[..HEADER_BYTES].to_vec();
        damaged[primary + 20] ^= 0x55;
        damaged[primary + 60] ^= 0x55;
        file.write_at(0, &damaged).unwrap();
        match Catalog::repair_header(&storage, "catalog.redb") {
            Ok(repair) => {
                assert!(repair.rolled_back, "{repair:?}");
                let catalog = Catalog::open(&storage, "catalog.redb").unwrap();
                assert_eq!(round_of(&catalog), 2);
            }
            Err(error) => {
                assert!(error.is_corrupt(), "{error}");
                let mut now = vec![0u8; HEADER_BYTES];
                file.read_at(0, &mut now).unwrap();
                assert_eq!(now, damaged, "a failed repair leaves the header as it was");
            }
        }
    }

    fn model(round: u64) -> BTreeMap<u64, Vec<u8>> {
        let mut model = BTreeMap::new();
        for r in 1..=round {
            model.insert(r, vec![r as u8; 100 * r as usize]);
            model.remove(&(r / 2));
        }
        model
    }

    fn run_commits(shared: &Arc<dyn Storage>, commits: u64, completed: &mut u64) {
        let Ok(catalog) = Catalog::open(shared, "catalog.redb") else {
            return;
        };
        for r in 1..=commits {
            let step = || -> Result<()> {
                let mut write = catalog.write()?;
                write.put_id(NUMBERS, r, &vec![r as u8; 100 * r as usize])?;
                write.remove_id(NUMBERS, r / 2)?;
                write.put_id(NUMBERS, 0, &r.to_le_bytes())?;
                write.commit()
            };
            if step().is_err() {
                return;
            }
            *completed = r;
        }
    }
}
