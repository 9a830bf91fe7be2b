//! The CSV tables behind the figures (`backups.csv`, `restores.csv`, `reverses.csv`,
//! `space.csv`, `deletions.csv`, `unique.csv`, `peers.csv`, `goals.csv`) and `summary.md`,
//! the measured tables that docs/LAB.md and docs/BENCHMARKS.md quote.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use onecopy_backup::DeleteMethod;

use super::comparison::ComparisonResults;
use super::figures::{
    final_inline_saving, final_saving, mean, mean_deviation, rate, spread, LIVE_WINDOW_STORES,
    MEBIBYTE,
};
use super::Paper2Results;
use crate::error::Result;
use crate::results::{number_cell, CsvTable};

/// Writes the CSV tables; returns the paths.
pub fn write_tables(directory: &Path, results: &Paper2Results) -> Result<Vec<PathBuf>> {
    let mut backups = CsvTable::new(&[
        "dataset",
        "store",
        "series",
        "version",
        "run",
        "logical_bytes",
        "zero_bytes",
        "new_stored_bytes",
        "segments_new",
        "index_seconds",
        "write_seconds",
        "seal_seconds",
        "seconds",
        "cpu_seconds",
        "load",
        "mb_per_s",
        "mb_per_cpu_s",
    ]);
    let mut restores = CsvTable::new(&[
        "dataset",
        "store",
        "series",
        "version",
        "run",
        "prefetch",
        "cold_cache",
        "verified",
        "logical_bytes",
        "read_bytes",
        "reads",
        "containers_read",
        "chain_length_max",
        "sink_seconds",
        "seconds",
        "cpu_seconds",
        "load",
        "mb_per_s",
    ]);
    let mut reverses = CsvTable::new(&[
        "dataset",
        "store",
        "series",
        "version",
        "run",
        "logical_bytes",
        "read_bytes",
        "written_bytes",
        "seconds",
        "cpu_seconds",
        "load",
        "mb_per_s",
    ]);
    let mut space = CsvTable::new(&[
        "dataset",
        "store",
        "week",
        "logical_bytes",
        "zero_bytes",
        "inline_stored_bytes",
        "container_bytes",
        "repository_bytes",
        "inline_saving_percent",
        "saving_percent",
    ]);
    let mut deletions = CsvTable::new(&[
        "dataset",
        "kind",
        "store",
        "run",
        "backups",
        "version",
        "deleted",
        "method",
        "metadata_seconds",
        "sweep_seconds",
        "seconds",
        "containers_removed",
        "scanned_bytes",
        "load",
    ]);
    for dataset in &results.datasets {
        let name = &dataset.dataset;
        for record in &dataset.backups {
            backups.push(vec![
                name.clone(),
                record.store.clone(),
                record.series.clone(),
                record.version.to_string(),
                record.run.to_string(),
                record.logical_bytes.to_string(),
                record.zero_bytes.to_string(),
                record.new_stored_bytes.to_string(),
                record.segments_new.to_string(),
                number_cell(record.index_seconds),
                number_cell(record.write_seconds),
                number_cell(record.seal_seconds),
                number_cell(record.timing.seconds),
                number_cell(record.timing.cpu_seconds),
                number_cell(record.timing.load_average),
                number_cell(rate(record.logical_bytes, record.timing.seconds)),
                number_cell(rate(record.logical_bytes, record.timing.cpu_seconds)),
            ]);
        }
        for record in &dataset.restores {
            restores.push(vec![
                name.clone(),
                record.store.clone(),
                record.series.clone(),
                record.version.to_string(),
                record.run.to_string(),
                record.prefetch.to_string(),
                record.cold_cache.to_string(),
                record.verified.to_string(),
                record.logical_bytes.to_string(),
                record.read_bytes.to_string(),
                record.reads.to_string(),
                record.containers_read.to_string(),
                record.chain_length_max.to_string(),
                number_cell(record.sink_seconds),
                number_cell(record.timing.seconds),
                number_cell(record.timing.cpu_seconds),
                number_cell(record.timing.load_average),
                number_cell(rate(record.logical_bytes, record.timing.seconds)),
            ]);
        }
        for record in &dataset.reverses {
            reverses.push(vec![
                name.clone(),
                record.store.clone(),
                record.series.clone(),
                record.version.to_string(),
                record.run.to_string(),
                record.logical_bytes.to_string(),
                record.read_bytes.to_string(),
                record.written_bytes.to_string(),
                number_cell(record.timing.seconds),
                number_cell(record.timing.cpu_seconds),
                number_cell(record.timing.load_average),
                number_cell(rate(record.logical_bytes, record.timing.seconds)),
            ]);
        }
        for record in &dataset.space {
            space.push(vec![
                name.clone(),
                record.store.clone(),
                record.week.to_string(),
                record.logical_bytes.to_string(),
                record.zero_bytes.to_string(),
                record.inline_stored_bytes.to_string(),
                record.space.container_bytes.to_string(),
                record.space.repository_bytes.to_string(),
                number_cell(record.inline_saving_percent()),
                number_cell(record.saving_percent()),
            ]);
        }
        let deletion_rows = dataset
            .deletions
            .iter()
            .map(|record| ("checkpoint", record.backups, &record.measure))
            .chain(
                dataset
                    .incremental_deletions
                    .iter()
                    .map(|measure| ("incremental", 0, measure)),
            );
        for record in &dataset.batch_deletions {
            deletions.push(vec![
                name.clone(),
                "batch".to_string(),
                record.store.clone(),
                record.run.to_string(),
                dataset.versions.to_string(),
                String::new(),
                record.deleted.to_string(),
                format!("{:?}", record.method),
                number_cell(record.metadata_seconds),
                number_cell(record.sweep_seconds),
                number_cell(record.timing.seconds),
                record.containers_removed.to_string(),
                record.scanned_bytes.to_string(),
                number_cell(record.timing.load_average),
            ]);
        }
        for (kind, backups_in_store, measure) in deletion_rows {
            deletions.push(vec![
                name.clone(),
                kind.to_string(),
                measure.store.clone(),
                measure.run.to_string(),
                backups_in_store.to_string(),
                measure.version.to_string(),
                "1".to_string(),
                format!("{:?}", measure.method),
                number_cell(measure.metadata_seconds),
                number_cell(measure.sweep_seconds),
                number_cell(measure.timing.seconds),
                measure.containers_removed.to_string(),
                measure.scanned_bytes.to_string(),
                number_cell(measure.timing.load_average),
            ]);
        }
    }
    let mut tables = vec![
        ("backups.csv", backups),
        ("restores.csv", restores),
        ("reverses.csv", reverses),
        ("space.csv", space),
        ("deletions.csv", deletions),
    ];
    if let Some(unique) = &results.unique {
        let mut table = CsvTable::new(&[
            "step",
            "run",
            "bytes",
            "seconds",
            "cpu_seconds",
            "load",
            "mb_per_s",
        ]);
        let mut push = |step: &str, run: u32, timing: &super::measure::Timing| {
            table.push(vec![
                step.to_string(),
                run.to_string(),
                unique.bytes.to_string(),
                number_cell(timing.seconds),
                number_cell(timing.cpu_seconds),
                number_cell(timing.load_average),
                number_cell(rate(unique.bytes, timing.seconds)),
            ]);
        };
        for limits in &unique.limits {
            push("memcpy", limits.run, &limits.memcpy);
            push("blake3", limits.run, &limits.hash);
            push("raw write", limits.run, &limits.raw_write);
            push("raw read", limits.run, &limits.raw_read);
        }
        for run in &unique.stores {
            push(&format!("{} backup", run.store), run.run, &run.backup);
            push(&format!("{} restore", run.store), run.run, &run.restore);
        }
        tables.push(("unique.csv", table));
    }
    if let Some(comparison) = &results.comparison {
        let mut peers = CsvTable::new(&[
            "tool",
            "version",
            "release",
            "logical_bytes",
            "backup_seconds",
            "backup_cpu_seconds",
            "backup_rss_bytes",
            "reverse_seconds",
            "restore_seconds",
            "restore_cpu_seconds",
            "restore_rss_bytes",
            "repository_bytes",
            "load",
        ]);
        for measure in &comparison.versions {
            peers.push(vec![
                measure.tool.name().into(),
                measure.version.to_string(),
                measure.release.clone(),
                measure.logical_bytes.to_string(),
                number_cell(measure.backup.seconds),
                number_cell(measure.backup.cpu_seconds()),
                measure.backup.max_rss_bytes.to_string(),
                number_cell(measure.reverse_seconds),
                number_cell(measure.restore_newest.seconds),
                number_cell(measure.restore_newest.cpu_seconds()),
                measure.restore_newest.max_rss_bytes.to_string(),
                measure.repository_bytes.to_string(),
                number_cell(measure.backup.load_average),
            ]);
        }
        tables.push(("peers.csv", peers));
        let mut goals = CsvTable::new(&["goal", "ours", "peer", "ratio", "met"]);
        for row in &results.goals {
            goals.push(vec![
                row.goal.clone(),
                row.ours.clone(),
                row.peer.clone(),
                row.ratio.clone(),
                row.met.to_string(),
            ]);
        }
        tables.push(("goals.csv", goals));
    }
    let mut written = Vec::new();
    for (name, table) in tables {
        let path = directory.join(name);
        table.write(&path)?;
        written.push(path);
    }
    Ok(written)
}

