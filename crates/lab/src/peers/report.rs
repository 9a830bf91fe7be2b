//! The outputs of `onecopy lab peers`: results.json, CSV tables, summary.md with the issue's
//! goals, and the figure `peers.svg`.
//!
//! Timed figures of repeated commands (unchanged backups, restores) are medians over the
//! rounds; a goal comparing two tools takes the ratio round by round (both ran in the same
//! round, one after the other) and reports the median ratio with the range.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{BackupKind, BackupRun, DatasetResults, PeersResults, RestoreRun};
use crate::error::Result;
use crate::paper2::peers::{Tool, ToolRun};
use crate::plot::{AxisScale, BarPanel, BarSeries, Figure, LinePanel, LineSeries, Panel};
use crate::results::{number_cell, write_json, write_text, CsvTable};

const MIB: f64 = 1048576.0;

/// One tool's figures on one dataset.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolSummary {
    pub tool: Tool,
    /// Repository after each snapshot's backup, in order.
    pub repository_bytes_each: Vec<u64>,
    /// Repository after every backup (the unchanged ones included).
    pub repository_bytes_all: u64,
    /// Backups of the first snapshot, by round: the series' own, then the ones into empty
    /// repositories ([`BackupKind::First`]).
    pub first_backups: Vec<ToolRun>,
    /// Backups of the changed snapshots after the first, in order.
    pub later_backups: Vec<ToolRun>,
    pub unchanged_backups: Vec<ToolRun>,
    pub restores: Vec<ToolRun>,
    pub deletion: Option<ToolRun>,
    pub reclaimed_bytes: i64,
    /// Largest peak memory of any command on the dataset.
    pub peak_rss_bytes: u64,
}

impl ToolSummary {
    /// Repository after the last snapshot's backup.
    pub fn repository_bytes_series(&self) -> u64 {
        self.repository_bytes_each.last().copied().unwrap_or(0)
    }

    pub fn first_seconds(&self) -> f64 {
        median_seconds(&self.first_backups)
    }

    pub fn unchanged_seconds(&self) -> f64 {
        median_seconds(&self.unchanged_backups)
    }

    pub fn restore_seconds(&self) -> f64 {
        median_seconds(&self.restores)
    }

    /// The most any unchanged backup read (`rchar`).
    pub fn unchanged_read_call_bytes(&self) -> u64 {
        self.unchanged_backups
            .iter()
            .map(|run| run.read_call_bytes)
            .max()
            .unwrap_or(0)
    }
}

/// The figures of every tool on a dataset, in the run's tool order.
pub fn summarize(dataset: &DatasetResults) -> Vec<ToolSummary> {
    let mut tools: Vec<Tool> = Vec::new();
    for backup in &dataset.backups {
        if !tools.contains(&backup.tool) {
            tools.push(backup.tool);
        }
    }
    tools
        .into_iter()
        .map(|tool| {
            let backups = |kind: BackupKind| -> Vec<&BackupRun> {
                let mut runs: Vec<&BackupRun> = dataset
                    .backups
                    .iter()
                    .filter(|backup| backup.tool == tool && backup.kind == kind)
                    .collect();
                runs.sort_by_key(|backup| backup.number);
                runs
            };
            let series = backups(BackupKind::Series);
            let unchanged = backups(BackupKind::Unchanged);
            let first_backups = series
                .first()
                .copied()
                .into_iter()
                .chain(backups(BackupKind::First))
                .map(|backup| backup.run)
                .collect();
            let restores: Vec<&RestoreRun> = dataset
                .restores
                .iter()
                .filter(|restore| restore.tool == tool)
                .collect();
            let deletion = dataset
                .deletions
                .iter()
                .find(|deletion| deletion.tool == tool);
            let peak_rss_bytes = dataset
                .backups
                .iter()
                .filter(|backup| backup.tool == tool)
                .map(|backup| backup.run.max_rss_bytes)
                .chain(restores.iter().map(|restore| restore.run.max_rss_bytes))
                .chain(deletion.map(|deletion| deletion.total.max_rss_bytes))
                .max()
                .unwrap_or(0);
            ToolSummary {
                tool,
                repository_bytes_each: series.iter().map(|run| run.repository_bytes).collect(),
                repository_bytes_all: unchanged
                    .last()
                    .or(series.last())
                    .map_or(0, |run| run.repository_bytes),
                first_backups,
                later_backups: series.iter().skip(1).map(|run| run.run).collect(),
                unchanged_backups: unchanged.iter().map(|run| run.run).collect(),
                restores: restores.iter().map(|restore| restore.run).collect(),
                deletion: deletion.map(|deletion| deletion.total),
                reclaimed_bytes: deletion.map_or(0, |deletion| deletion.reclaimed_bytes()),
                peak_rss_bytes,
            }
        })
        .collect()
}

