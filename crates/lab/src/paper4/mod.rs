//! Paper 4 §4.2 to §4.4 (I/O deduplication): dynamic replica retrieval, selective duplication
//! and all three techniques together, by a timed replay of the FIU mail trace over a model of
//! the paper's hard disk; and §4.5, the cost of the content cache's lookups and insertions.
//!
//! - **Fig. 10**: the distribution of per-request disk read times without and with dynamic
//!   replica retrieval (no cache, no duplication).
//! - **Fig. 11**: the same with selective duplication added (ten copies of the popular content
//!   of the previous days, made in idle time), on synthetic days, since duplication needs
//!   days.
//! - **Table 3**: total disk read time of the vanilla system (a sector-addressed cache of
//!   200 MB) against I/O deduplication (a content-addressed cache of the same size, replica
//!   retrieval and selective duplication), with each technique's share.
//! - **Figs. 12 and 13**: nanoseconds per lookup and per insertion of the block engine's
//!   content cache ([`onecopy_block::cache::ContentCache`]) against its size: the "sector"
//!   lookup (a copy's name: which content a location holds), the content lookup, and the
//!   content lookup with the digest it needs.
//!
//! The replays run on models ([`disk`], [`replay`]) because this machine's virtual disk has no
//! head to move, with the block engine's own read planner, ARC of days and duplication plan
//! ([`onecopy_block::replicas`]); [`workload`] says what the synthetic days take from the
//! excerpt and what from the paper. The cache costs are measured on this machine.

pub mod disk;
pub mod overhead;
pub mod replay;
pub mod workload;

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::{LabError, Result};
use crate::plot::{AxisScale, BarPanel, BarSeries, Figure, LinePanel, LineSeries, Panel};
use crate::results::{number_cell, write_json, write_text, CsvTable, HostSnapshot};
use replay::{replay, CacheMode, Duplication, ReplayOutcome, Techniques};
use workload::{ExcerptStatistics, Places, Workload};

/// The paper's cache size for Table 3: 200 MB of 4 KiB pages.
pub const CACHE_PAGES: usize = 50_000;
/// Copies of each popular content selective duplication makes (paper 4 §4.3: ten).
pub const DUPLICATE_COPIES: u64 = 10;
/// Scratch space for selective duplication: 256 MiB, 0.1% of the mail disk's span.
pub const SCRATCH_BLOCKS: u64 = 65_536;
/// Seed of the synthetic days.
pub const SEED: u64 = 0x10DE_D0F1;

/// Options of `onecopy lab paper4`.
#[derive(Clone, Debug)]
pub struct Paper4Options {
    pub out: PathBuf,
    /// The FIU trace (the mail excerpt).
    pub trace: PathBuf,
    pub quick: bool,
    /// Synthetic days (paper 4 replays a week).
    pub days: u32,
    pub requests_per_day: u64,
    /// Scratch space of selective duplication, in blocks for all copies.
    pub scratch_blocks: u64,
    /// Cache sizes of Figs. 12 and 13, in pages, and operations timed at each.
    pub overhead_pages: Vec<usize>,
    pub overhead_operations: u64,
}

impl Paper4Options {
    /// The defaults of a full run (`quick` false) or a quick one.
    pub fn new(out: PathBuf, trace: PathBuf, quick: bool) -> Paper4Options {
        let (days, requests_per_day, overhead_pages, overhead_operations) = if quick {
            (3, 40_000, vec![1 << 10, 1 << 12, 1 << 14], 100_000)
        } else {
            (
                7,
                200_000,
                vec![1 << 10, 1 << 12, 1 << 14, 1 << 16],
                1_000_000,
            )
        };
        Paper4Options {
            out,
            trace,
            quick,
            days,
            requests_per_day,
            scratch_blocks: SCRATCH_BLOCKS,
            overhead_pages,
            overhead_operations,
        }
    }
}

