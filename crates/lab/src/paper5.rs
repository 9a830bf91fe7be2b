//! Paper 5 §5 (deduplication in YAFFS2 on flash) on the block engine's flash mode, at the
//! engine's API (no kernel file system, no NBD):
//!
//! - **Figs. 1 and 2**: a file of 10 blocks (Fig. 1) and one of 800 blocks (Fig. 2) written 15
//!   times, each time to new blocks of the volume, as a log-structured file system writes a
//!   file again. Each write is timed alone and with the FLUSH that makes it durable, with
//!   deduplication (flash mode with paper 5's 32-bit CRC-32C, and with xxh3-128) and without
//!   (the same flash-mode engine, the volume marked no-dedup over its whole range, so every
//!   block is stored as it comes).
//! - **Fig. 3**: 15 writes of a 1000-block file with and without deduplication: the space the
//!   copies take (bytes stored in containers) and the total time.
//! - **Cache sizing** (§3.6): the LFU index cache's size against its hit rate and the write
//!   throughput, for repeated random writes of blocks already stored, up to a cache that holds
//!   the whole index (paper 5's "full-fledged in-memory chunk index"). A miss reads the
//!   on-disk index, which pays an injected flash page read ([`INDEX_READ_LATENCY_NS`]).
//!
//! Blocks are 4 KiB (a NAND page of today's flash; paper 5's YAFFS2 used 1 KiB chunks, so its
//! "10 KB, 10 blocks" file is our 10-block file of 40 KiB). Every write of a series is
//! repeated [`Paper5Options::repetitions`] times on a fresh repository and the median of each
//! point is reported, with its minimum and maximum.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use onecopy_block::{BlockConfig, ByteRange, Engine, HintSettings, RuntimeOptions};
use onecopy_core::fingerprint::FingerprintAlgorithm;
use onecopy_core::index::cache::CachePolicy;
use onecopy_core::repository::Repository;

use crate::error::{LabError, Result};
use crate::plot::{AxisScale, BarPanel, BarSeries, Figure, LinePanel, LineSeries, Panel};
use crate::results::{number_cell, write_json, write_text, CsvTable, HostSnapshot};

/// Block size of every volume: one flash page.
pub const BLOCK_BYTES: usize = 4096;
/// Writes of the same file in Figs. 1 to 3 (paper 5: "about 15 times").
pub const WRITES_PER_SERIES: usize = 15;
/// Latency of one on-disk index lookup in the cache-sizing experiment: a NAND page read.
pub const INDEX_READ_LATENCY_NS: u64 = 50_000;
/// Cache sizes of the cache-sizing experiment, as fractions of the index's entries; above 1
/// the cache holds the whole index.
pub const CACHE_FRACTIONS: [f64; 9] = [0.0625, 0.125, 0.25, 0.5, 0.75, 0.9, 0.97, 1.0, 1.25];

/// Time to program one NAND page, for the modelled device time of Figs. 1 to 3: a typical
/// figure for SLC/MLC NAND (200 to 900 µs); program-once media make writing the dear part.
pub const NAND_PAGE_PROGRAM_US: f64 = 200.0;
/// Time to read one NAND page (25 to 50 µs): what a byte comparison of a weak fingerprint's
/// match costs on the device, paper 5's "cheap random read".
pub const NAND_PAGE_READ_US: f64 = 25.0;

const VOLUME_NAME: &str = "flash";

/// Options of `onecopy lab paper5`.
#[derive(Clone, Debug)]
pub struct Paper5Options {
    /// Where results.json, results.csv, summary.md and the SVG figures go.
    pub out: PathBuf,
    /// Fewer repetitions and a smaller index for the cache-sizing experiment.
    pub quick: bool,
    /// Where the temporary repositories are made [default: the system temporary directory].
    pub work_dir: Option<PathBuf>,
    /// Runs of every series of Figs. 1 to 3.
    pub repetitions: usize,
    /// Blocks stored before the cache-sizing experiment: the index's entries.
    pub cache_index_blocks: u64,
    /// Random writes of one timed run at every cache size (as many again warm the cache
    /// first, after one rewrite of every stored block).
    pub cache_writes: u64,
}

impl Paper5Options {
    /// The defaults of a full run (`quick` false) or a quick one.
    pub fn new(out: PathBuf, quick: bool, work_dir: Option<PathBuf>) -> Paper5Options {
        let (repetitions, cache_index_blocks, cache_writes) = if quick {
            (3, 8192, 16384)
        } else {
            (5, 65536, 131072)
        };
        Paper5Options {
            out,
            quick,
            work_dir,
            repetitions,
            cache_index_blocks,
            cache_writes,
        }
    }
}

