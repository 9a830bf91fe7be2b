//! Paper 4 §4.1 in the lab: a content-addressed read cache against a sector-addressed one,
//! replaying a block trace with content digests ([`crate::trace`]).
//!
//! Two replays per cache size and policy:
//!
//! - *simulated*: both caches use the index's replacement machinery
//!   ([`onecopy_core::index::cache::Cache`], the same code as the engine's caches), keyed by
//!   block address (sector-addressed) or by content digest (content-addressed). A read hits
//!   when its key is cached (and, sector-addressed, holds the content the trace read); a miss
//!   inserts. Writes are write-through: they insert their key, and a write whose key was
//!   cached counts as a write hit (paper 4 Fig. 9). As in paper 4, the first part of the trace
//!   warms the caches and hits are counted over the rest.
//! - *engine*: the same trace through a real [`Engine`] volume whose content cache has the
//!   same number of 4 KiB slots (its budget is the slots' memory with the policy's and the
//!   names' bookkeeping, [`ContentCache::memory_bytes_for`]). Blocks are synthetic content derived from each digest (equal digests give
//!   equal blocks, so the engine deduplicates them exactly as the trace's content repeats);
//!   every address first seen by a read is written before the replay. The engine's cache
//!   fills on read misses only (writes do not enter it), so its hits are read hits.
//!
//! Addresses are renumbered densely in order of first appearance so the engine volume stays
//! small; identity is all a cache sees of an address.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use onecopy_block::cache::ContentCache;
use onecopy_block::{BlockConfig, Engine, HintSettings, RuntimeOptions};
use onecopy_core::error::IoContext;
use onecopy_core::fingerprint::Fingerprint;
use onecopy_core::index::cache::{Cache, CachePolicy, EntryCache};
use onecopy_core::storage::{LocalStorage, Storage};

use crate::error::{LabError, Result};
use crate::plot::{AxisScale, BarPanel, BarSeries, Figure, LinePanel, LineSeries, Panel};
use crate::results::{number_cell, write_json, write_text, CsvTable};
use crate::trace::{accesses_of, Access, Accesses, Operation, TraceRecord};

/// Cache sizes, in blocks, unless chosen otherwise.
pub const CACHE_BLOCKS_DEFAULT: [usize; 7] = [32, 64, 128, 256, 512, 1024, 2048];

/// Hits of one replay over the measured part of the trace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hits {
    pub reads: u64,
    pub read_hits: u64,
    pub writes: u64,
    pub write_hits: u64,
}

/// How a simulated cache is keyed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Addressing {
    Sector,
    Content,
}

fn key(number: u64) -> Fingerprint {
    // The policies hash the first eight bytes: spread the dense number over them.
    let mut bytes = [0u8; 32];
    let mut mixed = number.wrapping_add(0x9E37_79B9_7F4A_7C15);
    mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    bytes[..8].copy_from_slice(&(mixed ^ (mixed >> 31)).to_le_bytes());
    bytes[8..16].copy_from_slice(&number.to_le_bytes());
    Fingerprint(bytes)
}

/// Replays `accesses` through a simulated cache of `entries` blocks; hits are counted from
/// access index `measure_from` on.
pub fn simulate(
    accesses: &[Access],
    policy: CachePolicy,
    entries: usize,
    addressing: Addressing,
    measure_from: usize,
) -> Hits {
    assert!(entries > 0, "a cache of at least one block");
    let mut cache = Cache::with_entries(policy, entries);
    let mut hits = Hits::default();
    for (index, access) in accesses.iter().enumerate() {
        let measured = index >= measure_from;
        let (cache_key, value) = match addressing {
            Addressing::Sector => (key(access.address), access.content),
            Addressing::Content => (key(access.content), access.content),
        };
        let hit = cache.get(&cache_key) == Some(value);
        if !hit {
            cache.insert(&cache_key, value);
        }
        if measured {
            match access.operation {
                Operation::Read => {
                    hits.reads += 1;
                    hits.read_hits += u64::from(hit);
                }
                Operation::Write => {
                    hits.writes += 1;
                    hits.write_hits += u64::from(hit);
                }
            }
        }
    }
    hits
}

