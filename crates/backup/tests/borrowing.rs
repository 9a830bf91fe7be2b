//! Finer inline deduplication: a chunk of a new segment that an earlier new segment of the
//! same backup stores borrows that chunk instead of being stored again. The lender keeps a
//! borrowed chunk as long as the borrower does, through reverse deduplication, deletion and
//! compaction; a damaged lender makes its borrowers lost too.

mod common;

use std::sync::Arc;

use common::*;
use onecopy_backup::{BackupStore, CheckOptions, DedupMode, DeleteMethod, ExitStatus};
use onecopy_core::storage::{SimulatedStorage, Storage};

const REPAIR: CheckOptions = CheckOptions {
    read_data: true,
    repair: true,
};

fn random(seed: u64, bytes: usize) -> Vec<u8> {
    let mut data = vec![0u8; bytes];
    Random(seed).fill(&mut data);
    data
}

/// A stream that holds `repeated` twice, far apart (in other segments).
fn with_repeat(before: &[u8], repeated: &[u8], between: &[u8]) -> Vec<u8> {
    [before, repeated, between, repeated].concat()
}

fn store(storage: &Arc<dyn Storage>) -> BackupStore {
    open(Arc::clone(storage), DedupMode::Revdedup)
}

/// Goal: a repeat inside one backup is stored once and every version restores byte-exact
/// while the lender is settled (its borrower still live), the lender's backup deleted and
/// compacted, and the borrower's backup deleted too; checks stay clean. Method: v1 holds a
/// block twice; v2 changes the first copy (the lender) and keeps the second (the borrower's
/// segments are shared with v1); v3 is new data; delete v1, compact, delete v2.
#[test]
fn lent_chunks_live_as_long_as_their_borrowers() {
    let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
    let mut store = store(&storage);
    let (a, block, c) = (
        random(1, 200 << 10),
        random(2, 96 << 10),
        random(3, 200 << 10),
    );
    let first = with_repeat(&a, &block, &c);
    let report = create_report(&mut store, "s", &first, false);
    assert!(
        report.inline.borrowed_bytes > (64 << 10),
        "the repeat borrows its first copy: {:?}",
        report.inline
    );
    assert!(
        report.inline.new_raw_bytes + report.inline.borrowed_bytes
            <= first.len() as u64 - report.inline.zero_bytes,
        "{:?}",
        report.inline
    );
    assert_eq!(restore_bytes(&store, "s", Some(1)), first);
    assert_check_ok(&mut store);

    let mut second = first.clone();
    let changed = random(4, 90 << 10);
    second[a.len() + 3000..a.len() + 3000 + changed.len()].copy_from_slice(&changed);
    let report = create_report(&mut store, "s", &second, false);
    assert_eq!(report.reverse.len(), 1, "v1 was reverse-deduplicated");
    assert_eq!(restore_bytes(&store, "s", Some(1)), first);
    assert_eq!(restore_bytes(&store, "s", Some(2)), second);
    assert_check_ok(&mut store);

    let third = random(5, 300 << 10);
    create_report(&mut store, "s", &third, false);
    for (version, expected) in [(1, &first), (2, &second), (3, &third)] {
        assert_eq!(restore_bytes(&store, "s", Some(version)), *expected);
    }
    assert_check_ok(&mut store);

    store.delete("s", 1, Some(DeleteMethod::Timestamp)).unwrap();
    assert_eq!(restore_bytes(&store, "s", Some(2)), second);
    assert_check_ok(&mut store);
    let plan = store.plan_compact().unwrap();
    store.compact(plan).unwrap();
    assert_eq!(restore_bytes(&store, "s", Some(2)), second);
    assert_eq!(restore_bytes(&store, "s", Some(3)), third);
    assert_check_ok(&mut store);

    store.delete("s", 2, Some(DeleteMethod::Timestamp)).unwrap();
    assert_eq!(restore_bytes(&store, "s", Some(3)), third);
    assert_check_ok(&mut store);
    let plan = store.plan_compact().unwrap();
    store.compact(plan).unwrap();
    assert_check_ok(&mut store);
    assert_eq!(restore_bytes(&store, "s", None), third);
}

/// Goal: when the frames of a lender are damaged beyond repair, the chunks borrowing from it
/// are reported lost with it, so the loss names every range that no longer restores, and the
/// restore fails instead of returning wrong bytes. Method: one backup with a repeat, every
/// frame of every container damaged, then a repair and a restore.
#[test]
fn borrowers_of_a_lost_chunk_are_lost() {
    let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
    let mut store = open_with(
        Arc::clone(&storage),
        onecopy_backup::StoreOptions {
            compression_level: None,
            ..small_options(DedupMode::Revdedup)
        },
    );
    let (a, block, c) = (
        random(6, 100 << 10),
        random(7, 96 << 10),
        random(8, 100 << 10),
    );
    let data = with_repeat(&a, &block, &c);
    let report = create_report(&mut store, "s", &data, true);
    assert!(report.inline.borrowed_bytes > 0, "{:?}", report.inline);
    for name in container_files(&storage) {
        for record in container_records(&storage, &name) {
            flip_byte(&storage, &name, record.stored + 1, 0x10);
        }
    }
    let repaired = store.check(REPAIR).unwrap();
    assert_eq!(repaired.status(), ExitStatus::DataLost, "{repaired:#?}");
    let lost: Vec<&String> = repaired
        .findings
        .iter()
        .flat_map(|finding| finding.lost.iter())
        .collect();
    // The borrowed copy's bytes are named lost too: a range covers the middle of the
    // repeat's second copy, which only borrowed chunks hold.
    let middle = (a.len() + block.len() + c.len() + block.len() / 2) as u64;
    let covered = lost.iter().any(|line| {
        let numbers: Vec<u64> = line
            .split(|c: char| !c.is_ascii_digit())
            .filter(|part| !part.is_empty())
            .filter_map(|part| part.parse().ok())
            .collect();
        // "backup s@1: bytes A-B, C-D (N bytes)": the version, then pairs.
        numbers[1..]
            .chunks(2)
            .any(|pair| pair.len() == 2 && pair[0] <= middle && middle <= pair[1])
    });
    assert!(covered, "{lost:#?}");
    let restored = store.restore(
        "s",
        None,
        onecopy_backup::RestoreTarget::Writer(Box::new(SharedBuffer::default())),
    );
    assert!(restored.is_err(), "a lost stream does not restore");
}