/// `(mean, low, high)` as `mean (low-high)` with `digits` decimals, or the mean alone when
/// one run gave it.
fn spread_text((average, low, high): (f64, f64, f64), digits: usize) -> String {
    if !average.is_finite() {
        return "-".to_string();
    }
    if (high - low).abs() < f64::EPSILON {
        format!("{average:.digits$}")
    } else {
        format!("{average:.digits$} ({low:.digits$}-{high:.digits$})")
    }
}

/// Table 2: throughput on unique data beside the raw disk and the machine's limits.
fn unique_summary(text: &mut String, unique: &super::unique::UniqueResults) {
    let bytes = unique.bytes;
    let stat = |values: Vec<f64>| mean_deviation(&values);
    let cell = |(average, deviation): (f64, f64)| format!("{average:.0} ({deviation:.0})");
    let limit = |pick: &dyn Fn(&super::unique::LimitsRun) -> f64| {
        stat(
            unique
                .limits
                .iter()
                .map(|run| rate(bytes, pick(run)))
                .collect(),
        )
    };
    let raw_write = limit(&|run| run.raw_write.seconds);
    let raw_read = limit(&|run| run.raw_read.seconds);
    let _ = writeln!(
        text,
        "## Unique data (Table 2), {} MiB of random bytes, {} runs, MB/s mean (standard \
         deviation)\n\nLimits measured in the same runs: memcpy {}, BLAKE3 of 4 KiB pieces on \
         one core {}, raw disk write (write + fdatasync) {}, raw disk read (cold cache) {}.\n\n\
         | store | write | of raw write | read | of raw read | backup CPU s per GB | restore CPU \
         s per GB |\n|---|---|---|---|---|---|---|",
        bytes >> 20,
        unique.limits.len(),
        cell(limit(&|run| run.memcpy.seconds)),
        cell(limit(&|run| run.hash.seconds)),
        cell(raw_write),
        cell(raw_read)
    );
    for config in super::unique::unique_stores() {
        let runs: Vec<_> = unique
            .stores
            .iter()
            .filter(|run| run.store == config.label)
            .collect();
        let write = stat(
            runs.iter()
                .map(|run| rate(bytes, run.backup.seconds))
                .collect(),
        );
        let read = stat(
            runs.iter()
                .map(|run| rate(bytes, run.restore.seconds))
                .collect(),
        );
        let cpu = mean(
            runs.iter()
                .map(|run| run.backup.cpu_seconds / (bytes as f64 / 1e9)),
        );
        let restore_cpu = mean(
            runs.iter()
                .map(|run| run.restore.cpu_seconds / (bytes as f64 / 1e9)),
        );
        let _ = writeln!(
            text,
            "| {} | {} | {:.1}% | {} | {:.1}% | {cpu:.2} | {restore_cpu:.2} |",
            config.label,
            cell(write),
            100.0 * write.0 / raw_write.0,
            cell(read),
            100.0 * read.0 / raw_read.0,
        );
    }
    let _ = writeln!(text);
}

