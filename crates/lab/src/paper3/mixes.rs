//! Figs. 9, 10 and 11: the synthetic workloads of Table 4 read with 90% to 10% of their
//! files sequential, under four systems.
//!
//! The systems are file systems of the face made with different settings, each in its own
//! repository and mounted through FUSE:
//!
//! - **none**: written, never deduplicated (the plain layout, rank 0);
//! - **all-big** and **all-small**: big and small chunk both 256 KiB, or both 4 KiB, so that
//!   every file is cut the one way whatever its rank; deduplicated right after writing, with
//!   no reads (the paper: "these methods do not require runtime read characteristics");
//! - **selective**: big 256 KiB, small 4 KiB; the workload is read once in its mix (each file
//!   sequentially or randomly) so that the I/O monitor sees it, then the ranker and the
//!   deduplicator run (`onecopy fs dedup`); one file system per mix, since the mix decides
//!   the ranks.
//!
//! After deduplication (and compaction of the freed plain copies) each system is remounted
//! cold ([`MountedFs::cold_remount`]) and every file is read in the mix: a sequential file
//! whole, in 1 MiB `read`s; a random file by 4 KiB `pread`s at random blocks, a quarter of
//! its blocks (at least one). A file's response time runs from its `open` to its last read.
//! The sequential files and the random offsets are the same for every system.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use onecopy_fs::dedup::{self, DedupReport, Yield};
use onecopy_fs::node::Chunking;
use onecopy_fs::FsOptions;

use super::bed::MountedFs;
use super::synthetic::{self, Random, WorkloadSpec, BLOCK_BYTES};
use crate::error::{LabError, Result};
use crate::mount::sync_file_system;

/// Percent of the files read sequentially, as in Figs. 9 and 10 (a) to (e).
pub const MIXES: [u32; 5] = [90, 75, 50, 25, 10];
/// The four systems, in the order of the figures.
pub const SYSTEMS: [&str; 4] = ["none", "all-big", "all-small", "selective"];
/// Big chunk of the paper's evaluation.
pub const BIG_CHUNK_BYTES: u64 = 256 << 10;
/// Small chunk of the paper's evaluation.
pub const SMALL_CHUNK_BYTES: u64 = 4 << 10;
/// Bytes of one `read` of a sequential file.
const SEQUENTIAL_READ_BYTES: usize = 1 << 20;
/// Files per directory of the written tree.
const FILES_PER_DIRECTORY: usize = 64;

/// One system read in one mix.
#[derive(Clone, Debug, Serialize)]
pub struct MixRun {
    pub system: String,
    pub sequential_percent: u32,
    pub logical_bytes: u64,
    pub stored_bytes: u64,
    /// logical / stored.
    pub dedup_ratio: f64,
    /// 1 - stored / logical (the paper's "deduplication ratio").
    pub savings: f64,
    /// Files per rank after deduplication (0 to 3).
    pub rank_files: [u64; 4],
    /// Bytes of the files the face cut big (`Chunking::Big`: selective's rank-1 files above
    /// the small-file bound; none in the other systems, which rank nothing).
    pub big_cut_bytes: u64,
    /// The savings of an ideal deduplicator that keeps the files cut big whole, in 256 KiB
    /// chunks (distinct by content), and stores every 4 KiB block of the others once
    /// against all the data: the most a system that keeps those files contiguous can save.
    pub contiguous_bound_savings: f64,
    pub dedup_seconds: f64,
    /// Response time of every file, in milliseconds, in file order.
    pub file_latencies_ms: Vec<f64>,
    /// Which files were read sequentially (same order).
    pub sequential: Vec<bool>,
    /// Bytes of the sequentially read files and the sum of their response times.
    pub sequential_bytes: u64,
    pub sequential_seconds: f64,
    pub sequential_mb_per_second: f64,
}

/// One workload of Table 4 under every system and mix.
#[derive(Clone, Debug, Serialize)]
pub struct WorkloadResult {
    pub spec: WorkloadSpec,
    pub files: u64,
    pub bytes: u64,
    pub file_bytes_max: u64,
    /// Savings of an ideal deduplicator with 256 KiB and 4 KiB chunks (in memory).
    pub ideal_big_savings: f64,
    pub ideal_small_savings: f64,
    pub runs: Vec<MixRun>,
}

