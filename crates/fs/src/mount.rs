//! Mounting: FUSE sessions, the control socket, the idle deduplicator, and a clean end on
//! unmount (`fusermount3 -u`, `onecopy umount`) or a signal (SIGTERM, SIGINT, SIGHUP).
//!
//! One process serves every mounted file system of a repository ([`MountServer`]): the
//! first `onecopy mount` takes the face and serves; a later one, of another file system, asks
//! that process through the control socket to mount it too, in a session of its own. The
//! mount is ready when [`serve`] calls its `ready` callback: the mount is in place, so the
//! mount point already shows the file system (the kernel queues requests until the session
//! reads them). Each mount's end makes what it wrote durable; when the last ends, the
//! background threads stop and the engine checkpoints, so the next open replays nothing.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use fuser::{Config, MountOption, Session, SessionACL, SessionUnmounter};
use parking_lot::{Condvar, Mutex};

use crate::changes::FsId;
use crate::control::{self, MountInfo, Request, Response, REQUEST_BYTES_MAX, SOCKET_FILE};
use crate::dedup::{self, Yield};
use crate::engine::FsEngine;
use crate::error::{FsError, Result};
use crate::fuse::FuseFileSystem;

/// Request threads by default.
pub const THREADS_DEFAULT: usize = 4;
/// Most request threads.
pub const THREADS_MAX: usize = 64;
/// Control requests answered at once; more are refused (a deduplication run holds one).
const REQUESTS_IN_FLIGHT_MAX: usize = 16;
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
    /// The kernel's writeback cache (`writeback_cache`): writes go to the page cache and
    /// reach the file system later, merged into larger requests (at the latest on fsync,
    /// close or unmount); the kernel keeps the modification and change times meanwhile.
    pub writeback_cache: bool,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            allow_other: false,
            read_only: false,
            threads: THREADS_DEFAULT,
            keep_cache: false,
            no_monitor: false,
            writeback_cache: false,
        }
    }
}

