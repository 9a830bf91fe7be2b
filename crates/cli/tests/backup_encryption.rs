//! The encrypted backup store through the command line: what lies on the disk, passwords and
//! keys, and damage anywhere in the sealed files.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const PASSWORD: &str = "correct horse";

fn onecopy(repository: &Path, password: Option<&str>) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_onecopy"));
    command
        .env("ONECOPY_REPO", repository)
        .env_remove("ONECOPY_PASSWORD")
        .env_remove("ONECOPY_PASSWORD_FILE");
    if let Some(password) = password {
        command.env("ONECOPY_PASSWORD", password);
    }
    command
}

fn run(command: &mut Command) -> String {
    let output = command.output().expect("onecopy runs");
    assert!(
        output.status.success(),
        "{command:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn fails(command: &mut Command) -> String {
    let output: Output = command.output().expect("onecopy runs");
    assert!(!output.status.success(), "{command:?} succeeded");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Files whose content is easy to find in raw bytes: a marker repeated through text, which
/// compression would shrink but not hide, and a file name.
fn source_tree(root: &Path) -> PathBuf {
    let source = root.join("source");
    std::fs::create_dir_all(source.join("letters")).unwrap();
    let text: String = (0..4000)
        .map(|line| format!("line {line}: the secret marker PLAINTEXT-MARKER-7F3A\n"))
        .collect();
    std::fs::write(source.join("letters/confidential-name.txt"), &text).unwrap();
    let bytes: Vec<u8> = (0..400_000u32)
        .map(|index| (index.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    std::fs::write(source.join("data.bin"), &bytes).unwrap();
    source
}

fn files_under(directory: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(directory).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(files_under(&path));
        } else {
            files.push(path);
        }
    }
    files.sort();
    files
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

fn same_tree(a: &Path, b: &Path) -> bool {
    let relative = |root: &Path| -> Vec<(PathBuf, Vec<u8>)> {
        files_under(root)
            .into_iter()
            .map(|path| {
                let bytes = std::fs::read(&path).unwrap();
                (path.strip_prefix(root).unwrap().to_path_buf(), bytes)
            })
            .collect()
    };
    relative(a) == relative(b)
}

/// Goal: an encrypted repository keeps neither file contents nor file names in the clear,
/// its files are private, and it restores byte-exact with the password only. Method: back up
/// a tree holding a marker string and a distinctive name, search every byte of the
/// repository for both, restore, and try a wrong password and a password file.
#[test]
fn encrypted_store_hides_contents_and_restores() {
    let scratch = tempfile::tempdir().unwrap();
    let repository = scratch.path().join("repository");
    let source = source_tree(scratch.path());
    run(onecopy(&repository, None).arg("init"));
    let output = onecopy(&repository, Some(PASSWORD))
        .args(["backup", "create", "docs"])
        .arg(&source)
        .output()
        .unwrap();
    assert!(output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("Keep the password"));

    for file in files_under(&repository) {
        let bytes = std::fs::read(&file).unwrap();
        assert!(
            !contains(&bytes, b"PLAINTEXT-MARKER"),
            "{} holds file content",
            file.display()
        );
        assert!(
            !contains(&bytes, b"confidential-name"),
            "{} holds a file name",
            file.display()
        );
        let mode = std::os::unix::fs::PermissionsExt::mode(&file.metadata().unwrap().permissions());
        assert_eq!(mode & 0o077, 0, "{} is private", file.display());
    }

    let target = scratch.path().join("restored");
    run(onecopy(&repository, Some(PASSWORD))
        .args(["backup", "restore", "docs"])
        .arg(&target));
    assert!(same_tree(&source, &target));

    let error = fails(onecopy(&repository, Some("wrong")).args(["backup", "list"]));
    assert!(error.contains("wrong password"), "{error}");
    let password_file = scratch.path().join("password");
    std::fs::write(&password_file, format!("{PASSWORD}\n")).unwrap();
    let listing = run(onecopy(&repository, Some("wrong"))
        .args(["backup", "list", "--password-file"])
        .arg(&password_file));
    assert!(listing.contains("docs"), "{listing}");
}

/// Goal: one changed byte anywhere in the encrypted store (catalog, containers, segment
/// index) never restores wrong data: the restore either fails with a message naming a damaged
/// file, or restores the exact tree (the byte was in a copy the store does not need). Method:
/// flip bytes spread over every file of the store, one at a time, and restore each time.
#[test]
fn flipped_bytes_in_encrypted_store_never_restore_wrong_data() {
    let scratch = tempfile::tempdir().unwrap();
    let repository = scratch.path().join("repository");
    let source = source_tree(scratch.path());
    run(onecopy(&repository, Some(PASSWORD)).arg("init"));
    run(onecopy(&repository, Some(PASSWORD))
        .args(["backup", "create", "docs"])
        .arg(&source));
    let store = repository.join("backup");
    let files: Vec<PathBuf> = files_under(&store)
        .into_iter()
        .filter(|file| {
            let name = file.file_name().unwrap().to_string_lossy();
            name != "lock" && name != "reserve"
        })
        .collect();
    assert!(files.iter().any(|file| file.ends_with("catalog.redb")));
    let mut detected = 0;
    for (number, file) in files.iter().enumerate() {
        let length = std::fs::metadata(file).unwrap().len();
        // The header, the first slot's prefix, a ciphertext byte and a tag byte, and spread
        // positions.
        let mut positions = vec![3, 40, 64 + 2, 64 + 30, 64 + 4136 - 5];
        positions.extend((1..4).map(|step| length * step / 4 + number as u64));
        for position in positions.into_iter().filter(|&position| position < length) {
            let mut bytes = std::fs::read(file).unwrap();
            bytes[position as usize] ^= 0x04;
            std::fs::write(file, &bytes).unwrap();
            let target = scratch.path().join(format!("restore-{number}-{position}"));
            let output = onecopy(&repository, Some(PASSWORD))
                .args(["backup", "restore", "docs"])
                .arg(&target)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&output.stderr);
            if output.status.success() {
                assert!(
                    same_tree(&source, &target),
                    "byte {position} of {} restored wrong data",
                    file.display()
                );
            } else {
                assert!(
                    stderr.contains("corrupt") || stderr.contains("damage"),
                    "byte {position} of {}: {stderr}",
                    file.display()
                );
                detected += 1;
            }
            bytes[position as usize] ^= 0x04;
            std::fs::write(file, &bytes).unwrap();
            let _ = std::fs::remove_dir_all(&target);
        }
    }
    assert!(detected > 5, "damage was detected ({detected} times)");
    // Undamaged again: the store restores and checks clean.
    let target = scratch.path().join("restored");
    run(onecopy(&repository, Some(PASSWORD))
        .args(["backup", "restore", "docs"])
        .arg(&target));
    assert!(same_tree(&source, &target));
}

/// Goal: `key add`, `list`, `remove` and `passwd` manage the passwords: each key opens the
/// store, the key in use and the last key cannot be removed, a changed password replaces the
/// old one. Method: the commands in sequence, checking which passwords open `backup list`.
#[test]
fn keys_are_added_listed_removed_and_changed() {
    let scratch = tempfile::tempdir().unwrap();
    let repository = scratch.path().join("repository");
    run(onecopy(&repository, Some("first")).arg("init"));
    let second_file = scratch.path().join("second");
    std::fs::write(&second_file, "second\n").unwrap();
    run(onecopy(&repository, Some("first"))
        .args(["key", "add", "--new-password-file"])
        .arg(&second_file));
    let keys: serde_json::Value = serde_json::from_str(&run(
        onecopy(&repository, Some("second")).args(["key", "list", "--json"])
    ))
    .unwrap();
    let keys = keys.as_array().unwrap();
    assert_eq!(keys.len(), 2);
    let current: Vec<&serde_json::Value> =
        keys.iter().filter(|key| key["current"] == true).collect();
    assert_eq!(current.len(), 1);
    let second_id = current[0]["id"].as_str().unwrap().to_string();
    let first_id = keys
        .iter()
        .find(|key| key["id"] != second_id.as_str())
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    for password in ["first", "second"] {
        run(onecopy(&repository, Some(password)).args(["backup", "list"]));
    }
    let error = fails(onecopy(&repository, Some("second")).args(["key", "remove", &second_id]));
    assert!(error.contains("opened the repository"), "{error}");
    run(onecopy(&repository, Some("second")).args(["key", "remove", &first_id]));
    assert!(
        fails(onecopy(&repository, Some("first")).args(["backup", "list"]))
            .contains("wrong password")
    );

    let third_file = scratch.path().join("third");
    std::fs::write(&third_file, "third\n").unwrap();
    run(onecopy(&repository, Some("second"))
        .args(["key", "passwd", "--new-password-file"])
        .arg(&third_file));
    run(onecopy(&repository, Some("third")).args(["backup", "list"]));
    assert!(
        fails(onecopy(&repository, Some("second")).args(["backup", "list"]))
            .contains("wrong password")
    );
}

/// Goal: `init --insecure-no-encryption` makes a plain store that needs no password, and
/// `init` refuses to switch an existing repository between the two. Method: init both ways.
#[test]
fn unencrypted_only_when_asked() {
    let scratch = tempfile::tempdir().unwrap();
    let plain = scratch.path().join("plain");
    let source = source_tree(scratch.path());
    run(onecopy(&plain, None).args(["init", "--insecure-no-encryption"]));
    run(onecopy(&plain, None)
        .args(["backup", "create", "docs"])
        .arg(&source));
    let catalog = std::fs::read(plain.join("backup/catalog.redb")).unwrap();
    assert!(!catalog.starts_with(b"OCSEAL01"));
    assert!(fails(onecopy(&plain, None).arg("init")).contains("--insecure-no-encryption"));
    assert!(fails(onecopy(&plain, None).args(["key", "list"])).contains("no keys"));

    let sealed = scratch.path().join("sealed");
    run(onecopy(&sealed, None).arg("init"));
    assert!(
        fails(onecopy(&sealed, None).args(["init", "--insecure-no-encryption"]))
            .contains("encrypted")
    );
}

/// Goal: `onecopy check` authenticates the encrypted store: clean when untouched; a changed
/// byte in a container is found by `--read-data` and named. Method: back up, check, flip one
/// ciphertext byte of the first container, check with and without `--read-data`.
#[test]
fn check_finds_changed_sealed_blocks() {
    let scratch = tempfile::tempdir().unwrap();
    let repository = scratch.path().join("repository");
    let source = source_tree(scratch.path());
    run(onecopy(&repository, Some(PASSWORD)).arg("init"));
    run(onecopy(&repository, Some(PASSWORD))
        .args(["backup", "create", "docs"])
        .arg(&source));
    let clean = onecopy(&repository, Some(PASSWORD))
        .args(["check", "--read-data"])
        .output()
        .unwrap();
    assert_eq!(
        clean.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&clean.stdout)
    );

    let container = files_under(&repository.join("backup/containers"))
        .into_iter()
        .next()
        .expect("a container");
    let mut bytes = std::fs::read(&container).unwrap();
    // The second block's ciphertext: past the header (64 B) and the first slot (4136 B).
    bytes[64 + 4136 + 500] ^= 0x20;
    std::fs::write(&container, &bytes).unwrap();
    let damaged = onecopy(&repository, Some(PASSWORD))
        .args(["check", "--read-data"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&damaged.stdout).into_owned()
        + &String::from_utf8_lossy(&damaged.stderr);
    assert_eq!(damaged.status.code(), Some(1), "{text}");
    let name = container
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(text.contains(&name), "{text}");
    assert!(text.contains("fails authentication"), "{text}");
}
