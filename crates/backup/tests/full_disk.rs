//! A full file system under the backup store, on a small tmpfs the test mounts (it runs as
//! root, as in CI; without root it fails saying so):
//!
//! - `create` fails with [`BackupError::Full`] and leaves nothing behind: no container, no
//!   half commit, a clean check;
//! - at 100% full, read-only work goes on: open, list, restore, check;
//! - deleting a backup works at 100% full (the reserve makes room for its commit) and frees
//!   space; what it leaves in containers still in use is reported exactly and `compact`
//!   frees it.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::*;
use onecopy_backup::{
    BackupError, BackupStore, CheckOptions, DedupMode, DeleteMethod, ExitStatus, OpenOptions,
    RuntimeOptions, StoreOptions,
};
use onecopy_core::storage::{LocalStorage, Storage};

/// A tmpfs mounted for the test, unmounted when dropped.
struct Tmpfs {
    path: PathBuf,
    _parent: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(bytes: u64) -> Tmpfs {
        let parent = tempfile::tempdir().unwrap();
        let path = parent.path().join("tmpfs");
        std::fs::create_dir(&path).unwrap();
        let output = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}")])
            .arg("tmpfs")
            .arg(&path)
            .output()
            .expect("running mount(8): install util-linux (mount) to run this test");
        assert!(
            output.status.success(),
            "this test mounts a tmpfs and needs root (as in CI): mount failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        Tmpfs {
            path,
            _parent: parent,
        }
    }

    fn free_bytes(&self) -> u64 {
        let path = std::ffi::CString::new(self.path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: statvfs writes into the zeroed struct; the path is NUL-terminated.
        let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::statvfs(path.as_ptr(), &mut stats) }, 0);
        stats.f_bavail * stats.f_frsize
    }

    /// Fills the file system to the last byte with a file outside the store.
    fn fill(&self) -> PathBuf {
        let filler = self.path.join("filler");
        let mut file = std::fs::File::create(&filler).unwrap();
        for block in [1 << 20, 4096, 1] {
            let data = vec![0x5a_u8; block];
            while file.write_all(&data).is_ok() {}
        }
        let _ = file.sync_all();
        assert_eq!(self.free_bytes(), 0, "the file system is full");
        filler
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(&self.path)
            .status();
    }
}

fn options(mode: DedupMode) -> StoreOptions {
    StoreOptions {
        compression_level: None,
        ..small_options(mode)
    }
}

fn runtime() -> RuntimeOptions {
    RuntimeOptions {
        reserve_bytes_min: 2 << 20,
        ..small_runtime()
    }
}

fn open_at(path: &Path, mode: DedupMode, read_only: bool) -> onecopy_backup::Result<BackupStore> {
    let storage: Arc<dyn Storage> = Arc::new(LocalStorage::create(path).unwrap());
    BackupStore::open(
        storage,
        OpenOptions {
            store: Some(options(mode)),
            runtime: runtime(),
            read_only,
        },
    )
}

fn create(store: &mut BackupStore, series: &str, data: &[u8]) -> onecopy_backup::Result<u32> {
    store
        .create_backup(
            series,
            onecopy_backup::BackupSource::Reader {
                reader: Box::new(std::io::Cursor::new(data.to_vec())),
                name: "data".into(),
            },
            Default::default(),
        )
        .map(|report| report.version)
}

fn random_bytes(seed: u64, bytes: usize) -> Vec<u8> {
    let mut data = vec![0u8; bytes];
    let mut random = Random(seed);
    for chunk in data.chunks_mut(8) {
        let value = random.next().to_le_bytes();
        chunk.copy_from_slice(&value[..chunk.len()]);
    }
    data
}

const READ_DATA: CheckOptions = CheckOptions {
    read_data: true,
    repair: false,
};

/// Goal: see the module documentation, in RevDedup mode. Method: [`full_disk`].
#[test]
fn full_disk_revdedup() {
    full_disk(DedupMode::Revdedup);
}

/// Goal: see the module documentation, in conventional mode, where every chunk is a segment
/// and a deletion's commit rewrites many catalog pages: without the reserve it fails with
/// ENOSPC. Method: [`full_disk`].
#[test]
fn full_disk_conventional() {
    full_disk(DedupMode::Conventional);
}

