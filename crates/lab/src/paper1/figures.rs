//! Figures and summary tables of paper 1's experiment.
//!
//! One SVG per workload, in the spirit of the paper's figure for it ([`Workload::paper_figure`]):
//! one column per cache policy, and rows of grouped bars over the injected latencies, one bar
//! per [`Setup`]: the workload's speed (ops/s, the tree's creates and deletes apart, or the
//! copy's time), the processor time per operation (paper 1 §5.3 reports it in µs per
//! operation), the on-disk index lookups during the workload (the I/Os that hints avoid), and
//! the dedup ratio the volume ends with (after the deferred pass for deferred runs, whose pass
//! time has a row of its own). Bars are means over repetitions; with two or more repetitions
//! an error bar spans the lowest and the highest run, as in paper 2's figures. Table 5.1 gets
//! its own figure (`paper1-uniqueness.svg`).
//!
//! `summary.md` holds the same numbers as Markdown tables, with standard deviations (paper 1
//! kept three runs whose standard deviation was under 5% of the mean).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use onecopy_core::index::cache::CachePolicy;

use super::uniqueness::UniquenessRecord;
use super::{format_latency, Paper1Results, RunRecord, Setup, Workload};
use crate::error::Result;
use crate::plot::{AxisScale, BarPanel, BarSeries, Figure, Panel};
use crate::results::write_text;

/// Mean, spread and count of one measure over the runs of a cell.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stats {
    pub runs: usize,
    pub mean: f64,
    pub minimum: f64,
    pub maximum: f64,
    /// Sample standard deviation (0 for one run).
    pub deviation: f64,
}

impl Stats {
    /// The statistics of `values` (None when there are none).
    pub fn of(values: &[f64]) -> Option<Stats> {
        if values.is_empty() {
            return None;
        }
        let runs = values.len();
        let mean = values.iter().sum::<f64>() / runs as f64;
        let deviation = if runs > 1 {
            let squares: f64 = values.iter().map(|value| (value - mean).powi(2)).sum();
            (squares / (runs - 1) as f64).sqrt()
        } else {
            0.0
        };
        Some(Stats {
            runs,
            mean,
            minimum: values.iter().copied().fold(f64::INFINITY, f64::min),
            maximum: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            deviation,
        })
    }

    /// The standard deviation as a percentage of the mean.
    pub fn deviation_percent(&self) -> f64 {
        if self.mean == 0.0 {
            0.0
        } else {
            100.0 * self.deviation / self.mean.abs()
        }
    }
}

