//! Page store tests: checkpoints, crashes, damage, the cache and the record areas.

use super::*;
use crate::storage::{CrashMode, SimulatedStorage, Storage};
use std::collections::BTreeMap;
use std::sync::Arc;

fn fill(pages: &mut PageStore, area: AreaId, page: u64, byte: u8) {
    pages.write(area, page).unwrap().fill(byte);
}

/// Goal: pages round-trip through checkpoints and reopening; unwritten pages read as zero.
#[test]
fn checkpoint_and_reopen() {
    let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
    let options = PageStoreOptions { cache_pages: 2 };
    let (mut pages, state) = PageStore::open(storage.clone(), "meta", options).unwrap();
    assert!(state.is_empty());
    let maps = pages.area("maps");
    let other = pages.area("other");
    for page in 0..10 {
        fill(&mut pages, maps, page, page as u8 + 1);
    }
    fill(&mut pages, other, 3, 0xee);
    pages.checkpoint(b"state one").unwrap();
    fill(&mut pages, maps, 2, 0x77);
    pages.checkpoint(b"state two").unwrap();

    let (mut reopened, state) = PageStore::open(storage, "meta", options).unwrap();
    assert_eq!(state, b"state two");
    let maps = reopened.area("maps");
    let other = reopened.area("other");
    assert_eq!(reopened.page_count(maps), 10);
    assert_eq!(reopened.read(maps, 2).unwrap()[0], 0x77);
    assert_eq!(reopened.read(maps, 9).unwrap()[100], 10);
    assert_eq!(reopened.read(other, 3).unwrap()[5], 0xee);
    assert_eq!(reopened.read(other, 0).unwrap()[5], 0);
    assert_eq!(reopened.read(maps, 1000).unwrap()[0], 0);
    // Rewriting page 2 freed its first slot; it is reused rather than growing the file.
    let (live, slots, free) = reopened.slot_usage();
    assert_eq!((live, slots, free), (11, 12, 1));
    assert_eq!(reopened.verify().unwrap(), (live, Vec::new()));
}

/// Goal: page loads read their checksums from the manifest in runs, whatever the areas'
/// offsets in it and their sizes: every page of two areas larger than a run (the second
/// starting at an offset no run boundary meets), read in order, backwards and interleaved
/// after a reopen and after another checkpoint, has its content.
#[test]
fn pages_of_large_areas_load_in_any_order() {
    let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
    let options = PageStoreOptions { cache_pages: 1 };
    let (mut pages, _) = PageStore::open(storage.clone(), "meta", options).unwrap();
    let name = pages.area("a name of odd length");
    let big = pages.area("big");
    fill(&mut pages, name, 0, 1);
    for page in 0..1300 {
        fill(&mut pages, big, page, (page % 251) as u8);
    }
    pages.checkpoint(b"").unwrap();
    let (mut reopened, _) = PageStore::open(storage, "meta", options).unwrap();
    let name = reopened.area("a name of odd length");
    let big = reopened.area("big");
    for round in 0..2 {
        let order: Vec<u64> = match round {
            0 => (0..1300).collect(),
            _ => (0..1300).rev().collect(),
        };
        for page in order {
            assert_eq!(
                reopened.read(big, page).unwrap()[7],
                (page % 251) as u8,
                "page {page}"
            );
            assert_eq!(reopened.read(name, 0).unwrap()[0], 1);
        }
        fill(&mut reopened, big, 700, 9);
        reopened.checkpoint(b"").unwrap();
        assert_eq!(reopened.read(big, 700).unwrap()[0], 9);
        fill(&mut reopened, big, 700, (700 % 251) as u8);
        reopened.checkpoint(b"").unwrap();
    }
}

/// Goal: a flipped bit in a stored page is reported as corruption, not returned as data.
#[test]
fn corrupt_pages_are_detected() {
    let storage = SimulatedStorage::new();
    let shared: Arc<dyn Storage> = Arc::new(storage.clone());
    let (mut pages, _) =
        PageStore::open(shared.clone(), "meta", PageStoreOptions::default()).unwrap();
    let area = pages.area("a");
    fill(&mut pages, area, 0, 1);
    pages.checkpoint(b"").unwrap();
    let file = shared.open("meta/pages", false).unwrap();
    file.write_at(17, &[0xff]).unwrap();
    let (mut reopened, _) = PageStore::open(shared, "meta", PageStoreOptions::default()).unwrap();
    let area = reopened.area("a");
    assert!(reopened.read(area, 0).unwrap_err().is_corrupt());
}