impl WorkloadResult {
    /// The run of `system` in mix `percent`.
    pub fn run(&self, system: &str, percent: u32) -> Option<&MixRun> {
        self.runs
            .iter()
            .find(|run| run.system == system && run.sequential_percent == percent)
    }
}

fn options_of(system: &str) -> FsOptions {
    let (big, small, count) = match system {
        "all-big" => (BIG_CHUNK_BYTES, BIG_CHUNK_BYTES, 0),
        "all-small" => (SMALL_CHUNK_BYTES, SMALL_CHUNK_BYTES, 0),
        // One reading in the mix is enough evidence here (the paper's 100 reads stand for
        // days of use).
        _ => (BIG_CHUNK_BYTES, SMALL_CHUNK_BYTES, 1),
    };
    FsOptions {
        min_evaluation_interval_seconds: 0,
        min_evaluation_count: count,
        idle_seconds: 0,
        big_chunk_bytes: big,
        small_chunk_bytes: small,
        ..FsOptions::default()
    }
}

pub fn file_path(root: &Path, index: usize) -> PathBuf {
    root.join(format!("d{:03}", index / FILES_PER_DIRECTORY))
        .join(format!("f{index:05}"))
}

/// Writes the data set under `root` and syncs the file system.
pub fn write_files(root: &Path, files: &[Vec<u8>]) -> Result<()> {
    for (index, data) in files.iter().enumerate() {
        let path = file_path(root, index);
        if index % FILES_PER_DIRECTORY == 0 {
            let parent = path.parent().expect("a file has a directory");
            std::fs::create_dir_all(parent)
                .map_err(|source| LabError::io(format!("creating {}", parent.display()), source))?;
        }
        std::fs::write(&path, data)
            .map_err(|source| LabError::io(format!("writing {}", path.display()), source))?;
    }
    sync_file_system(root)
}

/// Which files a mix reads sequentially: the first `percent` of one fixed shuffle, so that
/// the sequential set of a mix contains those of the mixes below it.
pub fn sequential_set(files: usize, percent: u32) -> Vec<bool> {
    let order = shuffled(files, 0x0005_E0E0);
    let count = (files * percent as usize).div_ceil(100);
    let mut sequential = vec![false; files];
    for &index in &order[..count] {
        sequential[index] = true;
    }
    sequential
}

/// A fixed shuffle of `0..count`.
fn shuffled(count: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..count).collect();
    let mut random = Random::new(seed);
    for index in (1..order.len()).rev() {
        order.swap(index, random.below(index as u64 + 1) as usize);
    }
    order
}

/// Reads every file in its way, in one fixed shuffled order (in the order of writing, the
/// disk's read-ahead of one file would bring in the next); returns each file's response
/// time in milliseconds, in file order.
pub fn read_files(root: &Path, files: &[Vec<u8>], sequential: &[bool]) -> Result<Vec<f64>> {
    let mut buffer = vec![0u8; SEQUENTIAL_READ_BYTES];
    let mut latencies = vec![0.0; files.len()];
    for index in shuffled(files.len(), 0x0DE2) {
        let data = &files[index];
        let path = file_path(root, index);
        let io_error = |source| LabError::io(format!("reading {}", path.display()), source);
        let started = Instant::now();
        let mut file = File::open(&path).map_err(io_error)?;
        if sequential[index] {
            let mut total = 0;
            loop {
                let read = file.read(&mut buffer).map_err(io_error)?;
                if read == 0 {
                    break;
                }
                total += read;
            }
            if total != data.len() {
                return Err(LabError::engine(
                    format!("reading {}", path.display()),
                    format!("{total} bytes read of {}", data.len()),
                ));
            }
        } else {
            let blocks = data.len() as u64 / BLOCK_BYTES;
            let mut random = Random::new(0xB10C ^ index as u64);
            for _ in 0..(blocks / 4).max(1) {
                let block = random.below(blocks);
                file.read_exact_at(&mut buffer[..BLOCK_BYTES as usize], block * BLOCK_BYTES)
                    .map_err(io_error)?;
            }
        }
        latencies[index] = started.elapsed().as_secs_f64() * 1e3;
    }
    Ok(latencies)
}