/// A cell of the matrix: workload, policy (by name), latency, setup.
pub type Cell = (Workload, &'static str, u64, Setup);

/// The runs of every cell.
pub fn cells(runs: &[RunRecord]) -> BTreeMap<Cell, Vec<&RunRecord>> {
    let mut cells: BTreeMap<Cell, Vec<&RunRecord>> = BTreeMap::new();
    for run in runs {
        cells
            .entry((
                run.workload,
                run.policy.name(),
                run.latency_ns,
                Setup::of(run),
            ))
            .or_default()
            .push(run);
    }
    cells
}

/// The statistics of `measure` over `runs` (runs where it is not defined are left out).
pub fn stats(runs: &[&RunRecord], measure: fn(&RunRecord) -> Option<f64>) -> Option<Stats> {
    let values: Vec<f64> = runs
        .iter()
        .filter_map(|run| measure(run))
        .filter(|value| value.is_finite())
        .collect();
    Stats::of(&values)
}

/// The workloads (in the paper's order) present in `runs`, and for one workload its policies
/// (in first-seen order), latencies (ascending) and setups (in order).
fn workloads(runs: &[RunRecord]) -> Vec<Workload> {
    let mut workloads: Vec<Workload> = Vec::new();
    for run in runs {
        if !workloads.contains(&run.workload) {
            workloads.push(run.workload);
        }
    }
    workloads.sort();
    workloads
}

fn dimensions(runs: &[RunRecord], workload: Workload) -> (Vec<CachePolicy>, Vec<u64>, Vec<Setup>) {
    let mut policies = Vec::new();
    let mut latencies = Vec::new();
    let mut setups = Vec::new();
    for run in runs.iter().filter(|run| run.workload == workload) {
        if !policies.contains(&run.policy) {
            policies.push(run.policy);
        }
        if !latencies.contains(&run.latency_ns) {
            latencies.push(run.latency_ns);
        }
        if !setups.contains(&Setup::of(run)) {
            setups.push(Setup::of(run));
        }
    }
    latencies.sort_unstable();
    setups.sort();
    (policies, latencies, setups)
}

/// What a figure row shows.
struct Metric {
    label: &'static str,
    scale: AxisScale,
    measure: fn(&RunRecord) -> Option<f64>,
    /// Only these setups (None: all).
    only: Option<Setup>,
}

fn kind_rate(run: &RunRecord, name: &str) -> Option<f64> {
    run.kinds
        .iter()
        .find(|kind| kind.name == name)
        .map(|kind| kind.operations_per_second())
}

fn metrics(workload: Workload, setups: &[Setup]) -> Vec<Metric> {
    let metric =
        |label: &'static str, scale: AxisScale, measure: fn(&RunRecord) -> Option<f64>| Metric {
            label,
            scale,
            measure,
            only: None,
        };
    let mut rows = match workload {
        Workload::Copy => vec![metric("copy time (s)", AxisScale::Linear, |run| {
            Some(run.elapsed_seconds)
        })],
        Workload::Tree => vec![
            metric("creates/s", AxisScale::Log10, |run| {
                kind_rate(run, "create")
            }),
            metric("deletes/s", AxisScale::Log10, |run| {
                kind_rate(run, "delete")
            }),
        ],
        _ => vec![metric("ops/s", AxisScale::Log10, |run| {
            Some(run.operations_per_second)
        })],
    };
    rows.push(metric("CPU µs per operation", AxisScale::Linear, |run| {
        Some(run.cpu_microseconds_per_operation())
    }));
    rows.push(metric("on-disk index lookups", AxisScale::Linear, |run| {
        Some(run.counters.disk_lookups as f64)
    }));
    rows.push(metric("dedup ratio", AxisScale::Linear, |run| {
        Some(run.final_dedup_ratio())
    }));
    if setups.contains(&Setup::Deferred) {
        rows.push(Metric {
            label: "deferred pass (s)",
            scale: AxisScale::Linear,
            measure: |run| run.deferred_pass.as_ref().map(|pass| pass.seconds),
            only: Some(Setup::Deferred),
        });
    }
    rows
}

fn figure_title(workload: Workload) -> &'static str {
    match workload {
        Workload::Metadata => "Empty files created in one directory on ext4 (paper 1 Fig. 5.1)",
        Workload::Tree => {
            "Empty files created and deleted in a directory tree on ext4 (paper 1 Fig. 5.2)"
        }
        Workload::Journal => "4 KiB appends with fsync every 100 on ext4 (paper 1 Fig. 5.3)",
        Workload::DataJournal => {
            "4 KiB appends to many files, fsync every 10, ext4 data=journal (paper 1 Fig. 5.4)"
        }
        Workload::Copy => "Copy of a tree after the cache was flushed (paper 1 Table 5.2)",
        Workload::FileServer => {
            "Filebench's fileserver on ext4, inline and deferred (paper 1 Figs. 5.7-5.8)"
        }
    }
}

/// The file name of a workload's figure.
pub fn figure_file(workload: Workload) -> String {
    format!("paper1-{}.svg", workload.name())
}

/// The figure of one workload.
pub fn workload_figure(runs: &[RunRecord], workload: Workload) -> Figure {
    let cells = cells(runs);
    let (policies, latencies, setups) = dimensions(runs, workload);
    let categories: Vec<String> = latencies.iter().map(|l| format_latency(*l)).collect();
    let mut figure = Figure::new(figure_title(workload), policies.len().max(1));
    for metric in metrics(workload, &setups) {
        for policy in &policies {
            let shown: Vec<Setup> = setups
                .iter()
                .copied()
                .filter(|setup| metric.only.is_none_or(|only| only == *setup))
                .collect();
            let mut series = Vec::new();
            let mut ranges = Vec::new();
            for setup in &shown {
                let cell_stats: Vec<Option<Stats>> = latencies
                    .iter()
                    .map(|latency| {
                        cells
                            .get(&(workload, policy.name(), *latency, *setup))
                            .and_then(|runs| stats(runs, metric.measure))
                    })
                    .collect();
                series.push(BarSeries {
                    name: setup.label().to_string(),
                    values: cell_stats
                        .iter()
                        .map(|stats| stats.map_or(f64::NAN, |stats| stats.mean))
                        .collect(),
                });
                ranges.push(
                    cell_stats
                        .iter()
                        .map(|stats| match stats {
                            Some(stats) if stats.runs > 1 => (stats.minimum, stats.maximum),
                            _ => (f64::NAN, f64::NAN),
                        })
                        .collect(),
                );
            }
            figure.panels.push(Panel::RangedBars(
                BarPanel {
                    title: format!("{} cache: {}", policy.name().to_uppercase(), metric.label),
                    x_label: "injected on-disk index latency".into(),
                    y_label: metric.label.into(),
                    y_scale: metric.scale,
                    categories: categories.clone(),
                    series,
                    value_labels: true,
                },
                ranges,
            ));
        }
    }
    figure
}