/// One replay: a workload under a set of techniques.
#[derive(Clone, Debug, Serialize)]
pub struct Run {
    pub workload: String,
    /// What the run shows: `vanilla`, `replica retrieval`, `replica retrieval + duplication`,
    /// `vanilla, sector cache`, `content cache`, `content cache + replica retrieval`,
    /// `I/O deduplication`.
    pub setup: String,
    pub techniques: Techniques,
    pub outcome: ReplayOutcome,
    pub median_read_ms: f64,
    pub mean_read_ms: f64,
    pub total_read_s: f64,
    /// Quartiles and the 90th percentile of disk read times (ms).
    pub read_ms_percentiles: [f64; 4],
}

/// What a workload is, for the results.
#[derive(Clone, Debug, Serialize)]
pub struct WorkloadFacts {
    pub name: String,
    pub requests: u64,
    pub reads: u64,
    pub days: u32,
    pub blocks_known_at_start: u64,
    /// Mean copies on the disk, at the start, of the blocks read.
    pub copies_per_block_read: f64,
    /// Share of the content a day reads that the day before accessed (read or written),
    /// averaged over the days after the first (paper 4 Fig. 4 measures it over 3-day
    /// intervals: 45% for mail); 0 for one day.
    pub day_overlap: f64,
    /// What the synthetic days keep of the excerpt.
    pub shape: workload::Shape,
}

/// Everything `onecopy lab paper4` measured.
#[derive(Clone, Debug, Serialize)]
pub struct Paper4Results {
    pub quick: bool,
    pub trace: String,
    pub cache_pages: usize,
    /// The mail server's reads in a busy day, at the excerpt's rate: what the paper's cache
    /// size is measured against ([`small_cache_pages`]).
    pub mail_reads_per_day: f64,
    pub duplicate_copies: u64,
    pub scratch_blocks: u64,
    pub workloads: Vec<WorkloadFacts>,
    pub runs: Vec<Run>,
    pub overhead: Vec<overhead::OverheadPoint>,
    pub host_before: HostSnapshot,
    pub host_after: HostSnapshot,
}

/// Runs the experiment and writes its files; returns their paths.
pub fn run(options: &Paper4Options) -> Result<Vec<PathBuf>> {
    if options.days == 0 || options.requests_per_day == 0 || options.overhead_operations == 0 {
        return Err(LabError::InvalidOption(
            "days, requests per day and overhead operations must be positive".into(),
        ));
    }
    std::fs::create_dir_all(&options.out)
        .map_err(|source| LabError::io(format!("creating {}", options.out.display()), source))?;
    let host_before = HostSnapshot::take();
    let excerpt = workload::excerpt(&options.trace)?;
    let statistics = ExcerptStatistics::of(&excerpt);
    let synthetic: Vec<Workload> = [Places::Runs, Places::Areas]
        .into_iter()
        .map(|places| {
            workload::synthesize(
                &statistics,
                places,
                options.days,
                options.requests_per_day,
                SEED,
            )
        })
        .collect();
    let mail_reads_per_day = mail_reads_per_day(&excerpt);
    let workloads: Vec<&Workload> = std::iter::once(&excerpt).chain(&synthetic).collect();
    let mut runs = Vec::new();
    for workload in &workloads {
        runs.extend(replays(
            workload,
            mail_reads_per_day,
            options.scratch_blocks,
        ));
    }
    let overhead = overhead::measure(&options.overhead_pages, options.overhead_operations);
    let results = Paper4Results {
        quick: options.quick,
        trace: options
            .trace
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default(),
        cache_pages: CACHE_PAGES,
        duplicate_copies: DUPLICATE_COPIES,
        scratch_blocks: options.scratch_blocks,
        mail_reads_per_day,
        workloads: workloads.iter().map(|workload| facts(workload)).collect(),
        runs,
        overhead,
        host_before,
        host_after: HostSnapshot::take(),
    };
    write_outputs(&options.out, &results)
}

