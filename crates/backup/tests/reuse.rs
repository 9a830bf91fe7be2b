//! Reusing the stored form of chunks the series' newest backup holds (`reuse`): the bytes
//! written are those compression would have written, and a damaged predecessor does not
//! spread into new backups.

mod common;

use std::fs;
use std::sync::Arc;

use common::{
    assert_check_ok, create_report, first_image, next_image, open, restore_bytes, Random,
};
use onecopy_backup::{BackupStore, DedupMode, InlineReport};
use onecopy_core::storage::{LocalStorage, Storage};

fn create(store: &mut BackupStore, series: &str, data: &[u8], defer_reverse: bool) -> InlineReport {
    create_report(store, series, data, defer_reverse).inline
}

/// Goal: chunks of the previous backup are not compressed again, yet the new backup stores
/// the same bytes and restores exactly; method: back up two versions into one series, and the
/// second version into another series of a second store (nothing to reuse there), then
/// compare what each wrote and restore every version.
#[test]
fn reused_chunks_store_what_compression_would() {
    let mut random = Random(7);
    let first = first_image(&mut random, 2 << 20);
    let second = next_image(&mut random, &first);
    let scratch = tempfile::tempdir().expect("temporary directory");
    let mut store = open(local(&scratch, "one"), DedupMode::Revdedup);
    let initial = create(&mut store, "s", &first, false);
    assert_eq!(
        initial.reused_chunks, 0,
        "a first backup has no predecessor"
    );
    let reusing = create(&mut store, "s", &second, false);
    assert!(reusing.predecessor_chunks > 0);
    assert!(
        reusing.reused_raw_bytes * 2 > reusing.new_raw_bytes,
        "most chunks of the changed segments were reused: {reusing:?}"
    );
    assert!(reusing.reuse_read_bytes < reusing.reused_raw_bytes);

    let mut other = open(local(&scratch, "two"), DedupMode::Revdedup);
    create(&mut other, "s", &first, false);
    let fresh = create(&mut other, "t", &second, false);
    assert_eq!(fresh.reused_chunks, 0, "a new series has no predecessor");
    assert_eq!(fresh.new_raw_bytes, reusing.new_raw_bytes);
    assert_eq!(fresh.new_stored_bytes, reusing.new_stored_bytes);

    assert_eq!(restore_bytes(&store, "s", Some(1)), first);
    assert_eq!(restore_bytes(&store, "s", Some(2)), second);
    assert_check_ok(&mut store);
}

/// Goal: a damaged stored chunk in the predecessor is compressed afresh rather than copied;
/// method: flip bytes inside the first backup's containers, back up a version whose every
/// segment changed (deferring
/// reverse deduplication, which rightly refuses to repackage damaged chunks), and restore it
/// exactly.
#[test]
fn damaged_predecessor_falls_back_to_compression() {
    let scratch = tempfile::tempdir().expect("temporary directory");
    let root = scratch.path().join("repository");
    let storage: Arc<dyn Storage> = Arc::new(LocalStorage::create(&root).expect("storage"));
    let mut store = open(Arc::clone(&storage), DedupMode::Revdedup);
    let mut random = Random(11);
    let first = first_image(&mut random, 1 << 20);
    // One byte changed every 16 KiB: every segment of the second version is new (so its
    // restore reads none of the damaged containers), most of its chunks are not.
    let mut second = first.clone();
    for offset in (0..second.len()).step_by(16 << 10) {
        second[offset] ^= 1;
    }
    // The last segment may be shorter than 16 KiB.
    *second.last_mut().expect("not empty") ^= 1;
    create(&mut store, "s", &first, true);
    let mut damaged = 0;
    for entry in walk(&root.join("containers")) {
        let mut bytes = fs::read(&entry).expect("read container");
        // Flip a byte every 256 bytes past the container header: every stored chunk is hit.
        for offset in (4096..bytes.len().saturating_sub(4096)).step_by(256) {
            bytes[offset] ^= 0x55;
            damaged += 1;
        }
        fs::write(&entry, bytes).expect("write container");
    }
    assert!(damaged > 10);
    let report = create(&mut store, "s", &second, true);
    assert!(report.predecessor_chunks > 0);
    assert!(
        report.reused_chunks * 20 < report.predecessor_chunks,
        "damaged chunks were not reused: {report:?}"
    );
    assert_eq!(restore_bytes(&store, "s", Some(2)), second);
}

fn local(scratch: &tempfile::TempDir, name: &str) -> Arc<dyn Storage> {
    Arc::new(LocalStorage::create(scratch.path().join(name)).expect("storage"))
}

fn walk(directory: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in fs::read_dir(directory).expect("list") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}
