//! `onecopy analyze` as scripts use it: the JSON contract, and exact agreement with an
//! independent Python computation (scripts/analyze-reference.py) on real system files.

use std::fs::{self, File};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const COUNT_FIELDS: [&str; 5] = [
    "total_bytes",
    "zero_bytes",
    "unique_bytes",
    "chunks",
    "unique_chunks",
];

fn repository_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `onecopy analyze ARGS` with no repository anywhere; returns its parsed JSON output.
fn analyze_json(args: &[&str]) -> Value {
    let output = Command::new(env!("CARGO_BIN_EXE_onecopy"))
        .arg("analyze")
        .args(args)
        .env("ONECOPY_REPO", "/nonexistent/onecopy-repository")
        .output()
        .expect("run onecopy");
    assert!(
        output.status.success(),
        "onecopy analyze failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("one JSON object on standard output")
}

/// Writes a sparse file with holes, data, a duplicated region and an unaligned tail.
fn write_sparse_file(path: &Path) {
    let mut file = File::create(path).unwrap();
    file.set_len(48 << 20).unwrap();
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let data: Vec<u8> = (0..(1 << 20) + 1000)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    for offset in [0u64, 5 << 20, (20 << 20) + 512, 47 << 20] {
        file.seek(SeekFrom::Start(offset)).unwrap();
        file.write_all(&data).unwrap();
    }
    file.seek(SeekFrom::Start((48 << 20) + 333)).unwrap();
    file.write_all(b"tail").unwrap();
}

/// Goal: all five counts equal those of an independent computation (Python, hashlib SHA-256,
/// its own directory walk) on a directory of real system libraries plus a made-up sparse file
/// with zero blocks, a symbolic link and a FIFO; method: run both and compare.
#[test]
fn fixed_counts_match_python_reference() {
    let scratch = tempfile::tempdir().unwrap();
    write_sparse_file(&scratch.path().join("sparse.img"));
    std::os::unix::fs::symlink("/usr/lib/x86_64-linux-gnu", scratch.path().join("link")).unwrap();
    let fifo = scratch.path().join("fifo");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let system = "/usr/lib/x86_64-linux-gnu";
    let scratch_path = scratch.path().to_str().unwrap();

    let report = analyze_json(&["--json", "--chunker", "fixed:4096", system, scratch_path]);
    let results = report["results"].as_array().unwrap();
    assert_eq!(results.len(), 1);
    assert_eq!(results[0]["chunker"], "fixed:4096");
    assert!(results[0]["seconds"].as_f64().unwrap() > 0.0);

    let reference = Command::new("python3")
        .arg(repository_root().join("scripts/analyze-reference.py"))
        .args(["4096", system, scratch_path])
        .output()
        .expect("run python3");
    assert!(
        reference.status.success(),
        "{}",
        String::from_utf8_lossy(&reference.stderr)
    );
    let reference: Value = serde_json::from_slice(&reference.stdout).unwrap();
    for field in COUNT_FIELDS {
        assert_eq!(results[0][field], reference[field], "{field}");
    }
    assert!(
        reference["zero_bytes"].as_u64().unwrap() >= 40 << 20,
        "the sparse file's holes count"
    );
    assert!(
        reference["unique_bytes"].as_u64().unwrap() < reference["total_bytes"].as_u64().unwrap()
    );
}

/// Goal: the JSON has one result per chunker, in the order and spelling given, with exactly the
/// documented fields; method: two chunkers, one spelled with a unit.
#[test]
fn json_keeps_chunker_order_and_spelling() {
    let scratch = tempfile::tempdir().unwrap();
    fs::write(scratch.path().join("a"), vec![7u8; 100_000]).unwrap();
    let report = analyze_json(&[
        "--json",
        "--chunker",
        "fastcdc:8KiB",
        "--chunker",
        "fixed:4096",
        scratch.path().to_str().unwrap(),
    ]);
    let object = report.as_object().unwrap();
    assert_eq!(object.keys().collect::<Vec<_>>(), ["results"]);
    let results = report["results"].as_array().unwrap();
    let chunkers: Vec<&str> = results
        .iter()
        .map(|result| result["chunker"].as_str().unwrap())
        .collect();
    assert_eq!(chunkers, ["fastcdc:8KiB", "fixed:4096"]);
    for result in results {
        let mut fields: Vec<&str> = result
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        fields.sort();
        let mut expected = COUNT_FIELDS.to_vec();
        expected.extend(["chunker", "seconds"]);
        expected.sort();
        assert_eq!(fields, expected);
        assert_eq!(result["total_bytes"], 100_000);
    }
    // 100,000 bytes of 7s: fixed 4 KiB chunks are 24 equal ones and a 1,696-byte tail.
    assert_eq!(results[1]["chunks"], 25);
    assert_eq!(results[1]["unique_chunks"], 2);
}

/// Goal: an unreadable path and an invalid chunker fail with messages naming them.
#[test]
fn errors_name_the_problem() {
    let run = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_onecopy"))
            .arg("analyze")
            .args(args)
            .output()
            .unwrap();
        assert!(!output.status.success());
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let message = run(&["--json", "/nonexistent/onecopy-input"]);
    assert!(
        message.contains("/nonexistent/onecopy-input") && message.contains("No such file"),
        "{message}"
    );
    let message = run(&["--chunker", "fixed:3000", "/usr/lib"]);
    assert!(
        message.contains("fixed:3000") && message.contains("power of two"),
        "{message}"
    );
}
