//! Crash-point sweeps of the block device's recovery and maintenance paths on the simulated
//! storage: recovery after a crash (and a crash during that recovery), removal of orphan
//! containers, compaction, volume deletion (finished at the next open when interrupted), and
//! the repair itself, of a damaged journal record and of a damaged map page.
//!
//! Method: each case prepares a durable repository image and a reference model (the bytes of
//! every volume, the blocks a fault lost). It runs the operation once to count its syncs,
//! then, for every sync N and for a clean and a torn crash, runs it again on a fresh copy of
//! the image with the storage dying after sync N, and hands the crashed image to the case's
//! recovery: reopen (repair first when the case has damage), and check that every durable
//! write reads back, that exactly the expected blocks are lost, and that `check` is clean or
//! reports only the recorded losses. Where a crash can interrupt work the next open finishes
//! (recovery, deletion), that next open is swept too. After each repair and each reopen, a
//! copy whose newest manifest is damaged must fall back to the same state: the older manifest
//! and the journals every checkpoint keeps never lead back to older data or to the damage a
//! repair dealt with.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use onecopy_block::{BlockConfig, Engine, HintSettings, OpenMode, RuntimeOptions};
use onecopy_core::check::{CheckOptions, ExitStatus, FaceReport, FindingKind};
use onecopy_core::container::{ContainerOptions, CONTAINER_BYTES_MIN};
use onecopy_core::gc::CompactionOptions;
use onecopy_core::journal::Journal;
use onecopy_core::pages::{PageStore, PageStoreOptions};
use onecopy_core::storage::{CrashMode, SimulatedStorage, Storage};

const BLOCK: usize = 4096;
/// Blocks of each volume: two map pages.
const VOLUME_BLOCKS: u64 = 1024;
const VOLUME_BYTES: usize = VOLUME_BLOCKS as usize * BLOCK;
/// Map entries per metadata page: a damaged map page loses this many blocks.
const MAP_ENTRIES_PER_PAGE: u64 = 512;

type Volumes = BTreeMap<String, Vec<u8>>;
/// Blocks by volume name.
type Blocks = BTreeMap<String, BTreeSet<u64>>;

/// The smallest containers, so that a few hundred blocks fill many of them and compaction
/// and orphan removal have several to work on.
fn config() -> BlockConfig {
    BlockConfig {
        containers: ContainerOptions {
            container_bytes: CONTAINER_BYTES_MIN,
            compression_level: None,
        },
        ..BlockConfig::default()
    }
}

fn runtime() -> RuntimeOptions {
    let mut runtime = RuntimeOptions {
        content_cache_bytes: 0,
        // Large enough that flushed writes stay in the journal until a case checkpoints, and
        // small because a journal file is created at this capacity and every crash image
        // copies it.
        checkpoint_journal_bytes: 1 << 20,
        ..RuntimeOptions::default()
    };
    runtime.index.cache_bytes = 1 << 20;
    runtime
}

fn open(storage: &SimulatedStorage, mode: OpenMode) -> onecopy_block::Result<Arc<Engine>> {
    Engine::open_with(
        Arc::new(storage.clone()) as Arc<dyn Storage>,
        Some(config()),
        runtime(),
        mode,
    )
}

/// Deterministic bytes: a different block for every seed.
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

/// A durable image of a repository and what its volumes hold.
struct Prepared {
    storage: SimulatedStorage,
    model: Volumes,
    /// Blocks the image has lost (the case's fault).
    lost: Blocks,
}

/// Writes `data` to `volume` at block `first` and flushes; records it in `model`.
fn write_flushed(engine: &Engine, model: &mut Volumes, volume: &str, first: u64, data: &[u8]) {
    let id = engine.volume_id(volume).unwrap();
    engine.write(id, first * BLOCK as u64, data, false).unwrap();
    engine.flush().unwrap();
    let at = first as usize * BLOCK;
    model.get_mut(volume).unwrap()[at..at + data.len()].copy_from_slice(data);
}