/// How a series stores blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Flash mode with CRC-32C fingerprints (paper 5's weak 32-bit hash).
    DedupCrc32c,
    /// Flash mode with xxh3-128 fingerprints.
    DedupXxh3,
    /// Flash mode, the volume marked no-dedup: every block stored.
    NoDedup,
}

impl Mode {
    const ALL: [Mode; 3] = [Mode::DedupCrc32c, Mode::DedupXxh3, Mode::NoDedup];

    fn name(self) -> &'static str {
        match self {
            Mode::DedupCrc32c => "dedup, crc32c",
            Mode::DedupXxh3 => "dedup, xxh3",
            Mode::NoDedup => "no dedup",
        }
    }

    fn fingerprint(self) -> FingerprintAlgorithm {
        match self {
            Mode::DedupXxh3 => FingerprintAlgorithm::Xxh3,
            Mode::DedupCrc32c | Mode::NoDedup => FingerprintAlgorithm::Crc32c,
        }
    }
}

/// One write of a file in a series: medians over the repetitions, and their spread.
#[derive(Clone, Debug, Serialize)]
pub struct WritePoint {
    /// 1 for the first write of the file.
    pub write: usize,
    pub write_us: f64,
    pub write_us_min: f64,
    pub write_us_max: f64,
    /// The write and the FLUSH after it.
    pub durable_us: f64,
    pub durable_us_min: f64,
    pub durable_us_max: f64,
    /// Bytes this write added to containers (the same in every repetition).
    pub stored_bytes: u64,
    /// Flash pages this write programmed: its stored bytes in [`BLOCK_BYTES`] pages.
    pub pages_programmed: u64,
    /// Stored chunks this write read to compare bytes with (weak fingerprints).
    pub pages_compared: u64,
    /// The write's measured time plus the modelled NAND time of its programs and compare
    /// reads ([`NAND_PAGE_PROGRAM_US`], [`NAND_PAGE_READ_US`]): what the write would cost on
    /// a raw flash device whose writes are synchronous, as YAFFS2's are.
    pub modelled_us: f64,
}

/// What one write of one repetition measured.
#[derive(Clone, Copy, Debug)]
struct Measured {
    write_us: f64,
    durable_us: f64,
    stored_bytes: u64,
    pages_compared: u64,
}

/// A file written [`WRITES_PER_SERIES`] times in one mode.
#[derive(Clone, Debug, Serialize)]
pub struct Series {
    pub figure: String,
    pub mode: Mode,
    pub file_blocks: u64,
    pub points: Vec<WritePoint>,
    /// Bytes stored in containers after the last write.
    pub stored_bytes_total: u64,
    /// Median total time of the writes and flushes of one repetition.
    pub durable_seconds_total: f64,
    /// Total modelled NAND time of the writes ([`WritePoint::modelled_us`]).
    pub modelled_seconds_total: f64,
    /// Byte comparisons of the chunk store (weak fingerprints) in the last repetition.
    pub chain_comparisons: u64,
}

/// One cache size of the cache-sizing experiment.
#[derive(Clone, Debug, Serialize)]
pub struct CachePoint {
    /// Cache entries as a fraction of the index's entries.
    pub fraction: f64,
    pub cache_entries: u64,
    pub cache_bytes: u64,
    pub writes: u64,
    /// Lookups answered by the cache over the lookups that passed the filter.
    pub hit_rate: f64,
    /// Lookups that read the on-disk index (each paying the injected latency), per run of
    /// `writes`.
    pub disk_lookups: u64,
    pub writes_per_second: f64,
    pub mb_per_second: f64,
}

/// Everything one run measured.
#[derive(Clone, Debug, Serialize)]
pub struct Paper5Results {
    pub quick: bool,
    pub repetitions: usize,
    pub block_bytes: usize,
    pub series: Vec<Series>,
    pub cache_index_blocks: u64,
    pub cache_writes: u64,
    pub index_read_latency_ns: u64,
    pub cache: Vec<CachePoint>,
    pub host_before: HostSnapshot,
    pub host_after: HostSnapshot,
}

/// Deterministic, incompressible bytes of one block, different for every seed.
fn block_bytes(seed: u64, out: &mut [u8]) {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    for word in out.chunks_mut(8) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        word.copy_from_slice(&state.to_le_bytes()[..word.len()]);
    }
}