/// One row of the goal table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GoalRow {
    pub dataset: String,
    pub goal: String,
    pub onecopy: String,
    pub restic: String,
    pub ratio: String,
    pub met: bool,
}

/// Issue 21's goals, onecopy against restic, on one dataset (none when either is missing).
pub fn goal_table(dataset: &DatasetResults) -> Vec<GoalRow> {
    let summaries = summarize(dataset);
    let find = |tool: Tool| summaries.iter().find(|summary| summary.tool == tool);
    let (Some(ours), Some(restic)) = (find(Tool::Onecopy), find(Tool::Restic)) else {
        return Vec::new();
    };
    let name = dataset.dataset.name().to_string();
    let row = |goal: &str, onecopy: String, restic: String, ratio: String, met: bool| GoalRow {
        dataset: name.clone(),
        goal: goal.to_string(),
        onecopy,
        restic,
        ratio,
        met,
    };
    let mut rows = Vec::new();
    let size_ratio =
        ours.repository_bytes_series() as f64 / restic.repository_bytes_series() as f64;
    // The goal is judged on the repository the series leaves; the ratios after each snapshot
    // show how it got there.
    let each: Vec<f64> = ours
        .repository_bytes_each
        .iter()
        .zip(&restic.repository_bytes_each)
        .map(|(ours, restic)| *ours as f64 / *restic as f64)
        .collect();
    let (least, most) = each
        .iter()
        .fold((f64::INFINITY, 0f64), |(least, most), ratio| {
            (least.min(*ratio), most.max(*ratio))
        });
    rows.push(row(
        "repository size <= 0.9x restic's (after the series)",
        mebibytes(ours.repository_bytes_series()),
        mebibytes(restic.repository_bytes_series()),
        if each.is_empty() {
            format!("{size_ratio:.2}x")
        } else {
            format!("{size_ratio:.2}x (after each snapshot {least:.2}-{most:.2}x)")
        },
        size_ratio <= 0.9,
    ));
    let first = paired_ratios(&restic.first_backups, &ours.first_backups);
    rows.push(row(
        "first backup >= 3x faster than restic (per round)",
        median_timed(&ours.first_backups),
        median_timed(&restic.first_backups),
        ratio_text(&first, &restic.first_backups, &ours.first_backups),
        median(first.clone()) >= 3.0,
    ));
    let restore = paired_ratios(&restic.restores, &ours.restores);
    rows.push(row(
        "restore of the newest >= 2x faster than restic (per round)",
        median_timed(&ours.restores),
        median_timed(&restic.restores),
        ratio_text(&restore, &restic.restores, &ours.restores),
        median(restore.clone()) >= 2.0,
    ));
    let unchanged = paired_ratios(&restic.unchanged_backups, &ours.unchanged_backups);
    rows.push(row(
        "backup of the unchanged tree >= 3x faster than restic (per round)",
        median_timed(&ours.unchanged_backups),
        median_timed(&restic.unchanged_backups),
        ratio_text(
            &unchanged,
            &restic.unchanged_backups,
            &ours.unchanged_backups,
        ),
        median(unchanged.clone()) >= 3.0,
    ));
    let tree_bytes = dataset
        .snapshots
        .last()
        .map_or(0, |snapshot| snapshot.logical_bytes);
    let share = |bytes: u64| 100.0 * bytes as f64 / tree_bytes as f64;
    rows.push(row(
        "backup of the unchanged tree reads <= 1% of the tree's bytes (rchar, most of any round)",
        format!(
            "{} ({:.2}%)",
            mebibytes(ours.unchanged_read_call_bytes()),
            share(ours.unchanged_read_call_bytes())
        ),
        format!(
            "{} ({:.2}%)",
            mebibytes(restic.unchanged_read_call_bytes()),
            share(restic.unchanged_read_call_bytes())
        ),
        format!("of {}", mebibytes(tree_bytes)),
        share(ours.unchanged_read_call_bytes()) <= 1.0,
    ));
    let memory = ours.peak_rss_bytes as f64 / restic.peak_rss_bytes as f64;
    rows.push(row(
        "peak memory <= restic's (any command)",
        mebibytes(ours.peak_rss_bytes),
        mebibytes(restic.peak_rss_bytes),
        format!("{memory:.2}x"),
        ours.peak_rss_bytes <= restic.peak_rss_bytes,
    ));
    rows
}