/// Two volumes, `disk` and `other`, written with flushes: 8 writes of 16 blocks to each,
/// half of `other`'s the same data as `disk`'s (deduplicated). The engine is left open.
fn two_volumes(storage: &SimulatedStorage) -> (Arc<Engine>, Volumes) {
    let engine = open(storage, OpenMode::ReadWrite).unwrap();
    let mut model = Volumes::new();
    for name in ["disk", "other"] {
        engine
            .create_volume(
                name,
                VOLUME_BYTES as u64,
                BLOCK as u32,
                HintSettings::none(),
            )
            .unwrap();
        model.insert(name.to_string(), vec![0u8; VOLUME_BYTES]);
    }
    for index in 0..8u64 {
        let data = pattern(100 + index, 16 * BLOCK);
        write_flushed(&engine, &mut model, "disk", index * 100, &data);
        let data = if index % 2 == 0 {
            data
        } else {
            pattern(200 + index, 16 * BLOCK)
        };
        write_flushed(&engine, &mut model, "other", 600 + index * 40, &data);
    }
    (engine, model)
}

/// Every block reads back as the model says, lost blocks fail naming their loss, and the
/// check (with `read_data`) is clean, or reports exactly `lost` as recorded losses.
fn verify(engine: &Engine, model: &Volumes, lost: &Blocks, context: &str) {
    verify_besides(engine, model, lost, context, None);
}

/// As [`verify`], but a finding of damage to `damaged` (a file the test damaged on purpose,
/// which loses nothing) is allowed.
fn verify_besides(
    engine: &Engine,
    model: &Volumes,
    lost: &Blocks,
    context: &str,
    damaged: Option<&str>,
) {
    for (name, bytes) in model {
        let id = engine
            .volume_id(name)
            .unwrap_or_else(|error| panic!("{context}: volume {name}: {error}"));
        let lost_here = lost.get(name);
        let mut block = vec![0u8; BLOCK];
        for index in 0..VOLUME_BLOCKS {
            let result = engine.read(id, index * BLOCK as u64, &mut block);
            if lost_here.is_some_and(|blocks| blocks.contains(&index)) {
                let error = result.expect_err("a lost block fails").to_string();
                assert!(error.contains("lost"), "{context}: {error}");
                continue;
            }
            result.unwrap_or_else(|error| panic!("{context}: block {index} of {name}: {error}"));
            let at = index as usize * BLOCK;
            assert!(
                block[..] == bytes[at..at + BLOCK],
                "{context}: block {index} of volume {name} differs from the model"
            );
        }
    }
    let report = engine
        .check(CheckOptions {
            repair: false,
            read_data: true,
        })
        .unwrap_or_else(|error| panic!("{context}: check: {error}"));
    let mut report = report;
    if let Some(damaged) = damaged {
        report.findings.retain(|finding| {
            !(finding.kind == FindingKind::Damage
                && finding.object.ends_with(damaged)
                && finding.lost.is_empty())
        });
    }
    if lost.is_empty() {
        assert!(report.is_clean(), "{context}: {report:#?}");
    } else {
        assert_eq!(
            report.status(),
            ExitStatus::DataLost,
            "{context}: {report:#?}"
        );
        assert!(
            report
                .findings
                .iter()
                .all(|finding| finding.kind == FindingKind::Lost),
            "{context}: {report:#?}"
        );
        assert_eq!(&recorded_lost(&report), lost, "{context}: {report:#?}");
    }
}

/// The blocks a report lists as lost ("volume NAME blocks A-B").
fn recorded_lost(report: &FaceReport) -> Blocks {
    let mut blocks = Blocks::new();
    for finding in &report.findings {
        for entry in &finding.lost {
            let rest = entry.strip_prefix("volume ").expect("a block range");
            let (volume, range) = rest.split_once(" blocks ").expect("a block range");
            let (first, last) = range.split_once('-').expect("a block range");
            blocks
                .entry(volume.to_string())
                .or_default()
                .extend(first.parse::<u64>().unwrap()..=last.parse::<u64>().unwrap());
        }
    }
    blocks
}

/// Opens for writing and verifies; with damage, a repair runs first. After the repair and
/// after the open, the fallback from a damaged newest manifest is verified too. Returns the
/// engine.
fn recover(storage: &SimulatedStorage, prepared: &Prepared, context: &str) -> Arc<Engine> {
    recover_to(storage, &prepared.model, &prepared.lost, context)
}

fn recover_to(
    storage: &SimulatedStorage,
    model: &Volumes,
    lost: &Blocks,
    context: &str,
) -> Arc<Engine> {
    if !lost.is_empty() {
        repair(storage, context);
        verify_fallback(
            storage,
            model,
            lost,
            &format!("{context}, after the repair"),
        );
    }
    let engine = open(storage, OpenMode::ReadWrite)
        .unwrap_or_else(|error| panic!("{context}: open: {error}"));
    verify(&engine, model, lost, context);
    verify_fallback(storage, model, lost, context);
    engine
}

