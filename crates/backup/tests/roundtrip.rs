//! Round trips: directories with their metadata, disk images and streams restore byte-exact,
//! for the newest, the oldest and a middle version, before and after reverse deduplication
//! and deletion.

mod common;

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, FileExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

use common::*;
use onecopy_backup::tree::capture::read_xattrs;
use onecopy_backup::{
    BackupSource, BackupStore, CreateOptions, DedupMode, RestoreTarget, StoreOptions,
};
use onecopy_core::chunking::RollingHash;
use onecopy_core::fingerprint::FingerprintAlgorithm;
use onecopy_core::storage::{LocalStorage, Storage};

/// Everything a restore must reproduce about one name.
#[derive(Debug, PartialEq, Eq)]
struct Description {
    kind: &'static str,
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: (i64, i64),
    size: u64,
    content: Option<String>,
    link: Option<Vec<u8>>,
    rdev: u64,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// The first path (in walk order) with the same inode, for hard links.
    same_inode_as: Vec<u8>,
}

fn describe(root: &Path) -> BTreeMap<Vec<u8>, Description> {
    let mut out = BTreeMap::new();
    let mut inodes: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let mut stack = vec![Vec::<u8>::new()];
    while let Some(relative) = stack.pop() {
        let path = if relative.is_empty() {
            root.to_path_buf()
        } else {
            root.join(OsStr::from_bytes(&relative))
        };
        let metadata = fs::symlink_metadata(&path).unwrap();
        let file_type = metadata.file_type();
        let kind = if file_type.is_dir() {
            "directory"
        } else if file_type.is_symlink() {
            "symlink"
        } else if file_type.is_file() {
            "file"
        } else {
            "special"
        };
        if file_type.is_dir() {
            for child in fs::read_dir(&path).unwrap() {
                let mut child_relative = relative.clone();
                if !child_relative.is_empty() {
                    child_relative.push(b'/');
                }
                child_relative.extend_from_slice(child.unwrap().file_name().as_bytes());
                stack.push(child_relative);
            }
        }
        let same_inode_as = if file_type.is_file() {
            inodes
                .entry(metadata.ino())
                .or_insert_with(|| relative.clone())
                .clone()
        } else {
            relative.clone()
        };
        out.insert(
            relative.clone(),
            Description {
                kind,
                mode: metadata.mode() & 0o7777,
                uid: metadata.uid(),
                gid: metadata.gid(),
                mtime: (metadata.mtime(), metadata.mtime_nsec()),
                size: if file_type.is_dir() {
                    0
                } else {
                    metadata.len()
                },
                content: file_type.is_file().then(|| {
                    FingerprintAlgorithm::Blake3
                        .hash(&fs::read(&path).unwrap())
                        .to_hex()
                }),
                link: file_type.is_symlink().then(|| {
                    fs::read_link(&path)
                        .unwrap()
                        .as_os_str()
                        .as_bytes()
                        .to_vec()
                }),
                rdev: metadata.rdev(),
                xattrs: read_xattrs(&path).unwrap(),
                same_inode_as,
            },
        );
    }
    // Hard link groups are named by their smallest path, whatever the walk order.
    let mut groups: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    for (path, description) in &out {
        let smallest = groups
            .entry(description.same_inode_as.clone())
            .or_insert_with(|| path.clone());
        if path < smallest {
            *smallest = path.clone();
        }
    }
    for description in out.values_mut() {
        description.same_inode_as = groups[&description.same_inode_as].clone();
    }
    out
}

fn set_xattr(path: &Path, name: &str, value: &[u8]) -> bool {
    let c_path = CString::new(path.as_os_str().as_bytes()).unwrap();
    let c_name = CString::new(name).unwrap();
    // SAFETY: valid NUL-terminated strings and a buffer of `value.len()` bytes.
    unsafe {
        libc::lsetxattr(
            c_path.as_ptr(),
            c_name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        ) == 0
    }
}