/// `theirs[i] / ours[i]` for every round both have.
fn paired_ratios(theirs: &[ToolRun], ours: &[ToolRun]) -> Vec<f64> {
    theirs
        .iter()
        .zip(ours)
        .map(|(their, our)| their.seconds / our.seconds)
        .collect()
}

/// The median ratio with its range, and the ratio of the median CPU times.
fn ratio_text(ratios: &[f64], theirs: &[ToolRun], ours: &[ToolRun]) -> String {
    let low = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let high = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let cpu = |runs: &[ToolRun]| median(runs.iter().map(ToolRun::cpu_seconds).collect());
    format!(
        "{:.2}x faster ({low:.2}-{high:.2}; CPU {:.2}x less)",
        median(ratios.to_vec()),
        cpu(theirs) / cpu(ours)
    )
}

/// Median wall time.
fn median_seconds(runs: &[ToolRun]) -> f64 {
    median(runs.iter().map(|run| run.seconds).collect())
}

/// Median wall time with median CPU time.
fn median_timed(runs: &[ToolRun]) -> String {
    format!(
        "{:.2} s (CPU {:.2} s)",
        median_seconds(runs),
        median(runs.iter().map(ToolRun::cpu_seconds).collect())
    )
}

/// The middle value (the upper of the two middle ones for an even count; NaN when empty).
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

fn mebibytes(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / MIB)
}

fn seconds(value: f64) -> String {
    format!("{value:.2} s")
}