/// The older manifest and the journals kept with it hold the same state as the newest
/// manifest: on a copy of the durable image whose newest manifest is damaged, a read-only
/// open reads the same blocks and loses the same ones.
fn verify_fallback(storage: &SimulatedStorage, model: &Volumes, lost: &Blocks, context: &str) {
    let copy = storage.crash(CrashMode::Clean);
    // Checkpoints remove old journals without syncing the directory: the durable image may
    // still hold them, a real file system usually does not. The fallback must not need them.
    let live: BTreeSet<String> = storage.list("meta").unwrap().into_iter().collect();
    for name in copy.list("meta").unwrap() {
        if !live.contains(&name) {
            copy.remove(&name).unwrap();
        }
    }
    copy.sync_directory("meta").unwrap();
    let newest = {
        let (pages, _) =
            PageStore::open_read_only(Arc::new(copy.clone()), "meta", PageStoreOptions::default())
                .unwrap();
        pages.manifest_name(pages.current_manifest()).to_string()
    };
    flip(&copy, &newest, 100);
    let context = format!("{context}, falling back from a damaged {newest}");
    let engine =
        open(&copy, OpenMode::ReadOnly).unwrap_or_else(|error| panic!("{context}: open: {error}"));
    verify_besides(&engine, model, lost, &context, Some(&newest));
}

/// Opens for repair and repairs; the report must leave nothing to repair.
fn repair(storage: &SimulatedStorage, context: &str) {
    let engine = open(storage, OpenMode::Repair)
        .unwrap_or_else(|error| panic!("{context}: open for repair: {error}"));
    let report = engine
        .check(CheckOptions {
            repair: true,
            read_data: true,
        })
        .unwrap_or_else(|error| panic!("{context}: repair: {error}"));
    assert_ne!(
        report.status(),
        ExitStatus::Problems,
        "{context}: {report:#?}"
    );
}

/// Runs `operation` on a copy of `base` to count its syncs, then again on fresh copies
/// crashing after each of those syncs, clean and torn, and hands each crashed image to
/// `after_crash` with a description. Returns how many crashed images were checked.
fn sweep(
    base: &SimulatedStorage,
    operation: &dyn Fn(&SimulatedStorage) -> onecopy_block::Result<()>,
    after_crash: &dyn Fn(&SimulatedStorage, &str),
    modes: &[fn(u64) -> CrashMode],
    context: &str,
) -> usize {
    let syncs = {
        let storage = base.crash(CrashMode::Clean);
        operation(&storage).unwrap_or_else(|error| panic!("{context}: without a crash: {error}"));
        storage.sync_count()
    };
    assert!(syncs > 0, "{context}: the operation syncs");
    let mut images = 0;
    for crash_at in 1..=syncs {
        for mode in modes {
            let storage = base.crash(CrashMode::Clean);
            storage.crash_after_syncs(crash_at);
            // The operation fails at the crash (or completes, when the last sync was its
            // last step); either way the image is what a rebooted machine finds.
            let _ = operation(&storage);
            assert!(
                storage.is_crashed(),
                "{context}: sync {crash_at} is reached"
            );
            let mode = mode(crash_at);
            let image = storage.crash(mode);
            after_crash(
                &image,
                &format!("{context}, crash after sync {crash_at} of {syncs} ({mode:?})"),
            );
            images += 1;
        }
    }
    images
}

const CLEAN_AND_TORN: &[fn(u64) -> CrashMode] =
    &[|_| CrashMode::Clean, |seed| CrashMode::Torn { seed }];
const CLEAN: &[fn(u64) -> CrashMode] = &[|_| CrashMode::Clean];

fn open_for_writing(storage: &SimulatedStorage) -> onecopy_block::Result<()> {
    open(storage, OpenMode::ReadWrite).map(drop)
}

/// Goal: recovery after a crash is itself crash-safe: a crash at any sync of the recovery
/// (which replays the journal, writes a new one and checkpoints), and a crash at any sync of
/// the recovery after that, lose no flushed write. Method: flushed writes left in the journal,
/// a crash; the first recovery swept, and for each of its crash images the second one too.
#[test]
fn crash_during_recovery() {
    let storage = SimulatedStorage::new();
    let (engine, model) = two_volumes(&storage);
    drop(engine);
    let prepared = Prepared {
        storage: storage.crash(CrashMode::Clean),
        model,
        lost: Blocks::new(),
    };
    let images = sweep(
        &prepared.storage,
        &open_for_writing,
        &|image, context| {
            sweep(
                image,
                &open_for_writing,
                &|image, context| drop(recover(image, &prepared, context)),
                CLEAN,
                context,
            );
            drop(recover(image, &prepared, context));
        },
        CLEAN_AND_TORN,
        "recovery",
    );
    eprintln!("recovery: {images} crash images");
}