/// Table 5.1 as bars: the share of distinct chunks before and after the files, per file
/// system and chunk size.
pub fn uniqueness_figure(records: &[UniquenessRecord]) -> Figure {
    let mut figure = Figure::new(
        "Distinct chunks of a new file system before and after empty files (paper 1 Table 5.1)",
        1,
    );
    let categories: Vec<String> = records
        .iter()
        .map(|record| format!("{}, {} B", record.file_system, record.after.chunk_bytes))
        .collect();
    let percent = |distinct: u64, chunks: u64| 100.0 * distinct as f64 / chunks as f64;
    figure.panels.push(Panel::Bars(BarPanel {
        title: format!(
            "{} empty files in one directory, {} MiB volume",
            records.first().map_or(0, |record| record.files),
            records
                .first()
                .map_or(0, |record| record.volume_bytes >> 20)
        ),
        x_label: "file system, chunk size".into(),
        y_label: "distinct chunks (% of the volume's)".into(),
        y_scale: AxisScale::Log10,
        categories,
        series: vec![
            BarSeries {
                name: "after mkfs".into(),
                values: records
                    .iter()
                    .map(|record| percent(record.before.distinct, record.before.chunks))
                    .collect(),
            },
            BarSeries {
                name: "after the files".into(),
                values: records
                    .iter()
                    .map(|record| percent(record.after.distinct, record.after.chunks))
                    .collect(),
            },
        ],
        value_labels: true,
    }));
    figure
}

/// Writes one SVG per workload, Table 5.1's, and `summary.md`; returns the paths.
pub fn write_figures(directory: &Path, results: &Paper1Results) -> Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    if !results.uniqueness.is_empty() {
        let path = directory.join("paper1-uniqueness.svg");
        write_text(&path, &uniqueness_figure(&results.uniqueness).to_svg())?;
        written.push(path);
    }
    for workload in workloads(&results.runs) {
        let path = directory.join(figure_file(workload));
        write_text(&path, &workload_figure(&results.runs, workload).to_svg())?;
        written.push(path);
    }
    let summary = directory.join("summary.md");
    write_text(&summary, &summary_markdown(results))?;
    written.push(summary);
    Ok(written)
}

/// `mean ± sd` with the deviation in percent of the mean when there are several runs.
fn spread(stats: Option<Stats>, digits: usize) -> String {
    match stats {
        None => "n/a".into(),
        Some(stats) if stats.runs > 1 => format!(
            "{:.digits$} ± {:.0}%",
            stats.mean,
            stats.deviation_percent()
        ),
        Some(stats) => format!("{:.digits$}", stats.mean),
    }
}

fn mean_text(stats: Option<Stats>, digits: usize) -> String {
    stats.map_or("n/a".into(), |stats| format!("{:.digits$}", stats.mean))
}