/// Goal: a scan reads pages without filling the clean cache, sees dirty content, and
/// still reports corruption.
#[test]
fn read_once_bypasses_the_cache() {
    let storage = SimulatedStorage::new();
    let shared: Arc<dyn Storage> = Arc::new(storage.clone());
    let (mut pages, _) =
        PageStore::open(shared.clone(), "meta", PageStoreOptions::default()).unwrap();
    let area = pages.area("a");
    for page in 0..3 {
        fill(&mut pages, area, page, (page as u8).wrapping_add(1));
    }
    pages.checkpoint(b"").unwrap();
    let (mut reopened, _) =
        PageStore::open(shared.clone(), "meta", PageStoreOptions::default()).unwrap();
    let area = reopened.area("a");
    fill(&mut reopened, area, 2, 0x77);
    let firsts: Vec<u8> = (0..3)
        .map(|page| {
            reopened
                .read_once(area, page, |content| content[0])
                .unwrap()
        })
        .collect();
    assert_eq!(firsts, [1, 2, 0x77]);
    assert_eq!(reopened.cached_page_count(), 0, "read_once cached a page");
    // A page already cached is served from the cache.
    assert_eq!(reopened.read(area, 1).unwrap()[0], 2);
    assert_eq!(
        reopened.read_once(area, 1, |content| content[0]).unwrap(),
        2
    );
    assert_eq!(reopened.cached_page_count(), 1);

    let file = shared.open("meta/pages", false).unwrap();
    file.write_at(17, &[0xff]).unwrap();
    let (mut corrupted, _) = PageStore::open(shared, "meta", PageStoreOptions::default()).unwrap();
    let area = corrupted.area("a");
    let failures = (0..3)
        .filter(|&page| corrupted.read_once(area, page, |_| ()).is_err())
        .count();
    assert_eq!(failures, 1, "the flipped byte is in exactly one page");
}

/// Goal: `resident` finds dirty and cached pages (and records in them) without loading a
/// page, and finds nothing else. Method: pages on disk, dirty and cached, looked up
/// through `resident` with the clean cache's size checked after each step.
#[test]
fn resident_finds_only_pages_in_memory() {
    let storage = SimulatedStorage::new();
    let shared: Arc<dyn Storage> = Arc::new(storage.clone());
    let (mut pages, _) =
        PageStore::open(shared.clone(), "meta", PageStoreOptions::default()).unwrap();
    let area = pages.area("a");
    for page in 0..4 {
        fill(&mut pages, area, page, (page as u8).wrapping_add(1));
    }
    pages.checkpoint(b"").unwrap();
    let options = PageStoreOptions { cache_pages: 2 };
    let (mut reopened, _) = PageStore::open(shared, "meta", options).unwrap();
    let area = reopened.area("a");
    assert!(reopened.resident(area, 0).is_none(), "not loaded yet");
    assert_eq!(reopened.cached_page_count(), 0, "resident loaded a page");
    fill(&mut reopened, area, 3, 0x33);
    assert_eq!(reopened.resident(area, 3).unwrap()[0], 0x33, "a dirty page");
    let records = RecordArea::new(area, 8);
    assert_eq!(records.resident(&reopened, 3 * 512).unwrap(), [0x33; 8]);
    assert!(records.resident(&reopened, 0).is_none());
    reopened.read(area, 0).unwrap();
    reopened.read(area, 1).unwrap();
    assert_eq!(reopened.resident(area, 0).unwrap()[0], 1, "a cached page");
    reopened.read(area, 2).unwrap();
    let cached = (0..3)
        .filter(|&page| reopened.resident(area, page).is_some())
        .count();
    assert_eq!(cached, 2, "an evicted page is not resident");
    assert_eq!(reopened.cached_page_count(), 2);
}

