//! Reverse deduplication: restores are identical before and after, and stored bytes drop.

mod common;

use std::sync::Arc;

use common::*;
use onecopy_backup::DedupMode;
use onecopy_core::storage::{SimulatedStorage, Storage};

/// Goal: every version restores byte-exact with reverse deduplication deferred, then after it
/// runs; the store shrinks and check passes. Method: six versions of a mutating image.
#[test]
fn restores_identical_before_and_after_reverse() {
    let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
    let mut store = open(storage, DedupMode::Revdedup);
    let mut random = Random(7);
    let mut images = vec![first_image(&mut random, 600 << 10)];
    for _ in 0..5 {
        let next = next_image(&mut random, images.last().unwrap());
        images.push(next);
    }
    for image in &images {
        backup_bytes(&mut store, "vm", image, true);
    }
    for (index, image) in images.iter().enumerate() {
        assert!(
            restore_bytes(&store, "vm", Some(index as u32 + 1)) == *image,
            "version {} before",
            index + 1
        );
    }
    assert_check_ok(&mut store);
    let before = store.stats().unwrap();
    let reports = store.reverse_pending_backups("vm").unwrap();
    assert_eq!(reports.len(), 5);
    assert!(reports.iter().all(|report| report.plan.indirect_chunks > 0));
    for (index, image) in images.iter().enumerate() {
        assert!(
            restore_bytes(&store, "vm", Some(index as u32 + 1)) == *image,
            "version {} after",
            index + 1
        );
    }
    assert_check_ok(&mut store);
    let after = store.stats().unwrap();
    let stored = |stats: &onecopy_backup::StoreStats| {
        stats.container_bytes_shared + stats.container_bytes_archival
    };
    assert!(
        stored(&after) < stored(&before),
        "{} !< {}",
        stored(&after),
        stored(&before)
    );
    assert_eq!(after.archival_backups, 5);
}

/// The 40 small files of [`write_grouped_tree`].
fn small_file(n: usize) -> std::path::PathBuf {
    std::path::Path::new("a").join(format!("f{n:03}"))
}

/// A tree of 40 files of 3 KiB (their segments group files up to the minimum segment size)
/// and then the `large` files (name, bytes: segments of their own), all of random bytes.
fn write_grouped_tree(root: &std::path::Path, random: &mut Random, large: &[(&str, usize)]) {
    std::fs::create_dir_all(root.join("a")).unwrap();
    for n in 0..40 {
        let mut bytes = vec![0u8; 3 << 10];
        random.fill(&mut bytes);
        std::fs::write(root.join(small_file(n)), bytes).unwrap();
    }
    for &(name, length) in large {
        let mut bytes = vec![0u8; length];
        random.fill(&mut bytes);
        std::fs::write(root.join(name), bytes).unwrap();
    }
}

/// A store of uncompressed 512 KiB containers, so that the tests place files in them.
fn open_grouped(storage: Arc<dyn Storage>) -> onecopy_backup::BackupStore {
    open_with(
        storage,
        onecopy_backup::StoreOptions {
            container_bytes: 512 << 10,
            compression_level: None,
            ..small_options(DedupMode::Revdedup)
        },
    )
}

fn create_tree(
    store: &mut onecopy_backup::BackupStore,
    root: &std::path::Path,
    defer_reverse: bool,
) -> onecopy_backup::CreateReport {
    store
        .create_backup(
            "tree",
            onecopy_backup::BackupSource::Directory(root.to_path_buf()),
            onecopy_backup::CreateOptions {
                defer_reverse,
                ..onecopy_backup::CreateOptions::default()
            },
        )
        .unwrap()
}

/// Restores `version` under `scratch` and asserts that the small files and the `large` ones
/// are those of `root`; returns where it restored.
fn assert_restores_tree(
    store: &onecopy_backup::BackupStore,
    scratch: &std::path::Path,
    root: &std::path::Path,
    version: u32,
    large: &[&str],
) -> std::path::PathBuf {
    let target = scratch.join(format!("restored-{version}"));
    store
        .restore(
            "tree",
            Some(version),
            onecopy_backup::RestoreTarget::Directory(target.clone()),
        )
        .unwrap();
    let names = (0..40).map(small_file);
    for name in names.chain(large.iter().map(std::path::PathBuf::from)) {
        assert_eq!(
            std::fs::read(target.join(&name)).unwrap(),
            std::fs::read(root.join(&name)).unwrap(),
            "{name:?} of version {version}"
        );
    }
    target
}

