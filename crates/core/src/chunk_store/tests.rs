//! Chunk store tests: deduplication, reference counting, weak fingerprints, compaction.

use std::sync::Arc;

use super::*;
use crate::container::{ContainerOptions, ContainerStore};
use crate::gc::{execute_compaction, plan_compaction, CompactionOptions};
use crate::pages::PageStoreOptions;
use crate::storage::{CrashMode, SimulatedStorage, Storage};

struct Fixture {
    pages: PageStore,
    store: ChunkStore,
}

fn fixture(algorithm: FingerprintAlgorithm) -> Fixture {
    let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
    let (mut pages, _) =
        PageStore::open(storage.clone(), "meta", PageStoreOptions::default()).unwrap();
    let containers = Arc::new(
        ContainerStore::new(
            storage,
            "containers",
            ContainerOptions {
                container_bytes: 64 << 10,
                compression_level: None,
            },
        )
        .unwrap(),
    );
    let options = ChunkStoreOptions {
        fingerprint: algorithm,
        index: Default::default(),
    };
    let store =
        ChunkStore::open(&mut pages, containers, ChunkStoreState::default(), options).unwrap();
    Fixture { pages, store }
}

fn block(seed: u8) -> Vec<u8> {
    (0..4096u32)
        .map(|i| (i as u8).wrapping_mul(seed | 1) ^ seed)
        .collect()
}

impl Fixture {
    fn store_block(&mut self, data: &[u8]) -> StoreOutcome {
        let fingerprint = self.store.options().fingerprint.hash(data);
        self.store_with_fingerprint(data, &fingerprint)
    }

    fn store_with_fingerprint(&mut self, data: &[u8], fingerprint: &Fingerprint) -> StoreOutcome {
        let fingerprint = *fingerprint;
        let mut changes = Vec::new();
        self.store
            .store(
                &mut self.pages,
                NewChunk {
                    data,
                    fingerprint: Some(&fingerprint),
                    checksum: None,
                },
                0,
                0,
                &mut changes,
            )
            .unwrap()
    }

    fn read(&mut self, id: ChunkId) -> Vec<u8> {
        let mut out = vec![0u8; 4096];
        self.store.read_into(&mut self.pages, id, &mut out).unwrap();
        out
    }

    fn chain(&mut self, fingerprint: &Fingerprint) -> Vec<ChunkId> {
        self.store.chain(&mut self.pages, fingerprint).unwrap()
    }

    fn release(&mut self, id: ChunkId) {
        self.store
            .release(&mut self.pages, id, &mut Vec::new())
            .unwrap();
    }
}

/// Goal: identical blocks share one chunk, reference counts follow, freed ids are reused.
#[test]
fn dedup_reference_count_and_reuse() {
    let mut f = fixture(FingerprintAlgorithm::Blake3);
    let first = f.store_block(&block(1));
    let again = f.store_block(&block(1));
    let other = f.store_block(&block(2));
    assert!(!first.deduplicated && again.deduplicated && !other.deduplicated);
    assert_eq!(first.id, again.id);
    assert_eq!(
        f.store.record(&mut f.pages, first.id).unwrap().references,
        2
    );
    assert_eq!(f.read(first.id), block(1));
    assert_eq!(f.store.state().live_chunks, 2);

    f.release(first.id);
    assert_eq!(f.store.state().live_chunks, 2);
    f.release(first.id);
    assert_eq!(f.store.state().live_chunks, 1);
    assert!(!f.store.record(&mut f.pages, first.id).unwrap().in_use);
    // The freed id is handed out again, and the index no longer knows the old content.
    let third = f.store_block(&block(3));
    assert_eq!(third.id, first.id);
    let back = f.store_block(&block(1));
    assert!(!back.deduplicated);
    assert_eq!(f.read(third.id), block(3));
    assert_eq!(f.read(back.id), block(1));
}