/// A fresh repository in `work` with a flash-mode block engine; the directory goes when the
/// returned guard drops.
fn fresh_engine(
    work: &Path,
    fingerprint: FingerprintAlgorithm,
    runtime: impl FnOnce(&BlockConfig) -> RuntimeOptions,
) -> Result<(tempfile::TempDir, Arc<Engine>)> {
    let directory = tempfile::tempdir_in(work).map_err(|source| {
        LabError::io(format!("making a directory in {}", work.display()), source)
    })?;
    let repository = Repository::init(&directory.path().join("repository"))
        .map_err(|error| LabError::engine("creating a repository", error))?;
    let engine = open_engine(&repository, fingerprint, runtime)?;
    Ok((directory, engine))
}

fn open_engine(
    repository: &Repository,
    fingerprint: FingerprintAlgorithm,
    runtime: impl FnOnce(&BlockConfig) -> RuntimeOptions,
) -> Result<Arc<Engine>> {
    let storage = repository
        .face_storage("block")
        .map_err(|error| LabError::engine("opening the block face", error))?;
    let config = BlockConfig::flash_with(fingerprint);
    let runtime = runtime(&config);
    Engine::open(storage, Some(config), runtime)
        .map_err(|error| LabError::engine("opening the engine", error))
}

/// One repetition of a series: the file (`file_blocks` blocks) written
/// [`WRITES_PER_SERIES`] times to new blocks; returns (write µs, durable µs, stored bytes)
/// per write and the chunk store's byte comparisons.
fn run_series_once(work: &Path, mode: Mode, file_blocks: u64) -> Result<(Vec<Measured>, u64)> {
    let (_directory, engine) = fresh_engine(work, mode.fingerprint(), RuntimeOptions::for_config)?;
    let volume_bytes = file_blocks * BLOCK_BYTES as u64 * WRITES_PER_SERIES as u64;
    // Only the explicit no-dedup range is honoured: no file system derives hints here.
    let hints = HintSettings {
        explicit: true,
        ..HintSettings::none()
    };
    let volume = engine
        .create_volume(VOLUME_NAME, volume_bytes, BLOCK_BYTES as u32, hints)
        .map_err(|error| LabError::engine("creating the volume", error))?
        .id;
    if mode == Mode::NoDedup {
        engine
            .set_no_dedup(
                VOLUME_NAME,
                ByteRange {
                    start: 0,
                    end: volume_bytes,
                },
                true,
            )
            .map_err(|error| LabError::engine("marking the volume no-dedup", error))?;
    }
    let mut file = vec![0u8; file_blocks as usize * BLOCK_BYTES];
    for (index, block) in file.chunks_mut(BLOCK_BYTES).enumerate() {
        block_bytes(index as u64 + 1, block);
    }
    let file_bytes = file.len() as u64;
    let mut points = Vec::with_capacity(WRITES_PER_SERIES);
    for write in 0..WRITES_PER_SERIES as u64 {
        let before = engine.stats();
        let started = Instant::now();
        engine
            .write(volume, write * file_bytes, &file, false)
            .map_err(|error| LabError::engine("writing the file", error))?;
        let written = started.elapsed();
        engine
            .flush()
            .map_err(|error| LabError::engine("flushing", error))?;
        let durable = started.elapsed();
        let after = engine.stats();
        points.push(Measured {
            write_us: written.as_secs_f64() * 1e6,
            durable_us: durable.as_secs_f64() * 1e6,
            stored_bytes: after.store.live_stored_bytes - before.store.live_stored_bytes,
            pages_compared: after.chunks.chain_comparisons - before.chunks.chain_comparisons,
        });
    }
    let comparisons = engine.stats().chunks.chain_comparisons;
    engine
        .shutdown()
        .map_err(|error| LabError::engine("shutting the engine down", error))?;
    Ok((points, comparisons))
}

/// (median, minimum, maximum) of `values`.
fn spread(values: &mut [f64]) -> (f64, f64, f64) {
    assert!(!values.is_empty(), "a spread of no values");
    values.sort_by(f64::total_cmp);
    (
        values[values.len() / 2],
        values[0],
        values[values.len() - 1],
    )
}

