//! Damage to the block device's files is never silent: flipped bytes in manifests, journals,
//! metadata pages and containers are found, reported with what they lose, refused where they
//! would serve old data as current, and repaired so that everything intact reads back and
//! exactly the damaged blocks are recorded lost. Engine-level tests on the simulated storage;
//! the command-line face of the same cases is in crates/cli/tests.

use std::sync::Arc;

use onecopy_block::{Engine, HintSettings, OpenMode, RuntimeOptions};
use onecopy_core::check::{CheckOptions, ExitStatus, FaceReport, FindingKind};
use onecopy_core::pages::{PageStore, PageStoreOptions};
use onecopy_core::storage::{CrashMode, SimulatedStorage, Storage};

const BLOCK: usize = 4096;
const MIB: usize = 1 << 20;

fn runtime() -> RuntimeOptions {
    RuntimeOptions {
        content_cache_bytes: 0,
        checkpoint_journal_bytes: 64 << 20,
        ..RuntimeOptions::default()
    }
}

fn open(storage: &SimulatedStorage, mode: OpenMode) -> onecopy_block::Result<Arc<Engine>> {
    Engine::open_with(
        Arc::new(storage.clone()) as Arc<dyn Storage>,
        None,
        runtime(),
        mode,
    )
}

fn pattern(seed: u64, length: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..length)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

fn flip(storage: &SimulatedStorage, name: &str, offset: u64) {
    let file = storage.open(name, false).unwrap();
    let mut byte = [0u8];
    file.read_at(offset, &mut byte).unwrap();
    file.write_at(offset, &[byte[0] ^ 0x40]).unwrap();
    file.sync_data().unwrap();
}

fn read_file(storage: &SimulatedStorage, name: &str) -> Vec<u8> {
    onecopy_core::storage::read_all(storage, name).unwrap()
}

/// The byte offset in `meta/pages` of page `page` of area `area`.
fn page_offset(storage: &SimulatedStorage, area: &str, page: u64) -> u64 {
    let (pages, _) = PageStore::open_read_only(
        Arc::new(storage.clone()),
        "meta",
        PageStoreOptions::default(),
    )
    .unwrap();
    pages
        .page_offset(area, page)
        .unwrap_or_else(|| panic!("page {page} of {area} has no durable copy"))
}

/// The newest journal file's name.
fn newest_journal(storage: &SimulatedStorage) -> String {
    storage
        .list("meta")
        .unwrap()
        .into_iter()
        .filter(|name| name.contains("journal-"))
        .max()
        .expect("a journal")
}

/// Writes `count` writes of 1 MiB at consecutive MiB offsets of volume `disk`, each
/// followed by a FLUSH, and returns the storage as a machine would find it after a crash
/// (kill -9 of the server: only what was synced).
fn flushed_writes(count: usize) -> (SimulatedStorage, Vec<u8>) {
    let storage = SimulatedStorage::new();
    let engine = open(&storage, OpenMode::ReadWrite).unwrap();
    let volume = engine
        .create_volume("disk", 64 * MIB as u64, 4096, HintSettings::none())
        .unwrap()
        .id;
    let data = pattern(7, count * MIB);
    for index in 0..count {
        engine
            .write(
                volume,
                (index * MIB) as u64,
                &data[index * MIB..(index + 1) * MIB],
                false,
            )
            .unwrap();
        engine.flush().unwrap();
    }
    (storage.crash(CrashMode::Clean), data)
}

fn read_volume(engine: &Engine, offset: usize, length: usize) -> onecopy_block::Result<Vec<u8>> {
    let volume = engine.volume_id("disk")?;
    let mut out = vec![0u8; length];
    engine.read(volume, offset as u64, &mut out)?;
    Ok(out)
}

fn check(engine: &Engine, repair: bool, read_data: bool) -> FaceReport {
    engine
        .check(CheckOptions { repair, read_data })
        .expect("the check runs")
}

