use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use super::*;
use crate::index::cache::conformance::fingerprint;
use crate::pages::PageStoreOptions;
use crate::storage::{CrashMode, SimulatedStorage, Storage};

fn open_pages(storage: &Arc<dyn Storage>) -> (PageStore, Vec<u8>) {
    PageStore::open(
        storage.clone(),
        "meta",
        PageStoreOptions { cache_pages: 16 },
    )
    .unwrap()
}

fn small_options() -> IndexOptions {
    IndexOptions {
        cache_bytes: 100 * 1024,
        expected_entries: 1_000,
        ..IndexOptions::default()
    }
}

/// Goal: warming a batch changes neither answers nor counters nor the cache, for both filter
/// kinds and every cache policy. Method: warm present and absent keys, then compare.
#[test]
fn warming_changes_nothing() {
    let kinds = FilterKind::ALL.into_iter();
    for (filter_kind, cache_policy) in
        kinds.flat_map(|kind| CachePolicy::ALL.map(|policy| (kind, policy)))
    {
        let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
        let (mut pages, _) = open_pages(&storage);
        let options = IndexOptions {
            filter_kind,
            cache_policy,
            ..small_options()
        };
        let mut index = FingerprintIndex::open(&mut pages, "fp", options).unwrap();
        index.insert(&mut pages, &fingerprint(2), 20).unwrap();
        index.insert(&mut pages, &fingerprint(1), 10).unwrap();
        index.reset_counters();
        let before = index.counters();
        let batch: Vec<Fingerprint> = (0..64).map(fingerprint).collect();
        index.warm(&batch);
        assert_eq!(index.counters(), before, "{filter_kind} {cache_policy}");
        assert_eq!(index.get_cached(&fingerprint(1)), Some(10));
        assert_eq!(index.get_cached(&fingerprint(3)), None);
        assert_eq!(index.lookup(&mut pages, &fingerprint(2)).unwrap(), Some(20));
        assert_eq!(index.lookup(&mut pages, &fingerprint(5)).unwrap(), None);
    }
}

/// Goal: each step of the lookup path is taken and counted as documented. Method: one
/// stored entry looked up cold, warm, and absent keys.
#[test]
fn lookup_path_is_counted() {
    let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
    let (mut pages, _) = open_pages(&storage);
    let mut index = FingerprintIndex::open(&mut pages, "fp", small_options()).unwrap();
    index.insert(&mut pages, &fingerprint(1), 10).unwrap();
    index.clear_cache();
    index.reset_counters();

    assert_eq!(index.lookup(&mut pages, &fingerprint(1)).unwrap(), Some(10));
    assert_eq!(index.get_cached(&fingerprint(1)), Some(10));
    assert_eq!(index.lookup(&mut pages, &fingerprint(1)).unwrap(), Some(10));
    let mut absent_reaching_disk = 0;
    for n in 1_000..3_000 {
        assert_eq!(index.lookup(&mut pages, &fingerprint(n)).unwrap(), None);
        absent_reaching_disk += index.may_contain(&fingerprint(n)) as u64;
    }
    let counters = index.counters();
    assert_eq!(counters.lookups, 2_002);
    assert_eq!(counters.cache_hits, 1);
    assert_eq!(counters.disk_hits, 1);
    assert_eq!(counters.disk_lookups, 1 + absent_reaching_disk);
    assert_eq!(counters.cache_misses, counters.disk_lookups);
    assert_eq!(counters.filter_negatives, 2_000 - absent_reaching_disk);
    // Filter false positives on 2,000 absent keys at 1% (sized for 1,000, holding 1).
    assert!(absent_reaching_disk < 10, "{absent_reaching_disk}");
    let json = serde_json::to_string(&counters).unwrap();
    assert_eq!(
        serde_json::from_str::<IndexCounters>(&json).unwrap(),
        counters
    );
}

