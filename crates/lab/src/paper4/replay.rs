//! The timed replay of paper 4 §4: a workload through the three techniques of I/O
//! deduplication, each on or off, over the disk model ([`super::disk`]); every request's time
//! is the model's, not this machine's.
//!
//! Per request, in the order of paper 4 Fig. 5:
//!
//! 1. **Cache** (§3.2): a sector-addressed cache (the vanilla system) keyed by block, or a
//!    content-addressed one keyed by content, both with the index's replacement machinery
//!    ([`onecopy_core::index::cache::Cache`], ARC as in the paper) and write-through: a write
//!    enters its key. A read hit costs no disk time.
//! 2. **Merging**: blocks that miss the cache and follow each other on the disk (same
//!    operation, consecutive sectors, consecutive in the trace) go to the disk as one request,
//!    as the block layer's scheduler merges them; the FIU traces record 4 KiB pages below the
//!    page cache, before that merging. Paper 4's per-request disk I/O time is the service
//!    time of these requests.
//! 3. **Dynamic replica retrieval** (§3.3): a read request of one block goes to the copy of
//!    its content that costs least from where the head is (seek and rotation in the model):
//!    its own block, another block holding the same content, or a selective duplicate. A
//!    request of several blocks is read in place, since the other copies of its blocks are
//!    not next to each other; writes always go to their blocks.
//! 4. **Selective duplication** (§3.4): at the start of each idle period the most popular
//!    content of the days so far (reads counted per day, earlier days weighing half as much
//!    each day back, as paper 4 extends ARC's frequency to days) is copied
//!    [`Duplication::copies`] times into scratch regions spread evenly over the disk, within
//!    [`Duplication::budget_blocks`]; the previous day's duplicates are dropped. A duplicate
//!    whose content no block holds any more is dropped at once (its chunk was freed), and
//!    duplicates are never the only copy: they are derived data, and losing them loses
//!    nothing. Their writes happen in idle time and are counted apart, not in foreground time.
//!
//! The content of every block is tracked as writes change it, so a redirected read always
//! finds the content the trace read. Scratch regions are placed at their own sectors of the
//! model without moving the data around them (paper 4 interleaves them with the file system's
//! space; the shift is at most the budget, a small fraction of a seek).

use std::collections::HashMap;

use serde::Serialize;

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
    /// Disk reads served from another block than their own (replica retrieval).
    pub redirected_reads: u64,
    /// Disk reads served from a selective duplicate.
    pub duplicate_reads: u64,
    /// Sum of the service times of disk reads: paper 4's total disk read I/O time (Table 3).
    pub read_service_ns: u64,
    pub write_service_ns: u64,
    /// Sum of the response times (queue wait included) of all reads, hits count zero.
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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
        self.blocks_of.entry(content).or_default().push(sector);
        let old = old.filter(|&old| old != content)?;
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
}

/// Blocks waiting to go to the disk as one request: consecutive blocks of one operation, as
/// the block layer's scheduler merges them.
#[derive(Default)]
struct Merged {
    write: bool,
    arrival_ns: u64,
    /// (sector, content) of each block, consecutive sectors.
    blocks: Vec<(u64, u64)>,
}

impl Merged {
    fn continues(&self, write: bool, sector: u64) -> bool {
        self.blocks
            .last()
            .is_some_and(|&(last, _)| self.write == write && last + BLOCK_SECTORS == sector)
    }
}

/// The state of one replay.
struct Replay<'a> {
    techniques: &'a Techniques,
    copies: Copies,
    scratch: Scratch,
    /// Read requests served by the disk since the last idle period, by their blocks'
    /// contents: selective duplication's popularity of the day.
    today: HashMap<Vec<u64>, u64>,
    disk: Disk,
    outcome: ReplayOutcome,
}

/// Selective duplicates in scratch space.
#[derive(Default)]
struct Scratch {
    content_of: HashMap<u64, u64>,
    sectors_of: HashMap<u64, Vec<u64>>,
    /// First sector of each duplicated run, by the content of its first block.
    runs_of: HashMap<u64, Vec<u64>>,
}

impl Scratch {
    fn clear(&mut self) {
        self.content_of.clear();
        self.sectors_of.clear();
        self.runs_of.clear();
    }

    /// Drops every duplicate block of `content` (no block of the disk holds it any more).
    fn drop_content(&mut self, content: u64) {
        for sector in self.sectors_of.remove(&content).unwrap_or_default() {
            self.content_of.remove(&sector);
        }
    }
}

/// True when the blocks from `start` on hold `blocks`' contents, in `content_of`.
fn holds_run(content_of: &HashMap<u64, u64>, start: u64, blocks: &[(u64, u64)]) -> bool {
    blocks.iter().enumerate().all(|(index, &(_, content))| {
        content_of.get(&(start + index as u64 * BLOCK_SECTORS)) == Some(&content)
    })
}

