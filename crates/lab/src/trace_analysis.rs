//! Paper 4 §2 in the lab: what a block trace with content digests says about duplication,
//! the measures that motivate I/O deduplication.
//!
//! - **Table 1**, the workload's key statistics: requests, reads and writes, and the distinct
//!   locations against the distinct contents they read and wrote (the paper: "the unique
//!   content accessed is lesser than the unique locations").
//! - **Fig. 2**, the average reuse distance by sector and by content: the number of accesses
//!   between successive accesses to the same sector (same content), for reads and for writes.
//!   A content-addressed cache needs to hold data for less time when content comes back
//!   sooner than its sector does.
//! - **Fig. 3**, the workload static similarity: the average number of copies of each block
//!   read. The paper counts copies on the whole disk; a trace shows only the locations it
//!   touches, so the count here is the number of distinct locations the trace saw holding the
//!   content (a lower bound). Contents with more than [`COPIES_CAP`] copies are left out, as
//!   the paper does.
//! - **Fig. 4**, the overlap of content read in each interval with all content accessed (read
//!   or written) in the interval before; the first interval is compared with itself (100%).
//!   The paper uses seven 3-day intervals of a three-week trace; a trace given here is split
//!   into [`INTERVALS`] intervals of equal duration, whatever its length.
//!
//! Fig. 1 (read hits of content- and sector-addressed caches by size) is the same experiment
//! as Figs. 8 and 9 ([`crate::trace_replay`]).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::plot::{AxisScale, BarPanel, BarSeries, Figure, Panel};
use crate::results::{number_cell, write_text, CsvTable};
use crate::trace::{accesses_of, Access};
use crate::trace::{Operation, TraceRecord};

/// Contents with more copies than this are left out of the static similarity (paper 4 §2).
pub const COPIES_CAP: u64 = 1000;
/// Intervals of the content overlap (paper 4 Fig. 4: seven).
pub const INTERVALS: usize = 7;

/// Paper 4 Table 1 for one trace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct KeyStatistics {
    pub duration_seconds: f64,
    pub requests: u64,
    /// Block accesses (a request of several blocks is several accesses).
    pub reads: u64,
    pub writes: u64,
    pub block_bytes: u32,
    pub locations_read: u64,
    pub contents_read: u64,
    pub locations_written: u64,
    pub contents_written: u64,
    pub locations: u64,
    pub contents: u64,
}

/// Paper 4 Fig. 2: average reuse distances, in accesses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ReuseDistances {
    pub sector_reads: f64,
    pub content_reads: f64,
    pub sector_writes: f64,
    pub content_writes: f64,
}

/// Everything [`analyse`] measures of one trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceAnalysis {
    pub trace: PathBuf,
    pub table1: KeyStatistics,
    pub reuse: ReuseDistances,
    /// Fig. 3: average copies per block read (contents of at most [`COPIES_CAP`] copies).
    pub copies_per_block_read: f64,
    /// Fig. 4: per interval, the share of distinct content read that the interval before
    /// accessed (the first: 1.0).
    pub overlap: Vec<f64>,
    pub interval_seconds: f64,
}

