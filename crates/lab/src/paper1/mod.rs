//! Paper 1 §5 in the lab: file-system hints for inline block-layer deduplication.
//!
//! The experiment is a matrix: every [`Workload`] x injected on-disk index latency x index
//! cache policy x [`Setup`] (hints off, hints on, and for the file server hints on with
//! deferred deduplication), each cell repeated [`Paper1Options::repetitions`] times (the
//! paper: three runs per point, §5.3). One *run* (one cell, one repetition) goes:
//!
//! 1. build a fresh [`Testbed`]: a new repository in a temporary directory, an engine with the
//!    run's index options (cache policy, a small cache budget), one volume with the setup's
//!    hints, served over NBD in-process, attached through nbdfuse and
//!    a loop device, `mkfs.ext4`, mounted (`data=journal` for [`Workload::DataJournal`]);
//! 2. warm the index cache as paper 1 §5.3 does: copy a tree of real files (scaled down from a
//!    kernel tree plus a CentOS root to part of `/usr/share`) and sync;
//! 3. prepare what the workload starts from, unmeasured: for the copy, paper 1 §5.4.4 step 2
//!    (unique data worth twice the index cache's capacity, sync, remount to drop the page
//!    cache); for the directory tree and the file server, their file sets (filebench's
//!    preallocation), synced;
//! 4. inject the run's on-disk index latency (steps 1 to 3 run without it: they are not
//!    measured, and waiting in them would only lengthen the matrix); run the workload, sync, and
//!    measure the wall-clock time of both together, and the
//!    processor time of the process, of the workload's own threads and of nbdfuse
//!    ([`CpuSeconds`]);
//! 5. read the engine counters (differences over step 4) and the volume's dedup ratio
//!    (mapped / stored bytes after the run); with deferred deduplication, run the pass that
//!    deduplicates the deferred blocks ([`DeferredPass`]: paper 1's deduplication during
//!    NILFS2's garbage collection) and measure it; tear the testbed down.
//!
//! Hints on means [`HintSettings::default`] (file-system metadata and journal ranges are
//! stored without deduplication, copies prefetch), except for the copy workload: prefetch
//! only, because paper 1 §5.4.4 ran its copy with the metadata and journal hints off. Hints
//! off is [`HintSettings::none`].
//!
//! Before the matrix, [`uniqueness`] measures Table 5.1 (unique chunks of freshly made ext3
//! and ext4 before and after a million empty files).
//!
//! Results are written after every run (`results.json`, `results.csv`), and the figures at
//! the end ([`figures`]).

pub mod figures;
pub mod uniqueness;
pub mod workloads;

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Mutex;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use onecopy_block::{EngineStats, HintSettings, RuntimeOptions};
use onecopy_core::index::cache::CachePolicy;

use crate::cpu;
use crate::error::{LabError, Result};
use crate::mount::{FileSystemOptions, Testbed, TestbedOptions};
use crate::results::{number_cell, write_json, CsvTable, HostSnapshot};
use uniqueness::UniquenessRecord;
use workloads::{
    append_to_files, append_with_fsync, copy_tree, create_and_delete, create_empty_files,
    create_files, write_unique_file, BlockSource, FileServer, FileSet, Random,
};

/// The Bloom filter's false-positive rate in paper 1 (§4.2.2).
pub const PAPER_FILTER_FALSE_POSITIVE_RATE: f64 = 0.01;

/// Paper 1's on-disk index latencies (§5.3): 10 µs (fast flash) to 10 ms (slow disk).
pub const PAPER_LATENCIES_NS: [u64; 5] = [10_000, 100_000, 500_000, 1_000_000, 10_000_000];

/// How long a deferred block waits before the background pass may deduplicate it: NILFS2's
/// default protection period (paper 1 §5.3: its garbage collector runs once an hour), so
/// nothing is deduplicated during a run, as in the paper; the lab runs the pass itself after
/// the workload ([`DeferredPass`]).
pub const DEFERRED_SECONDS: u64 = 3600;

/// One workload of paper 1 §5.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// Many empty files created in one directory (§5.4.2, Fig. 5.1).
    Metadata,
    /// Empty files created and deleted at once in a directory tree (§5.4.2, Fig. 5.2).
    Tree,
    /// 4 KiB appends to one file with an fsync every 100, ordered journal (§5.4.2, Fig. 5.3).
    Journal,
    /// 4 KiB appends to many files with an fsync every 10, `data=journal` (§5.4.2, Fig. 5.4).
    DataJournal,
    /// Copy of a tree inside the same file system after the cache was flushed (§5.4.4,
    /// Table 5.2).
    Copy,
    /// Filebench's fileserver (§5.4.5, Figs. 5.7 and 5.8).
    FileServer,
}

impl Workload {
    /// Every workload, in the paper's order.
    pub const ALL: [Workload; 6] = [
        Workload::Metadata,
        Workload::Tree,
        Workload::Journal,
        Workload::DataJournal,
        Workload::Copy,
        Workload::FileServer,
    ];