/// A 48 MiB tmpfs; versions of one series until a create fails, then a filler file to the
/// last byte; read-only work, deletions, a compaction, and a create again.
fn full_disk(mode: DedupMode) {
    let tmpfs = Tmpfs::mount(48 << 20);
    let root = tmpfs.path.join("backup");
    let mut store = open_at(&root, mode, false).unwrap();
    assert!(
        root.join("reserve").exists(),
        "the reserve is written at creation"
    );
    let mut images = Vec::new();
    let failure = loop {
        let mut image = images
            .last()
            .cloned()
            .unwrap_or_else(|| random_bytes(1, 3 << 20));
        // Each version rewrites a third of the image: a third is new.
        let start = image.len() / 3 * (images.len() % 3);
        image[start..start + (1 << 20)]
            .copy_from_slice(&random_bytes(images.len() as u64 + 10, 1 << 20));
        match create(&mut store, "vm", &image) {
            Ok(version) => {
                assert_eq!(version as usize, images.len() + 1);
                images.push(image);
            }
            Err(error) => break error,
        }
        assert!(images.len() < 100, "the file system never filled");
    };
    assert!(
        matches!(failure, BackupError::Full { .. }),
        "a full disk is BackupError::Full: {failure}"
    );
    let message = failure.to_string();
    assert!(
        message.contains("is full") && message.contains("nothing was committed"),
        "{message}"
    );
    assert!(images.len() >= 3, "some versions fit: {}", images.len());
    drop(store);

    // Nothing stranded: every container belongs to a committed backup.
    let report =
        BackupStore::check_at(Arc::new(LocalStorage::open(&root).unwrap()), READ_DATA).unwrap();
    assert!(report.findings.is_empty(), "{report:#?}");

    let filler = tmpfs.fill();
    // Read-only work at 100%.
    let store = open_at(&root, mode, true).unwrap();
    assert_eq!(store.list(None).unwrap().len(), images.len());
    assert_eq!(restore_bytes(&store, "vm", Some(1)), images[0]);
    assert_eq!(restore_bytes(&store, "vm", None), *images.last().unwrap());
    drop(store);
    let report =
        BackupStore::check_at(Arc::new(LocalStorage::open(&root).unwrap()), READ_DATA).unwrap();
    assert_eq!(report.status(), ExitStatus::Clean, "{report:#?}");

    // Deleting the oldest backup at 100% full: the commit finds room in the reserve.
    let mut store = open_at(&root, mode, false).unwrap();
    let deleted = store
        .delete("vm", 1, Some(DeleteMethod::Timestamp))
        .unwrap_or_else(|error| panic!("deleting on a full disk: {error}"));
    assert!(
        deleted.freed_bytes > 0 || deleted.compactable_bytes > 0,
        "a deletion frees space or says what compaction frees: {deleted:#?}"
    );
    // What the deletion freed is free, but for the reserve written again out of it.
    let reserve = std::fs::metadata(root.join("reserve")).map_or(0, |metadata| metadata.len());
    assert!(
        tmpfs.free_bytes() + reserve >= deleted.freed_bytes,
        "freed {} bytes, {} free, reserve {reserve}",
        deleted.freed_bytes,
        tmpfs.free_bytes()
    );
    // The second oldest too, then compaction gives back what the deletions left.
    store
        .delete("vm", 2, Some(DeleteMethod::Timestamp))
        .unwrap();
    let plan = store.plan_compact().unwrap();
    let reserve_bytes =
        || std::fs::metadata(root.join("reserve")).map_or(0, |metadata| metadata.len());
    let (free_before, reserve_before) = (tmpfs.free_bytes(), reserve_bytes());
    let compacted = store.compact(plan.clone()).unwrap();
    assert_eq!(compacted.reclaimed_bytes, plan.reclaimable_bytes);
    // The reserve, written again at the end, grows with the catalog out of what was freed.
    let reserve_grew = reserve_bytes().saturating_sub(reserve_before);
    assert!(
        tmpfs.free_bytes() + reserve_grew + (256 << 10) >= free_before + compacted.reclaimed_bytes,
        "compaction frees what it planned: {} before, {} after, {} planned, reserve grew by \
         {reserve_grew}",
        free_before,
        tmpfs.free_bytes(),
        compacted.reclaimed_bytes
    );
    assert!(store.plan_compact().unwrap().containers.is_empty());
    for (index, image) in images.iter().enumerate().skip(2) {
        assert_eq!(restore_bytes(&store, "vm", Some(index as u32 + 1)), *image);
    }
    drop(store);

    // With the filler gone and fewer versions kept there is room again: a create works, and
    // the store checks clean.
    std::fs::remove_file(filler).unwrap();
    let mut store = open_at(&root, mode, false).unwrap();
    store.expire("vm", Some(2), None).unwrap();
    let version = create(&mut store, "vm", &images[0]).unwrap();
    assert_eq!(restore_bytes(&store, "vm", Some(version)), images[0]);
    assert_check_ok(&mut store);
    assert!(root.join("reserve").exists(), "the reserve is back");
}