/// Goal: with a weak fingerprint, a match is confirmed byte by byte, and different bytes that
/// share a fingerprint are all stored, indexed along one chain, and each later duplicate finds
/// its own chunk. Method: force collisions by storing three blocks under one fingerprint.
#[test]
fn weak_fingerprint_collisions_are_chained_and_deduplicated() {
    let mut f = fixture(FingerprintAlgorithm::Crc32c);
    let shared = FingerprintAlgorithm::Crc32c.hash(&block(1));
    let a = f.store_with_fingerprint(&block(1), &shared);
    let b = f.store_with_fingerprint(&block(2), &shared);
    let c = f.store_with_fingerprint(&block(3), &shared);
    assert!(!a.deduplicated && !b.deduplicated && !c.deduplicated);
    assert_eq!(f.chain(&shared), vec![c.id, b.id, a.id], "newest first");
    for (seed, first) in [(1, a), (2, b), (3, c)] {
        let again = f.store_with_fingerprint(&block(seed), &shared);
        assert!(again.deduplicated, "block {seed} finds its own chunk");
        assert_eq!(again.id, first.id);
        assert_eq!(f.read(first.id), block(seed));
    }
    // a was compared with c and b before it matched: 2 collisions; b with c: 1.
    assert_eq!(f.store.counters().weak_collisions, 3 + 3);
    assert_eq!(f.store.index().len(), 1, "one index entry for the chain");

    // Freeing a middle member, then the head, unlinks them; the rest still deduplicate.
    f.release(b.id);
    f.release(b.id);
    assert_eq!(f.chain(&shared), vec![c.id, a.id]);
    f.release(c.id);
    f.release(c.id);
    assert_eq!(f.chain(&shared), vec![a.id]);
    assert!(f.store_with_fingerprint(&block(1), &shared).deduplicated);
    let b_again = f.store_with_fingerprint(&block(2), &shared);
    assert!(!b_again.deduplicated, "freed bytes are stored again");
    assert_eq!(f.chain(&shared), vec![b_again.id, a.id]);
    assert_eq!(f.read(b_again.id), block(2));
    f.release(a.id);
    f.release(a.id);
    f.release(a.id);
    f.release(b_again.id);
    assert!(f.chain(&shared).is_empty());
    assert!(
        f.store.index().is_empty(),
        "the last member takes the entry with it"
    );
}

/// Goal: journal replay builds exactly the chains the live path built, and a rebuild of the
/// index relinks the same members. Method: record every change of a run with collisions and
/// frees, apply them to a new store, compare every record and chain; then rebuild the index.
#[test]
fn weak_fingerprint_chains_survive_replay_and_rebuild() {
    let mut live = fixture(FingerprintAlgorithm::Crc32c);
    let shared = FingerprintAlgorithm::Crc32c.hash(&block(1));
    let mut changes = Vec::new();
    let mut ids = Vec::new();
    for seed in [1u8, 2, 3, 4, 2, 5, 1] {
        let outcome = live
            .store
            .store(
                &mut live.pages,
                NewChunk {
                    data: &block(seed),
                    fingerprint: Some(&shared),
                    checksum: None,
                },
                0,
                0,
                &mut changes,
            )
            .unwrap();
        ids.push(outcome.id);
    }
    // Free block 3 (a middle member) and block 5 (the head).
    for id in [ids[2], ids[5]] {
        live.store
            .release(&mut live.pages, id, &mut changes)
            .unwrap();
    }
    let expected = live.chain(&shared);
    assert_eq!(expected, vec![ids[3], ids[1], ids[0]]);

    let mut replayed = fixture(FingerprintAlgorithm::Crc32c);
    for change in &changes {
        replayed.store.apply(&mut replayed.pages, change).unwrap();
    }
    assert_eq!(replayed.chain(&shared), expected);
    for id in 1..live.store.state().chunk_id_next {
        assert_eq!(
            replayed.store.record(&mut replayed.pages, id).unwrap(),
            live.store.record(&mut live.pages, id).unwrap(),
            "record {id}"
        );
    }

    live.store.rebuild_index_only(&mut live.pages).unwrap();
    let mut rebuilt = live.chain(&shared);
    rebuilt.sort_unstable();
    let mut members = expected.clone();
    members.sort_unstable();
    assert_eq!(rebuilt, members);
}