/// Markdown tables: Table 5.1, then per workload and policy a row per latency and setup, a
/// speed-up table, and for deferred runs the pass.
pub fn summary_markdown(results: &Paper1Results) -> String {
    let mut text = String::new();
    if !results.uniqueness.is_empty() {
        text.push_str(&uniqueness_markdown(&results.uniqueness));
    }
    let runs = &results.runs;
    let cells = cells(runs);
    for workload in workloads(runs) {
        let (policies, latencies, setups) = dimensions(runs, workload);
        for policy in &policies {
            let (speed, speed_measure): (&str, fn(&RunRecord) -> Option<f64>) =
                if workload == Workload::Copy {
                    ("copy s", |run| Some(run.elapsed_seconds))
                } else {
                    ("ops/s", |run| Some(run.operations_per_second))
                };
            let kinds = if workload == Workload::Tree {
                " creates/s | deletes/s |"
            } else {
                ""
            };
            let _ = writeln!(
                text,
                "\n#### {workload} ({}), {} cache\n\n| latency | setup | runs | {speed} ± sd |{kinds} \
                 CPU µs/op | engine CPU µs/op | disk lookups | cache hits | filter negatives | \
                 hinted blocks | dedup ratio | stored MiB | load |\n|{}",
                workload.paper_figure(),
                policy.name().to_uppercase(),
                "---|".repeat(13 + usize::from(workload == Workload::Tree) * 2)
            );
            for latency in &latencies {
                for setup in &setups {
                    let Some(runs) = cells.get(&(workload, policy.name(), *latency, *setup)) else {
                        continue;
                    };
                    let kinds = if workload == Workload::Tree {
                        format!(
                            " {} | {} |",
                            spread(stats(runs, |run| kind_rate(run, "create")), 0),
                            spread(stats(runs, |run| kind_rate(run, "delete")), 0)
                        )
                    } else {
                        String::new()
                    };
                    let _ =
                        writeln!(
                        text,
                        "| {} | {} | {} | {} |{kinds} {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                        format_latency(*latency),
                        setup.label(),
                        runs.len(),
                        spread(stats(runs, speed_measure), 1),
                        mean_text(stats(runs, |run| Some(run.cpu_microseconds_per_operation())), 0),
                        mean_text(
                            stats(runs, |run| Some(run.engine_cpu_microseconds_per_operation())),
                            0
                        ),
                        mean_text(stats(runs, |run| Some(run.counters.disk_lookups as f64)), 0),
                        mean_text(stats(runs, |run| Some(run.counters.cache_hits as f64)), 0),
                        mean_text(
                            stats(runs, |run| Some(run.counters.filter_negatives as f64)),
                            0
                        ),
                        mean_text(
                            stats(runs, |run| {
                                let counters = &run.counters;
                                Some(
                                    (counters.hint_metadata_blocks
                                        + counters.hint_journal_blocks
                                        + counters.hint_classified_blocks)
                                        as f64,
                                )
                            }),
                            0
                        ),
                        mean_text(stats(runs, |run| Some(run.final_dedup_ratio())), 3),
                        mean_text(
                            stats(runs, |run| Some(run.final_stored_bytes() as f64 / 1048576.0)),
                            1
                        ),
                        mean_text(stats(runs, |run| Some(run.host_after.load_average[0])), 1),
                    );
                }
            }
            text.push_str(&speedup_markdown(
                &cells, workload, *policy, &latencies, &setups,
            ));
            if setups.contains(&Setup::Deferred) {
                text.push_str(&deferred_markdown(&cells, workload, *policy, &latencies));
            }
        }
    }
    text
}

/// Per latency: with hints against without, for speed, CPU per operation and stored bytes.
fn speedup_markdown(
    cells: &BTreeMap<Cell, Vec<&RunRecord>>,
    workload: Workload,
    policy: CachePolicy,
    latencies: &[u64],
    setups: &[Setup],
) -> String {
    let mut text = String::from(
        "\n| latency | setup | speed against without hints | CPU per operation against without \
         hints | bytes stored against without hints |\n|---|---|---|---|---|\n",
    );
    let mean = |latency: u64, setup: Setup, measure: fn(&RunRecord) -> Option<f64>| {
        cells
            .get(&(workload, policy.name(), latency, setup))
            .and_then(|runs| stats(runs, measure))
            .map(|stats| stats.mean)
    };
    let speed: fn(&RunRecord) -> Option<f64> = if workload == Workload::Copy {
        |run| Some(1.0 / run.elapsed_seconds)
    } else {
        |run| Some(run.operations_per_second)
    };
    let ratio = |on: Option<f64>, off: Option<f64>| match (on, off) {
        (Some(on), Some(off)) if off > 0.0 => format!("{:.2}x", on / off),
        _ => "n/a".into(),
    };
    for &latency in latencies {
        for &setup in setups.iter().filter(|setup| **setup != Setup::Off) {
            let cpu: fn(&RunRecord) -> Option<f64> =
                |run| Some(run.cpu_microseconds_per_operation());
            let stored: fn(&RunRecord) -> Option<f64> = |run| Some(run.final_stored_bytes() as f64);
            let _ = writeln!(
                text,
                "| {} | {} | {} | {} | {} |",
                format_latency(latency),
                setup.label(),
                ratio(
                    mean(latency, setup, speed),
                    mean(latency, Setup::Off, speed)
                ),
                ratio(mean(latency, setup, cpu), mean(latency, Setup::Off, cpu)),
                ratio(
                    mean(latency, setup, stored),
                    mean(latency, Setup::Off, stored)
                ),
            );
        }
    }
    text
}

