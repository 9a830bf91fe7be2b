//! The files cache: a directory backup does not read the files that have not changed since
//! the series' previous backup (same path, size, mtime, ctime, inode and device); it places
//! the previous backup's segments holding them. Reads are counted with the reader's
//! observer, which sees every read from a file.

mod common;

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use onecopy_backup::tree::capture::FileProblem;
use onecopy_backup::{
    BackupSource, BackupStore, CreateOptions, CreateReport, DedupMode, RestoreTarget,
};
use onecopy_core::storage::{LocalStorage, Storage};

/// Files are stamped (trusted by the next backup) only once they are this old.
const SETTLE: Duration = Duration::from_millis(2_100);

fn store_in(scratch: &Path, mode: DedupMode) -> BackupStore {
    let storage: Arc<dyn Storage> =
        Arc::new(LocalStorage::create(scratch.join("repository")).unwrap());
    open(storage, mode)
}

fn write_random(path: &Path, random: &mut Random, bytes: usize) {
    let mut data = vec![0u8; bytes];
    random.fill(&mut data);
    fs::write(path, data).unwrap();
}

/// A tree of small files (which share segments), large ones (segments of their own), an
/// empty file, a hard link and a sparse file.
fn build_tree(root: &Path, random: &mut Random) {
    for directory in ["docs", "lib", "lib/deep"] {
        fs::create_dir_all(root.join(directory)).unwrap();
    }
    for n in 0..40 {
        let directory = ["docs", "lib", "lib/deep"][n % 3];
        let bytes = 500 + random.below(9_000) as usize;
        write_random(
            &root.join(directory).join(format!("f{n:02}")),
            random,
            bytes,
        );
    }
    write_random(&root.join("big-a"), random, 300 << 10);
    write_random(&root.join("lib/big-b"), random, 200 << 10);
    fs::write(root.join("docs/empty"), b"").unwrap();
    fs::hard_link(root.join("docs/f00"), root.join("link-to-f00")).unwrap();
    let sparse = fs::File::create(root.join("sparse")).unwrap();
    sparse.set_len(1 << 20).unwrap();
    std::os::unix::fs::FileExt::write_at(&sparse, b"data in a hole", 512 << 10).unwrap();
}

/// Every regular file's contents under `root`, by relative path.
fn contents(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut found = BTreeMap::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(directory) = pending.pop() {
        for entry in fs::read_dir(&directory).unwrap() {
            let path = entry.unwrap().path();
            let metadata = fs::symlink_metadata(&path).unwrap();
            if metadata.is_dir() {
                pending.push(path);
            } else if metadata.is_file() {
                let relative = path.strip_prefix(root).unwrap().to_path_buf();
                found.insert(relative, fs::read(&path).unwrap());
            }
        }
    }
    found
}

/// Backs `source` up, recording the relative path of every file read from.
fn create(store: &mut BackupStore, source: &Path, force: bool) -> (CreateReport, Vec<String>) {
    let read = Mutex::new(Vec::new());
    let observer = |path: &[u8], _reading: u32, _delivered: u64| {
        let path = String::from_utf8_lossy(path).into_owned();
        let mut read = read.lock().unwrap();
        if read.last() != Some(&path) {
            read.push(path);
        }
    };
    let report = store
        .create_backup(
            "tree",
            BackupSource::Directory(source.to_path_buf()),
            CreateOptions {
                read_observer: Some(&observer),
                force,
                ..CreateOptions::default()
            },
        )
        .unwrap();
    let mut read = read.into_inner().unwrap();
    read.sort();
    read.dedup();
    (report, read)
}

/// Restores `version` into a new directory under `scratch` and returns its files.
fn restored(store: &BackupStore, scratch: &Path, version: u32) -> BTreeMap<PathBuf, Vec<u8>> {
    let target = scratch.join(format!("restored-{version}-{}", std::process::id()));
    if target.exists() {
        fs::remove_dir_all(&target).unwrap();
    }
    store
        .restore(
            "tree",
            Some(version),
            RestoreTarget::Directory(target.clone()),
        )
        .unwrap();
    let files = contents(&target);
    fs::remove_dir_all(&target).unwrap();
    files
}

/// Sets the modification time of `path` (and so, as a side effect, its change time to now).
fn set_mtime(path: &Path, time: (i64, i64)) {
    let c_path = CString::new(path.as_os_str().as_bytes()).unwrap();
    let stamp = libc::timespec {
        tv_sec: time.0,
        tv_nsec: time.1,
    };
    let times = [stamp, stamp];
    // SAFETY: a valid path and two timespecs.
    let result = unsafe { libc::utimensat(libc::AT_FDCWD, c_path.as_ptr(), times.as_ptr(), 0) };
    assert_eq!(result, 0);
}

