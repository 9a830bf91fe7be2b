//! The timed replay of paper 4 §4: a workload through the three techniques of I/O
//! deduplication, each on or off, over the disk model ([`super::disk`]); every request's time
//! is the model's, not this machine's. Replica retrieval and selective duplication run the
//! block engine's own code ([`onecopy_block::replicas`]): its read planner with the `hdd`
//! profile (the copy nearest the head), its ARC of days, and its duplication plan.
//!
//! Per *run* (trace requests of one operation at consecutive sectors, one after the other in
//! the trace: what the block layer merges into one request), in the order of paper 4 Fig. 5:
//!
//! 1. **Cache** (§3.2), per block: a sector-addressed cache (the vanilla system) keyed by
//!    block, or a content-addressed one keyed by content, both with the index's replacement
//!    machinery ([`onecopy_core::index::cache::Cache`], ARC as in the paper) and
//!    write-through: a write enters its key. A read hit costs no disk time.
//! 2. **Dynamic replica retrieval** (§3.3): the blocks of the run that missed are planned
//!    together by [`plan_run`]: for each, its own block, the other blocks holding its content
//!    (the latest [`COPIES_PER_KEY`], as the engine's copy table keeps them) and its selective
//!    duplicates; the planner costs each with the `hdd` profile (nothing to continue where the
//!    head is, else a settle, half a turn and a seek growing with the distance), chooses block
//!    by block, and keeps that plan only when it costs less than reading in place. Without the technique every
//!    block is read in place.
//! 3. **Disk requests**: the chosen blocks that lie next to each other on the disk go as one
//!    request. A read of the block just read (the FIU traces record some reads twice in a
//!    row) is a request of its own, which the drive's buffer serves. All requests of one run are queued at the run's arrival, as the pieces of one
//!    request are: a cache hit in the middle of a run splits it into two requests served back
//!    to back (the second waits only for the hit block to pass under the head), never into two
//!    that arrive apart. Paper 4's per-request disk I/O time is the service time of these
//!    requests.
//! 4. **Selective duplication** (§3.4): every block read from the disk counts for its content
//!    ([`Popularity::note`]); at the start of each idle period the day ends, and the ARC of days
//!    ranks content read on several days first; [`plan_duplication`] takes the most popular
//!    content that fits one region's share of the scratch budget, and it is copied into each of
//!    [`Duplication::copies`] regions spread over the disk ([`region_positions`]), in the order
//!    of its blocks' addresses, so content read together lies together; the previous day's
//!    duplicates are dropped. A duplicate whose content no block holds any more is dropped at
//!    once (its chunk was freed). Duplicates are derived: their writes happen in idle time and
//!    are counted apart, not in foreground time.
//!
//! The content of every block is tracked as writes change it, so a redirected read always
//! finds the content the trace read. Scratch regions are placed at their own sectors of the
//! model without moving the data around them (paper 4 interleaves them with the file system's
//! space; the shift is at most the budget, a small fraction of a seek).

use std::collections::HashMap;

use serde::Serialize;

use onecopy_block::replicas::device::{region_positions, DeviceProfile, DeviceState};
use onecopy_block::replicas::planner::{plan_run, BlockCandidates};
use onecopy_block::replicas::popularity::Popularity;
use onecopy_block::replicas::{plan_duplication, COPIES_PER_KEY};
use onecopy_core::index::cache::{Cache, CacheKey, CachePolicy, EntryCache};

use super::disk::Disk;
use super::workload::{Workload, BLOCK_SECTORS, BUSY_NS, DAY_NS};

/// How reads are cached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheMode {
    None,
    /// Keyed by block address (the vanilla system).
    Sector,
    /// Keyed by content (I/O deduplication).
    Content,
}

/// Selective duplication's settings.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Duplication {
    /// Copies of each popular content (paper 4: ten).
    pub copies: u64,
    /// Blocks of scratch space in all.
    pub budget_blocks: u64,
}

/// Which techniques a replay uses.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Techniques {
    pub cache: CacheMode,
    /// Cache size in 4 KiB pages.
    pub cache_pages: usize,
    pub replica_retrieval: bool,
    pub duplication: Option<Duplication>,
}

