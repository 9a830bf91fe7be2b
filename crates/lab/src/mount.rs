//! A kernel file system on an onecopy volume, all inside one process.
//!
//! There is no `/dev/nbd` on our machines, so the lab gets a real kernel block device this
//! way (the *testbed*):
//!
//! ```text
//! workload (this process) -> ext4 -> /dev/loopN (direct I/O) -> FUSE file (nbdfuse)
//!     -> NBD over a unix socket -> onecopy-nbd server (this process) -> Engine
//! ```
//!
//! [`Testbed::attach`] builds it bottom-up in a fresh temporary directory: a repository, an
//! [`Engine`] with the requested [`RuntimeOptions`], one volume with the requested
//! [`HintSettings`], the NBD server, `nbdfuse`, a loop device, `mkfs` and `mount`. Teardown
//! runs top-down (umount, `losetup -d`, `fusermount3 -u`, server shutdown, engine checkpoint)
//! and always runs: on [`Testbed::teardown`], on drop, and when `attach` fails half way.
//!
//! The loop device uses direct I/O, so no page cache sits between the loop device and the
//! FUSE file: every block the file system reads or writes reaches the engine.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use onecopy_block::export::EngineExports;
use onecopy_block::{BlockConfig, Engine, HintSettings, RuntimeOptions, VolumeStats};
use onecopy_core::error::IoContext;
use onecopy_core::repository::Repository;
use onecopy_nbd::{silent_event_sink, ListenAddress, Server, ServerConfig};

use crate::error::{LabError, Result};
use crate::results::create_directory;

/// Name of the one volume of a testbed.
pub const VOLUME_NAME: &str = "lab";
/// How long `attach` waits for nbdfuse to present the volume as a file.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(20);
/// How long teardown waits for nbdfuse to exit after `fusermount3 -u`.
const NBDFUSE_EXIT_TIMEOUT: Duration = Duration::from_secs(20);
/// Attempts of `umount` while the file system is still busy.
const UMOUNT_ATTEMPTS_MAX: u32 = 10;
/// Pause between polls and retries.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// How to make and mount the file system.
#[derive(Clone, Debug)]
pub struct FileSystemOptions {
    /// The mkfs program, e.g. `mkfs.ext4`.
    pub mkfs_program: String,
    /// Arguments before the device, e.g. `-E lazy_itable_init=0`.
    pub mkfs_arguments: Vec<String>,
    /// `mount -o` options (empty for none).
    pub mount_options: String,
}

impl FileSystemOptions {
    /// ext4 with 4 KiB blocks, everything initialised by mkfs (so that no background
    /// initialisation writes during a measurement), no discard at mkfs (the volume is new:
    /// nothing to discard), and one inode per
    /// 8 KiB so that metadata workloads do not run out of inodes.
    pub fn ext4() -> FileSystemOptions {
        FileSystemOptions {
            mkfs_program: "mkfs.ext4".into(),
            mkfs_arguments: [
                "-q",
                "-F",
                "-b",
                "4096",
                "-i",
                "8192",
                "-E",
                "lazy_itable_init=0,lazy_journal_init=0,nodiscard",
            ]
            .map(String::from)
            .to_vec(),
            mount_options: String::new(),
        }
    }

    /// ext3 (no extents, no flex_bg; the kernel's ext4 driver mounts it), otherwise as
    /// [`FileSystemOptions::ext4`]: paper 1's file system.
    pub fn ext3() -> FileSystemOptions {
        FileSystemOptions {
            mkfs_program: "mkfs.ext3".into(),
            ..FileSystemOptions::ext4()
        }
    }

    /// The same file system with exactly `inodes` inodes instead of one per 8 KiB.
    pub fn with_inodes(mut self, inodes: u64) -> FileSystemOptions {
        let position = self
            .mkfs_arguments
            .iter()
            .position(|argument| argument == "-i")
            .expect("the ext options set an inode ratio");
        self.mkfs_arguments.splice(
            position..position + 2,
            ["-N".to_string(), inodes.to_string()],
        );
        self
    }

    /// The same file system mounted with `options` (`mount -o`), e.g. `data=journal`.
    pub fn with_mount_options(mut self, options: &str) -> FileSystemOptions {
        self.mount_options = options.to_string();
        self
    }
}

