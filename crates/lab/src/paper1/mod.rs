//! Paper 1 §5 in the lab: file-system hints for inline block-layer deduplication.
//!
//! The experiment is a matrix: every [`Workload`] x injected on-disk index latency x index
//! cache policy x hints on/off, each cell repeated [`Paper1Options::repetitions`] times. One
//! *run* (one cell, one repetition) goes:
//!
//! 1. build a fresh [`Testbed`]: a new repository in a temporary directory, an engine with the
//!    run's index options (cache policy, a small cache budget, the injected latency), one
//!    volume with or without hints, served over NBD in-process, attached through nbdfuse and a
//!    loop device, `mkfs.ext4`, mounted;
//! 2. warm the index cache as paper 1 §5.3 does: copy a tree of real files (scaled down from a
//!    kernel tree plus a CentOS root to part of `/usr/share`) and sync;
//! 3. for the copy workload only, paper 1 §5.4.4 step 2: write unique data worth twice the
//!    index cache's capacity, sync, and remount to drop the page cache;
//! 4. run the workload, sync, and measure the wall-clock time of both together;
//! 5. read the engine counters (differences over step 4) and the volume's dedup ratio
//!    (mapped / stored bytes after the run), then tear the testbed down.
//!
//! Hints on means [`HintSettings::default`] (file-system metadata and journal ranges are
//! stored without deduplication, copies prefetch) for the metadata and journal workloads,
//! and prefetch only for the copy workload, because paper 1 §5.4.4 ran its copy with the
//! metadata and journal hints off. Hints off is [`HintSettings::none`].
//!
//! Results are written after every run (`results.json`, `results.csv`), and the figures at
//! the end ([`figures`]).

pub mod figures;
pub mod workloads;

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use onecopy_block::{EngineStats, HintSettings, RuntimeOptions};
use onecopy_core::index::cache::CachePolicy;

use crate::error::{LabError, Result};
use crate::mount::{FileSystemOptions, Testbed, TestbedOptions};
use crate::results::{number_cell, write_json, CsvTable, HostSnapshot};
use workloads::{append_with_fsync, copy_tree, create_empty_files, write_unique_file, BlockSource};

/// The Bloom filter's false-positive rate in paper 1 (§4.2.2).
pub const PAPER_FILTER_FALSE_POSITIVE_RATE: f64 = 0.01;

/// Paper 1's on-disk index latencies (§5.3): 10 µs (fast flash) to 10 ms (slow disk).
pub const PAPER_LATENCIES_NS: [u64; 5] = [10_000, 100_000, 500_000, 1_000_000, 10_000_000];

/// One workload of paper 1 §5.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// Many empty files created in one directory (§5.4.2, Fig. 5.1).
    Metadata,
    /// 4 KiB appends to one file with an fsync every 100 (§5.4.2, Fig. 5.3).
    Journal,
    /// Copy of a tree inside the same file system after the cache was flushed (§5.4.4,
    /// Table 5.2).
    Copy,
}

impl Workload {
    /// Every workload, in the paper's order.
    pub const ALL: [Workload; 3] = [Workload::Metadata, Workload::Journal, Workload::Copy];

    /// The name used on the command line and in results.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Metadata => "metadata",
            Workload::Journal => "journal",
            Workload::Copy => "copy",
        }
    }

    /// What one operation of the workload is.
    pub fn operation(self) -> &'static str {
        match self {
            Workload::Metadata => "files created",
            Workload::Journal => "4 KiB appends",
            Workload::Copy => "files copied",
        }
    }

    /// The hint settings of a run with hints on or off (see the module documentation).
    pub fn hint_settings(self, hints: bool) -> HintSettings {
        match (self, hints) {
            (_, false) => HintSettings::none(),
            (Workload::Copy, true) => HintSettings {
                prefetch: true,
                ..HintSettings::none()
            },
            (_, true) => HintSettings::default(),
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
                    "unknown workload {text:?}; choose metadata, journal or copy"
                ))
            })
    }
}

/// The sizes of an experiment, scaled down from the paper so that the index cache is small
/// relative to the data and the matrix fits in well under an hour.
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
    /// Appends of the journal workload.
    pub journal_appends: u64,
    /// Appends between fsyncs (paper 1: 100).
    pub journal_fsync_every: u64,
    /// Fraction of appended blocks that repeat an earlier one (paper 1: the "homes"
    /// distribution).
    pub duplicate_fraction: f64,
    /// The copy workload syncs after each this many bytes copied.
    pub copy_flush_bytes: u64,
    /// Copy runs with hints on use every hint source, not only prefetch (paper 1 §5.4.4 had
    /// the metadata and journal hints off; this shows what they add).
    pub copy_all_hints: bool,
}

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
            journal_appends: 20_000,
            journal_fsync_every: 100,
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
            journal_appends: 1_000,
            copy_flush_bytes: 1 << 20,
            ..Scale::full()
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
    pub policies: Vec<CachePolicy>,
    /// Runs of every cell of the matrix.
    pub repetitions: u32,
    pub scale: Scale,
}

