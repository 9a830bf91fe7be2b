//! Crash injection: power loss after every sync of create, reverse deduplication, deletion
//! and expiry, with torn writes, must leave a store that checks clean and restores every
//! completed backup byte-exact.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::*;
use onecopy_backup::{BackupStore, CheckOptions, DedupMode, DeleteMethod};
use onecopy_core::storage::{CrashMode, SimulatedStorage, Storage};

const READ_DATA: CheckOptions = CheckOptions {
    read_data: true,
    repair: false,
};

/// What the scenario finished before the crash: version -> image of the backups that exist
/// for sure, plus the operation in flight.
#[derive(Default)]
struct Model {
    present: BTreeMap<u32, Vec<u8>>,
    /// A version whose create or delete was interrupted: it may or may not exist.
    uncertain: Option<(u32, Vec<u8>)>,
    /// Damage was injected (restores of the data it hit may fail as recorded losses).
    damaged: bool,
}

fn scenario_images() -> Vec<Vec<u8>> {
    let mut random = Random(21);
    let mut images = vec![first_image(&mut random, 160 << 10)];
    for _ in 0..5 {
        let next = next_image(&mut random, images.last().unwrap());
        images.push(next);
    }
    images
}

/// Creates four versions (each reverse-deduplicating the previous), deletes version 2 by
/// time stamp, creates a fifth, expires to three by mark and sweep, creates a sixth; records
/// in `model` what completed.
fn scenario(storage: Arc<dyn Storage>, mode: DedupMode, images: &[Vec<u8>], model: &mut Model) {
    let Ok(mut store) = BackupStore::open(
        storage,
        onecopy_backup::OpenOptions {
            store: Some(small_options(mode)),
            runtime: small_runtime(),
            read_only: false,
        },
    ) else {
        return;
    };
    let create = |store: &mut BackupStore, model: &mut Model, version: u32| -> bool {
        let image = &images[version as usize - 1];
        model.uncertain = Some((version, image.clone()));
        let created = store.create_backup(
            "vm",
            onecopy_backup::BackupSource::Reader {
                reader: Box::new(std::io::Cursor::new(image.clone())),
                name: "image".into(),
            },
            Default::default(),
        );
        match created {
            Ok(report) => {
                assert_eq!(report.version, version);
                model.present.insert(version, image.clone());
                model.uncertain = None;
                true
            }
            Err(_) => false,
        }
    };
    let delete = |store: &mut BackupStore, model: &mut Model, version: u32, method| -> bool {
        let image = model
            .present
            .remove(&version)
            .expect("deleting a present version");
        model.uncertain = Some((version, image));
        match store.delete("vm", version, Some(method)) {
            Ok(_) => {
                model.uncertain = None;
                true
            }
            Err(_) => false,
        }
    };
    for version in 1..=4 {
        if !create(&mut store, model, version) {
            return;
        }
    }
    if !delete(&mut store, model, 2, DeleteMethod::Timestamp) || !create(&mut store, model, 5) {
        return;
    }
    for version in [1, 3] {
        if !delete(&mut store, model, version, DeleteMethod::MarkAndSweep) {
            return;
        }
    }
    create(&mut store, model, 6);
}

fn verify(storage: Arc<dyn Storage>, mode: DedupMode, model: &Model, label: &str) {
    let mut store = open(storage, mode);
    let report = store.check(READ_DATA).expect("check runs");
    assert!(
        report.is_clean(),
        "{label}: check failed: {:#?}",
        report.findings
    );
    let listed: Vec<u32> = store
        .list(None)
        .unwrap()
        .iter()
        .map(|backup| backup.version)
        .collect();
    for (version, image) in &model.present {
        assert!(
            listed.contains(version),
            "{label}: version {version} is missing"
        );
        assert!(
            restore_bytes(&store, "vm", Some(*version)) == *image,
            "{label}: version {version} differs"
        );
    }
    for version in &listed {
        if !model.present.contains_key(version) {
            let (uncertain, image) = model
                .uncertain
                .as_ref()
                .unwrap_or_else(|| panic!("{label}: version {version} exists but never completed"));
            assert_eq!(uncertain, version, "{label}");
            assert!(
                restore_bytes(&store, "vm", Some(*version)) == *image,
                "{label}: version {version} differs"
            );
        }
    }
    // The next change recovers: leftovers go, and the store still checks clean.
    store.recover().unwrap();
    store.sweep().unwrap();
    let report = store.check(READ_DATA).unwrap();
    assert!(
        report.findings.is_empty(),
        "{label}: after recovery: {:#?}",
        report.findings
    );
}