/// Table 3 and what explains its write column: per store, the second SG1 backup's index and
/// write times, the disk's part (the seal), and the write cost per new segment and per MiB.
fn write_path_summary(text: &mut String, sg1: &super::experiments::DatasetResults) {
    let _ = writeln!(
        text,
        "\n## Write path of the second SG1 backup (Table 3), mean of {} runs\n\n\
         *write s* is packing new segments into containers (records and buffered writes, as \
         the paper's data writes); *seal s* is the wait for the disk at the end. Per new \
         segment and per new MiB show where each mode's write time goes.\n\n\
         | store | index lookups | index s | write s | seal s | new segments | new MiB | write \
         µs per new segment | write ms per new MiB | backup s |\n|---|---|---|---|---|---|---|---|---|---|",
        sg1.runs
    );
    for store in ["conv", "rev-1M", "rev-4M", "rev-8M"] {
        let records: Vec<_> = sg1
            .backups
            .iter()
            .filter(|record| record.store == store && record.version == 2)
            .collect();
        let Some(first) = records.first() else {
            continue;
        };
        let average = |pick: &dyn Fn(&super::measure::BackupMeasure) -> f64| {
            mean(records.iter().map(|record| pick(record)))
        };
        let write = average(&|record| record.write_seconds);
        let new_mib = first.new_stored_bytes as f64 / MEBIBYTE;
        let _ = writeln!(
            text,
            "| {store} | {} | {:.4} | {write:.4} | {:.4} | {} | {new_mib:.1} | {:.1} | {:.2} | {:.2} |",
            first.index_lookups,
            average(&|record| record.index_seconds),
            average(&|record| record.seal_seconds),
            first.segments_new,
            1e6 * write / first.segments_new.max(1) as f64,
            1e3 * write / new_mib.max(f64::MIN_POSITIVE),
            average(&|record| record.timing.seconds)
        );
    }
}

