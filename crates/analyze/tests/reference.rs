//! `analyze` against a reference computed the obvious way: every file chunked in memory with
//! `SliceChunks`, every non-zero chunk fingerprinted with the `blake3` crate into a `HashSet`.

use std::collections::HashSet;
use std::fs;
use std::path::Path;

use onecopy_analyze::{analyze, NoProgress};
use onecopy_core::chunking::{ChunkerSpec, SliceChunks};

/// Pseudo-random bytes (xorshift), so the test needs no stored data.
fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

/// [total, zero, unique, chunks, unique chunks] for `files` cut with `spec`.
fn reference(spec: &ChunkerSpec, files: &[Vec<u8>]) -> [u64; 5] {
    let mut seen = HashSet::new();
    let mut counts = [0u64; 5];
    for data in files {
        for chunk in SliceChunks::new(spec.build(), data) {
            let len = chunk.data.len() as u64;
            counts[0] += len;
            counts[3] += 1;
            if chunk.data.iter().all(|&byte| byte == 0) {
                counts[1] += len;
            } else if seen.insert(*blake3::hash(chunk.data).as_bytes()) {
                counts[2] += len;
                counts[4] += 1;
            }
        }
    }
    counts
}

fn write(path: &Path, data: &[u8]) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, data).unwrap();
}

/// Goal: exact agreement with the reference for every kind of chunker, across 8 MiB block
/// boundaries, small files packed into one block, empty files, zero runs and repeated content;
/// method: build such a tree in a temporary directory and compare all five counts.
#[test]
fn counts_match_reference() {
    let directory = tempfile::tempdir().unwrap();
    let root = directory.path();
    let mut files = Vec::new();
    // A 21 MiB file with zero runs and a repeated region: spans three blocks.
    let mut large = random_bytes(1, 21 << 20);
    large[3 << 20..5 << 20].fill(0);
    let copied = large[1 << 20..2 << 20].to_vec();
    large[10 << 20..11 << 20].copy_from_slice(&copied);
    // Exactly one block: its end is found only by the next read.
    let exact = random_bytes(2, 8 << 20);
    let mut small: Vec<Vec<u8>> = (0..200)
        .map(|index| random_bytes(100 + index, (index as usize * 7919) % 40_000))
        .collect();
    small[10] = small[3].clone();
    small[11] = vec![0; 12_345];
    // Walk order is by name: a/ (large), b/ (exact), c/NNN (small).
    write(&root.join("a/large"), &large);
    files.push(large);
    write(&root.join("b/exact"), &exact);
    files.push(exact);
    for (index, data) in small.into_iter().enumerate() {
        write(&root.join(format!("c/{index:03}")), &data);
        files.push(data);
    }
    // A symbolic link is not followed, so its target is counted once.
    std::os::unix::fs::symlink(root.join("a/large"), root.join("c/zzz-link")).unwrap();

    let chunkers: Vec<ChunkerSpec> = [
        "fixed:4096",
        "fixed:1MiB",
        "fastcdc:8192",
        "fastcdc:64KiB",
        "rabin:4096",
        "segment:1MiB/4KiB",
    ]
    .iter()
    .map(|text| text.parse().unwrap())
    .collect();
    let report = analyze(&[root.to_path_buf()], &chunkers, &NoProgress).unwrap();
    assert_eq!(report.files, files.len() as u64);
    assert_eq!(report.skipped, 1);
    for (spec, result) in chunkers.iter().zip(&report.results) {
        assert_eq!(result.chunker, *spec);
        let measured = [
            result.total_bytes,
            result.zero_bytes,
            result.unique_bytes,
            result.chunks,
            result.unique_chunks,
        ];
        assert_eq!(measured, reference(spec, &files), "{spec}");
        assert!(
            result.zero_bytes > 0 && result.unique_bytes < result.total_bytes - result.zero_bytes
        );
    }
}

/// Goal: an unreadable path fails with an error naming it; method: analyze a missing path.
#[test]
fn missing_path_is_named() {
    let directory = tempfile::tempdir().unwrap();
    let missing = directory.path().join("no-such-file");
    let error = analyze(
        std::slice::from_ref(&missing),
        &["fixed:4096".parse().unwrap()],
        &NoProgress,
    )
    .unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains(&missing.display().to_string()),
        "{message}"
    );
    assert!(message.contains("No such file"), "{message}");
}