fn crash_everywhere(mode: DedupMode) {
    let images = scenario_images();
    let total_syncs = {
        let storage = SimulatedStorage::new();
        let mut model = Model::default();
        scenario(Arc::new(storage.clone()), mode, &images, &mut model);
        assert_eq!(
            model.present.len(),
            3,
            "the scenario completes without a crash"
        );
        storage.sync_count()
    };
    for crash_at in 1..=total_syncs {
        let storage = SimulatedStorage::new();
        storage.crash_after_syncs(crash_at);
        let mut model = Model::default();
        scenario(Arc::new(storage.clone()), mode, &images, &mut model);
        let seed = crash_at * 7919;
        let after: Arc<dyn Storage> = Arc::new(storage.crash(CrashMode::Torn { seed }));
        verify(
            after,
            mode,
            &model,
            &format!("{mode:?} crash after sync {crash_at} of {total_syncs}"),
        );
    }
}

/// Goal: RevDedup survives power loss at every sync. Method: see the module documentation.
#[test]
fn revdedup_survives_crash_at_every_sync() {
    crash_everywhere(DedupMode::Revdedup);
}

/// Goal: the conventional baseline survives power loss at every sync too.
#[test]
fn conventional_survives_crash_at_every_sync() {
    crash_everywhere(DedupMode::Conventional);
}

/// Leaves `count` containers no record names at the ids the next operation would allocate,
/// as a create that died before its commit does, and makes them durable.
fn leave_orphan_containers(storage: &Arc<dyn Storage>, count: u64) {
    leave_orphan_containers_at(storage, &(0..count).collect::<Vec<_>>());
}

/// Leaves containers no record names at the ids `offsets` above the highest container (0 is
/// the id the next operation would allocate): with gaps, as parallel uploads to object
/// storage leave them when the client dies.
fn leave_orphan_containers_at(storage: &Arc<dyn Storage>, offsets: &[u64]) {
    let next = container_files(storage)
        .iter()
        .map(|name| u64::from_str_radix(name.rsplit('/').next().unwrap(), 16).unwrap())
        .max()
        .unwrap()
        + 1;
    let containers = onecopy_core::container::ContainerStore::new(
        Arc::clone(storage),
        "containers",
        small_options(DedupMode::Revdedup).container_options(),
    )
    .unwrap();
    for id in offsets.iter().map(|offset| next + offset) {
        let mut writer = containers.create(id, 0).unwrap();
        let data = vec![id as u8 + 1; 3000];
        writer
            .append(
                &onecopy_core::fingerprint::FingerprintAlgorithm::Blake3.hash(&data),
                &data,
                0,
            )
            .unwrap();
        writer.seal(0).unwrap();
    }
}

/// Goal: recovery removes every orphan container of a command that died with uploads in
/// flight, whose ids have gaps (parallel uploads finish in any order), so the next create
/// allocates them again without "already exists". Method: leave orphans at the next id
/// plus 1, 4 and 12 (gaps of 1, 2 and 7 ids), recover, check that none is left, back up data
/// that needs several containers, check and restore.
#[test]
fn orphans_after_gaps_are_removed() {
    let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
    let mut random = Random(7);
    let first = first_image(&mut random, 100 << 10);
    let mut store = open(Arc::clone(&storage), DedupMode::Revdedup);
    backup_bytes(&mut store, "vm", &first, false);
    drop(store);
    let committed = container_files(&storage);
    leave_orphan_containers_at(&storage, &[1, 4, 12]);
    assert_eq!(container_files(&storage).len(), committed.len() + 3);

    let mut store = open(Arc::clone(&storage), DedupMode::Revdedup);
    let report = store.recover().unwrap();
    assert_eq!(report.orphan_containers_removed, 3);
    assert_eq!(container_files(&storage), committed);
    let mut second = vec![0u8; 700 << 10];
    Random(8).fill(&mut second);
    backup_bytes(&mut store, "vm", &second, false);
    assert_check_ok(&mut store);
    assert_eq!(restore_bytes(&store, "vm", Some(1)), first);
    assert_eq!(restore_bytes(&store, "vm", Some(2)), second);
}

