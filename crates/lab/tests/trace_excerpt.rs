//! The trace parser on the real FIU mail excerpt, which is data kept outside the repository
//! (`shared/traces/` beside the workspace; its README asks that it never be copied in).
//!
//! A clone of the repository alone (CI) does not have it, so these tests are ignored by
//! default, with the reason in `cargo test`'s output rather than a silent "ok". Where the
//! excerpt is, run them with
//! `cargo test --release -p onecopy-lab --test trace_excerpt -- --ignored`; without it they
//! then fail saying where to put it.

use std::collections::HashMap;
use std::path::PathBuf;

use onecopy_core::index::cache::CachePolicy;
use onecopy_lab::trace::accesses_of;
use onecopy_lab::trace::{read_trace, Granularity, Operation};
use onecopy_lab::trace_replay::{simulate, Addressing};

const EXCERPT_NAME: &str = "fiu-mail-day1-excerpt.trace";
const EXCERPT: &str = "shared/traces/fiu-mail-day1-excerpt.trace";

/// The excerpt: `ONECOPY_TEST_DATA/<name>` if set, else `shared/traces/` beside the workspace
/// or any of its ancestors (worktrees live one level deeper than the main checkout). Fails the
/// test, saying what to provide, when it is in neither place.
fn excerpt() -> PathBuf {
    if let Some(directory) = std::env::var_os("ONECOPY_TEST_DATA") {
        let path = PathBuf::from(directory).join(EXCERPT_NAME);
        assert!(
            path.is_file(),
            "{} is missing: put the FIU mail trace excerpt there, or unset ONECOPY_TEST_DATA \
             to use {EXCERPT} beside the workspace",
            path.display()
        );
        return path;
    }
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let found = manifest
        .ancestors()
        .map(|ancestor| ancestor.join(EXCERPT))
        .find(|path| path.is_file());
    found.unwrap_or_else(|| {
        panic!(
            "the FIU mail trace excerpt was not found: put it at {EXCERPT} in a directory \
             above {} or set ONECOPY_TEST_DATA to the directory holding {EXCERPT_NAME}",
            manifest.display()
        )
    })
}

/// Goal: the excerpt parses whole and matches its README (10,000 requests, 8,905 reads,
/// 1,095 writes, one MD5 per 4 KiB page, 705 MD5 values seen more than once). Method: read
/// it and count.
#[test]
#[ignore = "needs the FIU mail trace excerpt (not in the repository); where it is, run with --ignored"]
fn excerpt_matches_its_readme() {
    let path = excerpt();
    let records = read_trace(&path).unwrap();
    assert_eq!(records.len(), 10_000);
    let reads = records
        .iter()
        .filter(|record| record.operation == Operation::Read)
        .count();
    assert_eq!(reads, 8_905);
    assert_eq!(records.len() - reads, 1_095);
    assert!(records
        .iter()
        .all(|record| record.granularity == Granularity::Page && record.sectors == 8));
    let mut counts: HashMap<[u8; 16], u32> = HashMap::new();
    for record in &records {
        for (_, digest) in record.blocks() {
            *counts.entry(*digest).or_default() += 1;
        }
    }
    assert_eq!(counts.values().filter(|count| **count > 1).count(), 705);
    assert!(records
        .windows(2)
        .all(|pair| pair[0].timestamp_ns <= pair[1].timestamp_ns));
}

/// Goal: on the real excerpt a content-addressed cache never hits less than a
/// sector-addressed one of the same size (paper 4 Fig. 8's claim); method: simulate both at
/// several sizes with ARC.
#[test]
#[ignore = "needs the FIU mail trace excerpt (not in the repository); where it is, run with --ignored"]
fn content_addressing_never_loses_on_the_excerpt() {
    let path = excerpt();
    let accesses = accesses_of(&read_trace(&path).unwrap()).unwrap();
    assert_eq!(accesses.accesses.len(), 10_000);
    let half = accesses.accesses.len() / 2;
    for blocks in [64, 512, 4096] {
        let content = simulate(
            &accesses.accesses,
            CachePolicy::Arc,
            blocks,
            Addressing::Content,
            half,
        );
        let sector = simulate(
            &accesses.accesses,
            CachePolicy::Arc,
            blocks,
            Addressing::Sector,
            half,
        );
        assert!(
            content.read_hits >= sector.read_hits,
            "{blocks}: {content:?} vs {sector:?}"
        );
    }
}

/// Goal: paper 4's timed replay runs on the excerpt and writes every figure, and on the
/// synthetic days replica retrieval, alone and with duplication, reduces the total disk read
/// time. Method: `paper4::run` in its quick mode into a temporary directory; the runs of
/// results.json compared.
#[test]
#[ignore = "needs the FIU mail trace excerpt (not in the repository); where it is, run with --ignored"]
fn paper4_quick_on_the_excerpt() {
    let out = tempfile::tempdir().unwrap();
    let options =
        onecopy_lab::paper4::Paper4Options::new(out.path().to_path_buf(), excerpt(), true);
    let written = onecopy_lab::paper4::run(&options).unwrap();
    for name in [
        "paper4-fig10.svg",
        "paper4-fig11.svg",
        "paper4-table3.svg",
        "paper4-fig12.svg",
        "paper4-fig13.svg",
        "summary.md",
        "results.json",
    ] {
        assert!(written.contains(&out.path().join(name)), "{name}");
    }
    let results: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("results.json")).unwrap()).unwrap();
    let total = |workload: &str, setup: &str| {
        results["runs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|run| {
                run["workload"].as_str().unwrap().contains(workload) && run["setup"] == setup
            })
            .and_then(|run| run["total_read_s"].as_f64())
            .unwrap_or_else(|| panic!("{workload}: {setup}"))
    };
    let vanilla = total("synthetic", "vanilla");
    let retrieval = total("synthetic", "replica retrieval");
    let duplication = total("synthetic", "replica retrieval + duplication");
    assert!(retrieval < vanilla, "{retrieval} against {vanilla}");
    assert!(duplication < vanilla, "{duplication} against {vanilla}");
}