/// Fig. 10b: deleting the n oldest backups at once.
fn batch_summary(text: &mut String, sg1: &super::experiments::DatasetResults) {
    if sg1.batch_deletions.is_empty() {
        return;
    }
    let _ = writeln!(
        text,
        "\n## Deleting the n oldest of {} backups at once (Fig. 10b), SG1, seconds, mean \
         (lowest-highest) of {} runs\n\n| n | rev-4M time stamps | rev-4M mark | rev-4M \
         sweep | rev-4M mark and sweep | conv mark | conv sweep | conv mark and sweep |\n\
         |---|---|---|---|---|---|---|---|",
        sg1.versions, sg1.runs
    );
    let counts: std::collections::BTreeSet<u32> = sg1
        .batch_deletions
        .iter()
        .map(|record| record.deleted)
        .collect();
    for count in counts {
        let pick = |store: &str,
                    method: DeleteMethod,
                    value: &dyn Fn(&super::measure::BatchDeleteMeasure) -> f64| {
            let values: Vec<f64> = sg1
                .batch_deletions
                .iter()
                .filter(|record| {
                    record.deleted == count && record.store == store && record.method == method
                })
                .map(value)
                .collect();
            spread_text(spread(&values), 4)
        };
        let total = |record: &super::measure::BatchDeleteMeasure| record.timing.seconds;
        let mark = |record: &super::measure::BatchDeleteMeasure| record.metadata_seconds;
        let sweep = |record: &super::measure::BatchDeleteMeasure| record.sweep_seconds;
        let _ = writeln!(
            text,
            "| {count} | {} | {} | {} | {} | {} | {} | {} |",
            pick("rev-4M", DeleteMethod::Timestamp, &total),
            pick("rev-4M", DeleteMethod::MarkAndSweep, &mark),
            pick("rev-4M", DeleteMethod::MarkAndSweep, &sweep),
            pick("rev-4M", DeleteMethod::MarkAndSweep, &total),
            pick("conv", DeleteMethod::MarkAndSweep, &mark),
            pick("conv", DeleteMethod::MarkAndSweep, &sweep),
            pick("conv", DeleteMethod::MarkAndSweep, &total),
        );
    }
}