/// The deferred pass of each latency: its time, work and the dedup ratio before and after.
fn deferred_markdown(
    cells: &BTreeMap<Cell, Vec<&RunRecord>>,
    workload: Workload,
    policy: CachePolicy,
    latencies: &[u64],
) -> String {
    let mut text = String::from(
        "\n| latency | deferred pass s | pass CPU s | chunks examined | merged | disk lookups in \
         the pass | dedup ratio before the pass | after | inline, with hints |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for &latency in latencies {
        let Some(runs) = cells.get(&(workload, policy.name(), latency, Setup::Deferred)) else {
            continue;
        };
        let pass = |measure: fn(&super::DeferredPass) -> f64| {
            let values: Vec<f64> = runs
                .iter()
                .filter_map(|run| run.deferred_pass.as_ref().map(measure))
                .collect();
            Stats::of(&values)
        };
        let inline = cells
            .get(&(workload, policy.name(), latency, Setup::On))
            .and_then(|runs| stats(runs, |run| Some(run.final_dedup_ratio())));
        let _ = writeln!(
            text,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            format_latency(latency),
            spread(pass(|pass| pass.seconds), 2),
            mean_text(pass(|pass| pass.cpu_seconds), 2),
            mean_text(pass(|pass| pass.examined as f64), 0),
            mean_text(pass(|pass| pass.deduplicated as f64), 0),
            mean_text(pass(|pass| pass.counters.disk_lookups as f64), 0),
            mean_text(stats(runs, |run| Some(run.dedup_ratio)), 3),
            mean_text(pass(|pass| pass.dedup_ratio), 3),
            mean_text(inline, 3),
        );
    }
    text
}