fn set_mtime(path: &Path, seconds: i64) {
    let c_path = CString::new(path.as_os_str().as_bytes()).unwrap();
    let times = [
        libc::timespec {
            tv_sec: seconds,
            tv_nsec: 5,
        },
        libc::timespec {
            tv_sec: seconds,
            tv_nsec: 123_456_789,
        },
    ];
    // SAFETY: valid path and two timespecs.
    assert_eq!(
        unsafe {
            libc::utimensat(
                libc::AT_FDCWD,
                c_path.as_ptr(),
                times.as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        },
        0
    );
}

fn write_random(path: &Path, random: &mut Random, bytes: usize) {
    let mut data = vec![0u8; bytes];
    random.fill(&mut data);
    fs::write(path, data).unwrap();
}

/// The first version of the test tree: every kind of entry and metadata a restore keeps.
fn build_tree(root: &Path, random: &mut Random) {
    fs::create_dir_all(root.join("docs/deep/deeper")).unwrap();
    write_random(&root.join("docs/report.txt"), random, 300 << 10);
    write_random(&root.join("docs/deep/deeper/small"), random, 100);
    fs::write(root.join("empty"), b"").unwrap();
    write_random(&root.join("big.bin"), random, 700 << 10);
    let sparse = fs::File::create(root.join("sparse.img")).unwrap();
    sparse.set_len(4 << 20).unwrap();
    sparse.write_all_at(b"start", 0).unwrap();
    sparse.write_all_at(&[7u8; 10000], 2 << 20).unwrap();
    drop(sparse);
    fs::write(
        root.join(OsStr::from_bytes(b"caf\xe9-latin1")),
        b"not utf-8 name",
    )
    .unwrap();
    fs::write(root.join("n".repeat(255)), b"long name").unwrap();
    symlink("docs/report.txt", root.join("link-relative")).unwrap();
    symlink("/nonexistent/target", root.join("link-dangling")).unwrap();
    fs::hard_link(root.join("big.bin"), root.join("docs/big-hardlink")).unwrap();
    fs::write(root.join("setuid"), b"#!/bin/sh\n").unwrap();
    fs::set_permissions(root.join("setuid"), fs::Permissions::from_mode(0o4755)).unwrap();
    fs::set_permissions(root.join("docs/deep"), fs::Permissions::from_mode(0o700)).unwrap();
    let fifo = CString::new(root.join("fifo").as_os_str().as_bytes()).unwrap();
    // SAFETY: valid path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o640) }, 0);
    std::os::unix::fs::lchown(root.join("docs/report.txt"), Some(1234), Some(5678)).unwrap();
    std::os::unix::fs::lchown(root.join("link-relative"), Some(42), Some(43)).unwrap();
    set_xattr(
        &root.join("docs/report.txt"),
        "user.origin",
        b"test\x00bytes",
    );
    set_mtime(&root.join("docs/deep/deeper/small"), 1_000_000_000);
    set_mtime(&root.join("link-relative"), 1_100_000_000);
}

/// The next version: contents changed, entries added and removed, metadata changed.
fn change_tree(root: &Path, random: &mut Random, round: u32) {
    let report = root.join("docs/report.txt");
    let mut data = fs::read(&report).unwrap();
    let at = random.below(data.len() as u64 - 5000) as usize;
    random.fill(&mut data[at..at + 5000]);
    fs::write(&report, data).unwrap();
    write_random(&root.join(format!("new-{round}")), random, 50 << 10);
    fs::set_permissions(
        root.join("empty"),
        fs::Permissions::from_mode(0o600 + round),
    )
    .unwrap();
    set_xattr(
        &root.join("big.bin"),
        "user.round",
        format!("{round}").as_bytes(),
    );
    if round == 2 {
        fs::remove_file(root.join("new-1")).unwrap();
        fs::hard_link(root.join("docs/report.txt"), root.join("report-link")).unwrap();
    }
}

fn restore_and_compare(
    store: &BackupStore,
    version: Option<u32>,
    expected: &BTreeMap<Vec<u8>, Description>,
    scratch: &Path,
    label: &str,
) {
    let target = scratch.join(format!(
        "restore-{label}-{}",
        version.map_or("newest".to_string(), |v| v.to_string())
    ));
    let report = store
        .restore("tree", version, RestoreTarget::Directory(target.clone()))
        .unwrap();
    assert_eq!(report.tree.unwrap().owners_not_set, 0);
    let restored = describe(&target);
    assert_eq!(restored.len(), expected.len(), "{label}: entry count");
    for (path, description) in expected {
        assert_eq!(
            restored.get(path),
            Some(description),
            "{label} v{version:?}: {}",
            String::from_utf8_lossy(path)
        );
    }
    let sparse = fs::metadata(target.join("sparse.img")).unwrap();
    assert!(
        sparse.blocks() * 512 < sparse.len() / 2,
        "{label}: the sparse file stays sparse"
    );
    fs::remove_dir_all(&target).unwrap();
}

/// Goal: directory backups keep contents, modes, owners, times, links, hard links, FIFOs,
/// sparse and empty files, long and non-UTF-8 names and extended attributes, for every
/// version, before and after reverse deduplication and after deleting the middle version.
/// Method: three versions of a tree on local storage, compared entry by entry.
#[test]
fn directory_round_trip() {
    let scratch = tempfile::tempdir().unwrap();
    let source = scratch.path().join("source");
    let storage: Arc<dyn Storage> =
        Arc::new(LocalStorage::create(scratch.path().join("repository")).unwrap());
    let mut store = open(storage, DedupMode::Revdedup);
    let mut random = Random(31);
    build_tree(&source, &mut random);
    let mut expected = Vec::new();
    for round in 1..=3 {
        if round > 1 {
            change_tree(&source, &mut random, round - 1);
        }
        expected.push(describe(&source));
        let report = store
            .create_backup(
                "tree",
                BackupSource::Directory(source.clone()),
                CreateOptions {
                    defer_reverse: true,
                    ..CreateOptions::default()
                },
            )
            .unwrap();
        assert_eq!(report.version, round);
    }
    for (label, versions) in [("before", vec![None, Some(1), Some(2)])] {
        for version in versions {
            let index = version.map_or(2, |v| v as usize - 1);
            restore_and_compare(&store, version, &expected[index], scratch.path(), label);
        }
    }
    assert_eq!(store.reverse_pending_backups("tree").unwrap().len(), 2);
    for version in [None, Some(1), Some(2)] {
        let index = version.map_or(2, |v| v as usize - 1);
        restore_and_compare(
            &store,
            version,
            &expected[index],
            scratch.path(),
            "after-reverse",
        );
    }
    store.delete("tree", 2, None).unwrap();
    restore_and_compare(
        &store,
        Some(1),
        &expected[0],
        scratch.path(),
        "after-delete",
    );
    restore_and_compare(
        &store,
        Some(3),
        &expected[2],
        scratch.path(),
        "after-delete",
    );
    assert_check_ok(&mut store);
}

/// Goal: a sparse disk image and a stream restore byte-exact for newest, oldest and middle
/// versions before and after reverse deduplication and deletion, and a restored image stays
/// sparse. Method: four versions of an 8 MiB image with holes, restored to files and writers.
#[test]
fn image_and_stream_round_trip() {
    image_and_stream_round_trip_with(RollingHash::Gear);
}

// Goal: the same round trips with paper 2's Rabin chunker (`--rolling-hash rabin`).
#[test]
fn image_and_stream_round_trip_rabin() {
    image_and_stream_round_trip_with(RollingHash::Rabin);
}

fn image_and_stream_round_trip_with(rolling_hash: RollingHash) {
    let scratch = tempfile::tempdir().unwrap();
    let storage: Arc<dyn Storage> =
        Arc::new(LocalStorage::create(scratch.path().join("repository")).unwrap());
    let options = StoreOptions {
        rolling_hash,
        ..small_options(DedupMode::Revdedup)
    };
    let mut store = open_with(storage, options);
    let mut random = Random(41);
    let mut images = Vec::new();
    let mut image = vec![0u8; 8 << 20];
    random.fill(&mut image[..1 << 20]);
    random.fill(&mut image[5 << 20..(5 << 20) + (300 << 10)]);
    for version in 1..=4u32 {
        if version > 1 {
            let at = random.below(1 << 20) as usize;
            random.fill(&mut image[at..at + 20000]);
        }
        let path = scratch.path().join("disk.img");
        let file = fs::File::create(&path).unwrap();
        file.set_len(image.len() as u64).unwrap();
        for (index, block) in image.chunks(64 << 10).enumerate() {
            if block.iter().any(|&byte| byte != 0) {
                file.write_all_at(block, (index * (64 << 10)) as u64)
                    .unwrap();
            }
        }
        drop(file);
        let options = CreateOptions {
            defer_reverse: true,
            ..CreateOptions::default()
        };
        store
            .create_backup("disk", BackupSource::File(path), options)
            .unwrap();
        let options = CreateOptions {
            defer_reverse: true,
            ..CreateOptions::default()
        };
        let reader = Box::new(std::io::Cursor::new(image.clone()));
        store
            .create_backup(
                "stdin",
                BackupSource::Reader {
                    reader,
                    name: "-".into(),
                },
                options,
            )
            .unwrap();
        images.push(image.clone());
    }
    let check_all = |store: &BackupStore, versions: &[u32], label: &str| {
        for &version in versions {
            let target = scratch.path().join(format!("out-{label}-{version}"));
            store
                .restore("disk", Some(version), RestoreTarget::File(target.clone()))
                .unwrap();
            assert!(
                fs::read(&target).unwrap() == images[version as usize - 1],
                "{label}: disk {version}"
            );
            let metadata = fs::metadata(&target).unwrap();
            assert!(
                metadata.blocks() * 512 < metadata.len() / 2,
                "{label}: restored image is sparse"
            );
            fs::remove_file(&target).unwrap();
            assert!(
                restore_bytes(store, "stdin", Some(version)) == images[version as usize - 1],
                "{label}: stream {version}"
            );
        }
        assert!(
            restore_bytes(store, "stdin", None) == *images.last().unwrap(),
            "{label}: newest"
        );
    };
    check_all(&store, &[1, 2, 4], "before");
    store.reverse_pending_backups("disk").unwrap();
    store.reverse_pending_backups("stdin").unwrap();
    check_all(&store, &[1, 2, 4], "after-reverse");
    store.delete("disk", 3, None).unwrap();
    store.delete("stdin", 3, None).unwrap();
    check_all(&store, &[1, 2, 4], "after-delete");
    assert_check_ok(&mut store);
}