/// Goal: prefetch loads an uncached entry flagged as prefetched, and is a no-op for cached
/// or filtered-out entries. Method: an ARC cache, whose list shows the flag.
#[test]
fn prefetch_loads_flagged_entries() {
    let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
    let (mut pages, _) = open_pages(&storage);
    let mut index = FingerprintIndex::open(&mut pages, "fp", small_options()).unwrap();
    index.insert(&mut pages, &fingerprint(1), 10).unwrap();
    index.insert(&mut pages, &fingerprint(2), 20).unwrap();
    index.clear_cache();
    assert!(index.prefetch(&mut pages, &fingerprint(1)).unwrap());
    let Cache::Arc(arc) = index.cache() else {
        panic!("the default policy is ARC")
    };
    assert_eq!(arc.place(&fingerprint(1)), "T1 prefetched");
    assert!(
        !index.prefetch(&mut pages, &fingerprint(1)).unwrap(),
        "already cached"
    );
    assert!(
        !index.prefetch(&mut pages, &fingerprint(999)).unwrap(),
        "not stored"
    );
    index.reset_counters();
    assert_eq!(index.lookup(&mut pages, &fingerprint(1)).unwrap(), Some(10));
    assert_eq!(index.counters().cache_hits, 1);
    assert_eq!(index.counters().disk_lookups, 0);
}

/// Goal: the filter grows instead of saturating, for both kinds, including a Bloom filter
/// filled with entries that were removed. Method: 20 times the expected entries; every
/// stored entry must be found, and the filter's rate must stay near its target.
#[test]
fn filters_grow_with_the_index() {
    for filter_kind in FilterKind::ALL {
        let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
        let (mut pages, _) = open_pages(&storage);
        let options = IndexOptions {
            filter_kind,
            ..small_options()
        };
        let mut index = FingerprintIndex::open(&mut pages, "fp", options).unwrap();
        for n in 0..20_000 {
            index.insert(&mut pages, &fingerprint(n), n).unwrap();
            if n % 4 == 0 {
                index.remove(&mut pages, &fingerprint(n)).unwrap();
            }
        }
        assert!(index.counters().filter_rebuilds >= 5, "{filter_kind}");
        assert!(index.filter().capacity() > 15_000);
        assert!(index.filter().expected_false_positive_rate() <= 0.01);
        assert_eq!(index.verify(&mut pages).unwrap(), 15_000);
        index.clear_cache();
        for n in 0..20_000 {
            let expected = (n % 4 != 0).then_some(n);
            assert_eq!(index.lookup(&mut pages, &fingerprint(n)).unwrap(), expected);
        }
    }
}

/// Goal: a saved filter is loaded at open when it matches the on-disk index, and rebuilt
/// when it is stale or absent. Method: count rebuilds across reopen variants.
#[test]
fn saved_filters_are_used_only_when_current() {
    for filter_kind in FilterKind::ALL {
        let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
        let options = IndexOptions {
            filter_kind,
            ..small_options()
        };
        let (mut pages, _) = open_pages(&storage);
        let mut index = FingerprintIndex::open(&mut pages, "fp", options.clone()).unwrap();
        assert_eq!(
            index.counters().filter_rebuilds,
            1,
            "a new index builds its filter"
        );
        for n in 0..3_000 {
            index.insert(&mut pages, &fingerprint(n), n).unwrap();
        }
        index.prepare_checkpoint(&mut pages).unwrap();
        pages.checkpoint(b"").unwrap();

        let (mut pages, _) = open_pages(&storage);
        let mut index = FingerprintIndex::open(&mut pages, "fp", options.clone()).unwrap();
        assert_eq!(
            index.counters().filter_rebuilds,
            0,
            "{filter_kind}: saved filter used"
        );
        assert_eq!(index.verify(&mut pages).unwrap(), 3_000);
        // A checkpoint after more changes but without saving the filter leaves it stale.
        index.insert(&mut pages, &fingerprint(5_000), 1).unwrap();
        pages.checkpoint(b"").unwrap();

        let (mut pages, _) = open_pages(&storage);
        let mut index = FingerprintIndex::open(&mut pages, "fp", options.clone()).unwrap();
        assert_eq!(
            index.counters().filter_rebuilds,
            1,
            "{filter_kind}: stale filter rebuilt"
        );
        assert_eq!(
            index.lookup(&mut pages, &fingerprint(5_000)).unwrap(),
            Some(1)
        );
        assert_eq!(index.verify(&mut pages).unwrap(), 3_001);

        // Another kind of filter in the options is built fresh rather than misread.
        let other = IndexOptions {
            filter_kind: FilterKind::ALL
                .into_iter()
                .find(|&k| k != filter_kind)
                .unwrap(),
            ..options
        };
        let index = FingerprintIndex::open(&mut pages, "fp", other).unwrap();
        assert_eq!(index.counters().filter_rebuilds, 1);
    }
}