fn mtime(path: &Path) -> (i64, i64) {
    use std::os::unix::fs::MetadataExt;
    let metadata = fs::metadata(path).unwrap();
    (metadata.mtime(), metadata.mtime_nsec())
}

/// Goal: a backup of an unchanged tree reads no file and restores byte-exact, and the
/// reverse deduplication it triggers maps the older backup's segments to it without reading
/// their records; the change summary calls every file unchanged; `force` reads every file
/// again. Method: two backups
/// of a settled tree counting the files read with the observer, then a forced third.
#[test]
fn unchanged_files_are_not_read() {
    let scratch = tempfile::tempdir().unwrap();
    let source = scratch.path().join("source");
    fs::create_dir(&source).unwrap();
    build_tree(&source, &mut Random(7));
    let expected = contents(&source);
    std::thread::sleep(SETTLE);
    let mut store = store_in(scratch.path(), DedupMode::Revdedup);

    let (first, read) = create(&mut store, &source, false);
    let files = first.files.unwrap();
    assert_eq!(files.previous_version, None);
    assert_eq!(files.files_kept, 0);
    // 40 small files, two large ones and a sparse one; the empty file has nothing to read.
    assert_eq!(read.len(), 43, "every file with data is read: {read:?}");

    let (second, read) = create(&mut store, &source, false);
    let files = second.files.unwrap();
    assert!(read.is_empty(), "nothing is read: {read:?}");
    assert_eq!(files.previous_version, Some(1));
    assert_eq!((files.files_read, files.bytes_read), (0, 0));
    assert_eq!(
        files.files_kept, 44,
        "every regular file (the empty one too)"
    );
    let summary = second.summary.unwrap();
    assert_eq!(summary.files_unchanged, files.files_kept);
    assert_eq!(summary.files_changed + summary.files_new, 0);
    assert_eq!(second.inline.segments_new, 0, "{:?}", second.inline);
    assert!(second.inline.placed_bytes >= files.bytes_kept);
    // The first backup's reverse deduplication maps every segment the second holds too
    // without reading its record (all but the tree's, which the directories' times may
    // change), and leaves no direct reference to them.
    assert_eq!(second.reverse.len(), 1);
    let plan = &second.reverse[0].plan;
    assert!(
        plan.shared_segments + 1 >= first.inline.segments,
        "{} of {} segments mapped",
        plan.shared_segments,
        first.inline.segments
    );
    assert_eq!(
        plan.settlement.segments_archived + plan.settlement.segments_died,
        { first.inline.segments - plan.shared_segments }
    );
    assert_eq!(restored(&store, scratch.path(), 2), expected);
    assert_eq!(restored(&store, scratch.path(), 1), expected);

    let (forced, read) = create(&mut store, &source, true);
    let files = forced.files.unwrap();
    assert_eq!(files.previous_version, None);
    assert_eq!(files.files_kept, 0);
    assert_eq!(read.len(), 43, "force reads every file: {read:?}");
    assert_eq!(forced.inline.placed_segments, 0);
    assert_eq!(forced.summary.unwrap().files_unchanged, 44);
    assert_eq!(restored(&store, scratch.path(), 3), expected);
    assert_check_ok(&mut store);
}

/// Goal: a file rewritten with the same size and mtime is read again, whether only its
/// ctime changed or it is a new inode; so is a file whose group of small files it breaks,
/// and no other; the summary calls exactly the rewritten files changed. Method: rewrite one
/// small file in place and replace a large one by rename, both with their old mtimes, and
/// count the files read by the next backup.
#[test]
fn rewritten_files_are_read_again() {
    let scratch = tempfile::tempdir().unwrap();
    let source = scratch.path().join("source");
    fs::create_dir(&source).unwrap();
    let mut random = Random(11);
    build_tree(&source, &mut random);
    std::thread::sleep(SETTLE);
    let mut store = store_in(scratch.path(), DedupMode::Revdedup);
    create(&mut store, &source, false);

    // Same size and mtime, new contents: only the ctime tells.
    let in_place = source.join("lib/f01");
    let old_time = mtime(&in_place);
    let size = fs::metadata(&in_place).unwrap().len() as usize;
    write_random(&in_place, &mut random, size);
    set_mtime(&in_place, old_time);
    // Same size and mtime, a new inode.
    let replaced = source.join("big-a");
    let old_time = mtime(&replaced);
    let new_file = source.join("replacement");
    write_random(&new_file, &mut random, 300 << 10);
    set_mtime(&new_file, old_time);
    fs::rename(&new_file, &replaced).unwrap();
    let expected = contents(&source);

    let (report, read) = create(&mut store, &source, false);
    assert!(read.contains(&"lib/f01".to_string()), "{read:?}");
    assert!(read.contains(&"big-a".to_string()), "{read:?}");
    let files = report.files.unwrap();
    // The rewritten small file's group is read with it: a few small files, no large one.
    assert!(!read.contains(&"lib/big-b".to_string()), "{read:?}");
    assert!(read.len() < 15, "only the broken groups are read: {read:?}");
    assert_eq!(files.files_read as usize, read.len());
    assert!(files.files_kept >= 30, "{files:?}");
    let summary = report.summary.unwrap();
    assert_eq!(summary.files_changed, 2, "{summary:?}");
    assert_eq!(summary.files_unchanged, 42);
    assert_eq!(restored(&store, scratch.path(), 2), expected);
    assert_check_ok(&mut store);
}