impl Replay<'_> {
    /// Serves one merged request (see the module documentation for where reads go).
    fn dispatch(&mut self, merged: &mut Merged) {
        let Some(&(first, content)) = merged.blocks.first() else {
            return;
        };
        let sectors = merged.blocks.len() as u64 * BLOCK_SECTORS;
        if merged.write {
            let service = self.disk.serve(merged.arrival_ns, first, sectors);
            self.outcome.write_service_ns += service.service_ns();
            for &(sector, content) in &merged.blocks {
                if let Some(freed) = self.copies.set(sector, content) {
                    self.scratch.drop_content(freed);
                }
            }
            merged.blocks.clear();
            return;
        }
        let start_ns = self.disk.start_for(merged.arrival_ns);
        let mut chosen = (self.disk.cost(start_ns, first, sectors), first);
        let mut from_duplicate = false;
        if self.techniques.replica_retrieval {
            // Every place that holds the request's blocks in order: other copies of the run
            // on the disk, and duplicates of it in scratch space.
            let others = self.copies.blocks_of.get(&content).into_iter().flatten();
            for &start in others {
                if start != first && holds_run(&self.copies.content_of, start, &merged.blocks) {
                    let cost = self.disk.cost(start_ns, start, sectors);
                    if cost.service_ns() < chosen.0.service_ns() {
                        chosen = (cost, start);
                    }
                }
            }
            for &start in self.scratch.runs_of.get(&content).into_iter().flatten() {
                if holds_run(&self.scratch.content_of, start, &merged.blocks) {
                    let cost = self.disk.cost(start_ns, start, sectors);
                    if cost.service_ns() < chosen.0.service_ns() {
                        chosen = (cost, start);
                        from_duplicate = true;
                    }
                }
            }
        }
        if self.techniques.duplication.is_some() {
            let contents = merged.blocks.iter().map(|&(_, content)| content).collect();
            *self.today.entry(contents).or_default() += 1;
        }
        let service = self.disk.serve(merged.arrival_ns, chosen.1, sectors);
        assert_eq!(service, chosen.0, "the disk serves what was costed");
        let outcome = &mut self.outcome;
        outcome.disk_reads += 1;
        outcome.disk_read_blocks += merged.blocks.len() as u64;
        outcome.redirected_reads += u64::from(chosen.1 != first);
        outcome.duplicate_reads += u64::from(from_duplicate && chosen.1 != first);
        outcome.read_service_ns += service.service_ns();
        outcome.read_response_ns += service.end_ns() - merged.arrival_ns;
        outcome.read_service_times_ns.push(service.service_ns());
        merged.blocks.clear();
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
    let mut state = Replay {
        techniques,
        copies,
        scratch: Scratch::default(),
        today: HashMap::new(),
        disk: Disk::new(),
        outcome: ReplayOutcome::default(),
    };
    let mut popularity: HashMap<Vec<u64>, f64> = HashMap::new();
    let mut next_idle_ns = BUSY_NS;
    let mut merged = Merged::default();
    for request in &workload.requests {
        if let Some(duplication) = techniques.duplication {
            while request.arrival_ns >= next_idle_ns {
                state.dispatch(&mut merged);
                duplicate(&duplication, span_sectors, &mut state, &mut popularity);
                next_idle_ns += DAY_NS;
            }
        }
        let key = NumberKey(match techniques.cache {
            CacheMode::Content => request.content,
            _ => request.sector,
        });
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
                        continue;
                    }
                    Some(_) => {
                        cache.set_value(&key, request.content);
                    }
                    None => cache.insert(&key, request.content),
                }
            }
        }
        if !merged.continues(request.write, request.sector) {
            state.dispatch(&mut merged);
            merged.write = request.write;
            merged.arrival_ns = request.arrival_ns;
        }
        merged.blocks.push((request.sector, request.content));
    }
    state.dispatch(&mut merged);
    state.outcome
}

/// Selective duplication in one idle period (see the module documentation): the most popular
/// read requests of the days so far, by their contents, are copied whole into each scratch
/// region, so a request finds its run of blocks together there.
fn duplicate(
    duplication: &Duplication,
    span_sectors: u64,
    state: &mut Replay<'_>,
    popularity: &mut HashMap<Vec<u64>, f64>,
) {
    // Earlier days weigh half as much each day back.
    popularity.retain(|_, score| {
        *score /= 2.0;
        *score >= 0.25
    });
    for (contents, reads) in state.today.drain() {
        *popularity.entry(contents).or_default() += reads as f64;
    }
    let blocks_of = &state.copies.blocks_of;
    let mut ranked: Vec<(&Vec<u64>, f64)> = popularity
        .iter()
        .filter(|(contents, _)| {
            contents
                .iter()
                .all(|content| blocks_of.contains_key(content))
        })
        .map(|(contents, &score)| (contents, score))
        .collect();
    // Most popular first; ties by contents, so runs repeat exactly.
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(b.0)));
    state.scratch.clear();
    let region_sectors = span_sectors / duplication.copies;
    let region_blocks = duplication.budget_blocks / duplication.copies;
    let mut used_blocks = 0;
    for (contents, _) in ranked {
        let blocks = contents.len() as u64;
        if used_blocks + blocks > region_blocks {
            break;
        }
        for region in 0..duplication.copies {
            // Region `region` starts in the middle of its share of the disk.
            let start = region * region_sectors + region_sectors / 2 + used_blocks * BLOCK_SECTORS;
            for (index, &content) in contents.iter().enumerate() {
                let sector = start + index as u64 * BLOCK_SECTORS;
                state.scratch.content_of.insert(sector, content);
                state
                    .scratch
                    .sectors_of
                    .entry(content)
                    .or_default()
                    .push(sector);
            }
            state
                .scratch
                .runs_of
                .entry(contents[0])
                .or_default()
                .push(start);
            state.outcome.duplicates_written += blocks;
            state.disk.park_at(start + blocks * BLOCK_SECTORS);
        }
        used_blocks += blocks;
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
