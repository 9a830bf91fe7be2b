//! Benchmarks of the fingerprint index: cached lookups (goal: at most 100 ns) over a
//! 200,000-entry working set (bound by memory latency) in insertion order (as a repeated
//! backup stream looks its fingerprints up) and in random order, and a 4,096-entry hot set,
//! filter negatives, on-disk lookups with a warm page cache, inserts, filters alone, and
//! opening a 1M-entry index with a saved or a rebuilt filter. Before the timings it prints
//! the filters' memory per entry and measured false-positive rates, and the cache entry
//! limits.
//!
//! Run: `cargo bench -p onecopy-core --bench index` (add a filter such as `-- lookup` to run
//! a subset).

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use onecopy_core::fingerprint::Fingerprint;
use onecopy_core::index::cache::CachePolicy;
use onecopy_core::index::filter::{Filter, FilterKind, MembershipFilter};
use onecopy_core::index::{FingerprintIndex, IndexOptions};
use onecopy_core::pages::{PageStore, PageStoreOptions};
use onecopy_core::storage::{LocalStorage, SimulatedStorage, Storage};

/// Entries in the indexes of the lookup benchmarks.
const ENTRIES: u64 = 200_000;
/// Fingerprints warmed together in the batched lookup benchmark: the most blocks the block
/// device's write batch fingerprints at once (16 writes of 4 KiB).
const WARM_BATCH: usize = 16;
/// Entries of the open-time benchmark.
const OPEN_ENTRIES: u64 = 1_000_000;