/// Ranks and deduplicates everything now, as `onecopy fs dedup` does, then compacts the
/// freed plain copies away; returns the seconds taken.
pub fn deduplicate(bed: &MountedFs) -> Result<f64> {
    let started = Instant::now();
    deduplicate_with_report(bed)?;
    Ok(started.elapsed().as_secs_f64())
}

/// [`deduplicate`], returning what the run did.
pub fn deduplicate_with_report(bed: &MountedFs) -> Result<DedupReport> {
    let engine = bed.engine();
    let plan = dedup::plan(engine, bed.fs())
        .map_err(|error| LabError::engine("planning deduplication", error))?;
    let report = dedup::execute(engine, bed.fs(), &plan, Yield::Never)
        .map_err(|error| LabError::engine("deduplicating", error))?;
    engine
        .compact(false)
        .map_err(|error| LabError::engine("compacting", error))?;
    Ok(report)
}

fn measured_run(
    bed: &mut MountedFs,
    system: &str,
    percent: u32,
    files: &[Vec<u8>],
    dedup_seconds: f64,
) -> Result<MixRun> {
    let stats = bed
        .engine()
        .stats(bed.fs())
        .map_err(|error| LabError::engine("reading file system statistics", error))?;
    let sequential = sequential_set(files.len(), percent);
    bed.cold_remount()?;
    let file_latencies_ms = read_files(bed.mount_point(), files, &sequential)?;
    let mut sequential_bytes = 0;
    let mut sequential_seconds = 0.0;
    for ((data, latency), is_sequential) in files.iter().zip(&file_latencies_ms).zip(&sequential) {
        if *is_sequential {
            sequential_bytes += data.len() as u64;
            sequential_seconds += latency / 1e3;
        }
    }
    let savings = if stats.logical_bytes == 0 {
        0.0
    } else {
        1.0 - stats.stored_bytes as f64 / stats.logical_bytes as f64
    };
    let cut_big = files_cut_big(bed, files.len())?;
    let big_cut_bytes = files
        .iter()
        .zip(&cut_big)
        .filter(|(_, big)| **big)
        .map(|(data, _)| data.len() as u64)
        .sum();
    Ok(MixRun {
        system: system.to_string(),
        sequential_percent: percent,
        logical_bytes: stats.logical_bytes,
        stored_bytes: stats.stored_bytes,
        dedup_ratio: stats.dedup_ratio,
        savings,
        rank_files: std::array::from_fn(|rank| stats.ranks[rank].files),
        big_cut_bytes,
        contiguous_bound_savings: contiguous_bound(files, &cut_big),
        dedup_seconds,
        file_latencies_ms,
        sequential,
        sequential_bytes,
        sequential_seconds,
        sequential_mb_per_second: sequential_bytes as f64 / 1e6 / sequential_seconds.max(1e-9),
    })
}

/// Which of the data set's files the face cut big (by their paths under the mount).
fn files_cut_big(bed: &MountedFs, count: usize) -> Result<Vec<bool>> {
    let ranks = bed
        .engine()
        .ranks(bed.fs())
        .map_err(|error| LabError::engine("reading ranks", error))?;
    let big: std::collections::HashSet<String> = ranks
        .into_iter()
        .filter(|file| file.chunking == Some(Chunking::Big))
        .map(|file| file.path)
        .collect();
    Ok((0..count)
        .map(|index| {
            let path = file_path(Path::new("/"), index);
            big.contains(&path.to_string_lossy().into_owned())
        })
        .collect())
}

/// See [`MixRun::contiguous_bound_savings`]: the files marked in `cut_big` first, whole in
/// big chunks, then the others block by block.
pub fn contiguous_bound(files: &[Vec<u8>], cut_big: &[bool]) -> f64 {
    let mut big_chunks = std::collections::HashSet::new();
    let mut blocks = std::collections::HashSet::new();
    let (mut logical, mut stored) = (0u64, 0u64);
    for (data, _) in files.iter().zip(cut_big).filter(|(_, big)| **big) {
        logical += data.len() as u64;
        for chunk in data.chunks(BIG_CHUNK_BYTES as usize) {
            if big_chunks.insert(blake3::hash(chunk)) {
                stored += chunk.len() as u64;
                for block in chunk.chunks(SMALL_CHUNK_BYTES as usize) {
                    blocks.insert(blake3::hash(block));
                }
            }
        }
    }
    for (data, _) in files.iter().zip(cut_big).filter(|(_, big)| !**big) {
        logical += data.len() as u64;
        for block in data.chunks(SMALL_CHUNK_BYTES as usize) {
            if blocks.insert(blake3::hash(block)) {
                stored += block.len() as u64;
            }
        }
    }
    if logical == 0 {
        0.0
    } else {
        1.0 - stored as f64 / logical as f64
    }
}

