//! `onecopy backup restore` and `create` through the binary, where users meet them: a restore
//! refuses to replace what TARGET holds unless told to, a directory backup restored to `-` is
//! a tar archive that GNU tar unpacks into the same tree, and a FIFO given as PATH is refused
//! at once instead of hanging with the lock held.

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr};
use std::fs;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, FileExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn onecopy(repository: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_onecopy"));
    command.env("ONECOPY_REPO", repository);
    command.env("ONECOPY_PASSWORD", "test password");
    command
}

/// Runs `command` and returns its output, failing the test if it runs longer than `limit`
/// (a regression that hangs fails instead of stalling the suite).
fn output_within(command: &mut Command, limit: Duration) -> Output {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("onecopy runs");
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out_reader = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        stdout.read_to_end(&mut bytes).unwrap();
        bytes
    });
    let err_reader = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        stderr.read_to_end(&mut bytes).unwrap();
        bytes
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{command:?} still ran after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out_reader.join().unwrap(),
        stderr: err_reader.join().unwrap(),
    }
}

fn run(command: &mut Command) -> Output {
    let output = output_within(command, Duration::from_secs(120));
    assert!(
        output.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn fails(command: &mut Command) -> String {
    let output = output_within(command, Duration::from_secs(120));
    assert!(!output.status.success(), "{command:?} succeeded");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn data(seed: u64, bytes: usize) -> Vec<u8> {
    let mut state = seed;
    (0..bytes)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            b'a' + (state >> 60) as u8
        })
        .collect()
}

/// Goal: a restore into a non-empty directory, or onto an existing file, is refused with a
/// message naming what would be replaced and how to proceed, and changes nothing; with
/// `--overwrite` the backup's entries replace the target's and other entries stay. Method:
/// restore a directory backup and a stream backup onto prepared targets, with and without
/// the option.
#[test]
fn restore_refuses_to_replace_without_overwrite() {
    let scratch = tempfile::tempdir().unwrap();
    let repository = scratch.path().join("repository");
    run(onecopy(&repository).arg("init"));
    let tree = scratch.path().join("tree");
    fs::create_dir_all(tree.join("sub")).unwrap();
    fs::write(tree.join("sub/a"), data(1, 50_000)).unwrap();
    fs::write(tree.join("b"), b"backed up").unwrap();
    run(onecopy(&repository)
        .args(["backup", "create", "home"])
        .arg(&tree));

    let target = scratch.path().join("target");
    fs::create_dir_all(target.join("sub")).unwrap();
    fs::write(target.join("b"), b"user's own b").unwrap();
    fs::write(target.join("stale"), b"not in the backup").unwrap();
    let message = fails(
        onecopy(&repository)
            .args(["backup", "restore", "home"])
            .arg(&target),
    );
    assert!(message.contains("not empty"), "{message}");
    assert!(message.contains("--overwrite"), "{message}");
    assert!(
        message.contains('b'),
        "names what would be replaced: {message}"
    );
    assert_eq!(fs::read(target.join("b")).unwrap(), b"user's own b");
    assert!(!target.join("sub/a").exists(), "nothing was restored");

    run(onecopy(&repository)
        .args(["backup", "restore", "home", "--overwrite"])
        .arg(&target));
    assert_eq!(fs::read(target.join("b")).unwrap(), b"backed up");
    assert_eq!(fs::read(target.join("sub/a")).unwrap(), data(1, 50_000));
    assert_eq!(
        fs::read(target.join("stale")).unwrap(),
        b"not in the backup",
        "--overwrite replaces the backup's entries and keeps the others"
    );

    let image = scratch.path().join("disk.img");
    fs::write(&image, data(2, 200_000)).unwrap();
    run(onecopy(&repository)
        .args(["backup", "create", "disk"])
        .arg(&image));
    let existing = scratch.path().join("existing.img");
    fs::write(&existing, b"precious").unwrap();
    let message = fails(
        onecopy(&repository)
            .args(["backup", "restore", "disk"])
            .arg(&existing),
    );
    assert!(message.contains("exists"), "{message}");
    assert!(message.contains("--overwrite"), "{message}");
    assert_eq!(fs::read(&existing).unwrap(), b"precious");
    run(onecopy(&repository)
        .args(["backup", "restore", "disk", "--overwrite"])
        .arg(&existing));
    assert!(fs::read(&existing).unwrap() == data(2, 200_000));
}

/// Everything `tar x` must reproduce about one name.
#[derive(Debug, PartialEq, Eq)]
struct Description {
    kind: &'static str,
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: (i64, i64),
    size: u64,
    content: Option<Vec<u8>>,
    link: Option<Vec<u8>>,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// The smallest path with the same inode (hard links).
    same_inode_as: Vec<u8>,
}

fn user_xattrs(path: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let c_path = CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut names = vec![0u8; 65536];
    // SAFETY: the buffer is valid for its length; the path is NUL-terminated.
    let length =
        unsafe { libc::llistxattr(c_path.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    assert!(length >= 0, "listing attributes of {}", path.display());
    names.truncate(length as usize);
    let mut out = Vec::new();
    for name in names.split(|&byte| byte == 0) {
        if !name.starts_with(b"user.") {
            continue;
        }
        let c_name = CString::new(name).unwrap();
        let mut value = vec![0u8; 65536];
        // SAFETY: as above.
        let read = unsafe {
            libc::lgetxattr(
                c_path.as_ptr(),
                c_name.as_ptr(),
                value.as_mut_ptr().cast(),
                value.len(),
            )
        };
        assert!(read >= 0);
        value.truncate(read as usize);
        out.push((name.to_vec(), value));
    }
    out.sort();
    out
}

fn describe(root: &Path) -> BTreeMap<Vec<u8>, Description> {
    let mut out = BTreeMap::new();
    let mut first_of_inode: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let mut stack = vec![Vec::<u8>::new()];
    while let Some(relative) = stack.pop() {
        let path = if relative.is_empty() {
            root.to_path_buf()
        } else {
            root.join(OsStr::from_bytes(&relative))
        };
        let metadata = fs::symlink_metadata(&path).unwrap();
        let file_type = metadata.file_type();
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
            let first = first_of_inode
                .entry(metadata.ino())
                .or_insert_with(|| relative.clone());
            if relative < *first {
                *first = relative.clone();
            }
            metadata.ino().to_le_bytes().to_vec()
        } else {
            relative.clone()
        };
        out.insert(
            relative.clone(),
            Description {
                kind: if file_type.is_dir() {
                    "directory"
                } else if file_type.is_symlink() {
                    "symlink"
                } else if file_type.is_file() {
                    "file"
                } else if file_type.is_fifo() {
                    "fifo"
                } else {
                    "other"
                },
                mode: metadata.mode() & 0o7777,
                uid: metadata.uid(),
                gid: metadata.gid(),
                mtime: (metadata.mtime(), metadata.mtime_nsec()),
                size: if file_type.is_dir() {
                    0
                } else {
                    metadata.len()
                },
                content: file_type.is_file().then(|| fs::read(&path).unwrap()),
                link: file_type.is_symlink().then(|| {
                    fs::read_link(&path)
                        .unwrap()
                        .as_os_str()
                        .as_bytes()
                        .to_vec()
                }),
                xattrs: if file_type.is_symlink() {
                    Vec::new()
                } else {
                    user_xattrs(&path)
                },
                same_inode_as,
            },
        );
    }
    // Name hard link groups by their smallest path, whatever the inode numbers.
    for description in out.values_mut() {
        if description.kind == "file" {
            let inode = u64::from_le_bytes(description.same_inode_as[..8].try_into().unwrap());
            description.same_inode_as = first_of_inode[&inode].clone();
        }
    }
    out
}

fn set_times(path: &Path, seconds: i64, nanoseconds: i64) {
    let c_path = CString::new(path.as_os_str().as_bytes()).unwrap();
    let times = [
        libc::timespec {
            tv_sec: seconds,
            tv_nsec: nanoseconds,
        },
        libc::timespec {
            tv_sec: seconds,
            tv_nsec: nanoseconds,
        },
    ];
    // SAFETY: a valid path and two timespecs.
    let result = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c_path.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(result, 0, "setting the times of {}", path.display());
}

fn set_user_xattr(path: &Path, name: &str, value: &[u8]) {
    let c_path = CString::new(path.as_os_str().as_bytes()).unwrap();
    let c_name = CString::new(name).unwrap();
    // SAFETY: valid strings and a buffer of `value.len()` bytes.
    let result = unsafe {
        libc::lsetxattr(
            c_path.as_ptr(),
            c_name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(
        result,
        0,
        "the test directory's file system must support user attributes: {}",
        std::io::Error::last_os_error()
    );
}

/// GNU tar, or a failure that says how to install it.
fn gnu_tar() -> PathBuf {
    let output = Command::new("tar").arg("--version").output();
    match output {
        Ok(output) if String::from_utf8_lossy(&output.stdout).contains("GNU tar") => {
            PathBuf::from("tar")
        }
        _ => panic!("this test needs GNU tar: apt-get install tar (scripts/setup.sh does)"),
    }
}

/// Goal: `backup restore SERIES -` of a directory backup writes a pax archive that GNU tar
/// extracts into the same tree: contents, modes (set-user-id too), owners, nanosecond
/// modification times, symbolic links, hard links, user attributes, a FIFO, a sparse file
/// (kept sparse), a name longer than 100 bytes and a name that is not UTF-8. Method: back up
/// such a tree, pipe the restore into `tar -x`, compare both trees entry by entry.
#[test]
fn restore_to_standard_output_is_a_tar_archive() {
    let tar = gnu_tar();
    let scratch = tempfile::tempdir().unwrap();
    let repository = scratch.path().join("repository");
    run(onecopy(&repository).arg("init"));
    let tree = scratch.path().join("tree");
    let long_directory = "d".repeat(120);
    fs::create_dir_all(tree.join("docs/deep")).unwrap();
    fs::create_dir_all(tree.join(&long_directory)).unwrap();
    fs::write(tree.join("docs/report.txt"), data(3, 70_000)).unwrap();
    fs::write(tree.join("docs/deep/small"), b"small").unwrap();
    fs::write(tree.join("empty"), b"").unwrap();
    fs::write(
        tree.join(&long_directory).join("n".repeat(200)),
        b"a long path",
    )
    .unwrap();
    fs::write(tree.join(OsStr::from_bytes(b"caf\xe9")), b"latin-1 name").unwrap();
    fs::write(
        tree.join(&long_directory)
            .join(OsStr::from_bytes(&[b'\xff'; 150])),
        b"a long name that is not UTF-8",
    )
    .unwrap();
    let sparse = fs::File::create(tree.join("sparse.img")).unwrap();
    sparse.set_len(8 << 20).unwrap();
    sparse.write_all_at(b"start", 0).unwrap();
    sparse.write_all_at(&data(4, 10_000), 3 << 20).unwrap();
    drop(sparse);
    symlink("docs/report.txt", tree.join("link")).unwrap();
    symlink("/nonexistent/target", tree.join("dangling")).unwrap();
    symlink("t".repeat(150), tree.join("long-link")).unwrap();
    fs::hard_link(tree.join("docs/report.txt"), tree.join("hard")).unwrap();
    fs::write(tree.join("setuid"), b"#!/bin/sh\n").unwrap();
    fs::set_permissions(tree.join("setuid"), fs::Permissions::from_mode(0o4755)).unwrap();
    fs::set_permissions(tree.join("docs/deep"), fs::Permissions::from_mode(0o700)).unwrap();
    let fifo = CString::new(tree.join("fifo").as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o640) }, 0);
    std::os::unix::fs::lchown(tree.join("docs/report.txt"), Some(1234), Some(5678)).unwrap();
    std::os::unix::fs::lchown(tree.join("link"), Some(42), Some(43)).unwrap();
    std::os::unix::fs::lchown(tree.join("docs"), Some(3_000_000), Some(4_000_000)).unwrap();
    set_user_xattr(
        &tree.join("docs/report.txt"),
        "user.origin",
        b"test\x00bytes",
    );
    set_user_xattr(&tree.join("docs"), "user.directory", b"yes");
    for (name, seconds) in [
        ("docs/deep/small", 1_000_000_000),
        ("link", 1_100_000_000),
        ("docs/deep", 1_200_000_000),
        ("docs", 1_300_000_000),
        ("", 1_400_000_000),
    ] {
        set_times(&tree.join(name), seconds, 123_456_789);
    }
    let expected = describe(&tree);
    run(onecopy(&repository)
        .args(["backup", "create", "home"])
        .arg(&tree));

    let archive = scratch.path().join("home.tar");
    let restored = run(onecopy(&repository).args(["backup", "restore", "home", "-"]));
    fs::write(&archive, &restored.stdout).unwrap();
    let out = scratch.path().join("out");
    fs::create_dir(&out).unwrap();
    let extracted = output_within(
        Command::new(&tar)
            .args([
                "--extract",
                "--xattrs",
                "--xattrs-include=user.*",
                "--same-permissions",
                "--same-owner",
                "--numeric-owner",
                "--file",
            ])
            .arg(&archive)
            .arg("--directory")
            .arg(&out),
        Duration::from_secs(60),
    );
    assert!(
        extracted.status.success() && extracted.stderr.is_empty(),
        "tar failed or warned: {}",
        String::from_utf8_lossy(&extracted.stderr)
    );
    let restored = describe(&out);
    assert_eq!(
        restored.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>()
    );
    for (path, description) in &expected {
        assert_eq!(
            restored.get(path),
            Some(description),
            "{}",
            String::from_utf8_lossy(path)
        );
    }
    let sparse = fs::metadata(out.join("sparse.img")).unwrap();
    assert!(
        sparse.blocks() * 512 < sparse.len() / 2,
        "the sparse file stays sparse"
    );
}

/// Goal: a FIFO given as PATH is refused at once, before the backup lock is taken, instead
/// of blocking forever on an open that waits for a writer. Method: `backup create` of a FIFO
/// with a time limit, then a command that needs the lock.
#[test]
fn create_refuses_a_fifo_at_once() {
    let scratch = tempfile::tempdir().unwrap();
    let repository = scratch.path().join("repository");
    run(onecopy(&repository).arg("init"));
    let fifo = scratch.path().join("pipe");
    let c_fifo = CString::new(fifo.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid path.
    assert_eq!(unsafe { libc::mkfifo(c_fifo.as_ptr(), 0o600) }, 0);
    let output = output_within(
        onecopy(&repository)
            .args(["backup", "create", "pipe"])
            .arg(&fifo),
        Duration::from_secs(20),
    );
    assert!(!output.status.success());
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(message.contains("FIFO"), "{message}");
    run(onecopy(&repository).args(["backup", "list"]));
}
