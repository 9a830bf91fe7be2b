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