/// A uniformly random fingerprint for `n` (SplitMix64 over four words: cheap enough not to
/// dominate an insert).
fn synthetic_fingerprint(n: u64) -> Fingerprint {
    let mut bytes = [0u8; 32];
    let mut state = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    for chunk in bytes.chunks_exact_mut(8) {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        chunk.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    Fingerprint(bytes)
}

fn memory_pages(cache_pages: usize) -> PageStore {
    let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
    PageStore::open(storage, "meta", PageStoreOptions { cache_pages })
        .expect("open page store")
        .0
}

/// An index of `ENTRIES` entries with the given options, checkpointed so its pages are clean
/// and served from the page cache.
fn filled_index(options: IndexOptions) -> (PageStore, FingerprintIndex, Vec<Fingerprint>) {
    let mut pages = memory_pages(8192);
    let mut index = FingerprintIndex::open(&mut pages, "fp", options).expect("open index");
    let keys: Vec<Fingerprint> = (0..ENTRIES).map(synthetic_fingerprint).collect();
    for (n, key) in keys.iter().enumerate() {
        index.insert(&mut pages, key, n as u64).expect("insert");
    }
    index.prepare_checkpoint(&mut pages).expect("save filter");
    pages.checkpoint(b"").expect("checkpoint");
    (pages, index, keys)
}

fn report_filters() {
    println!("filter memory and false-positive rates (capacity 1,000,000, 1,000,000 probes):");
    for kind in FilterKind::ALL {
        for rate in [0.01, 0.001] {
            let capacity = 1_000_000u64;
            let mut filter = Filter::new(kind, capacity, rate).expect("filter");
            for n in 0..capacity {
                filter.insert(&synthetic_fingerprint(n));
            }
            let probes = 1_000_000u64;
            let positives = (0..probes)
                .filter(|n| filter.may_contain(&synthetic_fingerprint(u64::MAX - n)))
                .count();
            let full = filter.memory_bytes() as f64 / capacity as f64;
            println!(
                "  {kind:6} target {rate}: {full:.3} bytes/entry full, {:.3} just after a 1.5x \
                 growth; measured false-positive rate {:.4}% (expected {:.4}%)",
                full * 1.5,
                positives as f64 * 100.0 / probes as f64,
                filter.expected_false_positive_rate() * 100.0
            );
        }
    }
    println!("cache entry limits for a 64 MiB budget:");
    for policy in CachePolicy::ALL {
        let entries = policy.entries_for_budget(64 << 20);
        println!(
            "  {policy}: {entries} entries, {:.1} bytes/entry",
            (64u64 << 20) as f64 / entries as f64
        );
    }
}

fn lookups(c: &mut Criterion) {
    report_filters();
    let mut group = c.benchmark_group("index_lookup");
    for policy in CachePolicy::ALL {
        let options = IndexOptions {
            cache_policy: policy,
            cache_bytes: 64 << 20,
            ..IndexOptions::default()
        };
        let (mut pages, mut index, keys) = filled_index(options);
        // Every entry is cached after one pass; the timed passes are cache hits.
        for key in &keys {
            index.lookup(&mut pages, key).expect("lookup");
        }
        let mut cursor = 0usize;
        group.bench_function(BenchmarkId::new("cached", policy), |b| {
            b.iter(|| {
                cursor = (cursor + 1) % keys.len();
                black_box(index.lookup(&mut pages, &keys[cursor]).expect("lookup"))
            })
        });
        // The same stream looked up as the write paths do it: batches of WARM_BATCH
        // fingerprints, warmed together, then looked up one by one. Timed per lookup.
        let mut batch_start = 0usize;
        group.bench_function(BenchmarkId::new("cached_warmed_batch", policy), |b| {
            b.iter_custom(|lookups| {
                let started = Instant::now();
                let mut done = 0u64;
                while done < lookups {
                    let wanted = (lookups - done).min(WARM_BATCH as u64) as usize;
                    if batch_start + wanted > keys.len() {
                        batch_start = 0;
                    }
                    let batch = &keys[batch_start..batch_start + wanted];
                    index.warm(batch);
                    for key in batch {
                        black_box(index.lookup(&mut pages, key).expect("lookup"));
                    }
                    batch_start += wanted;
                    done += wanted as u64;
                }
                started.elapsed()
            })
        });
        // Independent random picks: neither the table slots nor the list neighbours of
        // consecutive lookups are related, as for lookups in no particular order.
        let mut random = 0x2545_F491_4F6C_DD1Du64;
        group.bench_function(BenchmarkId::new("cached_random", policy), |b| {
            b.iter(|| {
                random ^= random << 13;
                random ^= random >> 7;
                random ^= random << 17;
                // Computed rather than read from `keys`, whose random reads would add a miss
                // of their own: `keys[n]` is `synthetic_fingerprint(n)`.
                let key = synthetic_fingerprint(random % ENTRIES);
                black_box(index.lookup(&mut pages, &key).expect("lookup"))
            })
        });
        // A hot set small enough for the processor's caches: the cost of the code itself.
        let hot = &keys[..4096];
        group.bench_function(BenchmarkId::new("cached_hot_4096", policy), |b| {
            b.iter(|| {
                cursor = (cursor + 1) % hot.len();
                black_box(index.lookup(&mut pages, &hot[cursor]).expect("lookup"))
            })
        });
        assert_eq!(
            index.counters().disk_lookups,
            0,
            "all timed lookups were cached"
        );
    }

    let (mut pages, mut index, _) = filled_index(IndexOptions::default());
    let mut absent = ENTRIES;
    group.bench_function("filter_negative", |b| {
        b.iter(|| {
            absent += 1;
            black_box(
                index
                    .lookup(&mut pages, &synthetic_fingerprint(absent))
                    .expect("lookup"),
            )
        })
    });

    // A one-entry-sized cache: nearly every lookup reads a bucket page from the page cache.
    let options = IndexOptions {
        cache_policy: CachePolicy::Lru,
        cache_bytes: 4096,
        ..IndexOptions::default()
    };
    let (mut pages, mut index, keys) = filled_index(options);
    let mut cursor = 0usize;
    group.bench_function("disk_warm_page_cache", |b| {
        b.iter(|| {
            cursor = (cursor + 7919) % keys.len();
            black_box(index.lookup(&mut pages, &keys[cursor]).expect("lookup"))
        })
    });
    group.finish();
}

fn inserts(c: &mut Criterion) {
    let mut group = c.benchmark_group("index_insert");
    group.measurement_time(Duration::from_secs(4));
    for kind in FilterKind::ALL {
        // Each sample inserts new keys into a fresh index, so the index grows from empty to
        // the sample's size (splits and page copies included, checkpoints excluded).
        group.bench_function(BenchmarkId::new("new_keys", kind), |b| {
            b.iter_custom(|iterations| {
                let mut pages = memory_pages(4096);
                let options = IndexOptions {
                    filter_kind: kind,
                    ..IndexOptions::default()
                };
                let mut index = FingerprintIndex::open(&mut pages, "fp", options).expect("open");
                let started = Instant::now();
                for n in 0..iterations {
                    index
                        .insert(&mut pages, &synthetic_fingerprint(n), n)
                        .expect("insert");
                }
                started.elapsed()
            })
        });
    }
    group.finish();
}

fn filters(c: &mut Criterion) {
    let mut group = c.benchmark_group("filter");
    for kind in FilterKind::ALL {
        let mut filter = Filter::new(kind, 1_000_000, 0.01).expect("filter");
        for n in 0..1_000_000 {
            filter.insert(&synthetic_fingerprint(n));
        }
        let mut n = 0u64;
        group.bench_function(BenchmarkId::new("may_contain_present", kind), |b| {
            b.iter(|| {
                n = (n + 1) % 1_000_000;
                black_box(filter.may_contain(&synthetic_fingerprint(n)))
            })
        });
        group.bench_function(BenchmarkId::new("may_contain_absent", kind), |b| {
            b.iter(|| {
                n += 1;
                black_box(filter.may_contain(&synthetic_fingerprint(u64::MAX - n)))
            })
        });
    }
    group.bench_function("synthetic_fingerprint_only", |b| {
        let mut n = 0u64;
        b.iter(|| {
            n += 1;
            black_box(synthetic_fingerprint(n))
        })
    });
    group.finish();
}

/// Opening a 1M-entry index on local files: with the saved filter, and rebuilding it from
/// every bucket page. The operating system's file cache is warm in both cases.
fn open_time(c: &mut Criterion) {
    let directory = tempfile::tempdir().expect("temporary directory");
    let storage: Arc<dyn Storage> =
        Arc::new(LocalStorage::open(directory.path()).expect("local storage"));
    {
        let (mut pages, _) =
            PageStore::open(storage.clone(), "meta", PageStoreOptions::default()).expect("open");
        let mut index =
            FingerprintIndex::open(&mut pages, "fp", IndexOptions::default()).expect("open");
        for n in 0..OPEN_ENTRIES {
            index
                .insert(&mut pages, &synthetic_fingerprint(n), n)
                .expect("insert");
            if pages.dirty_page_count() > 20_000 {
                index.prepare_checkpoint(&mut pages).expect("save filter");
                pages.checkpoint(b"").expect("checkpoint");
            }
        }
        index.prepare_checkpoint(&mut pages).expect("save filter");
        pages.checkpoint(b"").expect("checkpoint");
        println!(
            "open benchmark index: {} entries, {} bucket pages, global depth {}, memory {:?}",
            index.len(),
            index.disk().bucket_pages(),
            index.disk().global_depth(),
            index.memory()
        );
    }
    let mut group = c.benchmark_group("index_open_1m");
    group.sample_size(10);
    for (name, persist_filter) in [("saved_filter", true), ("rebuilt_filter", false)] {
        let options = IndexOptions {
            persist_filter,
            ..IndexOptions::default()
        };
        group.bench_function(name, |b| {
            b.iter(|| {
                let (mut pages, _) =
                    PageStore::open(storage.clone(), "meta", PageStoreOptions::default())
                        .expect("open");
                let index =
                    FingerprintIndex::open(&mut pages, "fp", options.clone()).expect("open");
                assert_eq!(index.counters().filter_rebuilds, u64::from(!persist_filter));
                black_box(index.len())
            })
        });
    }
    group.finish();
}

criterion_group!(benches, lookups, inserts, filters, open_time);
criterion_main!(benches);
