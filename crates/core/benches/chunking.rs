//! Chunking throughput, with memcpy of the same bytes measured in the same run as the yardstick
//! (`scripts/bench-ratios.py` prints every figure as a ratio to it).
//!
//! Run: `cargo bench -p onecopy-core --bench chunking`.
//!
//! Groups (single-threaded ones measure the thread's CPU time, see `thread_time.rs`):
//! - `chunking`: cutting only, one core.
//! - `chunking_blake3`: cutting and fingerprinting every chunk with BLAKE3 on one core, one
//!   chunk at a time or in batches (`hash_batch`, SIMD lanes across chunks).
//! - `chunking_blake3_two_cores`: the same on two cores, in wall-clock time: `parallel` cuts
//!   and fingerprints pieces of the buffer on every thread and splices them
//!   (`chunk_and_fingerprint_parallel`); `one_cutting_thread` cuts on one thread and hands
//!   batches of cuts to the rayon pool, which fingerprints them.

mod thread_time;

use criterion::measurement::Measurement;
use criterion::{
    criterion_group, criterion_main, BenchmarkGroup, BenchmarkId, Criterion, Throughput,
};
use onecopy_core::chunking::{chunk_and_fingerprint_parallel, ChunkerSpec, SliceChunks};
use onecopy_core::fingerprint::{Fingerprint, FingerprintAlgorithm};
use std::hint::black_box;
use thread_time::ThreadTime;

/// Bytes chunked per iteration: large enough to leave the CPU caches.
const DATA_BYTES: usize = 64 << 20;
/// Chunks fingerprinted together (one `hash_batch` call), and handed to the pool at a time in
/// the two-core benchmark.
const BATCH_BYTES: usize = 1 << 20;