/// Table 5.1 beside the paper's ext3 row.
fn uniqueness_markdown(records: &[UniquenessRecord]) -> String {
    let mut text = String::from(
        "\n#### Table 5.1: unique chunks before and after the empty files\n\n| file system | \
         chunk | chunks | files | distinct before | % | distinct after | % | once after | % | \
         create + sync s |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let percent = |count: u64, total: u64| 100.0 * count as f64 / total as f64;
    for record in records {
        let _ = writeln!(
            text,
            "| {} | {} B | {} | {} | {} | {:.3} | {} | {:.1} | {} | {:.1} | {:.1} |",
            record.file_system,
            record.after.chunk_bytes,
            record.after.chunks,
            record.files,
            record.before.distinct,
            percent(record.before.distinct, record.before.chunks),
            record.after.distinct,
            percent(record.after.distinct, record.after.chunks),
            record.after.once,
            percent(record.after.once, record.after.chunks),
            record.create_seconds,
        );
    }
    text.push_str(
        "| paper 1: ext3 | 512 B | 2,097,152 | 1,000,000 | 43 | 0.002 | 548,623 | 26 | | | |\n",
    );
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paper1::{CpuSeconds, DeferredPass, Paper1Options, PhaseCounters, Scale};
    use crate::results::HostSnapshot;

    fn run(
        workload: Workload,
        policy: CachePolicy,
        latency_ns: u64,
        setup: Setup,
        ops: f64,
    ) -> RunRecord {
        RunRecord {
            workload,
            policy,
            latency_ns,
            hints: setup != Setup::Off,
            deferred: setup == Setup::Deferred,
            hint_settings: workload.hint_settings(setup, false),
            repetition: 1,
            index_cache_entries_limit: 1000,
            operations: 100,
            data_bytes: 0,
            elapsed_seconds: 100.0 / ops,
            sync_seconds: 0.0,
            operations_per_second: ops,
            megabytes_per_second: 0.0,
            kinds: Vec::new(),
            cpu: CpuSeconds {
                process: 0.01,
                ..CpuSeconds::default()
            },
            dedup_ratio: if setup == Setup::Off { 1.4 } else { 1.2 },
            mapped_bytes: 0,
            stored_bytes: 0,
            counters: PhaseCounters {
                disk_lookups: if setup == Setup::Off { 50 } else { 0 },
                ..PhaseCounters::default()
            },
            setup_counters: PhaseCounters::default(),
            deferred_pass: (setup == Setup::Deferred).then(|| DeferredPass {
                seconds: 2.0,
                dedup_ratio: 1.3,
                ..DeferredPass::default()
            }),
            warm_files: 0,
            warm_bytes: 0,
            warm_seconds: 0.0,
            host_before: HostSnapshot::default(),
            host_after: HostSnapshot::default(),
        }
    }

    fn sample_runs() -> Vec<RunRecord> {
        let mut runs = Vec::new();
        for policy in [CachePolicy::Lru, CachePolicy::Arc] {
            for latency in [10_000, 10_000_000] {
                runs.push(run(Workload::Metadata, policy, latency, Setup::Off, 100.0));
                runs.push(run(Workload::Metadata, policy, latency, Setup::On, 200.0));
                runs.push(run(Workload::Metadata, policy, latency, Setup::On, 400.0));
            }
        }
        for setup in [Setup::Off, Setup::On, Setup::Deferred] {
            runs.push(run(
                Workload::FileServer,
                CachePolicy::Lru,
                10_000,
                setup,
                50.0,
            ));
        }
        runs
    }

    fn results(runs: Vec<RunRecord>) -> Paper1Results {
        Paper1Results {
            experiment: "paper1".into(),
            options: Paper1Options {
                output_directory: PathBuf::new(),
                work_directory: PathBuf::new(),
                workloads: Vec::new(),
                latencies_ns: Vec::new(),
                policies: None,
                repetitions: 1,
                scale: Scale::quick(),
                uniqueness: None,
            },
            uniqueness: Vec::new(),
            runs,
        }
    }

    /// Goal: repetitions are summarised per cell; method: two runs of 200 and 400 ops/s.
    #[test]
    fn cells_summarise_their_repetitions() {
        let runs = sample_runs();
        let cells = cells(&runs);
        let cell = &cells[&(Workload::Metadata, "lru", 10_000, Setup::On)];
        let stats = stats(cell, |run| Some(run.operations_per_second)).unwrap();
        assert_eq!(stats.runs, 2);
        assert_eq!(stats.mean, 300.0);
        assert_eq!((stats.minimum, stats.maximum), (200.0, 400.0));
        assert!((stats.deviation - 141.42).abs() < 0.01);
        assert_eq!(cells.len(), 11);
    }

    /// Goal: a workload figure has one panel per policy and metric, with a bar per latency and
    /// setup and error bars where a cell has several runs; method: count the titled marks in
    /// the SVG: 4 metrics x 2 policies x 2 latencies x 2 setups bars, and an error bar on
    /// each with-hints bar (two runs), 16.
    #[test]
    fn workload_figure_has_every_panel() {
        let figure = workload_figure(&sample_runs(), Workload::Metadata);
        assert_eq!(figure.panels.len(), 8);
        assert_eq!(figure.columns, 2);
        let svg = figure.to_svg();
        assert_eq!(svg.matches("<title>").count(), 32 + 16);
        assert!(svg.contains("ARC cache: ops/s"));
        assert!(svg.contains("CPU µs per operation"));
    }

    /// Goal: the file server's figure shows three setups and the deferred pass, and its
    /// dedup ratio is the one after the pass.
    #[test]
    fn fileserver_figure_shows_the_deferred_pass() {
        let figure = workload_figure(&sample_runs(), Workload::FileServer);
        assert_eq!(figure.panels.len(), 5);
        let Panel::RangedBars(dedup, _) = &figure.panels[3] else {
            panic!("bars with ranges");
        };
        assert_eq!(dedup.series.len(), 3);
        assert_eq!(dedup.series[2].values, vec![1.3]);
        let Panel::RangedBars(pass, _) = &figure.panels[4] else {
            panic!("bars with ranges");
        };
        assert_eq!(pass.series.len(), 1);
        assert_eq!(pass.series[0].values, vec![2.0]);
    }

    /// Goal: the summary shows the speed-up of hints per latency and the deferred pass;
    /// method: 300 / 100 = 3x.
    #[test]
    fn summary_shows_speed_up_and_pass() {
        let summary = summary_markdown(&results(sample_runs()));
        assert!(
            summary.contains("| 10us | with hints | 3.00x |"),
            "{summary}"
        );
        assert!(summary.contains("#### metadata (Fig. 5.1), ARC cache"));
        assert!(summary.contains("| 10us | 2.00 | 0.00 |"), "{summary}");
    }
}
