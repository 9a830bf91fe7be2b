//! One file system of the face, mounted through FUSE by this process, in a fresh repository
//! of its own (so that no two systems of an experiment deduplicate against each other).
//!
//! The workload reaches it as any program would: through the kernel's VFS and FUSE, the
//! face's request threads, the engine, the containers. [`MountedFs::cold_remount`] makes
//! the next reads reach the disk: it unmounts (the kernel forgets the mount's pages),
//! checkpoints and closes the engine (its chunk cache goes), drops the page cache's copy of
//! the repository's files (ours only, with `posix_fadvise`, after writing them out), opens
//! the engine again and mounts.
//!
//! [`MountedFs::create_serving`] mounts the way `onecopy mount` does ([`mount::serve`]):
//! with the control socket and the idle deduplicator, whose runs start after the file
//! system's `idle_seconds` without a request.

use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use onecopy_core::repository::Repository;
use onecopy_fs::engine::Caller;
use onecopy_fs::mount::{self, MountOptions, Mounted};
use onecopy_fs::{FsEngine, FsId, FsOptions, OpenMode, RuntimeOptions};

use crate::error::{LabError, Result};

const ROOT_CALLER: Caller = Caller { uid: 0, gid: 0 };
/// Name of the one file system of a bed.
const FILE_SYSTEM_NAME: &str = "lab";

/// How long a serving mount may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// The FUSE session of a bed.
enum Session {
    /// Requests only ([`mount::mount`]).
    Mounted(Mounted),
    /// As `onecopy mount` serves ([`mount::serve`]); the thread checkpoints the engine when
    /// the mount ends.
    Served(JoinHandle<onecopy_fs::Result<()>>),
}

/// A mounted file system; unmounted and removed on drop.
pub struct MountedFs {
    repository: PathBuf,
    mount_point: PathBuf,
    engine: Option<Arc<FsEngine>>,
    mounted: Option<Session>,
    fs: FsId,
    mount_options: MountOptions,
    /// Removed last, after the mount is gone.
    directory: Option<tempfile::TempDir>,
}

fn open_engine(repository: &Path) -> Result<Arc<FsEngine>> {
    let repository = Repository::open(repository)
        .map_err(|error| LabError::engine("opening the lab repository", error))?;
    let storage = repository
        .face_storage("fs")
        .map_err(|error| LabError::engine("opening the fs face", error))?;
    FsEngine::open(storage, RuntimeOptions::default(), OpenMode::ReadWrite)
        .map_err(|error| LabError::engine("opening the fs engine", error))
}

impl MountedFs {
    /// Creates a repository under `work`, a file system with `options` in it, and mounts it.
    pub fn create(work: &Path, options: FsOptions) -> Result<MountedFs> {
        MountedFs::create_with(work, options, MountOptions::default())
    }

    /// [`MountedFs::create`] with mount options.
    pub fn create_with(
        work: &Path,
        options: FsOptions,
        mount_options: MountOptions,
    ) -> Result<MountedFs> {
        mount::fuse_available().map_err(|error| LabError::Missing(error.to_string()))?;
        let directory = tempfile::Builder::new()
            .prefix("onecopy-lab-fs-")
            .tempdir_in(work)
            .map_err(|source| {
                LabError::io(format!("making a directory in {}", work.display()), source)
            })?;
        let repository = directory.path().join("repository");
        Repository::init(&repository)
            .map_err(|error| LabError::engine("creating the lab repository", error))?;
        let mount_point = directory.path().join("mnt");
        std::fs::create_dir(&mount_point).map_err(|source| {
            LabError::io(format!("creating {}", mount_point.display()), source)
        })?;
        let engine = open_engine(&repository)?;
        let fs = engine
            .create_file_system(FILE_SYSTEM_NAME, options, ROOT_CALLER)
            .map_err(|error| LabError::engine("creating the lab file system", error))?;
        let mut bed = MountedFs {
            repository,
            mount_point,
            engine: Some(engine),
            mounted: None,
            fs,
            mount_options,
            directory: Some(directory),
        };
        bed.mount()?;
        Ok(bed)
    }

    fn mount(&mut self) -> Result<()> {
        assert!(self.mounted.is_none(), "mount of a mounted bed");
        let engine = Arc::clone(self.engine.as_ref().expect("an open engine"));
        let mounted = mount::mount(
            engine,
            self.fs,
            &self.mount_point,
            &self.mount_options,
            &self.repository.join("fs"),
        )
        .map_err(|error| LabError::engine("mounting the lab file system", error))?;
        self.mounted = Some(Session::Mounted(mounted));
        Ok(())
    }

