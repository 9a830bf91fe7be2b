//! The files of a paper 3 run: results.json (everything), results.csv (Fig. 3),
//! mixes.csv (Figs. 9 to 11, one row per workload, system and mix), interference.csv
//! (Figs. 16 and 17), programs.csv (Fig. 15), releases.csv (Table 6), the SVG figures and summary.md (the numbers
//! beside the paper's).

use std::path::{Path, PathBuf};

use super::interference::Interval;
use super::mixes::{MixRun, WorkloadResult, MIXES, SYSTEMS};
use super::Paper3Results;
use crate::error::Result;
use crate::plot::{AxisScale, BarPanel, BarSeries, Figure, LinePanel, LineSeries, Panel};
use crate::results::{number_cell, write_json, write_text, CsvTable};

/// Most points drawn per CDF line (the rest are skipped evenly).
const CDF_POINTS_MAX: usize = 200;

/// The `quantile` (0 to 1) of `values`, by the nearest rank; 0 when empty.
pub fn quantile(values: &[f64], quantile: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((quantile * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// The empirical CDF of `values` as at most [`CDF_POINTS_MAX`] points (value, fraction).
pub fn cdf_points(values: &[f64]) -> Vec<(f64, f64)> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let count = sorted.len();
    let step = count.div_ceil(CDF_POINTS_MAX).max(1);
    let mut points: Vec<(f64, f64)> = sorted
        .iter()
        .enumerate()
        .filter(|(index, _)| index % step == 0 || index + 1 == count)
        .map(|(index, value)| (value.max(1e-3), (index + 1) as f64 / count as f64))
        .collect();
    points.dedup_by(|a, b| a == b);
    points
}

fn sequential_latencies(run: &MixRun) -> Vec<f64> {
    run.file_latencies_ms
        .iter()
        .zip(&run.sequential)
        .filter(|(_, sequential)| **sequential)
        .map(|(latency, _)| *latency)
        .collect()
}

/// Figs. 9 and 10: one CDF panel per mix over all files, then one per mix over the
/// sequentially read files only.
fn latency_figure(number: u32, workload: &WorkloadResult) -> Figure {
    let mut figure = Figure::new(
        format!(
            "Paper 3 Fig. {number}: per-file read response time, {} dedup ratio workload \
             ({} files, {:.0} MB), read cold through FUSE",
            workload.spec.name,
            workload.files,
            workload.bytes as f64 / 1e6
        ),
        MIXES.len(),
    );
    for sequential_only in [false, true] {
        for percent in MIXES {
            let series = SYSTEMS
                .iter()
                .filter_map(|system| workload.run(system, percent))
                .map(|run| LineSeries {
                    name: run.system.clone(),
                    points: cdf_points(&if sequential_only {
                        sequential_latencies(run)
                    } else {
                        run.file_latencies_ms.clone()
                    }),
                })
                .collect();
            figure.panels.push(Panel::Lines(LinePanel {
                title: format!(
                    "{percent}% sequential, {}",
                    if sequential_only {
                        "sequential files"
                    } else {
                        "all files"
                    }
                ),
                x_label: "response time per file (ms)".into(),
                y_label: "fraction of files".into(),
                x_scale: AxisScale::Log10,
                y_scale: AxisScale::Linear,
                series,
            }));
        }
    }
    figure
}

/// Fig. 11: sequential-read throughput of the sequentially read files (bars) and the dedup
/// ratio (lines) per mix, per workload.
fn throughput_figure(workloads: &[WorkloadResult]) -> Figure {
    let mut figure = Figure::new(
        "Paper 3 Fig. 11: sequential-read throughput of the sequentially read files and \
         space savings, per sequential:random mix",
        2,
    );
    for workload in workloads {
        let categories: Vec<String> = MIXES
            .iter()
            .map(|percent| format!("{percent}:{}", 100 - percent))
            .collect();
        let series = ["none", "all-big", "selective", "all-small"]
            .iter()
            .map(|system| BarSeries {
                name: system.to_string(),
                values: MIXES
                    .iter()
                    .map(|&percent| {
                        workload
                            .run(system, percent)
                            .map_or(0.0, |run| run.sequential_mb_per_second)
                    })
                    .collect(),
            })
            .collect();
        figure.panels.push(Panel::Bars(BarPanel {
            title: format!("{} workload: throughput", workload.spec.name),
            x_label: "S:R".into(),
            y_label: "MB/s".into(),
            y_scale: AxisScale::Linear,
            categories,
            series,
            value_labels: false,
        }));
        let series = ["all-big", "selective", "all-small"]
            .iter()
            .map(|system| LineSeries {
                name: system.to_string(),
                points: MIXES
                    .iter()
                    .filter_map(|&percent| {
                        workload
                            .run(system, percent)
                            .map(|run| (percent as f64, run.savings * 100.0))
                    })
                    .collect(),
            })
            .collect();
        figure.panels.push(Panel::Lines(LinePanel {
            title: format!("{} workload: space savings", workload.spec.name),
            x_label: "files read sequentially (%)".into(),
            y_label: "1 - stored / logical (%)".into(),
            x_scale: AxisScale::Linear,
            y_scale: AxisScale::Linear,
            series,
        }));
    }
    figure
}

/// Figs. 16 and 17: the foreground over time, the deduplication run drawn as a box.
fn interference_figure(results: &Paper3Results) -> Figure {
    let timeline = &results.interference;
    let mut figure = Figure::new(
        "Paper 3 Figs. 16 and 17: foreground work while `fs dedup` runs (box: the run), and \
         the mount's idle-started deduplicator between bursts of foreground work",
        2,
    );
    type Value = fn(&Interval) -> f64;
    let panels: [(&str, &str, Value); 3] = [
        ("Fig. 16: file serving throughput", "MB/s", |i| {
            i.serving_mb_per_second
        }),
        ("Fig. 16: file serving latency", "ms per file", |i| {
            i.serving_latency_ms
        }),
        ("Fig. 17: computing (hashing in memory)", "MB/s", |i| {
            i.computing_mb_per_second
        }),
    ];
    for (title, y_label, value) in panels {
        let points: Vec<(f64, f64)> = timeline
            .intervals
            .iter()
            .map(|interval| (interval.start_seconds, value(interval)))
            .collect();
        let top = points.iter().map(|p| p.1).fold(0.0, f64::max);
        let (start, end) = (timeline.dedup_start_seconds, timeline.dedup_end_seconds);
        figure.panels.push(Panel::Lines(LinePanel {
            title: title.into(),
            x_label: "seconds".into(),
            y_label: y_label.into(),
            x_scale: AxisScale::Linear,
            y_scale: AxisScale::Linear,
            series: vec![
                LineSeries {
                    name: "foreground".into(),
                    points,
                },
                LineSeries {
                    name: "fs dedup".into(),
                    points: vec![(start, 0.0), (start, top), (end, top), (end, 0.0)],
                },
            ],
        }));
    }
    let idle = &results.idle;
    figure.panels.push(Panel::Lines(LinePanel {
        title: format!(
            "idle-started runs ({} s idle, {}% share) between bursts",
            idle.idle_seconds, idle.dedup_share_percent
        ),
        x_label: "seconds".into(),
        y_label: "MB pending / MB/s served".into(),
        x_scale: AxisScale::Linear,
        y_scale: AxisScale::Linear,
        series: vec![
            LineSeries {
                name: "pending MB".into(),
                points: idle
                    .pending_over_time
                    .iter()
                    .map(|(at, bytes)| (*at, *bytes as f64 / 1e6))
                    .collect(),
            },
            LineSeries {
                name: "served MB/s".into(),
                points: idle.serving_over_time.clone(),
            },
        ],
    }));
    figure
}

/// Fig. 15: each program's slowdown with the monitor, and its seconds.
fn programs_figure(results: &Paper3Results) -> Figure {
    let programs = &results.programs;
    let mut figure = Figure::new(
        format!(
            "Paper 3 Fig. 15: the I/O monitor's cost for programs on {} ({} files, {:.0} MB), \
             median of {} rounds",
            programs.tree,
            programs.files,
            programs.bytes as f64 / 1e6,
            programs.rounds
        ),
        2,
    );
    let categories: Vec<String> = programs
        .programs
        .iter()
        .map(|program| program.program.clone())
        .collect();
    figure.panels.push(Panel::Bars(BarPanel {
        title: "with the monitor against without (100: no cost)".into(),
        x_label: "program".into(),
        y_label: "monitored / no_monitor (%)".into(),
        y_scale: AxisScale::Linear,
        categories: categories.clone(),
        series: vec![
            BarSeries {
                name: "elapsed".into(),
                values: programs
                    .programs
                    .iter()
                    .map(|program| (1.0 + program.overhead) * 100.0)
                    .collect(),
            },
            BarSeries {
                name: "file system CPU".into(),
                values: programs
                    .programs
                    .iter()
                    .map(|program| (1.0 + program.cpu_overhead) * 100.0)
                    .collect(),
            },
        ],
        value_labels: true,
    }));
    figure.panels.push(Panel::Bars(BarPanel {
        title: "seconds".into(),
        x_label: "program".into(),
        y_label: "s".into(),
        y_scale: AxisScale::Linear,
        categories,
        series: vec![
            BarSeries {
                name: "monitor".into(),
                values: programs
                    .programs
                    .iter()
                    .map(|program| program.monitored_seconds)
                    .collect(),
            },
            BarSeries {
                name: "no_monitor".into(),
                values: programs
                    .programs
                    .iter()
                    .map(|program| program.unmonitored_seconds)
                    .collect(),
            },
        ],
        value_labels: false,
    }));
    figure
}

fn chunk_size_figure(results: &Paper3Results) -> Figure {
    let categories: Vec<String> = results
        .chunk_sizes
        .iter()
        .map(|row| row.config.clone())
        .collect();
    let mut figure = Figure::new(
        "Paper 3 Fig. 3: dedup ratio and sequential read throughput against chunk size",
        2,
    );
    figure.panels.push(Panel::Bars(BarPanel {
        title: "dedup ratio".into(),
        x_label: "chunk size".into(),
        y_label: "logical / stored".into(),
        y_scale: AxisScale::Linear,
        categories: categories.clone(),
        series: vec![BarSeries {
            name: "dedup ratio".into(),
            values: results.chunk_sizes.iter().map(|r| r.dedup_ratio).collect(),
        }],
        value_labels: true,
    }));
    figure.panels.push(Panel::Bars(BarPanel {
        title: "sequential read, cold page cache".into(),
        x_label: "chunk size".into(),
        y_label: "MB/s".into(),
        y_scale: AxisScale::Linear,
        categories,
        series: vec![BarSeries {
            name: "read".into(),
            values: results
                .chunk_sizes
                .iter()
                .map(|r| r.read_mb_per_second)
                .collect(),
        }],
        value_labels: true,
    }));
    figure
}

/// Writes every file of a run; returns the paths written.
pub fn write_outputs(out: &Path, results: &Paper3Results) -> Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let json = out.join("results.json");
    write_json(&json, results)?;
    written.push(json);

    let mut table = CsvTable::new(&[
        "config",
        "chunk_bytes",
        "dedup_ratio",
        "read_mb_per_second",
        "dedup_seconds",
    ]);
    for row in &results.chunk_sizes {
        table.push(vec![
            row.config.clone(),
            row.chunk_bytes.to_string(),
            number_cell(row.dedup_ratio),
            number_cell(row.read_mb_per_second),
            number_cell(row.dedup_seconds),
        ]);
    }
    let csv = out.join("results.csv");
    table.write(&csv)?;
    written.push(csv);

    let mut table = CsvTable::new(&[
        "workload",
        "system",
        "sequential_percent",
        "savings",
        "dedup_ratio",
        "median_ms",
        "p90_ms",
        "sequential_files_median_ms",
        "sequential_mb_per_second",
        "rank_1_files",
        "rank_2_files",
        "big_cut_bytes",
        "contiguous_bound_savings",
        "dedup_seconds",
    ]);
    for workload in &results.workloads {
        for run in &workload.runs {
            table.push(vec![
                workload.spec.name.to_string(),
                run.system.clone(),
                run.sequential_percent.to_string(),
                number_cell(run.savings),
                number_cell(run.dedup_ratio),
                number_cell(quantile(&run.file_latencies_ms, 0.5)),
                number_cell(quantile(&run.file_latencies_ms, 0.9)),
                number_cell(quantile(&sequential_latencies(run), 0.5)),
                number_cell(run.sequential_mb_per_second),
                run.rank_files[1].to_string(),
                run.rank_files[2].to_string(),
                run.big_cut_bytes.to_string(),
                number_cell(run.contiguous_bound_savings),
                number_cell(run.dedup_seconds),
            ]);
        }
    }
    let csv = out.join("mixes.csv");
    table.write(&csv)?;
    written.push(csv);

    let mut table = CsvTable::new(&[
        "start_seconds",
        "files_served",
        "serving_mb_per_second",
        "serving_latency_ms",
        "computing_mb_per_second",
    ]);
    for interval in &results.interference.intervals {
        table.push(vec![
            number_cell(interval.start_seconds),
            interval.files_served.to_string(),
            number_cell(interval.serving_mb_per_second),
            number_cell(interval.serving_latency_ms),
            number_cell(interval.computing_mb_per_second),
        ]);
    }
    let csv = out.join("interference.csv");
    table.write(&csv)?;
    written.push(csv);

    let mut table = CsvTable::new(&[
        "program",
        "monitored_seconds",
        "unmonitored_seconds",
        "overhead",
        "monitored_cpu_seconds",
        "unmonitored_cpu_seconds",
        "cpu_overhead",
    ]);
    for program in &results.programs.programs {
        table.push(vec![
            program.program.clone(),
            number_cell(program.monitored_seconds),
            number_cell(program.unmonitored_seconds),
            number_cell(program.overhead),
            number_cell(program.monitored_cpu_seconds),
            number_cell(program.unmonitored_cpu_seconds),
            number_cell(program.cpu_overhead),
        ]);
    }
    let csv = out.join("programs.csv");
    table.write(&csv)?;
    written.push(csv);

    let mut table = CsvTable::new(&[
        "system",
        "rank_0_share",
        "rank_1_share",
        "rank_2_share",
        "rank_3_share",
        "savings",
        "sequential_mb_per_second",
    ]);
    for run in &results.releases.runs {
        let mut row = vec![run.system.clone()];
        row.extend(run.rank_shares.iter().map(|share| number_cell(*share)));
        row.push(number_cell(run.savings));
        row.push(number_cell(run.sequential_mb_per_second));
        table.push(row);
    }
    let csv = out.join("releases.csv");
    table.write(&csv)?;
    written.push(csv);

    let mut figures = vec![("paper3-fig3.svg", chunk_size_figure(results))];
    for (workload, number) in results.workloads.iter().zip([9, 10]) {
        let name = if number == 9 {
            "paper3-fig9.svg"
        } else {
            "paper3-fig10.svg"
        };
        figures.push((name, latency_figure(number, workload)));
    }
    figures.push(("paper3-fig11.svg", throughput_figure(&results.workloads)));
    figures.push(("paper3-fig15.svg", programs_figure(results)));
    figures.push(("paper3-fig16-17.svg", interference_figure(results)));
    for (name, figure) in figures {
        let path = out.join(name);
        write_text(&path, &figure.to_svg())?;
        written.push(path);
    }

    let path = out.join("summary.md");
    write_text(&path, &summary(results))?;
    written.push(path);
    Ok(written)
}

fn percent(value: f64) -> String {
    format!("{:.1}%", value * 100.0)
}

/// The numbers beside the paper's.
pub fn summary(results: &Paper3Results) -> String {
    let sizes = &results.sizes;
    let mut text = format!(
        "# Paper 3 §5 on the file system face\n\nRun took {:.0} s.\n\n\
         ## Fig. 3: dedup ratio and sequential read against the chunk size (engine level)\n\n\
         {} files of {} (runs of 1 to 64 blocks of 4 KiB repeating earlier data with \
         probability {}), the face's files dropped from the page cache before the reads.\n\n\
         | chunk size | dedup ratio | sequential read MB/s | dedup s |\n| --- | --- | --- | --- |\n",
        results.seconds,
        sizes.chunk_size_files,
        onecopy_core::units::format_size(sizes.chunk_size_file_bytes),
        results.duplicate_probability
    );
    for row in &results.chunk_sizes {
        text.push_str(&format!(
            "| {} | {:.2} | {:.0} | {:.2} |\n",
            row.config, row.dedup_ratio, row.read_mb_per_second, row.dedup_seconds
        ));
    }
    text.push_str(&format!(
        "\nI/O monitor: {:.0} ns per cached 4 KiB read with it, {:.0} ns without ({} reads, \
         median of 3).\n",
        results.monitor.monitored_ns_per_read,
        results.monitor.unmonitored_ns_per_read,
        results.monitor.reads
    ));

    text.push_str(
        "\n## Table 4: the synthetic workloads (space savings, 1 - stored / logical)\n\n\
         | workload | files | MB | ideal 256 KiB | all-big (measured) | paper big | \
         ideal 4 KiB | all-small (measured) | paper small |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for workload in &results.workloads {
        let measured = |system: &str| {
            workload
                .run(system, MIXES[0])
                .map_or("-".to_string(), |run| percent(run.savings))
        };
        text.push_str(&format!(
            "| {} | {} | {:.0} | {} | {} | {} | {} | {} | {} |\n",
            workload.spec.name,
            workload.files,
            workload.bytes as f64 / 1e6,
            percent(workload.ideal_big_savings),
            measured("all-big"),
            percent(workload.spec.paper_big_savings),
            percent(workload.ideal_small_savings),
            measured("all-small"),
            percent(workload.spec.paper_small_savings),
        ));
    }

    for (workload, number) in results.workloads.iter().zip([9, 10]) {
        text.push_str(&format!(
            "\n## Figs. {number} and 11: {} dedup ratio workload, read cold through FUSE\n\n\
             Median and 90th-percentile response time per file (ms), throughput of the \
             sequentially read files (MB/s), savings; selective: files ranked 1 (big chunks) \
             and 2 (small).\n\n\
             | S:R | system | median ms | p90 ms | sequential files median ms | \
             sequential MB/s | savings | ranks 1/2 |\n\
             | --- | --- | --- | --- | --- | --- | --- | --- |\n",
            workload.spec.name
        ));
        for percent_sequential in MIXES {
            for system in SYSTEMS {
                let Some(run) = workload.run(system, percent_sequential) else {
                    continue;
                };
                text.push_str(&format!(
                    "| {}:{} | {} | {:.2} | {:.2} | {:.2} | {:.0} | {} | {} |\n",
                    percent_sequential,
                    100 - percent_sequential,
                    system,
                    quantile(&run.file_latencies_ms, 0.5),
                    quantile(&run.file_latencies_ms, 0.9),
                    quantile(&sequential_latencies(run), 0.5),
                    run.sequential_mb_per_second,
                    percent(run.savings),
                    if system == "selective" {
                        format!("{}/{}", run.rank_files[1], run.rank_files[2])
                    } else {
                        "-".into()
                    }
                ));
            }
        }
    }

    text.push_str(
        "\n## Benchmark goals\n\n\
         Beside the goal, at 10% sequential: the bytes of the files selective cut big, and the \
         most a system that keeps those files whole in big chunks can save (every other 4 KiB \
         block stored once against all the data), against all-small.\n\n\
         | workload | selective / all-small savings at 10% sequential (goal ≥ 95%, paper 86%) \
         | selective / none sequential MB/s at 90% sequential (goal ≥ 97%, paper 97%) \
         | files cut big at 10% | their bound / all-small |\n\
         | --- | --- | --- | --- | --- |\n",
    );
    for workload in &results.workloads {
        let ratio =
            |numerator: Option<f64>, denominator: Option<f64>| match (numerator, denominator) {
                (Some(n), Some(d)) if d > 0.0 => percent(n / d),
                _ => "-".into(),
            };
        let savings = |system| workload.run(system, 10).map(|run| run.savings);
        let throughput = |system| {
            workload
                .run(system, 90)
                .map(|run| run.sequential_mb_per_second)
        };
        let selective = workload.run("selective", 10);
        text.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            workload.spec.name,
            ratio(savings("selective"), savings("all-small")),
            ratio(throughput("selective"), throughput("none")),
            selective.map_or("-".into(), |run| format!(
                "{:.1} MB of {:.1} MB",
                run.big_cut_bytes as f64 / 1e6,
                run.logical_bytes as f64 / 1e6
            )),
            ratio(
                selective.map(|run| run.contiguous_bound_savings),
                savings("all-small")
            ),
        ));
    }

    let releases = &results.releases;
    text.push_str(&format!(
        "\n## Table 6 and Fig. 14: successive releases of a source tree\n\n\
         {} releases, {} files, {:.0} MB in all: {}. The newest is in use (30% of its files \
         read whole, 20% read at random, 5% edited), the older ones cold. Share of the files \
         per rank after `fs dedup`, space savings, and the newest release's sequentially \
         used files read cold (the paper, desktop user: ranks 2.8/5.9/4.1/87.2%, savings \
         14.3% selective, 16.1% small, 11.2% big; developer: 0.9/2.2/1.2/95.7%, 31.1%, \
         32.8%, 17.2%).\n\n\
         | system | rank 0 | rank 1 | rank 2 | rank 3 | savings | sequential files MB/s |\n\
         | --- | --- | --- | --- | --- | --- | --- |\n",
        releases.releases,
        releases.files,
        releases.bytes as f64 / 1e6,
        releases.source
    ));
    for run in &releases.runs {
        let ranks = if run.system == "selective" {
            run.rank_shares.map(percent)
        } else {
            std::array::from_fn(|_| "-".to_string())
        };
        text.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {:.0} |\n",
            run.system,
            ranks[0],
            ranks[1],
            ranks[2],
            ranks[3],
            percent(run.savings),
            run.sequential_mb_per_second
        ));
    }

    let programs = &results.programs;
    text.push_str(&format!(
        "\n## Fig. 15: the I/O monitor's cost for programs\n\n\
         {} files, {:.0} MB of {} on a mount with the monitor and one with `no_monitor`, \
         median of {} rounds, each program followed by `syncfs`; elapsed seconds and the \
         CPU seconds of the file system serving it (the paper: under 7% for these \
         disk-bound programs).\n\n\
         | program | with monitor s | no_monitor s | slowdown | with monitor CPU s | \
         no_monitor CPU s | CPU change |\n| --- | --- | --- | --- | --- | --- | --- |\n",
        programs.files,
        programs.bytes as f64 / 1e6,
        programs.tree,
        programs.rounds
    ));
    for program in &programs.programs {
        text.push_str(&format!(
            "| {} | {:.3} | {:.3} | {:+.1}% | {:.3} | {:.3} | {:+.1}% |\n",
            program.program,
            program.monitored_seconds,
            program.unmonitored_seconds,
            program.overhead * 100.0,
            program.monitored_cpu_seconds,
            program.unmonitored_cpu_seconds,
            program.cpu_overhead * 100.0
        ));
    }

    let timeline = &results.interference;
    text.push_str(&format!(
        "\n## Figs. 16 and 17: foreground work while `fs dedup` runs\n\n\
         `fs dedup` of {:.0} MB pending (mostly duplicates of the {:.0} MB being served; \
         {} files, {:.0} MB read) ran from {:.1} s to {:.1} s, at full speed, while {} \
         threads served whole files and one thread hashed in memory (2 cores shared with \
         the rest of the machine).\n\n\
         | foreground | outside the run | during the run | change |\n| --- | --- | --- | --- |\n",
        timeline.pending_bytes as f64 / 1e6,
        timeline.served_bytes as f64 / 1e6,
        timeline.dedup_files,
        timeline.dedup_bytes_read as f64 / 1e6,
        timeline.dedup_start_seconds,
        timeline.dedup_end_seconds,
        2,
    ));
    for (name, idle, during) in [
        (
            "file serving MB/s",
            timeline.serving_mb_per_second_idle,
            timeline.serving_mb_per_second_during,
        ),
        (
            "file serving ms per file",
            timeline.serving_latency_ms_idle,
            timeline.serving_latency_ms_during,
        ),
        (
            "computing MB/s",
            timeline.computing_mb_per_second_idle,
            timeline.computing_mb_per_second_during,
        ),
    ] {
        let change = if idle > 0.0 {
            format!("{:+.0}%", (during / idle - 1.0) * 100.0)
        } else {
            "-".into()
        };
        text.push_str(&format!(
            "| {name} | {idle:.1} | {during:.1} | {change} |\n"
        ));
    }
    let idle = &results.idle;
    let first: Vec<String> = idle
        .first_file_after_dedup_ms
        .iter()
        .map(|ms| format!("{ms:.1}"))
        .collect();
    text.push_str(&format!(
        "\nThe mount's own deduplicator (started after {} s without a request, {}% share): \
         bursts of {:.0} s of file serving, pauses of {:.0} s; {:.0} MB pending were done \
         after {:.1} s. First file of each burst that interrupted a run (ms): {}; the \
         other files: median {:.1} ms.\n",
        idle.idle_seconds,
        idle.dedup_share_percent,
        idle.burst_seconds,
        idle.pause_seconds,
        idle.pending_bytes as f64 / 1e6,
        idle.seconds_to_done,
        if first.is_empty() {
            "none caught a run".to_string()
        } else {
            first.join(", ")
        },
        idle.other_files_median_ms
    ));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: quantiles by nearest rank and CDF points that end at 1 and stay bounded.
    /// Method: known small inputs and a long one.
    #[test]
    fn quantiles_and_cdf_points() {
        let values = [4.0, 1.0, 3.0, 2.0];
        assert_eq!(quantile(&values, 0.5), 2.0);
        assert_eq!(quantile(&values, 0.9), 4.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
        let points = cdf_points(&values);
        assert_eq!(points.first(), Some(&(1.0, 0.25)));
        assert_eq!(points.last(), Some(&(4.0, 1.0)));
        let long: Vec<f64> = (1..=10_000).map(f64::from).collect();
        let points = cdf_points(&long);
        assert!(points.len() <= CDF_POINTS_MAX + 1);
        assert_eq!(points.last(), Some(&(10_000.0, 1.0)));
    }
}