/// Measures Table 1 and Figs. 2 to 4 of `records`.
pub fn analyse(trace: &Path, records: &[TraceRecord]) -> Result<TraceAnalysis> {
    let accesses = accesses_of(records)?;
    let list = &accesses.accesses;
    let first_ns = records.iter().map(|r| r.timestamp_ns).min().unwrap_or(0);
    let last_ns = records.iter().map(|r| r.timestamp_ns).max().unwrap_or(0);
    let duration_seconds = (last_ns - first_ns) as f64 / 1e9;

    let distinct = |operation: Option<Operation>, field: fn(&Access) -> u64| -> u64 {
        list.iter()
            .filter(|access| operation.is_none_or(|wanted| access.operation == wanted))
            .map(field)
            .collect::<HashSet<u64>>()
            .len() as u64
    };
    let address = |access: &Access| access.address;
    let content = |access: &Access| access.content;
    let table1 = KeyStatistics {
        duration_seconds,
        requests: records.len() as u64,
        reads: list
            .iter()
            .filter(|a| a.operation == Operation::Read)
            .count() as u64,
        writes: list
            .iter()
            .filter(|a| a.operation == Operation::Write)
            .count() as u64,
        block_bytes: accesses.block_bytes,
        locations_read: distinct(Some(Operation::Read), address),
        contents_read: distinct(Some(Operation::Read), content),
        locations_written: distinct(Some(Operation::Write), address),
        contents_written: distinct(Some(Operation::Write), content),
        locations: accesses.distinct_addresses,
        contents: accesses.distinct_contents,
    };

    let reuse = ReuseDistances {
        sector_reads: average_reuse(list, Operation::Read, address),
        content_reads: average_reuse(list, Operation::Read, content),
        sector_writes: average_reuse(list, Operation::Write, address),
        content_writes: average_reuse(list, Operation::Write, content),
    };

    // Copies of a content: the distinct locations the trace saw holding it.
    let mut holders: HashMap<u64, HashSet<u64>> = HashMap::new();
    for access in list {
        holders
            .entry(access.content)
            .or_default()
            .insert(access.address);
    }
    let (copies_total, blocks_counted) = list
        .iter()
        .filter(|access| access.operation == Operation::Read)
        .map(|access| holders[&access.content].len() as u64)
        .filter(|&copies| copies <= COPIES_CAP)
        .fold((0u64, 0u64), |(sum, count), copies| {
            (sum + copies, count + 1)
        });
    let copies_per_block_read = copies_total as f64 / blocks_counted.max(1) as f64;

    // Content overlap between successive intervals of equal duration.
    let span_ns = (last_ns - first_ns).max(1);
    let interval_of = |timestamp_ns: u64| -> usize {
        (((timestamp_ns - first_ns) as u128 * INTERVALS as u128 / span_ns as u128) as usize)
            .min(INTERVALS - 1)
    };
    let mut read_in: Vec<HashSet<u64>> = vec![HashSet::new(); INTERVALS];
    let mut accessed_in: Vec<HashSet<u64>> = vec![HashSet::new(); INTERVALS];
    let mut next = 0;
    for record in records {
        let interval = interval_of(record.timestamp_ns);
        for _ in record.blocks() {
            let access = list[next];
            next += 1;
            accessed_in[interval].insert(access.content);
            if access.operation == Operation::Read {
                read_in[interval].insert(access.content);
            }
        }
    }
    assert_eq!(next, list.len(), "one access per block of every record");
    let overlap = (0..INTERVALS)
        .map(|interval| {
            let read = &read_in[interval];
            if interval == 0 {
                return 1.0;
            }
            let before = &accessed_in[interval - 1];
            read.iter().filter(|c| before.contains(c)).count() as f64 / read.len().max(1) as f64
        })
        .collect();
    Ok(TraceAnalysis {
        trace: trace.to_path_buf(),
        table1,
        reuse,
        copies_per_block_read,
        overlap,
        interval_seconds: duration_seconds / INTERVALS as f64,
    })
}

/// The average number of accesses between an access of `operation` and the previous access
/// (of either kind) to the same key, over the accesses that have one.
fn average_reuse(list: &[Access], operation: Operation, key: fn(&Access) -> u64) -> f64 {
    let mut last_seen: HashMap<u64, usize> = HashMap::new();
    let (mut total, mut count) = (0u64, 0u64);
    for (index, access) in list.iter().enumerate() {
        if let Some(previous) = last_seen.insert(key(access), index) {
            if access.operation == operation {
                total += (index - previous) as u64;
                count += 1;
            }
        }
    }
    total as f64 / count.max(1) as f64
}

/// Writes `analysis.csv` and `paper4-workload.svg` to `output` (the trace part's
/// results.json holds the analysis too).
pub fn write_analysis(analysis: &TraceAnalysis, output: &Path) -> Result<Vec<PathBuf>> {
    let csv = output.join("analysis.csv");
    let mut table = CsvTable::new(&["measure", "value"]);
    let t = &analysis.table1;
    let rows: Vec<(&str, String)> = vec![
        ("duration_seconds", number_cell(t.duration_seconds)),
        ("requests", t.requests.to_string()),
        ("block_bytes", t.block_bytes.to_string()),
        ("block_reads", t.reads.to_string()),
        ("block_writes", t.writes.to_string()),
        ("locations_read", t.locations_read.to_string()),
        ("contents_read", t.contents_read.to_string()),
        ("locations_written", t.locations_written.to_string()),
        ("contents_written", t.contents_written.to_string()),
        ("locations", t.locations.to_string()),
        ("contents", t.contents.to_string()),
        (
            "reuse_distance_sector_reads",
            number_cell(analysis.reuse.sector_reads),
        ),
        (
            "reuse_distance_content_reads",
            number_cell(analysis.reuse.content_reads),
        ),
        (
            "reuse_distance_sector_writes",
            number_cell(analysis.reuse.sector_writes),
        ),
        (
            "reuse_distance_content_writes",
            number_cell(analysis.reuse.content_writes),
        ),
        (
            "copies_per_block_read",
            number_cell(analysis.copies_per_block_read),
        ),
        ("interval_seconds", number_cell(analysis.interval_seconds)),
    ];
    for (measure, value) in rows {
        table.push(vec![measure.to_string(), value]);
    }
    for (interval, share) in analysis.overlap.iter().enumerate() {
        table.push(vec![
            format!("overlap_interval_{}", interval + 1),
            number_cell(*share),
        ]);
    }
    table.write(&csv)?;
    let svg = output.join("paper4-workload.svg");
    write_text(&svg, &analysis_figure(analysis).to_svg())?;
    Ok(vec![csv, svg])
}

