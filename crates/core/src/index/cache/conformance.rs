//! The conformance suite every [`EntryCache`] joins with one line:
//! `cache_conformance!(module_name, |entries| MyCache::new(entries));`
//! It checks the trait's contract; policy-specific behaviour is tested next to each policy.

use std::collections::HashMap;

use super::EntryCache;
use crate::fingerprint::Fingerprint;

/// A distinct, uniformly spread fingerprint for test number `n`.
pub(crate) fn fingerprint(n: u64) -> Fingerprint {
    Fingerprint(*blake3::hash(&n.to_le_bytes()).as_bytes())
}

/// Goal: an entry is readable right after insert, and `peek` agrees with `get`.
pub(crate) fn get_after_insert<C: EntryCache>(mut cache: C) {
    for n in 0..cache.entries_limit() as u64 {
        cache.insert(&fingerprint(n), n * 3);
        assert_eq!(cache.peek(&fingerprint(n)), Some(n * 3));
        assert_eq!(cache.get(&fingerprint(n)), Some(n * 3));
    }
    assert_eq!(cache.len(), cache.entries_limit());
    assert_eq!(cache.get(&fingerprint(u64::MAX)), None);
}

/// Goal: remove deletes exactly one entry and reports its value once.
pub(crate) fn remove_deletes<C: EntryCache>(mut cache: C) {
    let count = cache.entries_limit().min(8) as u64;
    for n in 0..count {
        cache.insert(&fingerprint(n), n);
    }
    assert_eq!(cache.remove(&fingerprint(0)), Some(0));
    assert_eq!(cache.remove(&fingerprint(0)), None);
    assert_eq!(cache.get(&fingerprint(0)), None);
    assert_eq!(cache.len(), count as usize - 1);
    for n in 1..count {
        assert_eq!(cache.peek(&fingerprint(n)), Some(n));
    }
    cache.clear();
    assert!(cache.is_empty());
    assert_eq!(cache.peek(&fingerprint(1)), None);
}

/// Goal: inserting an existing fingerprint replaces its value without adding an entry, and a
/// prefetch of a cached entry only replaces the value.
pub(crate) fn update_replaces<C: EntryCache>(mut cache: C) {
    cache.insert(&fingerprint(1), 10);
    cache.insert(&fingerprint(1), 11);
    assert_eq!(cache.len(), 1);
    assert_eq!(cache.get(&fingerprint(1)), Some(11));
    cache.prefetch(&fingerprint(1), 12);
    assert_eq!(cache.len(), 1);
    assert_eq!(cache.peek(&fingerprint(1)), Some(12));
    cache.prefetch(&fingerprint(2), 20);
    assert_eq!(cache.get(&fingerprint(2)), Some(20));
}

/// Goal: under a random mix of every operation the cache never exceeds its limit or its
/// memory, and never returns a stale or foreign value. Method: a map of the last value
/// inserted for each fingerprint; a cached value must equal it.
pub(crate) fn random_operations_respect_limits<C: EntryCache>(mut cache: C, memory_bytes: usize) {
    let mut truth: HashMap<u64, u64> = HashMap::new();
    let keys = cache.entries_limit() as u64 * 3 + 5;
    let mut state = 0x1234_5678u64;
    for step in 0..20_000u64 {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        // Skewed keys: a hot quarter gets most accesses, so every policy sees hits and misses.
        let key = if state >> 62 == 0 {
            (state >> 20) % keys
        } else {
            (state >> 20) % (keys / 4 + 1)
        };
        let fp = fingerprint(key);
        match (state >> 8) % 8 {
            0..=2 => {
                if let Some(value) = cache.get(&fp) {
                    assert_eq!(Some(&value), truth.get(&key), "stale value at step {step}");
                }
            }
            3..=4 => {
                cache.insert(&fp, step);
                truth.insert(key, step);
            }
            5 => {
                if let Some(&value) = truth.get(&key) {
                    cache.prefetch(&fp, value);
                }
            }
            6 => {
                if let Some(value) = cache.remove(&fp) {
                    assert_eq!(Some(&value), truth.get(&key));
                }
                truth.remove(&key);
            }
            _ => {
                if let Some(value) = cache.peek(&fp) {
                    assert_eq!(Some(&value), truth.get(&key));
                }
            }
        }
        assert!(cache.len() <= cache.entries_limit());
        assert_eq!(cache.memory_bytes(), memory_bytes);
    }
}