/// Writes results.json, backups.csv, restores.csv, deletions.csv, summary.csv, goals.csv,
/// summary.md and peers.svg into `directory`; returns the paths.
pub fn write_outputs(directory: &Path, results: &PeersResults) -> Result<Vec<PathBuf>> {
    let json = directory.join("results.json");
    write_json(&json, results)?;
    let mut written = vec![json];
    let mut write = |name: &str, text: String| -> Result<()> {
        let path = directory.join(name);
        write_text(&path, &text)?;
        written.push(path);
        Ok(())
    };
    let mut backups = CsvTable::new(&[
        "dataset",
        "tool",
        "kind",
        "number",
        "snapshot",
        "logical_bytes",
        "seconds",
        "cpu_seconds",
        "max_rss_bytes",
        "read_call_bytes",
        "storage_read_bytes",
        "reverse_seconds",
        "repository_bytes",
        "cache_bytes",
    ]);
    let mut restores = CsvTable::new(&[
        "dataset",
        "tool",
        "round",
        "seconds",
        "cpu_seconds",
        "max_rss_bytes",
        "read_call_bytes",
    ]);
    let mut deletions = CsvTable::new(&[
        "dataset",
        "tool",
        "backups_before",
        "steps",
        "seconds",
        "cpu_seconds",
        "max_rss_bytes",
        "repository_bytes_before",
        "repository_bytes_after",
        "reclaimed_bytes",
    ]);
    let mut summary_table = CsvTable::new(&[
        "dataset",
        "tool",
        "repository_bytes_series",
        "repository_bytes_all",
        "first_backup_seconds_median",
        "later_backups_seconds",
        "unchanged_backup_seconds_median",
        "unchanged_backup_read_call_bytes_max",
        "restore_newest_seconds_median",
        "delete_oldest_seconds",
        "reclaimed_bytes",
        "peak_rss_bytes",
    ]);
    let mut goals = CsvTable::new(&["dataset", "goal", "onecopy", "restic", "ratio", "met"]);
    for dataset in &results.datasets {
        let name = dataset.dataset.name();
        let last = dataset.snapshots.last();
        for backup in &dataset.backups {
            let snapshot = match backup.kind {
                BackupKind::Series => dataset.snapshots.get(backup.number as usize - 1),
                BackupKind::First => dataset.snapshots.first(),
                BackupKind::Unchanged => last,
            };
            backups.push(vec![
                name.into(),
                backup.tool.name().into(),
                format!("{:?}", backup.kind).to_lowercase(),
                backup.number.to_string(),
                snapshot.map_or(String::new(), |snapshot| snapshot.name.clone()),
                snapshot
                    .map_or(0, |snapshot| snapshot.logical_bytes)
                    .to_string(),
                number_cell(backup.run.seconds),
                number_cell(backup.run.cpu_seconds()),
                backup.run.max_rss_bytes.to_string(),
                backup.run.read_call_bytes.to_string(),
                backup.run.storage_read_bytes.to_string(),
                number_cell(backup.reverse_seconds),
                backup.repository_bytes.to_string(),
                backup.cache_bytes.to_string(),
            ]);
        }
        for restore in &dataset.restores {
            restores.push(vec![
                name.into(),
                restore.tool.name().into(),
                restore.round.to_string(),
                number_cell(restore.run.seconds),
                number_cell(restore.run.cpu_seconds()),
                restore.run.max_rss_bytes.to_string(),
                restore.run.read_call_bytes.to_string(),
            ]);
        }
        for deletion in &dataset.deletions {
            let steps: Vec<String> = deletion
                .steps
                .iter()
                .map(|(step, run)| format!("{step} {:.2}s", run.seconds))
                .collect();
            deletions.push(vec![
                name.into(),
                deletion.tool.name().into(),
                deletion.backups_before.to_string(),
                steps.join("; "),
                number_cell(deletion.total.seconds),
                number_cell(deletion.total.cpu_seconds()),
                deletion.total.max_rss_bytes.to_string(),
                deletion.repository_bytes_before.to_string(),
                deletion.repository_bytes_after.to_string(),
                deletion.reclaimed_bytes().to_string(),
            ]);
        }
        for summary in summarize(dataset) {
            let later: Vec<String> = summary
                .later_backups
                .iter()
                .map(|run| format!("{:.2}", run.seconds))
                .collect();
            summary_table.push(vec![
                name.into(),
                summary.tool.name().into(),
                summary.repository_bytes_series().to_string(),
                summary.repository_bytes_all.to_string(),
                number_cell(summary.first_seconds()),
                later.join(" "),
                number_cell(summary.unchanged_seconds()),
                summary.unchanged_read_call_bytes().to_string(),
                number_cell(summary.restore_seconds()),
                number_cell(summary.deletion.map_or(f64::NAN, |run| run.seconds)),
                summary.reclaimed_bytes.to_string(),
                summary.peak_rss_bytes.to_string(),
            ]);
        }
        for row in goal_table(dataset) {
            goals.push(vec![
                row.dataset,
                row.goal,
                row.onecopy,
                row.restic,
                row.ratio,
                row.met.to_string(),
            ]);
        }
    }
    write("backups.csv", backups.to_csv())?;
    write("restores.csv", restores.to_csv())?;
    write("deletions.csv", deletions.to_csv())?;
    write("summary.csv", summary_table.to_csv())?;
    write("goals.csv", goals.to_csv())?;
    write("summary.md", summary_markdown(results))?;
    write("peers.svg", figure(results).to_svg())?;
    Ok(written)
}