/// Goal: recovery is idempotent and complete after a crash at any point of itself: the
/// orphan containers of an interrupted create are all removed by the next command, which
/// then allocates their ids again without "already exists" (removing in ascending order
/// would leave a gap at which the next probe stops). Method:
/// leave four orphans, run recovery and a create that needs several containers with a crash
/// after every sync (torn writes), reopen, create again, check and restore.
#[test]
fn interrupted_recovery_finishes() {
    let first = {
        let mut random = Random(99);
        first_image(&mut random, 100 << 10)
    };
    let second = {
        let mut data = vec![0u8; 700 << 10];
        Random(100).fill(&mut data);
        data
    };
    let prepared = SimulatedStorage::new();
    {
        let shared: Arc<dyn Storage> = Arc::new(prepared.clone());
        let mut store = open(Arc::clone(&shared), DedupMode::Revdedup);
        backup_bytes(&mut store, "vm", &first, true);
        drop(store);
        leave_orphan_containers(&shared, 4);
    }
    let run = |storage: Arc<dyn Storage>| {
        let Ok(mut store) = BackupStore::open(
            storage,
            onecopy_backup::OpenOptions {
                store: Some(small_options(DedupMode::Revdedup)),
                runtime: small_runtime(),
                read_only: false,
            },
        ) else {
            return;
        };
        if store.recover().is_ok() {
            let _ = store.create_backup(
                "vm",
                onecopy_backup::BackupSource::Reader {
                    reader: Box::new(std::io::Cursor::new(second.clone())),
                    name: "second".into(),
                },
                onecopy_backup::CreateOptions {
                    defer_reverse: true,
                    ..Default::default()
                },
            );
        }
    };
    let total_syncs = {
        let copy = prepared.crash(CrashMode::Clean);
        let before = copy.sync_count();
        run(Arc::new(copy.clone()));
        copy.sync_count() - before
    };
    assert!(total_syncs > 6, "the run syncs: {total_syncs}");
    for crash_at in 1..=total_syncs {
        let copy = prepared.crash(CrashMode::Clean);
        copy.crash_after_syncs(crash_at);
        run(Arc::new(copy.clone()));
        let after: Arc<dyn Storage> = Arc::new(copy.crash(CrashMode::Torn { seed: crash_at }));
        let label = format!("crash after sync {crash_at} of {total_syncs}");
        let mut store = open(Arc::clone(&after), DedupMode::Revdedup);
        let versions: Vec<u32> = store
            .list(None)
            .unwrap()
            .iter()
            .map(|b| b.version)
            .collect();
        let created = store
            .create_backup(
                "vm",
                onecopy_backup::BackupSource::Reader {
                    reader: Box::new(std::io::Cursor::new(second.clone())),
                    name: "again".into(),
                },
                onecopy_backup::CreateOptions {
                    defer_reverse: true,
                    ..Default::default()
                },
            )
            .unwrap_or_else(|error| panic!("{label}: {error}"));
        assert_eq!(restore_bytes(&store, "vm", Some(1)), first, "{label}");
        for version in versions.iter().skip(1) {
            assert_eq!(
                restore_bytes(&store, "vm", Some(*version)),
                second,
                "{label}"
            );
        }
        assert_eq!(
            restore_bytes(&store, "vm", Some(created.version)),
            second,
            "{label}"
        );
        let report = store.check(READ_DATA).unwrap();
        assert!(report.findings.is_empty(), "{label}: {report:#?}");
    }
}

/// The maintenance scenario: four versions (reverse-deduplicated), version 2 deleted by time
/// stamp, a compaction, then the first chunk of every container damaged (and synced) and a
/// repair, then a deletion of version 1 and an expiry to one backup; records in `model` what
/// completed.
fn maintenance(storage: Arc<dyn Storage>, images: &[Vec<u8>], model: &mut Model) {
    let Ok(mut store) = BackupStore::open(
        Arc::clone(&storage),
        onecopy_backup::OpenOptions {
            store: Some(small_options(DedupMode::Revdedup)),
            runtime: small_runtime(),
            read_only: false,
        },
    ) else {
        return;
    };
    for version in 1..=4u32 {
        let image = images[version as usize - 1].clone();
        model.uncertain = Some((version, image.clone()));
        let created = store.create_backup(
            "vm",
            onecopy_backup::BackupSource::Reader {
                reader: Box::new(std::io::Cursor::new(image.clone())),
                name: "image".into(),
            },
            Default::default(),
        );
        if created.is_err() {
            return;
        }
        model.present.insert(version, image);
        model.uncertain = None;
    }
    let image = model.present.remove(&2).unwrap();
    model.uncertain = Some((2, image));
    if store
        .delete("vm", 2, Some(DeleteMethod::Timestamp))
        .is_err()
    {
        return;
    }
    model.uncertain = None;
    let Ok(plan) = store.plan_compact() else {
        return;
    };
    if store.compact(plan).is_err() {
        return;
    }
    // Damage: one bit of the first chunk of every container, made durable.
    let down = || storage.open("catalog.redb", false).is_err();
    if down() {
        return; // The machine went down in a step whose error is not reported.
    }
    model.damaged = true;
    for name in container_files(&storage) {
        if down() {
            return;
        }
        let first = container_records(&storage, &name)[0];
        flip_byte(&storage, &name, first.stored + 1, 0x04);
        if storage
            .open(&name, false)
            .and_then(|file| file.sync_data())
            .is_err()
        {
            return;
        }
    }
    if store.check(REPAIR).is_err() {
        return;
    }
    let image = model.present.remove(&1).unwrap();
    model.uncertain = Some((1, image));
    if store
        .delete("vm", 1, Some(DeleteMethod::Timestamp))
        .is_err()
    {
        return;
    }
    model.uncertain = None;
    let image = model.present.remove(&3).unwrap();
    model.uncertain = Some((3, image));
    if store
        .expire("vm", Some(1), Some(DeleteMethod::Timestamp))
        .is_ok()
    {
        model.uncertain = None;
    }
}