/// Goal: orphan containers (files past the next container id, left by writes no journal
/// record survived) are all removed by the next open, also when that open crashes at any
/// sync, whatever gaps lie between their ids, and nothing else is touched. Method: a clean
/// stop, three orphans at ids next, next + 2 and next + 5, the open swept.
#[test]
fn crash_during_orphan_removal() {
    let storage = SimulatedStorage::new();
    let (engine, model) = two_volumes(&storage);
    let next = engine.stats().store.container_id_next;
    engine.shutdown().unwrap();
    drop(engine);
    let base = storage.crash(CrashMode::Clean);
    let name = |id: u64| format!("containers/{:02x}/{id:016x}", id & 0xff);
    let sample = onecopy_core::storage::read_all(&base, &name(1)).unwrap();
    let orphans = [next, next + 2, next + 5];
    for &id in &orphans {
        let file = base.open(&name(id), true).unwrap();
        file.write_at(0, &sample).unwrap();
        file.sync_data().unwrap();
        base.sync_directory(&format!("containers/{:02x}", id & 0xff))
            .unwrap();
    }
    let base = base.crash(CrashMode::Clean);
    let prepared = Prepared {
        storage: base,
        model,
        lost: Blocks::new(),
    };
    let images = sweep(
        &prepared.storage,
        &open_for_writing,
        &|image, context| {
            let engine = recover(image, &prepared, context);
            drop(engine);
            for &id in &orphans {
                assert!(
                    !image.exists(&name(id)).unwrap(),
                    "{context}: orphan container {id} is removed"
                );
            }
        },
        CLEAN_AND_TORN,
        "orphan removal",
    );
    eprintln!("orphan removal: {images} crash images");
}

/// Goal: compaction, and the checkpoints after it that remove the containers it emptied, can
/// crash at any sync without losing or changing a block, and compaction works again after
/// the recovery. Method: overwritten data leaves most containers mostly dead; open, compact
/// and two checkpoints swept.
#[test]
fn crash_during_compaction() {
    let storage = SimulatedStorage::new();
    let (engine, mut model) = two_volumes(&storage);
    for round in 0..3u64 {
        for index in 0..8u64 {
            let data = pattern(1000 * (round + 1) + index, 16 * BLOCK);
            write_flushed(&engine, &mut model, "disk", index * 100, &data);
        }
    }
    engine.shutdown().unwrap();
    drop(engine);
    let prepared = Prepared {
        storage: storage.crash(CrashMode::Clean),
        model,
        lost: Blocks::new(),
    };
    let compact = |storage: &SimulatedStorage| -> onecopy_block::Result<()> {
        let engine = open(storage, OpenMode::ReadWrite)?;
        let (plan, report) = engine.compact(&CompactionOptions::default(), false)?;
        assert!(!plan.containers.is_empty(), "there is work to do");
        assert!(report.is_some());
        engine.checkpoint()?;
        engine.checkpoint()
    };
    let images = sweep(
        &prepared.storage,
        &compact,
        &|image, context| {
            let engine = recover(image, &prepared, context);
            engine
                .compact(&CompactionOptions::default(), false)
                .unwrap_or_else(|error| panic!("{context}: compaction again: {error}"));
            verify(&engine, &prepared.model, &Blocks::new(), context);
        },
        CLEAN_AND_TORN,
        "compaction",
    );
    eprintln!("compaction: {images} crash images");
}

/// Goal: deleting a volume can crash at any sync: the next open finishes an interrupted
/// deletion (also when it crashes itself), the volume is either whole or gone, the other
/// volume, which shares chunks with it, stays whole, and the check finds the reference
/// counts right. Method: the deletion swept, and the open after each crash swept too.
#[test]
fn crash_during_volume_deletion() {
    let storage = SimulatedStorage::new();
    let (engine, model) = two_volumes(&storage);
    engine.shutdown().unwrap();
    drop(engine);
    let base = storage.crash(CrashMode::Clean);
    let delete = |storage: &SimulatedStorage| -> onecopy_block::Result<()> {
        let engine = open(storage, OpenMode::ReadWrite)?;
        engine.delete_volume("disk").map(drop)
    };
    let settle = |image: &SimulatedStorage, context: &str| {
        let deleted = {
            let engine = open(image, OpenMode::ReadWrite)
                .unwrap_or_else(|error| panic!("{context}: open: {error}"));
            engine.volume_id("disk").is_err()
        };
        let mut expected = model.clone();
        if deleted {
            expected.remove("disk");
        }
        drop(recover_to(image, &expected, &Blocks::new(), context));
    };
    let images = sweep(
        &base,
        &delete,
        &|image, context| {
            sweep(image, &open_for_writing, &settle, CLEAN, context);
            settle(image, context);
        },
        CLEAN_AND_TORN,
        "volume deletion",
    );
    eprintln!("volume deletion: {images} crash images");
}

