//! Figures 4-10 of paper 2 as SVG (through [`crate::plot`]); the CSV tables and `summary.md`
//! are in [`super::tables`].
//!
//! Throughputs are logical bytes (the whole image or tree, null bytes included, as the paper
//! counts them) over wall time, in MB/s (10^6 bytes). The tables also give throughput over
//! the process's CPU time, which the shared machine's load does not inflate.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use onecopy_backup::DeleteMethod;

use super::comparison::ComparisonResults;
use super::experiments::DatasetResults;
use super::peers::Tool;
use super::Paper2Results;
use crate::error::Result;
use crate::plot::{AxisScale, BarPanel, BarSeries, Figure, LinePanel, LineSeries, Panel};
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

/// Per-version points of `dataset`: for each store in `stores`, the mean over series of
/// `value` by version, as a line series.
fn per_version_lines<T>(
    records: &[T],
    stores: &[&str],
    store_of: impl Fn(&T) -> &str,
    version_of: impl Fn(&T) -> u32,
    value: impl Fn(&T) -> f64,
    name: impl Fn(&str) -> String,
) -> Vec<LineSeries> {
    stores
        .iter()
        .map(|store| {
            let mut by_version: BTreeMap<u32, Vec<f64>> = BTreeMap::new();
            for record in records.iter().filter(|record| store_of(record) == *store) {
                by_version
                    .entry(version_of(record))
                    .or_default()
                    .push(value(record));
            }
            LineSeries {
                name: name(store),
                points: by_version
                    .into_iter()
                    .map(|(version, values)| (version as f64, mean(values)))
                    .collect(),
            }
        })
        .collect()
}

fn line_panel(title: &str, x_label: &str, y_label: &str, series: Vec<LineSeries>) -> Panel {
    Panel::Lines(LinePanel {
        title: title.to_string(),
        x_label: x_label.to_string(),
        y_label: y_label.to_string(),
        x_scale: AxisScale::Linear,
        y_scale: AxisScale::Linear,
        series,
    })
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
                    |record| rate(record.logical_bytes, record.timing.seconds),
                    str::to_string,
                )
            };
            if series.iter().all(|line| line.points.is_empty()) {
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
    for prefetch in [false, true] {
        let restores: Vec<_> = sg1
            .restores
            .iter()
            .filter(|record| record.prefetch == prefetch)
            .cloned()
            .collect();
        series.extend(per_version_lines(
            &restores,
            &present(sg1, &["conv", "rev-4M"]),
            |record| &record.store,
            |record| record.version,
            |record| rate(record.logical_bytes, record.timing.seconds),
            |store| format!("{store}{}", if prefetch { " prefetch" } else { "" }),
        ));
    }
    series.retain(|line| !line.points.is_empty());
    figure.panels.push(line_panel(
        "cold cache",
        "version (week)",
        "restore MB/s",
        series,
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
            |record| rate(record.logical_bytes, record.timing.seconds),
            str::to_string,
        ),
    ));
    figure
}

fn deletion_figure(sg1: &DatasetResults) -> Figure {
    let mut figure = Figure::new(
        "Fig. 10: deleting the oldest backup, SG1 rev-4M (seconds)",
        2,
    );
    let lines = |points: Vec<(DeleteMethod, f64, f64, f64)>| -> Vec<LineSeries> {
        let mut timestamp = Vec::new();
        let mut mark = Vec::new();
        let mut sweep = Vec::new();
        for (method, x, metadata, swept) in points {
            match method {
                DeleteMethod::Timestamp => timestamp.push((x, metadata + swept)),
                DeleteMethod::MarkAndSweep => {
                    mark.push((x, metadata));
                    sweep.push((x, swept));
                }
            }
        }
        vec![
            LineSeries {
                name: "time stamps".into(),
                points: timestamp,
            },
            LineSeries {
                name: "mark".into(),
                points: mark,
            },
            LineSeries {
                name: "sweep".into(),
                points: sweep,
            },
        ]
    };
    let incremental = sg1
        .incremental_deletions
        .iter()
        .map(|record| {
            (
                record.method,
                record.version as f64,
                record.metadata_seconds,
                record.sweep_seconds,
            )
        })
        .collect();
    let mut grouped: BTreeMap<(bool, u32), Vec<(f64, f64)>> = BTreeMap::new();
    for record in &sg1.deletions {
        grouped
            .entry((
                record.measure.method == DeleteMethod::Timestamp,
                record.backups,
            ))
            .or_default()
            .push((
                record.measure.metadata_seconds,
                record.measure.sweep_seconds,
            ));
    }
    let checkpoints = grouped
        .into_iter()
        .map(|((timestamp, backups), runs)| {
            let method = if timestamp {
                DeleteMethod::Timestamp
            } else {
                DeleteMethod::MarkAndSweep
            };
            (
                method,
                backups as f64,
                mean(runs.iter().map(|run| run.0)),
                mean(runs.iter().map(|run| run.1)),
            )
        })
        .collect();
    for (title, x_label, points) in [
        (
            "(a) one by one from the oldest",
            "deleted version",
            incremental,
        ),
        (
            "(b) oldest of a growing store (mean of runs)",
            "backups in the store",
            checkpoints,
        ),
    ] {
        figure.panels.push(Panel::Lines(LinePanel {
            title: title.into(),
            x_label: x_label.into(),
            y_label: "seconds".into(),
            x_scale: AxisScale::Linear,
            y_scale: AxisScale::Log10,
            series: lines(points),
        }));
    }
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
        line(&|measure| measure.backup.seconds),
    ));
    figure.panels.push(line_panel(
        "restore of the newest, cold cache",
        "version",
        "seconds",
        line(&|measure| measure.restore_newest.seconds),
    ));
    figure.panels.push(line_panel(
        "repository size",
        "version",
        "MiB",
        line(&|measure| measure.repository_bytes as f64 / MEBIBYTE),
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