/// How the newest backup of a dataset restores from each store: throughput over runs, and
/// what the restore did (reads, containers, bytes) and spent (CPU, the lab's sink).
fn newest_restore_summary(text: &mut String, dataset: &super::experiments::DatasetResults) {
    let newest = dataset.versions;
    let _ = writeln!(
        text,
        "\n## Restore of the newest backup (week {newest}), {}, per restore: mean (lowest-highest) \
         over {} runs x {} series\n\n*CPU/wall* near 1 means the restore waits for the processor, \
         not the disk; *sink s* is the lab's verification of the stream (BLAKE3), which runs on \
         the restore's writer thread.\n\n| store | MB/s | wall s | CPU s | CPU/wall | sink s | \
         reads | containers | read MiB |\n|---|---|---|---|---|---|---|---|---|",
        dataset.dataset.to_uppercase(),
        dataset.runs,
        dataset.series
    );
    for store in ["conv", "rev-1M", "rev-4M", "rev-8M"] {
        let records: Vec<_> = dataset
            .restores
            .iter()
            .filter(|record| record.store == store && record.version == newest && !record.prefetch)
            .collect();
        if records.is_empty() {
            continue;
        }
        let values = |pick: &dyn Fn(&super::measure::RestoreMeasure) -> f64| -> Vec<f64> {
            records.iter().map(|record| pick(record)).collect()
        };
        let wall = mean(values(&|record| record.timing.seconds));
        let cpu = mean(values(&|record| record.timing.cpu_seconds));
        let _ = writeln!(
            text,
            "| {store} | {} | {wall:.3} | {cpu:.3} | {:.2} | {:.3} | {:.0} | {:.0} | {:.1} |",
            spread_text(
                spread(&values(&|record| rate(
                    record.logical_bytes,
                    record.timing.seconds
                ))),
                0
            ),
            cpu / wall,
            mean(values(&|record| record.sink_seconds)),
            mean(values(&|record| record.reads as f64)),
            mean(values(&|record| record.containers_read as f64)),
            mean(values(&|record| record.read_bytes as f64)) / MEBIBYTE,
        );
    }
}