impl Paper1Options {
    /// Checks the options before anything runs.
    pub fn validate(&self) -> Result<()> {
        let check = |ok: bool, message: &str| {
            if ok {
                Ok(())
            } else {
                Err(LabError::InvalidOption(message.to_string()))
            }
        };
        check(!self.workloads.is_empty(), "no workload chosen")?;
        check(!self.latencies_ns.is_empty(), "no latency chosen")?;
        check(!self.policies.is_empty(), "no cache policy chosen")?;
        check(self.repetitions >= 1, "repetitions must be at least 1")?;
        check(
            (0.0..=1.0).contains(&self.scale.duplicate_fraction),
            "duplicate fraction must be between 0 and 1",
        )?;
        check(
            self.scale.metadata_threads >= 1,
            "metadata threads must be at least 1",
        )?;
        check(
            self.scale.journal_fsync_every >= 1,
            "fsync interval must be at least 1",
        )?;
        check(
            self.scale.warm_source.is_dir(),
            "the warm-up source is not a directory",
        )?;
        check(
            self.policies
                .iter()
                .all(|policy| policy.entries_for_budget(self.scale.index_cache_bytes) > 0),
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
        }
    }
}

/// One run: one cell of the matrix, one repetition.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunRecord {
    pub workload: Workload,
    pub policy: CachePolicy,
    pub latency_ns: u64,
    pub hints: bool,
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
    pub operations_per_second: f64,
    /// `data_bytes / elapsed_seconds / 10^6`.
    pub megabytes_per_second: f64,
    /// Mapped / stored bytes of the volume after the run.
    pub dedup_ratio: f64,
    pub mapped_bytes: u64,
    pub stored_bytes: u64,
    /// Engine counters over the workload (and its sync).
    pub counters: PhaseCounters,
    /// Engine counters over mkfs, mount and the warm-up (and, for copy, the unique fill).
    pub setup_counters: PhaseCounters,
    /// Files and bytes the warm-up copied, and its seconds.
    pub warm_files: u64,
    pub warm_bytes: u64,
    pub warm_seconds: f64,
    pub host_before: HostSnapshot,
    pub host_after: HostSnapshot,
}

/// Everything `results.json` holds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Paper1Results {
    pub experiment: String,
    pub options: Paper1Options,
    pub runs: Vec<RunRecord>,
}