fn damage(report: &FaceReport) -> Vec<&onecopy_core::check::Finding> {
    report
        .findings
        .iter()
        .filter(|finding| finding.kind == FindingKind::Damage)
        .collect()
}

/// Goal: a flipped byte inside a flushed journal record (16 writes of 1 MiB, each flushed,
/// then a crash) is damage, not a torn tail: a read-write open refuses it naming the journal
/// and the offset, a check reports it without changing anything, names exactly the blocks
/// of the damaged write as lost, and exits with problems; a repair brings back the other 15
/// writes byte for byte and marks exactly the damaged write's blocks lost (reads of them
/// fail, naming them), and the next check reports only those recorded losses.
#[test]
fn damaged_journal_record_is_refused_reported_and_salvaged() {
    let (storage, data) = flushed_writes(16);
    let journal = newest_journal(&storage);
    flip(&storage, &journal, 40_000);
    let journal_before = read_file(&storage, &journal);

    let refused =
        open(&storage, OpenMode::ReadWrite).expect_err("a damaged journal record is refused");
    let message = refused.to_string();
    assert!(
        message.contains("journal-") && message.contains("at byte"),
        "{message}"
    );
    assert!(message.contains("onecopy check --repair"), "{message}");

    let engine = open(&storage, OpenMode::ReadOnly).unwrap();
    let report = check(&engine, false, false);
    assert_eq!(report.status(), ExitStatus::Problems, "{report:#?}");
    let found = damage(&report);
    assert_eq!(found.len(), 1, "{report:#?}");
    assert!(found[0].object.contains(&journal), "{:?}", found[0]);
    // Record 0 holds the first MiB (blocks 0-255); byte 40000 lies in record 1.
    assert_eq!(
        found[0].lost,
        vec!["volume disk blocks 256-511".to_string()]
    );
    drop(engine);
    assert_eq!(
        read_file(&storage, &journal),
        journal_before,
        "a check changes nothing"
    );

    let engine = open(&storage, OpenMode::Repair).unwrap();
    let report = check(&engine, true, true);
    assert_eq!(report.status(), ExitStatus::DataLost, "{report:#?}");
    drop(engine);
    let engine = open(&storage, OpenMode::ReadWrite).unwrap();
    for index in (0..16).filter(|&index| index != 1) {
        let read = read_volume(&engine, index * MIB, MIB).unwrap();
        assert!(
            read == data[index * MIB..(index + 1) * MIB],
            "write {index}"
        );
    }
    let lost = read_volume(&engine, MIB, BLOCK).unwrap_err().to_string();
    assert!(
        lost.contains("block 256 of volume disk") && lost.contains("lost"),
        "{lost}"
    );
    let report = check(&engine, false, true);
    assert_eq!(report.status(), ExitStatus::DataLost, "{report:#?}");
    assert!(damage(&report).is_empty(), "{report:#?}");
    let recorded: Vec<_> = report
        .findings
        .iter()
        .filter(|finding| finding.kind == FindingKind::Lost)
        .collect();
    assert_eq!(recorded.len(), 1, "{report:#?}");
    assert_eq!(
        recorded[0].lost,
        vec!["volume disk blocks 256-511".to_string()]
    );

    // Writing the lost blocks again makes the volume whole.
    let volume = engine.volume_id("disk").unwrap();
    engine
        .write(volume, MIB as u64, &data[MIB..2 * MIB], false)
        .unwrap();
    assert!(check(&engine, false, true).is_clean());
}