/// Figs. 2 to 4 of paper 4 in one figure.
pub fn analysis_figure(analysis: &TraceAnalysis) -> Figure {
    let name = analysis
        .trace
        .file_name()
        .map_or_else(String::new, |name| name.to_string_lossy().into_owned());
    let mut figure = Figure::new(format!("Duplication in the workload, {name}"), 3);
    figure.panel_width = 360;
    let reuse = &analysis.reuse;
    figure.panels.push(Panel::Bars(BarPanel {
        title: "Average reuse distance (paper 4 Fig. 2)".into(),
        x_label: "requests".into(),
        y_label: "accesses between reuses".into(),
        y_scale: AxisScale::Linear,
        categories: vec!["reads".into(), "writes".into()],
        series: vec![
            BarSeries {
                name: "sector".into(),
                values: vec![reuse.sector_reads, reuse.sector_writes],
            },
            BarSeries {
                name: "content".into(),
                values: vec![reuse.content_reads, reuse.content_writes],
            },
        ],
        value_labels: true,
    }));
    figure.panels.push(Panel::Bars(BarPanel {
        title: "Copies per block read (paper 4 Fig. 3)".into(),
        x_label: format!("contents of at most {COPIES_CAP} copies"),
        y_label: "locations seen holding it".into(),
        y_scale: AxisScale::Linear,
        categories: vec!["blocks read".into()],
        series: vec![BarSeries {
            name: "workload static similarity".into(),
            values: vec![analysis.copies_per_block_read],
        }],
        value_labels: true,
    }));
    figure.panels.push(Panel::Bars(BarPanel {
        title: "Content read, accessed before (paper 4 Fig. 4)".into(),
        x_label: format!("interval of {:.1} s", analysis.interval_seconds),
        y_label: "share of distinct content read (%)".into(),
        y_scale: AxisScale::Linear,
        categories: (1..=analysis.overlap.len())
            .map(|i| i.to_string())
            .collect(),
        series: vec![BarSeries {
            name: "overlap".into(),
            values: analysis.overlap.iter().map(|share| share * 100.0).collect(),
        }],
        value_labels: false,
    }));
    figure
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::parse_trace;

    /// A trace line of one 4 KiB request.
    fn line(seconds: u64, lba_page: u64, operation: char, digest: u8) -> String {
        format!(
            "{} 1 test {} 8 {operation} 6 0 {}\n",
            seconds * 1_000_000_000,
            lba_page * 8,
            format!("{digest:02x}").repeat(16)
        )
    }

    /// Goal: the measures follow their definitions on a trace small enough to count by hand.
    /// Method: seven requests, two contents at three locations; every figure compared with
    /// the hand count.
    #[test]
    fn measures_match_a_hand_count() {
        let text = [
            line(0, 10, 'W', 0xaa), // a at 10
            line(1, 20, 'W', 0xaa), // a at 20
            line(2, 10, 'R', 0xaa), // sector 10 again after 2, content a after 1
            line(3, 30, 'W', 0xbb), // b at 30
            line(4, 20, 'R', 0xaa), // sector 20 after 3, content a after 2
            line(5, 30, 'R', 0xbb), // sector 30 after 2, content b after 2
            line(6, 10, 'R', 0xaa), // sector 10 after 4, content a after 2
        ]
        .concat();
        let records = parse_trace(&text, Path::new("hand")).unwrap();
        let analysis = analyse(Path::new("hand"), &records).unwrap();
        let t = &analysis.table1;
        assert_eq!((t.requests, t.reads, t.writes), (7, 4, 3));
        assert_eq!((t.locations_read, t.contents_read), (3, 2));
        assert_eq!((t.locations_written, t.contents_written), (3, 2));
        assert_eq!((t.locations, t.contents), (3, 2));
        assert_eq!(analysis.reuse.sector_reads, (2 + 3 + 2 + 4) as f64 / 4.0);
        assert_eq!(analysis.reuse.content_reads, (1 + 2 + 2 + 2) as f64 / 4.0);
        // Writes: only the second a (content reuse 1); no sector is written twice.
        assert_eq!(analysis.reuse.content_writes, 1.0);
        assert_eq!(analysis.reuse.sector_writes, 0.0);
        // Reads of a (three reads, two locations each) and of b (one location).
        assert_eq!(analysis.copies_per_block_read, (2 + 2 + 1 + 2) as f64 / 4.0);
        assert_eq!(analysis.overlap.len(), INTERVALS);
        assert_eq!(analysis.overlap[0], 1.0);
        // Interval 2 (second 2) reads a, which interval 1 (second 1) wrote.
        assert_eq!(analysis.overlap[2], 1.0);
        // Interval 5 (second 5) reads b, which interval 4 (second 4) did not access.
        assert_eq!(analysis.overlap[5], 0.0);
        let output = tempfile::tempdir().unwrap();
        let written = write_analysis(&analysis, output.path()).unwrap();
        assert!(written.iter().all(|path| path.exists()));
    }
}