fn facts(workload: &Workload) -> WorkloadFacts {
    let mut copies = std::collections::HashMap::<u64, u64>::new();
    let mut content_at = std::collections::HashMap::new();
    for &(sector, content) in &workload.initial {
        *copies.entry(content).or_default() += 1;
        content_at.insert(sector, content);
    }
    let mut counted = std::collections::HashSet::new();
    let (mut blocks, mut sum) = (0u64, 0u64);
    let mut written = std::collections::HashSet::new();
    for request in &workload.requests {
        if request.write {
            written.insert(request.sector);
        } else if !written.contains(&request.sector) && counted.insert(request.sector) {
            blocks += 1;
            sum += copies.get(&request.content).copied().unwrap_or(1);
        }
    }
    WorkloadFacts {
        name: workload.name.clone(),
        requests: workload.requests.len() as u64,
        reads: workload
            .requests
            .iter()
            .filter(|request| !request.write)
            .count() as u64,
        days: workload.days,
        blocks_known_at_start: workload.initial.len() as u64,
        copies_per_block_read: sum as f64 / blocks.max(1) as f64,
        day_overlap: day_overlap(workload),
        shape: ExcerptStatistics::of(workload).shape(),
    }
}

/// The mean over days after the first of the share of a day's read content that the day
/// before accessed ([`WorkloadFacts::day_overlap`]).
fn day_overlap(workload: &Workload) -> f64 {
    use std::collections::HashSet;
    let days = workload.days as usize;
    let mut accessed = vec![HashSet::new(); days];
    let mut read = vec![HashSet::new(); days];
    for request in &workload.requests {
        let day = ((request.arrival_ns / workload::DAY_NS) as usize).min(days.saturating_sub(1));
        accessed[day].insert(request.content);
        if !request.write {
            read[day].insert(request.content);
        }
    }
    let shares: Vec<f64> = (1..days)
        .filter(|&day| !read[day].is_empty())
        .map(|day| {
            let overlap = read[day]
                .iter()
                .filter(|content| accessed[day - 1].contains(content))
                .count();
            overlap as f64 / read[day].len() as f64
        })
        .collect();
    if shares.is_empty() {
        0.0
    } else {
        shares.iter().sum::<f64>() / shares.len() as f64
    }
}

/// The mail server's reads in a busy day ([`workload::BUSY_NS`]) at the excerpt's rate.
fn mail_reads_per_day(excerpt: &Workload) -> f64 {
    let reads = excerpt
        .requests
        .iter()
        .filter(|request| !request.write)
        .count();
    let span_ns = excerpt
        .requests
        .last()
        .map_or(0, |last| last.arrival_ns)
        .max(1);
    reads as f64 / span_ns as f64 * workload::BUSY_NS as f64
}

/// The paper's 200 MB cache scaled to a synthetic day: the synthetic day reads a small part of
/// what the mail server reads in a day (its rate in the excerpt over 16 busy hours), and the
/// cache is that part of 200 MB, so that it holds as much of a day's reads as the paper's did.
pub fn small_cache_pages(workload: &Workload, mail_reads_per_day: f64) -> usize {
    let reads = workload
        .requests
        .iter()
        .filter(|request| !request.write)
        .count();
    let reads_per_day = reads as f64 / f64::from(workload.days.max(1));
    ((CACHE_PAGES as f64 * reads_per_day / mail_reads_per_day.max(1.0)).round() as usize).max(1)
}

/// The suffix of setups run with the [`small_cache_pages`].
pub const SMALL_CACHE: &str = ", small cache";

