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

/// Goal: paper 1's new rows come from results.json: Table 5.1's census beside the paper's
/// ext3 numbers, the tree's creates and deletes, CPU per operation without the injected
/// wait's busy part, and the deferred setup after its pass. Method: a paper 1 directory with
/// one census, two tree runs and three file-server runs, rendered.
#[test]
fn paper1_rows_come_from_results() {
    let directory = tempfile::tempdir().unwrap();
    let census = |distinct: u64| json!({ "chunk_bytes": 512, "chunks": 2_097_152u64, "distinct": distinct, "once": 1 });
    let cpu = |process: f64| json!({ "process": process, "workload": 0.0, "nbdfuse": 0.5, "injected_wait_busy": 0.5 });
    let tree = |hints: bool, creates_seconds: f64| {
        json!({ "workload": "tree", "policy": "lru", "latency_ns": 10_000_000u64, "hints": hints,
                "operations": 2000, "cpu": cpu(if hints { 1.0 } else { 2.0 }),
                "kinds": [{ "name": "create", "operations": 1000, "seconds": creates_seconds },
                          { "name": "delete", "operations": 1000, "seconds": 4.0 }] })
    };
    let server = |hints: bool, deferred: bool, ops: f64| {
        let mut run = json!({ "workload": "file-server", "policy": "lru", "latency_ns": 10_000u64,
                              "hints": hints, "deferred": deferred, "operations": 1000,
                              "operations_per_second": ops, "cpu": cpu(1.0),
                              "dedup_ratio": 1.0, "stored_bytes": 100, "elapsed_seconds": 3.0 });
        if deferred {
            run["deferred_pass"] =
                json!({ "seconds": 7.0, "dedup_ratio": 1.5, "stored_bytes": 80 });
        }
        run
    };
    let results = json!({
        "uniqueness": [{ "file_system": "ext3", "files": 1_000_000u64,
                         "before": census(100), "after": census(524_288) }],
        "runs": [tree(false, 4.0), tree(true, 2.0), server(false, false, 100.0),
                 server(true, false, 150.0), server(true, true, 300.0)],
    });
    write(
        &directory.path().join("paper1/results.json"),
        &results.to_string(),
    );
    for figure in [
        "paper1-uniqueness.svg",
        "paper1-tree.svg",
        "paper1-file-server.svg",
    ] {
        write(&directory.path().join("paper1").join(figure), "<svg/>");
    }
    let page = render(directory.path()).unwrap();
    for expected in [
        "| ext3, 512 B chunks: distinct after mkfs | 43 (0.002%) | 100 (0.005%) |",
        "| ext3, 512 B chunks: distinct after 1,000,000 empty files | 548,623 (26%) | 524,288 (25.000%) |",
        "| creates/s with hints against without, LRU, 10 ms | over 1.5x | 2.00x |",
        "| deletes/s with hints against without, LRU, 10 ms | about 2x | 1.00x |",
        "| CPU per operation with hints against without, LRU, 10 ms | not given | 0.50x |",
        "| speed-up with hints and deferred dedup (Fig. 5.8), LRU, 10 µs | below 1x (NILFS2 metadata deduplicates) | 3.00x |",
        "| dedup ratio without / with hints and the deferred pass | not measured (GC ran hourly) | 1.00 / 1.50 |",
        "| deferred pass against the run it follows, mean over latencies | not measured | 7.0 s after 3.0 s |",
    ] {
        assert!(page.contains(expected), "{expected}\n{page}");
    }
}

/// Goal: paper 2's Table 2 and Fig. 10b rows are computed from results.json: the store's
/// write and read against the raw disk of the same runs, and batch deletions from the
/// smallest n to the largest. Method: a paper 2 directory with two unique-data runs and two
/// batch deletions, rendered.
#[test]
fn paper2_unique_and_batch_rows_come_from_results() {
    let directory = tempfile::tempdir().unwrap();
    let timing =
        |seconds: f64| json!({ "seconds": seconds, "cpu_seconds": seconds, "load_average": 1.0 });
    let limits = |run: u32| {
        json!({ "run": run, "memcpy": timing(0.01), "hash": timing(0.05), "raw_write": timing(1.0),
                "raw_read": timing(0.5), "cold_cache": true })
    };
    let store = |run: u32, backup: f64, restore: f64| {
        json!({ "store": "rev-4M", "run": run, "backup": timing(backup), "stored_bytes": 1,
                "restore": timing(restore), "restore_read_bytes": 1, "restore_cold_cache": true })
    };
    let batch = |deleted: u32, seconds: f64| {
        json!({ "store": "rev-4M", "run": 0, "deleted": deleted, "method": "timestamp",
                "cold_cache": true, "metadata_seconds": seconds, "sweep_seconds": 0.0,
                "containers_removed": 1, "scanned_bytes": 0, "timing": timing(seconds) })
    };
    let results = json!({
        "unique": { "bytes": 100_000_000u64, "limits": [limits(0), limits(1)],
                    "stores": [store(0, 1.25, 1.0), store(1, 1.25, 1.0)] },
        "datasets": [{ "dataset": "sg1", "batch_deletions": [batch(1, 0.01), batch(19, 0.03)] }],
    });
    write(
        &directory.path().join("paper2/results.json"),
        &results.to_string(),
    );
    for figure in ["table2-unique-throughput.svg", "fig10-deletion.svg"] {
        write(&directory.path().join("paper2").join(figure), "<svg/>");
    }
    let page = render(directory.path()).unwrap();
    assert!(
        page.contains(
            "| RevDedup 4 MiB write against the raw disk write (RAID-0) | 1,017 of 1,060 MB/s, 95.9% | 80 of 100 MB/s, 80.0% |"
        ),
        "{page}"
    );
    assert!(
        page.contains("| 1,094 of 1,235 MB/s, 88.6% | 100 of 200 MB/s, 50.0% |"),
        "{page}"
    );
    assert!(
        page.contains(
            "| very small for every n (figure only) | 0.010 s (n = 1) to 0.030 s (n = 19) |"
        ),
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