/// Replays `accesses` through an engine volume whose content cache has room for about
/// `entries` blocks, under `directory`; returns the engine's read hits over the measured part
/// and the cache's real entry limit.
pub fn replay_engine(
    accesses: &Accesses,
    policy: CachePolicy,
    entries: usize,
    measure_from: usize,
    directory: &Path,
) -> Result<(Hits, u64)> {
    let block_bytes = accesses.block_bytes as usize;
    let scratch = tempfile::tempdir_in(directory)
        .context_io(|| format!("creating a directory in {}", directory.display()))?;
    let storage: Arc<dyn Storage> = Arc::new(
        LocalStorage::create(scratch.path())
            .map_err(|error| LabError::engine("creating engine storage", error))?,
    );
    let runtime = RuntimeOptions {
        content_cache_policy: policy.name().to_string(),
        content_cache_bytes: ContentCache::memory_bytes_for(entries, policy),
        ..RuntimeOptions::default()
    };
    let engine = Engine::open(storage, Some(BlockConfig::default()), runtime)
        .map_err(|error| LabError::engine("opening the replay engine", error))?;
    let size_bytes = accesses.distinct_addresses.max(1) * block_bytes as u64;
    let volume = engine
        .create_volume(
            "trace",
            size_bytes,
            accesses.block_bytes,
            HintSettings::none(),
        )
        .map_err(|error| LabError::engine("creating the replay volume", error))?;
    let engine_error = |error| LabError::engine("replaying the trace", error);
    let mut block = vec![0u8; block_bytes];
    // Addresses first read before any write hold, on the traced disk, what the read returned.
    let mut written = vec![false; accesses.distinct_addresses as usize];
    for access in &accesses.accesses {
        if !written[access.address as usize] {
            written[access.address as usize] = true;
            if access.operation == Operation::Read {
                synthetic_block(access.digest_prefix, &mut block);
                engine
                    .write(
                        volume.id,
                        access.address * block_bytes as u64,
                        &block,
                        false,
                    )
                    .map_err(engine_error)?;
            }
        }
    }
    // Written blocks still in the open container's buffer would be read from it and bypass
    // the cache; flushing writes the buffer out, so every later read goes through the cache.
    engine.flush().map_err(engine_error)?;
    let mut hits = Hits::default();
    let mut before = engine.stats().content_cache;
    for (index, access) in accesses.accesses.iter().enumerate() {
        if index == measure_from {
            before = engine.stats().content_cache;
        }
        let offset = access.address * block_bytes as u64;
        match access.operation {
            Operation::Read => {
                engine
                    .read(volume.id, offset, &mut block)
                    .map_err(engine_error)?;
                if index >= measure_from {
                    hits.reads += 1;
                }
            }
            Operation::Write => {
                synthetic_block(access.digest_prefix, &mut block);
                engine
                    .write(volume.id, offset, &block, true)
                    .map_err(engine_error)?;
                if index >= measure_from {
                    hits.writes += 1;
                }
            }
        }
    }
    let after = engine.stats().content_cache;
    hits.read_hits = after.hits - before.hits;
    engine
        .shutdown()
        .map_err(|error| LabError::engine("closing the replay engine", error))?;
    Ok((hits, after.entries_limit))
}

/// Content determined by a digest prefix, never all zeros.
fn synthetic_block(seed: u64, block: &mut [u8]) {
    let mut state = seed | 1;
    for word in block.chunks_exact_mut(8) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        word.copy_from_slice(&state.to_le_bytes());
    }
}

