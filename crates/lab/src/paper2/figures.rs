//! Figures 4-10 of paper 2 as SVG (through [`crate::plot`]); the CSV tables and `summary.md`
//! are in [`super::tables`].
//!
//! Throughputs are logical bytes (the whole image or tree, null bytes included, as the paper
//! counts them) over wall time, in MB/s (10^6 bytes). The tables also give throughput over
//! the process's CPU time, which the shared machine's load does not inflate.
//!
//! Where a dataset ran several times, each point is the mean over runs (of the mean over a
//! group's series) and its error bar spans the lowest and the highest run; Table 2's bars
//! are the mean with one standard deviation either side, as the paper reports it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use onecopy_backup::DeleteMethod;

use super::comparison::ComparisonResults;
use super::experiments::DatasetResults;
use super::peers::Tool;
use super::Paper2Results;
use crate::error::Result;
use crate::plot::{AxisScale, BarPanel, BarSeries, Figure, LinePanel, LineSeries, Panel, Ranges};
use crate::results::write_text;

pub(super) const MEGABYTE: f64 = 1e6;
pub(super) const MEBIBYTE: f64 = 1048576.0;

/// Saving (percent) of `store` after the last week of `dataset`.
pub fn final_saving(dataset: &DatasetResults, store: &str) -> Option<f64> {
    dataset
        .space
        .iter()
        .filter(|record| record.store == store)
        .max_by_key(|record| record.week)
        .map(|record| record.saving_percent())
}

pub(super) fn final_inline_saving(dataset: &DatasetResults, store: &str) -> Option<f64> {
    dataset
        .space
        .iter()
        .filter(|record| record.store == store)
        .max_by_key(|record| record.week)
        .map(|record| record.inline_saving_percent())
}

pub(super) fn rate(bytes: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        bytes as f64 / MEGABYTE / seconds
    } else {
        f64::NAN
    }
}

/// Mean of `values` (NaN when empty).
pub(super) fn mean(values: impl IntoIterator<Item = f64>) -> f64 {
    let (sum, count) = values
        .into_iter()
        .fold((0.0, 0usize), |(sum, count), value| {
            (sum + value, count + 1)
        });
    if count == 0 {
        f64::NAN
    } else {
        sum / count as f64
    }
}

/// Mean, lowest and highest of `values` (NaN when empty).
pub(super) fn spread(values: &[f64]) -> (f64, f64, f64) {
    let low = values.iter().copied().fold(f64::INFINITY, f64::min);
    let high = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if values.is_empty() {
        (f64::NAN, f64::NAN, f64::NAN)
    } else {
        (mean(values.iter().copied()), low, high)
    }
}

/// Mean and sample standard deviation of `values` (NaN when empty; deviation 0 for one).
pub(super) fn mean_deviation(values: &[f64]) -> (f64, f64) {
    let average = mean(values.iter().copied());
    if values.len() < 2 {
        return (average, if values.is_empty() { f64::NAN } else { 0.0 });
    }
    let squares: f64 = values.iter().map(|value| (value - average).powi(2)).sum();
    (average, (squares / (values.len() - 1) as f64).sqrt())
}

/// Lines with error bars: per store, per version, the mean over runs of the mean over
/// series of `value`, with the lowest and highest run as the range.
fn per_version_lines<T>(
    records: &[T],
    stores: &[&str],
    store_of: impl Fn(&T) -> &str,
    version_of: impl Fn(&T) -> u32,
    run_of: impl Fn(&T) -> u32,
    value: impl Fn(&T) -> f64,
    name: impl Fn(&str) -> String,
) -> (Vec<LineSeries>, Ranges) {
    let mut lines = Vec::new();
    let mut ranges = Vec::new();
    for store in stores {
        let mut by_version: BTreeMap<u32, BTreeMap<u32, Vec<f64>>> = BTreeMap::new();
        for record in records.iter().filter(|record| store_of(record) == *store) {
            by_version
                .entry(version_of(record))
                .or_default()
                .entry(run_of(record))
                .or_default()
                .push(value(record));
        }
        let mut points = Vec::new();
        let mut range = Vec::new();
        for (version, runs) in by_version {
            let per_run: Vec<f64> = runs.into_values().map(mean).collect();
            let (average, low, high) = spread(&per_run);
            points.push((version as f64, average));
            range.push((low, high));
        }
        lines.push(LineSeries {
            name: name(store),
            points,
        });
        ranges.push(range);
    }
    (lines, ranges)
}