    /// The name used on the command line and in results.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Metadata => "metadata",
            Workload::Tree => "tree",
            Workload::Journal => "journal",
            Workload::DataJournal => "data-journal",
            Workload::Copy => "copy",
            Workload::FileServer => "file-server",
        }
    }

    /// What one operation of the workload is.
    pub fn operation(self) -> &'static str {
        match self {
            Workload::Metadata => "files created",
            Workload::Tree => "files created or deleted",
            Workload::Journal | Workload::DataJournal => "4 KiB appends",
            Workload::Copy => "files copied",
            Workload::FileServer => "filebench operations",
        }
    }

    /// The figure or table of paper 1 the workload reproduces.
    pub fn paper_figure(self) -> &'static str {
        match self {
            Workload::Metadata => "Fig. 5.1",
            Workload::Tree => "Fig. 5.2",
            Workload::Journal => "Fig. 5.3",
            Workload::DataJournal => "Fig. 5.4",
            Workload::Copy => "Table 5.2",
            Workload::FileServer => "Figs. 5.7-5.8",
        }
    }

    /// The cache policies paper 1 plots for the workload: both for Fig. 5.1; LRU for the
    /// others, where it reports LRU and says ARC behaved alike (§5.4.2, §5.4.4, §5.4.5).
    pub fn paper_policies(self) -> &'static [CachePolicy] {
        match self {
            Workload::Metadata => &[CachePolicy::Lru, CachePolicy::Arc],
            _ => &[CachePolicy::Lru],
        }
    }

    /// The setups a run of the workload compares: hints off and on, and for the file
    /// server, deferred deduplication (paper 1 Fig. 5.8: NILFS2 mounted `dedupongc`).
    pub fn setups(self) -> &'static [Setup] {
        match self {
            Workload::FileServer => &[Setup::Off, Setup::On, Setup::Deferred],
            _ => &[Setup::Off, Setup::On],
        }
    }

    /// The hint settings of a run (see the module documentation).
    pub fn hint_settings(self, setup: Setup, copy_all_hints: bool) -> HintSettings {
        match (self, setup) {
            (_, Setup::Off) => HintSettings::none(),
            (Workload::Copy, Setup::On) if !copy_all_hints => HintSettings {
                prefetch: true,
                ..HintSettings::none()
            },
            (_, Setup::On) => HintSettings::default(),
            (_, Setup::Deferred) => HintSettings {
                deferred_seconds: Some(DEFERRED_SECONDS),
                ..HintSettings::default()
            },
        }
    }

    /// The file system the workload runs on.
    pub fn file_system(self) -> FileSystemOptions {
        match self {
            Workload::DataJournal => FileSystemOptions::ext4().with_mount_options("data=journal"),
            _ => FileSystemOptions::ext4(),
        }
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Workload {
    type Err = LabError;

    fn from_str(text: &str) -> Result<Workload> {
        Workload::ALL
            .into_iter()
            .find(|workload| workload.name().eq_ignore_ascii_case(text))
            .ok_or_else(|| {
                LabError::InvalidOption(format!(
                    "unknown workload {text:?}; choose {}",
                    Workload::ALL.map(Workload::name).join(", ")
                ))
            })
    }
}

/// What a run compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Setup {
    /// Every block deduplicated inline (paper 1: the context-unaware system).
    Off,
    /// The file system's hints honoured, data deduplicated inline.
    On,
    /// Hints honoured, data stored at once and deduplicated later ([`DeferredPass`]).
    Deferred,
}

impl Setup {
    /// The name in results and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Setup::Off => "off",
            Setup::On => "on",
            Setup::Deferred => "deferred",
        }
    }

    /// The label in figures and tables.
    pub fn label(self) -> &'static str {
        match self {
            Setup::Off => "without hints",
            Setup::On => "with hints",
            Setup::Deferred => "with hints, deferred dedup",
        }
    }

    /// The setup a run was made with.
    pub fn of(run: &RunRecord) -> Setup {
        match (run.hints, run.deferred) {
            (false, _) => Setup::Off,
            (true, false) => Setup::On,
            (true, true) => Setup::Deferred,
        }
    }
}

/// The sizes of an experiment, scaled down from the paper so that the index cache is small
/// relative to the data and the matrix fits in about an hour.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Scale {
    /// Size of the volume (and of the ext4 on it).
    pub volume_bytes: u64,
    /// Memory budget of the index entry cache (paper 1: 1 GB; here a few hundred KiB).
    pub index_cache_bytes: u64,
    /// Entries the Bloom filter is first sized for (paper 1 sized it to the workload's unique
    /// chunks); it grows by rebuilding when exceeded.
    pub filter_expected_entries: u64,
    /// Tree copied to warm the cache (paper 1: a kernel tree and a CentOS root).
    pub warm_source: PathBuf,
    /// Bytes copied from `warm_source`.
    pub warm_bytes: u64,
    /// Empty files of the metadata workload (paper 1: 1.5 M).
    pub metadata_files: u64,
    /// Threads creating them (paper 1: 16).
    pub metadata_threads: usize,
    /// Names in the directory tree's file set (paper 1: 1.5 M); half exist at the start.
    pub tree_files: u64,
    /// Mean depth of the tree (paper 1: 1.3).
    pub tree_depth: f64,
    /// Threads creating and as many deleting (paper 1: 8 and 8).
    pub tree_threads: usize,
    /// Files each kind of thread creates or deletes, in all.
    pub tree_operations: u64,
    /// Appends of the journal workload.
    pub journal_appends: u64,
    /// Appends between fsyncs (paper 1: 100).
    pub journal_fsync_every: u64,
    /// Files of the data-journal workload (paper 1: 200,000).
    pub data_journal_files: u64,
    /// Threads appending to them (paper 1: 16).
    pub data_journal_threads: usize,
    /// Appends of the data-journal workload, in all.
    pub data_journal_appends: u64,
    /// Appends to one file between its fsyncs (paper 1: 10).
    pub data_journal_fsync_every: u64,
    /// Files of the file server's set (paper 1: 10,000 of 128 KB on average).
    pub fileserver_files: u64,
    /// Mean file size in 4 KiB blocks (paper 1: 128 KB).
    pub fileserver_mean_blocks: u64,
    /// Threads (paper 1: 50).
    pub fileserver_threads: usize,
    /// Iterations of filebench's eleven operations per thread.
    pub fileserver_iterations: u64,
    /// Fraction of blocks that repeat an earlier one (paper 1: the "homes" distribution).
    pub duplicate_fraction: f64,
    /// The copy workload syncs after each this many bytes copied.
    pub copy_flush_bytes: u64,
    /// Copy runs with hints on use every hint source, not only prefetch (paper 1 §5.4.4 had
    /// the metadata and journal hints off; this shows what they add).
    pub copy_all_hints: bool,
}

/// Filebench fileserver's mean directory width.
const FILESERVER_DIRECTORY_WIDTH: u64 = 20;
/// Filebench fileserver's preallocated fraction of the file set.
const FILESERVER_PREALLOCATED: f64 = 0.8;
/// Filebench fileserver's mean append, 16 KiB: appends are 1 to 7 blocks.
const FILESERVER_APPEND_BLOCKS_MAX: u64 = 7;
/// Filebench fileserver's I/O size.
const FILESERVER_IO_BYTES: usize = 1 << 20;