/// Goal: a flipped byte in the newest manifest (32 MiB written and flushed, checkpointed,
/// then a crash) neither serves the old contents nor loses anything: the state is rebuilt
/// from the older manifest and the journals the checkpoint kept, the damage is reported, and
/// a check after reopening is clean.
#[test]
fn damaged_newest_manifest_falls_back_without_loss() {
    let storage = SimulatedStorage::new();
    let engine = open(&storage, OpenMode::ReadWrite).unwrap();
    let volume = engine
        .create_volume("disk", 64 * MIB as u64, 4096, HintSettings::none())
        .unwrap()
        .id;
    let data = pattern(3, 32 * MIB);
    engine.write(volume, 0, &data[..16 * MIB], false).unwrap();
    engine.checkpoint().unwrap();
    engine
        .write(volume, 16 * MIB as u64, &data[16 * MIB..], false)
        .unwrap();
    engine.checkpoint().unwrap();
    engine.write(volume, 0, &data[..MIB], false).unwrap();
    engine.flush().unwrap();
    drop(engine);
    let storage = storage.crash(CrashMode::Clean);
    let (pages, _) = PageStore::open_read_only(
        Arc::new(storage.clone()),
        "meta",
        PageStoreOptions::default(),
    )
    .unwrap();
    let newest = pages.manifest_name(pages.current_manifest()).to_string();
    drop(pages);
    flip(&storage, &newest, 100);

    let engine = open(&storage, OpenMode::ReadOnly).unwrap();
    let report = check(&engine, false, true);
    let found = damage(&report);
    assert_eq!(found.len(), 1, "{report:#?}");
    assert!(found[0].object.ends_with(&newest), "{:?}", found[0]);
    assert!(found[0].lost.is_empty(), "{:?}", found[0]);
    assert_eq!(read_volume(&engine, 0, 32 * MIB).unwrap(), data);
    drop(engine);

    let engine = open(&storage, OpenMode::ReadWrite).unwrap();
    assert_eq!(read_volume(&engine, 0, 32 * MIB).unwrap(), data);
    assert_eq!(engine.open_findings().len(), 1);
    drop(engine);
    let engine = open(&storage, OpenMode::ReadWrite).unwrap();
    assert!(check(&engine, false, true).is_clean());
    assert_eq!(read_volume(&engine, 0, 32 * MIB).unwrap(), data);
}

/// Goal: a damaged older manifest (not needed to open) is still reported, and rewritten by
/// the next checkpoint.
#[test]
fn damaged_older_manifest_is_reported() {
    let storage = SimulatedStorage::new();
    let engine = open(&storage, OpenMode::ReadWrite).unwrap();
    let volume = engine
        .create_volume("disk", 8 * MIB as u64, 4096, HintSettings::none())
        .unwrap()
        .id;
    engine.write(volume, 0, &pattern(1, MIB), false).unwrap();
    engine.shutdown().unwrap();
    drop(engine);
    let (pages, _) = PageStore::open_read_only(
        Arc::new(storage.clone()),
        "meta",
        PageStoreOptions::default(),
    )
    .unwrap();
    let older = pages
        .manifest_name(1 - pages.current_manifest())
        .to_string();
    drop(pages);
    flip(&storage, &older, 40);
    let engine = open(&storage, OpenMode::ReadOnly).unwrap();
    let report = check(&engine, false, false);
    assert_eq!(damage(&report).len(), 1, "{report:#?}");
    assert!(damage(&report)[0].object.ends_with(&older));
    drop(engine);
    let engine = open(&storage, OpenMode::ReadWrite).unwrap();
    drop(engine);
    let engine = open(&storage, OpenMode::ReadOnly).unwrap();
    assert!(check(&engine, false, false).is_clean());
}

/// Writes two volumes of 8 MiB, shuts down cleanly, and returns the storage and the data.
fn two_volumes() -> (SimulatedStorage, Vec<u8>, Vec<u8>) {
    let storage = SimulatedStorage::new();
    let engine = open(&storage, OpenMode::ReadWrite).unwrap();
    let first = pattern(11, 8 * MIB);
    let second = pattern(12, 8 * MIB);
    for (name, data) in [("disk", &first), ("other", &second)] {
        let volume = engine
            .create_volume(name, 8 * MIB as u64, 4096, HintSettings::none())
            .unwrap()
            .id;
        engine.write(volume, 0, data, false).unwrap();
    }
    engine.shutdown().unwrap();
    (storage, first, second)
}

