//! `onecopy backup check` end to end: its exit statuses (0 clean, 1 needs a repair, 3 data
//! lost), `--read-data`, `--repair`, `--json`, and a restore after a repair.

use std::path::Path;
use std::process::{Command, Output};

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
        "{command:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn status(command: &mut Command) -> (i32, String) {
    let output = command.output().expect("onecopy runs");
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    (output.status.code().expect("exit code"), text)
}

/// Goal: a damaged chunk makes `backup check --read-data` exit 1 naming it; `--repair`
/// records the loss and exits 3, and so does every later check (the damage is not reported
/// as new); the restore of the backup fails naming the lost bytes, and a second backup of
/// the same data restores. Method: flip a byte in the middle of the only container's first
/// chunk (uncompressed store, unencrypted so that the byte is at its plain offset; the tests
/// in backup_encryption.rs damage encrypted stores).
#[test]
fn check_exit_statuses_and_repair() {
    let scratch = tempfile::tempdir().unwrap();
    let repository = scratch.path().join("repository");
    run(onecopy(&repository).args(["init", "--insecure-no-encryption"]));
    let image = scratch.path().join("image");
    let data: Vec<u8> = (0..300_000u32)
        .map(|index| (index * 7 % 251) as u8)
        .collect();
    std::fs::write(&image, &data).unwrap();
    run(onecopy(&repository)
        .args(["backup", "create", "vm"])
        .arg(&image)
        .args([
            "--compression",
            "none",
            "--chunk-size",
            "2KiB",
            "--segment-size",
            "64KiB",
        ]));
    let (code, text) = status(onecopy(&repository).args(["backup", "check"]));
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("no problems found"), "{text}");

    let containers = repository.join("backup/containers/01/0000000000000001");
    let mut bytes = std::fs::read(&containers).unwrap();
    bytes[64 + 48 + 100] ^= 0x01;
    std::fs::write(&containers, &bytes).unwrap();
    let (code, text) = status(onecopy(&repository).args(["backup", "check"]));
    assert_eq!(code, 0, "a metadata check reads no chunk: {text}");
    let (code, text) = status(onecopy(&repository).args(["backup", "check", "--read-data"]));
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("damage: chunk 0 of segment"), "{text}");
    assert!(text.contains("--repair"), "{text}");

    let (code, text) =
        status(onecopy(&repository).args(["backup", "check", "--read-data", "--repair"]));
    assert_eq!(code, 3, "{text}");
    assert!(text.contains("lost: backup vm@1: bytes 0-"), "{text}");
    let (code, text) = status(onecopy(&repository).args(["backup", "check", "--json"]));
    assert_eq!(code, 3, "{text}");
    let report: serde_json::Value = serde_json::from_str(text.lines().next().unwrap_or("{}"))
        .or_else(|_| serde_json::from_str(&text))
        .unwrap();
    assert_eq!(report["findings"][0]["kind"], "lost", "{text}");
    assert_eq!(report["findings"][0]["object"], "backup vm@1", "{text}");

    let (code, text) = status(
        onecopy(&repository)
            .args(["backup", "restore", "vm@1"])
            .arg(scratch.path().join("restored")),
    );
    assert_ne!(code, 0, "{text}");
    assert!(
        text.contains("backup vm@1") && text.contains("lost"),
        "{text}"
    );
    run(onecopy(&repository)
        .args(["backup", "create", "vm"])
        .arg(&image));
    let restored = scratch.path().join("again");
    run(onecopy(&repository)
        .args(["backup", "restore", "vm@2"])
        .arg(&restored));
    assert_eq!(std::fs::read(restored).unwrap(), data);
}
