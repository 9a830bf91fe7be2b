//! Fingerprint throughput: BLAKE3 on single 4 KiB blocks, on batches of 4 KiB blocks (plain and
//! keyed; one core and both cores) and on one large input; SHA-256 and the others for comparison; memcpy of the
//! same bytes in the same run as the yardstick (`scripts/bench-ratios.py` prints ratios).
//!
//! Run: `cargo bench -p onecopy-core --bench fingerprint`.
//!
//! Group `fingerprint` is single-threaded and measures the thread's CPU time (see
//! `thread_time.rs`); group `fingerprint_two_cores` measures wall-clock time.

mod thread_time;

use criterion::measurement::Measurement;
use criterion::{
    criterion_group, criterion_main, BenchmarkGroup, BenchmarkId, Criterion, Throughput,
};
use onecopy_core::fingerprint::blake3_lanes::{self, Kernel};
use onecopy_core::fingerprint::{Fingerprint, FingerprintAlgorithm};
use std::hint::black_box;
use thread_time::ThreadTime;

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

fn memcpy<M: Measurement>(group: &mut BenchmarkGroup<'_, M>, data: &[u8]) {
    let mut target = vec![0u8; data.len()];
    group.bench_function("memcpy", |bencher| {
        bencher.iter(|| {
            target.copy_from_slice(black_box(data));
            black_box(&target);
        })
    });
}

fn fingerprint(criterion: &mut Criterion<ThreadTime>) {
    let data = random_bytes(DATA_BYTES);
    let blocks: Vec<&[u8]> = data.chunks(BLOCK_BYTES).collect();
    let mut out = vec![Fingerprint::ZERO; blocks.len()];
    let mut group = criterion.benchmark_group("fingerprint");
    group.throughput(Throughput::Bytes(DATA_BYTES as u64));
    group.sample_size(10);
    memcpy(&mut group, &data);
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
    // BLAKE3 over many blocks at once, with each lane kernel this CPU has (`hash_batch` picks
    // the first supported).
    for kernel in Kernel::ALL
        .into_iter()
        .filter(|kernel| kernel.is_supported())
    {
        let name = format!("{kernel:?}").to_lowercase();
        group.bench_function(BenchmarkId::new("batch_4KiB_blake3", &name), |bencher| {
            bencher
                .iter(|| blake3_lanes::hash_batch_with(kernel, None, black_box(&blocks), &mut out))
        });
        // The keyed mode an encrypted backup store uses.
        let key = [7u8; 32];
        group.bench_function(
            BenchmarkId::new("batch_4KiB_blake3_keyed", name),
            |bencher| {
                bencher.iter(|| {
                    blake3_lanes::hash_batch_with(kernel, Some(&key), black_box(&blocks), &mut out)
                })
            },
        );
    }
    for algorithm in [FingerprintAlgorithm::Blake3, FingerprintAlgorithm::Sha256] {
        group.bench_with_input(
            BenchmarkId::new("large_16MiB", algorithm.name()),
            &algorithm,
            |bencher, algorithm| bencher.iter(|| algorithm.hash(black_box(&data))),
        );
    }
    group.finish();
}

fn fingerprint_two_cores(criterion: &mut Criterion) {
    let data = random_bytes(DATA_BYTES);
    let blocks: Vec<&[u8]> = data.chunks(BLOCK_BYTES).collect();
    let mut out = vec![Fingerprint::ZERO; blocks.len()];
    let mut group = criterion.benchmark_group("fingerprint_two_cores");
    group.throughput(Throughput::Bytes(DATA_BYTES as u64));
    group.sample_size(10);
    memcpy(&mut group, &data);
    group.bench_function("batch_parallel_4KiB/blake3", |bencher| {
        bencher
            .iter(|| FingerprintAlgorithm::Blake3.hash_batch_parallel(black_box(&blocks), &mut out))
    });
    group.finish();
}

criterion_group! {
    name = one_core;
    config = Criterion::default().with_measurement(ThreadTime);
    targets = fingerprint
}
criterion_group!(two_cores, fingerprint_two_cores);
criterion_main!(one_core, two_cores);
