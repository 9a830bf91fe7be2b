//! Paper 3 §5 on the file system face.
//!
//! - **Fig. 3** and the **I/O monitor's cost per read** ([`chunk_size`]): engine level.
//! - **Figs. 9 and 10** (read-latency CDFs of Table 4's high and low dedup workloads, 90% to
//!   10% of the files read sequentially, under no deduplication, all-big, all-small and
//!   selective) and **Fig. 11** (sequential-read throughput and dedup ratio) ([`mixes`]):
//!   file systems of the face mounted through FUSE by this process ([`bed`]), read cold.
//! - **Fig. 15** (the monitor's cost for tar, untar, grep and cp of a source tree)
//!   ([`programs`]).
//! - **Figs. 16 and 17** (foreground file serving and computing while `fs dedup` runs)
//!   ([`interference`]).
//!
//! - **Table 6** and **Fig. 14** (successive releases of a source tree, the newest in use:
//!   files per rank, savings, sequential reads of the rank-1 files) ([`releases`]).

pub mod bed;
pub mod chunk_size;
pub mod figures;
pub mod interference;
pub mod mixes;
pub mod programs;
pub mod releases;
pub mod synthetic;

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use crate::error::{LabError, Result};
use crate::results::HostSnapshot;
use chunk_size::{ChunkSizeResult, MonitorCost};
use interference::{IdleResult, InterferenceResult};
use mixes::WorkloadResult;
use programs::ProgramsResult;
use releases::ReleasesResult;

/// Most foreground bursts of the idle-started run.
const IDLE_BURSTS_MAX: usize = 10;

/// Options of `onecopy lab paper3`.
#[derive(Clone, Debug)]
pub struct Paper3Options {
    /// Where results.json, results.csv, summary.md and the figures go.
    pub out: PathBuf,
    /// Smaller data sets (see [`Sizes`]), for a run of a few minutes.
    pub quick: bool,
    /// Where the temporary repositories and mounts are made [default: the system temporary
    /// directory].
    pub work_dir: Option<PathBuf>,
    /// The cache of `onecopy lab paper2` (downloaded releases of typescript), used for
    /// Table 6 when it holds at least two releases.
    pub cache_directory: Option<PathBuf>,
}

/// The sizes of one run.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Sizes {
    /// Fig. 3: files and bytes per file.
    pub chunk_size_files: u64,
    pub chunk_size_file_bytes: u64,
    /// Figs. 9 to 11: bytes of each workload and its largest file (the paper: 2.5 GB,
    /// 32 MB).
    pub workload_bytes: u64,
    pub workload_file_bytes_max: u64,
    /// Figs. 16 and 17: bytes of the served (and of the pending) set, and the foreground's
    /// seconds alone before and after the deduplication run.
    pub interference_bytes: u64,
    pub interference_quiet_seconds: u64,
    /// The idle-started run of Figs. 16 and 17: bytes pending (and served).
    pub idle_bytes: u64,
    /// Fig. 15: bytes of the source tree and rounds of the programs.
    pub programs_bytes: u64,
    pub programs_rounds: u64,
    /// Table 6: releases, and bytes of the first one when they are made from a local tree.
    pub releases: u64,
    pub release_bytes: u64,
}

impl Sizes {
    pub fn of(quick: bool) -> Sizes {
        if quick {
            Sizes {
                chunk_size_files: 16,
                chunk_size_file_bytes: 4 << 20,
                workload_bytes: 64 << 20,
                workload_file_bytes_max: 8 << 20,
                interference_bytes: 256 << 20,
                interference_quiet_seconds: 2,
                idle_bytes: 128 << 20,
                programs_bytes: 24 << 20,
                programs_rounds: 7,
                releases: 6,
                release_bytes: 6 << 20,
            }
        } else {
            Sizes {
                chunk_size_files: 64,
                chunk_size_file_bytes: 8 << 20,
                workload_bytes: 512 << 20,
                workload_file_bytes_max: 32 << 20,
                interference_bytes: 512 << 20,
                interference_quiet_seconds: 5,
                idle_bytes: 256 << 20,
                programs_bytes: 256 << 20,
                programs_rounds: 9,
                releases: 12,
                release_bytes: 64 << 20,
            }
        }
    }
}

/// Everything one run measured.
#[derive(Clone, Debug, Serialize)]
pub struct Paper3Results {
    pub sizes: Sizes,
    /// Fig. 3.
    pub duplicate_probability: f64,
    pub chunk_sizes: Vec<ChunkSizeResult>,
    pub monitor: MonitorCost,
    /// Figs. 9, 10, 11: the high and the low workload.
    pub workloads: Vec<WorkloadResult>,
    /// Table 6, Fig. 14.
    pub releases: ReleasesResult,
    /// Fig. 15.
    pub programs: ProgramsResult,
    /// Figs. 16, 17.
    pub interference: InterferenceResult,
    /// Figs. 16, 17 with the mount's own, idle-started deduplicator.
    pub idle: IdleResult,
    pub seconds: f64,
    pub host_before: HostSnapshot,
    pub host_after: HostSnapshot,
}

/// Runs the measurements and writes their files; returns the paths written.
pub fn run(options: &Paper3Options) -> Result<Vec<PathBuf>> {
    let started = std::time::Instant::now();
    let sizes = Sizes::of(options.quick);
    let work = options.work_dir.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&options.out)
        .map_err(|source| LabError::io(format!("creating {}", options.out.display()), source))?;
    let host_before = HostSnapshot::take();
    let mut log = |line: &str| eprintln!("[{:.0} s] {line}", started.elapsed().as_secs_f64());

    log("paper3: Fig. 3");
    let files = chunk_size::dataset(sizes.chunk_size_files, sizes.chunk_size_file_bytes);
    let mut chunk_sizes = vec![chunk_size::run_chunk_size(&work, &files, 0)?];
    for chunk_bytes in chunk_size::CHUNK_SIZES {
        chunk_sizes.push(chunk_size::run_chunk_size(&work, &files, chunk_bytes)?);
    }
    let monitor = chunk_size::monitor_cost(&work, &files[0])?;
    drop(files);

    let mut workloads = Vec::new();
    for spec in [synthetic::HIGH, synthetic::LOW] {
        workloads.push(mixes::run_workload(
            &work,
            &spec,
            sizes.workload_bytes,
            sizes.workload_file_bytes_max,
            &mut log,
        )?);
    }

    let releases = releases::run(
        &work,
        options.cache_directory.as_deref(),
        sizes.releases as usize,
        sizes.release_bytes,
        &mut log,
    )?;

    log("paper3: Fig. 15");
    let programs = programs::run(&work, sizes.programs_bytes, sizes.programs_rounds)?;

    log("paper3: Figs. 16 and 17");
    let interference = interference::run(
        &work,
        sizes.interference_bytes,
        sizes.workload_file_bytes_max,
        Duration::from_secs(sizes.interference_quiet_seconds),
    )?;
    log("paper3: Figs. 16 and 17, idle-started deduplication");
    let idle = interference::run_idle(
        &work,
        sizes.idle_bytes,
        sizes.workload_file_bytes_max,
        Duration::from_secs(1),
        Duration::from_secs(2),
        IDLE_BURSTS_MAX,
    )?;

    let results = Paper3Results {
        sizes,
        duplicate_probability: chunk_size::DUPLICATE_PROBABILITY,
        chunk_sizes,
        monitor,
        workloads,
        releases,
        programs,
        interference,
        idle,
        seconds: started.elapsed().as_secs_f64(),
        host_before,
        host_after: HostSnapshot::take(),
    };
    figures::write_outputs(&options.out, &results)
}
