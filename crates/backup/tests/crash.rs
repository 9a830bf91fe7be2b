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
