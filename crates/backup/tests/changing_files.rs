//! Files that change while `backup create` reads them, and sources that must never be read:
//! the backup holds a version the file really had, or exactly the bytes read, with a warning
//! in the report (and so in `--json`); never zeros standing in for data. A FIFO is recorded,
//! never opened for reading, and refused as a source at once.

mod common;

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use common::*;
use onecopy_backup::tree::capture::{FileProblem, WalkOptions};
use onecopy_backup::{
    BackupError, BackupSource, BackupStore, CreateOptions, CreateReport, DedupMode, RestoreTarget,
    WalkedPaths,
};
use onecopy_core::storage::{LocalStorage, Storage};

const BIG_BYTES: usize = 3 << 20;

fn pattern(seed: u8, bytes: usize) -> Vec<u8> {
    let mut random = Random(seed as u64 + 1);
    let mut data = vec![0u8; bytes];
    random.fill(&mut data);
    data
}

/// A source with `big` (3 MiB) between two small files, and a store.
fn setup(scratch: &Path) -> (BackupStore, PathBuf) {
    let storage: Arc<dyn Storage> =
        Arc::new(LocalStorage::create(scratch.join("repository")).unwrap());
    let store = open(storage, DedupMode::Revdedup);
    let source = scratch.join("source");
    fs::create_dir(&source).unwrap();
    fs::write(source.join("a-first"), b"first").unwrap();
    fs::write(source.join("big"), pattern(1, BIG_BYTES)).unwrap();
    fs::write(source.join("z-last"), b"last").unwrap();
    (store, source)
}

/// Backs `source` up with `observer` watching the reads.
fn create_watched(
    store: &mut BackupStore,
    source: &Path,
    observer: &(dyn Fn(&[u8], u32, u64) + Sync),
) -> CreateReport {
    store
        .create_backup(
            "tree",
            BackupSource::Directory(source.to_path_buf()),
            CreateOptions {
                read_observer: Some(observer),
                ..CreateOptions::default()
            },
        )
        .unwrap()
}

/// Restores the newest backup and returns the restored `big`, checking the small files.
fn restored_big(store: &BackupStore, scratch: &Path) -> Vec<u8> {
    let target = scratch.join("restored");
    store
        .restore("tree", None, RestoreTarget::Directory(target.clone()))
        .unwrap();
    assert_eq!(fs::read(target.join("a-first")).unwrap(), b"first");
    assert_eq!(fs::read(target.join("z-last")).unwrap(), b"last");
    fs::read(target.join("big")).unwrap()
}

/// The one warning of `report`, checked to be about `big` with `problem`, also in JSON.
fn single_warning(report: &CreateReport, problem: FileProblem, json_problem: &str) -> String {
    assert_eq!(report.warnings.len(), 1, "{:?}", report.warnings);
    let warning = &report.warnings[0];
    assert_eq!(warning.path, "big");
    assert_eq!(warning.problem, problem);
    let json = serde_json::to_value(report).unwrap();
    assert_eq!(json["warnings"][0]["path"], "big");
    assert_eq!(json["warnings"][0]["problem"], json_problem);
    assert_eq!(json["warnings"][0]["message"], warning.message.as_str());
    warning.message.clone()
}

/// Sets the modification time of `path` to `seconds`, so a change is seen whatever the
/// clock's granularity.
fn set_mtime(path: &Path, seconds: i64) {
    let c_path = CString::new(path.as_os_str().as_bytes()).unwrap();
    let times = [
        libc::timespec {
            tv_sec: seconds,
            tv_nsec: 0,
        },
        libc::timespec {
            tv_sec: seconds,
            tv_nsec: 0,
        },
    ];
    // SAFETY: a valid path and two timespecs.
    let result = unsafe { libc::utimensat(libc::AT_FDCWD, c_path.as_ptr(), times.as_ptr(), 0) };
    assert_eq!(result, 0);
}