impl Scale {
    /// The full experiment.
    pub fn full() -> Scale {
        Scale {
            volume_bytes: 2 << 30,
            index_cache_bytes: 256 << 10,
            filter_expected_entries: 1 << 16,
            warm_source: PathBuf::from("/usr/share"),
            warm_bytes: 48 << 20,
            metadata_files: 100_000,
            metadata_threads: 4,
            tree_files: 300_000,
            tree_depth: 1.3,
            tree_threads: 4,
            tree_operations: 75_000,
            journal_appends: 40_000,
            journal_fsync_every: 100,
            data_journal_files: 1_000,
            data_journal_threads: 4,
            data_journal_appends: 20_000,
            data_journal_fsync_every: 10,
            fileserver_files: 400,
            fileserver_mean_blocks: 32,
            fileserver_threads: 8,
            fileserver_iterations: 160,
            duplicate_fraction: 0.25,
            copy_flush_bytes: 4 << 20,
            copy_all_hints: false,
        }
    }

    /// A smoke-test scale that finishes in a few minutes.
    pub fn quick() -> Scale {
        Scale {
            volume_bytes: 1 << 30,
            index_cache_bytes: 32 << 10,
            filter_expected_entries: 1 << 14,
            warm_bytes: 8 << 20,
            metadata_files: 10_000,
            tree_files: 10_000,
            tree_operations: 2_500,
            journal_appends: 1_000,
            data_journal_files: 100,
            data_journal_appends: 1_000,
            fileserver_files: 100,
            fileserver_threads: 4,
            fileserver_iterations: 10,
            copy_flush_bytes: 1 << 20,
            ..Scale::full()
        }
    }
}

/// The sizes of Table 5.1's measurement.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct UniquenessScale {
    /// The volume (paper 1: 1 GB).
    pub volume_bytes: u64,
    /// Empty files created in one directory (paper 1: 1,000,000).
    pub files: u64,
    pub threads: usize,
}

impl UniquenessScale {
    /// The paper's sizes.
    pub fn full() -> UniquenessScale {
        UniquenessScale {
            volume_bytes: 1 << 30,
            files: 1_000_000,
            threads: 4,
        }
    }

    /// A tenth of the files.
    pub fn quick() -> UniquenessScale {
        UniquenessScale {
            files: 100_000,
            ..UniquenessScale::full()
        }
    }
}

/// Everything an experiment is run from.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Paper1Options {
    /// Where results and figures are written.
    pub output_directory: PathBuf,
    /// Where each run's temporary repository and mount live (local disk or tmpfs).
    pub work_directory: PathBuf,
    pub workloads: Vec<Workload>,
    pub latencies_ns: Vec<u64>,
    /// The cache policies of every workload; `None`: each workload's
    /// [`Workload::paper_policies`].
    pub policies: Option<Vec<CachePolicy>>,
    /// Runs of every cell of the matrix.
    pub repetitions: u32,
    pub scale: Scale,
    /// Table 5.1, measured before the matrix; `None` leaves it out.
    pub uniqueness: Option<UniquenessScale>,
}

impl Paper1Options {
    /// The policies `workload` runs with.
    pub fn policies_of(&self, workload: Workload) -> Vec<CachePolicy> {
        match &self.policies {
            Some(policies) => policies.clone(),
            None => workload.paper_policies().to_vec(),
        }
    }

    /// Runs of the matrix.
    pub fn run_count(&self) -> usize {
        self.workloads
            .iter()
            .map(|&workload| self.policies_of(workload).len() * workload.setups().len())
            .sum::<usize>()
            * self.latencies_ns.len()
            * self.repetitions as usize
    }

    /// Checks the options before anything runs.
    pub fn validate(&self) -> Result<()> {
        let check = |ok: bool, message: &str| {
            if ok {
                Ok(())
            } else {
                Err(LabError::InvalidOption(message.to_string()))
            }
        };
        let scale = &self.scale;
        check(
            !self.workloads.is_empty() || self.uniqueness.is_some(),
            "no workload chosen",
        )?;
        check(!self.latencies_ns.is_empty(), "no latency chosen")?;
        check(
            self.policies
                .as_ref()
                .is_none_or(|policies| !policies.is_empty()),
            "no cache policy chosen",
        )?;
        check(self.repetitions >= 1, "repetitions must be at least 1")?;
        check(
            (0.0..=1.0).contains(&scale.duplicate_fraction),
            "duplicate fraction must be between 0 and 1",
        )?;
        check(
            scale.metadata_threads >= 1
                && scale.tree_threads >= 1
                && scale.data_journal_threads >= 1
                && scale.fileserver_threads >= 1,
            "every workload needs at least one thread",
        )?;
        check(
            scale.journal_fsync_every >= 1 && scale.data_journal_fsync_every >= 1,
            "fsync interval must be at least 1",
        )?;
        check(
            2 * scale.tree_operations <= scale.tree_files,
            "the tree's creates and deletes must fit in half its file set each",
        )?;
        check(
            scale.tree_depth >= 1.0,
            "the tree's depth must be at least 1",
        )?;
        check(
            scale.data_journal_files >= scale.data_journal_threads as u64,
            "the data-journal workload needs a file per thread",
        )?;
        check(
            scale.fileserver_files >= scale.fileserver_threads as u64
                && scale.fileserver_mean_blocks >= 1,
            "the file server needs a file per thread and files of a block or more",
        )?;
        check(
            scale.warm_source.is_dir(),
            "the warm-up source is not a directory",
        )?;
        check(
            self.workloads.iter().all(|&workload| {
                self.policies_of(workload)
                    .iter()
                    .all(|policy| policy.entries_for_budget(scale.index_cache_bytes) > 0)
            }),
            "the index cache budget is too small for one entry",
        )
    }
}

/// Engine counters that the experiment reports, as differences over a phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseCounters {
    pub writes: u64,
    pub reads: u64,
    pub flushes: u64,
    pub blocks_written: u64,
    pub zero_blocks_written: u64,
    pub blocks_deduplicated: u64,
    pub blocks_stored: u64,
    pub hint_metadata_blocks: u64,
    pub hint_journal_blocks: u64,
    pub hint_classified_blocks: u64,
    pub prefetched_fingerprints: u64,
    pub index_lookups: u64,
    pub filter_negatives: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Lookups that read the on-disk index and paid the injected latency: the I/Os hints
    /// avoid.
    pub disk_lookups: u64,
    pub disk_hits: u64,
    pub prefetches: u64,
    pub prefetch_loads: u64,
    pub index_inserts: u64,
    /// Nanoseconds the injected latency busy-waited (processor time a real index read would
    /// not use).
    #[serde(default)]
    pub injected_wait_busy_ns: u64,
}