/// Goal: options parse from partial JSON with defaults, and bad values are refused.
#[test]
fn options_have_defaults_and_checks() {
    let options: IndexOptions =
        serde_json::from_str(r#"{"cache_policy": "lfu", "latency_ns": 500000}"#).unwrap();
    assert_eq!(options.cache_policy, CachePolicy::Lfu);
    assert_eq!(options.latency_ns, 500_000);
    assert_eq!(options.cache_bytes, 64 << 20);
    options.validate().unwrap();
    assert!(serde_json::from_str::<IndexOptions>(r#"{"cache_size": 1}"#).is_err());
    for bad in [
        IndexOptions {
            false_positive_rate: 0.0,
            ..IndexOptions::default()
        },
        IndexOptions {
            cache_bytes: 10,
            ..IndexOptions::default()
        },
        IndexOptions {
            latency_ns: LATENCY_NS_MAX + 1,
            ..IndexOptions::default()
        },
        IndexOptions {
            global_depth_max: 40,
            ..IndexOptions::default()
        },
        IndexOptions {
            expected_entries: 0,
            ..IndexOptions::default()
        },
    ] {
        assert!(bad.validate().is_err(), "{bad:?}");
    }
}

/// Goal: the injected latency is paid on disk lookups only, in both the busy-wait and the
/// sleeping regime, and its busy part is counted. Method: elapsed time is at least the
/// injected total (a lower bound, so a slow machine cannot fail it); the busy time counted is
/// positive and within the elapsed time.
#[test]
fn injected_latency_is_paid_on_disk_lookups() {
    let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
    let (mut pages, _) = open_pages(&storage);
    let mut index = FingerprintIndex::open(&mut pages, "fp", small_options()).unwrap();
    index.insert(&mut pages, &fingerprint(1), 1).unwrap();
    for latency_ns in [50_000u64, 2_000_000] {
        index.set_latency_ns(latency_ns).unwrap();
        index.clear_cache();
        let busy_before = index.counters().injected_wait_busy_ns;
        let started = Instant::now();
        for _ in 0..3 {
            index.clear_cache();
            index.lookup(&mut pages, &fingerprint(1)).unwrap();
        }
        let elapsed = started.elapsed().as_nanos() as u64;
        assert!(elapsed >= 3 * latency_ns);
        // The busy part of the waits is counted, and is part of the time they took.
        let busy = index.counters().injected_wait_busy_ns - busy_before;
        assert!(
            busy > 0 && busy <= elapsed,
            "busy {busy} ns of {elapsed} ns"
        );
    }
    assert!(index.set_latency_ns(LATENCY_NS_MAX + 1).is_err());
}

/// Goal: memory is reported by part and the cache stays within its budget.
#[test]
fn memory_is_reported_by_part() {
    let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
    let (mut pages, _) = open_pages(&storage);
    let mut index = FingerprintIndex::open(&mut pages, "fp", small_options()).unwrap();
    for n in 0..5_000 {
        index.insert(&mut pages, &fingerprint(n), n).unwrap();
    }
    let memory = index.memory();
    assert!(memory.cache_bytes <= 100 * 1024);
    assert!(memory.filter_bytes > 0);
    assert!(memory.directory_bytes >= 4 * index.disk().bucket_pages());
    assert_eq!(index.memory_bytes(), memory.total_bytes());
}

/// Goal: the pass-through hasher works as a HashMap hasher for fingerprints.
#[test]
fn fingerprint_hasher_serves_hash_maps() {
    let mut map: HashMap<Fingerprint, u64, FingerprintBuildHasher> = HashMap::default();
    for n in 0..10_000 {
        map.insert(fingerprint(n), n);
    }
    assert!((0..10_000).all(|n| map[&fingerprint(n)] == n));
    let hash = FingerprintBuildHasher.hash_one(fingerprint(3));
    assert_eq!(hash, fingerprint(3).prefix_u64());
}

/// A deterministic schedule of operations: round `r` applies `operations(r)`.
fn operations(round: u64) -> Vec<(u64, Option<u64>)> {
    let mut state = round.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..250)
        .map(|step| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let key = state % 900;
            let value = (!state.is_multiple_of(3)).then_some(round * 1_000 + step);
            (key, value)
        })
        .collect()
}

fn model_after(round: u64) -> BTreeMap<u64, u64> {
    let mut model = BTreeMap::new();
    for r in 1..=round {
        for (key, value) in operations(r) {
            match value {
                Some(value) => model.insert(key, value),
                None => model.remove(&key),
            };
        }
    }
    model
}

/// Runs `rounds` rounds, each ending in a checkpoint whose user state is the round number.
/// Round 3 skips `prepare_checkpoint`, so the filter saved with it is stale. Stops at the
/// first error (the simulated crash).
fn run_rounds(storage: &SimulatedStorage, options: &IndexOptions, rounds: u64) {
    let shared: Arc<dyn Storage> = Arc::new(storage.clone());
    let Ok((mut pages, _)) = PageStore::open(shared, "meta", PageStoreOptions { cache_pages: 4 })
    else {
        return;
    };
    let Ok(mut index) = FingerprintIndex::open(&mut pages, "fp", options.clone()) else {
        return;
    };
    for round in 1..=rounds {
        for (key, value) in operations(round) {
            let result = match value {
                Some(value) => index.insert(&mut pages, &fingerprint(key), value).map(drop),
                None => index.remove(&mut pages, &fingerprint(key)).map(drop),
            };
            if result.is_err() {
                return;
            }
        }
        if round != 3 && index.prepare_checkpoint(&mut pages).is_err() {
            return;
        }
        if pages.checkpoint(&round.to_le_bytes()).is_err() {
            return;
        }
    }
}

/// Goal: after a crash at any sync, clean or with torn writes, the reopened index equals the
/// reference model of the last durable checkpoint, for both filter kinds. Method: crash after
/// the Nth sync for every N, reopen, read the round from the checkpoint's user state, compare
/// every key and verify the structure.
#[test]
fn crashes_recover_the_last_checkpoint() {
    let rounds = 6;
    for filter_kind in FilterKind::ALL {
        let options = IndexOptions {
            filter_kind,
            expected_entries: 100,
            cache_bytes: 16 * 1024,
            ..IndexOptions::default()
        };
        let total_syncs = {
            let storage = SimulatedStorage::new();
            run_rounds(&storage, &options, rounds);
            storage.sync_count()
        };
        let mut rounds_recovered = std::collections::BTreeSet::new();
        for crash_at in 1..=total_syncs {
            for mode in [CrashMode::Clean, CrashMode::Torn { seed: crash_at }] {
                let storage = SimulatedStorage::new();
                storage.crash_after_syncs(crash_at);
                run_rounds(&storage, &options, rounds);
                let after: Arc<dyn Storage> = Arc::new(storage.crash(mode));
                let (mut pages, state) = open_pages(&after);
                let round = if state.is_empty() {
                    0
                } else {
                    u64::from_le_bytes(state[..8].try_into().unwrap())
                };
                let mut index = FingerprintIndex::open(&mut pages, "fp", options.clone()).unwrap();
                rounds_recovered.insert(round);
                let model = model_after(round);
                let context = format!("{filter_kind}, crash at sync {crash_at}, {mode:?}");
                assert_eq!(index.len(), model.len() as u64, "{context}");
                assert_eq!(
                    index.verify(&mut pages).unwrap(),
                    model.len() as u64,
                    "{context}"
                );
                for key in 0..900 {
                    let found = index.lookup(&mut pages, &fingerprint(key)).unwrap();
                    assert_eq!(found, model.get(&key).copied(), "{context}, key {key}");
                }
            }
        }
        // Every checkpoint, and the empty start, was the surviving state of some crash.
        assert_eq!(rounds_recovered, (0..=rounds).collect(), "{filter_kind}");
    }
}