/// The offset of record `index` of the newest journal.
fn journal_record_offset(storage: &SimulatedStorage, index: usize) -> (String, u64) {
    let generation = *Journal::generations(storage, "meta")
        .unwrap()
        .last()
        .unwrap();
    let scan = Journal::scan(storage, "meta", generation).unwrap();
    (
        Journal::file_name("meta", generation),
        scan.records[index].offset,
    )
}

fn flip(storage: &SimulatedStorage, name: &str, offset: u64) {
    let file = storage.open(name, false).unwrap();
    let mut byte = [0u8];
    file.read_at(offset, &mut byte).unwrap();
    file.write_at(offset, &[byte[0] ^ 0x40]).unwrap();
    file.sync_data().unwrap();
}

fn repair_operation(storage: &SimulatedStorage) -> onecopy_block::Result<()> {
    let engine = open(storage, OpenMode::Repair)?;
    engine
        .check(CheckOptions {
            repair: true,
            read_data: true,
        })
        .map(drop)
}

/// Goal: a repair of a damaged journal record can crash at any sync: repairing again then
/// keeps every other write and loses exactly the damaged write's blocks, never more. Method:
/// flushed writes in the journal, a crash, a flipped byte in the record of the sixth write
/// (blocks 680 to 695 of `other`), the repair swept.
#[test]
fn crash_during_repair_of_a_damaged_journal_record() {
    let storage = SimulatedStorage::new();
    let (engine, model) = two_volumes(&storage);
    drop(engine);
    let base = storage.crash(CrashMode::Clean);
    // The journal holds the volume records, then the writes in order: disk, other, disk, ...
    let generation = *Journal::generations(&base, "meta").unwrap().last().unwrap();
    let scan = Journal::scan(&base, "meta", generation).unwrap();
    let records = scan.records.len();
    assert!(records >= 16, "the writes are in the journal");
    // Record `records - 16 + 5` is the sixth write: `other`, index 2, blocks 680..696.
    let (name, offset) = journal_record_offset(&base, records - 16 + 5);
    flip(&base, &name, offset + 32 + 100);
    let mut lost = Blocks::new();
    lost.entry("other".to_string())
        .or_default()
        .extend(680..696);
    let prepared = Prepared {
        storage: base,
        model,
        lost,
    };
    let images = sweep(
        &prepared.storage,
        &repair_operation,
        &|image, context| drop(recover(image, &prepared, context)),
        CLEAN_AND_TORN,
        "repair of a journal record",
    );
    eprintln!("repair of a journal record: {images} crash images");
}

/// Goal: a repair of a damaged map page can crash at any sync: repairing again then loses
/// exactly the page's 512 blocks and keeps everything else. Method: a clean stop, a flipped
/// byte in page 1 of `disk`'s map, the repair swept.
#[test]
fn crash_during_repair_of_a_damaged_map_page() {
    let storage = SimulatedStorage::new();
    let (engine, model) = two_volumes(&storage);
    engine.shutdown().unwrap();
    drop(engine);
    let base = storage.crash(CrashMode::Clean);
    let offset = {
        let (pages, _) =
            PageStore::open_read_only(Arc::new(base.clone()), "meta", PageStoreOptions::default())
                .unwrap();
        pages.page_offset("volume.1.map", 1).unwrap()
    };
    flip(&base, "meta/pages", offset + 100);
    let mut lost = Blocks::new();
    lost.entry("disk".to_string())
        .or_default()
        .extend(MAP_ENTRIES_PER_PAGE..2 * MAP_ENTRIES_PER_PAGE);
    let prepared = Prepared {
        storage: base,
        model,
        lost,
    };
    let images = sweep(
        &prepared.storage,
        &repair_operation,
        &|image, context| drop(recover(image, &prepared, context)),
        CLEAN_AND_TORN,
        "repair of a map page",
    );
    eprintln!("repair of a map page: {images} crash images");
}

