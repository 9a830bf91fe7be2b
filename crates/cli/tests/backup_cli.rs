//! The `onecopy backup` commands end to end: the forms scripts depend on, the lock message,
//! and kill -9 at arbitrary points of create, reverse and delete.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use onecopy_core::repository::Repository;

fn onecopy(repository: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_onecopy"));
    command.env("ONECOPY_REPO", repository);
    command.env("ONECOPY_PASSWORD", "test password");
    command
}

fn run(command: &mut Command) -> Output {
    let output = command.output().expect("onecopy runs");
    assert!(
        output.status.success(),
        "{command:?} failed ({}): {}{}",
        output.status,
        String::from_utf8_lossy(&output.stderr),
        String::from_utf8_lossy(&output.stdout)
    );
    output
}

/// Small sizes so that a few MiB make many segments and containers.
const SMALL: [&str; 6] = [
    "--segment-size",
    "64KiB",
    "--chunk-size",
    "2KiB",
    "--container-size",
    "256KiB",
];

fn image(seed: u64, bytes: usize) -> Vec<u8> {
    let mut state = seed;
    let mut data = vec![0u8; bytes];
    for chunk in data.chunks_mut(8) {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        for (index, byte) in chunk.iter_mut().enumerate() {
            *byte = b'a' + ((z >> (index * 4)) & 0xf) as u8;
        }
    }
    data
}

/// Goal: create (directory, image, stdin), list --json, restore (newest, @version, -),
/// delete, expire, reverse, stats and check work in the documented forms. Method: run the
/// binary on a temporary repository and compare restored bytes.
#[test]
fn commands_round_trip() {
    let scratch = tempfile::tempdir().unwrap();
    let repository = scratch.path().join("repository");
    run(onecopy(&repository).arg("init"));
    let tree = scratch.path().join("tree");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    std::fs::write(tree.join("sub/a"), image(1, 300_000)).unwrap();
    std::os::unix::fs::symlink("sub/a", tree.join("link")).unwrap();
    let mut create = onecopy(&repository);
    create
        .args(["backup", "create", "home"])
        .arg(&tree)
        .args(SMALL);
    run(&mut create);
    std::fs::write(tree.join("sub/b"), image(2, 100_000)).unwrap();
    run(onecopy(&repository)
        .args(["backup", "create", "home"])
        .arg(&tree));
    let listed = run(onecopy(&repository).args(["backup", "list", "home", "--json"]));
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 2);
    assert_eq!(listed[0]["state"], "archival");
    assert_eq!(listed[1]["version"], 2);

    let out = scratch.path().join("out");
    let restored = run(onecopy(&repository)
        .args(["backup", "restore", "home@1"])
        .arg(&out)
        .arg("--json"));
    let report: serde_json::Value = serde_json::from_slice(&restored.stdout).unwrap();
    assert_eq!(report["version"], 1);
    assert_eq!(std::fs::read(out.join("sub/a")).unwrap(), image(1, 300_000));
    assert!(!out.join("sub/b").exists());
    assert_eq!(
        std::fs::read_link(out.join("link")).unwrap(),
        PathBuf::from("sub/a")
    );
    let newest = scratch.path().join("newest");
    run(onecopy(&repository)
        .args(["backup", "restore", "home"])
        .arg(&newest));
    assert_eq!(
        std::fs::read(newest.join("sub/b")).unwrap(),
        image(2, 100_000)
    );

    let data = image(3, 2 << 20);
    let mut child = onecopy(&repository)
        .args(["backup", "create", "stream", "-", "--defer-reverse"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), &data).unwrap();
    assert!(child.wait().unwrap().success());
    let image_path = scratch.path().join("disk.img");
    std::fs::write(&image_path, &data).unwrap();
    run(onecopy(&repository)
        .args(["backup", "create", "stream"])
        .arg(&image_path)
        .arg("--defer-reverse"));
    let piped = run(onecopy(&repository).args(["backup", "restore", "stream@1", "-"]));
    assert!(piped.stdout == data);
    let dry = run(onecopy(&repository).args(["backup", "reverse", "--dry-run"]));
    assert!(String::from_utf8_lossy(&dry.stdout).contains("would reverse-deduplicate stream@1"));
    run(onecopy(&repository).args(["backup", "reverse"]));
    let to_file = scratch.path().join("restored.img");
    run(onecopy(&repository)
        .args(["backup", "restore", "stream@1", "--to-file"])
        .arg(&to_file));
    assert!(std::fs::read(&to_file).unwrap() == data);
    run(onecopy(&repository).args(["backup", "delete", "stream@2", "--method", "mark-and-sweep"]));
    run(onecopy(&repository).args(["backup", "expire", "home", "--keep", "1"]));
    let stats = run(onecopy(&repository).args(["backup", "stats", "--json"]));
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    assert_eq!(stats["backups"], 2);
    run(onecopy(&repository).args(["backup", "check"]));
    let missing = onecopy(&repository)
        .args(["backup", "delete", "home@9"])
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("home@9 not found"));
}

