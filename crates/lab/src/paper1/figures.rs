//! Figures and summary tables of paper 1's experiment.
//!
//! One SVG per workload, in the spirit of paper 1 Fig. 5.1 (metadata), Fig. 5.3 (journal)
//! and Table 5.2 (copy): one column per cache policy, and three rows of grouped bars over the
//! injected latencies, without and with hints: the workload's speed (ops/s, or copy time for
//! the copy workload), the on-disk index lookups during the workload (the I/Os that hints
//! avoid), and the dedup ratio after the run. Values are means over repetitions.
//! `summary.md` holds the same numbers as Markdown tables.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use onecopy_core::index::cache::CachePolicy;

use super::{format_latency, RunRecord, Workload};
use crate::error::Result;
use crate::plot::{AxisScale, BarPanel, BarSeries, Figure, Panel};
use crate::results::write_text;

/// Hint states in the order they are drawn.
const HINT_STATES: [(bool, &str); 2] = [(false, "without hints"), (true, "with hints")];

/// Means over repetitions of the runs of one cell.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CellMeans {
    pub runs: usize,
    pub operations_per_second: f64,
    pub elapsed_seconds: f64,
    pub megabytes_per_second: f64,
    pub dedup_ratio: f64,
    pub disk_lookups: f64,
    pub cache_hits: f64,
    pub filter_negatives: f64,
    pub index_lookups: f64,
    pub hinted_blocks: f64,
    pub load_average: f64,
}

/// Groups runs by cell (workload, policy name, latency, hints) and averages them.
pub fn cell_means(runs: &[RunRecord]) -> BTreeMap<(Workload, String, u64, bool), CellMeans> {
    let mut sums: BTreeMap<(Workload, String, u64, bool), CellMeans> = BTreeMap::new();
    for run in runs {
        let key = (
            run.workload,
            run.policy.name().to_string(),
            run.latency_ns,
            run.hints,
        );
        let entry = sums.entry(key).or_default();
        let counters = &run.counters;
        entry.runs += 1;
        entry.operations_per_second += run.operations_per_second;
        entry.elapsed_seconds += run.elapsed_seconds;
        entry.megabytes_per_second += run.megabytes_per_second;
        entry.dedup_ratio += run.dedup_ratio;
        entry.disk_lookups += counters.disk_lookups as f64;
        entry.cache_hits += counters.cache_hits as f64;
        entry.filter_negatives += counters.filter_negatives as f64;
        entry.index_lookups += counters.index_lookups as f64;
        entry.hinted_blocks += (counters.hint_metadata_blocks
            + counters.hint_journal_blocks
            + counters.hint_classified_blocks) as f64;
        entry.load_average += run.host_after.load_average[0];
    }
    for means in sums.values_mut() {
        let runs = means.runs as f64;
        for value in [
            &mut means.operations_per_second,
            &mut means.elapsed_seconds,
            &mut means.megabytes_per_second,
            &mut means.dedup_ratio,
            &mut means.disk_lookups,
            &mut means.cache_hits,
            &mut means.filter_negatives,
            &mut means.index_lookups,
            &mut means.hinted_blocks,
            &mut means.load_average,
        ] {
            *value /= runs;
        }
    }
    sums
}

/// The workloads, policies (in first-seen order) and latencies (ascending) present in `runs`.
fn dimensions(runs: &[RunRecord]) -> (Vec<Workload>, Vec<CachePolicy>, Vec<u64>) {
    let mut workloads = Vec::new();
    let mut policies = Vec::new();
    let mut latencies = Vec::new();
    for run in runs {
        if !workloads.contains(&run.workload) {
            workloads.push(run.workload);
        }
        if !policies.contains(&run.policy) {
            policies.push(run.policy);
        }
        if !latencies.contains(&run.latency_ns) {
            latencies.push(run.latency_ns);
        }
    }
    latencies.sort_unstable();
    (workloads, policies, latencies)
}