    /// Creates a repository under `work` and a file system with `options` in it, and serves
    /// it as `onecopy mount` does (control socket, idle deduplicator). A cold remount mounts
    /// it without them.
    pub fn create_serving(work: &Path, options: FsOptions) -> Result<MountedFs> {
        let mut bed = MountedFs::create(work, options)?;
        bed.unmount()?;
        let engine = Arc::clone(bed.engine());
        let (fs, mount_point) = (bed.fs, bed.mount_point.clone());
        let face_directory = bed.repository.join("fs");
        let (ready_sender, ready) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("lab-fs-serve".to_string())
            .spawn(move || {
                mount::serve(
                    engine,
                    fs,
                    &mount_point,
                    &MountOptions::default(),
                    &face_directory,
                    false,
                    move || {
                        let _ = ready_sender.send(());
                    },
                )
            })
            .map_err(|error| LabError::io("starting the serving thread", error))?;
        if ready.recv_timeout(READY_TIMEOUT).is_err() {
            let outcome = if thread.is_finished() {
                match thread.join() {
                    Ok(Err(error)) => error.to_string(),
                    _ => "the serving thread ended".to_string(),
                }
            } else {
                format!("not ready within {READY_TIMEOUT:?}")
            };
            return Err(LabError::engine("serving the lab file system", outcome));
        }
        bed.mounted = Some(Session::Served(thread));
        Ok(bed)
    }

    fn unmount(&mut self) -> Result<()> {
        match self.mounted.take() {
            None => {}
            Some(Session::Mounted(mounted)) => {
                mount::unmount(&self.mount_point)
                    .map_err(|error| LabError::engine("unmounting the lab file system", error))?;
                mounted
                    .wait()
                    .map_err(|error| LabError::engine("serving the lab file system", error))?;
            }
            Some(Session::Served(thread)) => {
                mount::unmount(&self.mount_point)
                    .map_err(|error| LabError::engine("unmounting the lab file system", error))?;
                let served = thread.join().map_err(|_| {
                    LabError::engine("serving the lab file system", "the serving thread panicked")
                })?;
                served.map_err(|error| LabError::engine("serving the lab file system", error))?;
                // serve checkpointed and closed the engine.
                self.engine = None;
            }
        }
        Ok(())
    }

    /// The engine serving the mount.
    pub fn engine(&self) -> &Arc<FsEngine> {
        self.engine.as_ref().expect("an open engine")
    }

    /// The file system's id in the engine.
    pub fn fs(&self) -> FsId {
        self.fs
    }

    /// Where it is mounted.
    pub fn mount_point(&self) -> &Path {
        &self.mount_point
    }

    /// Unmounts, closes the engine, drops the repository's files from the page cache, opens
    /// the engine again and mounts: the next reads find nothing cached.
    pub fn cold_remount(&mut self) -> Result<()> {
        self.unmount()?;
        if let Some(engine) = self.engine.take() {
            engine
                .shutdown()
                .map_err(|error| LabError::engine("checkpointing the lab file system", error))?;
        }
        evict(&self.repository)?;
        self.engine = Some(open_engine(&self.repository)?);
        self.mount()
    }

    /// Unmounts, checkpoints and removes everything.
    pub fn teardown(mut self) -> Result<()> {
        self.unmount()?;
        if let Some(engine) = self.engine.take() {
            engine
                .shutdown()
                .map_err(|error| LabError::engine("checkpointing the lab file system", error))?;
        }
        if let Some(directory) = self.directory.take() {
            let path = directory.path().display().to_string();
            directory
                .close()
                .map_err(|source| LabError::io(format!("removing {path}"), source))?;
        }
        Ok(())
    }
}

impl Drop for MountedFs {
    fn drop(&mut self) {
        if self.mounted.is_some() {
            if let Err(error) = self.unmount() {
                eprintln!("onecopy lab: {error}");
                // Removing files under a live mount would be worse than leaving them.
                if let Some(directory) = self.directory.take() {
                    let _ = directory.keep();
                }
            }
        }
    }
}

/// Drops the page cache's copy of every file under `directory` (ours only): each file is
/// written out first, since only clean pages can be dropped.
pub fn evict(directory: &Path) -> Result<()> {
    let entries = std::fs::read_dir(directory)
        .map_err(|source| LabError::io(format!("listing {}", directory.display()), source))?;
    for entry in entries {
        let path = entry
            .map_err(|source| LabError::io(format!("listing {}", directory.display()), source))?
            .path();
        if path.is_dir() {
            evict(&path)?;
        } else if path.is_file() {
            if let Ok(file) = std::fs::File::open(&path) {
                use std::os::unix::io::AsRawFd;
                let _ = file.sync_data();
                // SAFETY: fadvise on an open descriptor; it only drops clean cached pages.
                unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            }
        }
    }
    Ok(())
}