/// The setups of Figs. 10, 11 and Table 3 on one workload.
fn replays(workload: &Workload, mail_reads_per_day: f64, scratch_blocks: u64) -> Vec<Run> {
    let none = Techniques {
        cache: CacheMode::None,
        cache_pages: 0,
        replica_retrieval: false,
        duplication: None,
    };
    let duplication = Some(Duplication {
        copies: DUPLICATE_COPIES,
        budget_blocks: scratch_blocks,
    });
    let retrieval = Techniques {
        replica_retrieval: true,
        ..none
    };
    let sector_cache = Techniques {
        cache: CacheMode::Sector,
        cache_pages: CACHE_PAGES,
        ..none
    };
    let content_cache = Techniques {
        cache: CacheMode::Content,
        ..sector_cache
    };
    let mut setups = vec![
        ("vanilla", none),
        ("replica retrieval", retrieval),
        ("vanilla, sector cache", sector_cache),
        ("content cache", content_cache),
        (
            "content cache + replica retrieval",
            Techniques {
                replica_retrieval: true,
                ..content_cache
            },
        ),
    ];
    // Selective duplication needs idle periods between days; the excerpt is 23 seconds.
    if workload.days > 1 {
        setups.push((
            "replica retrieval + duplication",
            Techniques {
                duplication,
                ..retrieval
            },
        ));
        setups.push((
            "sector cache + replica retrieval",
            Techniques {
                replica_retrieval: true,
                ..sector_cache
            },
        ));
        setups.push((
            "sector cache + replica retrieval + duplication",
            Techniques {
                replica_retrieval: true,
                duplication,
                ..sector_cache
            },
        ));
        setups.push((
            "I/O deduplication",
            Techniques {
                replica_retrieval: true,
                duplication,
                ..content_cache
            },
        ));
    }
    let mut setups: Vec<(String, Techniques)> = setups
        .into_iter()
        .map(|(name, techniques)| (name.to_string(), techniques))
        .collect();
    if workload.days > 1 {
        // The cache setups again with the paper's cache scaled to the synthetic day.
        let pages = small_cache_pages(workload, mail_reads_per_day);
        let small: Vec<(String, Techniques)> = setups
            .iter()
            .filter(|(_, techniques)| techniques.cache != CacheMode::None)
            .map(|(name, techniques)| {
                (
                    format!("{name}{SMALL_CACHE}"),
                    Techniques {
                        cache_pages: pages,
                        ..*techniques
                    },
                )
            })
            .collect();
        setups.extend(small);
    }
    setups
        .into_iter()
        .map(|(setup, techniques)| {
            let outcome = replay(workload, &techniques);
            let mut times = outcome.read_service_times_ns.clone();
            times.sort_unstable();
            let at = |fraction: f64| {
                times
                    .get(
                        ((times.len() as f64 * fraction) as usize)
                            .min(times.len().saturating_sub(1)),
                    )
                    .map_or(0.0, |&ns| ns as f64 / 1e6)
            };
            Run {
                workload: workload.name.clone(),
                setup,
                techniques,
                median_read_ms: outcome.median_read_ms(),
                mean_read_ms: outcome.mean_read_ms(),
                total_read_s: outcome.read_service_ns as f64 / 1e9,
                read_ms_percentiles: [at(0.25), at(0.5), at(0.75), at(0.9)],
                outcome,
            }
        })
        .collect()
}

fn find<'a>(runs: &'a [Run], workload: &str, setup: &str) -> Option<&'a Run> {
    runs.iter()
        .find(|run| run.workload == workload && run.setup == setup)
}

/// The distribution of disk read times as (ms, fraction at or below), at most 200 points, up
/// to the 99th percentile: the longest merged requests (hundreds of blocks) would stretch the
/// axis over a tail that holds 1% of them.
fn distribution(run: &Run) -> Vec<(f64, f64)> {
    let mut times = run.outcome.read_service_times_ns.clone();
    times.sort_unstable();
    if times.is_empty() {
        return Vec::new();
    }
    let shown = (times.len() * 99).div_ceil(100);
    let fraction = |count: usize| count as f64 / times.len() as f64;
    let step = (shown / 200).max(1);
    let mut points: Vec<(f64, f64)> = (0..shown)
        .step_by(step)
        .map(|index| (times[index] as f64 / 1e6, fraction(index + 1)))
        .collect();
    points.push((times[shown - 1] as f64 / 1e6, fraction(shown)));
    points
}

fn distribution_figure(
    title: &str,
    results: &Paper4Results,
    setups: &[&str],
    workloads: &[&str],
) -> Figure {
    let mut figure = Figure::new(title, workloads.len());
    for &workload in workloads {
        let series = setups
            .iter()
            .filter_map(|setup| find(&results.runs, workload, setup))
            .map(|run| LineSeries {
                name: format!("{} (median {:.2} ms)", run.setup, run.median_read_ms),
                points: distribution(run),
            })
            .collect();
        figure.panels.push(Panel::Lines(LinePanel {
            title: workload.to_string(),
            x_label: "disk read time (ms, modelled; to the 99th percentile)".into(),
            y_label: "fraction of disk reads".into(),
            x_scale: AxisScale::Linear,
            y_scale: AxisScale::Linear,
            series,
        }));
    }
    figure
}

