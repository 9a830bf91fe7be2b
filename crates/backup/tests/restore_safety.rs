//! Restore safety: a restore never creates, writes or changes anything outside its target,
//! whatever the target already holds and whatever the stored tree says, and it replaces what
//! the target holds only when asked to.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::*;
use onecopy_backup::tree::apply::{ApplyOptions, TreeApplier};
use onecopy_backup::tree::{EntryKind, Extent, Tree, TreeEntry};
use onecopy_backup::{
    BackupError, BackupSource, BackupStore, CreateOptions, DedupMode, RestoreOptions, RestoreTarget,
};
use onecopy_core::storage::{LocalStorage, Storage};

/// Everything about a directory that a stray restore could change: per name (recursively),
/// its kind, mode, modification time, contents or link target.
fn snapshot(root: &Path) -> BTreeMap<PathBuf, (u32, i64, i64, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(path) = stack.pop() {
        let metadata = fs::symlink_metadata(&path).unwrap();
        let contents = if metadata.is_file() {
            fs::read(&path).unwrap()
        } else if metadata.is_symlink() {
            fs::read_link(&path)
                .unwrap()
                .as_os_str()
                .as_bytes()
                .to_vec()
        } else {
            for child in fs::read_dir(&path).unwrap() {
                stack.push(child.unwrap().path());
            }
            Vec::new()
        };
        out.insert(
            path,
            (
                metadata.mode(),
                metadata.mtime(),
                metadata.mtime_nsec(),
                contents,
            ),
        );
    }
    out
}

/// A directory outside every target, holding a "password file", mode 0700.
fn make_outside(scratch: &Path) -> PathBuf {
    let outside = scratch.join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("passwd"), b"root:x:0:0\n").unwrap();
    fs::set_permissions(&outside, fs::Permissions::from_mode(0o700)).unwrap();
    outside
}

fn local_store(scratch: &Path) -> BackupStore {
    let storage: Arc<dyn Storage> =
        Arc::new(LocalStorage::create(scratch.join("repository")).unwrap());
    open(storage, DedupMode::Revdedup)
}

fn back_up(store: &mut BackupStore, source: &Path) {
    store
        .create_backup(
            "tree",
            BackupSource::Directory(source.to_path_buf()),
            CreateOptions::default(),
        )
        .unwrap();
}

fn overwrite() -> RestoreOptions {
    RestoreOptions {
        overwrite: true,
        ..RestoreOptions::default()
    }
}