/// The series of one figure, one per mode. Repetitions alternate between the modes, so that
/// drift on a shared machine (and whatever the first run of a process pays) falls on all.
fn run_figure(
    work: &Path,
    figure: &str,
    file_blocks: u64,
    repetitions: usize,
) -> Result<Vec<Series>> {
    let mut runs: Vec<Vec<Vec<Measured>>> = vec![Vec::new(); Mode::ALL.len()];
    let mut comparisons = vec![0; Mode::ALL.len()];
    for repetition in 0..repetitions {
        for offset in 0..Mode::ALL.len() {
            let which = (repetition + offset) % Mode::ALL.len();
            let (points, compared) = run_series_once(work, Mode::ALL[which], file_blocks)?;
            runs[which].push(points);
            comparisons[which] = compared;
        }
    }
    Ok(Mode::ALL
        .iter()
        .zip(runs)
        .zip(comparisons)
        .map(|((&mode, runs), chain_comparisons)| {
            series_from_runs(figure, mode, file_blocks, &runs, chain_comparisons)
        })
        .collect())
}

/// One mode's series from its repetitions' measurements.
fn series_from_runs(
    figure: &str,
    mode: Mode,
    file_blocks: u64,
    runs: &[Vec<Measured>],
    chain_comparisons: u64,
) -> Series {
    let points: Vec<WritePoint> = (0..WRITES_PER_SERIES)
        .map(|write| {
            let (write_us, write_us_min, write_us_max) = spread(
                &mut runs
                    .iter()
                    .map(|run| run[write].write_us)
                    .collect::<Vec<_>>(),
            );
            let (durable_us, durable_us_min, durable_us_max) = spread(
                &mut runs
                    .iter()
                    .map(|run| run[write].durable_us)
                    .collect::<Vec<_>>(),
            );
            let Measured {
                stored_bytes,
                pages_compared,
                ..
            } = runs[0][write];
            let pages_programmed = stored_bytes.div_ceil(BLOCK_BYTES as u64);
            WritePoint {
                write: write + 1,
                write_us,
                write_us_min,
                write_us_max,
                durable_us,
                durable_us_min,
                durable_us_max,
                stored_bytes,
                pages_programmed,
                pages_compared,
                modelled_us: write_us
                    + pages_programmed as f64 * NAND_PAGE_PROGRAM_US
                    + pages_compared as f64 * NAND_PAGE_READ_US,
            }
        })
        .collect();
    let (durable_seconds_total, _, _) = spread(
        &mut runs
            .iter()
            .map(|run| run.iter().map(|point| point.durable_us).sum::<f64>() / 1e6)
            .collect::<Vec<_>>(),
    );
    Series {
        figure: figure.to_string(),
        mode,
        file_blocks,
        stored_bytes_total: points.iter().map(|point| point.stored_bytes).sum(),
        modelled_seconds_total: points.iter().map(|point| point.modelled_us).sum::<f64>() / 1e6,
        points,
        durable_seconds_total,
        chain_comparisons,
    }
}