/// Goal: checksums held only in the durable manifest verify clean pages correctly across
/// many checkpoints, whether the page was rewritten, carried over unchanged, or its area
/// cleared; and free slots are reused lowest first, so the file does not grow without
/// bound. Method: a reference model of every page, read back through a one-page cache
/// (every read loads) after each checkpoint and after reopening.
#[test]
fn checksums_carried_over_checkpoints() {
    let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
    let options = PageStoreOptions { cache_pages: 1 };
    let (mut pages, _) = PageStore::open(storage.clone(), "meta", options).unwrap();
    let areas = [pages.area("a"), pages.area("b")];
    let mut model: BTreeMap<(usize, u64), u8> = BTreeMap::new();
    let mut seed = 7u64;
    for round in 0..40u64 {
        for _ in 0..5 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let area = areas[(seed >> 60) as usize % 2];
            let page = (seed >> 33) % 24;
            let byte = (seed >> 20) as u8 | 1;
            fill(&mut pages, area, page, byte);
            model.insert((area, page), byte);
        }
        if round % 13 == 12 {
            pages.clear_area(areas[1]).unwrap();
            model.retain(|&(area, _), _| area != areas[1]);
        }
        pages.checkpoint(&round.to_le_bytes()).unwrap();
        for (&(area, page), &byte) in &model {
            assert_eq!(pages.read(area, page).unwrap()[4095], byte, "round {round}");
        }
        let (live, slots, _) = pages.slot_usage();
        assert!(
            slots <= 2 * live + 10,
            "{slots} slots for {live} live pages"
        );
    }
    let (mut reopened, state) = PageStore::open(storage, "meta", options).unwrap();
    assert_eq!(state, 39u64.to_le_bytes());
    let areas = [reopened.area("a"), reopened.area("b")];
    for page in 0..24 {
        for area in areas {
            let expected = model.get(&(area, page)).copied().unwrap_or(0);
            assert_eq!(reopened.read(area, page).unwrap()[0], expected);
        }
    }
    let (live, _, _) = reopened.slot_usage();
    assert_eq!(reopened.verify().unwrap(), (live, Vec::new()));
}

/// Goal: a manifest that changes after it was verified (its entries no longer match the
/// page tables in memory) is never used: a small one is kept in memory as verified, so its
/// pages still load; a large one, read again for each load, is reported as corruption when
/// a page is loaded. Method: swap two entries of the durable manifest after open, once with
/// two pages and once with more pages than a kept manifest lists.
#[test]
fn manifest_changed_after_open_is_detected() {
    for page_count in [
        2,
        store::KEPT_MANIFEST_BYTES_MAX as u64 / manifest::MANIFEST_ENTRY_BYTES + 1,
    ] {
        manifest_changed_after_open(page_count);
    }
}

fn manifest_changed_after_open(page_count: u64) {
    let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
    let options = PageStoreOptions { cache_pages: 1 };
    let (mut pages, _) = PageStore::open(storage.clone(), "meta", options).unwrap();
    let area = pages.area("a");
    for page in 0..page_count {
        fill(&mut pages, area, page, (page as u8).wrapping_add(1));
    }
    pages.checkpoint(b"").unwrap();
    let (mut reopened, _) = PageStore::open(storage.clone(), "meta", options).unwrap();
    let area = reopened.area("a");
    // The first checkpoint went to manifest.1; swap the two entries' slots there.
    let manifest = storage.open("meta/manifest.1", false).unwrap();
    let at = reopened.manifest_entries_at(area);
    let mut entries = [0u8; 16];
    manifest.read_at(at, &mut entries).unwrap();
    let mut swapped = entries;
    swapped[..8].copy_from_slice(&entries[8..]);
    swapped[8..].copy_from_slice(&entries[..8]);
    manifest.write_at(at, &swapped).unwrap();
    if page_count * manifest::MANIFEST_ENTRY_BYTES <= store::KEPT_MANIFEST_BYTES_MAX as u64 {
        assert_eq!(reopened.read(area, 0).unwrap()[..], [1u8; PAGE_BYTES][..]);
        assert_eq!(reopened.read(area, 1).unwrap()[..], [2u8; PAGE_BYTES][..]);
    } else {
        assert!(reopened.read(area, 0).unwrap_err().is_corrupt());
        assert!(reopened.read(area, 1).unwrap_err().is_corrupt());
    }
}