/// The measured tables in Markdown.
pub fn summary(results: &Paper2Results) -> String {
    let mut text = String::new();
    let scale = &results.scale;
    let _ = writeln!(
        text,
        "# Paper 2 results\n\nScale: {} MiB images holding {} MiB of files, {} weeks (SG1-5), GP \
         {} series x {} weeks, {} typescript releases. Load average before/after: {:.2}/{:.2} on \
         {} CPUs. Run time {:.0} s. Runs of each dataset (timings are means over runs; ranges \
         are the lowest and highest run): {}.\n",
        scale.image_bytes >> 20,
        scale.content_bytes >> 20,
        scale.weeks,
        scale.group_series,
        scale.group_weeks,
        scale.releases,
        results.host_before.load_average[0],
        results.host_after.load_average[0],
        results.host_before.cpus,
        results.seconds,
        results
            .datasets
            .iter()
            .map(|dataset| format!("{} {}", dataset.dataset, dataset.runs))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if let Some(unique) = &results.unique {
        unique_summary(&mut text, unique);
    }
    let _ = writeln!(
        text,
        "## Storage saving (Fig. 4), % of non-null bytes after the last backup\n\n| dataset | \
         Conv | rev-1M inline | rev-1M | rev-4M inline | rev-4M | rev-8M inline | rev-8M |\n|---|---|---|---|---|---|---|---|"
    );
    for dataset in &results.datasets {
        let cell =
            |value: Option<f64>| value.map_or("-".to_string(), |value| format!("{value:.1}"));
        let _ = writeln!(
            text,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            dataset.dataset,
            cell(final_saving(dataset, "conv")),
            cell(final_inline_saving(dataset, "rev-1M")),
            cell(final_saving(dataset, "rev-1M")),
            cell(final_inline_saving(dataset, "rev-4M")),
            cell(final_saving(dataset, "rev-4M")),
            cell(final_inline_saving(dataset, "rev-8M")),
            cell(final_saving(dataset, "rev-8M")),
        );
    }
    let _ = writeln!(
        text,
        "\n## Throughput (Fig. 5-7), MB/s of logical bytes, mean over versions 2.. (backup) or \
         all versions (restore)\n\n| dataset | store | backup wall | backup CPU | restore first | \
         restore last | restore mean | reverse wall |\n|---|---|---|---|---|---|---|---|"
    );
    for dataset in &results.datasets {
        for config in &dataset.stores {
            let store = config.label.as_str();
            let backups: Vec<_> = dataset
                .backups
                .iter()
                .filter(|record| record.store == store && record.version >= 2)
                .collect();
            let restores: Vec<_> = dataset
                .restores
                .iter()
                .filter(|record| record.store == store && !record.prefetch)
                .collect();
            let restore_at = |version: u32| {
                mean(
                    restores
                        .iter()
                        .filter(|record| record.version == version)
                        .map(|record| rate(record.logical_bytes, record.timing.seconds)),
                )
            };
            let reverse = mean(
                dataset
                    .reverses
                    .iter()
                    .filter(|record| record.store == store)
                    .map(|record| rate(record.logical_bytes, record.timing.seconds)),
            );
            let _ = writeln!(
                text,
                "| {} | {store} | {} | {} | {} | {} | {} | {} |",
                dataset.dataset,
                Whole(mean(backups.iter().map(|record| rate(
                    record.logical_bytes,
                    record.timing.seconds
                )))),
                Whole(mean(backups.iter().map(|record| rate(
                    record.logical_bytes,
                    record.timing.cpu_seconds
                )))),
                Whole(restore_at(1)),
                Whole(restore_at(dataset.versions)),
                Whole(mean(restores.iter().map(|record| rate(
                    record.logical_bytes,
                    record.timing.seconds
                )))),
                Whole(reverse),
            );
        }
    }
    if let Some(sg1) = results
        .datasets
        .iter()
        .find(|dataset| dataset.dataset == "sg1")
    {
        write_path_summary(&mut text, sg1);
        let _ = writeln!(text, "\n## Prefetching (Fig. 8), SG1, mean restore MB/s\n\n| store | without | with | gain |\n|---|---|---|---|");
        for store in ["conv", "rev-4M"] {
            let average = |prefetch: bool| {
                mean(
                    sg1.restores
                        .iter()
                        .filter(|record| record.store == store && record.prefetch == prefetch)
                        .map(|record| rate(record.logical_bytes, record.timing.seconds)),
                )
            };
            let (without, with) = (average(false), average(true));
            let _ = writeln!(
                text,
                "| {store} | {without:.0} | {with:.0} | {:+.1}% |",
                100.0 * (with / without - 1.0)
            );
        }
        let _ = writeln!(text, "\n## Live window (Fig. 9), SG1\n\n| store | restore mean MB/s | oldest | newest | saving % |\n|---|---|---|---|---|");
        for store in LIVE_WINDOW_STORES {
            let restores: Vec<_> = sg1
                .restores
                .iter()
                .filter(|record| record.store == store && !record.prefetch)
                .collect();
            if restores.is_empty() {
                continue;
            }
            let at = |version: u32| {
                mean(
                    restores
                        .iter()
                        .filter(|record| record.version == version)
                        .map(|record| rate(record.logical_bytes, record.timing.seconds)),
                )
            };
            let _ = writeln!(
                text,
                "| {store} | {:.0} | {:.0} | {:.0} | {:.1} |",
                mean(
                    restores
                        .iter()
                        .map(|record| rate(record.logical_bytes, record.timing.seconds))
                ),
                at(1),
                at(sg1.versions),
                final_saving(sg1, store).unwrap_or(f64::NAN)
            );
        }
        let _ = writeln!(text, "\n## Deletion of the oldest backup (Fig. 10), SG1 rev-4M, seconds\n\n| backups | container MiB | time stamps | mark | sweep | mark and sweep |\n|---|---|---|---|---|---|");
        let backups_measured: std::collections::BTreeSet<u32> =
            sg1.deletions.iter().map(|record| record.backups).collect();
        for backups in backups_measured {
            let records: Vec<_> = sg1
                .deletions
                .iter()
                .filter(|record| record.backups == backups)
                .collect();
            let average =
                |method: DeleteMethod, pick: &dyn Fn(&super::measure::DeleteMeasure) -> f64| {
                    mean(
                        records
                            .iter()
                            .filter(|record| record.measure.method == method)
                            .map(|record| pick(&record.measure)),
                    )
                };
            let mark = average(DeleteMethod::MarkAndSweep, &|measure| {
                measure.metadata_seconds
            });
            let sweep = average(DeleteMethod::MarkAndSweep, &|measure| measure.sweep_seconds);
            let _ = writeln!(
                text,
                "| {backups} | {:.0} | {:.4} | {mark:.4} | {sweep:.3} | {:.3} |",
                records[0].container_bytes_before as f64 / MEBIBYTE,
                average(DeleteMethod::Timestamp, &|measure| measure.timing.seconds),
                mark + sweep
            );
        }
        let incremental = |method: DeleteMethod| {
            mean(
                sg1.incremental_deletions
                    .iter()
                    .filter(|record| record.method == method)
                    .map(|record| record.timing.seconds),
            )
        };
        let _ = writeln!(
            text,
            "\nOne by one from the oldest (Fig. 10a), mean seconds per deletion: time stamps \
             {:.4}, mark and sweep {:.3}.",
            incremental(DeleteMethod::Timestamp),
            incremental(DeleteMethod::MarkAndSweep)
        );
        batch_summary(&mut text, sg1);
    }
    for dataset in &results.datasets {
        if dataset.dataset == "gp" || dataset.dataset == "sg1" {
            newest_restore_summary(&mut text, dataset);
        }
    }
    if let Some(comparison) = &results.comparison {
        comparison_summary(&mut text, comparison, &results.goals);
    }
    text
}

fn comparison_summary(
    text: &mut String,
    comparison: &ComparisonResults,
    goals: &[super::comparison::GoalRow],
) {
    let _ = writeln!(
        text,
        "\n## Peers on the typescript series\n\n| tool | version | settings |\n|---|---|---|"
    );
    for (tool, version, settings) in &comparison.tools {
        let _ = writeln!(text, "| {tool} | {version} | {settings} |");
    }
    let _ = writeln!(
        text,
        "\nPage cache dropped before each timed command: {}.\n\n| tool | backups total s (wall) | \
         backups total CPU s | first backup s | later backups mean s | restore newest first/last s | \
         restore oldest s | repository MiB | peak RSS MiB |\n|---|---|---|---|---|---|---|---|---|",
        comparison.cold_cache
    );
    for (tool, _, _) in &comparison.tools {
        let measures: Vec<_> = comparison
            .versions
            .iter()
            .filter(|measure| measure.tool == *tool)
            .collect();
        let (Some(first), Some(last)) = (measures.first(), measures.last()) else {
            continue;
        };
        let oldest = comparison
            .restore_oldest
            .iter()
            .find(|(owner, _)| owner == tool)
            .map_or(f64::NAN, |(_, run)| run.seconds);
        let rss = measures
            .iter()
            .flat_map(|measure| {
                [
                    measure.backup.max_rss_bytes,
                    measure.restore_newest.max_rss_bytes,
                ]
            })
            .max()
            .unwrap_or(0);
        let _ = writeln!(
            text,
            "| {tool} | {:.2} | {:.2} | {:.3} | {:.3} | {:.3} / {:.3} | {oldest:.3} | {:.1} | {:.1} |",
            measures.iter().map(|measure| measure.backup.seconds).sum::<f64>(),
            measures.iter().map(|measure| measure.backup.cpu_seconds()).sum::<f64>(),
            first.backup.seconds,
            mean(measures.iter().skip(1).map(|measure| measure.backup.seconds)),
            first.restore_newest.seconds,
            last.restore_newest.seconds,
            last.repository_bytes as f64 / MEBIBYTE,
            rss as f64 / MEBIBYTE,
        );
    }
    let _ = writeln!(text, "\nDeleting the oldest backup (copy of the repository, cold cache):\n\n| tool | backups | repository MiB | steps | seconds | CPU s | peak RSS MiB |\n|---|---|---|---|---|---|---|");
    for deletion in &comparison.deletions {
        let steps: Vec<String> = deletion
            .steps
            .iter()
            .map(|(name, run)| format!("{name} {:.3}", run.seconds))
            .collect();
        let _ = writeln!(
            text,
            "| {} | {} | {:.1} | {} | {:.3} | {:.3} | {:.1} |",
            deletion.tool,
            deletion.backups,
            deletion.repository_bytes as f64 / MEBIBYTE,
            steps.join(", "),
            deletion.total.seconds,
            deletion.total.cpu_seconds(),
            deletion.total.max_rss_bytes as f64 / MEBIBYTE
        );
    }
    let _ = writeln!(
        text,
        "\n## Goals\n\n| goal | onecopy | peer | ratio | met |\n|---|---|---|---|---|"
    );
    for row in goals {
        let _ = writeln!(
            text,
            "| {} | {} | {} | {} | {} |",
            row.goal,
            row.ours,
            row.peer,
            row.ratio,
            if row.met { "yes" } else { "**no**" }
        );
    }
}

/// A table cell rounded to a whole number, or `-` where nothing was measured (the mean of no
/// values is NaN: restores of SG2-SG5 are not run, Conv has no reverse phase).
struct Whole(f64);

impl std::fmt::Display for Whole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_finite() {
            write!(f, "{:.0}", self.0)
        } else {
            f.write_str("-")
        }
    }
}
