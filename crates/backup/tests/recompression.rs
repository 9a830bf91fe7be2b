//! Recompression: each backup compresses again the frames earlier backups wrote.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;

use common::*;
use onecopy_backup::{DedupMode, StoreOptions};
use onecopy_core::container::{CHUNK_COMPRESSED, CHUNK_RECOMPRESSED};
use onecopy_core::storage::{SimulatedStorage, Storage};

/// Text of `bytes` drawn from a vocabulary of 400 words, which zstd 7 stores in less than
/// zstd 1 does.
fn text(random: &mut Random, bytes: usize) -> Vec<u8> {
    let words: Vec<Vec<u8>> = (0..400)
        .map(|_| {
            let length = 3 + random.below(8) as usize;
            (0..length).map(|_| b'a' + random.below(26) as u8).collect()
        })
        .collect();
    let mut text = Vec::with_capacity(bytes + 16);
    while text.len() < bytes {
        text.extend_from_slice(&words[random.below(words.len() as u64) as usize]);
        text.push(if random.below(12) == 0 { b'\n' } else { b' ' });
    }
    text.truncate(bytes);
    text
}

/// The container file and flags of every chunk record in the store's containers.
fn record_flags(storage: &Arc<dyn Storage>) -> Vec<(String, u32)> {
    let mut flags = Vec::new();
    for name in container_files(storage) {
        let file = storage.open(&name, false).unwrap();
        for record in container_records(storage, &name) {
            let mut bytes = [0u8; 4];
            file.read_at(record.header + 40, &mut bytes).unwrap();
            flags.push((name.clone(), u32::from_le_bytes(bytes)));
        }
    }
    flags
}

/// True for the flags of a record compressed by the write path and not yet again.
fn waits(flags: u32) -> bool {
    flags & (CHUNK_COMPRESSED | CHUNK_RECOMPRESSED) == CHUNK_COMPRESSED
}

/// (compressed records awaiting recompression, recompressed records)
fn census(storage: &Arc<dyn Storage>) -> (usize, usize) {
    let flags = record_flags(storage);
    let awaiting = flags.iter().filter(|(_, flags)| waits(*flags)).count();
    let recompressed = flags
        .iter()
        .filter(|(_, flags)| flags & CHUNK_RECOMPRESSED != 0)
        .count();
    (awaiting, recompressed)
}

/// The container files of the store that hold a record waiting for recompression.
fn waiting_containers(storage: &Arc<dyn Storage>) -> BTreeSet<String> {
    record_flags(storage)
        .into_iter()
        .filter(|(_, flags)| waits(*flags))
        .map(|(name, _)| name)
        .collect()
}

fn stored_bytes(store: &onecopy_backup::BackupStore) -> u64 {
    let stats = store.stats().unwrap();
    stats.container_bytes_shared + stats.container_bytes_archival
}

/// Asserts that every version of `docs` restores byte-exact (`when` says at what point).
fn assert_restores(store: &onecopy_backup::BackupStore, versions: &[&Vec<u8>], when: &str) {
    for (number, version) in versions.iter().enumerate() {
        assert!(
            restore_bytes(store, "docs", Some(number as u32 + 1)) == **version,
            "version {} {when}",
            number + 1
        );
    }
}