fn line_panel(
    title: &str,
    x_label: &str,
    y_label: &str,
    lines: (Vec<LineSeries>, Ranges),
) -> Panel {
    let (series, ranges) = lines;
    Panel::RangedLines(
        LinePanel {
            title: title.to_string(),
            x_label: x_label.to_string(),
            y_label: y_label.to_string(),
            x_scale: AxisScale::Linear,
            y_scale: AxisScale::Linear,
            series,
        },
        ranges,
    )
}

fn present<'a>(dataset: &DatasetResults, stores: &[&'a str]) -> Vec<&'a str> {
    stores
        .iter()
        .copied()
        .filter(|store| dataset.stores.iter().any(|config| config.label == *store))
        .collect()
}

const CONTAINER_STORES: [&str; 4] = ["conv", "rev-4M-c4M", "rev-4M-c16M", "rev-4M"];
const SEGMENT_STORES: [&str; 4] = ["conv", "rev-1M", "rev-4M", "rev-8M"];
pub(super) const LIVE_WINDOW_STORES: [&str; 3] = ["rev-4M", "rev-4M-lw2", "rev-4M-lw4"];

/// Writes every figure; returns the paths.
pub fn write_figures(directory: &Path, results: &Paper2Results) -> Result<Vec<PathBuf>> {
    let mut figures: Vec<(&str, Figure)> = vec![("fig4-storage-saving", storage_figure(results))];
    figures.push(("fig5-backup-throughput", throughput_figure(results, true)));
    figures.push(("fig6-restore-throughput", throughput_figure(results, false)));
    if let Some(sg1) = results
        .datasets
        .iter()
        .find(|dataset| dataset.dataset == "sg1")
    {
        figures.push(("fig7-reverse-throughput", reverse_figure(sg1)));
        figures.push(("fig8-prefetch", prefetch_figure(sg1)));
        figures.push(("fig9-live-window", live_window_figure(sg1)));
        figures.push(("fig10-deletion", deletion_figure(sg1)));
    }
    if let Some(comparison) = &results.comparison {
        figures.push(("peers-typescript", peers_figure(comparison)));
    }
    if let Some(unique) = &results.unique {
        figures.push(("table2-unique-throughput", unique_figure(unique)));
    }
    let mut written = Vec::new();
    for (name, figure) in figures {
        if figure.panels.is_empty() {
            continue;
        }
        let path = directory.join(format!("{name}.svg"));
        write_text(&path, &figure.to_svg())?;
        written.push(path);
    }
    Ok(written)
}

fn storage_figure(results: &Paper2Results) -> Figure {
    let mut figure = Figure::new(
        "Fig. 4: storage saving (% of non-null bytes), inline only and after reverse dedup",
        1,
    );
    figure.panel_width = 900;
    let categories: Vec<String> = results
        .datasets
        .iter()
        .map(|dataset| dataset.dataset.clone())
        .collect();
    let mut series = vec![BarSeries {
        name: "Conv".into(),
        values: results
            .datasets
            .iter()
            .map(|dataset| final_saving(dataset, "conv").unwrap_or(f64::NAN))
            .collect(),
    }];
    for store in ["rev-1M", "rev-4M", "rev-8M"] {
        series.push(BarSeries {
            name: format!("{store} inline"),
            values: results
                .datasets
                .iter()
                .map(|dataset| final_inline_saving(dataset, store).unwrap_or(f64::NAN))
                .collect(),
        });
        series.push(BarSeries {
            name: format!("{store} +reverse"),
            values: results
                .datasets
                .iter()
                .map(|dataset| final_saving(dataset, store).unwrap_or(f64::NAN))
                .collect(),
        });
    }
    figure.panels.push(Panel::Bars(BarPanel {
        title: "saving after the last backup".into(),
        x_label: "dataset".into(),
        y_label: "saving (%)".into(),
        y_scale: AxisScale::Linear,
        categories,
        series,
        value_labels: false,
    }));
    figure
}

