//! Mounting: the FUSE session, the control socket, the idle deduplicator, and a clean end on
//! unmount (`fusermount3 -u`, `onecopy umount`) or a signal (SIGTERM, SIGINT, SIGHUP).
//!
//! The mount is ready when [`serve`] calls its `ready` callback: the kernel has answered the
//! session's INIT, so the mount point already shows the file system. When the session ends,
//! the background threads stop and the engine checkpoints, so the next mount replays nothing.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use fuser::{Config, MountOption, Session, SessionACL, SessionUnmounter};
use parking_lot::Mutex;

use crate::changes::FsId;
use crate::control::ControlServer;
use crate::dedup::{self, Yield};
use crate::engine::FsEngine;
use crate::error::{FsError, Result};
use crate::fuse::FuseFileSystem;

/// Request threads by default.
pub const THREADS_DEFAULT: usize = 4;
/// Most request threads.
pub const THREADS_MAX: usize = 64;
/// How often the idle deduplicator looks at the clock.
const IDLE_POLL: Duration = Duration::from_millis(200);

/// Options of `onecopy mount -o`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountOptions {
    /// Let other users than the mounting one in (`allow_other`; the kernel still checks
    /// modes).
    pub allow_other: bool,
    /// Mount read-only (`ro`): nothing is written, not even recovery.
    pub read_only: bool,
    /// Request threads (`threads=N`).
    pub threads: usize,
    /// Keep each file's page cache across opens (`keep_cache`). Every change of a file goes
    /// through this mount (deduplication changes no byte), so the cache cannot go stale, and
    /// repeated readings of a file cost no request. Off by default: reads served from the
    /// page cache never reach the I/O monitor, which then ranks files by their cache misses
    /// only. Without it the kernel drops a file's cache at each open, so every opening's
    /// first reading is counted (as the paper's monitor counts reads at the VFS).
    pub keep_cache: bool,
    /// Leave reads out of the I/O monitor (`no_monitor`): no read counts, access times or
    /// rank-queue moves, so files never rank 1 or 2 and turn cold by their last write. For
    /// measuring what the monitor costs whole programs (the lab's Fig. 15).
    pub no_monitor: bool,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            allow_other: false,
            read_only: false,
            threads: THREADS_DEFAULT,
            keep_cache: false,
            no_monitor: false,
        }
    }
}

impl MountOptions {
    /// Parses a comma-separated list: `allow_other`, `ro`, `rw`, `keep_cache`, `no_monitor`,
    /// `threads=N`.
    pub fn parse(text: &str) -> Result<MountOptions> {
        let mut options = MountOptions::default();
        for option in text.split(',').map(str::trim).filter(|o| !o.is_empty()) {
            match option {
                "allow_other" => options.allow_other = true,
                "ro" => options.read_only = true,
                "rw" => options.read_only = false,
                "keep_cache" => options.keep_cache = true,
                "no_monitor" => options.no_monitor = true,
                _ => match option.strip_prefix("threads=") {
                    Some(count) => {
                        options.threads = count
                            .parse()
                            .ok()
                            .filter(|count| (1..=THREADS_MAX).contains(count))
                            .ok_or_else(|| {
                                FsError::InvalidArgument(format!(
                                    "threads={count}: give 1 to {THREADS_MAX}"
                                ))
                            })?
                    }
                    None => {
                        return Err(FsError::InvalidArgument(format!(
                            "unknown mount option {option:?} (known: allow_other, ro, rw, \
                             keep_cache, no_monitor, threads=N)"
                        )))
                    }
                },
            }
        }
        Ok(options)
    }
}

/// Fails with a message saying what to install when FUSE cannot work here.
pub fn fuse_available() -> Result<()> {
    if !Path::new("/dev/fuse").exists() {
        return Err(FsError::InvalidArgument(
            "/dev/fuse is missing: load the fuse kernel module (modprobe fuse) or, in a \
             container, pass the device in (--device /dev/fuse)"
                .to_string(),
        ));
    }
    let found = std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|directory| directory.join("fusermount3").exists())
    });
    if !found {
        return Err(FsError::InvalidArgument(
            "fusermount3 is missing: install the fuse3 package (apt-get install fuse3)".to_string(),
        ));
    }
    Ok(())
}

/// A mounted file system whose requests run on background threads.
pub struct Mounted {
    unmounter: Arc<Mutex<SessionUnmounter>>,
    session: JoinHandle<std::io::Result<()>>,
    mount_point: PathBuf,
}

impl Mounted {
    /// Something that unmounts this file system from another thread.
    pub fn unmounter(&self) -> Arc<Mutex<SessionUnmounter>> {
        Arc::clone(&self.unmounter)
    }

    /// Waits until the file system is unmounted (by anyone).
    pub fn wait(self) -> Result<()> {
        match self.session.join() {
            Ok(result) => result.map_err(|error| {
                FsError::io(format!("serving {}", self.mount_point.display()), error)
            }),
            Err(_) => Err(FsError::io(
                format!("serving {}", self.mount_point.display()),
                std::io::Error::other("a request thread panicked"),
            )),
        }
    }
}

