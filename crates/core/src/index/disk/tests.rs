use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::index::cache::conformance::fingerprint;
use crate::pages::PageStoreOptions;
use crate::storage::{SimulatedStorage, Storage};

fn open_pages(storage: &Arc<dyn Storage>, cache_pages: usize) -> PageStore {
    PageStore::open(storage.clone(), "meta", PageStoreOptions { cache_pages })
        .unwrap()
        .0
}

fn new_index() -> (Arc<dyn Storage>, PageStore, DiskIndex) {
    let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
    let mut pages = open_pages(&storage, 64);
    let index = DiskIndex::open(&mut pages, "fp", DiskIndexLimits::default()).unwrap();
    (storage, pages, index)
}

/// Goal: inserts, replacements, lookups and removals behave as a map, across many splits,
/// and the structure verifies. Method: 20,000 entries (about 200 buckets).
#[test]
fn behaves_as_a_map_across_splits() {
    let (_storage, mut pages, mut index) = new_index();
    for n in 0..20_000 {
        assert_eq!(index.insert(&mut pages, &fingerprint(n), n).unwrap(), None);
    }
    assert_eq!(index.len(), 20_000);
    assert!(index.global_depth() >= 7, "depth {}", index.global_depth());
    assert_eq!(
        index.insert(&mut pages, &fingerprint(5), 55).unwrap(),
        Some(5)
    );
    assert_eq!(index.lookup(&mut pages, &fingerprint(5)).unwrap(), Some(55));
    assert_eq!(index.remove(&mut pages, &fingerprint(6)).unwrap(), Some(6));
    assert_eq!(index.remove(&mut pages, &fingerprint(6)).unwrap(), None);
    assert_eq!(index.lookup(&mut pages, &fingerprint(6)).unwrap(), None);
    assert_eq!(index.lookup(&mut pages, &fingerprint(7)).unwrap(), Some(7));
    assert_eq!(index.verify(&mut pages).unwrap(), 19_999);
    let mut seen = BTreeMap::new();
    index
        .for_each_entry(&mut pages, |key, value| {
            seen.insert(*key, value);
        })
        .unwrap();
    assert_eq!(seen.len(), 19_999);
    assert_eq!(seen[&IndexKey::of(&fingerprint(5))], 55);
    let expected_pages = 20_000 / BUCKET_ENTRIES as u64;
    assert!(index.bucket_pages() >= expected_pages && index.bucket_pages() <= expected_pages * 2);
}

/// Goal: appending keys known to be absent builds the same map as searching inserts, across
/// splits. Method: 20,000 entries appended, then every lookup, a verify, and
/// a searching insert that replaces one of them.
#[test]
fn appending_absent_keys_equals_searching_inserts() {
    {
        let (_storage, mut pages, mut index) = new_index();
        for n in 0..20_000 {
            index.insert_absent(&mut pages, &fingerprint(n), n).unwrap();
        }
        assert_eq!(index.len(), 20_000);
        for n in 0..20_000 {
            assert_eq!(index.lookup(&mut pages, &fingerprint(n)).unwrap(), Some(n));
        }
        assert_eq!(
            index.lookup(&mut pages, &fingerprint(20_000)).unwrap(),
            None
        );
        assert_eq!(index.verify(&mut pages).unwrap(), 20_000);
        assert_eq!(
            index.insert(&mut pages, &fingerprint(9), 99).unwrap(),
            Some(9)
        );
        assert_eq!(index.len(), 20_000);
    }
}

/// Goal: every lookup, hit or miss, reads exactly one page. Method: the index's counter of
/// bucket page reads, checked around each of 10,000 lookups on a 50,000-entry index.
#[test]
fn one_page_read_per_lookup() {
    let (_storage, mut pages, mut index) = new_index();
    for n in 0..50_000 {
        index.insert(&mut pages, &fingerprint(n), n).unwrap();
    }
    for n in (0..100_000).step_by(10) {
        let before = index.bucket_page_reads();
        let found = index.lookup(&mut pages, &fingerprint(n)).unwrap();
        assert_eq!(found, (n < 50_000).then_some(n));
        assert_eq!(index.bucket_page_reads() - before, 1);
    }
}

/// Goal: a full bucket at the depth limit is a typed error, not a panic or a corrupt index.
/// Method: a depth limit of 2 (at most 4 buckets) and more entries than they hold.
#[test]
fn depth_limit_is_a_typed_error() {
    let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
    let mut pages = open_pages(&storage, 64);
    let limits = DiskIndexLimits {
        global_depth_max: 2,
    };
    let mut index = DiskIndex::open(&mut pages, "fp", limits).unwrap();
    let mut stored = 0;
    let error = (0..1_000)
        .find_map(|n| match index.insert(&mut pages, &fingerprint(n), n) {
            Ok(_) => {
                stored += 1;
                None
            }
            Err(error) => Some(error),
        })
        .expect("the limit is reached");
    assert!(matches!(error, Error::Limit(_)), "{error}");
    let entries = BUCKET_ENTRIES as u64;
    assert!(stored <= 4 * entries && stored > entries);
    assert_eq!(index.verify(&mut pages).unwrap(), stored);
    for n in 0..stored {
        assert_eq!(index.lookup(&mut pages, &fingerprint(n)).unwrap(), Some(n));
    }
}