/// Backs up version 1 with `sub` a link to `outside`, then version 2 with `sub/` a real
/// directory holding `passwd`, mode 0755.
fn two_versions(scratch: &Path, outside: &Path) -> BackupStore {
    let mut store = local_store(scratch);
    let source = scratch.join("source");
    fs::create_dir(&source).unwrap();
    symlink(outside, source.join("sub")).unwrap();
    back_up(&mut store, &source);
    fs::remove_file(source.join("sub")).unwrap();
    fs::create_dir(source.join("sub")).unwrap();
    fs::set_permissions(source.join("sub"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(source.join("sub/passwd"), b"evil::0:0\n").unwrap();
    back_up(&mut store, &source);
    store
}

/// Goal: restoring version 1 (`sub` a link to a directory outside) and then version 2 (`sub/`
/// a directory holding `passwd`) into the same target changes nothing outside. Method: the
/// second restore is refused without overwriting; with it, the link is replaced by a
/// directory, and the outside directory's names, modes, times and contents are compared.
#[test]
fn two_version_symlink_swap_stays_in_the_target() {
    let scratch = tempfile::tempdir().unwrap();
    let outside = make_outside(scratch.path());
    let before = snapshot(&outside);
    let store = two_versions(scratch.path(), &outside);
    let target = scratch.path().join("target");
    store
        .restore("tree", Some(1), RestoreTarget::Directory(target.clone()))
        .unwrap();
    assert!(fs::symlink_metadata(target.join("sub"))
        .unwrap()
        .is_symlink());
    let refused = store.restore("tree", Some(2), RestoreTarget::Directory(target.clone()));
    assert!(
        matches!(refused, Err(BackupError::TargetNotEmpty { .. })),
        "{refused:?}"
    );
    assert_eq!(snapshot(&outside), before);
    store
        .restore_with(
            "tree",
            Some(2),
            RestoreTarget::Directory(target.clone()),
            overwrite(),
        )
        .unwrap();
    assert_eq!(snapshot(&outside), before, "nothing outside changed");
    assert!(fs::symlink_metadata(target.join("sub")).unwrap().is_dir());
    assert_eq!(fs::read(target.join("sub/passwd")).unwrap(), b"evil::0:0\n");
}

/// Goal: a target that already holds a symbolic link where the tree has a directory, and a
/// hard link to a file outside where the tree has a file, is restored into without writing
/// through either. Method: prepare such a target, restore version 2 with overwriting, compare
/// the outside directory.
#[test]
fn links_in_the_target_are_replaced_not_followed() {
    let scratch = tempfile::tempdir().unwrap();
    let outside = make_outside(scratch.path());
    fs::write(outside.join("victim"), b"outside data").unwrap();
    let mut store = two_versions(scratch.path(), &outside);
    let source = scratch.path().join("source");
    fs::write(source.join("victim"), b"from the backup").unwrap();
    back_up(&mut store, &source);
    let target = scratch.path().join("target");
    fs::create_dir(&target).unwrap();
    symlink(&outside, target.join("sub")).unwrap();
    fs::hard_link(outside.join("victim"), target.join("victim")).unwrap();
    let before = snapshot(&outside);
    let report = store
        .restore_with(
            "tree",
            Some(3),
            RestoreTarget::Directory(target.clone()),
            overwrite(),
        )
        .unwrap();
    assert_eq!(report.tree.unwrap().replaced, 2);
    let mut after = snapshot(&outside);
    // Unlinking the target's name drops the outside file's link count, which changes its
    // change time only; everything compared here stays.
    assert_eq!(after.len(), before.len());
    for (path, state) in &before {
        assert_eq!(
            after.remove(path).as_ref(),
            Some(state),
            "{}",
            path.display()
        );
    }
    assert!(fs::symlink_metadata(target.join("sub")).unwrap().is_dir());
    assert_eq!(fs::read(target.join("victim")).unwrap(), b"from the backup");
    assert_eq!(fs::read(outside.join("victim")).unwrap(), b"outside data");
}

fn entry(path: &[u8], kind: EntryKind) -> TreeEntry {
    TreeEntry {
        path: path.to_vec(),
        kind,
        mode: 0o777,
        uid: 0,
        gid: 0,
        atime: (0, 0),
        mtime: (0, 0),
        xattrs: Vec::new(),
        stamp: None,
    }
}

fn file(bytes: u64, stream_offset: u64) -> EntryKind {
    EntryKind::File {
        size: bytes,
        stream_offset,
        extents: vec![Extent {
            offset: 0,
            length: bytes,
        }],
    }
}

/// Applies a crafted tree whose files hold "evil" each, as a restore would.
fn apply(target: &Path, tree: Tree) -> onecopy_backup::Result<()> {
    let files = tree
        .entries
        .iter()
        .filter(|entry| matches!(entry.kind, EntryKind::File { .. }))
        .count() as u64;
    let options = ApplyOptions {
        backup: "crafted@7".to_string(),
        overwrite: true,
    };
    let mut applier = TreeApplier::prepare(target, tree, 4 * files, &options)?;
    for index in 0..files {
        applier.write(index * 4, b"evil")?;
    }
    applier.finish()?;
    Ok(())
}

/// Goal: a crafted tree whose paths lead outside the target (`..`, an absolute path), or that
/// the walk cannot produce (an empty or `.` component, a NUL byte, a file beneath a symbolic
/// link, a hard link to a file beneath a link, duplicates, entries out of order), is refused
/// as corruption naming the backup and the path, before anything is created. Method: apply
/// each tree to a new target next to a directory outside; the outside directory and the
/// target's absence are checked after each.
#[test]
fn crafted_trees_are_refused_before_anything_is_created() {
    let scratch = tempfile::tempdir().unwrap();
    let outside = make_outside(scratch.path());
    let outside_bytes = outside.as_os_str().as_bytes().to_vec();
    let mut absolute = outside_bytes.clone();
    absolute.extend_from_slice(b"/passwd");
    let root = || entry(b"", EntryKind::Directory);
    let cases: Vec<(&str, Vec<TreeEntry>, Vec<u8>)> = vec![
        (
            "dot-dot",
            vec![root(), entry(b"../outside/passwd", file(4, 0))],
            b"../outside/passwd".to_vec(),
        ),
        (
            "dot-dot inside",
            vec![
                root(),
                entry(b"a", EntryKind::Directory),
                entry(b"a/../../outside/passwd", file(4, 0)),
            ],
            b"a/../../outside/passwd".to_vec(),
        ),
        (
            "absolute",
            vec![root(), entry(&absolute, file(4, 0))],
            absolute.clone(),
        ),
        (
            "empty component",
            vec![
                root(),
                entry(b"a", EntryKind::Directory),
                entry(b"a//b", file(4, 0)),
            ],
            b"a//b".to_vec(),
        ),
        (
            "dot",
            vec![root(), entry(b"./passwd", file(4, 0))],
            b"./passwd".to_vec(),
        ),
        (
            "NUL",
            vec![root(), entry(b"pass\0wd", file(4, 0))],
            b"pass\0wd".to_vec(),
        ),
        (
            "file beneath a symbolic link",
            vec![
                root(),
                entry(
                    b"s",
                    EntryKind::Symlink {
                        target: outside_bytes.clone(),
                    },
                ),
                entry(b"s/passwd", file(4, 0)),
            ],
            b"s/passwd".to_vec(),
        ),
        (
            "hard link to a file beneath a symbolic link",
            vec![
                root(),
                entry(
                    b"s",
                    EntryKind::Symlink {
                        target: outside_bytes.clone(),
                    },
                ),
                entry(b"s/passwd", file(4, 0)),
                entry(b"t", EntryKind::HardLink { target: 2 }),
            ],
            b"s/passwd".to_vec(),
        ),
        (
            "hard link to a later entry",
            vec![
                root(),
                entry(b"a", EntryKind::HardLink { target: 2 }),
                entry(b"b", file(4, 0)),
            ],
            b"a".to_vec(),
        ),
        (
            "directory after a file of the same name",
            vec![
                root(),
                entry(b"sub", file(4, 0)),
                entry(b"sub", EntryKind::Directory),
            ],
            b"sub".to_vec(),
        ),
        (
            "out of order",
            vec![
                root(),
                entry(b"b", EntryKind::Directory),
                entry(b"a", file(4, 0)),
            ],
            b"a".to_vec(),
        ),
        (
            "root not first",
            vec![entry(b"passwd", file(4, 0)), root()],
            b"passwd".to_vec(),
        ),
        (
            "overlapping contents",
            vec![root(), entry(b"a", file(4, 0)), entry(b"b", file(4, 2))],
            b"b".to_vec(),
        ),
    ];
    let before = snapshot(&outside);
    for (label, entries, bad_path) in cases {
        let target = scratch.path().join("target");
        let error = apply(&target, Tree { entries }).expect_err(label);
        let message = error.to_string();
        assert!(
            matches!(&error, BackupError::CorruptTree { path, .. }
                if *path == format!("\"{}\"", bad_path.escape_ascii())),
            "{label}: {message}"
        );
        assert!(message.contains("crafted@7"), "{label}: {message}");
        assert!(!target.exists(), "{label}: nothing was created");
        assert_eq!(
            snapshot(&outside),
            before,
            "{label}: nothing outside changed"
        );
    }
}

/// Goal: a directory swapped for a link to a directory outside while a restore runs makes
/// the restore fail, not write or change anything outside. Method: prepare a valid tree,
/// replace `sub` by a link to the outside directory, then write and finish.
#[test]
fn a_directory_swapped_during_the_restore_is_not_followed() {
    let scratch = tempfile::tempdir().unwrap();
    let outside = make_outside(scratch.path());
    let before = snapshot(&outside);
    let target = scratch.path().join("target");
    let tree = Tree {
        entries: vec![
            entry(b"", EntryKind::Directory),
            entry(b"sub", EntryKind::Directory),
            entry(b"sub/passwd", file(4, 0)),
        ],
    };
    let options = ApplyOptions {
        backup: "swap@1".to_string(),
        overwrite: false,
    };
    let mut applier = TreeApplier::prepare(&target, tree, 4, &options).unwrap();
    fs::rename(target.join("sub"), target.join("moved")).unwrap();
    symlink(&outside, target.join("sub")).unwrap();
    let result = applier.write(0, b"evil").and_then(|()| applier.finish());
    assert!(result.is_err(), "{result:?}");
    assert_eq!(snapshot(&outside), before);
}

/// Goal: without overwriting, a non-empty directory target and an existing file target are
/// refused with what would be replaced and nothing changes; with overwriting, the backup's
/// entries replace the target's, others stay, a target directory where the backup has a file
/// is refused before anything is written, and a longer existing file ends up exactly the
/// backup. Method: restore a directory and a stream backup onto prepared targets.
#[test]
fn restore_replaces_only_when_asked() {
    let scratch = tempfile::tempdir().unwrap();
    let mut store = local_store(scratch.path());
    let source = scratch.path().join("source");
    fs::create_dir_all(source.join("docs")).unwrap();
    fs::write(source.join("docs/a"), b"backed up a").unwrap();
    fs::write(source.join("b"), b"backed up b").unwrap();
    back_up(&mut store, &source);

    let target = scratch.path().join("target");
    fs::create_dir_all(target.join("docs")).unwrap();
    fs::write(target.join("b"), b"target's b").unwrap();
    fs::write(target.join("stale"), b"not in the backup").unwrap();
    let before = snapshot(&target);
    let error = store
        .restore("tree", None, RestoreTarget::Directory(target.clone()))
        .unwrap_err();
    let message = error.to_string();
    assert!(
        matches!(error, BackupError::TargetNotEmpty { .. }),
        "{message}"
    );
    assert!(message.contains("3 entries"), "{message}");
    assert!(message.contains("\"b\""), "{message}");
    assert!(message.contains("\"docs\""), "{message}");
    assert!(message.contains("--overwrite"), "{message}");
    assert_eq!(snapshot(&target), before, "nothing changed");

    let report = store
        .restore_with(
            "tree",
            None,
            RestoreTarget::Directory(target.clone()),
            overwrite(),
        )
        .unwrap();
    assert_eq!(report.tree.unwrap().replaced, 2);
    assert_eq!(fs::read(target.join("b")).unwrap(), b"backed up b");
    assert_eq!(fs::read(target.join("docs/a")).unwrap(), b"backed up a");
    assert_eq!(
        fs::read(target.join("stale")).unwrap(),
        b"not in the backup"
    );

    let conflicting = scratch.path().join("conflicting");
    fs::create_dir_all(conflicting.join("b/inner")).unwrap();
    let before = snapshot(&conflicting);
    let error = store
        .restore_with(
            "tree",
            None,
            RestoreTarget::Directory(conflicting.clone()),
            overwrite(),
        )
        .unwrap_err();
    assert!(
        matches!(error, BackupError::TargetConflict { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("\"b\""), "{error}");
    assert_eq!(snapshot(&conflicting), before, "nothing changed");

    let data = vec![7u8; 100_000];
    create_report(&mut store, "stream", &data, false);
    let existing = scratch.path().join("existing.img");
    fs::write(&existing, vec![1u8; 300_000]).unwrap();
    let error = store
        .restore("stream", None, RestoreTarget::File(existing.clone()))
        .unwrap_err();
    assert!(error.to_string().contains("300000 bytes"), "{error}");
    assert_eq!(fs::read(&existing).unwrap(), vec![1u8; 300_000]);
    store
        .restore_with(
            "stream",
            None,
            RestoreTarget::File(existing.clone()),
            overwrite(),
        )
        .unwrap();
    assert!(fs::read(&existing).unwrap() == data);
}
