//! The lab report: numbers read from results.json, every figure listed, and the committed
//! docs/lab/README.md in step with the committed results.

use std::fs;
use std::path::{Path, PathBuf};

use onecopy_lab::report::{render, write_report, PartRun, RUNS_FILE};
use serde_json::json;

fn write(path: &Path, text: &str) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
}

fn paper1_run(hints: bool, operations_per_second: f64) -> serde_json::Value {
    json!({
        "workload": "metadata",
        "policy": "lru",
        "latency_ns": 1000000,
        "hints": hints,
        "operations_per_second": operations_per_second,
        "dedup_ratio": if hints { 1.2 } else { 1.8 },
    })
}

/// Goal: a figure the report knows gets the paper's number beside ours, computed from
/// results.json. Method: a paper 1 directory with two runs (hints off at 100 ops/s, on at
/// 300), rendered.
#[test]
fn known_figure_compares_from_results() {
    let directory = tempfile::tempdir().unwrap();
    let results = json!({ "runs": [paper1_run(false, 100.0), paper1_run(true, 300.0)] });
    write(
        &directory.path().join("paper1/results.json"),
        &results.to_string(),
    );
    write(
        &directory.path().join("paper1/paper1-metadata.svg"),
        "<svg/>",
    );
    let page = render(directory.path()).unwrap();
    assert!(
        page.contains("![paper1-metadata.svg](paper1/paper1-metadata.svg)"),
        "{page}"
    );
    assert!(
        page.contains("| speed-up with hints, LRU, 1 ms | 1.18x-1.50x | 3.00x |"),
        "{page}"
    );
    assert!(
        page.contains("| dedup ratio without / with hints | 1.41 / 1.17 (ext3) | 1.80 / 1.20 |"),
        "{page}"
    );
}

/// Goal: every figure file of a part appears, known or not, and a part without results says
/// how to make them. Method: a paper 3 variant directory (no primary) with a known and a new
/// figure and no results.json, rendered.
#[test]
fn every_figure_file_is_listed() {
    let directory = tempfile::tempdir().unwrap();
    write(
        &directory.path().join("paper3-quick/paper3-fig9.svg"),
        "<svg/>",
    );
    write(
        &directory.path().join("paper3-quick/paper3-fig42.png"),
        "png",
    );
    write(&directory.path().join("paper5/paper5-fig1.svg"), "<svg/>");
    let page = render(directory.path()).unwrap();
    assert!(page.contains("](paper3-quick/paper3-fig9.svg)"), "{page}");
    assert!(page.contains("### Fig. 42 (`paper3-fig42.png`)"), "{page}");
    assert!(page.contains("](paper3-quick/paper3-fig42.png)"), "{page}");
    assert!(page.contains("No result directory `paper2` here"), "{page}");
    // paper 5 has a figure but no results.json: the figure stays, its numbers are n/a.
    assert!(page.contains("](paper5/paper5-fig1.svg)"), "{page}");
    assert!(page.contains("The numbers below are missing"), "{page}");
}

/// Goal: the runs of `lab all` close the report with their commands and times. Method: a
/// record of one successful and one failed part, rendered.
#[test]
fn runs_are_reported() {
    let directory = tempfile::tempdir().unwrap();
    let runs = vec![
        PartRun {
            part: "paper5".to_string(),
            command: "onecopy lab paper5 --quick --out x/paper5".to_string(),
            seconds: 41.2,
            outcome: "ok".to_string(),
        },
        PartRun {
            part: "trace".to_string(),
            command: "onecopy lab trace t --out x/trace".to_string(),
            seconds: 0.4,
            outcome: "reading t: not found".to_string(),
        },
    ];
    write(
        &directory.path().join(RUNS_FILE),
        &serde_json::to_string(&runs).unwrap(),
    );
    let path = write_report(directory.path()).unwrap();
    let page = fs::read_to_string(path).unwrap();
    assert!(
        page.contains("Made by `onecopy lab paper5 --quick --out x/paper5` in 41 s."),
        "{page}"
    );
    assert!(
        page.contains("which failed: reading t: not found"),
        "{page}"
    );
    assert!(page.contains("| all | | 42 | |"), "{page}");
}

/// Goal: the committed report is what the committed results give. Method: render
/// docs/lab and compare with docs/lab/README.md.
#[test]
fn committed_report_is_current() {
    let directory = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/lab");
    let committed = fs::read_to_string(directory.join("README.md")).unwrap();
    let rendered = render(&directory).unwrap();
    assert!(
        committed == rendered,
        "docs/lab/README.md is out of date with the results beside it: run \
         `onecopy lab report --out docs/lab` and commit it"
    );
}