fn read_named(
    engine: &Engine,
    name: &str,
    offset: usize,
    length: usize,
) -> onecopy_block::Result<Vec<u8>> {
    let volume = engine.volume_id(name)?;
    let mut out = vec![0u8; length];
    engine.read(volume, offset as u64, &mut out)?;
    Ok(out)
}

/// Goal: a damaged page of one volume's map fails only the blocks that page maps, with an
/// error naming them; the rest of the volume, the other volume and new writes keep working;
/// a check names exactly those blocks as lost; a repair marks them lost and the rest reads
/// back byte for byte.
#[test]
fn damaged_map_page_fails_only_its_blocks() {
    let (storage, first, second) = two_volumes();
    let offset = page_offset(&storage, "volume.1.map", 1);
    flip(&storage, "meta/pages", offset + 100);
    let engine = open(&storage, OpenMode::ReadWrite).unwrap();
    // Page 1 maps blocks 512-1023 (bytes 2-4 MiB).
    let error = read_named(&engine, "disk", 2 * MIB, BLOCK)
        .unwrap_err()
        .to_string();
    assert!(error.contains("block 512 of volume disk"), "{error}");
    assert_eq!(
        read_named(&engine, "disk", 0, 2 * MIB).unwrap(),
        first[..2 * MIB]
    );
    assert_eq!(
        read_named(&engine, "disk", 4 * MIB, 4 * MIB).unwrap(),
        first[4 * MIB..]
    );
    assert_eq!(read_named(&engine, "other", 0, 8 * MIB).unwrap(), second);
    let volume = engine.volume_id("other").unwrap();
    engine.write(volume, 0, &first[..MIB], false).unwrap();
    engine.write(volume, 0, &second[..MIB], false).unwrap();
    engine.flush().unwrap();
    let report = check(&engine, false, false);
    let found = damage(&report);
    assert_eq!(found.len(), 1, "{report:#?}");
    assert_eq!(
        found[0].lost,
        vec!["volume disk blocks 512-1023".to_string()]
    );
    drop(engine);

    let engine = open(&storage, OpenMode::Repair).unwrap();
    let report = check(&engine, true, true);
    assert_eq!(report.status(), ExitStatus::DataLost, "{report:#?}");
    drop(engine);
    let engine = open(&storage, OpenMode::ReadWrite).unwrap();
    assert!(read_named(&engine, "disk", 2 * MIB, BLOCK)
        .unwrap_err()
        .to_string()
        .contains("lost"));
    assert_eq!(
        read_named(&engine, "disk", 0, 2 * MIB).unwrap(),
        first[..2 * MIB]
    );
    assert_eq!(
        read_named(&engine, "disk", 4 * MIB, 4 * MIB).unwrap(),
        first[4 * MIB..]
    );
    assert_eq!(read_named(&engine, "other", 0, 8 * MIB).unwrap(), second);
    let report = check(&engine, false, true);
    assert_eq!(report.status(), ExitStatus::DataLost, "{report:#?}");
    assert!(damage(&report).is_empty(), "{report:#?}");
}