/// The run as markdown: tools, then per dataset its snapshots, one row per tool, and the
/// goals.
pub fn summary_markdown(results: &PeersResults) -> String {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "# onecopy against restic, borg, rustic and bupstash\n\n\
         {} rounds of first backups, unchanged backups and restores (into {}); encryption \
         {:?}; {:.0} s in all; load {:.2} before, {:.2} after; {} CPUs, kernel {}.\n",
        results.rounds,
        results.restore_directory.display(),
        results.encryption,
        results.seconds,
        results.host_before.load_average[0],
        results.host_after.load_average[0],
        results.host_before.cpus,
        results.host_before.kernel
    );
    let _ = writeln!(text, "| tool | version | settings |\n|---|---|---|");
    for info in &results.tools {
        let _ = writeln!(
            text,
            "| {} | {} | {} |",
            info.tool,
            info.version.lines().next().unwrap_or(""),
            info.settings
        );
    }
    for dataset in &results.datasets {
        let _ = writeln!(text, "\n## {}\n", dataset.dataset);
        let sizes: Vec<String> = dataset
            .snapshots
            .iter()
            .map(|snapshot| {
                let changes = if snapshot.changes.is_empty() {
                    String::new()
                } else {
                    format!("; {}", snapshot.changes)
                };
                format!(
                    "{} ({}, {} files{changes})",
                    snapshot.name,
                    mebibytes(snapshot.logical_bytes),
                    snapshot.files
                )
            })
            .collect();
        let _ = writeln!(text, "Snapshots: {}.\n", sizes.join(", "));
        let _ = writeln!(
            text,
            "| tool | repository after the snapshots / after all | first backup (median) | \
             later backups (each) | unchanged backup (median; most read) | restore of the \
             newest (median) | delete the oldest (reclaimed) | peak memory |\n\
             |---|---|---|---|---|---|---|---|"
        );
        for summary in summarize(dataset) {
            let later: Vec<String> = summary
                .later_backups
                .iter()
                .map(|run| format!("{:.2}", run.seconds))
                .collect();
            let _ = writeln!(
                text,
                "| {} | {} / {} | {} | {} s | {}; {} | {} | {} ({}) | {} |",
                summary.tool,
                mebibytes(summary.repository_bytes_series()),
                mebibytes(summary.repository_bytes_all),
                median_timed(&summary.first_backups),
                later.join(", "),
                median_timed(&summary.unchanged_backups),
                mebibytes(summary.unchanged_read_call_bytes()),
                median_timed(&summary.restores),
                summary
                    .deletion
                    .map_or("-".to_string(), |run| seconds(run.seconds)),
                mebibytes(summary.reclaimed_bytes.max(0) as u64),
                mebibytes(summary.peak_rss_bytes)
            );
        }
        let goals = goal_table(dataset);
        if !goals.is_empty() {
            let _ = writeln!(
                text,
                "\n| goal | onecopy | restic | ratio | met |\n|---|---|---|---|---|"
            );
            for row in goals {
                let _ = writeln!(
                    text,
                    "| {} | {} | {} | {} | {} |",
                    row.goal,
                    row.onecopy,
                    row.restic,
                    row.ratio,
                    if row.met { "yes" } else { "no" }
                );
            }
        }
    }
    text
}