/// What one replay measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ReplayOutcome {
    pub reads: u64,
    pub writes: u64,
    pub read_hits: u64,
    pub write_hits: u64,
    /// Read requests served by the disk (after merging consecutive blocks).
    pub disk_reads: u64,
    /// Blocks those requests read.
    pub disk_read_blocks: u64,
    /// Blocks read from another block than their own (replica retrieval).
    pub redirected_reads: u64,
    /// Blocks read from a selective duplicate.
    pub duplicate_reads: u64,
    /// Blocks read from the disk whose content had selective duplicates, chosen or not.
    pub duplicated_blocks_read: u64,
    /// Sum of the service times of disk reads: paper 4's total disk read I/O time (Table 3),
    /// and its parts: seeks, rotational waits, transfers.
    pub read_service_ns: u64,
    pub read_seek_ns: u64,
    pub read_rotation_ns: u64,
    pub read_transfer_ns: u64,
    pub write_service_ns: u64,
    /// Sum of the response times (queue wait included) of all disk reads.
    pub read_response_ns: u64,
    /// Blocks written to scratch space in idle time.
    pub duplicates_written: u64,
    /// Service time of every disk read request, in order (for the distributions of Figs. 10 and 11).
    #[serde(skip)]
    pub read_service_times_ns: Vec<u64>,
}

impl ReplayOutcome {
    /// Median service time of a disk read request, in milliseconds.
    pub fn median_read_ms(&self) -> f64 {
        let mut times = self.read_service_times_ns.clone();
        if times.is_empty() {
            return 0.0;
        }
        times.sort_unstable();
        times[times.len() / 2] as f64 / 1e6
    }

    /// Mean service time of a disk read request, in milliseconds.
    pub fn mean_read_ms(&self) -> f64 {
        self.read_service_ns as f64 / self.disk_reads.max(1) as f64 / 1e6
    }
}

/// A block address or content number as a cache key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct NumberKey(u64);