/// Mounts file system `fs` of `engine` at `mount_point`; returns once the mount is ready.
pub fn mount(
    engine: Arc<FsEngine>,
    fs: FsId,
    mount_point: &Path,
    options: &MountOptions,
    face_directory: &Path,
) -> Result<Mounted> {
    fuse_available()?;
    let name = engine.record(fs)?.name;
    let mount_options = vec![
        MountOption::FSName(format!("onecopy:{name}")),
        MountOption::Subtype("onecopy".to_string()),
        MountOption::DefaultPermissions,
        MountOption::NoDev,
        if options.read_only {
            MountOption::RO
        } else {
            MountOption::RW
        },
    ];
    let mut config = Config::default();
    config.mount_options = mount_options;
    // SessionACL::All is what passes allow_other to the kernel.
    config.acl = if options.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(options.threads);
    config.clone_fd = true;
    let filesystem = FuseFileSystem::new(
        engine,
        fs,
        face_directory,
        options.keep_cache,
        !options.no_monitor,
    );
    let mut session = Session::new(filesystem, mount_point, &config)
        .map_err(|error| FsError::io(format!("mounting at {}", mount_point.display()), error))?;
    let unmounter = Arc::new(Mutex::new(session.unmount_callable()));
    let session = std::thread::Builder::new()
        .name("fs-session".to_string())
        .spawn(move || session.run())
        .map_err(|error| FsError::io("starting the session thread", error))?;
    Ok(Mounted {
        unmounter,
        session,
        mount_point: mount_point.to_path_buf(),
    })
}

/// Unmounts `mount_point`: through the kernel (root) or fusermount3, lazily when it is
/// busy so that the serving process can end.
pub fn unmount(mount_point: &Path) -> Result<()> {
    let status = std::process::Command::new("fusermount3")
        .arg("-u")
        .arg(mount_point)
        .status()
        .map_err(|error| FsError::io("running fusermount3 -u", error))?;
    if status.success() {
        return Ok(());
    }
    let lazy = std::process::Command::new("fusermount3")
        .args(["-u", "-z"])
        .arg(mount_point)
        .status()
        .map_err(|error| FsError::io("running fusermount3 -u -z", error))?;
    if lazy.success() {
        Ok(())
    } else {
        Err(FsError::io(
            format!("unmounting {}", mount_point.display()),
            std::io::Error::other(format!("fusermount3 -u failed ({status})")),
        ))
    }
}

/// Runs the idle deduplicator until `stop` is set: after `idle_seconds` without a request
/// (the file system's option; 0 turns it off) it ranks and deduplicates, yielding to the
/// first foreground request.
fn idle_deduplicator(engine: Arc<FsEngine>, fs: FsId, stop: Arc<AtomicBool>) -> JoinHandle<()> {
    std::thread::Builder::new()
        .name("fs-dedup".to_string())
        .spawn(move || {
            let mut requests_at_last_run = u64::MAX;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(IDLE_POLL);
                let Ok(record) = engine.record(fs) else { break };
                let idle_seconds = record.options.idle_seconds;
                // Runs once per idle period: a run that found nothing is not repeated until
                // requests arrive again.
                if idle_seconds == 0
                    || engine.idle_milliseconds() < idle_seconds * 1000
                    || engine.request_count() == requests_at_last_run
                {
                    continue;
                }
                requests_at_last_run = engine.request_count();
                let run = dedup::plan(&engine, fs)
                    .and_then(|plan| dedup::execute(&engine, fs, &plan, Yield::ToForeground));
                match run {
                    Ok(report) if report.stopped_for_foreground => {}
                    Ok(_) => {
                        if let Err(error) = engine.flush() {
                            eprintln!("onecopy fs: syncing after deduplication: {error}");
                        }
                    }
                    Err(error) => eprintln!("onecopy fs: deduplication: {error}"),
                }
            }
        })
        .expect("the deduplicator thread starts")
}

/// Serves file system `fs` at `mount_point` until it is unmounted: mounts, starts the
/// control socket and the idle deduplicator, calls `ready`, waits, then stops everything and
/// checkpoints. With `signals`, SIGTERM, SIGINT and SIGHUP unmount (the caller must not have
/// started other threads yet: the signals are blocked in every thread and taken by one).
pub fn serve(
    engine: Arc<FsEngine>,
    fs: FsId,
    mount_point: &Path,
    options: &MountOptions,
    face_directory: &Path,
    signals: bool,
    ready: impl FnOnce(),
) -> Result<()> {
    let signal_set = if signals {
        Some(block_signals()?)
    } else {
        None
    };
    let mounted = mount(
        Arc::clone(&engine),
        fs,
        mount_point,
        options,
        face_directory,
    )?;
    let control = ControlServer::start(Arc::clone(&engine), face_directory, fs, mount_point)?;
    let stop = Arc::new(AtomicBool::new(false));
    let deduplicator =
        (!options.read_only).then(|| idle_deduplicator(Arc::clone(&engine), fs, Arc::clone(&stop)));
    if let Some(set) = signal_set {
        let mount_point = mount_point.to_path_buf();
        let unmounter = mounted.unmounter();
        std::thread::Builder::new()
            .name("fs-signals".to_string())
            .spawn(move || {
                let mut signal = 0;
                // SAFETY: sigwait reads the set and writes the signal number.
                unsafe { libc::sigwait(&set, &mut signal) };
                if unmounter.lock().unmount().is_err() {
                    let _ = unmount(&mount_point);
                }
            })
            .map_err(|error| FsError::io("starting the signal thread", error))?;
    }
    ready();
    let served = mounted.wait();
    stop.store(true, Ordering::Relaxed);
    if let Some(deduplicator) = deduplicator {
        let _ = deduplicator.join();
    }
    control.stop();
    engine.shutdown()?;
    served
}

/// Blocks SIGTERM, SIGINT and SIGHUP in this thread (and the threads it starts after), for
/// one thread to take with `sigwait`; also used by `onecopy backup mount`.
pub fn block_signals() -> Result<libc::sigset_t> {
    // SAFETY: the set is initialised by sigemptyset before use; pthread_sigmask only reads it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, signal);
        }
        let result = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if result != 0 {
            return Err(FsError::io(
                "blocking signals",
                std::io::Error::from_raw_os_error(result),
            ));
        }
        Ok(set)
    }
}