/// The cache-sizing experiment: `index_blocks` distinct blocks stored, then for every cache
/// size an engine opened with that LFU cache, a rewrite of every stored block and `writes`
/// random rewrites to warm it, then `repetitions` runs of `writes` random rewrites timed
/// (the median run's throughput; hit rate and disk lookups over all of them).
fn run_cache_sizing(
    work: &Path,
    index_blocks: u64,
    writes: u64,
    repetitions: usize,
) -> Result<Vec<CachePoint>> {
    let directory = tempfile::tempdir_in(work).map_err(|source| {
        LabError::io(format!("making a directory in {}", work.display()), source)
    })?;
    let repository = Repository::init(&directory.path().join("repository"))
        .map_err(|error| LabError::engine("creating a repository", error))?;
    let fingerprint = FingerprintAlgorithm::Crc32c;
    let runtime_with = |cache_bytes: u64| {
        move |config: &BlockConfig| {
            let mut runtime = RuntimeOptions::for_config(config);
            runtime.index.cache_bytes = cache_bytes;
            runtime.index.latency_ns = INDEX_READ_LATENCY_NS;
            // The byte comparisons read containers, not a copy kept in memory.
            runtime.content_cache_bytes = 0;
            runtime
        }
    };
    let region_bytes = index_blocks * BLOCK_BYTES as u64;
    let volume = {
        let engine = open_engine(&repository, fingerprint, runtime_with(64 << 20))?;
        let volume = engine
            .create_volume(
                VOLUME_NAME,
                2 * region_bytes,
                BLOCK_BYTES as u32,
                HintSettings::none(),
            )
            .map_err(|error| LabError::engine("creating the volume", error))?
            .id;
        let mut batch = vec![0u8; 256 * BLOCK_BYTES];
        for first in (0..index_blocks).step_by(256) {
            let count = (index_blocks - first).min(256) as usize;
            for (offset, block) in batch[..count * BLOCK_BYTES]
                .chunks_mut(BLOCK_BYTES)
                .enumerate()
            {
                block_bytes(first + offset as u64 + 1, block);
            }
            engine
                .write(
                    volume,
                    first * BLOCK_BYTES as u64,
                    &batch[..count * BLOCK_BYTES],
                    false,
                )
                .map_err(|error| LabError::engine("storing the blocks", error))?;
        }
        engine
            .shutdown()
            .map_err(|error| LabError::engine("shutting the engine down", error))?;
        volume
    };
    let policy = CachePolicy::Lfu;
    let mut points = Vec::new();
    let mut random = 0x2545_F491_4F6C_DD1Du64;
    let mut block = vec![0u8; BLOCK_BYTES];
    for fraction in CACHE_FRACTIONS {
        let cache_entries = ((index_blocks as f64 * fraction).round() as usize).max(1);
        let cache_bytes = policy.memory_bytes_for(cache_entries) as u64;
        let engine = open_engine(&repository, fingerprint, runtime_with(cache_bytes))?;
        // Rewrites `count` stored blocks, each in turn (`in_order`) or chosen at random, to
        // random places of the second half of the volume.
        let mut timed = |engine: &Engine, count: u64, in_order: bool| -> Result<f64> {
            let started = Instant::now();
            for index in 0..count {
                random ^= random << 13;
                random ^= random >> 7;
                random ^= random << 17;
                let seed = if in_order {
                    index % index_blocks
                } else {
                    random % index_blocks
                };
                let target = (random >> 32) % index_blocks;
                block_bytes(seed + 1, &mut block);
                engine
                    .write(
                        volume,
                        region_bytes + target * BLOCK_BYTES as u64,
                        &block,
                        false,
                    )
                    .map_err(|error| LabError::engine("rewriting a stored block", error))?;
            }
            engine
                .flush()
                .map_err(|error| LabError::engine("flushing", error))?;
            Ok(started.elapsed().as_secs_f64())
        };
        // Warm-up: every stored block once (so that no lookup of the timed part is a first
        // one, which misses whatever the cache's size), then as many random rewrites as are
        // timed, so that LFU's counts settle.
        timed(&engine, index_blocks, true)?;
        timed(&engine, writes, false)?;
        let before = engine.stats().index;
        let mut seconds: Vec<f64> = (0..repetitions)
            .map(|_| timed(&engine, writes, false))
            .collect::<Result<_>>()?;
        let (seconds, _, _) = spread(&mut seconds);
        let after = engine.stats().index;
        let hits = after.cache_hits - before.cache_hits;
        let misses = after.cache_misses - before.cache_misses;
        points.push(CachePoint {
            fraction,
            cache_entries: cache_entries as u64,
            cache_bytes,
            writes,
            hit_rate: hits as f64 / (hits + misses).max(1) as f64,
            disk_lookups: (after.disk_lookups - before.disk_lookups) / repetitions as u64,
            writes_per_second: writes as f64 / seconds.max(1e-9),
            mb_per_second: (writes * BLOCK_BYTES as u64) as f64 / 1e6 / seconds.max(1e-9),
        });
        engine
            .shutdown()
            .map_err(|error| LabError::engine("shutting the engine down", error))?;
    }
    Ok(points)
}

/// Runs the experiments and writes their files; returns the paths written.
pub fn run(options: &Paper5Options) -> Result<Vec<PathBuf>> {
    if options.repetitions == 0 || options.cache_index_blocks == 0 || options.cache_writes == 0 {
        return Err(LabError::InvalidOption(
            "repetitions, cache index blocks and cache writes must be positive".into(),
        ));
    }
    let work = options.work_dir.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&options.out)
        .map_err(|source| LabError::io(format!("creating {}", options.out.display()), source))?;
    let host_before = HostSnapshot::take();
    let mut series = Vec::new();
    for (figure, file_blocks) in [("fig1", 10u64), ("fig2", 800), ("fig3", 1000)] {
        series.extend(run_figure(&work, figure, file_blocks, options.repetitions)?);
    }
    let cache = run_cache_sizing(
        &work,
        options.cache_index_blocks,
        options.cache_writes,
        options.repetitions,
    )?;
    let results = Paper5Results {
        quick: options.quick,
        repetitions: options.repetitions,
        block_bytes: BLOCK_BYTES,
        series,
        cache_index_blocks: options.cache_index_blocks,
        cache_writes: options.cache_writes,
        index_read_latency_ns: INDEX_READ_LATENCY_NS,
        cache,
        host_before,
        host_after: HostSnapshot::take(),
    };
    write_outputs(&options.out, &results)
}