/// Goal: a file truncated while it is read is read again and restored as the truncated
/// version, never with zeros standing for the lost bytes, with a warning in the report and
/// its JSON. Method: truncate `big` to 256 KiB once 1 MiB of its first reading is delivered.
#[test]
fn a_file_truncated_while_read_is_read_again() {
    let scratch = tempfile::tempdir().unwrap();
    let (mut store, source) = setup(scratch.path());
    let big = source.join("big");
    let done = AtomicBool::new(false);
    let observer = |path: &[u8], reading: u32, delivered: u64| {
        if path == b"big"
            && reading == 1
            && delivered >= 1 << 20
            && !done.swap(true, Ordering::SeqCst)
        {
            fs::OpenOptions::new()
                .write(true)
                .open(&big)
                .unwrap()
                .set_len(256 << 10)
                .unwrap();
        }
    };
    let report = create_watched(&mut store, &source, &observer);
    assert!(done.load(Ordering::SeqCst));
    let message = single_warning(&report, FileProblem::ReadAgain, "read-again");
    assert!(message.contains("read again"), "{message}");
    let restored = restored_big(&store, scratch.path());
    assert!(
        restored == pattern(1, BIG_BYTES)[..256 << 10],
        "the truncated version"
    );
    assert_check_ok(&mut store);
}

/// Goal: a tree walked before the backup began (`backup create` walks while the store opens)
/// stores each file as its reading finds it: a file rewritten after the walk is restored with
/// the bytes and size read, not the walked size. Method: walk the source, rewrite `big` with
/// other bytes and a third of its size, then back the walked tree up.
#[test]
fn a_file_changed_after_the_walk_is_stored_as_read() {
    let scratch = tempfile::tempdir().unwrap();
    let (mut store, source) = setup(scratch.path());
    let walked = WalkedPaths::walk(std::slice::from_ref(&source), &WalkOptions::default()).unwrap();
    let big = source.join("big");
    fs::write(&big, pattern(2, 1 << 20)).unwrap();
    set_mtime(&big, 1_000_000);
    store
        .create_backup(
            "tree",
            BackupSource::Walked(walked),
            CreateOptions::default(),
        )
        .unwrap();
    let restored = restored_big(&store, scratch.path());
    assert!(restored == pattern(2, 1 << 20), "the version read");
    assert_check_ok(&mut store);
}

/// Goal: a file grown while it is read is read again and restored as the grown version.
/// Method: append 500 KiB to `big` once 1 MiB of its first reading is delivered.
#[test]
fn a_file_grown_while_read_is_read_again() {
    let scratch = tempfile::tempdir().unwrap();
    let (mut store, source) = setup(scratch.path());
    let big = source.join("big");
    let done = AtomicBool::new(false);
    let appended = pattern(2, 500 << 10);
    let observer = |path: &[u8], reading: u32, delivered: u64| {
        if path == b"big"
            && reading == 1
            && delivered >= 1 << 20
            && !done.swap(true, Ordering::SeqCst)
        {
            let file = fs::OpenOptions::new().write(true).open(&big).unwrap();
            file.write_all_at(&appended, BIG_BYTES as u64).unwrap();
        }
    };
    let report = create_watched(&mut store, &source, &observer);
    single_warning(&report, FileProblem::ReadAgain, "read-again");
    let mut expected = pattern(1, BIG_BYTES);
    expected.extend_from_slice(&appended);
    assert!(
        restored_big(&store, scratch.path()) == expected,
        "the grown version"
    );
}

/// Goal: a file rewritten in place during every reading is stored as exactly the bytes of
/// its last reading, with a warning that says so. Method: in each reading, once 1 MiB is
/// delivered, overwrite its first 64 KiB (already read) with pattern N and set a new
/// modification time; the last reading delivered pattern N-1 there and the original after.
#[test]
fn a_file_rewritten_during_every_reading_is_stored_as_read() {
    let scratch = tempfile::tempdir().unwrap();
    let (mut store, source) = setup(scratch.path());
    let big = source.join("big");
    let rewritten = std::sync::Mutex::new(0u32);
    let observer = |path: &[u8], reading: u32, delivered: u64| {
        let mut last = rewritten.lock().unwrap();
        if path == b"big" && delivered >= 1 << 20 && *last < reading {
            *last = reading;
            let file = fs::OpenOptions::new().write(true).open(&big).unwrap();
            file.write_all_at(&pattern(10 + reading as u8, 64 << 10), 0)
                .unwrap();
            set_mtime(&big, 1_000_000 + i64::from(reading));
        }
    };
    let report = create_watched(&mut store, &source, &observer);
    let readings = *rewritten.lock().unwrap();
    assert_eq!(readings, onecopy_backup::tree::capture::FILE_READINGS_MAX);
    let message = single_warning(&report, FileProblem::ChangedWhileRead, "changed-while-read");
    assert!(message.contains("may mix versions"), "{message}");
    let mut expected = pattern(1, BIG_BYTES);
    expected[..64 << 10].copy_from_slice(&pattern(10 + readings as u8 - 1, 64 << 10));
    assert!(
        restored_big(&store, scratch.path()) == expected,
        "exactly the bytes of the last reading"
    );
}

