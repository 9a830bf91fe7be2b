//! The workloads of paper 4's timed replays: the FIU mail excerpt as recorded, and longer
//! synthetic traces with the excerpt's statistics where the paper needs days.
//!
//! Both are lists of 4 KiB block requests ([`Request`]) with a content number per block, and
//! the on-disk content known before the replay starts ([`Workload::initial`]): paper 4 loads
//! "information about duplicates ... as would have been accumulated over the lifetime of all
//! data on the disk" before each replay.
//!
//! **The excerpt** (`fiu-mail-day1-excerpt.trace`, 10,000 requests over 23 s) knows the
//! content of a block only where the trace touches it: the blocks it reads before writing
//! them hold, at the start, what those reads return. Copies elsewhere on the mail server's
//! disk are unknown, so replica retrieval on the excerpt finds only copies the excerpt itself
//! shows.
//!
//! **Synthetic days** ([`synthesize`]) keep what the excerpt measures, and take from the paper
//! what it cannot show:
//!
//! 1. From the excerpt: the fraction of reads (89%) on blocks apart from the written ones (an
//!    extent is read or written, never both), the runs of sequential requests (85% of
//!    requests follow the previous one; run lengths are resampled from the excerpt's), where
//!    runs start on the disk (the excerpt's run starts, moved by up to
//!    [`START_JITTER_SECTORS`]), the gaps between requests (resampled apart within a run and
//!    between runs: the requests of a run come microseconds apart, runs milliseconds apart),
//!    and the share of writes whose content is already on the disk (27%).
//! 2. From paper 4: the content read on one day overlaps what was accessed the day before by
//!    45% for mail (Fig. 4), popular content staying popular; blocks read have on average
//!    about [`DISK_COPIES_MEAN`] copies on the disk (the workload static similarity of Fig. 3),
//!    whole runs of blocks placed where the excerpt's runs start (the mailbox files lie in the
//!    file system's used area), as copies of one mail in many mailbox files are; and some of
//!    the runs a day reads are such copies ([`COPY_READ_FRACTION`], tuned to §4.1's 10% more
//!    hits of a content cache on mail): the same content read at another address, as one mail
//!    is read from several mailboxes.
//! 3. A day has 16 busy hours, in which the requests come, and 8 idle ones, in which
//!    selective duplication runs (the diurnal pattern of §2.3).
//! 4. Where runs start ([`Places`]): as in the excerpt, whose 23 seconds are dominated by one
//!    process reading one mailbox file (87% of its requests in one 5 GB area), or spread over
//!    the areas the excerpt touches, each equally likely, as a day of many mailboxes would be.
//!    The lab replays both.

use std::collections::HashMap;
use std::path::Path;

use serde::Serialize;

use crate::error::{LabError, Result};
use crate::trace::{read_trace, Digest, Granularity, Operation};

/// Sectors of one block.
pub const BLOCK_SECTORS: u64 = 8;
/// Mean copies on the disk of a block read (paper 4 Fig. 3: 2.5, limited to content with at
/// most 1000 copies).
pub const DISK_COPIES_MEAN: f64 = 2.5;
/// Share of new extents copied elsewhere, and the mean number of copies of one (geometric):
/// chosen so that the blocks read have [`DISK_COPIES_MEAN`] copies on average, counted as
/// paper 4 counts them (over the blocks read, so content with more copies, read through any
/// of them, weighs more).
pub const COPIED_EXTENT_FRACTION: f64 = 0.7;
pub const COPIES_PER_COPIED_EXTENT: f64 = 2.0;
/// Share of one day's extents that the next day accesses again (paper 4 Fig. 4, mail: 45%).
pub const DAY_OVERLAP: f64 = 0.45;
/// How far a synthetic run's start may lie from the excerpt's run start it is modelled on.
pub const START_JITTER_SECTORS: u64 = 1 << 17;
/// Share of a day's new runs drawn as a copy of one of the day's runs (one mail read from
/// another mailbox the same day; the draw finds no copy for most runs, which are not copied):
/// chosen so that a content-addressed cache gets about 10% more read hits than a
/// sector-addressed one, paper 4's figure for mail (§4.1).
pub const COPY_READ_FRACTION: f64 = 0.3;
/// Times a day's extent is accessed on average.
pub const ACCESSES_PER_EXTENT: f64 = 2.0;
/// Where a synthetic day's runs start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Places {
    /// Near the excerpt's run starts, each run as likely as in the excerpt: 87% of the mail
    /// excerpt's requests lie in one 5 GB area (one process reading one mailbox file).
    Runs,
    /// Anywhere in the [`AREA_SECTORS`] areas the excerpt touches, each area equally likely:
    /// a day of a mail server reads many mailboxes, not the excerpt's one.
    Areas,
}