/// What a figure row shows.
struct Metric {
    label: &'static str,
    scale: AxisScale,
    value: fn(&CellMeans) -> f64,
}

fn metrics(workload: Workload) -> [Metric; 3] {
    let speed = match workload {
        Workload::Copy => Metric {
            label: "copy time (s)",
            scale: AxisScale::Linear,
            value: |means| means.elapsed_seconds,
        },
        Workload::Metadata | Workload::Journal => Metric {
            label: "ops/s",
            scale: AxisScale::Log10,
            value: |means| means.operations_per_second,
        },
    };
    [
        speed,
        Metric {
            label: "on-disk index lookups",
            scale: AxisScale::Linear,
            value: |means| means.disk_lookups,
        },
        Metric {
            label: "dedup ratio",
            scale: AxisScale::Linear,
            value: |means| means.dedup_ratio,
        },
    ]
}

fn figure_title(workload: Workload) -> &'static str {
    match workload {
        Workload::Metadata => "Empty files created in one directory on ext4 (paper 1 Fig. 5.1)",
        Workload::Journal => "4 KiB appends with fsync every 100 on ext4 (paper 1 Fig. 5.3)",
        Workload::Copy => "Copy of a tree after the cache was flushed (paper 1 Table 5.2)",
    }
}

/// The figure of one workload.
pub fn workload_figure(runs: &[RunRecord], workload: Workload) -> Figure {
    let means = cell_means(runs);
    let (_, policies, latencies) = dimensions(runs);
    let categories: Vec<String> = latencies.iter().map(|l| format_latency(*l)).collect();
    let mut figure = Figure::new(figure_title(workload), policies.len().max(1));
    for metric in metrics(workload) {
        for policy in &policies {
            let series = HINT_STATES
                .iter()
                .map(|(hints, name)| BarSeries {
                    name: name.to_string(),
                    values: latencies
                        .iter()
                        .map(|latency| {
                            means
                                .get(&(workload, policy.name().to_string(), *latency, *hints))
                                .map_or(f64::NAN, metric.value)
                        })
                        .collect(),
                })
                .collect();
            figure.panels.push(Panel::Bars(BarPanel {
                title: format!("{} cache: {}", policy.name().to_uppercase(), metric.label),
                x_label: "injected on-disk index latency".into(),
                y_label: metric.label.into(),
                y_scale: metric.scale,
                categories: categories.clone(),
                series,
                value_labels: true,
            }));
        }
    }
    figure
}

/// Writes one SVG per workload and `summary.md`; returns the paths.
pub fn write_figures(directory: &Path, runs: &[RunRecord]) -> Result<Vec<PathBuf>> {
    let (workloads, _, _) = dimensions(runs);
    let mut written = Vec::new();
    for workload in workloads {
        let path = directory.join(format!("paper1-{}.svg", workload.name()));
        write_text(&path, &workload_figure(runs, workload).to_svg())?;
        written.push(path);
    }
    let summary = directory.join("summary.md");
    write_text(&summary, &summary_markdown(runs))?;
    written.push(summary);
    Ok(written)
}

