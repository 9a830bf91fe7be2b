//! Shared helpers of the block device's end-to-end tests: a repository in a temporary
//! directory, the `onecopy serve` process as a guard that never outlives a test, external
//! tools, and guards that undo mounts, loop devices and FUSE mounts even when a test fails.
//!
//! Every test gets its own temporary directory holding the repository, the unix socket and
//! the server's log, so tests run in parallel without sharing anything.

#![allow(dead_code)]

pub mod nbd_client;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long a server may take to start listening (debug builds recover slowly).
const SERVER_START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a server may take to finish requests and checkpoint after SIGTERM.
const SERVER_STOP_TIMEOUT: Duration = Duration::from_secs(60);
/// What `onecopy serve` prints once it accepts connections.
const SERVER_READY_LINE: &str = "press Ctrl-C to stop";

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;

/// The `onecopy` binary built for these tests.
pub fn onecopy_binary() -> &'static str {
    env!("CARGO_BIN_EXE_onecopy")
}

/// Fails the test with a hint when `tool` is not installed.
pub fn require_tool(tool: &str) {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .map(|output| output.status.success())
        .unwrap_or(false);
    assert!(found, "{tool} is not installed: run scripts/setup.sh");
}

/// Fails the test unless it runs as root (loop devices and mounts need it).
pub fn require_root() {
    // SAFETY: geteuid has no preconditions and no side effects.
    let user = unsafe { libc::geteuid() };
    assert_eq!(
        user, 0,
        "this test mounts a file system through a loop device and must run as root"
    );
}

