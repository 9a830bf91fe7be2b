//! Mounting a file system in the test process, and comparing a mounted tree with a
//! reference directory.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashSet};
use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use onecopy_core::repository::Repository;
use onecopy_fs::engine::Caller;
use onecopy_fs::mount::{self, MountOptions, Mounted};
use onecopy_fs::{FsEngine, FsId, FsOptions, OpenMode, RuntimeOptions};

/// Fails (never skips) when FUSE cannot run here, saying what to install.
pub fn require_fuse() {
    if let Err(error) = mount::fuse_available() {
        panic!("this test mounts a FUSE file system and cannot run: {error}");
    }
}

/// A repository with one file system, mounted in this process.
pub struct TestMount {
    pub repository: PathBuf,
    pub mount_point: PathBuf,
    pub engine: Option<Arc<FsEngine>>,
    pub fs: FsId,
    mounted: Option<Mounted>,
}

impl TestMount {
    /// Creates the repository and file system `name` with `options` under `base`, and mounts
    /// it.
    pub fn create(base: &Path, options: FsOptions) -> TestMount {
        require_fuse();
        let repository = base.join("repository");
        Repository::init(&repository).unwrap();
        let engine = open_engine(&repository);
        let fs = engine
            .create_file_system("test", options, Caller { uid: 0, gid: 0 })
            .unwrap();
        engine.shutdown().unwrap();
        drop(engine);
        let mount_point = base.join("mnt");
        std::fs::create_dir_all(&mount_point).unwrap();
        let mut test = TestMount {
            repository,
            mount_point,
            engine: None,
            fs,
            mounted: None,
        };
        test.mount();
        test
    }

    /// Mounts (again).
    pub fn mount(&mut self) {
        self.mount_with(&MountOptions::default());
    }

    /// Mounts (again) with `options`.
    pub fn mount_with(&mut self, options: &MountOptions) {
        assert!(self.mounted.is_none());
        let engine = open_engine(&self.repository);
        let mounted = mount::mount(
            Arc::clone(&engine),
            self.fs,
            &self.mount_point,
            options,
            &self.repository.join("fs"),
        )
        .unwrap();
        self.engine = Some(engine);
        self.mounted = Some(mounted);
    }

    pub fn engine(&self) -> &Arc<FsEngine> {
        self.engine.as_ref().expect("mounted")
    }

    /// Unmounts; `clean` checkpoints, otherwise the engine is dropped as a killed process
    /// leaves it (what was not synced is lost).
    pub fn unmount(&mut self, clean: bool) {
        let mounted = self.mounted.take().expect("mounted");
        mounted.unmounter().lock().unmount().unwrap();
        mounted.wait().unwrap();
        let engine = self.engine.take().unwrap();
        if clean {
            engine.shutdown().unwrap();
        }
        drop(engine);
    }
}

impl Drop for TestMount {
    fn drop(&mut self) {
        if let Some(mounted) = self.mounted.take() {
            let _ = mounted.unmounter().lock().unmount();
            let _ = mounted.wait();
        }
    }
}

pub fn open_engine(repository: &Path) -> Arc<FsEngine> {
    let repository = Repository::open(repository).unwrap();
    FsEngine::open(
        repository.face_storage("fs").unwrap(),
        RuntimeOptions::default(),
        OpenMode::ReadWrite,
    )
    .unwrap()
}

fn c_path(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).unwrap()
}

/// The `user.` xattrs of `path` (not following a symbolic link), by name.
pub fn user_xattrs(path: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let name = c_path(path);
    let mut list = vec![0u8; 65536];
    // SAFETY: the buffers outlive the calls and their lengths are passed.
    let length = unsafe { libc::llistxattr(name.as_ptr(), list.as_mut_ptr().cast(), list.len()) };
    assert!(length >= 0, "listxattr {}", path.display());
    let mut out = BTreeMap::new();
    for key in list[..length as usize]
        .split(|&b| b == 0)
        .filter(|k| !k.is_empty())
    {
        if !key.starts_with(b"user.") {
            continue;
        }
        let key_c = CString::new(key).unwrap();
        let mut value = vec![0u8; 65536];
        // SAFETY: as above.
        let got = unsafe {
            libc::lgetxattr(
                name.as_ptr(),
                key_c.as_ptr(),
                value.as_mut_ptr().cast(),
                value.len(),
            )
        };
        assert!(got >= 0, "getxattr {}", path.display());
        value.truncate(got as usize);
        out.insert(key.to_vec(), value);
    }
    out
}

