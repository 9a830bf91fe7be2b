//! The onecopy backup store: RevDedup (paper 2) on the engine core.
//!
//! # Terms
//!
//! - A **series** is the sequence of backups of one source, numbered by *version* 1, 2, ...
//!   Its newest backups (the **live window**, one by default) are *live*; older ones are
//!   *archival*; the **retention window** says how many are kept ([`config`], [`series`]).
//! - A backup's stream is cut in one pass into **chunks** (4 KiB average) and **segments**
//!   (4 MiB average, whole chunks). Segments are deduplicated **inline** against every
//!   segment stored in the store, through a persisted **segment index** ([`inline`]).
//! - A **recipe** rebuilds a backup's stream: segment references while live; direct, indirect
//!   and zero chunk references once archival ([`recipe`]).
//! - **Reverse deduplication** runs when a backup leaves the live window: its chunks found in
//!   the following backup of the series become indirect references to it, and chunks that
//!   nothing references directly any more are removed ([`reverse`]). **Two-level reference
//!   counts** say what may go: a segment's count of live recipes, and each chunk's count of
//!   direct references from archival recipes ([`segment`]).
//! - Removing chunks **repackages** the segments into **archival containers** stamped with
//!   the backup's time, apart from the **shared containers** (time stamp 0) of segments still
//!   in use ([`settle`]). Deleting a backup drops its stamped containers without reading them
//!   ([`delete`]); mark and sweep is the baseline.
//! - Null chunks are never stored and are regenerated on restore ([`restore`]).
//! - A segment's stored chunks are compressed together in **frames** of up to 256 KiB, one
//!   container record each ([`segment`], `frames`).
//! - The **files cache**: a directory backup does not read the files unchanged since the
//!   series' previous backup (same path, size, mtime, ctime, inode and device); chunk and
//!   segment boundaries follow file boundaries, so it places that backup's segments holding
//!   them in its stream, as references ([`files_cache`]).
//! - **Retention** deletes the backups no rule keeps: the newest N, and the newest backup of
//!   each of the N newest hours, days, weeks, months or years, as restic's `forget` does
//!   ([`retention`]).
//!
//! # Write ordering
//!
//! Every change follows *data, then index, then recipe*; every removal the reverse:
//!
//! | operation | 1 | 2 | 3 | 4 |
//! |---|---|---|---|---|
//! | create  | containers sealed and synced | index checkpoint (serial + 1) | catalog commit: segments, counts, recipe, backup | — |
//! | reverse | new containers synced | catalog commit: archival recipe, counts, locations | old containers removed | index removals, checkpoint |
//! | delete  | new containers synced (rare) | catalog commit: recipe and counts gone | dead containers removed | index removals, checkpoint |
//! | compact, repair | rewritten containers synced | catalog commit | old containers removed | index rebuilt (repair) |
//!
//! The catalog commit (one redb transaction) is the commit point of each; operations that
//! free space release the space reserve just before it ([`store`]). A crash before it leaves
//! unreferenced containers and index entries the catalog does not confirm; a crash after it
//! leaves containers no record names and stale index entries. Neither is visible to restores
//! (they follow the catalog only); inline lookups confirm index hits against the catalog (so
//! containers may go before the index entries naming their segments); and
//! [`BackupStore::recover`], run by every mutating operation and again right after one
//! fails, removes the files and reconciles the index (whose checkpoint records the catalog
//! serial it matches). So after a crash at any point `check` passes and every completed
//! backup restores byte-exact; the crash tests (`tests/crash.rs`) replay crashes at every
//! sync with torn writes, through recovery, compaction and repair too.
//!
//! # Damage
//!
//! [`BackupStore::check`] reports what is wrong as the [`FaceReport`] every face returns
//! ([`check`]); with a repair it rebuilds derived data, removes leftovers, rewrites damaged
//! containers and records what is lost ([`repair`], [`losses`]). Restores never return
//! damaged bytes: chunks are CRC-checked as they are read, and chunks recorded as lost fail
//! naming the lost files.
//!
//! # Concurrency
//!
//! A store is used by one process at a time: the command line takes the backup face's
//! exclusive lock ([`onecopy_core::repository::Repository::lock_face`]) for *every* command,
//! read-only ones included, because the catalog's database is not safe to open from two
//! processes while one writes. Within a process, `&mut self` methods change the store and
//! `&self` ones only read.
//!
//! # Example
//!
//! ```no_run
//! use std::sync::Arc;
//! use onecopy_backup::{BackupSource, BackupStore, CreateOptions, OpenOptions, RestoreTarget};
//! use onecopy_core::storage::LocalStorage;
//!
//! # fn main() -> onecopy_backup::Result<()> {
//! let storage = Arc::new(LocalStorage::create("/tmp/repository/backup")?);
//! let mut store = BackupStore::open(storage, OpenOptions::default())?;
//! let created = store.create_backup(
//!     "home",
//!     BackupSource::Directory("/home/me".into()),
//!     CreateOptions::default(),
//! )?;
//! println!("version {} in {:.1} s", created.version, created.seconds);
//! store.restore("home", Some(created.version), RestoreTarget::Directory("/tmp/out".into()))?;
//! store.expire("home", Some(7), None)?;
//! assert!(store.check(Default::default())?.is_clean());
//! # Ok(())
//! # }
//! ```

mod changes;
pub mod check;
mod codec;
pub mod compact;
pub mod config;
pub mod create;
pub mod delete;
pub mod error;
pub mod files_cache;
mod frames;
pub mod inline;
mod inspection;
pub mod losses;
pub mod mount;
pub mod recipe;
mod recompress;
pub mod repair;
pub mod resolve;
pub mod restore;
pub mod retention;
pub mod reverse;
pub mod segment;
mod segment_index;
pub mod series;
pub mod settle;
pub mod stats;
pub mod store;
pub mod tree;

pub use compact::{CompactPlan, CompactReport};
pub use config::{DedupMode, DeleteMethod, RuntimeOptions, SeriesOptions, StoreOptions};
pub use create::{BackupSource, CreateOptions, CreateReport, WalkedPaths};
pub use delete::{DeletePlan, DeleteReport, ExpirePlan, SweepReport};
pub use error::{BackupError, Result};
pub use inline::InlineReport;
pub use onecopy_core::check::{CheckOptions, ExitStatus, FaceReport, Finding, FindingKind};
pub use restore::{RestoreOptions, RestoreReport, RestoreTarget};
pub use retention::{KeptBackup, RetentionPolicy};
pub use reverse::{ReversePlan, ReverseReport};
pub use series::{BackupRecord, BackupState, SeriesRecord, SourceKind};
pub use settle::{CopyReport, Settlement};
pub use stats::StoreStats;
pub use store::{is_full, BackupStore, OpenOptions, RecoveryReport};