/// Markdown tables, one per workload and policy: a row per latency, without and with hints.
pub fn summary_markdown(runs: &[RunRecord]) -> String {
    let means = cell_means(runs);
    let (workloads, policies, latencies) = dimensions(runs);
    let mut text = String::new();
    for workload in workloads {
        for policy in &policies {
            let speed = if workload == Workload::Copy {
                "copy s"
            } else {
                "ops/s"
            };
            let _ = writeln!(
                text,
                "\n#### {workload}, {} cache\n\n| latency | {speed} off | {speed} on | speed-up | \
                 disk lookups off | disk lookups on | cache hits off | filter negatives off | \
                 hinted blocks on | dedup off | dedup on | runs | load |\n|{}",
                policy.name().to_uppercase(),
                "---|".repeat(13)
            );
            for latency in &latencies {
                let cell = |hints: bool| {
                    means
                        .get(&(workload, policy.name().to_string(), *latency, hints))
                        .copied()
                };
                let (Some(off), Some(on)) = (cell(false), cell(true)) else {
                    continue;
                };
                let (speed_off, speed_on, speed_up) = if workload == Workload::Copy {
                    (
                        off.elapsed_seconds,
                        on.elapsed_seconds,
                        off.elapsed_seconds / on.elapsed_seconds,
                    )
                } else {
                    (
                        off.operations_per_second,
                        on.operations_per_second,
                        on.operations_per_second / off.operations_per_second,
                    )
                };
                let _ = writeln!(
                    text,
                    "| {} | {speed_off:.1} | {speed_on:.1} | {speed_up:.2}x | {:.0} | {:.0} | {:.0} | \
                     {:.0} | {:.0} | {:.3} | {:.3} | {} | {:.1} |",
                    format_latency(*latency),
                    off.disk_lookups,
                    on.disk_lookups,
                    off.cache_hits,
                    off.filter_negatives,
                    on.hinted_blocks,
                    off.dedup_ratio,
                    on.dedup_ratio,
                    off.runs.min(on.runs),
                    (off.load_average + on.load_average) / 2.0,
                );
            }
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paper1::PhaseCounters;
    use crate::results::HostSnapshot;

    fn run(
        workload: Workload,
        policy: CachePolicy,
        latency_ns: u64,
        hints: bool,
        ops: f64,
    ) -> RunRecord {
        RunRecord {
            workload,
            policy,
            latency_ns,
            hints,
            hint_settings: workload.hint_settings(hints),
            repetition: 1,
            index_cache_entries_limit: 1000,
            operations: 100,
            data_bytes: 0,
            elapsed_seconds: 100.0 / ops,
            operations_per_second: ops,
            megabytes_per_second: 0.0,
            dedup_ratio: if hints { 1.2 } else { 1.4 },
            mapped_bytes: 0,
            stored_bytes: 0,
            counters: PhaseCounters {
                disk_lookups: if hints { 0 } else { 50 },
                ..PhaseCounters::default()
            },
            setup_counters: PhaseCounters::default(),
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
                runs.push(run(Workload::Metadata, policy, latency, false, 100.0));
                runs.push(run(Workload::Metadata, policy, latency, true, 200.0));
                runs.push(run(Workload::Metadata, policy, latency, true, 400.0));
            }
        }
        runs
    }

    /// Goal: repetitions are averaged per cell; method: two runs of 200 and 400 ops/s.
    #[test]
    fn cells_average_their_repetitions() {
        let means = cell_means(&sample_runs());
        let cell = means[&(Workload::Metadata, "lru".to_string(), 10_000, true)];
        assert_eq!(cell.runs, 2);
        assert_eq!(cell.operations_per_second, 300.0);
        assert_eq!(means.len(), 8);
    }

    /// Goal: a workload figure has one panel per policy and metric, with a bar per latency and
    /// hint state; method: count bars in the SVG (3 metrics x 2 policies x 2 latencies x 2
    /// states, minus the zero disk lookups which are drawn with zero height).
    #[test]
    fn workload_figure_has_every_panel() {
        let figure = workload_figure(&sample_runs(), Workload::Metadata);
        assert_eq!(figure.panels.len(), 6);
        assert_eq!(figure.columns, 2);
        let svg = figure.to_svg();
        assert_eq!(svg.matches("<title>").count(), 24);
        assert!(svg.contains("ARC cache: ops/s"));
    }

    /// Goal: the summary shows the speed-up of hints per latency; method: 300 / 100 = 3x.
    #[test]
    fn summary_shows_speed_up() {
        let summary = summary_markdown(&sample_runs());
        assert!(
            summary.contains("| 10us | 100.0 | 300.0 | 3.00x | 50 | 0 |"),
            "{summary}"
        );
        assert!(summary.contains("#### metadata, ARC cache"));
    }
}