fn series_of<'a>(results: &'a Paper5Results, figure: &str) -> Vec<&'a Series> {
    results
        .series
        .iter()
        .filter(|series| series.figure == figure)
        .collect()
}

/// Figs. 1 and 2: time per write, alone, with its FLUSH and modelled on NAND, one line per
/// mode.
fn write_time_figure(title: &str, series: &[&Series]) -> Figure {
    let mut figure = Figure::new(title, 3);
    let panels: [(&str, PointValue); 3] = [
        ("write", |point| point.write_us),
        ("write + FLUSH", |point| point.durable_us),
        ("write, modelled on NAND", |point| point.modelled_us),
    ];
    for (panel_title, value) in panels {
        figure.panels.push(Panel::Lines(LinePanel {
            title: panel_title.into(),
            x_label: "write of the file".into(),
            y_label: "µs".into(),
            x_scale: AxisScale::Linear,
            y_scale: AxisScale::Log10,
            series: series
                .iter()
                .map(|series| LineSeries {
                    name: series.mode.name().into(),
                    points: series
                        .points
                        .iter()
                        .map(|point| (point.write as f64, value(point)))
                        .collect(),
                })
                .collect(),
        }));
    }
    figure
}

fn write_outputs(out: &Path, results: &Paper5Results) -> Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let json = out.join("results.json");
    write_json(&json, results)?;
    written.push(json);

    let mut table = CsvTable::new(&[
        "figure",
        "mode",
        "file_blocks",
        "write",
        "write_us",
        "durable_us",
        "stored_bytes",
        "pages_programmed",
        "pages_compared",
        "modelled_us",
    ]);
    for series in &results.series {
        for point in &series.points {
            table.push(vec![
                series.figure.clone(),
                series.mode.name().to_string(),
                series.file_blocks.to_string(),
                point.write.to_string(),
                number_cell(point.write_us),
                number_cell(point.durable_us),
                point.stored_bytes.to_string(),
                point.pages_programmed.to_string(),
                point.pages_compared.to_string(),
                number_cell(point.modelled_us),
            ]);
        }
    }
    let csv = out.join("results.csv");
    table.write(&csv)?;
    written.push(csv);

    let mut cache_table = CsvTable::new(&[
        "fraction",
        "cache_entries",
        "cache_bytes",
        "hit_rate",
        "disk_lookups",
        "writes_per_second",
    ]);
    for point in &results.cache {
        cache_table.push(vec![
            number_cell(point.fraction),
            point.cache_entries.to_string(),
            point.cache_bytes.to_string(),
            number_cell(point.hit_rate),
            point.disk_lookups.to_string(),
            number_cell(point.writes_per_second),
        ]);
    }
    let cache_csv = out.join("cache.csv");
    cache_table.write(&cache_csv)?;
    written.push(cache_csv);

    for (figure, file_blocks, name) in [
        ("fig1", 10, "paper5-fig1.svg"),
        ("fig2", 800, "paper5-fig2.svg"),
    ] {
        let title = format!(
            "Paper 5 Fig. {}: a file of {file_blocks} blocks written {WRITES_PER_SERIES} times, flash mode",
            &figure[3..]
        );
        let svg = out.join(name);
        write_text(
            &svg,
            &write_time_figure(&title, &series_of(results, figure)).to_svg(),
        )?;
        written.push(svg);
    }

    let fig3 = series_of(results, "fig3");
    let categories: Vec<String> = fig3
        .iter()
        .map(|series| series.mode.name().into())
        .collect();
    let mut figure = Figure::new(
        format!(
            "Paper 5 Fig. 3: {WRITES_PER_SERIES} writes of a 1000-block file, with and without deduplication"
        ),
        2,
    );
    figure.panels.push(Panel::Bars(BarPanel {
        title: "space used".into(),
        x_label: "mode".into(),
        y_label: "MiB stored".into(),
        y_scale: AxisScale::Linear,
        categories: categories.clone(),
        series: vec![BarSeries {
            name: "stored".into(),
            values: fig3
                .iter()
                .map(|series| series.stored_bytes_total as f64 / (1u64 << 20) as f64)
                .collect(),
        }],
        value_labels: true,
    }));
    figure.panels.push(Panel::Bars(BarPanel {
        title: "time of the 15 writes".into(),
        x_label: "mode".into(),
        y_label: "ms".into(),
        y_scale: AxisScale::Linear,
        categories,
        series: vec![
            BarSeries {
                name: "write + FLUSH".into(),
                values: fig3
                    .iter()
                    .map(|series| series.durable_seconds_total * 1e3)
                    .collect(),
            },
            BarSeries {
                name: "modelled on NAND".into(),
                values: fig3
                    .iter()
                    .map(|series| series.modelled_seconds_total * 1e3)
                    .collect(),
            },
        ],
        value_labels: true,
    }));
    let svg = out.join("paper5-fig3.svg");
    write_text(&svg, &figure.to_svg())?;
    written.push(svg);

    let mut figure = Figure::new(
        format!(
            "Paper 5 §3.6: LFU index cache size against hit rate and throughput ({} stored blocks, random rewrites, {} µs per index read)",
            results.cache_index_blocks,
            results.index_read_latency_ns / 1000
        ),
        2,
    );
    let percent = |point: &CachePoint| point.fraction * 100.0;
    figure.panels.push(Panel::Lines(LinePanel {
        title: "hit rate".into(),
        x_label: "cache entries, % of the index".into(),
        y_label: "hits / lookups".into(),
        x_scale: AxisScale::Linear,
        y_scale: AxisScale::Linear,
        series: vec![LineSeries {
            name: "LFU".into(),
            points: results
                .cache
                .iter()
                .map(|point| (percent(point), point.hit_rate))
                .collect(),
        }],
    }));
    figure.panels.push(Panel::Lines(LinePanel {
        title: "write throughput".into(),
        x_label: "cache entries, % of the index".into(),
        y_label: "writes/s".into(),
        x_scale: AxisScale::Linear,
        y_scale: AxisScale::Linear,
        series: vec![LineSeries {
            name: "LFU".into(),
            points: results
                .cache
                .iter()
                .map(|point| (percent(point), point.writes_per_second))
                .collect(),
        }],
    }));
    let svg = out.join("paper5-cache.svg");
    write_text(&svg, &figure.to_svg())?;
    written.push(svg);

    let path = out.join("summary.md");
    write_text(&path, &summary(results))?;
    written.push(path);
    Ok(written)
}