/// Goal: a store compares at most CHAIN_COMPARISONS_MAX members, so crafted collisions cannot
/// make every write walk a long chain; a chunk past the limit is stored unindexed and reads
/// back. Method: one more distinct block than the limit under one fingerprint.
#[test]
fn weak_fingerprint_chains_are_bounded() {
    let mut f = fixture(FingerprintAlgorithm::Crc32c);
    let shared = FingerprintAlgorithm::Crc32c.hash(&block(1));
    let mut last = None;
    for seed in 0..=CHAIN_COMPARISONS_MAX as u8 {
        last = Some(f.store_with_fingerprint(&block(seed + 1), &shared));
    }
    let last = last.unwrap();
    assert_eq!(f.chain(&shared).len(), CHAIN_COMPARISONS_MAX);
    assert_eq!(f.store.counters().chain_limit_copies, 1);
    assert!(!f.store.record(&mut f.pages, last.id).unwrap().indexed);
    assert_eq!(f.read(last.id), block(CHAIN_COMPARISONS_MAX as u8 + 1));
}

/// Goal: the index compares only the first 16 bytes of fingerprints, so a hit is confirmed
/// against the whole fingerprint in the chunk's record; a fingerprint that shares the key but
/// not the rest is stored as a new chunk, never deduplicated against the other one. Method:
/// store a block under a fingerprint forged to share another chunk's key.
#[test]
fn index_key_collisions_are_not_deduplicated() {
    let mut f = fixture(FingerprintAlgorithm::Blake3);
    let a = f.store_block(&block(1));
    let mut forged = FingerprintAlgorithm::Blake3.hash(&block(1));
    forged.0[31] ^= 1;
    let b = f.store_with_fingerprint(&block(2), &forged);
    assert!(!b.deduplicated);
    assert_ne!(a.id, b.id);
    assert_eq!(f.read(a.id), block(1));
    assert_eq!(f.read(b.id), block(2));
    assert_eq!(f.store.counters().index_key_collisions, 1);
    // The first chunk keeps its entry: its own content still deduplicates against it.
    assert_eq!(f.store_block(&block(1)).id, a.id);
}

/// Goal: compaction moves live chunks out of mostly-dead containers, keeps every chunk
/// readable under its id, and retired containers disappear after removal.
#[test]
fn compaction_preserves_data_and_reclaims_space() {
    let mut f = fixture(FingerprintAlgorithm::Blake3);
    let ids: Vec<ChunkId> = (0..60u8)
        .map(|seed| f.store_block(&block(seed)).id)
        .collect();
    // Free three quarters of the chunks.
    for (index, &id) in ids.iter().enumerate() {
        if index % 4 != 0 {
            f.release(id);
        }
    }
    f.store
        .seal_open_container(&mut f.pages, &mut Vec::new())
        .unwrap();
    let plan = plan_compaction(&f.store, &mut f.pages, &CompactionOptions::default()).unwrap();
    assert!(!plan.containers.is_empty());
    assert!(plan.reclaim_bytes > plan.copy_bytes);
    let report = execute_compaction(&mut f.store, &mut f.pages, &plan, &mut Vec::new()).unwrap();
    assert_eq!(report.containers_retired as usize, plan.containers.len());
    for (index, &id) in ids.iter().enumerate() {
        if index % 4 == 0 {
            assert_eq!(f.read(id), block(index as u8));
        }
    }
    let before = f.store.containers().list().unwrap().len();
    // Retired containers stay one checkpoint longer, for a fallback's replay.
    assert_eq!(f.store.remove_retired_containers(&mut f.pages).unwrap(), 0);
    assert_eq!(f.store.containers().list().unwrap().len(), before);
    let removed = f.store.remove_retired_containers(&mut f.pages).unwrap();
    assert_eq!(removed as usize, plan.containers.len());
    assert_eq!(
        f.store.containers().list().unwrap().len(),
        before - removed as usize
    );
    for (index, &id) in ids.iter().enumerate() {
        if index % 4 == 0 {
            assert_eq!(f.read(id), block(index as u8));
        }
    }
}