/// Setups of Table 3: the vanilla system, each technique added, and all three.
pub const TABLE3_SETUPS: [&str; 6] = [
    "vanilla, sector cache",
    "content cache",
    "content cache + replica retrieval",
    "sector cache + replica retrieval",
    "sector cache + replica retrieval + duplication",
    "I/O deduplication",
];

/// Table 3 as bars: total disk read time of each setup, one panel per workload, one group of
/// bars per cache size.
fn table3_figure(results: &Paper4Results) -> Figure {
    let mut figure = Figure::new(
        "Table 3: total disk read time, vanilla against I/O deduplication (HDD model)",
        1,
    );
    for facts in &results.workloads {
        let mut categories = vec![format!("{} pages (200 MB)", results.cache_pages)];
        let mut suffixes = vec![String::new()];
        let small = find(
            &results.runs,
            &facts.name,
            &format!("vanilla, sector cache{SMALL_CACHE}"),
        );
        if let Some(small) = small {
            categories.push(format!(
                "{} pages (scaled to the day)",
                small.techniques.cache_pages
            ));
            suffixes.push(SMALL_CACHE.to_string());
        }
        let series = TABLE3_SETUPS
            .iter()
            .filter(|setup| find(&results.runs, &facts.name, setup).is_some())
            .map(|setup| BarSeries {
                name: short_setup(setup).to_string(),
                values: suffixes
                    .iter()
                    .map(|suffix| {
                        find(&results.runs, &facts.name, &format!("{setup}{suffix}"))
                            .map_or(0.0, |run| round(run.total_read_s, 1))
                    })
                    .collect(),
            })
            .collect();
        // One bar per setup, named in the legend: the setups' names are too long for the axis.
        figure.panels.push(Panel::Bars(BarPanel {
            title: facts.name.clone(),
            x_label: "cache size".into(),
            y_label: "total disk read time (s, modelled)".into(),
            y_scale: AxisScale::Linear,
            categories,
            series,
            value_labels: true,
        }));
    }
    figure
}

/// A setup's name short enough for two legend columns.
fn short_setup(setup: &str) -> &str {
    match setup {
        "vanilla, sector cache" => "vanilla (sector cache)",
        "content cache + replica retrieval" => "content + retrieval",
        "sector cache + replica retrieval" => "sector + retrieval",
        "sector cache + replica retrieval + duplication" => "sector + retr. + dupl.",
        other => other,
    }
}

/// One measure of an overhead point.
type OverheadValue = fn(&overhead::OverheadPoint) -> f64;

fn overhead_figure(title: &str, results: &Paper4Results, insert: bool) -> Figure {
    let mut figure = Figure::new(title, 1);
    let kinds: &[(&str, OverheadValue)] = if insert {
        &[
            ("name (sector) insert", |point| point.name_insert_ns),
            ("content insert", |point| point.content_insert_ns),
            ("content insert with digest", |point| {
                point.content_insert_with_digest_ns
            }),
        ]
    } else {
        &[
            ("name (sector) lookup", |point| point.name_lookup_ns),
            ("content lookup", |point| point.content_lookup_ns),
            ("content lookup with digest", |point| {
                point.content_lookup_with_digest_ns
            }),
        ]
    };
    figure.panels.push(Panel::Lines(LinePanel {
        title: if insert { "insert" } else { "lookup" }.into(),
        x_label: "cache size (4 KiB pages)".into(),
        y_label: "ns per operation".into(),
        x_scale: AxisScale::Log10,
        y_scale: AxisScale::Log10,
        series: kinds
            .iter()
            .map(|(name, value)| LineSeries {
                name: name.to_string(),
                points: results
                    .overhead
                    .iter()
                    .map(|point| (point.cache_pages as f64, value(point)))
                    .collect(),
            })
            .collect(),
    }));
    figure
}