/// Goal: the first backup's frames stay as the write path compressed them; each later
/// backup compresses earlier frames again (flagged), oldest first, up to twice what it
/// stored new, and never its own; an unchanged backup recompresses nothing; after a backup
/// whose budget covers the backlog only its own frames wait; every version restores
/// byte-exact, check reads every frame clean, and the store is smaller than one without
/// recompression.
/// Method: reverse deduplication deferred (so that the recompression pass does all the
/// work), five versions of compressible text: the first, a new middle, the same again, then
/// two of new text twice as large; the same backups into a store with recompression off.
#[test]
fn later_backups_recompress_what_earlier_ones_wrote() {
    let mut random = Random(5);
    let first = text(&mut random, 1 << 20);
    let mut second = first.clone();
    let middle = text(&mut random, 512 << 10);
    second[256 << 10..768 << 10].copy_from_slice(&middle);
    let fourth = text(&mut random, 2 << 20);
    let fifth = text(&mut random, 2 << 20);
    let versions = [&first, &second, &second, &fourth, &fifth];

    let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
    let mut store = open(storage.clone(), DedupMode::Revdedup);
    let plain_storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
    let mut plain = open_with(
        plain_storage,
        StoreOptions {
            recompression_level: None,
            ..small_options(DedupMode::Revdedup)
        },
    );

    let report = create_report(&mut store, "docs", versions[0], true);
    assert!(report.recompression.is_none());
    let (awaiting, recompressed) = census(&storage);
    assert!(awaiting > 0, "the write path compresses text");
    assert_eq!(recompressed, 0, "the first backup is not recompressed");

    let report = create_report(&mut store, "docs", versions[1], true);
    assert_eq!(report.recompression_error, None);
    let rewritten = report.recompression.unwrap_or_else(|| {
        panic!(
            "the first backup's frames wait; stored new {}, containers {:?}",
            report.inline.new_stored_bytes,
            container_files(&storage)
                .iter()
                .map(|name| storage.open(name, false).unwrap().len().unwrap())
                .collect::<Vec<_>>()
        )
    });
    assert!(rewritten.plan.rewrite_bytes <= 2 * report.inline.new_stored_bytes);
    let after_second = census(&storage);
    assert!(
        after_second.1 > 0,
        "the first backup's frames are recompressed"
    );

    let report = create_report(&mut store, "docs", versions[2], true);
    assert_eq!(report.inline.new_stored_bytes, 0);
    assert!(report.recompression.is_none());
    assert_eq!(
        census(&storage),
        after_second,
        "an unchanged backup recompresses nothing"
    );

    let before_fourth: BTreeSet<String> = container_files(&storage).into_iter().collect();
    let report = create_report(&mut store, "docs", versions[3], true);
    assert_eq!(report.recompression_error, None);
    assert!(report.recompression.is_some());
    let waiting = waiting_containers(&storage);
    assert!(!waiting.is_empty(), "the fourth backup's own frames wait");
    assert!(
        waiting.is_disjoint(&before_fourth),
        "only the fourth backup's own containers wait: {waiting:?}"
    );

    let report = create_report(&mut store, "docs", versions[4], true);
    assert!(
        report.recompression.is_some(),
        "the fourth backup's frames wait"
    );

    for version in versions {
        backup_bytes(&mut plain, "docs", version, true);
    }
    assert_restores(&store, &versions, "after the backups");
    assert_check_ok(&mut store);
    store.reverse_pending_backups("docs").unwrap();
    assert_restores(&store, &versions, "after reverse deduplication");
    assert_check_ok(&mut store);
    let (recompressed, kept) = (stored_bytes(&store), stored_bytes(&plain));
    assert!(
        recompressed < kept,
        "recompressed {recompressed} bytes, kept {kept}"
    );
}

/// Goal: a store refuses a recompression level that is not above its compression level.
#[test]
fn recompression_level_is_above_the_compression_level() {
    let options = StoreOptions {
        compression_level: Some(7),
        recompression_level: Some(7),
        ..small_options(DedupMode::Revdedup)
    };
    let error = options.validate().unwrap_err().to_string();
    assert!(error.contains("recompression level 7"), "{error}");
    let off = StoreOptions {
        recompression_level: None,
        ..options
    };
    off.validate().unwrap();
}

/// Goal: a damaged frame met by a recompression stops it with an error naming the damage,
/// while the backup that ran it stays committed and restorable, and the next backup with
/// something to store tries the same containers again (nothing was skipped for good).
/// Method: reverse deduplication deferred; one byte of the first backup's first frame
/// flipped before the second backup.
#[test]
fn damage_stops_a_recompression_but_not_the_backup() {
    let mut random = Random(9);
    let first = text(&mut random, 1 << 20);
    let second = text(&mut random, 1 << 20);
    let third = text(&mut random, 1 << 20);
    let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
    let mut store = open(storage.clone(), DedupMode::Revdedup);
    create_report(&mut store, "docs", &first, true);
    let name = container_files(&storage)[0].clone();
    let record = container_records(&storage, &name)[0];
    flip_byte(&storage, &name, record.stored + 10, 0x40);

    let report = create_report(&mut store, "docs", &second, true);
    let error = report
        .recompression_error
        .expect("the damaged frame stops the recompression");
    assert!(error.contains("checksum"), "{error}");
    assert!(restore_bytes(&store, "docs", Some(2)) == second);

    let report = create_report(&mut store, "docs", &third, true);
    assert!(
        report.recompression_error.is_some(),
        "the damaged container is tried again"
    );
    assert!(restore_bytes(&store, "docs", Some(3)) == third);
}