/// The paper's numbers (§5) for the first and the later writes of Figs. 1 and 2, in µs.
const PAPER_FIRST_LATER_US: [(&str, f64, f64); 2] = [("fig1", 380.0, 60.0), ("fig2", 805.0, 395.0)];

/// One number of a [`WritePoint`].
type PointValue = fn(&WritePoint) -> f64;

/// Median of `value` over the writes after the first.
fn later_median(series: &Series, value: PointValue) -> f64 {
    let mut later: Vec<f64> = series.points[1..].iter().map(value).collect();
    spread(&mut later).0
}

fn summary(results: &Paper5Results) -> String {
    let mut text = format!(
        "# Paper 5 on flash mode\n\n{} repetitions per series (medians), {} KiB blocks, \
         engine level; load average {:.2} before, {:.2} after.\n\n\
         ## Figs. 1 and 2: first write and later writes of the same file\n\n\
         Each cell is first write / median of the later writes (factor). Modelled: the \
         measured write plus {} µs per page programmed and {} µs per page read to compare \
         bytes.\n\n\
         | figure | mode | write µs | write + FLUSH µs | modelled on NAND µs | paper µs |\n\
         | --- | --- | --- | --- | --- | --- |\n",
        results.repetitions,
        results.block_bytes / 1024,
        results.host_before.load_average[0],
        results.host_after.load_average[0],
        NAND_PAGE_PROGRAM_US,
        NAND_PAGE_READ_US,
    );
    let cell = |first: f64, later: f64| {
        format!("{first:.0} / {later:.0} ({:.1})", first / later.max(1e-9))
    };
    for (figure, paper_first, paper_later) in PAPER_FIRST_LATER_US {
        for series in series_of(results, figure) {
            let first = &series.points[0];
            text.push_str(&format!(
                "| {} ({} blocks) | {} | {} | {} | {} | {} |\n",
                figure,
                series.file_blocks,
                series.mode.name(),
                cell(
                    first.write_us,
                    later_median(series, |point: &WritePoint| point.write_us)
                ),
                cell(
                    first.durable_us,
                    later_median(series, |point| point.durable_us)
                ),
                cell(
                    first.modelled_us,
                    later_median(series, |point| point.modelled_us)
                ),
                cell(paper_first, paper_later),
            ));
        }
    }
    text.push_str(
        "\n## Fig. 3: 15 writes of a 1000-block file\n\n\
         | mode | MiB stored | write + FLUSH total ms | modelled on NAND total ms | byte comparisons |\n\
         | --- | --- | --- | --- | --- |\n",
    );
    for series in series_of(results, "fig3") {
        text.push_str(&format!(
            "| {} | {:.1} | {:.1} | {:.1} | {} |\n",
            series.mode.name(),
            series.stored_bytes_total as f64 / (1u64 << 20) as f64,
            series.durable_seconds_total * 1e3,
            series.modelled_seconds_total * 1e3,
            series.chain_comparisons,
        ));
    }
    text.push_str(&format!(
        "\n## Cache sizing (§3.6): LFU, {} stored blocks, {} timed random rewrites per size, \
         {} µs per on-disk index read\n\n\
         | cache entries | % of index | hit rate | disk lookups | writes/s | MB/s |\n| --- | --- | --- | --- | --- | --- |\n",
        results.cache_index_blocks,
        results.cache_writes,
        results.index_read_latency_ns / 1000
    ));
    for point in &results.cache {
        text.push_str(&format!(
            "| {} | {:.1} | {:.3} | {} | {:.0} | {:.1} |\n",
            point.cache_entries,
            point.fraction * 100.0,
            point.hit_rate,
            point.disk_lookups,
            point.writes_per_second,
            point.mb_per_second
        ));
    }
    // The whole index's throughput: the best of the caches that hold all of it.
    let whole = results
        .cache
        .iter()
        .filter(|point| point.fraction >= 1.0)
        .map(|point| point.writes_per_second)
        .fold(None, |best: Option<f64>, value| {
            Some(best.map_or(value, |best| best.max(value)))
        });
    if let Some(whole) = whole {
        let matching = results
            .cache
            .iter()
            .find(|point| point.writes_per_second >= 0.95 * whole);
        if let Some(matching) = matching {
            text.push_str(&format!(
                "\nThe smallest cache within 5% of the best throughput of a cache holding the \
                 whole index holds {} entries for an index of {} (paper 5: \"a few hundred less \
                 than the chunk index size\").\n",
                matching.cache_entries, results.cache_index_blocks
            ));
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a tiny run of every experiment writes every file, and its numbers have the shape
    /// the paper's figures have: deduplicated rewrites store nothing, the copies without
    /// deduplication store every block each time, and a cache holding the whole index hits
    /// every lookup. Method: one repetition, 64 stored blocks, in a temporary directory.
    #[test]
    fn a_tiny_run_writes_every_figure() {
        let directory = tempfile::tempdir().unwrap();
        let options = Paper5Options {
            out: directory.path().join("out"),
            quick: true,
            work_dir: Some(directory.path().to_path_buf()),
            repetitions: 1,
            cache_index_blocks: 64,
            cache_writes: 256,
        };
        let written = run(&options).unwrap();
        for name in [
            "results.json",
            "results.csv",
            "cache.csv",
            "paper5-fig1.svg",
            "paper5-fig2.svg",
            "paper5-fig3.svg",
            "paper5-cache.svg",
            "summary.md",
        ] {
            assert!(written.contains(&options.out.join(name)), "{name} written");
        }
        let results: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(options.out.join("results.json")).unwrap(),
        )
        .unwrap();
        let series = results["series"].as_array().unwrap();
        for series in series {
            let blocks = series["file_blocks"].as_u64().unwrap() * BLOCK_BYTES as u64;
            let points = series["points"].as_array().unwrap();
            let first = points[0]["stored_bytes"].as_u64().unwrap();
            assert!(first >= blocks, "the first write stores the file");
            for point in &points[1..] {
                let stored = point["stored_bytes"].as_u64().unwrap();
                if series["mode"] == "no-dedup" {
                    assert!(stored >= blocks, "every copy stored without dedup");
                } else {
                    assert_eq!(stored, 0, "rewrites are deduplicated");
                }
            }
        }
        let cache = results["cache"].as_array().unwrap();
        let whole = cache.last().unwrap();
        assert_eq!(whole["hit_rate"].as_f64().unwrap(), 1.0);
    }
}