fn random_bytes(len: usize) -> Vec<u8> {
    let mut state = 0x1234_5678_9abc_def0u64;
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

fn memcpy<M: Measurement>(criterion_group: &mut BenchmarkGroup<'_, M>, data: &[u8]) {
    let mut target = vec![0u8; data.len()];
    criterion_group.bench_function("memcpy", |bencher| {
        bencher.iter(|| {
            target.copy_from_slice(black_box(data));
            black_box(&target);
        })
    });
}

fn chunking(criterion: &mut Criterion<ThreadTime>) {
    let data = random_bytes(DATA_BYTES);
    let mut group = criterion.benchmark_group("chunking");
    group.throughput(Throughput::Bytes(DATA_BYTES as u64));
    group.sample_size(10);
    memcpy(&mut group, &data);
    for text in [
        "fixed:4096",
        "fastcdc:8192",
        "rabin:8192",
        "segment:4MiB/4KiB",
        "segment-gear:4MiB/4KiB",
    ] {
        let spec: ChunkerSpec = text.parse().expect("valid spec");
        group.bench_with_input(BenchmarkId::from_parameter(text), &spec, |bencher, spec| {
            bencher.iter(|| SliceChunks::new(spec.build(), black_box(&data)).count())
        });
    }
    group.finish();
}

/// Cuts `data` into chunks and fingerprints them one by one on one thread.
fn chunk_and_hash_one_by_one(spec: &ChunkerSpec, data: &[u8]) -> Vec<Fingerprint> {
    SliceChunks::new(spec.build(), data)
        .map(|chunk| FingerprintAlgorithm::Blake3.hash(chunk.data))
        .collect()
}

/// Cuts `data` into chunks and fingerprints them in batches of about `BATCH_BYTES` with
/// `hash_batch` (SIMD lanes across chunks) on one thread.
fn chunk_and_hash_batched(spec: &ChunkerSpec, data: &[u8]) -> usize {
    let mut batch: Vec<&[u8]> = Vec::new();
    let mut batch_bytes = 0;
    let mut out = Vec::new();
    let mut fingerprints = 0;
    let mut chunks = SliceChunks::new(spec.build(), data).peekable();
    while let Some(chunk) = chunks.next() {
        batch.push(chunk.data);
        batch_bytes += chunk.data.len();
        if batch_bytes >= BATCH_BYTES || chunks.peek().is_none() {
            out.resize(batch.len(), Fingerprint::ZERO);
            FingerprintAlgorithm::Blake3.hash_batch(&batch, &mut out);
            fingerprints += out.len();
            batch.clear();
            batch_bytes = 0;
        }
    }
    fingerprints
}

/// Cuts `data` on one thread and fingerprints batches of chunks on the rayon pool meanwhile.
fn chunk_and_hash_two_cores(spec: &ChunkerSpec, data: &[u8]) -> usize {
    let mut fingerprints = 0usize;
    let counter = std::sync::atomic::AtomicUsize::new(0);
    rayon::scope(|scope| {
        let mut batch: Vec<&[u8]> = Vec::new();
        let mut batch_bytes = 0;
        let counter = &counter;
        for chunk in SliceChunks::new(spec.build(), data) {
            batch.push(chunk.data);
            batch_bytes += chunk.data.len();
            if batch_bytes >= BATCH_BYTES {
                let full = std::mem::take(&mut batch);
                batch_bytes = 0;
                scope.spawn(move |_| {
                    let mut out = vec![Fingerprint::ZERO; full.len()];
                    FingerprintAlgorithm::Blake3.hash_batch(&full, &mut out);
                    counter.fetch_add(out.len(), std::sync::atomic::Ordering::Relaxed);
                });
            }
        }
        let mut out = vec![Fingerprint::ZERO; batch.len()];
        FingerprintAlgorithm::Blake3.hash_batch(&batch, &mut out);
        fingerprints += out.len();
    });
    fingerprints + counter.into_inner()
}

fn chunking_blake3(criterion: &mut Criterion<ThreadTime>) {
    let data = random_bytes(DATA_BYTES);
    let mut group = criterion.benchmark_group("chunking_blake3");
    group.throughput(Throughput::Bytes(DATA_BYTES as u64));
    group.sample_size(10);
    memcpy(&mut group, &data);
    for text in ["fastcdc:8192", "rabin:8192", "fixed:4096"] {
        let spec: ChunkerSpec = text.parse().expect("valid spec");
        group.bench_with_input(
            BenchmarkId::new("one_by_one", text),
            &spec,
            |bencher, spec| bencher.iter(|| chunk_and_hash_one_by_one(spec, black_box(&data))),
        );
        group.bench_with_input(BenchmarkId::new("batched", text), &spec, |bencher, spec| {
            bencher.iter(|| chunk_and_hash_batched(spec, black_box(&data)))
        });
    }
    group.finish();
}

fn chunking_blake3_two_cores(criterion: &mut Criterion) {
    let data = random_bytes(DATA_BYTES);
    let mut group = criterion.benchmark_group("chunking_blake3_two_cores");
    group.throughput(Throughput::Bytes(DATA_BYTES as u64));
    group.sample_size(10);
    memcpy(&mut group, &data);
    let threads = rayon::current_num_threads();
    for text in ["fastcdc:8192", "fixed:4096"] {
        let spec: ChunkerSpec = text.parse().expect("valid spec");
        group.bench_with_input(
            BenchmarkId::new("parallel", text),
            &spec,
            |bencher, spec| {
                bencher.iter(|| {
                    chunk_and_fingerprint_parallel(
                        spec,
                        black_box(&data),
                        FingerprintAlgorithm::Blake3,
                        threads,
                    )
                    .len()
                })
            },
        );
        group.bench_with_input(
            BenchmarkId::new("one_cutting_thread", text),
            &spec,
            |bencher, spec| bencher.iter(|| chunk_and_hash_two_cores(spec, black_box(&data))),
        );
    }
    group.finish();
}

criterion_group! {
    name = one_core;
    config = Criterion::default().with_measurement(ThreadTime);
    targets = chunking, chunking_blake3
}
criterion_group!(two_cores, chunking_blake3_two_cores);
criterion_main!(one_core, two_cores);