/// Runs `work` on a thread and fails the test if it takes longer than `limit` (a read that
/// blocks on a FIFO would otherwise hang the suite).
fn within<T: Send + 'static>(limit: Duration, work: impl FnOnce() -> T + Send + 'static) -> T {
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(work());
    });
    receiver
        .recv_timeout(limit)
        .expect("finished in time (a FIFO was opened for reading?)")
}

fn mkfifo(path: &Path) {
    let c_path = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o644) }, 0);
}

/// Goal: FIFOs in a tree are recorded and restored as FIFOs, never opened for reading; a
/// regular file replaced by a FIFO after the walk is stored as an empty file with a warning
/// instead of blocking. Method: a tree with a FIFO and more files than the reader opens
/// ahead; when the first file is read, the last file is replaced by a FIFO; the backup must
/// finish within a time limit.
#[test]
fn fifos_are_recorded_not_read() {
    let scratch = tempfile::tempdir().unwrap();
    let storage: Arc<dyn Storage> =
        Arc::new(LocalStorage::create(scratch.path().join("repository")).unwrap());
    let source = scratch.path().join("source");
    fs::create_dir(&source).unwrap();
    for n in 0..40 {
        fs::write(source.join(format!("f{n:02}")), format!("file {n}")).unwrap();
    }
    fs::write(source.join("zz-becomes-fifo"), b"regular at walk time").unwrap();
    mkfifo(&source.join("pipe"));
    let scratch_path = scratch.path().to_path_buf();
    let report = within(Duration::from_secs(60), move || {
        let mut store = open(storage, DedupMode::Revdedup);
        let victim = source.join("zz-becomes-fifo");
        let done = AtomicBool::new(false);
        let observer = |_: &[u8], _: u32, _: u64| {
            if !done.swap(true, Ordering::SeqCst) {
                fs::remove_file(&victim).unwrap();
                mkfifo(&victim);
            }
        };
        let report = store
            .create_backup(
                "tree",
                BackupSource::Directory(source.clone()),
                CreateOptions {
                    read_observer: Some(&observer),
                    ..CreateOptions::default()
                },
            )
            .unwrap();
        let target = scratch_path.join("restored");
        store
            .restore("tree", None, RestoreTarget::Directory(target.clone()))
            .unwrap();
        use std::os::unix::fs::FileTypeExt;
        assert!(fs::symlink_metadata(target.join("pipe"))
            .unwrap()
            .file_type()
            .is_fifo());
        assert_eq!(fs::read(target.join("zz-becomes-fifo")).unwrap(), b"");
        assert_eq!(fs::read(target.join("f07")).unwrap(), b"file 7");
        report
    });
    assert_eq!(report.warnings.len(), 1, "{:?}", report.warnings);
    assert_eq!(report.warnings[0].path, "zz-becomes-fifo");
    assert_eq!(report.warnings[0].problem, FileProblem::NotARegularFile);
    assert!(report.warnings[0].message.contains("FIFO"));
}

/// Goal: a FIFO given as the file to back up is refused at once, not opened for a read that
/// waits forever for a writer. Method: create a backup of a FIFO within a time limit.
#[test]
fn a_fifo_source_is_refused_at_once() {
    let scratch = tempfile::tempdir().unwrap();
    let fifo = scratch.path().join("pipe");
    mkfifo(&fifo);
    let storage: Arc<dyn Storage> =
        Arc::new(LocalStorage::create(scratch.path().join("repository")).unwrap());
    let error = within(Duration::from_secs(30), move || {
        let mut store = open(storage, DedupMode::Revdedup);
        store
            .create_backup("pipe", BackupSource::File(fifo), CreateOptions::default())
            .map(|report| report.version)
    })
    .unwrap_err();
    assert!(
        matches!(&error, BackupError::InvalidArgument(message) if message.contains("FIFO")),
        "{error}"
    );
}