/// One replay's outcome.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ReplayRow {
    /// `simulated` or `engine`.
    pub replay: String,
    pub addressing: Addressing,
    pub policy: CachePolicy,
    /// Blocks the cache was asked to hold.
    pub cache_blocks: usize,
    /// Blocks it could hold (the engine's is a little smaller).
    pub cache_entries_limit: u64,
    pub hits: Hits,
}

/// What `onecopy lab trace` writes to `results.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TraceResults {
    pub trace: PathBuf,
    pub records: usize,
    pub block_bytes: u32,
    pub accesses: usize,
    pub distinct_addresses: u64,
    pub distinct_contents: u64,
    /// Accesses before this index only warm the caches.
    pub measure_from: usize,
    pub rows: Vec<ReplayRow>,
    /// Paper 4 §2's measures of the same trace.
    pub analysis: crate::trace_analysis::TraceAnalysis,
}

/// Runs every replay and writes results.json, results.csv and `paper4-cache.svg` to
/// `output`, with the workload's duplication measures beside them
/// ([`crate::trace_analysis`]); returns the paths written.
pub fn run_trace_experiment(
    trace: &Path,
    records: &[TraceRecord],
    cache_blocks: &[usize],
    warmup_fraction: f64,
    output: &Path,
) -> Result<Vec<PathBuf>> {
    if !(0.0..1.0).contains(&warmup_fraction) {
        return Err(LabError::InvalidOption(format!(
            "warm-up fraction {warmup_fraction} must be in [0, 1)"
        )));
    }
    if cache_blocks.is_empty() || cache_blocks.contains(&0) {
        return Err(LabError::InvalidOption(
            "cache sizes must be positive".into(),
        ));
    }
    let accesses = accesses_of(records)?;
    let measure_from = (accesses.accesses.len() as f64 * warmup_fraction) as usize;
    let shared_memory = Path::new("/dev/shm");
    let scratch_parent = if shared_memory.is_dir() {
        shared_memory.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let mut rows = Vec::new();
    for &policy in &[CachePolicy::Arc, CachePolicy::Lru] {
        for &blocks in cache_blocks {
            for addressing in [Addressing::Sector, Addressing::Content] {
                rows.push(ReplayRow {
                    replay: "simulated".into(),
                    addressing,
                    policy,
                    cache_blocks: blocks,
                    cache_entries_limit: blocks as u64,
                    hits: simulate(&accesses.accesses, policy, blocks, addressing, measure_from),
                });
            }
            let (hits, limit) =
                replay_engine(&accesses, policy, blocks, measure_from, &scratch_parent)?;
            rows.push(ReplayRow {
                replay: "engine".into(),
                addressing: Addressing::Content,
                policy,
                cache_blocks: blocks,
                cache_entries_limit: limit,
                hits,
            });
        }
    }
    let results = TraceResults {
        trace: trace.to_path_buf(),
        records: records.len(),
        block_bytes: accesses.block_bytes,
        accesses: accesses.accesses.len(),
        distinct_addresses: accesses.distinct_addresses,
        distinct_contents: accesses.distinct_contents,
        measure_from,
        rows,
        analysis: crate::trace_analysis::analyse(trace, records)?,
    };
    let json = output.join("results.json");
    write_json(&json, &results)?;
    let csv = output.join("results.csv");
    results_table(&results.rows).write(&csv)?;
    let svg = output.join("paper4-cache.svg");
    write_text(&svg, &trace_figure(&results).to_svg())?;
    let mut written = vec![json, csv, svg];
    written.extend(crate::trace_analysis::write_analysis(
        &results.analysis,
        output,
    )?);
    Ok(written)
}

fn results_table(rows: &[ReplayRow]) -> CsvTable {
    let mut table = CsvTable::new(&[
        "replay",
        "addressing",
        "policy",
        "cache_blocks",
        "cache_entries_limit",
        "reads",
        "read_hits",
        "read_hit_ratio",
        "writes",
        "write_hits",
    ]);
    for row in rows {
        table.push(vec![
            row.replay.clone(),
            format!("{:?}", row.addressing).to_lowercase(),
            row.policy.name().to_string(),
            row.cache_blocks.to_string(),
            row.cache_entries_limit.to_string(),
            row.hits.reads.to_string(),
            row.hits.read_hits.to_string(),
            number_cell(row.hits.read_hits as f64 / row.hits.reads.max(1) as f64),
            row.hits.writes.to_string(),
            row.hits.write_hits.to_string(),
        ]);
    }
    table
}

/// Paper 4 Fig. 8 (content vs sector, ARC) and Fig. 9 (ARC vs LRU, content) in one figure,
/// plus the engine's measured read hits beside the simulation.
pub fn trace_figure(results: &TraceResults) -> Figure {
    let sizes: Vec<usize> = {
        let mut sizes: Vec<usize> = results.rows.iter().map(|row| row.cache_blocks).collect();
        sizes.sort_unstable();
        sizes.dedup();
        sizes
    };
    let find = |replay: &str, addressing: Addressing, policy: CachePolicy, blocks: usize| {
        results.rows.iter().find(|row| {
            row.replay == replay
                && row.addressing == addressing
                && row.policy == policy
                && row.cache_blocks == blocks
        })
    };
    let read_hits = |replay: &str, addressing, policy| -> Vec<f64> {
        sizes
            .iter()
            .map(|blocks| {
                find(replay, addressing, policy, *blocks)
                    .map_or(f64::NAN, |row| row.hits.read_hits as f64)
            })
            .collect()
    };
    let line = |name: &str, values: Vec<f64>| LineSeries {
        name: name.to_string(),
        points: sizes.iter().map(|size| *size as f64).zip(values).collect(),
    };
    let write_hits = |addressing, policy| -> Vec<f64> {
        sizes
            .iter()
            .map(|blocks| {
                find("simulated", addressing, policy, *blocks)
                    .map_or(f64::NAN, |row| row.hits.write_hits as f64)
            })
            .collect()
    };
    let mut figure = Figure::new(
        format!(
            "Content- vs sector-addressed cache, {} ({} accesses, hits after the first {})",
            results
                .trace
                .file_name()
                .map_or_else(String::new, |name| name.to_string_lossy().into_owned()),
            results.accesses,
            results.measure_from
        ),
        2,
    );
    figure.panel_width = 520;
    figure.panels.push(Panel::Bars(BarPanel {
        title: "Read hits, ARC (paper 4 Fig. 8)".into(),
        x_label: "cache size (4 KiB blocks)".into(),
        y_label: "read hits".into(),
        y_scale: AxisScale::Linear,
        categories: sizes.iter().map(|size| size.to_string()).collect(),
        series: vec![
            BarSeries {
                name: "sector-addressed".into(),
                values: read_hits("simulated", Addressing::Sector, CachePolicy::Arc),
            },
            BarSeries {
                name: "content-addressed".into(),
                values: read_hits("simulated", Addressing::Content, CachePolicy::Arc),
            },
        ],
        value_labels: false,
    }));
    figure.panels.push(Panel::Bars(BarPanel {
        title: "Write hits, ARC".into(),
        x_label: "cache size (4 KiB blocks)".into(),
        y_label: "write hits".into(),
        y_scale: AxisScale::Linear,
        categories: sizes.iter().map(|size| size.to_string()).collect(),
        series: vec![
            BarSeries {
                name: "sector-addressed".into(),
                values: write_hits(Addressing::Sector, CachePolicy::Arc),
            },
            BarSeries {
                name: "content-addressed".into(),
                values: write_hits(Addressing::Content, CachePolicy::Arc),
            },
        ],
        value_labels: false,
    }));
    figure.panels.push(Panel::Lines(LinePanel {
        title: "Content-addressed, ARC vs LRU (Fig. 9)".into(),
        x_label: "cache size (4 KiB blocks)".into(),
        y_label: "hits".into(),
        x_scale: AxisScale::Log10,
        y_scale: AxisScale::Linear,
        series: vec![
            line(
                "read hits, ARC",
                read_hits("simulated", Addressing::Content, CachePolicy::Arc),
            ),
            line(
                "read hits, LRU",
                read_hits("simulated", Addressing::Content, CachePolicy::Lru),
            ),
            line(
                "write hits, ARC",
                write_hits(Addressing::Content, CachePolicy::Arc),
            ),
            line(
                "write hits, LRU",
                write_hits(Addressing::Content, CachePolicy::Lru),
            ),
        ],
    }));
    figure.panels.push(Panel::Lines(LinePanel {
        title: "Engine content cache vs simulation".into(),
        x_label: "cache size (4 KiB blocks)".into(),
        y_label: "read hits".into(),
        x_scale: AxisScale::Log10,
        y_scale: AxisScale::Linear,
        series: vec![
            line(
                "simulated, ARC",
                read_hits("simulated", Addressing::Content, CachePolicy::Arc),
            ),
            line(
                "engine, ARC",
                read_hits("engine", Addressing::Content, CachePolicy::Arc),
            ),
            line(
                "simulated, LRU",
                read_hits("simulated", Addressing::Content, CachePolicy::Lru),
            ),
            line(
                "engine, LRU",
                read_hits("engine", Addressing::Content, CachePolicy::Lru),
            ),
        ],
    }));
    figure
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(operation: Operation, address: u64, content: u64) -> Access {
        Access {
            operation,
            address,
            content,
            digest_prefix: content + 1,
        }
    }

    /// Goal: the same content at two addresses hits a content-addressed cache but not a
    /// sector-addressed one; method: write A at 0, read A at 1 (the clone), read 0 again.
    #[test]
    fn content_addressing_hits_copies() {
        let accesses = [
            access(Operation::Write, 0, 7),
            access(Operation::Read, 1, 7),
            access(Operation::Read, 0, 7),
        ];
        for policy in [CachePolicy::Lru, CachePolicy::Arc] {
            let content = simulate(&accesses, policy, 4, Addressing::Content, 0);
            let sector = simulate(&accesses, policy, 4, Addressing::Sector, 0);
            assert_eq!(content.read_hits, 2, "{policy}");
            assert_eq!(sector.read_hits, 1, "{policy}");
            assert_eq!(content.reads, 2);
            assert_eq!(content.writes, 1);
        }
    }

    /// Goal: a sector-addressed entry whose address was rewritten holds the new content;
    /// method: write A at 0, write B at 0, read B at 0 hits, and warm-up accesses are not counted.
    #[test]
    fn sector_cache_follows_overwrites() {
        let accesses = [
            access(Operation::Write, 0, 1),
            access(Operation::Write, 0, 2),
            access(Operation::Read, 0, 2),
        ];
        let hits = simulate(&accesses, CachePolicy::Lru, 2, Addressing::Sector, 2);
        assert_eq!(
            hits,
            Hits {
                reads: 1,
                read_hits: 1,
                writes: 0,
                write_hits: 0
            }
        );
    }

    /// Goal: the engine's content cache serves a clone's read from memory; method: replay
    /// write A at 0, read 0 (miss, fills), read 1 holding A (hit through deduplication).
    #[test]
    fn engine_replay_hits_through_deduplication() {
        let accesses = Accesses {
            accesses: vec![
                access(Operation::Write, 0, 7),
                access(Operation::Read, 0, 7),
                access(Operation::Read, 1, 7),
            ],
            block_bytes: 4096,
            distinct_addresses: 2,
            distinct_contents: 1,
        };
        let directory = tempfile::tempdir().unwrap();
        let (hits, limit) =
            replay_engine(&accesses, CachePolicy::Arc, 8, 0, directory.path()).unwrap();
        assert!(limit >= 1);
        assert_eq!(hits.reads, 2);
        assert_eq!(hits.read_hits, 1);
    }
}