fn throughput_figure(results: &Paper2Results, backup: bool) -> Figure {
    let (title, what) = if backup {
        ("Fig. 5: backup throughput per week (MB/s, wall)", "backup")
    } else {
        (
            "Fig. 6: restore throughput per version, cold cache, no prefetch (MB/s)",
            "restore",
        )
    };
    let mut figure = Figure::new(title, 2);
    for dataset in &results.datasets {
        let groups: Vec<(&str, Vec<&str>)> = if dataset.dataset == "sg1" {
            vec![
                ("container sizes", present(dataset, &CONTAINER_STORES)),
                ("segment sizes", present(dataset, &SEGMENT_STORES)),
            ]
        } else if dataset.dataset == "gp" || dataset.dataset == "typescript" {
            vec![("segment sizes", present(dataset, &SEGMENT_STORES))]
        } else {
            continue;
        };
        for (group, stores) in groups {
            let series = if backup {
                per_version_lines(
                    &dataset.backups,
                    &stores,
                    |record| &record.store,
                    |record| record.version,
                    |record| record.run,
                    |record| rate(record.logical_bytes, record.timing.seconds),
                    str::to_string,
                )
            } else {
                let restores: Vec<_> = dataset
                    .restores
                    .iter()
                    .filter(|record| !record.prefetch)
                    .cloned()
                    .collect();
                per_version_lines(
                    &restores,
                    &stores,
                    |record| &record.store,
                    |record| record.version,
                    |record| record.run,
                    |record| rate(record.logical_bytes, record.timing.seconds),
                    str::to_string,
                )
            };
            if series.0.iter().all(|line| line.points.is_empty()) {
                continue;
            }
            figure.panels.push(line_panel(
                &format!("{}: {group}", dataset.dataset),
                "version (week)",
                &format!("{what} MB/s"),
                series,
            ));
        }
    }
    figure
}

fn reverse_figure(sg1: &DatasetResults) -> Figure {
    let mut figure = Figure::new("Fig. 7: reverse deduplication throughput, SG1 (MB/s)", 1);
    let stores = present(sg1, &["rev-1M", "rev-4M", "rev-8M"]);
    figure.panels.push(line_panel(
        "backup's logical bytes / reverse dedup time",
        "week of the reverse-deduplicated backup",
        "MB/s",
        per_version_lines(
            &sg1.reverses,
            &stores,
            |record| &record.store,
            |record| record.version,
            |record| record.run,
            |record| rate(record.logical_bytes, record.timing.seconds),
            str::to_string,
        ),
    ));
    figure
}

fn prefetch_figure(sg1: &DatasetResults) -> Figure {
    let mut figure = Figure::new(
        "Fig. 8: restore throughput with and without prefetching, SG1",
        1,
    );
    let mut series = Vec::new();
    let mut ranges = Vec::new();
    for prefetch in [false, true] {
        let restores: Vec<_> = sg1
            .restores
            .iter()
            .filter(|record| record.prefetch == prefetch)
            .cloned()
            .collect();
        let (lines, line_ranges) = per_version_lines(
            &restores,
            &present(sg1, &["conv", "rev-4M"]),
            |record| &record.store,
            |record| record.version,
            |record| record.run,
            |record| rate(record.logical_bytes, record.timing.seconds),
            |store| format!("{store}{}", if prefetch { " prefetch" } else { "" }),
        );
        for (line, range) in lines.into_iter().zip(line_ranges) {
            if !line.points.is_empty() {
                series.push(line);
                ranges.push(range);
            }
        }
    }
    figure.panels.push(line_panel(
        "cold cache",
        "version (week)",
        "restore MB/s",
        (series, ranges),
    ));
    figure
}

fn live_window_figure(sg1: &DatasetResults) -> Figure {
    let mut figure = Figure::new("Fig. 9: restore throughput by live window, SG1", 1);
    let restores: Vec<_> = sg1
        .restores
        .iter()
        .filter(|record| !record.prefetch)
        .cloned()
        .collect();
    figure.panels.push(line_panel(
        "live window 1, 2, 4 backups",
        "version (week)",
        "restore MB/s",
        per_version_lines(
            &restores,
            &present(sg1, &LIVE_WINDOW_STORES),
            |record| &record.store,
            |record| record.version,
            |record| record.run,
            |record| rate(record.logical_bytes, record.timing.seconds),
            str::to_string,
        ),
    ));
    figure
}

/// One line of the deletion figure: its name and, per x, the values of every run.
type DeletionLine = (String, BTreeMap<u64, BTreeMap<u32, Vec<f64>>>);