/// Compares the trees under `mounted` and `reference`: names, types, modes, sizes, link
/// counts, contents, link targets, user xattrs, and the modification times of the files
/// whose reference inode is in `explicit_mtimes` (set by utimens; other times come from two
/// different clocks). Returns the first difference.
pub fn compare_trees(
    mounted: &Path,
    reference: &Path,
    explicit_mtimes: &HashSet<u64>,
) -> Result<(), String> {
    let mut pending = vec![PathBuf::new()];
    while let Some(relative) = pending.pop() {
        let list = |root: &Path| -> Vec<Vec<u8>> {
            let mut names: Vec<Vec<u8>> = std::fs::read_dir(root.join(&relative))
                .unwrap()
                .map(|entry| entry.unwrap().file_name().as_bytes().to_vec())
                .collect();
            names.sort();
            names
        };
        let (ours, theirs) = (list(mounted), list(reference));
        if ours != theirs {
            return Err(format!(
                "{}: entries {:?} against {:?}",
                relative.display(),
                lossy(&ours),
                lossy(&theirs)
            ));
        }
        for name in ours {
            let path = relative.join(OsStr::from_bytes(&name));
            let a = std::fs::symlink_metadata(mounted.join(&path)).unwrap();
            let b = std::fs::symlink_metadata(reference.join(&path)).unwrap();
            let what = path.display();
            if a.file_type() != b.file_type() {
                return Err(format!(
                    "{what}: type {:?} against {:?}",
                    a.file_type(),
                    b.file_type()
                ));
            }
            if a.nlink() != b.nlink() {
                return Err(format!("{what}: nlink {} against {}", a.nlink(), b.nlink()));
            }
            if a.file_type().is_symlink() {
                let targets = (
                    std::fs::read_link(mounted.join(&path)).unwrap(),
                    std::fs::read_link(reference.join(&path)).unwrap(),
                );
                if targets.0 != targets.1 {
                    return Err(format!(
                        "{what}: target {:?} against {:?}",
                        targets.0, targets.1
                    ));
                }
                continue;
            }
            if a.mode() != b.mode() {
                return Err(format!(
                    "{what}: mode {:o} against {:o}",
                    a.mode(),
                    b.mode()
                ));
            }
            if (a.uid(), a.gid()) != (b.uid(), b.gid()) {
                return Err(format!("{what}: owner differs"));
            }
            if user_xattrs(&mounted.join(&path)) != user_xattrs(&reference.join(&path)) {
                return Err(format!("{what}: xattrs differ"));
            }
            if a.is_dir() {
                pending.push(path);
                continue;
            }
            if !a.is_file() {
                // FIFOs, sockets and devices have no contents to read.
                continue;
            }
            if a.len() != b.len() {
                return Err(format!("{what}: size {} against {}", a.len(), b.len()));
            }
            if std::fs::read(mounted.join(&path)).unwrap()
                != std::fs::read(reference.join(&path)).unwrap()
            {
                return Err(format!("{what}: contents differ"));
            }
            if explicit_mtimes.contains(&b.ino())
                && (a.mtime(), a.mtime_nsec()) != (b.mtime(), b.mtime_nsec())
            {
                return Err(format!(
                    "{what}: mtime {}.{} against {}.{}",
                    a.mtime(),
                    a.mtime_nsec(),
                    b.mtime(),
                    b.mtime_nsec()
                ));
            }
        }
    }
    Ok(())
}

fn lossy(names: &[Vec<u8>]) -> Vec<String> {
    names
        .iter()
        .map(|name| String::from_utf8_lossy(name).into_owned())
        .collect()
}