impl PhaseCounters {
    /// The cumulative counters of an engine now.
    pub fn of(stats: &EngineStats) -> PhaseCounters {
        let (requests, index) = (&stats.requests, &stats.index);
        PhaseCounters {
            writes: requests.writes,
            reads: requests.reads,
            flushes: requests.flushes,
            blocks_written: requests.blocks_written,
            zero_blocks_written: requests.zero_blocks_written,
            blocks_deduplicated: requests.blocks_deduplicated,
            blocks_stored: requests.blocks_stored,
            hint_metadata_blocks: requests.hint_metadata_blocks,
            hint_journal_blocks: requests.hint_journal_blocks,
            hint_classified_blocks: requests.hint_classified_blocks,
            prefetched_fingerprints: requests.prefetched_fingerprints,
            index_lookups: index.lookups,
            filter_negatives: index.filter_negatives,
            cache_hits: index.cache_hits,
            cache_misses: index.cache_misses,
            disk_lookups: index.disk_lookups,
            disk_hits: index.disk_hits,
            prefetches: index.prefetches,
            prefetch_loads: index.prefetch_loads,
            index_inserts: index.inserts,
            injected_wait_busy_ns: index.injected_wait_busy_ns,
        }
    }

    /// What happened between `earlier` and `self` (counters only grow while an engine runs).
    pub fn since(&self, earlier: &PhaseCounters) -> PhaseCounters {
        let difference = |now: u64, then: u64| {
            assert!(now >= then, "engine counters went backwards");
            now - then
        };
        PhaseCounters {
            writes: difference(self.writes, earlier.writes),
            reads: difference(self.reads, earlier.reads),
            flushes: difference(self.flushes, earlier.flushes),
            blocks_written: difference(self.blocks_written, earlier.blocks_written),
            zero_blocks_written: difference(self.zero_blocks_written, earlier.zero_blocks_written),
            blocks_deduplicated: difference(self.blocks_deduplicated, earlier.blocks_deduplicated),
            blocks_stored: difference(self.blocks_stored, earlier.blocks_stored),
            hint_metadata_blocks: difference(
                self.hint_metadata_blocks,
                earlier.hint_metadata_blocks,
            ),
            hint_journal_blocks: difference(self.hint_journal_blocks, earlier.hint_journal_blocks),
            hint_classified_blocks: difference(
                self.hint_classified_blocks,
                earlier.hint_classified_blocks,
            ),
            prefetched_fingerprints: difference(
                self.prefetched_fingerprints,
                earlier.prefetched_fingerprints,
            ),
            index_lookups: difference(self.index_lookups, earlier.index_lookups),
            filter_negatives: difference(self.filter_negatives, earlier.filter_negatives),
            cache_hits: difference(self.cache_hits, earlier.cache_hits),
            cache_misses: difference(self.cache_misses, earlier.cache_misses),
            disk_lookups: difference(self.disk_lookups, earlier.disk_lookups),
            disk_hits: difference(self.disk_hits, earlier.disk_hits),
            prefetches: difference(self.prefetches, earlier.prefetches),
            prefetch_loads: difference(self.prefetch_loads, earlier.prefetch_loads),
            index_inserts: difference(self.index_inserts, earlier.index_inserts),
            injected_wait_busy_ns: difference(
                self.injected_wait_busy_ns,
                earlier.injected_wait_busy_ns,
            ),
        }
    }
}

/// Processor seconds over a run's workload and its sync ([`crate::cpu`] says what each
/// clock covers).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuSeconds {
    /// The lab process: the workload's threads, the NBD server and the engine.
    pub process: f64,
    /// The workload's own threads: the driver and the file system's work in its system
    /// calls (and the final `syncfs`).
    pub workload: f64,
    /// nbdfuse, the NBD client.
    pub nbdfuse: f64,
    /// The injected latency's busy-waiting (part of `process`), which paper 1's emulation
    /// spent asleep.
    pub injected_wait_busy: f64,
}

impl CpuSeconds {
    /// The processor time of the whole stack the lab can see, without the injected wait's
    /// busy part.
    pub fn total(&self) -> f64 {
        (self.process + self.nbdfuse - self.injected_wait_busy).max(0.0)
    }

    /// The engine's and the NBD server's share: the process without the workload's threads
    /// and without the injected wait's busy part.
    pub fn engine(&self) -> f64 {
        (self.process - self.workload - self.injected_wait_busy).max(0.0)
    }
}

/// A part of a workload timed on its own (the tree's creates and deletes).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OperationKind {
    pub name: String,
    pub operations: u64,
    /// Seconds until the last thread of this kind finished, plus the final sync.
    pub seconds: f64,
}

impl OperationKind {
    pub fn operations_per_second(&self) -> f64 {
        self.operations as f64 / self.seconds
    }
}

/// The pass that deduplicates deferred blocks after a deferred run, as `onecopy volume dedup`
/// runs it (paper 1's NILFS2 deduplicated during garbage collection).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DeferredPass {
    pub seconds: f64,
    /// Processor seconds of the process during the pass, without the injected wait's busy
    /// part.
    pub cpu_seconds: f64,
    /// Deferred chunks examined, merged into an existing chunk, and indexed as new.
    pub examined: u64,
    pub deduplicated: u64,
    pub indexed: u64,
    /// Engine counters over the pass.
    pub counters: PhaseCounters,
    /// The volume after the pass.
    pub dedup_ratio: f64,
    pub stored_bytes: u64,
}