fn write_outputs(out: &Path, results: &Paper4Results) -> Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let json = out.join("results.json");
    write_json(&json, results)?;
    written.push(json);

    let mut table = CsvTable::new(&[
        "workload",
        "setup",
        "reads",
        "read_hits",
        "disk_reads",
        "redirected_reads",
        "duplicate_reads",
        "duplicates_written",
        "median_read_ms",
        "mean_read_ms",
        "total_read_s",
        "total_write_s",
    ]);
    for run in &results.runs {
        table.push(vec![
            run.workload.clone(),
            run.setup.clone(),
            run.outcome.reads.to_string(),
            run.outcome.read_hits.to_string(),
            run.outcome.disk_reads.to_string(),
            run.outcome.redirected_reads.to_string(),
            run.outcome.duplicate_reads.to_string(),
            run.outcome.duplicates_written.to_string(),
            number_cell(round(run.median_read_ms, 4)),
            number_cell(round(run.mean_read_ms, 4)),
            number_cell(round(run.total_read_s, 3)),
            number_cell(round(run.outcome.write_service_ns as f64 / 1e9, 3)),
        ]);
    }
    let csv = out.join("results.csv");
    table.write(&csv)?;
    written.push(csv);

    let names: Vec<&str> = results
        .workloads
        .iter()
        .map(|facts| facts.name.as_str())
        .collect();
    let synthetic: Vec<&str> = names
        .iter()
        .copied()
        .filter(|name| name.contains("synthetic"))
        .collect();
    let figures = [
        (
            "paper4-fig10.svg",
            distribution_figure(
                "Fig. 10: disk read time, without and with dynamic replica retrieval (HDD model)",
                results,
                &["vanilla", "replica retrieval"],
                &names,
            ),
        ),
        (
            "paper4-fig11.svg",
            distribution_figure(
                "Fig. 11: disk read time with selective duplication added (HDD model)",
                results,
                &[
                    "vanilla",
                    "replica retrieval",
                    "replica retrieval + duplication",
                ],
                &synthetic,
            ),
        ),
        ("paper4-table3.svg", table3_figure(results)),
        (
            "paper4-fig12.svg",
            overhead_figure(
                "Fig. 12: content cache lookup cost against its size",
                results,
                false,
            ),
        ),
        (
            "paper4-fig13.svg",
            overhead_figure(
                "Fig. 13: content cache insertion cost against its size",
                results,
                true,
            ),
        ),
    ];
    for (name, figure) in figures {
        let path = out.join(name);
        write_text(&path, &figure.to_svg())?;
        written.push(path);
    }
    let summary = out.join("summary.md");
    write_text(&summary, &summary_text(results))?;
    written.push(summary);
    Ok(written)
}

fn round(value: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (value * scale).round() / scale
}

/// The reduction from `before` to `after`, in percent.
pub fn reduction_percent(before: f64, after: f64) -> f64 {
    if before > 0.0 {
        (before - after) / before * 100.0
    } else {
        0.0
    }
}

