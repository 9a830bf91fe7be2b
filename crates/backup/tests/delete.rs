//! Deletion: by time stamp and by mark and sweep, of oldest, middle, newest and live backups.

mod common;

use std::sync::Arc;

use common::*;
use onecopy_backup::{BackupStore, DedupMode, DeleteMethod, SeriesOptions};
use onecopy_core::storage::{SimulatedStorage, Storage};

fn images(seed: u64, count: usize) -> Vec<Vec<u8>> {
    let mut random = Random(seed);
    let mut images = vec![first_image(&mut random, 400 << 10)];
    for _ in 1..count {
        let next = next_image(&mut random, images.last().unwrap());
        images.push(next);
    }
    images
}

fn store_with(mode: DedupMode, images: &[Vec<u8>]) -> BackupStore {
    let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
    let mut store = open(storage, mode);
    for image in images {
        backup_bytes(&mut store, "vm", image, false);
    }
    store
}

fn assert_restores(store: &BackupStore, images: &[Vec<u8>], versions: &[u32]) {
    for &version in versions {
        let restored = restore_bytes(store, "vm", Some(version));
        assert!(
            restored == images[version as usize - 1],
            "version {version} differs"
        );
    }
}

/// Goal: expiring the oldest backups by time stamp and by mark and sweep leaves identical
/// restores of the survivors; the time stamp method reads no container, the sweep reads all
/// of them and leaves no more garbage. Method: two stores with the same eight versions.
#[test]
fn timestamp_and_mark_and_sweep_agree() {
    let images = images(11, 8);
    let mut by_timestamp = store_with(DedupMode::Revdedup, &images);
    let mut by_sweep = store_with(DedupMode::Revdedup, &images);
    let timestamp_reports = by_timestamp
        .expire("vm", Some(3), Some(DeleteMethod::Timestamp))
        .unwrap();
    let sweep_reports = by_sweep
        .expire("vm", Some(3), Some(DeleteMethod::MarkAndSweep))
        .unwrap();
    assert_eq!(timestamp_reports.len(), 5);
    assert_eq!(sweep_reports.len(), 5);
    for report in &timestamp_reports {
        assert_eq!(
            report.copy.containers_read, 0,
            "deleting the oldest copies nothing"
        );
        assert!(report.sweep.is_none());
    }
    assert!(timestamp_reports.iter().any(|report| !report
        .plan
        .settlement
        .dropped_containers
        .is_empty()));
    for report in &sweep_reports {
        let sweep = report.sweep.expect("a sweep ran");
        assert!(sweep.containers_scanned > 0);
    }
    for store in [&by_timestamp, &by_sweep] {
        assert_restores(store, &images, &[6, 7, 8]);
        assert_eq!(store.list(Some("vm")).unwrap().len(), 3);
    }
    assert_check_ok(&mut by_timestamp);
    assert_check_ok(&mut by_sweep);
    let garbage = |store: &BackupStore| store.stats().unwrap().garbage_bytes;
    assert!(garbage(&by_sweep) <= garbage(&by_timestamp));
}

/// Goal: deleting a middle archival version, then the newest (live) one, keeps every other
/// version byte-exact; the next backup reverse-deduplicates the new newest again. Method:
/// delete 3, then 6 of six versions, add a seventh.
#[test]
fn delete_middle_and_newest() {
    let mut images = images(12, 6);
    let mut store = store_with(DedupMode::Revdedup, &images);
    store.delete("vm", 3, None).unwrap();
    assert_restores(&store, &images, &[1, 2, 4, 5, 6]);
    assert_check_ok(&mut store);
    store.delete("vm", 6, None).unwrap();
    assert_restores(&store, &images, &[1, 2, 4, 5]);
    assert_check_ok(&mut store);
    let mut random = Random(99);
    let seventh = next_image(&mut random, &images[4]);
    images.push(seventh.clone());
    let version = backup_bytes(&mut store, "vm", &seventh, false);
    assert_eq!(version, 7);
    assert!(store.pending_reverse("vm").unwrap().is_empty());
    assert_restores(&store, &images, &[1, 2, 4, 5, 7]);
    assert_check_ok(&mut store);
}

/// Goal: with a live window of three, deleting a live version in the middle of the window and
/// the oldest live one keeps the others exact. Method: five versions, delete 4 then 3.
#[test]
fn delete_live_versions() {
    let images = images(13, 5);
    let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
    let mut store = open(storage, DedupMode::Revdedup);
    for image in &images {
        store
            .create_backup(
                "vm",
                onecopy_backup::BackupSource::Reader {
                    reader: Box::new(std::io::Cursor::new(image.clone())),
                    name: "image".into(),
                },
                onecopy_backup::CreateOptions {
                    series_options: Some(SeriesOptions {
                        live_window: 3,
                        retention: None,
                    }),
                    ..Default::default()
                },
            )
            .unwrap();
    }
    store.delete("vm", 4, None).unwrap();
    assert_restores(&store, &images, &[1, 2, 3, 5]);
    assert_check_ok(&mut store);
    store.delete("vm", 3, None).unwrap();
    assert_restores(&store, &images, &[1, 2, 5]);
    assert_check_ok(&mut store);
}

/// Goal: the conventional baseline (4 KiB-style chunk dedup, no reverse) stores, deletes by
/// mark and sweep and restores exactly. Method: five versions, expire to two.
#[test]
fn conventional_mode_round_trip() {
    let images = images(14, 5);
    let mut store = store_with(DedupMode::Conventional, &images);
    assert_restores(&store, &images, &[1, 3, 5]);
    assert!(store
        .list(Some("vm"))
        .unwrap()
        .iter()
        .all(|backup| !backup.reverse_pending));
    let reports = store.expire("vm", Some(2), None).unwrap();
    assert!(reports
        .iter()
        .all(|report| report.method == DeleteMethod::MarkAndSweep));
    assert_restores(&store, &images, &[4, 5]);
    assert_check_ok(&mut store);
}

/// Goal: `plan_expire` names exactly the versions `expire` then deletes, changes nothing, and
/// refuses what `expire` refuses (keeping none, no window). Method: plan twice, compare with
/// the reports of the expiry that follows.
#[test]
fn expire_carries_out_its_plan() {
    let images = images(15, 5);
    let mut store = store_with(DedupMode::Revdedup, &images);
    let plan = store.plan_expire("vm", Some(2)).unwrap();
    assert_eq!(plan.versions, vec![1, 2, 3]);
    assert_eq!(plan.policy.keep_last, 2);
    assert_eq!(plan.kept.len(), 2);
    assert_eq!(
        store.plan_expire("vm", Some(2)).unwrap(),
        plan,
        "planning changes nothing"
    );
    assert_eq!(store.list(Some("vm")).unwrap().len(), 5);
    assert!(store.plan_expire("vm", Some(0)).is_err());
    assert!(
        store.plan_expire("vm", None).is_err(),
        "no retention window"
    );
    assert!(store
        .plan_expire("vm", Some(9))
        .unwrap()
        .versions
        .is_empty());
    let reports = store.expire("vm", Some(2), None).unwrap();
    let deleted: Vec<u32> = reports.iter().map(|report| report.plan.version).collect();
    assert_eq!(deleted, plan.versions);
    assert_restores(&store, &images, &[4, 5]);
}