/// Everything a testbed is built from.
#[derive(Clone, Debug)]
pub struct TestbedOptions {
    /// A fresh temporary directory is made under this one and removed at teardown.
    pub parent_directory: PathBuf,
    /// Size of the volume.
    pub volume_bytes: u64,
    /// Block size of the volume (the deduplication unit).
    pub block_bytes: u32,
    /// Engine options of this run (index cache policy and budget, injected latency).
    pub runtime: RuntimeOptions,
    /// Hint sources of the volume.
    pub hints: HintSettings,
    /// The file system made on the volume.
    pub file_system: FileSystemOptions,
}

/// A mounted file system on an engine volume; see the module documentation.
pub struct Testbed {
    engine: Arc<Engine>,
    server: Option<Server>,
    nbdfuse: Option<Child>,
    loop_device: Option<String>,
    mounted: bool,
    fuse_directory: PathBuf,
    mount_point: PathBuf,
    mount_options: String,
    /// Set once teardown ran, so that drop after `teardown` does nothing (closing the engine
    /// twice would write a checkpoint into the removed directory).
    torn_down: bool,
    /// Removed last, after everything living in it is gone.
    directory: Option<tempfile::TempDir>,
}

impl Testbed {
    /// Builds the stack bottom-up; on failure, what was built is torn down before returning.
    pub fn attach(options: &TestbedOptions) -> Result<Testbed> {
        for program in [
            "nbdfuse",
            "losetup",
            "fusermount3",
            "mount",
            "umount",
            options.file_system.mkfs_program.as_str(),
        ] {
            require_program(program)?;
        }
        let directory = tempfile::Builder::new()
            .prefix("onecopy-lab-")
            .tempdir_in(&options.parent_directory)
            .context_io(|| {
                format!(
                    "creating a temporary directory in {}",
                    options.parent_directory.display()
                )
            })?;
        let root = directory.path().to_path_buf();
        let repository = Repository::init(&root.join("repository"))
            .map_err(|error| LabError::engine("creating the lab repository", error))?;
        let storage = repository
            .face_storage("block")
            .map_err(|error| LabError::engine("opening the block face", error))?;
        let engine = Engine::open(
            storage,
            Some(BlockConfig::default()),
            options.runtime.clone(),
        )
        .map_err(|error| LabError::engine("opening the engine", error))?;
        engine
            .create_volume(
                VOLUME_NAME,
                options.volume_bytes,
                options.block_bytes,
                options.hints.clone(),
            )
            .map_err(|error| LabError::engine("creating the lab volume", error))?;
        let mut testbed = Testbed {
            engine,
            server: None,
            nbdfuse: None,
            loop_device: None,
            mounted: false,
            fuse_directory: root.join("fuse"),
            mount_point: root.join("mnt"),
            mount_options: options.file_system.mount_options.clone(),
            torn_down: false,
            directory: Some(directory),
        };
        testbed.build(options, &root)?;
        Ok(testbed)
    }

    fn build(&mut self, options: &TestbedOptions, root: &Path) -> Result<()> {
        let socket = root.join("nbd.sock");
        let config = ServerConfig {
            events: silent_event_sink(),
            ..ServerConfig::default()
        };
        let catalog = Arc::new(EngineExports::new(Arc::clone(&self.engine)));
        self.server = Some(
            Server::start(&ListenAddress::Unix(socket.clone()), catalog, config)
                .map_err(|error| LabError::engine("starting the NBD server", error))?,
        );

        create_directory(&self.fuse_directory)?;
        let disk = self.fuse_directory.join("disk");
        let log_path = root.join("nbdfuse.log");
        let log = fs::File::create(&log_path)
            .context_io(|| format!("creating {}", log_path.display()))?;
        let uri = format!("nbd+unix:///{VOLUME_NAME}?socket={}", socket.display());
        let child = Command::new("nbdfuse")
            .arg(&disk)
            .arg(&uri)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|error| LabError::Command {
                command: format!("nbdfuse {} {uri}", disk.display()),
                detail: error.to_string(),
            })?;
        self.nbdfuse = Some(child);
        self.wait_for_disk(&disk, options.volume_bytes, &log_path)?;

        let loop_device = run(
            "losetup",
            &[
                "--find",
                "--show",
                "--direct-io=on",
                &disk.display().to_string(),
            ],
        )?;
        self.loop_device = Some(loop_device.trim().to_string());
        let loop_device = self.loop_device.clone().expect("just set");