fn summary_text(results: &Paper4Results) -> String {
    use std::fmt::Write as _;
    let mut text = String::from("# Paper 4: I/O deduplication on a modelled disk\n\n");
    let _ = writeln!(
        text,
        "Trace `{}`; cache {} pages (200 MB); selective duplication {} copies within {} \
         scratch blocks. The mail server reads about {:.0} blocks in a busy day at the \
         excerpt's rate; setups marked `{}` scale the paper's 200 MB by a synthetic day's \
         reads against that: {}.\n",
        results.trace,
        results.cache_pages,
        results.duplicate_copies,
        results.scratch_blocks,
        results.mail_reads_per_day,
        SMALL_CACHE.trim_start_matches(", "),
        results
            .runs
            .iter()
            .filter(|run| run.setup == format!("vanilla, sector cache{SMALL_CACHE}"))
            .map(|run| format!("{} pages for {}", run.techniques.cache_pages, run.workload))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let _ = writeln!(
        text,
        "The synthetic days are generated (`paper4::workload`): the excerpt's share of reads, \
         runs of sequential requests, places, gaps (within and between runs) and repeated \
         writes, with paper 4's copies per block read (2.5) and day-to-day overlap (45%), and \
         some of each day's new runs reading a copy of one of the day's runs (one mail read \
         from another mailbox); the excerpt is 23 seconds, and duplication needs days. \
         `spread` days start their runs anywhere in the 1 GiB areas the excerpt touches, each \
         area equally likely, where the others follow the excerpt's runs (87% of them in one \
         5 GB area). Replica \
         retrieval and selective duplication run the block engine's planner (`hdd` profile: \
         the copy nearest the head), ARC of days and duplication plan.\n"
    );
    let _ = writeln!(
        text,
        "| workload | requests | reads | days | blocks known at start | copies per block read | \
         content read the day before | read share | sequential share | mean run (blocks) | \
         immediate repeats | repeated writes | median gap (µs) |"
    );
    let _ = writeln!(
        text,
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for facts in &results.workloads {
        let shape = &facts.shape;
        let _ = writeln!(
            text,
            "| {} | {} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.1} | {:.3} | {:.2} | \
             {:.0} |",
            facts.name,
            facts.requests,
            facts.reads,
            facts.days,
            facts.blocks_known_at_start,
            facts.copies_per_block_read,
            facts.day_overlap,
            shape.read_fraction,
            shape.sequential_fraction,
            shape.mean_run_blocks,
            shape.immediate_repeat_fraction,
            shape.write_duplicate_fraction,
            shape.median_gap_us
        );
    }
    let _ = writeln!(text, "\n## Figs. 10, 11 and Table 3\n");
    let _ = writeln!(
        text,
        "| workload | setup | read hits | disk reads | blocks they read | redirected | \
         with duplicates | from duplicates | median ms | mean ms | total read s | \
         seek, rotation, transfer s | change of total |"
    );
    let _ = writeln!(
        text,
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for run in &results.runs {
        let baseline = if run.techniques.cache == CacheMode::None {
            find(&results.runs, &run.workload, "vanilla")
        } else if run.setup.ends_with(SMALL_CACHE) {
            find(
                &results.runs,
                &run.workload,
                &format!("vanilla, sector cache{SMALL_CACHE}"),
            )
        } else {
            find(&results.runs, &run.workload, "vanilla, sector cache")
        };
        let change = baseline.map_or(0.0, |baseline| {
            -reduction_percent(baseline.total_read_s, run.total_read_s)
        });
        let _ = writeln!(
            text,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.2} | {:.2} | {:.1} | {:.1}, {:.1}, \
             {:.1} | {:+.1}% |",
            run.workload,
            run.setup,
            run.outcome.read_hits,
            run.outcome.disk_reads,
            run.outcome.disk_read_blocks,
            run.outcome.redirected_reads,
            run.outcome.duplicated_blocks_read,
            run.outcome.duplicate_reads,
            run.median_read_ms,
            run.mean_read_ms,
            run.total_read_s,
            run.outcome.read_seek_ns as f64 / 1e9,
            run.outcome.read_rotation_ns as f64 / 1e9,
            run.outcome.read_transfer_ns as f64 / 1e9,
            change
        );
    }
    let _ = writeln!(
        text,
        "\n## Figs. 12 and 13 (ns per operation, this machine)\n"
    );
    let _ = writeln!(
        text,
        "| cache pages | name lookup | content lookup | with digest | name insert | content insert | with digest |"
    );
    let _ = writeln!(text, "| --- | --- | --- | --- | --- | --- | --- |");
    for point in &results.overhead {
        let _ = writeln!(
            text,
            "| {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
            point.cache_pages,
            point.name_lookup_ns,
            point.content_lookup_ns,
            point.content_lookup_with_digest_ns,
            point.name_insert_ns,
            point.content_insert_ns,
            point.content_insert_with_digest_ns
        );
    }
    text
}
