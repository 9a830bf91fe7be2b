//! Content-defined chunking finds more of what two successive releases of a real package
//! share than fixed-size chunking does. The releases are fetched by
//! `scripts/fetch-test-data.sh` (npm `typescript` 5.4.4 and 5.4.5) into `target/test-data/`.

use std::path::PathBuf;

use onecopy_analyze::{analyze, NoProgress};
use onecopy_core::chunking::ChunkerSpec;

const RELEASES: [&str; 2] = ["typescript-5.4.4", "typescript-5.4.5"];

fn test_data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/test-data")
}

/// The paths of both releases with `suffix` (".tar" or "" for the unpacked tree). Fails the
/// test, saying what to run, when the data is missing.
fn release_paths(suffix: &str) -> Vec<PathBuf> {
    let paths: Vec<PathBuf> = RELEASES
        .iter()
        .map(|release| test_data_dir().join(format!("{release}{suffix}")))
        .collect();
    if let Some(missing) = paths.iter().find(|path| !path.exists()) {
        panic!(
            "test data {} is missing: run scripts/fetch-test-data.sh (scripts/setup.sh runs it)",
            missing.display()
        );
    }
    paths
}

fn unique_bytes(paths: &[PathBuf]) -> Vec<(String, u64, u64)> {
    let chunkers: Vec<ChunkerSpec> = ["fixed:4096", "fastcdc:8192", "rabin:8192"]
        .iter()
        .map(|text| text.parse().unwrap())
        .collect();
    let report = analyze(paths, &chunkers, &NoProgress).unwrap();
    report
        .results
        .iter()
        .map(|result| {
            (
                result.chunker.to_string(),
                result.unique_bytes,
                result.total_bytes,
            )
        })
        .collect()
}

fn assert_content_defined_wins(paths: &[PathBuf]) {
    let results = unique_bytes(paths);
    let (_, fixed_unique, fixed_total) = &results[0];
    for (chunker, unique, total) in &results[1..] {
        assert_eq!(total, fixed_total, "every chunker reads the same bytes");
        assert!(
            unique < fixed_unique,
            "{chunker} keeps {unique} bytes, fixed:4096 keeps {fixed_unique} of {total}"
        );
    }
    eprintln!(
        "unique bytes of {total} read: {results:?}",
        total = fixed_total
    );
}

/// Goal: on the two releases' uncompressed tarballs (where file offsets shift between
/// releases), FastCDC and Rabin keep fewer unique bytes than fixed 4 KiB blocks; method: one
/// analysis of both tarballs per chunker.
#[test]
fn content_defined_beats_fixed_on_release_tarballs() {
    assert_content_defined_wins(&release_paths(".tar"));
}

/// Goal: the same on the unpacked trees, where files that changed between releases have
/// insertions and deletions inside them; method: as above, on the two directories.
#[test]
fn content_defined_beats_fixed_on_release_trees() {
    assert_content_defined_wins(&release_paths(""));
}
