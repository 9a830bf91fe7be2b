//! `onecopy backup mount` through the binary: every version as a directory equal to the
//! source tree of its time, reads at random offsets, EROFS on writes, both ways to unmount.

use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// Fails (never skips) when FUSE cannot run here, saying what to install.
fn require_fuse() {
    assert!(
        Path::new("/dev/fuse").exists(),
        "this test mounts a FUSE file system: /dev/fuse is missing (load the fuse module, or \
         pass --device /dev/fuse to the container)"
    );
    let found = std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|directory| directory.join("fusermount3").exists())
    });
    assert!(
        found,
        "this test needs fusermount3: install the fuse3 package"
    );
}

fn onecopy(repository: &Path, arguments: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_onecopy"))
        .arg("--repo")
        .arg(repository)
        .env("ONECOPY_PASSWORD", "test password")
        .args(arguments)
        .output()
        .unwrap()
}

fn ok(repository: &Path, arguments: &[&str]) -> String {
    let arguments: Vec<&std::ffi::OsStr> = arguments.iter().map(|a| a.as_ref()).collect();
    let output = onecopy(repository, &arguments);
    assert!(
        output.status.success(),
        "onecopy {arguments:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn data(seed: u64, bytes: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..bytes)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

fn is_mounted(path: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    let path = path.to_str().unwrap();
    mounts
        .lines()
        .any(|line| line.split(' ').nth(1) == Some(path))
}

fn wait_unmounted(path: &Path) {
    let started = Instant::now();
    while is_mounted(path) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{} stays mounted",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Unmounts on the way out, so that a failed test leaves no mount behind.
struct Unmount<'a>(&'a Path);

impl Drop for Unmount<'_> {
    fn drop(&mut self) {
        if is_mounted(self.0) {
            let _ = Command::new("fusermount3")
                .arg("-u")
                .arg("-z")
                .arg(self.0)
                .status();
        }
    }
}

fn xattrs(path: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let name = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut list = vec![0u8; 64 << 10];
    // SAFETY: the buffers outlive the calls, their lengths are given.
    let length = unsafe { libc::llistxattr(name.as_ptr(), list.as_mut_ptr().cast(), list.len()) };
    assert!(length >= 0, "llistxattr {}", path.display());
    let mut found = BTreeMap::new();
    for attribute in list[..length as usize]
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
    {
        let key = std::ffi::CString::new(attribute).unwrap();
        let mut value = vec![0u8; 64 << 10];
        // SAFETY: as above.
        let size = unsafe {
            libc::lgetxattr(
                name.as_ptr(),
                key.as_ptr(),
                value.as_mut_ptr().cast(),
                value.len(),
            )
        };
        assert!(size >= 0, "lgetxattr {}", path.display());
        value.truncate(size as usize);
        found.insert(attribute.to_vec(), value);
    }
    found
}

/// Compares metadata of every entry of `expected` and `actual` (contents by `diff -r`):
/// kind, mode, owner, size, mtime, link target, xattrs, and hard links as one inode.
fn assert_same_tree(expected: &Path, actual: &Path) {
    let output = Command::new("diff")
        .arg("-r")
        .arg("--no-dereference")
        .arg(expected)
        .arg(actual)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "diff -r {} {}: {}",
        expected.display(),
        actual.display(),
        String::from_utf8_lossy(&output.stdout)
    );
    let mut inodes_expected: BTreeMap<u64, PathBuf> = BTreeMap::new();
    let mut pairs = Vec::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(relative) = pending.pop() {
        let (e, a) = (expected.join(&relative), actual.join(&relative));
        let (me, ma) = (
            std::fs::symlink_metadata(&e).unwrap(),
            std::fs::symlink_metadata(&a).unwrap(),
        );
        let what = relative.display().to_string();
        assert_eq!(me.mode(), ma.mode(), "mode of {what}");
        assert_eq!(
            (me.uid(), me.gid()),
            (ma.uid(), ma.gid()),
            "owner of {what}"
        );
        assert_eq!(
            (me.mtime(), me.mtime_nsec()),
            (ma.mtime(), ma.mtime_nsec()),
            "mtime of {what}"
        );
        assert_eq!(xattrs(&e), xattrs(&a), "xattrs of {what}");
        if me.is_file() {
            assert_eq!(me.len(), ma.len(), "size of {what}");
            assert_eq!(me.nlink(), ma.nlink(), "links of {what}");
            pairs.push((me.ino(), ma.ino(), relative.clone()));
            inodes_expected.entry(me.ino()).or_insert(relative.clone());
        }
        if me.file_type().is_symlink() {
            assert_eq!(
                std::fs::read_link(&e).unwrap(),
                std::fs::read_link(&a).unwrap(),
                "{what}"
            );
        }
        if me.is_dir() {
            for child in std::fs::read_dir(&e).unwrap() {
                pending.push(relative.join(child.unwrap().file_name()));
            }
        }
    }
    // Names sharing an inode in the source share one in the mount, and only those.
    for (source_a, mount_a, path_a) in &pairs {
        for (source_b, mount_b, path_b) in &pairs {
            assert_eq!(
                source_a == source_b,
                mount_a == mount_b,
                "{path_a:?} and {path_b:?}"
            );
        }
    }
}