/// Size of one area of [`Places::Areas`]: 1 GiB.
pub const AREA_SECTORS: u64 = 1 << 21;
/// Busy part of a day; the rest is idle.
pub const BUSY_NS: u64 = 16 * 3600 * 1_000_000_000;
pub const DAY_NS: u64 = 24 * 3600 * 1_000_000_000;

/// One block request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub arrival_ns: u64,
    /// First sector (the block is [`BLOCK_SECTORS`] long).
    pub sector: u64,
    pub write: bool,
    /// Dense number of the block's content (read, or written).
    pub content: u64,
}

/// A workload: requests and what the disk holds before them.
#[derive(Clone, Debug, Default)]
pub struct Workload {
    pub name: String,
    pub requests: Vec<Request>,
    /// (first sector, content) of every block whose content is known at the start.
    pub initial: Vec<(u64, u64)>,
    /// Days the requests cover (1 for the excerpt).
    pub days: u32,
    /// Contents numbered so far (the next new content gets this number).
    pub contents: u64,
}

/// A small deterministic generator (splitmix64); the lab's workloads need no better.
#[derive(Clone, Debug)]
pub struct Random(u64);

impl Random {
    pub fn new(seed: u64) -> Random {
        Random(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut value = self.0;
        value = (value ^ (value >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        value = (value ^ (value >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        value ^ (value >> 31)
    }

    /// Uniform in `[0, bound)`.
    pub fn below(&mut self, bound: u64) -> u64 {
        assert!(bound > 0);
        self.next_u64() % bound
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The excerpt as a workload: page-granular traces only (the FIU mail and web traces).
pub fn excerpt(path: &Path) -> Result<Workload> {
    let records = read_trace(path)?;
    let Some(first) = records.first() else {
        return Err(LabError::InvalidOption(format!(
            "the trace {} has no records",
            path.display()
        )));
    };
    if records
        .iter()
        .any(|record| record.granularity != Granularity::Page)
    {
        return Err(LabError::InvalidOption(format!(
            "the trace {} has per-sector digests; the timed replay takes one digest per 4 KiB \
             page (the mail and web traces)",
            path.display()
        )));
    }
    let start_ns = first.timestamp_ns;
    let mut numbers: HashMap<Digest, u64> = HashMap::new();
    let mut workload = Workload {
        name: "mail excerpt".to_string(),
        days: 1,
        ..Workload::default()
    };
    let mut touched: HashMap<u64, ()> = HashMap::new();
    for record in &records {
        for (index, digest) in record.digests.iter().enumerate() {
            let next = numbers.len() as u64;
            let content = *numbers.entry(*digest).or_insert(next);
            let sector = record.lba + index as u64 * BLOCK_SECTORS;
            let write = record.operation == Operation::Write;
            if touched.insert(sector, ()).is_none() && !write {
                workload.initial.push((sector, content));
            }
            workload.requests.push(Request {
                arrival_ns: record.timestamp_ns.saturating_sub(start_ns),
                sector,
                write,
                content,
            });
        }
    }
    workload.contents = numbers.len() as u64;
    Ok(workload)
}

/// The statistics a synthetic workload shares with the excerpt, for comparing the two.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Shape {
    pub read_fraction: f64,
    /// Share of requests for the block the previous request asked for.
    pub immediate_repeat_fraction: f64,
    /// Share of requests that continue the one before (the next block, same operation or not).
    pub sequential_fraction: f64,
    pub mean_run_blocks: f64,
    pub write_duplicate_fraction: f64,
    /// Median gap between requests (the mean would be the idle nights').
    pub median_gap_us: f64,
}

/// What [`synthesize`] measures of the excerpt.
#[derive(Clone, Debug)]
pub struct ExcerptStatistics {
    pub read_fraction: f64,
    /// Share of requests for the block the previous request asked for.
    pub immediate_repeat_fraction: f64,
    /// Lengths of the runs of sequential requests, in blocks.
    pub run_lengths: Vec<u64>,
    /// First sector of each run.
    pub run_starts: Vec<u64>,
    /// Gaps between requests, in nanoseconds: all, before a request that continues a run,
    /// and before one that starts a run.
    pub gaps_ns: Vec<u64>,
    pub gaps_within_runs_ns: Vec<u64>,
    pub gaps_between_runs_ns: Vec<u64>,
    /// Share of written blocks whose content was seen before.
    pub write_duplicate_fraction: f64,
    /// The highest sector touched, plus one block.
    pub span_sectors: u64,
}

impl ExcerptStatistics {
    /// The figures to compare with another workload's.
    pub fn shape(&self) -> Shape {
        let runs = self.run_lengths.len() as f64;
        let requests = self.run_lengths.iter().sum::<u64>() as f64;
        Shape {
            read_fraction: self.read_fraction,
            immediate_repeat_fraction: self.immediate_repeat_fraction,
            sequential_fraction: (requests - runs) / requests,
            mean_run_blocks: requests / runs,
            write_duplicate_fraction: self.write_duplicate_fraction,
            median_gap_us: {
                let mut gaps = self.gaps_ns.clone();
                gaps.sort_unstable();
                gaps.get(gaps.len() / 2)
                    .map_or(0.0, |&gap| gap as f64 / 1e3)
            },
        }
    }

    pub fn of(workload: &Workload) -> ExcerptStatistics {
        let requests = &workload.requests;
        assert!(!requests.is_empty(), "a workload has requests");
        let reads = requests.iter().filter(|request| !request.write).count();
        // A request for the block the previous one asked for (the FIU traces record some
        // reads twice in a row) neither ends nor extends a run.
        let (mut run_lengths, mut run_starts) = (Vec::new(), Vec::new());
        let (mut gaps_within_runs_ns, mut gaps_between_runs_ns) = (Vec::new(), Vec::new());
        let mut immediate_repeats = 0u64;
        let mut length = 0;
        let mut previous: Option<&Request> = None;
        for request in requests {
            if let Some(previous) = previous {
                if previous.sector == request.sector && previous.write == request.write {
                    immediate_repeats += 1;
                    continue;
                }
            }
            let follows =
                previous.is_some_and(|previous| previous.sector + BLOCK_SECTORS == request.sector);
            if let Some(previous) = previous {
                let gap = request.arrival_ns.saturating_sub(previous.arrival_ns);
                if follows {
                    gaps_within_runs_ns.push(gap);
                } else {
                    gaps_between_runs_ns.push(gap);
                }
            }
            if !follows {
                if length > 0 {
                    run_lengths.push(length);
                }
                run_starts.push(request.sector);
                length = 0;
            }
            length += 1;
            previous = Some(request);
        }
        run_lengths.push(length);
        for gaps in [&mut gaps_within_runs_ns, &mut gaps_between_runs_ns] {
            if gaps.is_empty() {
                gaps.push(0);
            }
        }
        let gaps_ns: Vec<u64> = requests
            .windows(2)
            .map(|pair| pair[1].arrival_ns.saturating_sub(pair[0].arrival_ns))
            .collect();
        let mut seen = std::collections::HashSet::new();
        let (mut writes, mut duplicate_writes) = (0u64, 0u64);
        for request in requests {
            if request.write {
                writes += 1;
                duplicate_writes += u64::from(seen.contains(&request.content));
            }
            seen.insert(request.content);
        }
        ExcerptStatistics {
            read_fraction: reads as f64 / requests.len() as f64,
            immediate_repeat_fraction: immediate_repeats as f64 / requests.len() as f64,
            run_lengths,
            run_starts,
            gaps_ns,
            gaps_within_runs_ns,
            gaps_between_runs_ns,
            write_duplicate_fraction: duplicate_writes as f64 / writes.max(1) as f64,
            span_sectors: requests
                .iter()
                .map(|request| request.sector)
                .max()
                .unwrap_or(0)
                + BLOCK_SECTORS,
        }
    }
}

/// One run of blocks a day accesses, and how popular it is.
#[derive(Clone, Copy, Debug)]
struct Extent {
    start: u64,
    blocks: u64,
    /// Written whenever drawn (else read): the excerpt's reads and writes touch different
    /// blocks (6 of its 890 written blocks are read), so an extent keeps one role.
    write: bool,
}

/// The disk's content, as far as the generator has decided it.
struct DiskContent {
    /// The content of each block decided so far, as of the last request generated.
    content_of: HashMap<u64, u64>,
    /// What each block decided so far held before the first request: the replay's
    /// [`Workload::initial`].
    initial: Vec<(u64, u64)>,
    /// Copies placed so far, by the start of the extent they copy, for runs that read content
    /// at another address.
    copies_of: HashMap<u64, Vec<Extent>>,
    next_content: u64,
    span_sectors: u64,
}

impl DiskContent {
    /// The content of the block at `sector`, deciding it (new content) when not decided yet.
    fn content(&mut self, sector: u64) -> u64 {
        if let Some(&content) = self.content_of.get(&sector) {
            return content;
        }
        let content = self.next_content;
        self.next_content += 1;
        self.content_of.insert(sector, content);
        self.initial.push((sector, content));
        content
    }

    /// Decides the content of a new extent's blocks and, for half the extents, places copies
    /// of the whole extent elsewhere on the disk (a geometric number with mean 2, so blocks
    /// have [`DISK_COPIES_MEAN`] copies on average): a mail delivered to several mailboxes
    /// is a run of blocks in each.
    fn decide_extent(
        &mut self,
        extent: Extent,
        random: &mut Random,
        place: &mut impl FnMut(&mut Random) -> Extent,
    ) {
        // Only blocks decided here get copies: a block already decided (another extent's copy)
        // has its copies already.
        let contents: Vec<Option<u64>> = (0..extent.blocks)
            .map(|block| {
                let sector = extent.start + block * BLOCK_SECTORS;
                let fresh = !self.content_of.contains_key(&sector);
                let content = self.content(sector);
                fresh.then_some(content)
            })
            .collect();
        if random.unit() >= COPIED_EXTENT_FRACTION {
            return;
        }
        let extra_mean = COPIES_PER_COPIED_EXTENT;
        let mut extra = 1;
        while random.unit() > 1.0 / extra_mean && extra < 1000 {
            extra += 1;
        }
        for _ in 0..extra {
            // Copies lie where the mail server's files do: where runs start.
            let start = place(random)
                .start
                .min(self.span_sectors - extent.blocks * BLOCK_SECTORS);
            let mut placed = 0;
            for (block, content) in contents.iter().enumerate() {
                let Some(content) = *content else { continue };
                let sector = start + block as u64 * BLOCK_SECTORS;
                if let std::collections::hash_map::Entry::Vacant(entry) =
                    self.content_of.entry(sector)
                {
                    entry.insert(content);
                    self.initial.push((sector, content));
                    placed += 1;
                }
            }
            if placed == extent.blocks {
                self.copies_of
                    .entry(extent.start)
                    .or_default()
                    .push(Extent {
                        start,
                        blocks: extent.blocks,
                        write: false,
                    });
            }
        }
    }
}

/// `days` synthetic days of about `requests_per_day` block requests each, with the statistics
/// of `statistics` (see the module documentation).
pub fn synthesize(
    statistics: &ExcerptStatistics,
    places: Places,
    days: u32,
    requests_per_day: u64,
    seed: u64,
) -> Workload {
    assert!(days > 0 && requests_per_day > 0);
    // The areas the excerpt touches, each once.
    let mut areas: Vec<u64> = statistics
        .run_starts
        .iter()
        .map(|start| start / AREA_SECTORS)
        .collect();
    areas.sort_unstable();
    areas.dedup();
    let mut random = Random::new(seed);
    let mut disk = DiskContent {
        content_of: HashMap::new(),
        initial: Vec::new(),
        copies_of: HashMap::new(),
        next_content: 0,
        span_sectors: statistics.span_sectors,
    };
    let mean_run =
        statistics.run_lengths.iter().sum::<u64>() as f64 / statistics.run_lengths.len() as f64;
    // Each extent is accessed ACCESSES_PER_EXTENT times a day on average (Zipf-like
    // popularity below), so a day needs this many extents.
    let extents_per_day =
        ((requests_per_day as f64 / mean_run / ACCESSES_PER_EXTENT).ceil() as usize).max(1);
    let mut new_extent = |random: &mut Random| {
        let template = match places {
            Places::Runs => {
                statistics.run_starts[random.below(statistics.run_starts.len() as u64) as usize]
            }
            Places::Areas => {
                let area = areas[random.below(areas.len() as u64) as usize];
                area * AREA_SECTORS + random.below(AREA_SECTORS)
            }
        };
        let jitter = random.below(2 * START_JITTER_SECTORS / BLOCK_SECTORS) * BLOCK_SECTORS;
        let start = (template + jitter)
            .saturating_sub(START_JITTER_SECTORS)
            .min(statistics.span_sectors - BLOCK_SECTORS);
        let blocks =
            statistics.run_lengths[random.below(statistics.run_lengths.len() as u64) as usize];
        Extent {
            start: start - start % BLOCK_SECTORS,
            blocks: blocks
                .min((statistics.span_sectors - start) / BLOCK_SECTORS)
                .max(1),
            write: random.unit() >= statistics.read_fraction,
        }
    };
    let mut workload = Workload {
        name: match places {
            Places::Runs => format!("mail, {days} synthetic days"),
            Places::Areas => format!("mail, {days} synthetic days, spread"),
        },
        days,
        ..Workload::default()
    };
    // Extents in order of popularity, most popular first.
    let mut extents: Vec<Extent> = Vec::new();
    let mut recent_contents: Vec<u64> = Vec::new();
    for day in 0..days {
        // Survivors keep their order of popularity; new extents are mixed in at random ranks.
        let mut ranked: Vec<(f64, Extent)> = extents
            .iter()
            .enumerate()
            .filter(|_| random.unit() < DAY_OVERLAP)
            .map(|(rank, extent)| (rank as f64 / extents.len() as f64, *extent))
            .collect();
        while ranked.len() < extents_per_day {
            // A copy of one of the day's extents, when the draw finds one that has copies: the
            // same mail read from another mailbox the same day.
            let copy = (random.unit() < COPY_READ_FRACTION && !ranked.is_empty())
                .then(|| {
                    let original = ranked[random.below(ranked.len() as u64) as usize].1;
                    if original.write {
                        return None;
                    }
                    let copies = disk.copies_of.get(&original.start)?;
                    Some(copies[random.below(copies.len() as u64) as usize])
                })
                .flatten();
            let extent = copy.unwrap_or_else(|| new_extent(&mut random));
            disk.decide_extent(extent, &mut random, &mut new_extent);
            ranked.push((random.unit(), extent));
        }
        ranked.sort_by(|a, b| a.0.total_cmp(&b.0));
        extents = ranked.into_iter().map(|(_, extent)| extent).collect();
        // Read and written extents, each in order of popularity: a request is a write with
        // the excerpt's share, and goes to the popular written extents.
        let (written, read): (Vec<Extent>, Vec<Extent>) =
            extents.iter().partition(|extent| extent.write);
        let mut time_ns = u64::from(day) * DAY_NS;
        let day_end_ns = time_ns + BUSY_NS;
        let (mut issued, mut issued_writes) = (0u64, 0u64);
        while issued < requests_per_day {
            // A write whenever the day's writes fall behind the excerpt's share: extents differ
            // in length, so drawing the operation at random would let a long popular extent
            // set the share.
            let write = (issued_writes as f64) < (1.0 - statistics.read_fraction) * issued as f64;
            let list = match (write, written.is_empty(), read.is_empty()) {
                (true, false, _) | (false, _, true) => &written,
                _ => &read,
            };
            // Zipf-like popularity (exponent 1): rank r is drawn with weight 1/(r+1).
            let rank = ((list.len() as f64 + 1.0).powf(random.unit()) - 1.0) as usize;
            let extent = list[rank.min(list.len() - 1)];
            let write = extent.write;
            for block in 0..extent.blocks {
                let sector = extent.start + block * BLOCK_SECTORS;
                let content = if write {
                    let content = if random.unit() < statistics.write_duplicate_fraction
                        && !recent_contents.is_empty()
                    {
                        recent_contents[random.below(recent_contents.len() as u64) as usize]
                    } else {
                        disk.next_content += 1;
                        disk.next_content - 1
                    };
                    if !disk.content_of.contains_key(&sector) {
                        // What the write replaces was on the disk before: decide it, so the
                        // replay knows it from the start.
                        disk.content(sector);
                    }
                    disk.content_of.insert(sector, content);
                    content
                } else {
                    disk.content(sector)
                };
                if recent_contents.len() < 1 << 16 {
                    recent_contents.push(content);
                } else {
                    let slot = random.below(recent_contents.len() as u64) as usize;
                    recent_contents[slot] = content;
                }
                let gaps = if block == 0 {
                    &statistics.gaps_between_runs_ns
                } else {
                    &statistics.gaps_within_runs_ns
                };
                let gap = gaps[random.below(gaps.len() as u64) as usize];
                time_ns = (time_ns + gap).min(day_end_ns);
                workload.requests.push(Request {
                    arrival_ns: time_ns,
                    sector,
                    write,
                    content,
                });
                issued += 1;
                issued_writes += u64::from(write);
            }
        }
    }
    workload.contents = disk.next_content;
    workload.initial = disk.initial;
    workload
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A workload of runs of 1 to 12 blocks in a few areas, a tenth of them writes, some
    /// writes repeating content.
    fn base() -> Workload {
        let mut random = Random::new(7);
        let mut workload = Workload::default();
        let mut time_ns = 0;
        for run in 0..400u64 {
            let start = (random.below(4) * 50_000_000 + random.below(1 << 20)) * BLOCK_SECTORS;
            let write = run % 10 == 0;
            for block in 0..1 + random.below(12) {
                time_ns += 1 + random.below(4_000_000);
                workload.requests.push(Request {
                    arrival_ns: time_ns,
                    sector: start + block * BLOCK_SECTORS,
                    write,
                    content: if write && block % 3 == 0 {
                        0
                    } else {
                        run * 100 + block
                    },
                });
            }
        }
        workload
    }

    /// Goal: synthetic days keep the statistics they are made from (reads, sequential runs,
    /// gaps, repeated writes), read what the disk holds, and give the blocks read about
    /// DISK_COPIES_MEAN copies. Method: synthesize from a made-up workload and compare shapes;
    /// replay the content of every read against the generator's own initial map and writes.
    #[test]
    fn synthetic_days_keep_the_statistics() {
        let statistics = ExcerptStatistics::of(&base());
        let synthetic = synthesize(&statistics, Places::Runs, 3, 20_000, 1);
        let (want, got) = (
            statistics.shape(),
            ExcerptStatistics::of(&synthetic).shape(),
        );
        assert!(
            (want.read_fraction - got.read_fraction).abs() < 0.03,
            "{want:?} {got:?}"
        );
        assert!(
            (want.mean_run_blocks / got.mean_run_blocks - 1.0).abs() < 0.25,
            "{want:?} {got:?}"
        );
        assert!((want.write_duplicate_fraction - got.write_duplicate_fraction).abs() < 0.1);
        assert_eq!(synthetic.days, 3);
        assert!(synthetic
            .requests
            .iter()
            .all(|request| request.arrival_ns < 3 * DAY_NS));
        // Every read returns what the disk holds at that moment.
        let mut content_of: HashMap<u64, u64> = synthetic.initial.iter().copied().collect();
        assert_eq!(
            content_of.len(),
            synthetic.initial.len(),
            "one initial content per block"
        );
        for request in &synthetic.requests {
            if request.write {
                content_of.insert(request.sector, request.content);
            } else {
                assert_eq!(content_of.get(&request.sector), Some(&request.content));
            }
        }
    }
}