fn describe(program: &str, arguments: &[&str], output: &Output) -> String {
    format!(
        "{program} {arguments:?}: {}\nstdout: {}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Runs `program` and asserts it succeeds; returns its output.
pub fn run(program: &str, arguments: &[&str]) -> Output {
    require_tool(program);
    let output = Command::new(program)
        .args(arguments)
        .output()
        .unwrap_or_else(|error| panic!("running {program}: {error}"));
    assert!(
        output.status.success(),
        "failed: {}",
        describe(program, arguments, &output)
    );
    output
}

/// Standard output of a command as text.
pub fn stdout_text(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Deterministic pseudo-random bytes (xorshift64).
pub fn pattern(bytes: usize, seed: u64) -> Vec<u8> {
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

/// A small seeded generator (splitmix64) for test decisions.
#[derive(Clone, Debug)]
pub struct Random(u64);

impl Random {
    pub fn new(seed: u64) -> Random {
        Random(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in `[low, high)`.
    pub fn range(&mut self, low: u64, high: u64) -> u64 {
        assert!(low < high);
        low + self.next_u64() % (high - low)
    }

    /// True with probability `numerator / denominator`.
    pub fn chance(&mut self, numerator: u64, denominator: u64) -> bool {
        self.range(0, denominator) < numerator
    }
}

/// A repository in its own temporary directory, with the socket and logs next to it.
pub struct TestRepository {
    directory: tempfile::TempDir,
    repository: PathBuf,
}

impl TestRepository {
    /// Creates a repository with `onecopy init`.
    pub fn new() -> TestRepository {
        let directory = tempfile::Builder::new()
            .prefix("onecopy-e2e-")
            .tempdir()
            .expect("temporary directory");
        let repository = directory.path().join("repository");
        let test = TestRepository {
            directory,
            repository,
        };
        test.onecopy(&["init"]);
        test
    }

    /// Creates a repository with `onecopy init` inside `parent` (a file system the test
    /// prepared, such as a small tmpfs); sockets and logs stay in a temporary directory.
    pub fn inside(parent: &Path) -> TestRepository {
        let directory = tempfile::Builder::new()
            .prefix("onecopy-e2e-")
            .tempdir()
            .expect("temporary directory");
        let test = TestRepository {
            directory,
            repository: parent.join("repository"),
        };
        test.onecopy(&["init"]);
        test
    }

    /// A copy of `source`'s repository in a new temporary directory (sparse files stay
    /// sparse), so that several tests start from one prepared repository.
    pub fn copy_of(source: &TestRepository) -> TestRepository {
        let directory = tempfile::Builder::new()
            .prefix("onecopy-e2e-")
            .tempdir()
            .expect("temporary directory");
        let repository = directory.path().join("repository");
        run(
            "cp",
            &[
                "-a",
                "--sparse=always",
                source.repository.to_str().expect("utf-8 path"),
                repository.to_str().expect("utf-8 path"),
            ],
        );
        TestRepository {
            directory,
            repository,
        }
    }

    /// The temporary directory of this test (for sockets, images and mount points).
    pub fn directory(&self) -> &Path {
        self.directory.path()
    }

    pub fn repository(&self) -> &Path {
        &self.repository
    }

    /// A `onecopy` command on this repository.
    pub fn command(&self) -> Command {
        let mut command = Command::new(onecopy_binary());
        command
            .env("ONECOPY_REPO", &self.repository)
            .env("ONECOPY_PASSWORD", "test password");
        command
    }

    /// Runs `onecopy ARGUMENTS` and returns its output, whatever the exit status.
    pub fn onecopy_output(&self, arguments: &[&str]) -> Output {
        self.command()
            .args(arguments)
            .output()
            .expect("running onecopy")
    }

    /// Runs `onecopy ARGUMENTS`, asserting it succeeds; returns its standard output.
    pub fn onecopy(&self, arguments: &[&str]) -> String {
        let output = self.onecopy_output(arguments);
        assert!(
            output.status.success(),
            "failed: {}",
            describe("onecopy", arguments, &output)
        );
        stdout_text(&output)
    }

    /// Runs `onecopy ARGUMENTS --json` and parses its output.
    pub fn onecopy_json(&self, arguments: &[&str]) -> Value {
        let mut with_json = arguments.to_vec();
        with_json.push("--json");
        let text = self.onecopy(&with_json);
        serde_json::from_str(&text).unwrap_or_else(|error| panic!("{error}: {text}"))
    }

    pub fn create_volume(&self, name: &str, size: &str) {
        self.onecopy(&["volume", "create", name, "--size", size]);
    }

    /// `onecopy volume stats NAME --json` (the server must be stopped).
    pub fn stats(&self, name: &str) -> Value {
        self.onecopy_json(&["volume", "stats", name])
    }

    /// Runs `onecopy check --json`, asserts it reports no problem and returns the report.
    pub fn check_clean(&self) -> Value {
        let output = self.onecopy_output(&["check", "--json"]);
        let text = stdout_text(&output);
        assert!(
            output.status.success(),
            "check failed: {}",
            describe("onecopy", &["check", "--json"], &output)
        );
        let report: Value =
            serde_json::from_str(&text).unwrap_or_else(|error| panic!("{error}: {text}"));
        assert_eq!(report["status"], "clean", "{report}");
        let block = report["faces"]
            .as_array()
            .and_then(|faces| faces.iter().find(|face| face["face"] == "block"))
            .unwrap_or_else(|| panic!("no block face: {report}"));
        assert_eq!(
            block["findings"].as_array().map(Vec::len),
            Some(0),
            "{report}"
        );
        assert!(block["checked"]["pages"].as_u64() > Some(0), "{report}");
        assert_eq!(block["repaired"].as_bool(), Some(false), "{report}");
        report
    }

    /// Starts `onecopy serve` on a unix socket in the test directory.
    pub fn serve(&self, extra_arguments: &[&str]) -> ServeProcess {
        ServeProcess::start(self, extra_arguments, None)
    }

    /// Starts `onecopy serve` under the file creation mask `umask`.
    pub fn serve_with_umask(&self, extra_arguments: &[&str], umask: u32) -> ServeProcess {
        ServeProcess::start(self, extra_arguments, Some(umask))
    }

    /// The socket path servers of this test listen on.
    pub fn socket(&self) -> PathBuf {
        self.directory.path().join("nbd.sock")
    }
}

/// A running `onecopy serve`; dropping it kills the process if it still runs.
pub struct ServeProcess {
    child: Option<Child>,
    socket: PathBuf,
    log: PathBuf,
}

impl ServeProcess {
    fn start(
        repository: &TestRepository,
        extra_arguments: &[&str],
        umask: Option<u32>,
    ) -> ServeProcess {
        let mut server = ServeProcess::spawn(repository, extra_arguments, "serve.log", umask);
        server.wait_until_ready();
        server
    }

    /// Starts a server without waiting for it to listen (to kill it during recovery).
    pub fn start_unready(repository: &TestRepository) -> ServeProcess {
        ServeProcess::spawn(repository, &[], "serve-unready.log", None)
    }

    fn spawn(
        repository: &TestRepository,
        extra_arguments: &[&str],
        log_name: &str,
        umask: Option<u32>,
    ) -> ServeProcess {
        let socket = repository.socket();
        // A socket left by a killed server is replaced by the new one.
        let _ = std::fs::remove_file(&socket);
        let log = repository.directory().join(log_name);
        let log_file = File::create(&log).expect("server log");
        let mut command = repository.command();
        if let Some(umask) = umask {
            with_umask(&mut command, umask);
        }
        let child = command
            .arg("serve")
            .arg("--socket")
            .arg(&socket)
            .args(extra_arguments)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("log handle"))
            .stderr(log_file)
            .spawn()
            .expect("starting onecopy serve");
        ServeProcess {
            child: Some(child),
            socket,
            log,
        }
    }

    fn wait_until_ready(&mut self) {
        let started = Instant::now();
        loop {
            if self.log_text().contains(SERVER_READY_LINE) {
                return;
            }
            let child = self.child.as_mut().expect("running");
            if let Some(status) = child.try_wait().expect("polling the server") {
                panic!("onecopy serve exited with {status}: {}", self.log_text());
            }
            assert!(
                started.elapsed() < SERVER_START_TIMEOUT,
                "onecopy serve did not start in {SERVER_START_TIMEOUT:?}: {}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What the server printed so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The NBD URI of volume `name`.
    pub fn uri(&self, name: &str) -> String {
        format!("nbd+unix:///{name}?socket={}", self.socket.display())
    }

    fn signal(&self, signal: i32) {
        let pid = self.pid() as libc::pid_t;
        // SAFETY: kill has no memory effects; the pid is our own child, not yet reaped.
        let result = unsafe { libc::kill(pid, signal) };
        assert_eq!(result, 0, "signal {signal} to the server");
    }

    /// Sends SIGTERM without waiting (to kill the server during its shutdown).
    pub fn terminate(&self) {
        self.signal(libc::SIGTERM);
    }

    /// Stops the server with SIGTERM and asserts it exits successfully after checkpointing.
    pub fn stop(mut self) {
        self.signal(libc::SIGTERM);
        let status = self.wait_for_exit(SERVER_STOP_TIMEOUT);
        assert!(
            status.success(),
            "onecopy serve exited with {status}: {}",
            self.log_text()
        );
    }

    /// Sends SIGKILL (a crash) without reaping; dropping the guard reaps the process.
    pub fn kill_now(&self) {
        self.signal(libc::SIGKILL);
    }

    /// Kills the server with SIGKILL (a crash) and reaps it.
    pub fn kill(mut self) {
        self.signal(libc::SIGKILL);
        self.wait_for_exit(SERVER_STOP_TIMEOUT);
    }

    fn wait_for_exit(&mut self, timeout: Duration) -> ExitStatus {
        let started = Instant::now();
        let child = self.child.as_mut().expect("running");
        loop {
            if let Some(status) = child.try_wait().expect("polling the server") {
                self.child = None;
                return status;
            }
            if started.elapsed() > timeout {
                let _ = child.kill();
                let _ = child.wait();
                self.child = None;
                panic!("onecopy serve did not exit in {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A child process (a client tool) killed and reaped when dropped.
pub struct ChildGuard(pub Option<Child>);

impl ChildGuard {
    /// Waits for the process and returns its output.
    pub fn wait_output(mut self) -> Output {
        self.0
            .take()
            .expect("running")
            .wait_with_output()
            .expect("waiting for a client")
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A FUSE mount made by `nbdfuse`: the volume as the file `<directory>/disk`. Dropping it
/// unmounts the FUSE file system and reaps nbdfuse.
pub struct NbdFuse {
    directory: PathBuf,
    child: Option<Child>,
}

impl NbdFuse {
    /// Mounts `uri` at `directory/disk` and waits until the file appears.
    pub fn mount(directory: &Path, uri: &str) -> NbdFuse {
        require_tool("nbdfuse");
        require_tool("fusermount3");
        std::fs::create_dir_all(directory).expect("fuse mount point");
        let child = Command::new("nbdfuse")
            .arg(directory.join("disk"))
            .arg(uri)
            .stdin(Stdio::null())
            .spawn()
            .expect("starting nbdfuse");
        let mut mount = NbdFuse {
            directory: directory.to_path_buf(),
            child: Some(child),
        };
        let started = Instant::now();
        while !mount.file().exists() {
            if let Some(status) = mount
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                mount.child = None;
                panic!("nbdfuse exited with {status}");
            }
            assert!(
                started.elapsed() < SERVER_START_TIMEOUT,
                "nbdfuse did not mount"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        mount
    }

    /// The volume as a file.
    pub fn file(&self) -> PathBuf {
        self.directory.join("disk")
    }

    /// Unmounts now, asserting success (the drop only tries).
    pub fn unmount(mut self) {
        run(
            "fusermount3",
            &["-u", self.directory.to_str().expect("utf-8 path")],
        );
        if let Some(mut child) = self.child.take() {
            let status = child.wait().expect("waiting for nbdfuse");
            assert!(status.success(), "nbdfuse exited with {status}");
        }
    }
}

impl Drop for NbdFuse {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("fusermount3")
                .arg("-u")
                .arg(&self.directory)
                .output();
            // nbdfuse exits once unmounted; kill it if the unmount failed.
            std::thread::sleep(Duration::from_millis(100));
            if child.try_wait().ok().flatten().is_none() {
                let _ = child.kill();
                let _ = Command::new("fusermount3")
                    .args(["-u", "-z"])
                    .arg(&self.directory)
                    .output();
            }
            let _ = child.wait();
        }
    }
}

/// A loop device over a file; dropping it detaches the device.
pub struct LoopDevice {
    device: Option<String>,
}

impl LoopDevice {
    pub fn attach(file: &Path) -> LoopDevice {
        let output = run(
            "losetup",
            &["-f", "--show", file.to_str().expect("utf-8 path")],
        );
        LoopDevice {
            device: Some(stdout_text(&output).trim().to_string()),
        }
    }

    pub fn device(&self) -> &str {
        self.device.as_deref().expect("attached")
    }

    /// Detaches now, asserting success.
    pub fn detach(mut self) {
        let device = self.device.take().expect("attached");
        run("losetup", &["-d", &device]);
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        if let Some(device) = self.device.take() {
            let _ = Command::new("losetup").args(["-d", &device]).output();
        }
    }
}

/// A mounted file system; dropping it unmounts.
pub struct Mounted {
    directory: Option<PathBuf>,
}

impl Mounted {
    pub fn mount(device: &str, directory: &Path, options: &str) -> Mounted {
        std::fs::create_dir_all(directory).expect("mount point");
        run(
            "mount",
            &[
                "-o",
                options,
                device,
                directory.to_str().expect("utf-8 path"),
            ],
        );
        Mounted {
            directory: Some(directory.to_path_buf()),
        }
    }

    pub fn path(&self) -> &Path {
        self.directory.as_deref().expect("mounted")
    }

    /// Unmounts now, asserting success.
    pub fn unmount(mut self) {
        let directory = self.directory.take().expect("mounted");
        run("umount", &[directory.to_str().expect("utf-8 path")]);
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(directory) = self.directory.take() {
            if Command::new("umount")
                .arg(&directory)
                .output()
                .map(|output| !output.status.success())
                .unwrap_or(true)
            {
                let _ = Command::new("umount").arg("-l").arg(&directory).output();
            }
        }
    }
}

/// Writes a deterministic directory tree of about `total_bytes` under `root`: nested
/// directories, empty and tiny files, sizes around the 4 KiB block, large files, files that
/// repeat other files, and a symbolic link. Returns the bytes of regular file data.
pub fn make_tree(root: &Path, seed: u64, total_bytes: u64) -> u64 {
    let mut random = Random::new(seed);
    let mut written = 0u64;
    let edge_sizes = [0u64, 1, 100, 511, 512, 4095, 4096, 4097, 65536 + 7];
    let mut previous: Vec<Vec<u8>> = Vec::new();
    let mut index = 0u64;
    while written < total_bytes {
        let directory = root
            .join(format!("d{}", index % 7))
            .join(format!("e{}", index % 3));
        std::fs::create_dir_all(&directory).expect("tree directory");
        let data = if index < edge_sizes.len() as u64 {
            pattern(edge_sizes[index as usize] as usize, seed ^ index)
        } else if !previous.is_empty() && random.chance(1, 5) {
            // A copy of an earlier file: deduplicates within the tree too.
            previous[random.range(0, previous.len() as u64) as usize].clone()
        } else {
            let size = if random.chance(1, 8) {
                random.range(256 * KIB, 2 * MIB)
            } else {
                random.range(1, 64 * KIB)
            };
            pattern(size as usize, seed.wrapping_add(index * 7919))
        };
        std::fs::write(directory.join(format!("file{index}.bin")), &data).expect("tree file");
        written += data.len() as u64;
        if previous.len() < 16 && data.len() < 512 * KIB as usize {
            previous.push(data);
        }
        index += 1;
    }
    std::os::unix::fs::symlink("d0/e0/file0.bin", root.join("link")).expect("symbolic link");
    written
}

/// Every thread's stack of process `pid`, from gdb when it is installed, for diagnosing a
/// server that stopped making progress.
pub fn thread_stacks(pid: u32) -> String {
    match Command::new("gdb")
        .args([
            "-p",
            &pid.to_string(),
            "-batch",
            "-ex",
            "thread apply all bt",
        ])
        .output()
    {
        Ok(output) => stdout_text(&output),
        Err(error) => format!("(no stacks: gdb is not available: {error})"),
    }
}

/// Makes `command` run under the file creation mask `umask`.
pub fn with_umask(command: &mut Command, umask: u32) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: umask is async-signal-safe and touches nothing but the child's mask.
    unsafe {
        command.pre_exec(move || {
            libc::umask(umask as libc::mode_t);
            Ok(())
        })
    }
}

/// Makes TLS credentials in `directory` (scripts/test-certificates.sh, with openssl):
/// `server/` for `serve --tls-certificates`, `client/` and `anonymous/` for clients.
pub fn make_certificates(directory: &Path) -> PathBuf {
    require_tool("openssl");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/test-certificates.sh"
    );
    let credentials = directory.join("credentials");
    run("bash", &[script, credentials.to_str().expect("UTF-8 path")]);
    credentials
}