/// One run: one cell of the matrix, one repetition.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunRecord {
    pub workload: Workload,
    pub policy: CachePolicy,
    pub latency_ns: u64,
    /// Hints on ([`Setup::On`] or [`Setup::Deferred`]).
    pub hints: bool,
    /// Deferred deduplication ([`Setup::Deferred`]).
    #[serde(default)]
    pub deferred: bool,
    pub hint_settings: HintSettings,
    pub repetition: u32,
    /// Index cache entries the budget allows for this policy.
    pub index_cache_entries_limit: u64,
    /// Operations of the workload ([`Workload::operation`]).
    pub operations: u64,
    /// File data the workload wrote (appends, copied bytes; 0 for empty files).
    pub data_bytes: u64,
    /// Wall-clock seconds of the workload and the sync that ends it.
    pub elapsed_seconds: f64,
    /// Of which the final sync.
    #[serde(default)]
    pub sync_seconds: f64,
    pub operations_per_second: f64,
    /// `data_bytes / elapsed_seconds / 10^6`.
    pub megabytes_per_second: f64,
    /// Parts of the workload timed on their own.
    #[serde(default)]
    pub kinds: Vec<OperationKind>,
    /// Processor time over the workload and its sync.
    #[serde(default)]
    pub cpu: CpuSeconds,
    /// Mapped / stored bytes of the volume after the run (before any deferred pass).
    pub dedup_ratio: f64,
    pub mapped_bytes: u64,
    pub stored_bytes: u64,
    /// Engine counters over the workload (and its sync).
    pub counters: PhaseCounters,
    /// Engine counters over mkfs, mount, the warm-up and the workload's preparation.
    pub setup_counters: PhaseCounters,
    /// The deferred pass after a deferred run.
    #[serde(default)]
    pub deferred_pass: Option<DeferredPass>,
    /// Files and bytes the warm-up copied, and its seconds.
    pub warm_files: u64,
    pub warm_bytes: u64,
    pub warm_seconds: f64,
    pub host_before: HostSnapshot,
    pub host_after: HostSnapshot,
}

impl RunRecord {
    /// Processor microseconds per operation of the whole visible stack ([`CpuSeconds::total`]).
    pub fn cpu_microseconds_per_operation(&self) -> f64 {
        self.cpu.total() * 1e6 / self.operations as f64
    }

    /// The engine's share of it ([`CpuSeconds::engine`]).
    pub fn engine_cpu_microseconds_per_operation(&self) -> f64 {
        self.cpu.engine() * 1e6 / self.operations as f64
    }

    /// The dedup ratio the volume ends with: after the deferred pass when there was one.
    pub fn final_dedup_ratio(&self) -> f64 {
        self.deferred_pass
            .as_ref()
            .map_or(self.dedup_ratio, |pass| pass.dedup_ratio)
    }

    /// The bytes stored at the end: after the deferred pass when there was one.
    pub fn final_stored_bytes(&self) -> u64 {
        self.deferred_pass
            .as_ref()
            .map_or(self.stored_bytes, |pass| pass.stored_bytes)
    }
}

/// Everything `results.json` holds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Paper1Results {
    pub experiment: String,
    pub options: Paper1Options,
    /// Table 5.1, one record per file system and chunk size.
    #[serde(default)]
    pub uniqueness: Vec<UniquenessRecord>,
    pub runs: Vec<RunRecord>,
}