/// Goal: a damaged page of the chunk table fails only the blocks whose chunks it describes;
/// a repair names exactly those blocks lost and everything else reads back.
#[test]
fn damaged_chunk_table_page_fails_only_its_chunks() {
    let (storage, first, second) = two_volumes();
    let offset = page_offset(&storage, "chunks", 2);
    flip(&storage, "meta/pages", offset + 7);
    let engine = open(&storage, OpenMode::ReadWrite).unwrap();
    // 64 records a page: page 2 holds chunks 128-191, the blocks 127-190 of `disk` (chunk ids
    // start at 1 and the volume was written in order with unique blocks).
    let error = read_named(&engine, "disk", 127 * BLOCK, BLOCK)
        .unwrap_err()
        .to_string();
    assert!(error.contains("block 127 of volume disk"), "{error}");
    assert_eq!(
        read_named(&engine, "disk", 0, 127 * BLOCK).unwrap(),
        first[..127 * BLOCK]
    );
    assert_eq!(read_named(&engine, "other", 0, 8 * MIB).unwrap(), second);
    drop(engine);
    let engine = open(&storage, OpenMode::Repair).unwrap();
    let report = check(&engine, true, true);
    let lost: Vec<String> = report
        .findings
        .iter()
        .flat_map(|finding| finding.lost.clone())
        .collect();
    assert_eq!(
        lost,
        vec!["volume disk blocks 127-190".to_string()],
        "{report:#?}"
    );
    drop(engine);
    let engine = open(&storage, OpenMode::ReadWrite).unwrap();
    assert_eq!(
        read_named(&engine, "disk", 0, 127 * BLOCK).unwrap(),
        first[..127 * BLOCK]
    );
    assert_eq!(
        read_named(&engine, "disk", 191 * BLOCK, 8 * MIB - 191 * BLOCK).unwrap(),
        first[191 * BLOCK..]
    );
    assert_eq!(read_named(&engine, "other", 0, 8 * MIB).unwrap(), second);
    assert!(damage(&check(&engine, false, true)).is_empty());
}

/// Goal: a damaged page of derived data (the index filter, directory or buckets, the
/// container table) never stops the device: it opens, reads and writes, says what it rebuilt
/// or reset, and a repair leaves a clean check.
#[test]
fn damaged_derived_pages_are_rebuilt() {
    for area in [
        "index.filter",
        "index.directory",
        "index.buckets",
        "containers",
    ] {
        let (storage, first, second) = two_volumes();
        let offset = page_offset(&storage, area, 0);
        flip(&storage, "meta/pages", offset + 20);
        let engine =
            open(&storage, OpenMode::ReadWrite).unwrap_or_else(|error| panic!("{area}: {error}"));
        assert_eq!(
            read_named(&engine, "disk", 0, 8 * MIB).unwrap(),
            first,
            "{area}"
        );
        assert_eq!(
            read_named(&engine, "other", 0, 8 * MIB).unwrap(),
            second,
            "{area}"
        );
        let volume = engine.volume_id("other").unwrap();
        engine.write(volume, 0, &first[..MIB], false).unwrap();
        engine.flush().unwrap();
        drop(engine);
        let engine = open(&storage, OpenMode::Repair).unwrap();
        let report = check(&engine, true, true);
        assert!(
            report
                .findings
                .iter()
                .all(|finding| finding.lost.is_empty()),
            "{area}: {report:#?}"
        );
        drop(engine);
        let engine = open(&storage, OpenMode::ReadWrite).unwrap();
        assert!(check(&engine, false, true).is_clean(), "{area}");
        assert_eq!(
            read_named(&engine, "other", 0, MIB).unwrap(),
            first[..MIB],
            "{area}"
        );
    }
}

/// Goal: a damaged chunk's bytes are found by `--read-data`, named with the blocks that use
/// it, and after a repair the next check does not fail again on the same damage: it reports
/// the recorded loss.
#[test]
fn damaged_chunk_data_is_found_and_repaired_once() {
    let (storage, first, _) = two_volumes();
    let container = storage
        .list("containers/01")
        .unwrap()
        .into_iter()
        .next()
        .expect("container 1");
    // Past the 64-byte header and the first chunk's header: the first chunk's bytes.
    flip(&storage, &container, 64 + 60 + 10);
    let engine = open(&storage, OpenMode::ReadOnly).unwrap();
    let report = check(&engine, false, true);
    let found = damage(&report);
    assert_eq!(found.len(), 1, "{report:#?}");
    assert_eq!(found[0].lost, vec!["volume disk blocks 0-0".to_string()]);
    drop(engine);
    let engine = open(&storage, OpenMode::Repair).unwrap();
    assert_eq!(check(&engine, true, true).status(), ExitStatus::DataLost);
    drop(engine);
    let engine = open(&storage, OpenMode::ReadWrite).unwrap();
    let report = check(&engine, false, true);
    assert_eq!(report.status(), ExitStatus::DataLost, "{report:#?}");
    assert!(damage(&report).is_empty(), "{report:#?}");
    assert_eq!(
        read_named(&engine, "disk", BLOCK, 8 * MIB - BLOCK).unwrap(),
        first[BLOCK..]
    );
}

