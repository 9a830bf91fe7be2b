//! The `onecopy` binary around a running block device: files and sockets private to their
//! owner whatever the umask, read-only commands that reach the running server, lock conflicts
//! with their own exit status and `--wait`, and TLS on the network.

mod block_support;

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use block_support::{
    make_certificates, make_tree, run, stdout_text, with_umask, ChildGuard, TestRepository, MIB,
};
use onecopy_core::repository::{check_privacy, Repository};

/// Exit status of a command that found the repository in use.
const EXIT_LOCKED: i32 = 4;

fn qemu_io(uri: &str, commands: &[&str]) {
    let mut arguments = vec!["-f", "raw", uri];
    for command in commands {
        arguments.extend(["-c", command]);
    }
    let output = run("qemu-io", &arguments);
    assert!(!stdout_text(&output).contains("failed"));
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap_or_else(|error| panic!("{}: {error}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// Every directory and file under `root` with its mode.
fn walk(root: &Path) -> Vec<(std::path::PathBuf, std::fs::Metadata)> {
    let mut found = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(path) = pending.pop() {
        let metadata = std::fs::symlink_metadata(&path).unwrap();
        if metadata.is_dir() {
            for entry in std::fs::read_dir(&path).unwrap() {
                pending.push(entry.unwrap().path());
            }
        }
        found.push((path, metadata));
    }
    found
}

/// Goal: whatever the umask, a repository's directories are 0700 and its files 0600 after
/// init, volume create, writes through `serve` and a backup, and the NBD and control sockets
/// are 0600 while serving. Method: run the binary under umask 022 and 000, write with
/// qemu-io, back up a tree, then look at every mode and ask `check_privacy`.
#[test]
fn repository_files_are_private_whatever_the_umask() {
    for umask in [0o022, 0o000] {
        let repository = TestRepository::new();
        std::fs::remove_dir_all(repository.repository()).unwrap();
        let onecopy = |arguments: &[&str]| {
            let mut command = repository.command();
            with_umask(&mut command, umask).args(arguments);
            let output = command.output().unwrap();
            assert!(output.status.success(), "{arguments:?}: {output:?}");
        };
        onecopy(&["init"]);
        onecopy(&["volume", "create", "disk", "--size", "16MiB"]);
        let server = repository.serve_with_umask(&[], umask);
        qemu_io(&server.uri("disk"), &["write -P 0x5a 0 4M", "flush"]);
        assert_eq!(
            mode(server.socket()),
            0o600,
            "umask {umask:03o}: NBD socket"
        );
        let control = repository.repository().join("block/control.sock");
        assert_eq!(mode(&control), 0o600, "umask {umask:03o}: control socket");
        server.stop();
        assert!(!control.exists(), "the control socket is removed on exit");
        let tree = repository.directory().join("tree");
        make_tree(&tree, 3, MIB);
        onecopy(&["backup", "create", "home", tree.to_str().unwrap()]);

        let entries = walk(repository.repository());
        assert!(entries.len() > 10, "{entries:?}");
        for (path, metadata) in &entries {
            let expected = if metadata.is_dir() { 0o700 } else { 0o600 };
            assert!(
                !metadata.file_type().is_socket(),
                "{} left behind",
                path.display()
            );
            assert_eq!(
                metadata.permissions().mode() & 0o7777,
                expected,
                "umask {umask:03o}: {}",
                path.display()
            );
        }
        assert_eq!(
            check_privacy(repository.repository(), false).unwrap(),
            vec![]
        );
    }
}

/// The id of the `daemon` group, which every Debian system has.
fn daemon_group() -> u32 {
    let groups = std::fs::read_to_string("/etc/group").unwrap();
    groups
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            (fields[0] == "daemon").then(|| fields[2].parse().unwrap())
        })
        .expect("a daemon group in /etc/group")
}

/// Goal: `--socket-mode` and `--socket-group` set the NBD socket's permissions exactly, also
/// under umask 000, and a malformed mode is refused before anything starts. Method: serve
/// with both options, look at the socket; serve with mode 999.
#[test]
fn socket_mode_and_group_are_applied() {
    let repository = TestRepository::new();
    repository.create_volume("disk", "16MiB");
    let server =
        repository.serve_with_umask(&["--socket-mode", "0660", "--socket-group", "daemon"], 0);
    let metadata = std::fs::metadata(server.socket()).unwrap();
    assert_eq!(metadata.permissions().mode() & 0o7777, 0o660);
    assert_eq!(metadata.gid(), daemon_group());
    qemu_io(&server.uri("disk"), &["read 0 4k"]);
    server.stop();
    let refused =
        repository.onecopy_output(&["serve", "--socket", "x.sock", "--socket-mode", "999"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("octal"));
}

/// Goal: while `serve` runs, `volume stats`, `volume list` and `check` work and show the
/// server's live state: the request counters of writes made through NBD, not zeros. Method:
/// write (twice the same data) with qemu-io, then run the commands with `--json` and as text.
#[test]
fn read_only_commands_show_the_running_server() {
    let repository = TestRepository::new();
    repository.create_volume("disk", "64MiB");
    let server = repository.serve(&[]);
    qemu_io(
        &server.uri("disk"),
        &["write -P 0x5a 0 4M", "write -P 0x5a 4M 4M", "read 0 1M"],
    );
    let stats = repository.stats("disk");
    let requests = &stats["engine"]["requests"];
    assert!(requests["writes"].as_u64().unwrap() > 0, "{stats}");
    assert!(requests["reads"].as_u64().unwrap() > 0, "{stats}");
    assert!(
        requests["blocks_deduplicated"].as_u64().unwrap() > 0,
        "{stats}"
    );
    assert_eq!(stats["mapped_bytes"], 8 * MIB);
    let text = repository.onecopy(&["volume", "stats", "disk"]);
    assert!(text.contains("requests"), "{text}");
    let volumes = repository.onecopy_json(&["volume", "list"]);
    assert_eq!(volumes[0]["name"], "disk");
    assert!(repository.onecopy(&["volume", "list"]).contains("disk"));
    let check = repository.check_clean();
    let block = check["faces"]
        .as_array()
        .and_then(|faces| faces.iter().find(|face| face["face"] == "block"))
        .unwrap_or_else(|| panic!("no block face: {check}"));
    assert!(block["checked"]["chunks"].as_u64() > Some(0), "{check}");
    let missing = repository.onecopy_output(&["volume", "stats", "nope"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("volume nope"));
    server.stop();
}

/// Goal: a command that needs a face another process holds exits with status 4 and a
/// message naming the holder (no "invalid argument"); `--wait=DURATION` gives up after that
/// long, and `--wait` succeeds once the holder exits, for volume and backup commands.
/// Method: a running server holds the block device; this test holds the backup face's lock.
#[test]
fn a_busy_repository_exits_with_status_4_and_wait_waits() {
    let repository = TestRepository::new();
    repository.create_volume("disk", "16MiB");
    let server = repository.serve(&[]);
    let create = ["volume", "create", "other", "--size", "1MiB"];
    let refused = repository.onecopy_output(&create);
    let message = String::from_utf8_lossy(&refused.stderr).into_owned();
    assert_eq!(refused.status.code(), Some(EXIT_LOCKED), "{message}");
    assert!(
        message.contains(&format!("pid {}: serve", server.pid())),
        "{message}"
    );
    assert!(!message.contains("invalid argument"), "{message}");

    let started = Instant::now();
    let bounded = repository.onecopy_output(&[&create[..], &["--wait=300ms"]].concat());
    assert_eq!(bounded.status.code(), Some(EXIT_LOCKED));
    assert!(started.elapsed() >= Duration::from_millis(300));

    let waiting = ChildGuard(Some(
        repository
            .command()
            .args(create)
            .arg("--wait")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    std::thread::sleep(Duration::from_millis(300));
    server.stop();
    let output = waiting.wait_output();
    assert!(output.status.success(), "{output:?}");
    assert!(repository.onecopy(&["volume", "list"]).contains("other"));

    let store = Repository::open(repository.repository()).unwrap();
    let lock = store
        .lock_face("backup", "onecopy backup create (test holder)")
        .unwrap();
    let refused = repository.onecopy_output(&["backup", "list"]);
    assert_eq!(refused.status.code(), Some(EXIT_LOCKED));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("test holder"));
    let waiting = ChildGuard(Some(
        repository
            .command()
            .args(["backup", "list", "--wait"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    std::thread::sleep(Duration::from_millis(300));
    drop(lock);
    let output = waiting.wait_output();
    assert!(output.status.success(), "{output:?}");
}

/// Goal: `serve` refuses an address other machines can reach unless TLS is required (or
/// --insecure), refuses TLS without certificates, and with certificates serves TLS clients
/// (nbdinfo with the client credentials) and refuses plain ones. Method: certificates from
/// scripts/test-certificates.sh, a loopback port chosen by the kernel.
#[test]
fn serve_requires_tls_off_loopback_and_serves_tls_clients() {
    let repository = TestRepository::new();
    repository.create_volume("disk", "16MiB");
    // 192.0.2.1 (TEST-NET-1) is no address of this machine: even a server that failed to
    // refuse could not listen there and would exit instead of serving.
    let exposed = repository.onecopy_output(&["serve", "--listen", "192.0.2.1:10809"]);
    assert!(!exposed.status.success());
    let message = String::from_utf8_lossy(&exposed.stderr);
    assert!(
        message.contains("--tls-certificates") && message.contains("--insecure"),
        "{message}"
    );
    let no_certificates = repository.onecopy_output(&["serve", "--tls", "require"]);
    assert!(!no_certificates.status.success());

    let credentials = make_certificates(repository.directory());
    let server_credentials = credentials.join("server");
    let server = repository.serve(&[
        "--listen",
        "127.0.0.1:0",
        "--tls-certificates",
        server_credentials.to_str().unwrap(),
    ]);
    let log = server.log_text();
    let address = log
        .lines()
        .find_map(|line| line.strip_prefix("serving disk at nbds://"))
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("no TLS address in the log: {log}"))
        .to_string();
    let client = credentials.join("client");
    let info = run(
        "nbdinfo",
        &[&format!(
            "nbds://{address}/disk?tls-certificates={}",
            client.display()
        )],
    );
    assert!(
        stdout_text(&info).contains("16777216"),
        "{}",
        stdout_text(&info)
    );
    let plain = Command::new("nbdinfo")
        .arg(format!("nbd://{address}/disk"))
        .output()
        .unwrap();
    assert!(!plain.status.success(), "a plain client was served");
    let plain_unix = Command::new("nbdinfo")
        .arg(server.uri("disk"))
        .output()
        .unwrap();
    assert!(
        !plain_unix.status.success(),
        "TLS is required on the unix socket too"
    );
    server.stop();
}