        let mut mkfs_arguments: Vec<&str> = options
            .file_system
            .mkfs_arguments
            .iter()
            .map(String::as_str)
            .collect();
        mkfs_arguments.push(&loop_device);
        run(&options.file_system.mkfs_program, &mkfs_arguments)?;
        create_directory(&self.mount_point)?;
        self.mount()
    }

    /// Polls until nbdfuse shows the volume as a file of the right size.
    fn wait_for_disk(&mut self, disk: &Path, volume_bytes: u64, log_path: &Path) -> Result<()> {
        let started = Instant::now();
        loop {
            if fs::metadata(disk).is_ok_and(|metadata| metadata.len() == volume_bytes) {
                return Ok(());
            }
            let child = self.nbdfuse.as_mut().expect("nbdfuse was started");
            if let Ok(Some(status)) = child.try_wait() {
                self.nbdfuse = None;
                return Err(LabError::Command {
                    command: "nbdfuse".into(),
                    detail: format!(
                        "exited with {status} before presenting the volume: {}",
                        fs::read_to_string(log_path).unwrap_or_default().trim()
                    ),
                });
            }
            if started.elapsed() > ATTACH_TIMEOUT {
                return Err(LabError::Command {
                    command: "nbdfuse".into(),
                    detail: format!(
                        "{} did not appear within {ATTACH_TIMEOUT:?}",
                        disk.display()
                    ),
                });
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    fn mount(&mut self) -> Result<()> {
        assert!(!self.mounted, "mount of a mounted testbed");
        let device = self
            .loop_device
            .clone()
            .expect("mount needs the loop device");
        let mount_point = self.mount_point.display().to_string();
        let mut arguments = Vec::new();
        if !self.mount_options.is_empty() {
            arguments.extend(["-o", self.mount_options.as_str()]);
        }
        arguments.extend([device.as_str(), mount_point.as_str()]);
        run("mount", &arguments)?;
        self.mounted = true;
        Ok(())
    }

    fn unmount(&mut self) -> Result<()> {
        assert!(self.mounted, "unmount of an unmounted testbed");
        let mount_point = self.mount_point.display().to_string();
        retry(UMOUNT_ATTEMPTS_MAX, || run("umount", &[&mount_point]))?;
        self.mounted = false;
        Ok(())
    }

    /// Unmounts and mounts again: the file system's page cache of this volume is dropped, so
    /// later reads reach the engine (paper 1 §5.4.4 drops caches the same way, machine-wide).
    pub fn remount(&mut self) -> Result<()> {
        self.unmount()?;
        self.mount()
    }

    /// Where the file system is mounted.
    pub fn mount_point(&self) -> &Path {
        &self.mount_point
    }

    /// The engine serving the volume.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// The process id of nbdfuse, the NBD client (for its processor time).
    pub fn nbdfuse_pid(&self) -> Option<u32> {
        self.nbdfuse.as_ref().map(Child::id)
    }

    /// Reads `out.len()` bytes of the volume at `offset` from the engine (what a client
    /// reading the device would get once the file system is synced).
    pub fn read_volume(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        let id = self
            .engine
            .volume_id(VOLUME_NAME)
            .map_err(|error| LabError::engine("finding the lab volume", error))?;
        self.engine
            .read(id, offset, out)
            .map_err(|error| LabError::engine(format!("reading the volume at {offset}"), error))
    }

    /// Statistics of the volume and the engine now.
    pub fn volume_stats(&self) -> Result<VolumeStats> {
        self.engine
            .volume_stats(VOLUME_NAME)
            .map_err(|error| LabError::engine("reading volume statistics", error))
    }

    /// Writes every dirty page and journal block of the file system to the engine
    /// (`syncfs(2)`); also writes the block device's dirty buffers (checkpointed metadata).
    pub fn sync(&self) -> Result<()> {
        sync_file_system(&self.mount_point)
    }

    /// Tears the stack down top-down and reports the first failure; later steps run anyway.
    pub fn teardown(mut self) -> Result<()> {
        let failures = self.teardown_steps();
        match failures.into_iter().next() {
            Some(first) => Err(first),
            None => Ok(()),
        }
    }

    fn teardown_steps(&mut self) -> Vec<LabError> {
        let mut failures = Vec::new();
        if self.torn_down {
            return failures;
        }
        self.torn_down = true;
        if self.mounted {
            if let Err(error) = self.unmount() {
                failures.push(error);
            }
        }
        if let Some(device) = self.loop_device.take() {
            match run("losetup", &["--detach", &device]) {
                Ok(_) => wait_for_detach(&device),
                Err(error) => failures.push(error),
            }
        }
        if let Some(mut child) = self.nbdfuse.take() {
            let fuse_directory = self.fuse_directory.display().to_string();
            if let Err(error) = retry(UMOUNT_ATTEMPTS_MAX, || {
                run("fusermount3", &["-u", &fuse_directory])
            }) {
                failures.push(error);
            }
            if let Err(error) = wait_or_kill(&mut child, NBDFUSE_EXIT_TIMEOUT) {
                failures.push(error);
            }
        }
        if let Some(server) = self.server.take() {
            server.shutdown();
        }
        if let Err(error) = self.engine.shutdown() {
            failures.push(LabError::engine("closing the engine", error));
        }
        // Only remove the directory when nothing can still be mounted inside it.
        if failures.is_empty() {
            if let Some(directory) = self.directory.take() {
                let path = directory.path().display().to_string();
                if let Err(error) = directory.close() {
                    failures.push(LabError::io(format!("removing {path}"), error));
                }
            }
        } else if let Some(directory) = self.directory.take() {
            // Keep it for inspection; removing files under a live mount would be worse.
            let _ = directory.keep();
        }
        failures
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        for failure in self.teardown_steps() {
            eprintln!("onecopy lab: teardown: {failure}");
        }
    }
}

/// `syncfs(2)` on the file system holding `path`.
pub fn sync_file_system(path: &Path) -> Result<()> {
    let directory = fs::File::open(path).context_io(|| format!("opening {}", path.display()))?;
    use std::os::fd::AsRawFd;
    // SAFETY: syncfs takes a descriptor we own for the duration of the call.
    let status = unsafe { libc::syncfs(directory.as_raw_fd()) };
    if status != 0 {
        return Err(LabError::io(
            format!("syncfs on {}", path.display()),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Fails with a message naming the package when `program` is not on the path.
pub fn require_program(program: &str) -> Result<()> {
    let found = std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|directory| directory.join(program).is_file())
    });
    if found {
        Ok(())
    } else {
        Err(LabError::Missing(format!(
            "{program} is not installed; run scripts/setup.sh (it installs libnbd-bin, fuse3, \
             e2fsprogs and util-linux)"
        )))
    }
}

/// Runs `program` with `arguments` and returns its standard output; a failure carries the
/// command line and its standard error.
pub fn run(program: &str, arguments: &[&str]) -> Result<String> {
    let command_line = format!("{program} {}", arguments.join(" "));
    let output = Command::new(program)
        .args(arguments)
        .stdin(Stdio::null())
        .output()
        .map_err(|error| LabError::Command {
            command: command_line.clone(),
            detail: error.to_string(),
        })?;
    if !output.status.success() {
        return Err(LabError::Command {
            command: command_line,
            detail: format!(
                "{}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Runs `step` until it succeeds, at most `attempts` times, pausing between attempts: a
/// device or mount can stay busy for a moment after its last user went away.
fn retry<T>(attempts: u32, mut step: impl FnMut() -> Result<T>) -> Result<T> {
    assert!(attempts >= 1);
    let mut attempt = 1;
    loop {
        match step() {
            Ok(value) => return Ok(value),
            Err(error) if attempt >= attempts => return Err(error),
            Err(_) => std::thread::sleep(POLL_INTERVAL * 10),
        }
        attempt += 1;
    }
}

/// Waits (boundedly) until the kernel let go of a detached loop device: `losetup --detach` of
/// a device still referenced only marks it for clearing, and its backing file (our FUSE
/// file) stays open until then, which would keep `fusermount3 -u` from succeeding.
fn wait_for_detach(device: &str) {
    let name = device.trim_start_matches("/dev/");
    let backing_file = format!("/sys/block/{name}/loop/backing_file");
    let started = Instant::now();
    while Path::new(&backing_file).exists() && started.elapsed() < ATTACH_TIMEOUT {
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// Waits for a child we started to exit; kills it (by its own pid) after `timeout`.
fn wait_or_kill(child: &mut Child, timeout: Duration) -> Result<()> {
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return Ok(()),
            Ok(None) if started.elapsed() < timeout => std::thread::sleep(POLL_INTERVAL),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(LabError::Command {
                    command: "nbdfuse".into(),
                    detail: format!("did not exit within {timeout:?} of fusermount3 -u; killed"),
                });
            }
            Err(error) => return Err(LabError::io("waiting for nbdfuse", error)),
        }
    }
}