impl MountOptions {
    /// Parses a comma-separated list: `allow_other`, `ro`, `rw`, `keep_cache`, `no_monitor`,
    /// `writeback_cache`, `no_writeback_cache`, `threads=N`.
    pub fn parse(text: &str) -> Result<MountOptions> {
        let mut options = MountOptions::default();
        for option in text.split(',').map(str::trim).filter(|o| !o.is_empty()) {
            match option {
                "allow_other" => options.allow_other = true,
                "ro" => options.read_only = true,
                "rw" => options.read_only = false,
                "keep_cache" => options.keep_cache = true,
                "no_monitor" => options.no_monitor = true,
                "writeback_cache" => options.writeback_cache = true,
                "no_writeback_cache" => options.writeback_cache = false,
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
                             keep_cache, no_monitor, writeback_cache, no_writeback_cache, \
                             threads=N)"
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
    )
    .with_writeback_cache(options.writeback_cache && !options.read_only);
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

/// The mounts one process serves over one engine: every file system of the repository that
/// is mounted, each in its own FUSE session with its own request threads. The process that
/// holds the face serves them all; `onecopy mount` of another file system asks it through the
/// control socket ([`crate::control::Request::Mount`]). It lives until its last mount ends.
///
/// Each mount ends on its own (`fusermount3 -u`, `onecopy umount`); its end makes every
/// completed request durable (the engine's flush), so an unmounted file system is on the
/// disk whatever happens to the others. The last end closes the server: later mount requests
/// are refused with [`SERVER_ENDING`] (the asking command then waits for the face and serves
/// the mount itself), and the caller of [`MountServer::wait_all`] checkpoints.
pub struct MountServer {
    engine: Arc<FsEngine>,
    face_directory: PathBuf,
    table: Mutex<MountTable>,
    changed: Condvar,
    /// Serialises mount requests, so that two cannot both pass the checks for one file
    /// system or mount point.
    mounting: Mutex<()>,
}

/// The start of the refusal a server that is ending gives to a mount request.
pub const SERVER_ENDING: &str = "the process serving this repository's file systems is ending";

#[derive(Default)]
struct MountTable {
    mounts: Vec<MountEntry>,
    /// Mounts being set up: the server does not end meanwhile.
    starting: usize,
    /// The last mount ended and the server is ending: no new mounts.
    closed: bool,
}

struct MountEntry {
    fs: FsId,
    mount_point: PathBuf,
    read_only: bool,
    unmounter: Arc<Mutex<SessionUnmounter>>,
}

impl MountServer {
    /// A server of no mounts yet over `engine`, whose face lives in `face_directory`.
    pub fn new(engine: Arc<FsEngine>, face_directory: &Path) -> Arc<MountServer> {
        Arc::new(MountServer {
            engine,
            face_directory: face_directory.to_path_buf(),
            table: Mutex::new(MountTable::default()),
            changed: Condvar::new(),
            mounting: Mutex::new(()),
        })
    }

    /// The engine every mount serves.
    pub fn engine(&self) -> &Arc<FsEngine> {
        &self.engine
    }

    /// The mounts served now.
    pub fn mounts(&self) -> Vec<MountInfo> {
        self.table
            .lock()
            .mounts
            .iter()
            .map(|entry| MountInfo {
                fs: entry.fs,
                mount_point: entry.mount_point.clone(),
                read_only: entry.read_only,
            })
            .collect()
    }

    /// Mounts file system `name` at `mount_point` (an existing directory) with
    /// `options`, in a session of its own; returns once the mount is in place. Refused when
    /// the server is ending, when the file system or the mount point is mounted already (two
    /// sessions of one file system would each trust their own kernel caches), and a writable
    /// mount when the engine is open read-only.
    pub fn mount(
        self: &Arc<Self>,
        name: &str,
        mount_point: &Path,
        options: &MountOptions,
    ) -> Result<FsId> {
        // The table compares mount points by path: a relative one is made absolute first.
        let absolute = std::path::absolute(mount_point).map_err(|error| {
            FsError::io(format!("mount point {}", mount_point.display()), error)
        })?;
        let mount_point = absolute.as_path();
        let _serialised = self.mounting.lock();
        let fs = self.engine.find(name)?;
        {
            let mut table = self.table.lock();
            if table.closed {
                return Err(FsError::Remote(format!(
                    "{SERVER_ENDING}; try again once it has ended"
                )));
            }
            if let Some(entry) = table.mounts.iter().find(|entry| entry.fs == fs) {
                return Err(FsError::posix(
                    libc::EBUSY,
                    format!(
                        "file system {name:?} is mounted at {} already",
                        entry.mount_point.display()
                    ),
                ));
            }
            if table
                .mounts
                .iter()
                .any(|entry| entry.mount_point == mount_point)
            {
                return Err(FsError::posix(
                    libc::EBUSY,
                    format!(
                        "{} has a file system mounted already",
                        mount_point.display()
                    ),
                ));
            }
            if self.engine.is_read_only() && !options.read_only {
                return Err(FsError::posix(
                    libc::EROFS,
                    "the process serving this repository's file systems has the face open \
                     read-only (its first mount used -o ro): mount with -o ro, or unmount \
                     its file systems first",
                ));
            }
            table.starting += 1;
        }
        let mounted = mount(
            Arc::clone(&self.engine),
            fs,
            mount_point,
            options,
            &self.face_directory,
        );
        let mut table = self.table.lock();
        table.starting -= 1;
        let mounted = match mounted {
            Ok(mounted) => mounted,
            Err(error) => {
                self.changed.notify_all();
                return Err(error);
            }
        };
        table.mounts.push(MountEntry {
            fs,
            mount_point: mount_point.to_path_buf(),
            read_only: options.read_only,
            unmounter: mounted.unmounter(),
        });
        drop(table);
        let server = Arc::clone(self);
        let path = mount_point.to_path_buf();
        std::thread::Builder::new()
            .name("fs-mount-end".to_string())
            .spawn(move || server.watch(mounted, &path))
            .map_err(|error| FsError::io("starting the thread that watches a mount", error))?;
        Ok(fs)
    }

    /// Waits for the session of the mount at `path` to end, makes what it wrote durable and
    /// takes it out of the table.
    fn watch(&self, mounted: Mounted, path: &Path) {
        if let Err(error) = mounted.wait() {
            eprintln!("onecopy fs: {error}");
        }
        // An unmount is a foreground event: a deduplication run started by idleness yields
        // to it, so that a file system that goes away is not worked on.
        self.engine.note_request();
        if !self.engine.is_read_only() {
            if let Err(error) = self.engine.flush() {
                eprintln!(
                    "onecopy fs: syncing after unmounting {}: {error}",
                    path.display()
                );
            }
        }
        let mut table = self.table.lock();
        table.mounts.retain(|entry| entry.mount_point != path);
        self.changed.notify_all();
    }

    /// Waits until nothing is mounted at `path` (returns at once when nothing was); returns
    /// whether the server has no mounts left then (it is ending).
    pub fn await_unmount(&self, path: &Path) -> bool {
        let mut table = self.table.lock();
        while table.mounts.iter().any(|entry| entry.mount_point == path) {
            self.changed.wait(&mut table);
        }
        table.mounts.is_empty() && table.starting == 0
    }

    /// Waits until every mount has ended, then refuses new ones.
    pub fn wait_all(&self) {
        let mut table = self.table.lock();
        while !table.mounts.is_empty() || table.starting > 0 {
            self.changed.wait(&mut table);
        }
        table.closed = true;
    }

    /// Unmounts every mount (lazily where busy): the end of a signal.
    pub fn unmount_all(&self) {
        let mounts: Vec<(PathBuf, Arc<Mutex<SessionUnmounter>>)> = self
            .table
            .lock()
            .mounts
            .iter()
            .map(|entry| (entry.mount_point.clone(), Arc::clone(&entry.unmounter)))
            .collect();
        for (path, unmounter) in mounts {
            if unmounter.lock().unmount().is_err() {
                if let Err(error) = unmount(&path) {
                    eprintln!("onecopy fs: {error}");
                }
            }
        }
    }

    /// The writable file systems mounted now: those the idle deduplicator works on.
    fn writable_file_systems(&self) -> Vec<FsId> {
        self.table
            .lock()
            .mounts
            .iter()
            .filter(|entry| !entry.read_only)
            .map(|entry| entry.fs)
            .collect()
    }
}

/// Runs the idle deduplicator of `server` until `stop` is set. Idleness is the engine's (no
/// request on any mount: they share the disk); each mounted, writable file system is ranked
/// and deduplicated once per idle period after its own `--idle` seconds (0 turns it off),
/// and a run yields to the first foreground request on any mount, or an unmount.
fn idle_deduplicator(server: Arc<MountServer>, stop: Arc<AtomicBool>) -> JoinHandle<()> {
    std::thread::Builder::new()
        .name("fs-dedup".to_string())
        .spawn(move || {
            let engine = Arc::clone(server.engine());
            // Per file system, the request count at its last run: a run that found nothing
            // is not repeated until requests arrive again.
            let mut requests_at_last_run: HashMap<FsId, u64> = HashMap::new();
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(IDLE_POLL);
                for fs in server.writable_file_systems() {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let Ok(record) = engine.record(fs) else {
                        continue;
                    };
                    let idle_seconds = record.options.idle_seconds;
                    let requests = engine.request_count();
                    if idle_seconds == 0
                        || engine.idle_milliseconds() < idle_seconds * 1000
                        || requests_at_last_run.get(&fs) == Some(&requests)
                    {
                        continue;
                    }
                    requests_at_last_run.insert(fs, requests);
                    let run = dedup::plan(&engine, fs)
                        .and_then(|plan| dedup::execute(&engine, fs, &plan, Yield::ToForeground));
                    match run {
                        Ok(report) if report.stopped_for_foreground => break,
                        Ok(_) => {
                            if let Err(error) = engine.flush() {
                                eprintln!("onecopy fs: syncing after deduplication: {error}");
                            }
                        }
                        Err(error) => {
                            eprintln!("onecopy fs: deduplication of {}: {error}", record.name)
                        }
                    }
                }
            }
        })
        .expect("the deduplicator thread starts")
}

/// Serves file system `fs` at `mount_point`, and every mount asked for through the control
/// socket later, until the last is unmounted: mounts, starts the control socket and the idle
/// deduplicator, calls `ready`, waits, then stops everything and checkpoints. With `signals`,
/// SIGTERM, SIGINT and SIGHUP unmount every mount (the caller must not have started other
/// threads yet: the signals are blocked in every thread and taken by one).
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
    serve_with_signals(
        engine,
        fs,
        mount_point,
        options,
        face_directory,
        signal_set,
        ready,
    )
}

