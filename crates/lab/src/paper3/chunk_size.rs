//! Fig. 3 (dedup ratio and sequential read throughput against the chunk size) and the I/O
//! monitor's cost per read, both at the engine level (no FUSE).
//!
//! - **Fig. 3**: a synthetic set of files whose 4 KiB blocks repeat earlier ones with a given
//!   probability is written plainly, deduplicated with one chunk size for every file, and
//!   read back in order in 1 MiB requests from a freshly opened engine after the face's
//!   files were dropped from the page cache, so the containers' layout shows. "none" is the
//!   plain layout (rank 0).
//! - **The I/O monitor's cost** on the read path: 4 KiB reads served from the chunk cache,
//!   with and without the monitor's bookkeeping.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use onecopy_core::repository::Repository;
use onecopy_fs::dedup::{self, Yield};
use onecopy_fs::engine::{Caller, NewNode};
use onecopy_fs::node::{Kind, ROOT};
use onecopy_fs::{FsEngine, FsOptions, OpenMode, RuntimeOptions};

use super::bed::evict;
use crate::error::{LabError, Result};

/// One chunk size of Fig. 3.
#[derive(Clone, Debug, Serialize)]
pub struct ChunkSizeResult {
    /// "none" (plain, not deduplicated) or the chunk size.
    pub config: String,
    pub chunk_bytes: u64,
    pub logical_bytes: u64,
    pub stored_bytes: u64,
    pub dedup_ratio: f64,
    pub read_seconds: f64,
    pub read_mb_per_second: f64,
    pub dedup_seconds: f64,
}

/// The monitor's cost per read.
#[derive(Clone, Debug, Serialize)]
pub struct MonitorCost {
    pub reads: u64,
    pub monitored_ns_per_read: f64,
    pub unmonitored_ns_per_read: f64,
}

/// Probability that a run of blocks repeats earlier data.
pub const DUPLICATE_PROBABILITY: f64 = 0.5;
/// The chunk sizes of Fig. 3.
pub const CHUNK_SIZES: [u64; 5] = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20];
const ROOT_CALLER: Caller = Caller { uid: 0, gid: 0 };

fn engine_error(context: &str) -> impl Fn(onecopy_fs::FsError) -> LabError + '_ {
    move |error| LabError::Engine {
        context: context.to_string(),
        detail: error.to_string(),
    }
}

/// The synthetic files: runs of 1 to 64 blocks of 4 KiB; with probability
/// [`DUPLICATE_PROBABILITY`] a run copies an earlier run of the data (of any file, aligned to
/// 4 KiB), otherwise it is random. Longer chunks span more runs, so fewer of them repeat:
/// the dedup ratio falls with the chunk size, as in the paper's Fig. 3. Deterministic.
pub fn dataset(files: u64, file_bytes: u64) -> Vec<Vec<u8>> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut all: Vec<u8> = Vec::with_capacity((files * file_bytes) as usize);
    let blocks_per_file = (file_bytes / 4096) as usize;
    for _ in 0..files {
        let mut blocks = 0;
        while blocks < blocks_per_file {
            let run = ((next() % 64) as usize + 1).min(blocks_per_file - blocks);
            let earlier_blocks = all.len() / 4096;
            let duplicate =
                earlier_blocks > run && (next() % 1000) as f64 / 1000.0 < DUPLICATE_PROBABILITY;
            if duplicate {
                let from = (next() % (earlier_blocks - run) as u64) as usize * 4096;
                all.extend_from_within(from..from + run * 4096);
            } else {
                for _ in 0..run * 512 {
                    all.extend_from_slice(&next().to_le_bytes());
                }
            }
            blocks += run;
        }
    }
    all.chunks(file_bytes as usize)
        .map(<[u8]>::to_vec)
        .collect()
}

fn open(repository: &Path) -> Result<Arc<FsEngine>> {
    let repository = Repository::open(repository).map_err(|error| LabError::Engine {
        context: "opening the repository".into(),
        detail: error.to_string(),
    })?;
    let storage = repository
        .face_storage("fs")
        .map_err(|error| LabError::Engine {
            context: "opening the fs face".into(),
            detail: error.to_string(),
        })?;
    FsEngine::open(storage, RuntimeOptions::default(), OpenMode::ReadWrite)
        .map_err(engine_error("opening the engine"))
}