/// Goal: every change survives its journal encoding unchanged.
#[test]
fn changes_round_trip() {
    let location = ChunkLocation {
        container: 9,
        offset: 112,
        stored_bytes: 4096,
        raw_bytes: 4096,
        flags: 0,
        checksum: 77,
    };
    let changes = [
        ChunkChange::Stored {
            id: 5,
            fingerprint: Some(FingerprintAlgorithm::Blake3.hash(b"x")),
            owner: 1,
            written_at: 2,
            location,
        },
        ChunkChange::Stored {
            id: 6,
            fingerprint: None,
            owner: 3,
            written_at: 4,
            location,
        },
        ChunkChange::Referenced { id: 1 },
        ChunkChange::Released { id: 2 },
        ChunkChange::ReferencesSet {
            id: 3,
            references: 9,
        },
        ChunkChange::Relocated { id: 4, location },
        ChunkChange::Indexed {
            id: 8,
            fingerprint: FingerprintAlgorithm::Sha256.hash(b"y"),
        },
        ChunkChange::ContainerOpened {
            id: 3,
            created_at: 10,
        },
        ChunkChange::ContainerSealed { id: 3, bytes: 1000 },
        ChunkChange::ContainerRetired { id: 2 },
    ];
    let mut bytes = Vec::new();
    for change in &changes {
        change.encode(&mut bytes);
    }
    let mut reader = crate::bytes::ByteReader::new(&bytes);
    for change in &changes {
        assert_eq!(&ChunkChange::decode(&mut reader).unwrap(), change);
    }
    assert!(reader.is_empty());
    assert!(ChunkChange::decode(&mut crate::bytes::ByteReader::new(&[77])).is_err());
}

/// Goal: replay treats a seal whose trailer did not reach the media as not durable, and a
/// synced one as durable (with write-behind, a seal is synced only by the next
/// `sync_data`). Method: store until a container is sealed, then crash cleanly with only
/// the container's name made durable, and again after `sync_data`.
#[test]
fn seals_are_durable_only_after_the_deferred_sync() {
    let storage = SimulatedStorage::new();
    let shared: Arc<dyn Storage> = Arc::new(storage.clone());
    let (mut pages, _) =
        PageStore::open(shared.clone(), "meta", PageStoreOptions::default()).unwrap();
    let options = ContainerOptions {
        container_bytes: 64 << 10,
        compression_level: None,
    };
    let containers =
        Arc::new(ContainerStore::with_write_behind(shared, "containers", options).unwrap());
    let chunk_options = ChunkStoreOptions {
        fingerprint: FingerprintAlgorithm::Blake3,
        index: Default::default(),
    };
    let mut store = ChunkStore::open(
        &mut pages,
        Arc::clone(&containers),
        ChunkStoreState::default(),
        chunk_options.clone(),
    )
    .unwrap();
    let mut changes = Vec::new();
    let mut seed = 0u8;
    let sealed = loop {
        let data = block(seed);
        let fingerprint = FingerprintAlgorithm::Blake3.hash(&data);
        let chunk = NewChunk {
            data: &data,
            fingerprint: Some(&fingerprint),
            checksum: None,
        };
        store.store(&mut pages, chunk, 0, 0, &mut changes).unwrap();
        seed += 1;
        if let Some(sealed) = changes
            .iter()
            .find(|change| matches!(change, ChunkChange::ContainerSealed { .. }))
        {
            break *sealed;
        }
    };
    containers.write_behind().unwrap().run().unwrap();
    let reopened = |storage: SimulatedStorage| {
        let storage: Arc<dyn Storage> = Arc::new(storage);
        let (mut pages, _) =
            PageStore::open(storage.clone(), "meta", PageStoreOptions::default()).unwrap();
        let containers = Arc::new(ContainerStore::new(storage, "containers", options).unwrap());
        ChunkStore::open(
            &mut pages,
            containers,
            ChunkStoreState::default(),
            chunk_options.clone(),
        )
        .unwrap()
    };
    // The name is durable, the trailer is not.
    storage.sync_directory("containers/01").unwrap();
    let torn = reopened(storage.crash(CrashMode::Clean));
    assert!(!torn.stored_data_is_durable(&sealed).unwrap());

    store.sync_data().unwrap();
    let synced = reopened(storage.crash(CrashMode::Clean));
    assert!(synced.stored_data_is_durable(&sealed).unwrap());
}