macro_rules! cache_conformance {
    ($name:ident, $make:expr) => {
        mod $name {
            use super::*;
            use $crate::index::cache::conformance as suite;

            fn make(entries: usize) -> impl $crate::index::cache::EntryCache {
                #[allow(clippy::redundant_closure_call)]
                ($make)(entries)
            }

            /// Goal: see [`suite::get_after_insert`].
            #[test]
            fn get_after_insert() {
                suite::get_after_insert(make(64));
                suite::get_after_insert(make(1));
            }

            /// Goal: see [`suite::remove_deletes`].
            #[test]
            fn remove_deletes() {
                suite::remove_deletes(make(16));
                suite::remove_deletes(make(2));
            }

            /// Goal: see [`suite::update_replaces`].
            #[test]
            fn update_replaces() {
                suite::update_replaces(make(4));
            }

            /// Goal: see [`suite::random_operations_respect_limits`].
            #[test]
            fn random_operations_respect_limits() {
                for entries in [1, 2, 7, 100] {
                    let cache = make(entries);
                    let memory = $crate::index::cache::EntryCache::memory_bytes(&cache);
                    suite::random_operations_respect_limits(cache, memory);
                }
            }
        }
    };
}
pub(crate) use cache_conformance;

mod joined {
    use crate::index::cache::{ArcCache, Cache, CachePolicy, EntryCache, LfuCache, LruCache};

    super::cache_conformance!(lru, LruCache::new);
    super::cache_conformance!(arc, ArcCache::new);
    super::cache_conformance!(lfu, LfuCache::new);
    super::cache_conformance!(dispatched, |entries| Cache::with_entries(
        CachePolicy::Arc,
        entries
    ));

    /// A key that is not a fingerprint: a number, as a cache of other content might use.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    struct NumberKey(u64);

    impl crate::index::cache::CacheKey for NumberKey {
        fn prefix_u64(&self) -> u64 {
            super::fingerprint(self.0).prefix_u64()
        }
    }

    /// Goal: every policy serves keys other than fingerprints, in the memory of that key type.
    /// Method: fill a cache keyed by numbers past its limit, then read and remove the newest.
    #[test]
    fn policies_take_other_keys() {
        for policy in CachePolicy::ALL {
            let budget = 1u64 << 16;
            let mut cache: Cache<NumberKey> = Cache::new(policy, budget).unwrap();
            assert!(cache.memory_bytes() as u64 <= budget, "{policy}");
            assert!(
                policy.memory_bytes_with_keys::<NumberKey>(100) < policy.memory_bytes_for(100),
                "{policy}: an 8-byte key takes less than a 32-byte fingerprint"
            );
            let limit = cache.entries_limit() as u64;
            for n in 0..2 * limit {
                cache.insert(&NumberKey(n), n * 5);
            }
            assert_eq!(cache.len() as u64, limit, "{policy}");
            let newest = NumberKey(2 * limit - 1);
            assert_eq!(cache.get(&newest), Some((2 * limit - 1) * 5), "{policy}");
            assert_eq!(cache.remove(&newest), Some((2 * limit - 1) * 5), "{policy}");
            assert_eq!(cache.peek(&newest), None, "{policy}");
        }
    }

    /// Goal: a cache built from a byte budget never holds more memory than the budget, and the
    /// budget is used well (one more entry would not fit). Method: many budgets, every policy.
    #[test]
    fn budgets_are_hard_limits() {
        for policy in CachePolicy::ALL {
            for budget in [600u64, 4096, 100_000, 1 << 20, 3 << 20] {
                let cache: Cache = Cache::new(policy, budget).unwrap();
                assert!(cache.memory_bytes() as u64 <= budget, "{policy} {budget}");
                let entries = cache.entries_limit();
                assert!(policy.memory_bytes_for(entries + 1) as u64 > budget);
                assert_eq!(cache.memory_bytes(), policy.memory_bytes_for(entries));
            }
            assert!(Cache::<crate::fingerprint::Fingerprint>::new(policy, 16).is_err());
        }
        assert_eq!("LFU".parse::<CachePolicy>().unwrap(), CachePolicy::Lfu);
        assert!("mru".parse::<CachePolicy>().is_err());
    }
}