/// Goal: after a crash at every sync point, with torn writes, reopening yields exactly the
/// last completed checkpoint. Method: a reference model of page contents per checkpoint.
#[test]
fn crash_at_every_sync_yields_last_checkpoint() {
    let rounds = 6u64;
    // Count the syncs of a full run first.
    let total_syncs = {
        let storage = SimulatedStorage::new();
        run_rounds(&storage, rounds, &mut Vec::new());
        storage.sync_count()
    };
    for crash_at in 1..=total_syncs {
        for seed in 0..3 {
            let storage = SimulatedStorage::new();
            storage.crash_after_syncs(crash_at);
            let mut completed = Vec::new();
            run_rounds(&storage, rounds, &mut completed);
            let after: Arc<dyn Storage> = Arc::new(storage.crash(CrashMode::Torn { seed }));
            let (mut pages, state) =
                PageStore::open(after, "meta", PageStoreOptions { cache_pages: 3 }).unwrap();
            let area = pages.area("a");
            // The durable state is one of the checkpoints that returned, or the one that
            // was in flight when the crash hit (its manifest may have become durable).
            let round = if state.is_empty() {
                0
            } else {
                u64::from_le_bytes(state[..8].try_into().unwrap())
            };
            assert!(round <= completed.len() as u64 + 1);
            let expected = model_after(round);
            for (page, byte) in expected {
                assert_eq!(
                    pages.read(area, page).unwrap()[0],
                    byte,
                    "crash at {crash_at}"
                );
                assert!(pages.read(area, page).unwrap().iter().all(|&b| b == byte));
            }
        }
    }
}

fn model_after(round: u64) -> BTreeMap<u64, u8> {
    let mut model = BTreeMap::new();
    for r in 1..=round {
        for page in (r % 3)..(r % 3 + 4) {
            model.insert(page, (r * 10 + page) as u8);
        }
    }
    model
}

fn run_rounds(storage: &SimulatedStorage, rounds: u64, completed: &mut Vec<u64>) {
    let shared: Arc<dyn Storage> = Arc::new(storage.clone());
    let Ok((mut pages, _)) = PageStore::open(shared, "meta", PageStoreOptions::default()) else {
        return;
    };
    let area = pages.area("a");
    for round in 1..=rounds {
        for page in (round % 3)..(round % 3 + 4) {
            match pages.write(area, page) {
                Ok(content) => content.fill((round * 10 + page) as u8),
                Err(_) => return,
            }
        }
        if pages.checkpoint(&round.to_le_bytes()).is_err() {
            return;
        }
        completed.push(round);
    }
}

/// Goal: a cleared area reads as zeros, survives reopen cleared, and its slots are reused
/// only after the checkpoint that dropped them.
#[test]
fn clear_area_frees_slots_after_checkpoint() {
    let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
    let (mut pages, _) =
        PageStore::open(storage.clone(), "m", PageStoreOptions::default()).unwrap();
    let doomed = pages.area("doomed");
    for page in 0..4 {
        fill(&mut pages, doomed, page, 9);
    }
    pages.checkpoint(b"").unwrap();
    pages.clear_area(doomed).unwrap();
    assert_eq!(pages.read(doomed, 2).unwrap()[0], 0);
    assert_eq!(pages.slot_usage(), (0, 4, 0));
    pages.checkpoint(b"").unwrap();
    assert_eq!(pages.slot_usage(), (0, 4, 4));
    let (mut reopened, _) = PageStore::open(storage, "m", PageStoreOptions::default()).unwrap();
    let doomed = reopened.area("doomed");
    assert_eq!(reopened.page_count(doomed), 0);
    assert_eq!(reopened.slot_usage(), (0, 4, 4));
}

/// Goal: record areas address records inside pages without overlap.
#[test]
fn record_area_addresses_records() {
    let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
    let (mut pages, _) = PageStore::open(storage, "m", PageStoreOptions::default()).unwrap();
    let records = RecordArea::new(pages.area("r"), 24);
    assert_eq!(records.records_per_page(), 170);
    for index in 0..1000u64 {
        records.get_mut(&mut pages, index).unwrap()[..8].copy_from_slice(&index.to_le_bytes());
    }
    for index in 0..1000u64 {
        let bytes = records.get(&mut pages, index).unwrap();
        assert_eq!(u64::from_le_bytes(bytes[..8].try_into().unwrap()), index);
    }
}
