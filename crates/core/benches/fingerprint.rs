//! Fingerprint throughput: BLAKE3 on single 4 KiB blocks, on batches of 4 KiB blocks (one core
//! and both cores) and on one large input; SHA-256 and the others for comparison; memcpy of the
//! same bytes in the same run as the yardstick (`scripts/bench-ratios.py` prints ratios).
//!
//! Run: `cargo bench -p onecopy-core --bench fingerprint`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use onecopy_core::fingerprint::{Fingerprint, FingerprintAlgorithm};
use std::hint::black_box;

/// Bytes hashed per iteration.
const DATA_BYTES: usize = 16 << 20;
/// The block size of the small-input benchmarks.
const BLOCK_BYTES: usize = 4096;

fn random_bytes(len: usize) -> Vec<u8> {
    let mut state = 0x0fed_cba9_8765_4321u64;
    let mut bytes = Vec::with_capacity(len);
    while bytes.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        bytes.extend_from_slice(&state.to_le_bytes());
    }
    bytes.truncate(len);
    bytes
}

fn fingerprint(criterion: &mut Criterion) {
    let data = random_bytes(DATA_BYTES);
    let blocks: Vec<&[u8]> = data.chunks(BLOCK_BYTES).collect();
    let mut out = vec![Fingerprint::ZERO; blocks.len()];
    let mut group = criterion.benchmark_group("fingerprint");
    group.throughput(Throughput::Bytes(DATA_BYTES as u64));
    group.sample_size(10);

    let mut target = vec![0u8; DATA_BYTES];
    group.bench_function("memcpy", |bencher| {
        bencher.iter(|| {
            target.copy_from_slice(black_box(&data));
            black_box(&target);
        })
    });
    for algorithm in FingerprintAlgorithm::ALL {
        group.bench_with_input(
            BenchmarkId::new("single_4KiB", algorithm.name()),
            &algorithm,
            |bencher, algorithm| {
                bencher.iter(|| {
                    for (block, slot) in blocks.iter().zip(out.iter_mut()) {
                        *slot = algorithm.hash(black_box(block));
                    }
                })
            },
        );
    }
    group.bench_function("batch_4KiB/blake3", |bencher| {
        bencher.iter(|| FingerprintAlgorithm::Blake3.hash_batch(black_box(&blocks), &mut out))
    });
    group.bench_function("batch_parallel_4KiB/blake3", |bencher| {
        bencher
            .iter(|| FingerprintAlgorithm::Blake3.hash_batch_parallel(black_box(&blocks), &mut out))
    });
    for algorithm in [FingerprintAlgorithm::Blake3, FingerprintAlgorithm::Sha256] {
        group.bench_with_input(
            BenchmarkId::new("large_16MiB", algorithm.name()),
            &algorithm,
            |bencher, algorithm| bencher.iter(|| algorithm.hash(black_box(&data))),
        );
    }
    group.finish();
}

criterion_group!(benches, fingerprint);
criterion_main!(benches);