/// Per dataset, one row of four panels: the repository's size after each snapshot, each
/// snapshot's backup time, the single operations side by side (first backup, unchanged
/// backup, restore of the newest, deletion of the oldest), and peak memory with the most an
/// unchanged backup read (`rchar`).
pub fn figure(results: &PeersResults) -> Figure {
    let mut figure = Figure::new("onecopy against restic, borg, rustic and bupstash", 4);
    for dataset in &results.datasets {
        let summaries = summarize(dataset);
        let series_points = |tool: Tool, value: &dyn Fn(&BackupRun) -> f64| -> Vec<(f64, f64)> {
            dataset
                .backups
                .iter()
                .filter(|backup| backup.tool == tool && backup.kind == BackupKind::Series)
                .map(|backup| (f64::from(backup.number), value(backup)))
                .collect()
        };
        figure.panels.push(Panel::Lines(LinePanel {
            title: format!("{}: repository size", dataset.dataset),
            x_label: "snapshot".into(),
            y_label: "MiB".into(),
            x_scale: AxisScale::Linear,
            y_scale: AxisScale::Linear,
            series: summaries
                .iter()
                .map(|summary| LineSeries {
                    name: summary.tool.name().into(),
                    points: series_points(summary.tool, &|backup| {
                        backup.repository_bytes as f64 / MIB
                    }),
                })
                .collect(),
        }));
        figure.panels.push(Panel::Lines(LinePanel {
            title: format!("{}: backup of each snapshot", dataset.dataset),
            x_label: "snapshot".into(),
            y_label: "seconds".into(),
            x_scale: AxisScale::Linear,
            y_scale: AxisScale::Log10,
            series: summaries
                .iter()
                .map(|summary| LineSeries {
                    name: summary.tool.name().into(),
                    points: series_points(summary.tool, &|backup| backup.run.seconds),
                })
                .collect(),
        }));
        figure.panels.push(Panel::Bars(BarPanel {
            title: format!("{}: operations", dataset.dataset),
            x_label: String::new(),
            y_label: "seconds".into(),
            y_scale: AxisScale::Log10,
            categories: vec![
                "first".into(),
                "unchanged".into(),
                "restore".into(),
                "delete".into(),
            ],
            series: summaries
                .iter()
                .map(|summary| BarSeries {
                    name: summary.tool.name().into(),
                    values: vec![
                        summary.first_seconds(),
                        summary.unchanged_seconds(),
                        summary.restore_seconds(),
                        summary.deletion.map_or(f64::NAN, |run| run.seconds),
                    ],
                })
                .collect(),
            value_labels: false,
        }));
        figure.panels.push(Panel::Bars(BarPanel {
            title: format!("{}: memory and reads", dataset.dataset),
            x_label: String::new(),
            y_label: "MiB".into(),
            y_scale: AxisScale::Log10,
            categories: vec!["peak memory".into(), "unchanged: read".into()],
            series: summaries
                .iter()
                .map(|summary| BarSeries {
                    name: summary.tool.name().into(),
                    values: vec![
                        summary.peak_rss_bytes as f64 / MIB,
                        summary.unchanged_read_call_bytes() as f64 / MIB,
                    ],
                })
                .collect(),
            value_labels: false,
        }));
    }
    figure
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paper2::peers::Encryption;
    use crate::peers::{DeletionRun, PeerDataset, SnapshotInfo};
    use crate::results::HostSnapshot;

    fn run(seconds: f64, rss_mebibytes: u64, read_mebibytes: u64) -> ToolRun {
        ToolRun {
            seconds,
            user_seconds: seconds,
            max_rss_bytes: rss_mebibytes << 20,
            read_call_bytes: read_mebibytes << 20,
            ..ToolRun::default()
        }
    }

    /// A made-up dataset: onecopy's repository is 0.8x restic's, its first backups 2x, 4x and
    /// 4x faster by round, restores 2.5x, unchanged backups 2x (one round 4x), reading 2 MiB
    /// of 100.
    fn dataset() -> DatasetResults {
        let mut backups = Vec::new();
        for (tool, first, later, bytes) in [
            (Tool::Onecopy, 1.0, 0.5, 80u64 << 20),
            (Tool::Restic, 2.0, 1.0, 100 << 20),
        ] {
            for number in 1..=2 {
                backups.push(BackupRun {
                    tool,
                    kind: BackupKind::Series,
                    number,
                    run: run(if number == 1 { first } else { later }, 50, 100),
                    reverse_seconds: 0.0,
                    repository_bytes: bytes / 2 * u64::from(number),
                    cache_bytes: 0,
                });
            }
        }
        for number in 2..=3 {
            for (tool, seconds) in [(Tool::Onecopy, 1.0), (Tool::Restic, 4.0)] {
                backups.push(BackupRun {
                    tool,
                    kind: BackupKind::First,
                    number,
                    run: run(seconds, 50, 100),
                    reverse_seconds: 0.0,
                    repository_bytes: 10 << 20,
                    cache_bytes: 0,
                });
            }
        }
        for (number, ours, theirs) in [(1, 1.0, 2.0), (2, 0.5, 2.0), (3, 1.0, 2.0)] {
            for (tool, seconds, read) in [(Tool::Onecopy, ours, 2), (Tool::Restic, theirs, 1)] {
                backups.push(BackupRun {
                    tool,
                    kind: BackupKind::Unchanged,
                    number,
                    run: run(seconds, if tool == Tool::Onecopy { 60 } else { 55 }, read),
                    reverse_seconds: 0.0,
                    repository_bytes: 200 << 20,
                    cache_bytes: 0,
                });
            }
        }
        let restores = (1..=3)
            .flat_map(|round| {
                [
                    RestoreRun {
                        tool: Tool::Onecopy,
                        round,
                        run: run(0.4, 40, 0),
                    },
                    RestoreRun {
                        tool: Tool::Restic,
                        round,
                        run: run(1.0, 40, 0),
                    },
                ]
            })
            .collect();
        DatasetResults {
            dataset: PeerDataset::Debian,
            snapshots: vec![
                SnapshotInfo {
                    name: "a".into(),
                    logical_bytes: 90 << 20,
                    files: 10,
                    changes: String::new(),
                },
                SnapshotInfo {
                    name: "b".into(),
                    logical_bytes: 100 << 20,
                    files: 10,
                    changes: "packages: 1 added, 0 removed, 0 upgraded".into(),
                },
            ],
            backups,
            restores,
            deletions: vec![DeletionRun {
                tool: Tool::Onecopy,
                backups_before: 5,
                steps: vec![("expire".into(), run(0.1, 30, 0))],
                total: run(0.1, 30, 0),
                repository_bytes_before: 200 << 20,
                repository_bytes_after: 150 << 20,
            }],
        }
    }

    /// Goal: the goal table judges each of the goals from the measures, per round
    /// where rounds exist; method: the made-up dataset above.
    #[test]
    fn goals_are_judged() {
        let rows = goal_table(&dataset());
        let verdict = |prefix: &str| {
            rows.iter()
                .find(|row| row.goal.starts_with(prefix))
                .unwrap_or_else(|| panic!("no row {prefix}"))
                .clone()
        };
        assert!(verdict("repository size").met);
        assert_eq!(
            verdict("repository size").ratio,
            "0.80x (after each snapshot 0.80-0.80x)"
        );
        let first = verdict("first backup");
        assert!(first.met, "median of 2x, 4x and 4x");
        assert!(
            first.ratio.starts_with("4.00x faster (2.00-4.00"),
            "{}",
            first.ratio
        );
        assert!(verdict("restore of the newest").met);
        let unchanged = verdict("backup of the unchanged tree >=");
        assert!(!unchanged.met, "median ratio 2x");
        assert_eq!(unchanged.ratio, "2.00x faster (2.00-4.00; CPU 2.00x less)");
        let reads = verdict("backup of the unchanged tree reads");
        assert!(!reads.met, "2 MiB of 100 is 2%");
        assert!(!verdict("peak memory").met, "60 MiB against 55");
        let summary = &summarize(&dataset())[0];
        assert_eq!(summary.later_backups.len(), 1);
        assert_eq!(summary.reclaimed_bytes, 50 << 20);
        assert_eq!(summary.repository_bytes_series(), 80 << 20);
    }

    /// Goal: the outputs are written and name every tool; method: the made-up dataset into
    /// a temporary directory.
    #[test]
    fn outputs_are_written() {
        let directory = tempfile::tempdir().expect("temporary directory");
        let results = PeersResults {
            tools: Vec::new(),
            encryption: Encryption::On,
            rounds: 3,
            host_before: HostSnapshot::default(),
            host_after: HostSnapshot::default(),
            datasets: vec![dataset()],
            seconds: 1.0,
            restore_directory: PathBuf::from("/dev/shm"),
        };
        let written = write_outputs(directory.path(), &results).expect("written");
        assert_eq!(written.len(), 8);
        let summary = std::fs::read_to_string(directory.path().join("summary.md")).expect("read");
        assert!(
            summary.contains("| onecopy | 80.0 MiB / 200.0 MiB |"),
            "{summary}"
        );
        assert!(summary.contains("| restic |"));
        assert!(summary.contains("10 files; packages: 1 added"), "{summary}");
        let svg = std::fs::read_to_string(directory.path().join("peers.svg")).expect("read");
        assert!(svg.contains("debian: repository size"));
    }
}