/// Goal: a file that changes while a files-cache backup reads it is read again (with a
/// warning), the backup holds a version the file had, and the next backup reads it once more
/// rather than trusting times taken while it changed; so is a file changed moments before the
/// backup. Method: change a file's size and mtime during its first reading, and rewrite
/// another just before; back up once more without changes.
#[test]
fn a_file_changed_while_read_is_read_again() {
    let scratch = tempfile::tempdir().unwrap();
    let source = scratch.path().join("source");
    fs::create_dir(&source).unwrap();
    let mut random = Random(13);
    build_tree(&source, &mut random);
    std::thread::sleep(SETTLE);
    let mut store = store_in(scratch.path(), DedupMode::Revdedup);
    create(&mut store, &source, false);

    let big = source.join("lib/big-b");
    write_random(&big, &mut random, 200 << 10);
    // Changed just before the backup, not while it is read.
    write_random(&source.join("big-a"), &mut random, 300 << 10);
    let done = AtomicBool::new(false);
    let observer = |path: &[u8], reading: u32, delivered: u64| {
        if path == b"lib/big-b"
            && reading == 1
            && delivered > 0
            && !done.swap(true, Ordering::SeqCst)
        {
            let mut data = fs::read(&big).unwrap();
            data.extend_from_slice(b"appended while read");
            fs::write(&big, data).unwrap();
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
    assert_eq!(report.warnings.len(), 1, "{:?}", report.warnings);
    assert_eq!(report.warnings[0].path, "lib/big-b");
    assert_eq!(report.warnings[0].problem, FileProblem::ReadAgain);
    let expected = contents(&source);
    assert_eq!(restored(&store, scratch.path(), 2), expected);

    // Their times were taken moments after a change: not trusted, both read again.
    let (report, read) = create(&mut store, &source, false);
    assert!(read.contains(&"lib/big-b".to_string()), "{read:?}");
    assert!(read.contains(&"big-a".to_string()), "{read:?}");
    assert!(report.warnings.is_empty());
    assert_eq!(restored(&store, scratch.path(), 3), expected);
    assert_check_ok(&mut store);
}

/// Changes a tree between backups: rewrites, appends, removals and additions.
fn change_tree(root: &Path, random: &mut Random, round: u32) {
    let rewrite = root.join(format!("lib/f{:02}", (round * 7) % 40 / 3 * 3 + 1));
    if rewrite.exists() {
        let bytes = 300 + random.below(6_000) as usize;
        write_random(&rewrite, random, bytes);
    }
    let mut grown = fs::read(root.join("big-a")).unwrap();
    grown.extend((0..5_000).map(|index| (index as u32 * round) as u8));
    fs::write(root.join("big-a"), grown).unwrap();
    let removed = root.join(format!("docs/f{:02}", round * 3));
    let _ = fs::remove_file(removed);
    write_random(&root.join(format!("docs/new-{round}")), random, 3_000);
    fs::create_dir_all(root.join(format!("added-{round}"))).unwrap();
    write_random(&root.join(format!("added-{round}/big")), random, 100 << 10);
}

/// Goal: after a series of files-cache backups with changes, every version restores
/// byte-exact (newest, middle and oldest), also after reverse deduplication, after deleting
/// the oldest and a middle backup and after expiry; check passes; the files read each time
/// are the changed ones and their groups, not the tree. Method: six backups of a changing
/// tree, with the expected contents of each kept aside, in both dedup modes.
#[test]
fn versions_restore_after_reverse_and_deletion() {
    for mode in [DedupMode::Revdedup, DedupMode::Conventional] {
        let scratch = tempfile::tempdir().unwrap();
        let source = scratch.path().join("source");
        fs::create_dir(&source).unwrap();
        let mut random = Random(17);
        build_tree(&source, &mut random);
        std::thread::sleep(SETTLE);
        let mut store = store_in(scratch.path(), mode);
        let mut expected = BTreeMap::new();
        for round in 1..=6u32 {
            if round > 1 {
                change_tree(&source, &mut random, round);
                // The changed files must settle, or every one of them is read again next time.
                std::thread::sleep(SETTLE);
            }
            expected.insert(round, contents(&source));
            let (report, read) = create(&mut store, &source, false);
            assert_eq!(report.version, round);
            if round > 1 {
                // The changed, added and removed files break at most a group of small files
                // each: about a third of the small files.
                let files = report.files.unwrap();
                assert!(
                    files.files_read <= 20 && files.files_kept >= 25,
                    "{mode:?} round {round}: {files:?}, read {read:?}"
                );
                for unchanged in ["lib/big-b", "sparse"] {
                    assert!(!read.contains(&unchanged.to_string()), "{read:?}");
                }
            }
            if mode == DedupMode::Revdedup && round > 1 {
                assert_eq!(report.reverse.len(), 1, "reverse deduplication ran");
            }
        }
        for version in [6, 3, 1] {
            assert_eq!(
                restored(&store, scratch.path(), version),
                expected[&version],
                "{mode:?} version {version}"
            );
        }
        assert_check_ok(&mut store);
        store.delete("tree", 1, None).unwrap();
        store.delete("tree", 4, None).unwrap();
        for version in [6, 5, 3, 2] {
            assert_eq!(
                restored(&store, scratch.path(), version),
                expected[&version],
                "{mode:?} version {version} after deletions"
            );
        }
        store.expire("tree", Some(2), None).unwrap();
        // A backup after the deletions still takes its unchanged files from the newest.
        let (report, read) = create(&mut store, &source, false);
        assert!(read.is_empty(), "{mode:?}: {read:?}");
        assert_eq!(report.files.unwrap().previous_version, Some(6));
        for version in [7, 6] {
            assert_eq!(
                restored(&store, scratch.path(), version),
                expected[&6],
                "{mode:?} version {version} after expiry"
            );
        }
        assert_check_ok(&mut store);
    }
}

/// The versions a crash scenario completed (with the contents each holds), and the one in
/// flight when it crashed.
#[derive(Default)]
struct Model {
    present: BTreeMap<u32, BTreeMap<PathBuf, Vec<u8>>>,
    uncertain: Option<(u32, BTreeMap<PathBuf, Vec<u8>>)>,
}

/// Backups of `source` with the files cache: two of the same tree (the second places every
/// unchanged file), one after a change, the deletion of the first, and one more; `reset`
/// and `change` set the source's state. Records in `model` what completed.
fn crash_scenario(
    storage: Arc<dyn Storage>,
    source: &Path,
    reset: &dyn Fn(),
    change: &dyn Fn(),
    model: &mut Model,
) {
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
    reset();
    let create = |store: &mut BackupStore, model: &mut Model, version: u32| -> bool {
        let expected = contents(source);
        model.uncertain = Some((version, expected.clone()));
        let created = store.create_backup(
            "tree",
            BackupSource::Directory(source.to_path_buf()),
            CreateOptions::default(),
        );
        match created {
            Ok(report) => {
                assert_eq!(report.version, version);
                if version > 1 {
                    assert!(report.inline.placed_segments > 0, "the files cache is used");
                }
                model.present.insert(version, expected);
                model.uncertain = None;
                true
            }
            Err(_) => false,
        }
    };
    for version in [1, 2] {
        if !create(&mut store, model, version) {
            return;
        }
    }
    change();
    if !create(&mut store, model, 3) {
        return;
    }
    let first = model.present.remove(&1).expect("version 1 completed");
    model.uncertain = Some((1, first));
    if store.delete("tree", 1, None).is_err() {
        return;
    }
    model.uncertain = None;
    create(&mut store, model, 4);
}

/// Goal: a crash at any sync of files-cache backups (placing the previous backup's segments,
/// reverse deduplication, deletion) leaves a store that checks clean, restores every
/// completed version byte-exact, and takes a correct files-cache backup next. Method: the
/// scenario of [`crash_scenario`] on simulated storage, crashed after every sync with torn
/// writes; the source is reset to its first state before each run.
#[test]
fn crash_during_files_cache_backups() {
    use onecopy_core::storage::{CrashMode, SimulatedStorage};
    let scratch = tempfile::tempdir().unwrap();
    let source = scratch.path().join("source");
    fs::create_dir(&source).unwrap();
    let mut random = Random(23);
    build_tree(&source, &mut random);
    std::thread::sleep(SETTLE);
    let changed = source.join("lib/f01");
    let original = fs::read(&changed).unwrap();
    let mut replacement = original.clone();
    replacement.reverse();
    let added = source.join("docs/added");
    let reset = || {
        if fs::read(&changed).unwrap() != original {
            fs::write(&changed, &original).unwrap();
        }
        let _ = fs::remove_file(&added);
    };
    let change = || {
        fs::write(&changed, &replacement).unwrap();
        fs::write(&added, b"added between versions 2 and 3").unwrap();
    };

    let total_syncs = {
        let storage = SimulatedStorage::new();
        let mut model = Model::default();
        crash_scenario(
            Arc::new(storage.clone()),
            &source,
            &reset,
            &change,
            &mut model,
        );
        assert_eq!(
            model.present.len(),
            3,
            "the scenario completes without a crash"
        );
        storage.sync_count()
    };
    for crash_at in 1..=total_syncs {
        let label = format!("crash after sync {crash_at} of {total_syncs}");
        let storage = SimulatedStorage::new();
        storage.crash_after_syncs(crash_at);
        let mut model = Model::default();
        crash_scenario(
            Arc::new(storage.clone()),
            &source,
            &reset,
            &change,
            &mut model,
        );
        let after: Arc<dyn Storage> = Arc::new(storage.crash(CrashMode::Torn {
            seed: crash_at * 7919,
        }));
        let mut store = open(after, DedupMode::Revdedup);
        let report = store
            .check(onecopy_backup::CheckOptions {
                read_data: true,
                repair: false,
            })
            .unwrap();
        assert!(report.is_clean(), "{label}: {:#?}", report.findings);
        let listed: Vec<u32> = store
            .list(None)
            .unwrap()
            .iter()
            .map(|b| b.version)
            .collect();
        for version in &listed {
            let expected = match model.present.get(version) {
                Some(expected) => expected,
                None => match &model.uncertain {
                    Some((uncertain, expected)) if uncertain == version => expected,
                    _ => panic!("{label}: version {version} exists but never completed"),
                },
            };
            assert!(
                restored(&store, scratch.path(), *version) == *expected,
                "{label}: version {version} differs"
            );
        }
        for version in model.present.keys() {
            assert!(
                listed.contains(version),
                "{label}: version {version} is missing"
            );
        }
        // The next backup takes unchanged files from whatever is newest, and restores.
        let report = store
            .create_backup(
                "tree",
                BackupSource::Directory(source.clone()),
                CreateOptions::default(),
            )
            .unwrap();
        assert!(
            restored(&store, scratch.path(), report.version) == contents(&source),
            "{label}: the backup after recovery differs"
        );
        assert_check_ok(&mut store);
    }
}

/// Goal: the racy window follows the file system: on a local one with nanosecond times
/// (`files_cache::local_times`) a file last changed 300 ms before a backup is trusted by the
/// next backup (the window is 50 ms), on any other the 2 s window holds and the next backup
/// reads it again; a file changed after the backup started is read again everywhere.
/// Method: two files of their own segments, one written 300 ms before the first backup, one whose mtime is set an
/// hour ahead; a second backup of the unchanged tree, its reads counted.
#[test]
fn racy_window_follows_the_file_system() {
    let scratch = tempfile::tempdir().unwrap();
    let source = scratch.path().join("source");
    fs::create_dir(&source).unwrap();
    let mut random = Random(11);
    write_random(&source.join("recent"), &mut random, 300 << 10);
    write_random(&source.join("ahead"), &mut random, 300 << 10);
    let (now_seconds, now_nanoseconds) = mtime(&source.join("ahead"));
    set_mtime(&source.join("ahead"), (now_seconds + 3600, now_nanoseconds));
    std::thread::sleep(Duration::from_millis(300));
    let mut store = store_in(scratch.path(), DedupMode::Revdedup);
    let (_, read) = create(&mut store, &source, false);
    assert_eq!(read.len(), 2, "{read:?}");

    let path = CString::new(source.as_os_str().as_bytes()).unwrap();
    // SAFETY: statfs writes a statfs into the zeroed buffer it is given.
    let mut info: libc::statfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statfs(path.as_ptr(), &mut info) }, 0);
    let local = onecopy_backup::files_cache::local_times(info.f_type as i64);
    let (_, read) = create(&mut store, &source, false);
    let expected: Vec<String> = if local {
        vec!["ahead".into()]
    } else {
        vec!["ahead".into(), "recent".into()]
    };
    assert_eq!(read, expected, "file system type {:#x}", info.f_type);
}
