//! `onecopy analyze PATH...`: how much would deduplication save? No repository is needed.
//!
//! JSON output (`--json`) is a contract that scripts rely on: exactly one object
//! `{"results": [{"chunker", "total_bytes", "zero_bytes", "unique_bytes", "chunks",
//! "unique_chunks", "seconds"}, ...]}`, one entry per `--chunker` in the order given, with
//! `chunker` spelled exactly as given on the command line.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use indicatif::ProgressBar;
use onecopy_analyze::{
    analyze, default_chunkers, ChunkerReport, Progress, Report, DEFAULT_CHUNKERS,
};
use onecopy_core::chunking::ChunkerSpec;
use onecopy_core::units::{format_rate, format_size};
use serde::Serialize;

use crate::output::{byte_progress, print_json};
use crate::Cli;

#[derive(Args, Debug)]
pub struct AnalyzeArgs {
    /// Files, directories (walked recursively; symbolic links inside are not followed), disk
    /// images or block devices to analyze.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,

    /// A chunker to analyze with; repeat for several. One of fixed:SIZE, fastcdc:AVERAGE,
    /// fastcdc:MIN/AVERAGE/MAX, rabin:AVERAGE, rabin:MIN/AVERAGE/MAX,
    /// segment:SEGMENT_AVERAGE/CHUNK_AVERAGE (sizes in bytes or with units, e.g. 8KiB).
    /// [default: fixed:4096, fastcdc:8192, rabin:8192, segment:4MiB/4KiB]
    #[arg(long = "chunker", value_name = "SPEC")]
    pub chunkers: Vec<String>,

    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One entry of the JSON output (see the module documentation).
#[derive(Serialize)]
struct JsonResult<'a> {
    chunker: &'a str,
    total_bytes: u64,
    zero_bytes: u64,
    unique_bytes: u64,
    chunks: u64,
    unique_chunks: u64,
    seconds: f64,
}

#[derive(Serialize)]
struct JsonReport<'a> {
    results: Vec<JsonResult<'a>>,
}

/// Draws the byte progress of each pass.
struct BarProgress {
    bar: ProgressBar,
}

impl Progress for BarProgress {
    fn begin_pass(&self, chunker: &ChunkerSpec, total_bytes: u64) {
        self.bar.set_length(total_bytes);
        self.bar.set_position(0);
        self.bar.set_message(chunker.to_string());
    }

    fn advance(&self, bytes: u64) {
        self.bar.inc(bytes);
    }
}

pub fn run(_cli: &Cli, args: &AnalyzeArgs) -> anyhow::Result<()> {
    let (labels, chunkers): (Vec<String>, Vec<ChunkerSpec>) = if args.chunkers.is_empty() {
        (
            DEFAULT_CHUNKERS
                .iter()
                .map(|text| text.to_string())
                .collect(),
            default_chunkers(),
        )
    } else {
        let mut chunkers = Vec::with_capacity(args.chunkers.len());
        for text in &args.chunkers {
            chunkers.push(
                text.parse::<ChunkerSpec>()
                    .with_context(|| format!("--chunker {text}"))?,
            );
        }
        (args.chunkers.clone(), chunkers)
    };
    let progress = BarProgress {
        bar: byte_progress(0, "analyze"),
    };
    let report = analyze(&args.paths, &chunkers, &progress);
    progress.bar.finish_and_clear();
    let report = report?;
    if args.json {
        let results = labels
            .iter()
            .zip(&report.results)
            .map(|(label, result)| JsonResult {
                chunker: label.trim(),
                total_bytes: result.total_bytes,
                zero_bytes: result.zero_bytes,
                unique_bytes: result.unique_bytes,
                chunks: result.chunks,
                unique_chunks: result.unique_chunks,
                seconds: result.seconds,
            })
            .collect();
        print_json(&JsonReport { results })
    } else {
        print_table(&labels, &report);
        Ok(())
    }
}

fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        "-".to_string()
    } else {
        format!("{:.1}%", 100.0 * part as f64 / whole as f64)
    }
}

fn row(label: &str, result: &ChunkerReport) -> [String; 10] {
    let stored_chunks = result.chunks.max(1);
    [
        label.to_string(),
        format_size(result.total_bytes),
        format!(
            "{} ({})",
            format_size(result.zero_bytes),
            percent(result.zero_bytes, result.total_bytes)
        ),
        format_size(result.unique_bytes),
        format!("{:.1}%", 100.0 * result.saved_fraction()),
        result.chunks.to_string(),
        result.unique_chunks.to_string(),
        format_size(result.total_bytes / stored_chunks),
        format_rate(result.total_bytes as f64 / result.seconds.max(1e-9)),
        format_size(result.index_bytes),
    ]
}

fn print_table(labels: &[String], report: &Report) {
    let header = [
        "chunker",
        "total",
        "zero",
        "unique",
        "saved",
        "chunks",
        "unique chunks",
        "mean chunk",
        "throughput",
        "index memory",
    ]
    .map(str::to_string);
    let rows: Vec<[String; 10]> = labels
        .iter()
        .zip(&report.results)
        .map(|(label, result)| row(label, result))
        .collect();
    let mut widths = header.clone().map(|cell| cell.len());
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    for row in std::iter::once(&header).chain(&rows) {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(column, (cell, width))| {
                if column == 0 {
                    format!("{cell:<width$}")
                } else {
                    format!("{cell:>width$}")
                }
            })
            .collect();
        println!("{}", cells.join("  "));
    }
    println!(
        "{} files, {} block devices read; {} symbolic links and special files skipped. \
         saved = 1 - unique / total (zero chunks are not stored).",
        report.files, report.block_devices, report.skipped
    );
}