/// Goal: a container that reverse deduplication leaves with at least a tenth of garbage is
/// rewritten at once, one with less is left for `backup compact`, and every version restores
/// either way. Method: a file added first in a group of small files makes the next backup
/// store the group's files in new segments; every chunk of the old group's segments is in
/// the new backup, so those segments die in the first container, whose large file stays
/// referenced (the tree, which does change, is in a later container). A file of 2 KiB
/// shifts every group (about 120 of the container's 510 KiB die), one of a few bytes only
/// the first (about 33 KiB).
#[test]
fn reverse_deduplication_rewrites_containers_left_with_garbage() {
    let large = [("b-big", 400 << 10), ("c-big", 400 << 10)];
    for (added_bytes, rewritten) in [(2 << 10, true), (35, false)] {
        let scratch = tempfile::tempdir().unwrap();
        let mut store = open_grouped(Arc::new(
            onecopy_core::storage::LocalStorage::create(scratch.path().join("repository")).unwrap(),
        ));
        let root = scratch.path().join("tree");
        write_grouped_tree(&root, &mut Random(added_bytes as u64), &large);
        create_tree(&mut store, &root, false);
        std::fs::write(root.join("a").join("f"), vec![7u8; added_bytes]).unwrap();
        let report = create_tree(&mut store, &root, false);
        let reverse = &report.reverse[0];
        assert!(reverse.plan.settlement.segments_died > 0, "{added_bytes}");
        assert_eq!(reverse.compact_error, None);
        let after = store.stats().unwrap();
        let left = store.plan_compact().unwrap();
        if rewritten {
            let compact = reverse
                .compact
                .as_ref()
                .expect("the container was rewritten");
            assert_eq!(compact.containers_rewritten, 1);
            assert!(compact.reclaimed_bytes >= 100 << 10, "{compact:?}");
            assert!(left.containers.is_empty(), "{left:?}");
            assert_eq!(after.compactable_bytes, 0);
        } else {
            assert!(reverse.compact.is_none(), "{:?}", reverse.compact);
            assert_eq!(left.containers.len(), 1, "{left:?}");
            let garbage = &left.containers[0];
            assert!((garbage.bytes - garbage.bytes_after) * 10 < garbage.bytes);
            assert_eq!(after.compactable_bytes, garbage.bytes - garbage.bytes_after);
        }
        for version in [1, 2] {
            let target =
                assert_restores_tree(&store, scratch.path(), &root, version, &["b-big", "c-big"]);
            assert_eq!(target.join("a").join("f").exists(), version == 2);
        }
        assert_check_ok(&mut store);
    }
}

/// Goal: when the disk has no room for the rewrite that follows a reverse deduplication, the
/// reverse deduplication stays committed, says why the rewrite stopped, leaves nothing but
/// the garbage, and `backup compact` frees it once there is room. Method: the tree of the
/// test above with one large file filling the first container, so that the changed tree
/// is alone in the second; the second backup's reverse deduplication runs on a simulated
/// storage with a little more room than it uses, less than the rewrite needs.
#[test]
fn a_rewrite_without_room_leaves_the_reverse_deduplication_committed() {
    let scratch = tempfile::tempdir().unwrap();
    let simulated = SimulatedStorage::new();
    let mut store = open_grouped(Arc::new(simulated.clone()));
    let root = scratch.path().join("tree");
    write_grouped_tree(&root, &mut Random(3), &[("b-big", 390 << 10)]);
    create_tree(&mut store, &root, true);
    std::fs::write(root.join("a").join("f"), vec![7u8; 2 << 10]).unwrap();
    create_tree(&mut store, &root, true);
    let plan = store.plan_reverse("tree", 1).unwrap();
    assert!(plan.settlement.segments_died > 0);
    assert_eq!(
        plan.settlement.garbage_containers.len(),
        1,
        "{:?}",
        plan.settlement.dropped_containers
    );
    assert!(
        plan.settlement.copy_shared_bytes < 16 << 10,
        "the evacuated container holds little besides the tree: {}",
        plan.settlement.copy_shared_bytes
    );
    let limit = 1u64 << 40;
    simulated.set_capacity(Some(limit));
    let used = limit - simulated.available_bytes().unwrap().unwrap();
    simulated.set_capacity(Some(used + (64 << 10)));
    let report = store.execute_reverse(plan).unwrap();
    assert!(report.compact.is_none());
    let error = report.compact_error.expect("the rewrite found no room");
    assert!(error.contains("No space left"), "{error}");
    simulated.set_capacity(None);
    assert_check_ok(&mut store);
    let left = store.plan_compact().unwrap();
    assert_eq!(left.containers.len(), 1, "{left:?}");
    let freed = store.compact(left).unwrap();
    assert!(freed.reclaimed_bytes >= 100 << 10, "{freed:?}");
    for version in [1, 2] {
        assert_restores_tree(&store, scratch.path(), &root, version, &["b-big"]);
    }
    assert_check_ok(&mut store);
}