/// Goal: selective duplication is derived data. A run that reads popular blocks on two days,
/// duplicates them, reads them back from the duplicates and overwrites some of them can crash
/// at any sync without losing a flushed write, and the next open serves every block from its
/// own chunk: the scratch files a crash leaves are removed, never read. Method: the run swept
/// (clean and torn); after each crash the open must give every overwritten block its old or
/// its new bytes and every other block the model's, find `check` clean and `scratch/` empty.
#[test]
fn crash_during_selective_duplication() {
    use onecopy_block::replicas::device::DeviceProfile;
    use onecopy_block::replicas::{ReplicaOptions, SCRATCH_DIRECTORY};

    let storage = SimulatedStorage::new();
    let (engine, model) = two_volumes(&storage);
    engine.shutdown().unwrap();
    drop(engine);
    let base = storage.crash(CrashMode::Clean);
    // The first 16 blocks of each of the first four writes to `disk`; half are overwritten.
    let popular: Vec<u64> = (0..4u64)
        .flat_map(|index| index * 100..index * 100 + 16)
        .collect();
    let overwritten: Vec<u64> = popular.iter().copied().step_by(2).collect();
    let new_bytes = |block: u64| pattern(9000 + block, BLOCK);
    let duplicating = |storage: &SimulatedStorage| -> onecopy_block::Result<()> {
        let mut runtime = runtime();
        runtime.replicas = ReplicaOptions {
            device_profile: DeviceProfile::Hdd,
            scratch_bytes: 10 * 32 * BLOCK as u64,
            duplicate_copies: 10,
            ..ReplicaOptions::default()
        };
        let engine = Engine::open_with(
            Arc::new(storage.clone()) as Arc<dyn Storage>,
            Some(config()),
            runtime,
            OpenMode::ReadWrite,
        )?;
        let disk = engine.volume_id("disk")?;
        let other = engine.volume_id("other")?;
        let mut block = vec![0u8; BLOCK];
        let expect = |block: &[u8], index: u64, context: &str| {
            let at = index as usize * BLOCK;
            assert!(
                block[..] == model["disk"][at..at + BLOCK],
                "{context}: block {index} reads back"
            );
        };
        for _day in 0..2 {
            for &index in &popular {
                engine.read(disk, index * BLOCK as u64, &mut block)?;
                expect(&block, index, "a popular read");
            }
            engine.duplicate_popular()?;
        }
        // The head at the far end of the layout, then the popular blocks: some come from
        // duplicates.
        for &index in &popular {
            engine.read(other, (600 + 7 * 40) * BLOCK as u64, &mut block)?;
            engine.read(disk, index * BLOCK as u64, &mut block)?;
            expect(&block, index, "a read after duplication");
        }
        for &index in &overwritten {
            engine.write(disk, index * BLOCK as u64, &new_bytes(index), false)?;
        }
        engine.flush()?;
        engine.checkpoint()?;
        for &index in &overwritten {
            engine.read(disk, index * BLOCK as u64, &mut block)?;
            assert!(block == new_bytes(index), "an overwritten block reads new");
        }
        Ok(())
    };
    let images = sweep(
        &base,
        &duplicating,
        &|image, context| {
            let engine = open(image, OpenMode::ReadWrite)
                .unwrap_or_else(|error| panic!("{context}: open: {error}"));
            assert!(
                image.list(SCRATCH_DIRECTORY).unwrap().is_empty(),
                "{context}: scratch files are removed at open"
            );
            let mut block = vec![0u8; BLOCK];
            for (name, bytes) in &model {
                let id = engine.volume_id(name).unwrap();
                for index in 0..VOLUME_BLOCKS {
                    engine
                        .read(id, index * BLOCK as u64, &mut block)
                        .unwrap_or_else(|error| panic!("{context}: {name} {index}: {error}"));
                    let at = index as usize * BLOCK;
                    let old = block[..] == bytes[at..at + BLOCK];
                    let new =
                        name == "disk" && overwritten.contains(&index) && block == new_bytes(index);
                    assert!(old || new, "{context}: block {index} of {name}");
                }
            }
            let report = engine
                .check(CheckOptions {
                    repair: false,
                    read_data: true,
                })
                .unwrap_or_else(|error| panic!("{context}: check: {error}"));
            assert!(report.is_clean(), "{context}: {report:#?}");
        },
        CLEAN_AND_TORN,
        "selective duplication",
    );
    eprintln!("selective duplication: {images} crash images");
}