/// Goal: a changed fingerprint or length field in a sealed container's record header (the
/// copy inside the container body, which the chunk table does not use for reads) is found
/// by `--read-data` and named; nothing is lost, and a repair copies the container's live
/// chunks to a new container, after which the check is clean and the data unchanged.
#[test]
fn damaged_record_header_in_a_sealed_container_is_found() {
    for (field, offset) in [("fingerprint", 5u64), ("stored length", 33)] {
        let (storage, first, second) = two_volumes();
        let container = storage
            .list("containers/01")
            .unwrap()
            .into_iter()
            .next()
            .expect("container 1");
        flip(&storage, &container, 64 + offset);
        let engine = open(&storage, OpenMode::ReadOnly).unwrap();
        let report = check(&engine, false, true);
        let found = damage(&report);
        assert_eq!(found.len(), 1, "{field}: {report:#?}");
        assert!(
            found[0].object.ends_with(&container),
            "{field}: {:?}",
            found[0]
        );
        assert!(found[0].lost.is_empty(), "{field}: {:?}", found[0]);
        drop(engine);
        let engine = open(&storage, OpenMode::Repair).unwrap();
        assert_eq!(
            check(&engine, true, true).status(),
            ExitStatus::Clean,
            "{field}"
        );
        drop(engine);
        let engine = open(&storage, OpenMode::ReadWrite).unwrap();
        assert!(check(&engine, false, true).is_clean(), "{field}");
        assert_eq!(
            read_named(&engine, "disk", 0, 8 * MIB).unwrap(),
            first,
            "{field}"
        );
        assert_eq!(
            read_named(&engine, "other", 0, 8 * MIB).unwrap(),
            second,
            "{field}"
        );
    }
}

/// Goal: a checkpoint whose next volume id is damaged (0, below an existing volume's id, or
/// beyond what the chunk owner tags hold) is refused as corrupt, not silently replaced.
/// Method: rewrite the checkpoint state of a face with one volume through the page store,
/// then open the engine.
#[test]
fn damaged_next_volume_id_is_refused() {
    for next in [0u64, 1, (1 << 21) + 1, u64::from(u32::MAX)] {
        let storage = SimulatedStorage::new();
        let engine = open(&storage, OpenMode::ReadWrite).unwrap();
        let volume = engine
            .create_volume("disk", 8 * MIB as u64, 4096, HintSettings::none())
            .unwrap()
            .id;
        assert_eq!(volume, 1);
        engine.shutdown().unwrap();
        drop(engine);
        let (mut pages, saved) = PageStore::open(
            Arc::new(storage.clone()),
            "meta",
            PageStoreOptions::default(),
        )
        .unwrap();
        let mut state: serde_json::Value = serde_json::from_slice(&saved).unwrap();
        assert_eq!(state["next_volume_id"], 2);
        state["next_volume_id"] = next.into();
        pages
            .checkpoint(&serde_json::to_vec(&state).unwrap())
            .unwrap();
        drop(pages);

        let error = match open(&storage, OpenMode::ReadWrite) {
            Ok(_) => panic!("next volume id {next} was accepted"),
            Err(error) => error,
        };
        assert!(error.is_corrupt(), "{error}");
        assert!(error.to_string().contains("volume id"), "{error}");
    }
}