/// Goal: a damaged bucket page (the index is derived data) is reset to an empty bucket
/// serving the same hashes: its entries miss, the rest of the index keeps working, and
/// inserts into it work again. Method: fill several buckets, break one bucket's marker
/// through the page store, then look up every entry and insert again.
#[test]
fn damaged_buckets_are_reset() {
    let (_storage, mut pages, mut index) = new_index();
    let count = 3 * BUCKET_ENTRIES as u64;
    for n in 0..count {
        index.insert(&mut pages, &fingerprint(n), n).unwrap();
    }
    let area = pages.area("fp.buckets");
    pages.write(area, 0).unwrap()[1] = 0;
    let found = (0..count)
        .filter(|&n| index.lookup(&mut pages, &fingerprint(n)).unwrap() == Some(n))
        .count() as u64;
    assert!(found > 0 && found < count, "{found} of {count} found");
    assert_eq!(index.damaged_buckets_reset(), 1);
    for n in 0..count {
        index.insert(&mut pages, &fingerprint(n), n).unwrap();
        assert_eq!(index.lookup(&mut pages, &fingerprint(n)).unwrap(), Some(n));
    }
}

#[derive(Debug, Clone)]
enum Operation {
    Insert(u64, u64),
    Remove(u64),
    Lookup(u64),
    CheckpointAndReopen,
    Reopen,
}

fn operation() -> impl Strategy<Value = Operation> {
    // Keys from a space large enough to split buckets many times, small enough to repeat.
    let key = 0..3_000u64;
    prop_oneof![
        8 => (key.clone(), any::<u64>()).prop_map(|(k, v)| Operation::Insert(k, v)),
        3 => key.clone().prop_map(Operation::Remove),
        3 => key.prop_map(Operation::Lookup),
        1 => Just(Operation::CheckpointAndReopen),
        1 => Just(Operation::Reopen),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Goal: the index matches a BTreeMap under random operations, and reopening yields the
    /// state of the last checkpoint. Method: a model per checkpoint; `Reopen` without a
    /// checkpoint drops the page store and must bring back the last checkpointed model.
    #[test]
    fn matches_a_model_through_reopens(operations in prop::collection::vec(operation(), 1..1_500)) {
        let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
        let mut pages = open_pages(&storage, 8);
        let mut index = DiskIndex::open(&mut pages, "fp", DiskIndexLimits::default()).unwrap();
        let mut model: BTreeMap<u64, u64> = BTreeMap::new();
        let mut checkpointed = model.clone();
        for operation in operations {
            match operation {
                Operation::Insert(key, value) => {
                    let previous = index.insert(&mut pages, &fingerprint(key), value).unwrap();
                    prop_assert_eq!(previous, model.insert(key, value));
                }
                Operation::Remove(key) => {
                    let removed = index.remove(&mut pages, &fingerprint(key)).unwrap();
                    prop_assert_eq!(removed, model.remove(&key));
                }
                Operation::Lookup(key) => {
                    let found = index.lookup(&mut pages, &fingerprint(key)).unwrap();
                    prop_assert_eq!(found, model.get(&key).copied());
                }
                Operation::CheckpointAndReopen | Operation::Reopen => {
                    if matches!(operation, Operation::CheckpointAndReopen) {
                        pages.checkpoint(b"").unwrap();
                        checkpointed = model.clone();
                    }
                    drop(index);
                    pages = open_pages(&storage, 8);
                    index = DiskIndex::open(&mut pages, "fp", DiskIndexLimits::default()).unwrap();
                    model = checkpointed.clone();
                    prop_assert_eq!(index.verify(&mut pages).unwrap(), model.len() as u64);
                }
            }
            prop_assert_eq!(index.len(), model.len() as u64);
        }
        prop_assert_eq!(index.verify(&mut pages).unwrap(), model.len() as u64);
        for (&key, &value) in &model {
            prop_assert_eq!(index.lookup(&mut pages, &fingerprint(key)).unwrap(), Some(value));
        }
    }
}

/// Goal: entries are keyed by the first 16 bytes of a fingerprint: a fingerprint that differs
/// only after them finds, replaces and removes the same entry. Method: two such fingerprints.
#[test]
fn entries_are_keyed_by_the_first_16_bytes() {
    let (_storage, mut pages, mut index) = new_index();
    let first = fingerprint(1);
    let mut second = first;
    second.0[KEY_BYTES..].copy_from_slice(&fingerprint(2).0[KEY_BYTES..]);
    assert_ne!(first, second);
    assert_eq!(IndexKey::of(&first), IndexKey::of(&second));
    assert_eq!(index.insert(&mut pages, &first, 1).unwrap(), None);
    assert_eq!(index.lookup(&mut pages, &second).unwrap(), Some(1));
    assert_eq!(index.insert(&mut pages, &second, 2).unwrap(), Some(1));
    assert_eq!(index.len(), 1);
    assert_eq!(
        index.remove_key(&mut pages, &IndexKey::of(&first)).unwrap(),
        Some(2)
    );
    assert!(index.is_empty());
}

/// Goal: a directory whose magic is not `OCINDEX2` (here `OCINDEX1`, a format that was
/// never released) is refused as corruption, not read in another layout. Method: rewrite the
/// magic of a checkpointed index, then reopen it.
#[test]
fn unknown_directory_magic_is_corrupt() {
    let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
    let mut pages = open_pages(&storage, 64);
    let limits = DiskIndexLimits::default();
    let mut index = DiskIndex::open(&mut pages, "fp", limits).unwrap();
    for n in 0..1_000 {
        index.insert(&mut pages, &fingerprint(n), n).unwrap();
    }
    drop(index);
    let directory = pages.area("fp.directory");
    pages.write(directory, 0).unwrap()[..8].copy_from_slice(b"OCINDEX1");
    pages.checkpoint(b"").unwrap();
    let mut pages = open_pages(&storage, 64);
    let error = DiskIndex::open(&mut pages, "fp", limits).unwrap_err();
    assert!(error.is_corrupt(), "{error}");
}