const REPAIR: CheckOptions = CheckOptions {
    read_data: true,
    repair: true,
};

/// Goal: compaction, repair and the deletions around them survive power loss at every
/// sync: after reopening and a repair, every backup that exists restores byte for byte or,
/// for data the injected damage destroyed, fails as a recorded loss, and check finds
/// nothing but recorded losses. Method: the maintenance scenario with a crash after every
/// sync (torn writes).
#[test]
fn maintenance_survives_crash_at_every_sync() {
    let mut random = Random(31);
    let mut images = vec![first_image(&mut random, 200 << 10)];
    for _ in 0..3 {
        let next = next_image(&mut random, images.last().unwrap());
        images.push(next);
    }
    let total_syncs = {
        let storage = SimulatedStorage::new();
        let mut model = Model::default();
        maintenance(Arc::new(storage.clone()), &images, &mut model);
        assert!(
            model.damaged && model.uncertain.is_none(),
            "the scenario completes"
        );
        // The damage costs data that the last backup still needs.
        let mut store = open(Arc::new(storage.clone()), DedupMode::Revdedup);
        let report = store.check(READ_DATA).unwrap();
        assert_eq!(
            report.status(),
            onecopy_backup::ExitStatus::DataLost,
            "{report:#?}"
        );
        storage.sync_count()
    };
    for crash_at in 1..=total_syncs {
        let storage = SimulatedStorage::new();
        storage.crash_after_syncs(crash_at);
        let mut model = Model::default();
        maintenance(Arc::new(storage.clone()), &images, &mut model);
        let after: Arc<dyn Storage> = Arc::new(storage.crash(CrashMode::Torn {
            seed: crash_at * 131,
        }));
        let label = format!("crash after sync {crash_at} of {total_syncs}");
        let mut store = open(after, DedupMode::Revdedup);
        let report = store.check(REPAIR).unwrap();
        assert_ne!(
            report.status(),
            onecopy_backup::ExitStatus::Problems,
            "{label}: {report:#?}"
        );
        let report = store.check(READ_DATA).unwrap();
        assert!(
            report
                .findings
                .iter()
                .all(|finding| finding.kind == onecopy_backup::FindingKind::Lost),
            "{label}: {report:#?}"
        );
        let listed: Vec<u32> = store
            .list(None)
            .unwrap()
            .iter()
            .map(|b| b.version)
            .collect();
        for version in &listed {
            let expected = model
                .present
                .get(version)
                .or(model
                    .uncertain
                    .as_ref()
                    .filter(|(uncertain, _)| uncertain == version)
                    .map(|(_, image)| image))
                .unwrap_or_else(|| panic!("{label}: version {version} should not exist"));
            let buffer = SharedBuffer::default();
            match store.restore(
                "vm",
                Some(*version),
                onecopy_backup::RestoreTarget::Writer(Box::new(buffer.clone())),
            ) {
                Ok(_) => assert!(
                    *buffer.0.lock().unwrap() == *expected,
                    "{label}: version {version} differs"
                ),
                Err(onecopy_backup::BackupError::Lost { .. }) if model.damaged => {}
                Err(error) => panic!("{label}: version {version}: {error}"),
            }
        }
        for version in model.present.keys() {
            assert!(
                listed.contains(version),
                "{label}: version {version} is missing"
            );
        }
    }
}