/// One configuration of Fig. 3: write, deduplicate with `chunk_bytes` (0: not at all),
/// evict, read back in order.
pub fn run_chunk_size(work: &Path, files: &[Vec<u8>], chunk_bytes: u64) -> Result<ChunkSizeResult> {
    let directory = tempfile::tempdir_in(work).map_err(|source| LabError::Io {
        context: format!("making a directory in {}", work.display()),
        source,
    })?;
    let repository = directory.path().join("repository");
    Repository::init(&repository).map_err(|error| LabError::Engine {
        context: "creating a repository".into(),
        detail: error.to_string(),
    })?;
    let engine = open(&repository)?;
    let size = chunk_bytes.max(4096);
    let options = FsOptions {
        min_evaluation_interval_seconds: 0,
        min_evaluation_count: 0,
        idle_seconds: 0,
        big_chunk_bytes: size,
        small_chunk_bytes: size,
        ..FsOptions::default()
    };
    let fs = engine
        .create_file_system("fig3", options, ROOT_CALLER)
        .map_err(engine_error("creating the file system"))?;
    let mut inos = Vec::new();
    for (index, data) in files.iter().enumerate() {
        let node = NewNode {
            kind: Kind::File,
            mode: 0o644,
            rdev: 0,
            target: Vec::new(),
        };
        let ino = engine
            .create_node(fs, ROOT, format!("f{index}").as_bytes(), node, ROOT_CALLER)
            .map_err(engine_error("creating a file"))?
            .ino;
        for (piece, bytes) in data.chunks(1 << 20).enumerate() {
            engine
                .write(fs, ino, (piece as u64) << 20, bytes)
                .map_err(engine_error("writing"))?;
        }
        inos.push(ino);
    }
    let started = Instant::now();
    if chunk_bytes > 0 {
        // No reads yet: every file ranks 2 (small chunks), here of the chosen size.
        let plan = dedup::plan(&engine, fs).map_err(engine_error("planning"))?;
        dedup::execute(&engine, fs, &plan, Yield::Never).map_err(engine_error("deduplicating"))?;
        engine.compact(false).map_err(engine_error("compacting"))?;
    }
    let dedup_seconds = started.elapsed().as_secs_f64();
    let stats = engine.stats(fs).map_err(engine_error("stats"))?;
    engine.shutdown().map_err(engine_error("checkpointing"))?;
    drop(engine);
    evict(&repository.join("fs"))?;
    let engine = open(&repository)?;
    let started = Instant::now();
    let mut read = 0u64;
    for (ino, data) in inos.iter().zip(files) {
        let mut offset = 0u64;
        while offset < data.len() as u64 {
            let bytes = engine
                .read(fs, *ino, offset, 1 << 20)
                .map_err(engine_error("reading"))?;
            if bytes.len() != (data.len() as u64 - offset).min(1 << 20) as usize {
                return Err(LabError::Engine {
                    context: "reading back".into(),
                    detail: "a short read".into(),
                });
            }
            offset += bytes.len() as u64;
            read += bytes.len() as u64;
        }
    }
    let read_seconds = started.elapsed().as_secs_f64();
    Ok(ChunkSizeResult {
        config: if chunk_bytes == 0 {
            "none".into()
        } else {
            onecopy_core::units::format_size(chunk_bytes)
        },
        chunk_bytes,
        logical_bytes: stats.logical_bytes,
        stored_bytes: stats.stored_bytes,
        dedup_ratio: stats.dedup_ratio,
        read_seconds,
        read_mb_per_second: read as f64 / 1e6 / read_seconds.max(1e-9),
        dedup_seconds,
    })
}

/// The monitor's cost: 4 KiB reads of one cached file, with and without it.
pub fn monitor_cost(work: &Path, data: &[u8]) -> Result<MonitorCost> {
    let directory = tempfile::tempdir_in(work).map_err(|source| LabError::Io {
        context: format!("making a directory in {}", work.display()),
        source,
    })?;
    let repository = directory.path().join("repository");
    Repository::init(&repository).map_err(|error| LabError::Engine {
        context: "creating a repository".into(),
        detail: error.to_string(),
    })?;
    let engine = open(&repository)?;
    let fs = engine
        .create_file_system("monitor", FsOptions::default(), ROOT_CALLER)
        .map_err(engine_error("creating the file system"))?;
    let node = NewNode {
        kind: Kind::File,
        mode: 0o644,
        rdev: 0,
        target: Vec::new(),
    };
    let ino = engine
        .create_node(fs, ROOT, b"f", node, ROOT_CALLER)
        .map_err(engine_error("creating a file"))?
        .ino;
    let length = data.len().min(1 << 20);
    engine
        .write(fs, ino, 0, &data[..length])
        .map_err(engine_error("writing"))?;
    let reads = 200_000u64;
    let blocks = (length / 4096).max(1) as u64;
    let time = |monitored: bool| -> Result<f64> {
        let started = Instant::now();
        for index in 0..reads {
            let offset = (index * 7919 % blocks) * 4096;
            let result = if monitored {
                engine.read(fs, ino, offset, 4096)
            } else {
                engine.read_unmonitored(fs, ino, offset, 4096)
            };
            result.map_err(engine_error("reading"))?;
        }
        Ok(started.elapsed().as_nanos() as f64 / reads as f64)
    };
    // Warm the chunk cache, then alternate so that drift on a shared machine hits both.
    time(false)?;
    let mut monitored = Vec::new();
    let mut unmonitored = Vec::new();
    for _ in 0..3 {
        unmonitored.push(time(false)?);
        monitored.push(time(true)?);
    }
    let median = |values: &mut Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    Ok(MonitorCost {
        reads,
        monitored_ns_per_read: median(&mut monitored),
        unmonitored_ns_per_read: median(&mut unmonitored),
    })
}