/// Goal: a second command on a locked store fails at once, naming the holder. Method: hold
/// the backup face's lock in this process and run `onecopy backup list`.
#[test]
fn conflicting_command_gets_the_lock_message() {
    let scratch = tempfile::tempdir().unwrap();
    let repository_path = scratch.path().join("repository");
    run(onecopy(&repository_path).arg("init"));
    let repository = Repository::open(&repository_path).unwrap();
    let lock = repository
        .lock_face("backup", "onecopy backup create (test holder)")
        .unwrap();
    let output = onecopy(&repository_path)
        .args(["backup", "list"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(
        message.contains("in use by another onecopy process"),
        "{message}"
    );
    assert!(message.contains("test holder"), "{message}");
    drop(lock);
    run(onecopy(&repository_path).args(["backup", "list"]));
}

/// Goal: kill -9 at arbitrary moments of create, reverse and delete never damages completed
/// backups: check passes and each restores byte-exact. Method: kill the binary after growing
/// delays, verify, and go on with the next version.
#[test]
fn kill_nine_leaves_a_consistent_store() {
    let scratch = tempfile::tempdir().unwrap();
    let repository = scratch.path().join("repository");
    run(onecopy(&repository).arg("init"));
    let mut completed: Vec<(u32, Vec<u8>)> = Vec::new();
    let mut interrupted = 0;
    let mut next_version = 1;
    let mut data = image(10, 12 << 20);
    let delays_ms = [5u64, 40, 90, 160, 250, 400];
    for (round, delay) in delays_ms.iter().enumerate() {
        let at = (round * 1_500_000) % (data.len() - 200_000);
        data[at..at + 200_000].copy_from_slice(&image(round as u64 + 100, 200_000));
        let path = scratch.path().join("disk.img");
        std::fs::write(&path, &data).unwrap();
        let mut command = onecopy(&repository);
        command
            .args(["backup", "create", "disk"])
            .arg(&path)
            .args(SMALL)
            .args(["--defer-reverse", "--json"]);
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(*delay));
        let _ = child.kill();
        if child.wait().unwrap().success() {
            completed.push((next_version, data.clone()));
        } else {
            interrupted += 1;
        }
        // Versions are numbered by completed creates only when a create completes.
        let listed = run(onecopy(&repository).args(["backup", "list", "--json"]));
        let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
        let versions: Vec<u64> = listed
            .as_array()
            .unwrap()
            .iter()
            .map(|row| row["version"].as_u64().unwrap())
            .collect();
        if versions.len() > completed.len() {
            // The create finished its commit just before the kill.
            completed.push((*versions.last().unwrap() as u32, data.clone()));
        }
        next_version = versions.last().map_or(1, |&v| v as u32 + 1);
        // Interrupt a reverse deduplication and a deletion too.
        for command_args in [
            vec!["backup", "reverse"],
            vec!["backup", "expire", "disk", "--keep", "3"],
        ] {
            let mut child = onecopy(&repository)
                .args(&command_args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            std::thread::sleep(Duration::from_millis(delay / 2));
            let _ = child.kill();
            if !child.wait().unwrap().success() {
                interrupted += 1;
            }
        }
        run(onecopy(&repository).args(["backup", "check"]));
        let listed = run(onecopy(&repository).args(["backup", "list", "--json"]));
        let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
        let present: Vec<u32> = listed
            .as_array()
            .unwrap()
            .iter()
            .map(|row| row["version"].as_u64().unwrap() as u32)
            .collect();
        completed.retain(|(version, _)| present.contains(version));
        for (version, expected) in &completed {
            let output = run(onecopy(&repository).args([
                "backup",
                "restore",
                &format!("disk@{version}"),
                "-",
            ]));
            assert!(
                output.stdout == *expected,
                "round {round}: disk@{version} differs"
            );
        }
    }
    assert!(interrupted > 0, "at least one command was killed mid-way");
}