/// Goal: a mounted series shows each version as the source tree of its time (contents,
/// modes, owners, mtimes, symlinks, hard links, xattrs), `latest`, large-file reads at random
/// offsets, EROFS on writes, unmounting by `onecopy umount` and by `fusermount3 -u`.
/// Method: two backups of a tree changed between them; `cp -a` keeps the first state.
#[test]
fn mounted_versions_match_their_sources() {
    require_fuse();
    let base = tempfile::tempdir().unwrap();
    let repository = base.path().join("repository");
    let source = base.path().join("source");
    let first = base.path().join("first");
    let mount_point = base.path().join("mnt");
    std::fs::create_dir_all(source.join("dir/sub")).unwrap();
    std::fs::create_dir(&mount_point).unwrap();
    let _unmount = Unmount(&mount_point);
    let large = data(1, 24 << 20);
    std::fs::write(source.join("large.bin"), &large).unwrap();
    std::fs::write(source.join("dir/small.txt"), b"hello\n").unwrap();
    std::fs::write(source.join("dir/sub/other"), data(2, 100_000)).unwrap();
    std::fs::write(source.join("empty"), b"").unwrap();
    std::os::unix::fs::symlink("dir/small.txt", source.join("link")).unwrap();
    std::fs::hard_link(source.join("dir/small.txt"), source.join("hard")).unwrap();
    let sparse = std::fs::File::create(source.join("sparse")).unwrap();
    sparse.write_all_at(b"tail", 10 << 20).unwrap();
    drop(sparse);
    let path = std::ffi::CString::new(source.join("dir/small.txt").as_os_str().as_bytes()).unwrap();
    // SAFETY: the strings are NUL-terminated and the value outlives the call.
    let set = unsafe {
        libc::setxattr(
            path.as_ptr(),
            c"user.colour".as_ptr(),
            b"blue".as_ptr().cast(),
            4,
            0,
        )
    };
    assert_eq!(set, 0, "setxattr: {}", std::io::Error::last_os_error());
    std::fs::set_permissions(
        source.join("dir/sub/other"),
        std::os::unix::fs::PermissionsExt::from_mode(0o640),
    )
    .unwrap();
    std::os::unix::fs::chown(source.join("empty"), Some(1234), Some(5678)).unwrap();
    ok(&repository, &["init"]);
    ok(
        &repository,
        &["backup", "create", "tree", source.to_str().unwrap()],
    );
    assert!(Command::new("cp")
        .arg("-a")
        .arg(&source)
        .arg(&first)
        .status()
        .unwrap()
        .success());
    // Changes for version 2.
    let mut changed = large.clone();
    changed[5 << 20..(5 << 20) + 4096].copy_from_slice(&data(3, 4096));
    std::fs::write(source.join("large.bin"), &changed).unwrap();
    std::fs::remove_file(source.join("dir/sub/other")).unwrap();
    std::fs::write(source.join("dir/new"), b"new file").unwrap();
    std::fs::set_permissions(
        source.join("dir/small.txt"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    ok(
        &repository,
        &["backup", "create", "tree", source.to_str().unwrap()],
    );

    ok(
        &repository,
        &["backup", "mount", "tree", mount_point.to_str().unwrap()],
    );
    let mut names: Vec<String> = std::fs::read_dir(&mount_point)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["1", "2", "latest"]);
    assert_eq!(
        std::fs::read_link(mount_point.join("latest")).unwrap(),
        Path::new("2")
    );
    assert_same_tree(&first, &mount_point.join("1"));
    assert_same_tree(&source, &mount_point.join("2"));
    assert_same_tree(&source, &mount_point.join("latest").join("."));

    // Random offsets of the large file, in both versions.
    let mounted = std::fs::File::open(mount_point.join("1/large.bin")).unwrap();
    let newer = std::fs::File::open(mount_point.join("2/large.bin")).unwrap();
    let mut state = 7u64;
    for _ in 0..200 {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let offset = (state >> 20) as usize % large.len();
        let length = ((state >> 8) as usize % 300_000).min(large.len() - offset);
        let mut buffer = vec![0u8; length];
        mounted.read_exact_at(&mut buffer, offset as u64).unwrap();
        assert!(
            buffer == large[offset..offset + length],
            "version 1 at {offset}+{length}"
        );
        newer.read_exact_at(&mut buffer, offset as u64).unwrap();
        assert!(
            buffer == changed[offset..offset + length],
            "version 2 at {offset}+{length}"
        );
    }

    // Every change fails with EROFS.
    let erofs = |result: std::io::Result<()>, what: &str| {
        let error = result.expect_err(what);
        assert_eq!(error.raw_os_error(), Some(libc::EROFS), "{what}: {error}");
    };
    erofs(
        std::fs::OpenOptions::new()
            .write(true)
            .open(mount_point.join("2/dir/new"))
            .map(drop),
        "open for writing",
    );
    erofs(
        std::fs::write(mount_point.join("2/created"), b"x"),
        "create",
    );
    erofs(std::fs::create_dir(mount_point.join("2/newdir")), "mkdir");
    erofs(std::fs::remove_file(mount_point.join("2/empty")), "unlink");
    erofs(
        std::fs::rename(mount_point.join("2/empty"), mount_point.join("2/moved")),
        "rename",
    );
    erofs(
        std::fs::set_permissions(
            mount_point.join("2/empty"),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        ),
        "chmod",
    );
    drop((mounted, newer));

    // While mounted the store is locked; `onecopy umount` unmounts and waits for the server.
    let busy = onecopy(&repository, &["backup".as_ref(), "list".as_ref()]);
    assert!(!busy.status.success(), "the store is locked while mounted");
    ok(&repository, &["umount", mount_point.to_str().unwrap()]);
    assert!(!is_mounted(&mount_point));
    ok(&repository, &["backup", "list"]);

    // fusermount3 -u ends the serving process too.
    ok(
        &repository,
        &["backup", "mount", "tree", mount_point.to_str().unwrap()],
    );
    assert_eq!(
        std::fs::read(mount_point.join("1/dir/small.txt")).unwrap(),
        b"hello\n"
    );
    assert!(Command::new("fusermount3")
        .arg("-u")
        .arg(&mount_point)
        .status()
        .unwrap()
        .success());
    wait_unmounted(&mount_point);
    let started = Instant::now();
    while !onecopy(&repository, &["backup".as_ref(), "list".as_ref()])
        .status
        .success()
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the mount process still holds the store"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