/// Runs Table 5.1 and the matrix, calling `progress` with a line before and after each run;
/// results are rewritten after every run and figures at the end. Returns the paths written.
pub fn run_experiment(
    options: &Paper1Options,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<PathBuf>> {
    options.validate()?;
    let mut results = Paper1Results {
        experiment: "paper1".into(),
        options: options.clone(),
        uniqueness: Vec::new(),
        runs: Vec::new(),
    };
    let started = Instant::now();
    if let Some(scale) = &options.uniqueness {
        for file_system in uniqueness::FILE_SYSTEMS {
            progress(&format!(
                "[Table 5.1, {:.0} s] {file_system}: {} empty files on {} MiB",
                started.elapsed().as_secs_f64(),
                scale.files,
                scale.volume_bytes >> 20
            ));
            let records = uniqueness::measure(
                &options.work_directory,
                file_system,
                scale.volume_bytes,
                scale.files,
                scale.threads,
            )?;
            for record in &records {
                progress(&format!(
                    "    {} B chunks: {} distinct before, {} after ({:.1}% of {}), {:.1} s",
                    record.after.chunk_bytes,
                    record.before.distinct,
                    record.after.distinct,
                    100.0 * record.after.distinct as f64 / record.after.chunks as f64,
                    record.after.chunks,
                    record.create_seconds,
                ));
            }
            results.uniqueness.extend(records);
            write_results(&options.output_directory, &results)?;
        }
    }
    let cells = options.run_count();
    for repetition in 1..=options.repetitions {
        for &workload in &options.workloads {
            for policy in options.policies_of(workload) {
                for &latency_ns in &options.latencies_ns {
                    // Rotate the order between repetitions so that whatever the first run of
                    // a cell leaves behind (host page cache, load) does not always favour
                    // the same setup.
                    let mut order = workload.setups().to_vec();
                    let turn = (repetition as usize - 1) % order.len();
                    order.rotate_left(turn);
                    for setup in order {
                        progress(&format!(
                            "[{}/{cells}, {:.0} s] {workload} {policy} {} {}",
                            results.runs.len() + 1,
                            started.elapsed().as_secs_f64(),
                            format_latency(latency_ns),
                            setup.label(),
                        ));
                        let record =
                            run_once(options, workload, policy, latency_ns, setup, repetition)?;
                        progress(&format!(
                            "    {:.1} ops/s ({:.2} s), {:.0} µs CPU/op, dedup {:.3}, disk \
                             lookups {}, filter negatives {}, cache hits {}, load {:.1}{}",
                            record.operations_per_second,
                            record.elapsed_seconds,
                            record.cpu_microseconds_per_operation(),
                            record.dedup_ratio,
                            record.counters.disk_lookups,
                            record.counters.filter_negatives,
                            record.counters.cache_hits,
                            record.host_after.load_average[0],
                            record.deferred_pass.as_ref().map_or(String::new(), |pass| {
                                format!(
                                    "; deferred pass {:.2} s, {} merged, dedup {:.3}",
                                    pass.seconds, pass.deduplicated, pass.dedup_ratio
                                )
                            }),
                        ));
                        results.runs.push(record);
                        write_results(&options.output_directory, &results)?;
                    }
                }
            }
        }
    }
    write_results(&options.output_directory, &results)?;
    let mut written = vec![
        options.output_directory.join("results.json"),
        options.output_directory.join("results.csv"),
    ];
    written.extend(figures::write_figures(&options.output_directory, &results)?);
    Ok(written)
}

/// `10us`, `500us`, `1ms`, `10ms`.
pub fn format_latency(latency_ns: u64) -> String {
    if latency_ns >= 1_000_000 && latency_ns.is_multiple_of(1_000_000) {
        format!("{}ms", latency_ns / 1_000_000)
    } else if latency_ns >= 1_000 && latency_ns.is_multiple_of(1_000) {
        format!("{}us", latency_ns / 1_000)
    } else {
        format!("{latency_ns}ns")
    }
}

/// Processor clocks at one moment, for differences over a phase.
struct CpuClocks {
    process: f64,
    thread: f64,
    nbdfuse: f64,
    injected_wait_busy_ns: u64,
}

impl CpuClocks {
    fn now(testbed: &Testbed) -> Result<CpuClocks> {
        let nbdfuse = match testbed.nbdfuse_pid() {
            Some(pid) => cpu::child_seconds(pid)?,
            None => 0.0,
        };
        Ok(CpuClocks {
            process: cpu::process_seconds(),
            thread: cpu::thread_seconds(),
            nbdfuse,
            injected_wait_busy_ns: testbed.engine().stats().index.injected_wait_busy_ns,
        })
    }

    /// The time since `earlier`; `driver_threads` is what the workload's own threads used
    /// besides this one.
    fn since(&self, earlier: &CpuClocks, driver_threads: f64) -> CpuSeconds {
        CpuSeconds {
            process: self.process - earlier.process,
            workload: self.thread - earlier.thread + driver_threads,
            nbdfuse: self.nbdfuse - earlier.nbdfuse,
            injected_wait_busy: (self.injected_wait_busy_ns - earlier.injected_wait_busy_ns) as f64
                / 1e9,
        }
    }
}

/// What a workload did, for its record.
struct Outcome {
    operations: u64,
    data_bytes: u64,
    /// Seconds from the start of each timed kind until it finished (the sync is added later).
    kinds: Vec<(String, u64, f64)>,
    /// Processor seconds of threads the driver started.
    driver_thread_seconds: f64,
}

fn run_once(
    options: &Paper1Options,
    workload: Workload,
    policy: CachePolicy,
    latency_ns: u64,
    setup: Setup,
    repetition: u32,
) -> Result<RunRecord> {
    let scale = &options.scale;
    let host_before = HostSnapshot::take();
    let mut runtime = RuntimeOptions::default();
    // The paper's filter (§4.2.2), not the block device's default.
    runtime.index.false_positive_rate = PAPER_FILTER_FALSE_POSITIVE_RATE;
    runtime.index.cache_policy = policy;
    runtime.index.cache_bytes = scale.index_cache_bytes;
    // The latency is injected only while the workload runs (below): preparing a run at
    // 10 ms would take minutes that measure nothing.
    runtime.index.latency_ns = 0;
    runtime.index.expected_entries = scale.filter_expected_entries;
    // Paper 1's system has no read cache; reads go to the containers.
    runtime.content_cache_bytes = 0;
    let hint_settings = workload.hint_settings(setup, scale.copy_all_hints);
    let mut testbed = Testbed::attach(&TestbedOptions {
        parent_directory: options.work_directory.clone(),
        volume_bytes: scale.volume_bytes,
        block_bytes: 4096,
        runtime,
        hints: hint_settings.clone(),
        file_system: workload.file_system(),
    })?;
    let mount = testbed.mount_point().to_path_buf();
    let seed = u64::from(repetition) * 1_000_003 + latency_ns;

    let warm_started = Instant::now();
    let warm = copy_tree(
        &scale.warm_source,
        &mount.join("warm"),
        scale.warm_bytes,
        None,
    )?;
    testbed.sync()?;
    let warm_seconds = warm_started.elapsed().as_secs_f64();
    let entries_limit = policy.entries_for_budget(scale.index_cache_bytes) as u64;
    // One duplicate distribution per run, shared by the workload's threads (paper 1 §5.2).
    let source = Mutex::new(BlockSource::new(seed, scale.duplicate_fraction));
    let tree = FileSet::new(
        &mount.join("tree"),
        scale.tree_files,
        FileSet::width_for_depth(scale.tree_files, scale.tree_depth),
    );
    let mut tree_absent = Vec::new();
    let mut tree_present = Vec::new();
    let fileserver = FileServer {
        set: FileSet::new(
            &mount.join("fileserver"),
            scale.fileserver_files,
            FILESERVER_DIRECTORY_WIDTH,
        ),
        mean_file_blocks: scale.fileserver_mean_blocks,
        append_blocks_max: FILESERVER_APPEND_BLOCKS_MAX,
        io_bytes: FILESERVER_IO_BYTES,
    };
    match workload {
        Workload::Copy => {
            let unique_bytes = 2 * entries_limit * workloads::BLOCK_BYTES as u64;
            write_unique_file(&mount.join("unique"), unique_bytes, seed)?;
            testbed.remount()?;
        }
        Workload::Tree => {
            // Half the names exist at the start; the creates take free names and the deletes
            // existing ones, each in a random order.
            let mut names: Vec<u64> = (0..scale.tree_files).collect();
            Random::new(seed).shuffle(&mut names);
            let (present, absent) = names.split_at(names.len() / 2);
            tree.create_directories()?;
            create_files(&tree, present)?;
            testbed.sync()?;
            tree_present = present[..scale.tree_operations as usize].to_vec();
            tree_absent = absent[..scale.tree_operations as usize].to_vec();
        }
        Workload::FileServer => {
            fileserver.preallocate(FILESERVER_PREALLOCATED, &source, seed)?;
            testbed.sync()?;
        }
        Workload::Metadata | Workload::Journal | Workload::DataJournal => {}
    }
    testbed
        .engine()
        .set_index_latency_ns(latency_ns)
        .map_err(|error| LabError::engine("setting the injected index latency", error))?;
    let before = PhaseCounters::of(&testbed.engine().stats());
    let clocks_before = CpuClocks::now(&testbed)?;

    let started = Instant::now();
    let outcome = match workload {
        Workload::Metadata => {
            let directory = mount.join("files");
            let (created, thread_seconds) =
                create_empty_files(&directory, scale.metadata_files, scale.metadata_threads)?;
            Outcome {
                operations: created,
                data_bytes: 0,
                kinds: Vec::new(),
                driver_thread_seconds: thread_seconds,
            }
        }
        Workload::Tree => {
            let done = create_and_delete(&tree, &tree_absent, &tree_present, scale.tree_threads)?;
            Outcome {
                operations: done.creates + done.deletes,
                data_bytes: 0,
                kinds: vec![
                    ("create".into(), done.creates, done.create_seconds),
                    ("delete".into(), done.deletes, done.delete_seconds),
                ],
                driver_thread_seconds: done.thread_cpu_seconds,
            }
        }
        Workload::Journal => {
            let mut source = source.lock().expect("no other thread holds the source");
            append_with_fsync(
                &mount.join("log"),
                scale.journal_appends,
                scale.journal_fsync_every,
                &mut source,
            )?;
            Outcome {
                operations: scale.journal_appends,
                data_bytes: scale.journal_appends * workloads::BLOCK_BYTES as u64,
                kinds: Vec::new(),
                driver_thread_seconds: 0.0,
            }
        }
        Workload::DataJournal => {
            let done = append_to_files(
                &mount.join("logs"),
                scale.data_journal_files,
                scale.data_journal_threads,
                scale.data_journal_appends,
                scale.data_journal_fsync_every,
                &source,
            )?;
            Outcome {
                operations: done.appends,
                data_bytes: done.appends * workloads::BLOCK_BYTES as u64,
                kinds: Vec::new(),
                driver_thread_seconds: done.thread_cpu_seconds,
            }
        }
        Workload::Copy => {
            let copy = copy_tree(
                &mount.join("warm"),
                &mount.join("copy"),
                u64::MAX,
                Some(scale.copy_flush_bytes),
            )?;
            Outcome {
                operations: copy.files,
                data_bytes: copy.bytes,
                kinds: Vec::new(),
                driver_thread_seconds: 0.0,
            }
        }
        Workload::FileServer => {
            let done = fileserver.run(
                scale.fileserver_threads,
                scale.fileserver_iterations,
                &source,
                seed,
            )?;
            Outcome {
                operations: done.operations,
                data_bytes: done.bytes_written,
                kinds: Vec::new(),
                driver_thread_seconds: done.thread_cpu_seconds,
            }
        }
    };
    let sync_started = Instant::now();
    testbed.sync()?;
    let sync_seconds = sync_started.elapsed().as_secs_f64();
    let elapsed_seconds = started.elapsed().as_secs_f64();
    let cpu = CpuClocks::now(&testbed)?.since(&clocks_before, outcome.driver_thread_seconds);

    let stats = testbed.volume_stats()?;
    let after = PhaseCounters::of(&stats.engine);
    let deferred_pass = if setup == Setup::Deferred {
        Some(run_deferred_pass(&testbed, &after)?)
    } else {
        None
    };
    testbed.teardown()?;
    Ok(RunRecord {
        workload,
        policy,
        latency_ns,
        hints: setup != Setup::Off,
        deferred: setup == Setup::Deferred,
        hint_settings,
        repetition,
        index_cache_entries_limit: entries_limit,
        operations: outcome.operations,
        data_bytes: outcome.data_bytes,
        elapsed_seconds,
        sync_seconds,
        operations_per_second: outcome.operations as f64 / elapsed_seconds,
        megabytes_per_second: outcome.data_bytes as f64 / elapsed_seconds / 1e6,
        kinds: outcome
            .kinds
            .into_iter()
            .map(|(name, operations, seconds)| OperationKind {
                name,
                operations,
                seconds: seconds + sync_seconds,
            })
            .collect(),
        cpu,
        dedup_ratio: stats.dedup_ratio,
        mapped_bytes: stats.mapped_bytes,
        stored_bytes: stats.stored_bytes,
        counters: after.since(&before),
        setup_counters: before,
        deferred_pass,
        warm_files: warm.files,
        warm_bytes: warm.bytes,
        warm_seconds,
        host_before,
        host_after: HostSnapshot::take(),
    })
}

/// Deduplicates every deferred block of the volume now (minimum age 0, as `onecopy volume
/// dedup --min-age 0`) and measures it; `after_run` holds the counters before the pass.
fn run_deferred_pass(testbed: &Testbed, after_run: &PhaseCounters) -> Result<DeferredPass> {
    let engine = testbed.engine();
    let volume = engine
        .volume_id(crate::mount::VOLUME_NAME)
        .map_err(|error| LabError::engine("finding the lab volume", error))?;
    let process_before = cpu::process_seconds();
    let started = Instant::now();
    let report = engine
        .deduplicate_deferred(Some(volume), Some(0))
        .map_err(|error| LabError::engine("the deferred deduplication pass", error))?;
    engine
        .flush()
        .map_err(|error| LabError::engine("flushing after the deferred pass", error))?;
    let seconds = started.elapsed().as_secs_f64();
    let process = cpu::process_seconds() - process_before;
    let stats = testbed.volume_stats()?;
    let counters = PhaseCounters::of(&stats.engine).since(after_run);
    Ok(DeferredPass {
        seconds,
        cpu_seconds: (process - counters.injected_wait_busy_ns as f64 / 1e9).max(0.0),
        examined: report.examined,
        deduplicated: report.deduplicated,
        indexed: report.indexed,
        counters,
        dedup_ratio: stats.dedup_ratio,
        stored_bytes: stats.stored_bytes,
    })
}

/// Columns of `results.csv`.
const CSV_COLUMNS: [&str; 37] = [
    "workload",
    "policy",
    "latency_ns",
    "setup",
    "repetition",
    "operations",
    "data_bytes",
    "elapsed_seconds",
    "sync_seconds",
    "operations_per_second",
    "megabytes_per_second",
    "cpu_total_seconds",
    "cpu_engine_seconds",
    "cpu_workload_seconds",
    "cpu_nbdfuse_seconds",
    "injected_wait_busy_seconds",
    "cpu_microseconds_per_operation",
    "dedup_ratio",
    "mapped_bytes",
    "stored_bytes",
    "index_lookups",
    "filter_negatives",
    "cache_hits",
    "cache_misses",
    "disk_lookups",
    "disk_hits",
    "prefetches",
    "prefetched_fingerprints",
    "hint_metadata_blocks",
    "hint_journal_blocks",
    "hint_classified_blocks",
    "blocks_deduplicated",
    "blocks_stored",
    "pass_seconds",
    "pass_disk_lookups",
    "dedup_ratio_after_pass",
    "load_average_1m",
];

/// `results.csv`: one row per run.
pub fn results_table(runs: &[RunRecord]) -> CsvTable {
    let mut table = CsvTable::new(&CSV_COLUMNS);
    for run in runs {
        let counters = &run.counters;
        let mut row = vec![
            run.workload.name().to_string(),
            run.policy.name().to_string(),
            run.latency_ns.to_string(),
            Setup::of(run).name().to_string(),
        ];
        row.extend(
            [u64::from(run.repetition), run.operations, run.data_bytes].map(|v| v.to_string()),
        );
        row.extend(
            [
                run.elapsed_seconds,
                run.sync_seconds,
                run.operations_per_second,
                run.megabytes_per_second,
                run.cpu.total(),
                run.cpu.engine(),
                run.cpu.workload,
                run.cpu.nbdfuse,
                run.cpu.injected_wait_busy,
                run.cpu_microseconds_per_operation(),
                run.dedup_ratio,
            ]
            .map(number_cell),
        );
        row.extend(
            [
                run.mapped_bytes,
                run.stored_bytes,
                counters.index_lookups,
                counters.filter_negatives,
                counters.cache_hits,
                counters.cache_misses,
                counters.disk_lookups,
                counters.disk_hits,
                counters.prefetches,
                counters.prefetched_fingerprints,
                counters.hint_metadata_blocks,
                counters.hint_journal_blocks,
                counters.hint_classified_blocks,
                counters.blocks_deduplicated,
                counters.blocks_stored,
            ]
            .map(|value| value.to_string()),
        );
        match &run.deferred_pass {
            Some(pass) => row.extend([
                number_cell(pass.seconds),
                pass.counters.disk_lookups.to_string(),
                number_cell(pass.dedup_ratio),
            ]),
            None => row.extend([String::new(), String::new(), String::new()]),
        }
        row.push(number_cell(run.host_after.load_average[0]));
        table.push(row);
    }
    table
}

fn write_results(directory: &Path, results: &Paper1Results) -> Result<()> {
    write_json(&directory.join("results.json"), results)?;
    results_table(&results.runs).write(&directory.join("results.csv"))
}

/// Reads a `results.json` written by [`run_experiment`] (to redraw figures).
pub fn read_results(path: &Path) -> Result<Paper1Results> {
    crate::results::read_json(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: workload names round-trip, the copy workload's hints are prefetch only, and only
    /// the file server compares deferred deduplication.
    #[test]
    fn workloads_parse_and_choose_hints() {
        for workload in Workload::ALL {
            assert_eq!(workload.name().parse::<Workload>().unwrap(), workload);
        }
        assert!("filebench".parse::<Workload>().is_err());
        let copy = Workload::Copy.hint_settings(Setup::On, false);
        assert!(copy.prefetch && !copy.filesystem && !copy.explicit);
        assert_eq!(
            Workload::Copy.hint_settings(Setup::On, true),
            HintSettings::default()
        );
        assert_eq!(
            Workload::Metadata.hint_settings(Setup::On, false),
            HintSettings::default()
        );
        assert_eq!(
            Workload::Journal.hint_settings(Setup::Off, false),
            HintSettings::none()
        );
        let deferred = Workload::FileServer.hint_settings(Setup::Deferred, false);
        assert_eq!(deferred.deferred_seconds, Some(DEFERRED_SECONDS));
        assert!(deferred.filesystem);
        for workload in Workload::ALL {
            assert_eq!(
                workload.setups().contains(&Setup::Deferred),
                workload == Workload::FileServer
            );
        }
        assert_eq!(
            Workload::DataJournal.file_system().mount_options,
            "data=journal"
        );
    }

    /// Goal: the CPU shares never count the injected wait's busy part; method: one sample.
    #[test]
    fn cpu_shares_leave_out_the_busy_wait() {
        let cpu = CpuSeconds {
            process: 3.0,
            workload: 1.0,
            nbdfuse: 0.5,
            injected_wait_busy: 0.5,
        };
        assert_eq!(cpu.total(), 3.0);
        assert_eq!(cpu.engine(), 1.5);
    }

    /// Goal: latencies print as the paper writes them.
    #[test]
    fn latencies_format_like_the_paper() {
        let names: Vec<String> = PAPER_LATENCIES_NS
            .iter()
            .map(|l| format_latency(*l))
            .collect();
        assert_eq!(names, ["10us", "100us", "500us", "1ms", "10ms"]);
        assert_eq!(format_latency(1500), "1500ns");
    }

    /// Goal: phase differences subtract every counter; method: two snapshots.
    #[test]
    fn phase_counters_subtract() {
        let earlier = PhaseCounters {
            disk_lookups: 3,
            cache_hits: 10,
            ..PhaseCounters::default()
        };
        let later = PhaseCounters {
            disk_lookups: 8,
            cache_hits: 10,
            writes: 4,
            ..PhaseCounters::default()
        };
        let difference = later.since(&earlier);
        assert_eq!(difference.disk_lookups, 5);
        assert_eq!(difference.cache_hits, 0);
        assert_eq!(difference.writes, 4);
    }

    /// Goal: options are checked before anything runs.
    #[test]
    fn options_are_validated() {
        let mut options = Paper1Options {
            output_directory: PathBuf::from("/nonexistent"),
            work_directory: std::env::temp_dir(),
            workloads: vec![Workload::Metadata],
            latencies_ns: vec![10_000],
            policies: None,
            repetitions: 1,
            scale: Scale::quick(),
            uniqueness: None,
        };
        options.scale.warm_source = std::env::temp_dir();
        assert!(options.validate().is_ok());
        assert_eq!(options.run_count(), 4, "metadata runs with LRU and ARC");
        options.workloads = vec![Workload::FileServer];
        assert_eq!(options.run_count(), 3, "off, on, deferred");
        options.scale.index_cache_bytes = 1;
        assert!(options.validate().is_err());
        options.scale.index_cache_bytes = 1 << 20;
        options.scale.tree_operations = options.scale.tree_files;
        assert!(options.validate().is_err());
        options.scale = Scale::quick();
        options.scale.warm_source = std::env::temp_dir();
        options.workloads.clear();
        assert!(options.validate().is_err());
        options.uniqueness = Some(UniquenessScale::quick());
        assert!(
            options.validate().is_ok(),
            "Table 5.1 alone is an experiment"
        );
    }
}