impl CacheKey for NumberKey {
    fn prefix_u64(&self) -> u64 {
        let mut value = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        value = (value ^ (value >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        value = (value ^ (value >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        value ^ (value >> 31)
    }
}

/// Where the blocks of each content are, as writes change them.
#[derive(Default)]
struct Copies {
    content_of: HashMap<u64, u64>,
    blocks_of: HashMap<u64, Vec<u64>>,
}

impl Copies {
    /// Sets the content of the block at `sector`; returns the content it held, if that is
    /// now held by no block.
    fn set(&mut self, sector: u64, content: u64) -> Option<u64> {
        let old = self.content_of.insert(sector, content);
        if old == Some(content) {
            return None;
        }
        self.blocks_of.entry(content).or_default().push(sector);
        let old = old?;
        let blocks = self
            .blocks_of
            .get_mut(&old)
            .expect("a held content has blocks");
        blocks.retain(|&block| block != sector);
        if blocks.is_empty() {
            self.blocks_of.remove(&old);
            return Some(old);
        }
        None
    }

    /// Up to [`COPIES_PER_KEY`] other blocks holding `content` than `sector`, the latest
    /// first, as the engine's copy table keeps them.
    fn others(&self, content: u64, sector: u64) -> impl Iterator<Item = u64> + '_ {
        self.blocks_of
            .get(&content)
            .into_iter()
            .flat_map(|blocks| blocks.iter().rev())
            .copied()
            .filter(move |&block| block != sector)
            .take(COPIES_PER_KEY)
    }
}

/// Blocks of one run: consecutive blocks of one operation, as the block layer merges them.
#[derive(Default)]
struct Run {
    write: bool,
    arrival_ns: u64,
    /// (sector, content, served by the cache) of each block, consecutive sectors.
    blocks: Vec<(u64, u64, bool)>,
}

impl Run {
    fn continues(&self, write: bool, sector: u64) -> bool {
        self.blocks
            .last()
            .is_some_and(|&(last, _, _)| self.write == write && last + BLOCK_SECTORS == sector)
    }
}

/// Selective duplicates in scratch space.
#[derive(Default)]
struct Scratch {
    /// Duplicate sectors of each content.
    sectors_of: HashMap<u64, Vec<u64>>,
}

/// The state of one replay.
struct Replay<'a> {
    techniques: &'a Techniques,
    copies: Copies,
    scratch: Scratch,
    popularity: Option<Popularity<NumberKey, u64>>,
    disk: Disk,
    outcome: ReplayOutcome,
}

/// The lab's disk as the engine's `hdd` profile sees it: where the head is, and the disk's
/// span as its stroke.
fn planner_view(disk: &Disk) -> DeviceState {
    let device = DeviceState::new(DeviceProfile::Hdd);
    device.set_stroke(super::disk::CAPACITY_SECTORS);
    device.moved_to(disk.head_sector());
    device
}

impl Replay<'_> {
    /// Serves one run (see the module documentation).
    fn dispatch(&mut self, run: &mut Run) {
        if run.blocks.is_empty() {
            return;
        }
        if run.write {
            let first = run.blocks[0].0;
            let sectors = run.blocks.len() as u64 * BLOCK_SECTORS;
            let service = self.disk.write(run.arrival_ns, first, sectors);
            self.outcome.write_service_ns += service.service_ns();
            for &(sector, content, _) in &run.blocks {
                if let Some(freed) = self.copies.set(sector, content) {
                    self.scratch.sectors_of.remove(&freed);
                    if let Some(popularity) = self.popularity.as_mut() {
                        popularity.forget(&NumberKey(freed));
                    }
                }
            }
            run.blocks.clear();
            return;
        }
        let misses: Vec<(u64, u64)> = run
            .blocks
            .iter()
            .filter(|(_, _, hit)| !hit)
            .map(|&(sector, content, _)| (sector, content))
            .collect();
        run.blocks.clear();
        if misses.is_empty() {
            return;
        }
        let candidates: Vec<BlockCandidates> = misses
            .iter()
            .map(|&(sector, content)| {
                let mut positions = vec![sector];
                if self.techniques.replica_retrieval {
                    positions.extend(self.copies.others(content, sector));
                    positions.extend(
                        self.scratch
                            .sectors_of
                            .get(&content)
                            .into_iter()
                            .flatten()
                            .copied(),
                    );
                }
                BlockCandidates {
                    positions,
                    length: BLOCK_SECTORS,
                }
            })
            .collect();
        let plan = plan_run(&planner_view(&self.disk), &candidates);
        let chosen: Vec<u64> = candidates
            .iter()
            .zip(&plan.choices)
            .map(|(block, &choice)| block.positions[choice])
            .collect();
        for ((&(sector, content), &position), &choice) in
            misses.iter().zip(&chosen).zip(&plan.choices)
        {
            self.outcome.redirected_reads += u64::from(choice != 0);
            self.outcome.duplicate_reads += u64::from(
                choice != 0
                    && self
                        .scratch
                        .sectors_of
                        .get(&content)
                        .is_some_and(|sectors| sectors.contains(&position)),
            );
            self.outcome.duplicated_blocks_read +=
                u64::from(self.scratch.sectors_of.contains_key(&content));
            if let Some(popularity) = self.popularity.as_mut() {
                popularity.note(NumberKey(content), sector);
            }
        }
        // Chosen blocks next to each other on the disk go as one request; every request of
        // the run is queued at the run's arrival.
        let mut start = 0;
        while start < chosen.len() {
            let mut end = start + 1;
            while end < chosen.len() && chosen[end] == chosen[end - 1] + BLOCK_SECTORS {
                end += 1;
            }
            let blocks = (end - start) as u64;
            let service = self
                .disk
                .read(run.arrival_ns, chosen[start], blocks * BLOCK_SECTORS);
            let outcome = &mut self.outcome;
            outcome.disk_reads += 1;
            outcome.disk_read_blocks += blocks;
            outcome.read_service_ns += service.service_ns();
            outcome.read_seek_ns += service.seek_ns;
            outcome.read_rotation_ns += service.rotation_ns;
            outcome.read_transfer_ns += service.transfer_ns;
            outcome.read_response_ns += service.end_ns() - run.arrival_ns;
            outcome.read_service_times_ns.push(service.service_ns());
            start = end;
        }
    }
}

/// Replays `workload` with `techniques`.
pub fn replay(workload: &Workload, techniques: &Techniques) -> ReplayOutcome {
    let mut copies = Copies::default();
    for &(sector, content) in &workload.initial {
        copies.set(sector, content);
    }
    let span_sectors = workload
        .requests
        .iter()
        .map(|request| request.sector)
        .chain(workload.initial.iter().map(|(sector, _)| *sector))
        .max()
        .unwrap_or(0)
        + BLOCK_SECTORS;
    let mut cache: Option<Cache<NumberKey>> = (techniques.cache != CacheMode::None
        && techniques.cache_pages > 0)
        .then(|| Cache::with_entries(CachePolicy::Arc, techniques.cache_pages));
    // What the blocks hold as the requests arrive (the disk's map changes when merged writes
    // are served, which is no later than the next request of another kind).
    let mut content_of: HashMap<u64, u64> = copies.content_of.clone();
    let popularity = techniques.duplication.map(|duplication| {
        // The engine's defaults scaled to the budget: the ARC of days remembers four times
        // the content the scratch space holds.
        let keys = (duplication.budget_blocks / duplication.copies.max(1) * 4).max(1) as usize;
        Popularity::new(keys, keys * 4)
    });
    let mut state = Replay {
        techniques,
        copies,
        scratch: Scratch::default(),
        popularity,
        disk: Disk::new(),
        outcome: ReplayOutcome::default(),
    };
    let mut next_idle_ns = BUSY_NS;
    let mut run = Run::default();
    for request in &workload.requests {
        if let Some(duplication) = techniques.duplication {
            while request.arrival_ns >= next_idle_ns {
                state.dispatch(&mut run);
                duplicate(&duplication, span_sectors, &mut state);
                next_idle_ns += DAY_NS;
            }
        }
        let key = NumberKey(match techniques.cache {
            CacheMode::Content => request.content,
            _ => request.sector,
        });
        let mut hit = false;
        if request.write {
            state.outcome.writes += 1;
            if let Some(cache) = cache.as_mut() {
                // Write-through: a sector cache's entry takes the new content (value), a
                // content cache's entry is the content itself.
                match cache.get(&key) {
                    Some(value) if value == request.content => state.outcome.write_hits += 1,
                    Some(_) => {
                        cache.set_value(&key, request.content);
                    }
                    None => cache.insert(&key, request.content),
                }
            }
            content_of.insert(request.sector, request.content);
        } else {
            state.outcome.reads += 1;
            assert_eq!(
                content_of.get(&request.sector),
                Some(&request.content),
                "the replay knows what every block read holds"
            );
            if let Some(cache) = cache.as_mut() {
                match cache.get(&key) {
                    Some(value) if value == request.content => {
                        state.outcome.read_hits += 1;
                        hit = true;
                    }
                    Some(_) => {
                        cache.set_value(&key, request.content);
                    }
                    None => cache.insert(&key, request.content),
                }
            }
        }
        let repeat = !request.write
            && !run.write
            && run
                .blocks
                .last()
                .is_some_and(|&(sector, _, _)| sector == request.sector);
        if repeat {
            // The block just read, asked again: a request of its own after the run, which the
            // drive's buffer serves when it reaches the disk (see [`super::disk`]).
            state.dispatch(&mut run);
            state.dispatch(&mut Run {
                write: false,
                arrival_ns: request.arrival_ns,
                blocks: vec![(request.sector, request.content, hit)],
            });
            continue;
        }
        if !run.continues(request.write, request.sector) {
            state.dispatch(&mut run);
            run.write = request.write;
            run.arrival_ns = request.arrival_ns;
        }
        run.blocks.push((request.sector, request.content, hit));
    }
    state.dispatch(&mut run);
    state.outcome
}

/// Selective duplication in one idle period (see the module documentation).
fn duplicate(duplication: &Duplication, span_sectors: u64, state: &mut Replay<'_>) {
    let Some(popularity) = state.popularity.as_mut() else {
        return;
    };
    popularity.end_day();
    let ranked = popularity.ranked();
    // A source no longer holding its content (overwritten since it was read) is skipped, as
    // the engine skips a source chunk that is no longer live.
    let content_of = &state.copies.content_of;
    let live: Vec<_> = ranked
        .into_iter()
        .filter(|candidate| content_of.get(&candidate.source) == Some(&candidate.key.0))
        .collect();
    let region_blocks = duplication.budget_blocks / duplication.copies;
    let mut chosen = plan_duplication(&live, region_blocks, |_| 1);
    // Written in the order of their sources, so content read together lies together.
    chosen.sort_by_key(|candidate| candidate.source);
    state.scratch.sectors_of.clear();
    let regions = region_positions(span_sectors, duplication.copies as u32);
    for anchor in regions {
        let anchor = anchor - anchor % BLOCK_SECTORS;
        for (index, candidate) in chosen.iter().enumerate() {
            let sector = anchor + index as u64 * BLOCK_SECTORS;
            state
                .scratch
                .sectors_of
                .entry(candidate.key.0)
                .or_default()
                .push(sector);
        }
        state.outcome.duplicates_written += chosen.len() as u64;
        state
            .disk
            .park_at(anchor + chosen.len() as u64 * BLOCK_SECTORS);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paper4::workload::Request;

    fn read(arrival_ns: u64, sector: u64, content: u64) -> Request {
        Request {
            arrival_ns,
            sector,
            write: false,
            content,
        }
    }

    /// Goal: replica retrieval reads the copy nearest the head, and a write that frees the
    /// last block of a content drops its duplicates (they are never read for other content).
    /// Method: content 1 at the start and at the end of the disk; the head near the end; then
    /// content 2 duplicated at idle time, overwritten, and read again under its new content.
    #[test]
    fn nearest_copy_and_freed_duplicates() {
        let far = 400_000_000;
        let workload = Workload {
            name: "test".into(),
            requests: vec![read(0, far + 800, 3), read(1, 0, 1)],
            initial: vec![(0, 1), (far, 1), (far + 800, 3)],
            days: 1,
            contents: 4,
        };
        let plain = Techniques {
            cache: CacheMode::None,
            cache_pages: 0,
            replica_retrieval: false,
            duplication: None,
        };
        let without = replay(&workload, &plain);
        let with = replay(
            &workload,
            &Techniques {
                replica_retrieval: true,
                ..plain
            },
        );
        assert_eq!(with.redirected_reads, 1);
        assert!(with.read_service_ns < without.read_service_ns);

        // Day 1 reads content 2 at sector 0; at idle time it is duplicated; day 2 overwrites
        // sector 0 with content 5 and reads it: the duplicates of content 2 are gone.
        let day2 = DAY_NS + 1;
        let mut workload = Workload {
            name: "test".into(),
            requests: vec![
                read(0, 0, 2),
                read(1, 0, 2),
                Request {
                    arrival_ns: day2,
                    sector: 0,
                    write: true,
                    content: 5,
                },
                read(day2 + 1, 0, 5),
            ],
            initial: vec![(0, 2), (far, 9)],
            days: 2,
            contents: 10,
        };
        let duplicating = Techniques {
            replica_retrieval: true,
            duplication: Some(Duplication {
                copies: 4,
                budget_blocks: 8,
            }),
            ..plain
        };
        let outcome = replay(&workload, &duplicating);
        assert_eq!(outcome.duplicates_written, 4);
        assert_eq!(
            outcome.duplicate_reads, 0,
            "freed content's duplicates are dropped"
        );
        // Without the overwrite, the day-2 read of content 2 from far away uses a duplicate.
        workload.requests = vec![read(0, 0, 2), read(day2, far, 9), read(day2 + 1, 0, 2)];
        let outcome = replay(&workload, &duplicating);
        assert_eq!(outcome.duplicate_reads, 1);
    }
}