/// Runs the matrix, calling `progress` with a line before and after each run; results are
/// rewritten after every run and figures at the end. Returns the paths written.
pub fn run_experiment(
    options: &Paper1Options,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<PathBuf>> {
    options.validate()?;
    let mut results = Paper1Results {
        experiment: "paper1".into(),
        options: options.clone(),
        runs: Vec::new(),
    };
    let cells = options.workloads.len()
        * options.latencies_ns.len()
        * options.policies.len()
        * 2
        * options.repetitions as usize;
    let started = Instant::now();
    for repetition in 1..=options.repetitions {
        for &workload in &options.workloads {
            for &policy in &options.policies {
                for &latency_ns in &options.latencies_ns {
                    // Alternate the order between repetitions so that whatever the first
                    // run of a pair leaves behind (host page cache, load) does not always
                    // favour the same side.
                    let order = if repetition % 2 == 1 {
                        [false, true]
                    } else {
                        [true, false]
                    };
                    for hints in order {
                        progress(&format!(
                            "[{}/{cells}, {:.0} s] {workload} {policy} {} hints {}",
                            results.runs.len() + 1,
                            started.elapsed().as_secs_f64(),
                            format_latency(latency_ns),
                            if hints { "on" } else { "off" },
                        ));
                        let record =
                            run_once(options, workload, policy, latency_ns, hints, repetition)?;
                        progress(&format!(
                            "    {:.1} ops/s ({:.2} s), dedup {:.3}, disk lookups {}, \
                             filter negatives {}, cache hits {}, load {:.1}",
                            record.operations_per_second,
                            record.elapsed_seconds,
                            record.dedup_ratio,
                            record.counters.disk_lookups,
                            record.counters.filter_negatives,
                            record.counters.cache_hits,
                            record.host_after.load_average[0],
                        ));
                        results.runs.push(record);
                        write_results(&options.output_directory, &results)?;
                    }
                }
            }
        }
    }
    let mut written = vec![
        options.output_directory.join("results.json"),
        options.output_directory.join("results.csv"),
    ];
    written.extend(figures::write_figures(
        &options.output_directory,
        &results.runs,
    )?);
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

fn run_once(
    options: &Paper1Options,
    workload: Workload,
    policy: CachePolicy,
    latency_ns: u64,
    hints: bool,
    repetition: u32,
) -> Result<RunRecord> {
    let scale = &options.scale;
    let host_before = HostSnapshot::take();
    let mut runtime = RuntimeOptions::default();
    // The paper's filter (§4.2.2), not the block device's default.
    runtime.index.false_positive_rate = PAPER_FILTER_FALSE_POSITIVE_RATE;
    runtime.index.cache_policy = policy;
    runtime.index.cache_bytes = scale.index_cache_bytes;
    runtime.index.latency_ns = latency_ns;
    runtime.index.expected_entries = scale.filter_expected_entries;
    // Paper 1's system has no read cache; reads go to the containers.
    runtime.content_cache_bytes = 0;
    let hint_settings = if workload == Workload::Copy && hints && scale.copy_all_hints {
        HintSettings::default()
    } else {
        workload.hint_settings(hints)
    };
    let mut testbed = Testbed::attach(&TestbedOptions {
        parent_directory: options.work_directory.clone(),
        volume_bytes: scale.volume_bytes,
        block_bytes: 4096,
        runtime,
        hints: hint_settings.clone(),
        file_system: FileSystemOptions::ext4(),
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
    if workload == Workload::Copy {
        let unique_bytes = 2 * entries_limit * workloads::BLOCK_BYTES as u64;
        write_unique_file(&mount.join("unique"), unique_bytes, seed)?;
        testbed.remount()?;
    }
    let before = PhaseCounters::of(&testbed.engine().stats());

    let started = Instant::now();
    let (operations, data_bytes) = match workload {
        Workload::Metadata => {
            let directory = mount.join("files");
            let created =
                create_empty_files(&directory, scale.metadata_files, scale.metadata_threads)?;
            (created, 0)
        }
        Workload::Journal => {
            let mut source = BlockSource::new(seed, scale.duplicate_fraction);
            append_with_fsync(
                &mount.join("log"),
                scale.journal_appends,
                scale.journal_fsync_every,
                &mut source,
            )?;
            (
                scale.journal_appends,
                scale.journal_appends * workloads::BLOCK_BYTES as u64,
            )
        }
        Workload::Copy => {
            let copy = copy_tree(
                &mount.join("warm"),
                &mount.join("copy"),
                u64::MAX,
                Some(scale.copy_flush_bytes),
            )?;
            (copy.files, copy.bytes)
        }
    };
    testbed.sync()?;
    let elapsed_seconds = started.elapsed().as_secs_f64();

    let stats = testbed.volume_stats()?;
    let after = PhaseCounters::of(&stats.engine);
    testbed.teardown()?;
    Ok(RunRecord {
        workload,
        policy,
        latency_ns,
        hints,
        hint_settings,
        repetition,
        index_cache_entries_limit: entries_limit,
        operations,
        data_bytes,
        elapsed_seconds,
        operations_per_second: operations as f64 / elapsed_seconds,
        megabytes_per_second: data_bytes as f64 / elapsed_seconds / 1e6,
        dedup_ratio: stats.dedup_ratio,
        mapped_bytes: stats.mapped_bytes,
        stored_bytes: stats.stored_bytes,
        counters: after.since(&before),
        setup_counters: before,
        warm_files: warm.files,
        warm_bytes: warm.bytes,
        warm_seconds,
        host_before,
        host_after: HostSnapshot::take(),
    })
}

/// Columns of `results.csv`.
const CSV_COLUMNS: [&str; 27] = [
    "workload",
    "policy",
    "latency_ns",
    "hints",
    "repetition",
    "operations",
    "data_bytes",
    "elapsed_seconds",
    "operations_per_second",
    "megabytes_per_second",
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
    "load_average_1m",
];

/// `results.csv`: one row per run.
pub fn results_table(runs: &[RunRecord]) -> CsvTable {
    let mut table = CsvTable::new(&CSV_COLUMNS);
    for run in runs {
        let counters = &run.counters;
        let integers = [
            run.latency_ns,
            u64::from(run.repetition),
            run.operations,
            run.data_bytes,
        ];
        let mut row = vec![
            run.workload.name().to_string(),
            run.policy.name().to_string(),
        ];
        row.push(integers[0].to_string());
        row.push(run.hints.to_string());
        row.extend(integers[1..].iter().map(u64::to_string));
        row.extend(
            [
                run.elapsed_seconds,
                run.operations_per_second,
                run.megabytes_per_second,
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

    /// Goal: workload names round-trip and the copy workload's hints are prefetch only.
    #[test]
    fn workloads_parse_and_choose_hints() {
        for workload in Workload::ALL {
            assert_eq!(workload.name().parse::<Workload>().unwrap(), workload);
        }
        assert!("fileserver".parse::<Workload>().is_err());
        let copy = Workload::Copy.hint_settings(true);
        assert!(copy.prefetch && !copy.filesystem && !copy.explicit);
        assert_eq!(
            Workload::Metadata.hint_settings(true),
            HintSettings::default()
        );
        assert_eq!(Workload::Journal.hint_settings(false), HintSettings::none());
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
            policies: vec![CachePolicy::Lru],
            repetitions: 1,
            scale: Scale::quick(),
        };
        options.scale.warm_source = std::env::temp_dir();
        assert!(options.validate().is_ok());
        options.scale.index_cache_bytes = 1;
        assert!(options.validate().is_err());
        options.scale.index_cache_bytes = 1 << 20;
        options.workloads.clear();
        assert!(options.validate().is_err());
    }
}