/// [`serve`], with the signals `signal_set` (from [`block_signals`], taken before any thread
/// started) unmounting every mount.
pub fn serve_with_signals(
    engine: Arc<FsEngine>,
    fs: FsId,
    mount_point: &Path,
    options: &MountOptions,
    face_directory: &Path,
    signal_set: Option<libc::sigset_t>,
    ready: impl FnOnce(),
) -> Result<()> {
    let server = MountServer::new(Arc::clone(&engine), face_directory);
    let name = engine.record(fs)?.name;
    server.mount(&name, mount_point, options)?;
    let control = match ControlServer::start(Arc::clone(&server), face_directory) {
        Ok(control) => control,
        Err(error) => {
            server.unmount_all();
            server.wait_all();
            return Err(error);
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    let deduplicator =
        (!engine.is_read_only()).then(|| idle_deduplicator(Arc::clone(&server), Arc::clone(&stop)));
    if let Some(set) = signal_set {
        let server = Arc::clone(&server);
        std::thread::Builder::new()
            .name("fs-signals".to_string())
            .spawn(move || loop {
                let mut signal = 0;
                // SAFETY: sigwait reads the set and writes the signal number.
                unsafe { libc::sigwait(&set, &mut signal) };
                server.unmount_all();
            })
            .map_err(|error| FsError::io("starting the signal thread", error))?;
    }
    ready();
    server.wait_all();
    stop.store(true, Ordering::Relaxed);
    if let Some(deduplicator) = deduplicator {
        let _ = deduplicator.join();
    }
    control.stop();
    engine.shutdown()
}

/// Runs `request` in the process that serves the mounts of `server`.
pub fn execute_served(server: &Arc<MountServer>, request: &Request) -> Result<serde_json::Value> {
    match request {
        Request::Mount {
            name,
            mount_point,
            options,
        } => {
            let options = MountOptions::parse(options)?;
            server.mount(name, mount_point, &options)?;
            Ok(serde_json::json!({ "mounted": name, "pid": std::process::id() }))
        }
        Request::AwaitUnmount { mount_point } => {
            let was_mounted = server
                .mounts()
                .iter()
                .any(|mount| mount.mount_point == *mount_point);
            let last = server.await_unmount(mount_point);
            Ok(serde_json::json!({ "was_mounted": was_mounted, "last": last }))
        }
        _ => control::execute(server.engine(), request, &server.mounts()),
    }
}

/// The control socket of a mounting process.
pub struct ControlServer {
    path: PathBuf,
    /// The listening socket, shut down to wake the accept loop when stopping: connecting to
    /// the socket's path would not reach it once the path is gone (a repository removed
    /// while its server ends), and the loop would wait forever.
    listener: std::os::fd::RawFd,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ControlServer {
    /// Listens on the face's socket in `face_directory` and answers requests for the mounts
    /// of `server` until stopped.
    pub fn start(server: Arc<MountServer>, face_directory: &Path) -> Result<ControlServer> {
        let path = face_directory.join(SOCKET_FILE);
        // A socket left by a process that died: the face lock (held by the caller) proves
        // nobody serves it.
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)
            .map_err(|error| FsError::io(format!("listening on {}", path.display()), error))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .map_err(|error| FsError::io(format!("making {} private", path.display()), error))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let listener_fd = std::os::fd::AsRawFd::as_raw_fd(&listener);
        let thread = std::thread::Builder::new()
            .name("fs-control".to_string())
            .spawn(move || {
                let in_flight = Arc::new(AtomicUsize::new(0));
                for stream in listener.incoming() {
                    if stopping.load(Ordering::Relaxed) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    if in_flight.fetch_add(1, Ordering::AcqRel) >= REQUESTS_IN_FLIGHT_MAX {
                        in_flight.fetch_sub(1, Ordering::AcqRel);
                        let busy: Response = Err(format!(
                            "the mounting process is answering {REQUESTS_IN_FLIGHT_MAX} \
                             requests already; try again"
                        ));
                        let mut out = serde_json::to_vec(&busy).expect("responses serialise");
                        out.push(b'\n');
                        let _ = (&stream).write_all(&out);
                        continue;
                    }
                    let server = Arc::clone(&server);
                    let done = Arc::clone(&in_flight);
                    // A long request (a deduplication run, waiting for an unmount) must not
                    // hold up `stats`.
                    let spawned = std::thread::Builder::new()
                        .name("fs-control-request".to_string())
                        .spawn(move || {
                            let _ = answer(&server, stream, &done);
                        });
                    if spawned.is_err() {
                        in_flight.fetch_sub(1, Ordering::AcqRel);
                    }
                }
            })
            .map_err(|error| FsError::io("starting the control thread", error))?;
        Ok(ControlServer {
            path,
            listener: listener_fd,
            stop,
            thread: Some(thread),
        })
    }

    /// Stops listening and removes the socket.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accept loop: an accept on a socket shut down fails at once. The loop
        // owns the socket and closes it only after it has seen `stop`, so the descriptor is
        // still this socket's.
        // SAFETY: shutdown only reads the descriptor number.
        unsafe { libc::shutdown(self.listener, libc::SHUT_RDWR) };
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Answers the request on `stream`, then takes it out of `in_flight` (a wait for an unmount
/// at once: it lasts as long as the mount and is no work).
fn answer(
    server: &Arc<MountServer>,
    stream: UnixStream,
    in_flight: &AtomicUsize,
) -> std::io::Result<()> {
    let mut counted = true;
    let release = |counted: &mut bool| {
        if std::mem::take(counted) {
            in_flight.fetch_sub(1, Ordering::AcqRel);
        }
    };
    let mut line = String::new();
    let read = BufReader::new((&stream).take(REQUEST_BYTES_MAX)).read_line(&mut line);
    if let Err(error) = read {
        release(&mut counted);
        return Err(error);
    }
    let request = serde_json::from_str::<Request>(&line);
    if matches!(request, Ok(Request::AwaitUnmount { .. })) {
        release(&mut counted);
    }
    let response: Response = match request {
        Ok(request) => execute_served(server, &request).map_err(|error| error.to_string()),
        Err(error) => Err(format!("malformed control request: {error}")),
    };
    release(&mut counted);
    let mut out = serde_json::to_vec(&response).expect("responses serialise");
    out.push(b'\n');
    (&stream).write_all(&out)
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