/// Adds `value` of run `run` at `x` to the line named `name`.
fn add_point(lines: &mut Vec<DeletionLine>, name: &str, x: u64, run: u32, value: f64) {
    let index = match lines.iter().position(|(line, _)| line == name) {
        Some(index) => index,
        None => {
            lines.push((name.to_string(), BTreeMap::new()));
            lines.len() - 1
        }
    };
    lines[index]
        .1
        .entry(x)
        .or_default()
        .entry(run)
        .or_default()
        .push(value);
}

/// A log-scale panel of deletion lines, each point the mean over runs with the lowest and
/// highest run as its range.
fn deletion_panel(title: &str, x_label: &str, lines: Vec<DeletionLine>) -> Panel {
    let mut series = Vec::new();
    let mut ranges = Vec::new();
    for (name, by_x) in lines {
        let mut points = Vec::new();
        let mut range = Vec::new();
        for (x, runs) in by_x {
            let per_run: Vec<f64> = runs.into_values().map(mean).collect();
            let (average, low, high) = spread(&per_run);
            points.push((x as f64, average));
            range.push((low, high));
        }
        series.push(LineSeries { name, points });
        ranges.push(range);
    }
    Panel::RangedLines(
        LinePanel {
            title: title.into(),
            x_label: x_label.into(),
            y_label: "seconds".into(),
            x_scale: AxisScale::Linear,
            y_scale: AxisScale::Log10,
            series,
        },
        ranges,
    )
}

fn deletion_figure(sg1: &DatasetResults) -> Figure {
    let mut figure = Figure::new("Fig. 10: deleting backups, SG1 (seconds)", 2);
    let method_lines = |lines: &mut Vec<DeletionLine>,
                        suffix: &str,
                        x: u64,
                        run: u32,
                        method: DeleteMethod,
                        metadata: f64,
                        swept: f64| match method {
        DeleteMethod::Timestamp => add_point(
            lines,
            &format!("time stamps{suffix}"),
            x,
            run,
            metadata + swept,
        ),
        DeleteMethod::MarkAndSweep => {
            add_point(lines, &format!("mark{suffix}"), x, run, metadata);
            add_point(lines, &format!("sweep{suffix}"), x, run, swept);
        }
    };
    let mut incremental = Vec::new();
    for record in &sg1.incremental_deletions {
        method_lines(
            &mut incremental,
            "",
            u64::from(record.version),
            record.run,
            record.method,
            record.metadata_seconds,
            record.sweep_seconds,
        );
    }
    let mut batch = Vec::new();
    for record in &sg1.batch_deletions {
        let suffix = format!(" ({})", record.store);
        method_lines(
            &mut batch,
            &suffix,
            u64::from(record.deleted),
            record.run,
            record.method,
            record.metadata_seconds,
            record.sweep_seconds,
        );
    }
    let mut checkpoints = Vec::new();
    for record in &sg1.deletions {
        method_lines(
            &mut checkpoints,
            "",
            u64::from(record.backups),
            record.measure.run,
            record.measure.method,
            record.measure.metadata_seconds,
            record.measure.sweep_seconds,
        );
    }
    figure.panels.push(deletion_panel(
        "(a) one by one from the oldest, rev-4M",
        "deleted version",
        incremental,
    ));
    if !batch.is_empty() {
        figure.panels.push(deletion_panel(
            "(b) the n oldest at once, after the last backup",
            "backups deleted (n)",
            batch,
        ));
    }
    figure.panels.push(deletion_panel(
        "(c) the oldest of a growing store, rev-4M",
        "backups in the store",
        checkpoints,
    ));
    figure
}