/// Runs one workload under every system and mix; `log` receives a line per step.
pub fn run_workload(
    work: &Path,
    spec: &WorkloadSpec,
    total_bytes: u64,
    file_bytes_max: u64,
    log: &mut dyn FnMut(&str),
) -> Result<WorkloadResult> {
    let files = synthetic::generate(spec, total_bytes, file_bytes_max);
    let mut result = WorkloadResult {
        spec: *spec,
        files: files.len() as u64,
        bytes: files.iter().map(|file| file.len() as u64).sum(),
        file_bytes_max,
        ideal_big_savings: synthetic::savings(&files, BIG_CHUNK_BYTES as usize),
        ideal_small_savings: synthetic::savings(&files, SMALL_CHUNK_BYTES as usize),
        runs: Vec::new(),
    };
    for system in ["none", "all-big", "all-small"] {
        log(&format!("paper3: {} workload, {system}", spec.name));
        let mut bed = MountedFs::create(work, options_of(system))?;
        write_files(bed.mount_point(), &files)?;
        let dedup_seconds = if system == "none" {
            0.0
        } else {
            deduplicate(&bed)?
        };
        for percent in MIXES {
            let run = measured_run(&mut bed, system, percent, &files, dedup_seconds)?;
            result.runs.push(run);
        }
        bed.teardown()?;
    }
    for percent in MIXES {
        log(&format!(
            "paper3: {} workload, selective, {percent}% sequential",
            spec.name
        ));
        let mut bed = MountedFs::create(work, options_of("selective"))?;
        write_files(bed.mount_point(), &files)?;
        read_files(
            bed.mount_point(),
            &files,
            &sequential_set(files.len(), percent),
        )?;
        let dedup_seconds = deduplicate(&bed)?;
        let run = measured_run(&mut bed, "selective", percent, &files, dedup_seconds)?;
        result.runs.push(run);
        bed.teardown()?;
    }
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the contiguity bound stores whole big chunks once and every other block once
    /// against all data. Method: a big file, its copy cut small, a file of its blocks
    /// shifted by one block, cut big.
    #[test]
    fn contiguous_bound_keeps_big_files_whole() {
        let block = |seed: u8| vec![seed; SMALL_CHUNK_BYTES as usize];
        let big: Vec<u8> = (0..64u8).flat_map(block).collect();
        let mut shifted = block(200);
        shifted.extend_from_slice(&big[..big.len() - SMALL_CHUNK_BYTES as usize]);
        let files = vec![big.clone(), big.clone(), shifted];
        // The copy, cut small, finds every block; the shifted file is stored whole.
        let bound = contiguous_bound(&files, &[true, false, true]);
        let logical = 3.0 * big.len() as f64;
        assert!((bound - (1.0 - 2.0 * big.len() as f64 / logical)).abs() < 1e-9);
        // Cut small, the shifted file adds one block.
        let bound = contiguous_bound(&files, &[true, false, false]);
        let stored = big.len() as f64 + SMALL_CHUNK_BYTES as f64;
        assert!((bound - (1.0 - stored / logical)).abs() < 1e-9);
    }

    /// Goal: the sequential sets have the mix's share of the files and nest (the 10% set is
    /// inside the 90% one). Method: build every mix's set for 1,000 files.
    #[test]
    fn sequential_sets_have_their_share_and_nest() {
        let sets: Vec<Vec<bool>> = MIXES.iter().map(|&p| sequential_set(1000, p)).collect();
        for (set, percent) in sets.iter().zip(MIXES) {
            assert_eq!(set.iter().filter(|s| **s).count(), percent as usize * 10);
        }
        for pair in sets.windows(2) {
            assert!(pair[1]
                .iter()
                .zip(&pair[0])
                .all(|(low, high)| !low || *high));
        }
    }
}