/// Table 2 as a figure: backup and restore of unique data per store beside the raw disk
/// (mean, one standard deviation either side), and the machine's limits on a log axis.
fn unique_figure(unique: &super::unique::UniqueResults) -> Figure {
    let mut figure = Figure::new(
        format!(
            "Table 2: throughput on unique data ({} MiB, {} runs, mean and standard deviation)",
            unique.bytes >> 20,
            unique.limits.len()
        ),
        2,
    );
    let bytes = unique.bytes;
    let stat = |values: Vec<f64>| mean_deviation(&values);
    let limits = |pick: &dyn Fn(&super::unique::LimitsRun) -> f64| {
        stat(
            unique
                .limits
                .iter()
                .map(|run| rate(bytes, pick(run)))
                .collect(),
        )
    };
    let mut categories = vec!["raw disk".to_string()];
    let mut write = vec![limits(&|run| run.raw_write.seconds)];
    let mut read = vec![limits(&|run| run.raw_read.seconds)];
    let stores: Vec<String> = super::unique::unique_stores()
        .into_iter()
        .map(|config| config.label)
        .collect();
    for store in &stores {
        let runs: Vec<_> = unique
            .stores
            .iter()
            .filter(|run| &run.store == store)
            .collect();
        categories.push(store.clone());
        write.push(stat(
            runs.iter()
                .map(|run| rate(bytes, run.backup.seconds))
                .collect(),
        ));
        read.push(stat(
            runs.iter()
                .map(|run| rate(bytes, run.restore.seconds))
                .collect(),
        ));
    }
    let bars = |values: &[(f64, f64)]| -> (Vec<f64>, Vec<(f64, f64)>) {
        values
            .iter()
            .map(|&(average, deviation)| (average, (average - deviation, average + deviation)))
            .unzip()
    };
    let (write_values, write_ranges) = bars(&write);
    let (read_values, read_ranges) = bars(&read);
    figure.panels.push(Panel::RangedBars(
        BarPanel {
            title: "write (backup) and read (restore, cold cache)".into(),
            x_label: "store".into(),
            y_label: "MB/s".into(),
            y_scale: AxisScale::Linear,
            categories,
            series: vec![
                BarSeries {
                    name: "write".into(),
                    values: write_values,
                },
                BarSeries {
                    name: "read".into(),
                    values: read_values,
                },
            ],
            value_labels: true,
        },
        vec![write_ranges, read_ranges],
    ));
    let limit_values = [
        limits(&|run| run.memcpy.seconds),
        limits(&|run| run.hash.seconds),
        limits(&|run| run.raw_write.seconds),
        limits(&|run| run.raw_read.seconds),
    ];
    let (values, ranges) = bars(&limit_values);
    figure.panels.push(Panel::RangedBars(
        BarPanel {
            title: "this machine's limits, same run".into(),
            x_label: "step".into(),
            y_label: "MB/s".into(),
            y_scale: AxisScale::Log10,
            categories: vec![
                "memcpy".into(),
                "BLAKE3, 1 core".into(),
                "disk write".into(),
                "disk read".into(),
            ],
            series: vec![BarSeries {
                name: "MB/s".into(),
                values,
            }],
            value_labels: true,
        },
        vec![ranges],
    ));
    figure
}

fn peers_figure(comparison: &ComparisonResults) -> Figure {
    let mut figure = Figure::new("onecopy, restic and borg on the typescript series", 2);
    let tools: Vec<Tool> = comparison.tools.iter().map(|(tool, _, _)| *tool).collect();
    let line = |pick: &dyn Fn(&super::comparison::PeerVersion) -> f64| -> Vec<LineSeries> {
        tools
            .iter()
            .map(|tool| LineSeries {
                name: tool.name().into(),
                points: comparison
                    .versions
                    .iter()
                    .filter(|measure| measure.tool == *tool)
                    .map(|measure| (measure.version as f64, pick(measure)))
                    .collect(),
            })
            .collect()
    };
    figure.panels.push(line_panel(
        "backup (wall seconds)",
        "version",
        "seconds",
        (line(&|measure| measure.backup.seconds), Vec::new()),
    ));
    figure.panels.push(line_panel(
        "restore of the newest, cold cache",
        "version",
        "seconds",
        (line(&|measure| measure.restore_newest.seconds), Vec::new()),
    ));
    figure.panels.push(line_panel(
        "repository size",
        "version",
        "MiB",
        (
            line(&|measure| measure.repository_bytes as f64 / MEBIBYTE),
            Vec::new(),
        ),
    ));
    figure.panels.push(Panel::Lines(LinePanel {
        title: "deleting the oldest backup".into(),
        x_label: "backups in the repository".into(),
        y_label: "seconds".into(),
        x_scale: AxisScale::Linear,
        y_scale: AxisScale::Log10,
        series: tools
            .iter()
            .map(|tool| LineSeries {
                name: tool.name().into(),
                points: comparison
                    .deletions
                    .iter()
                    .filter(|deletion| deletion.tool == *tool)
                    .map(|deletion| (deletion.backups as f64, deletion.total.seconds))
                    .collect(),
            })
            .collect(),
    }));
    figure
}
