//! The first run, as a new user tries it: the README's commands twice in a row, sizes with
//! and without units, messages that say each thing once and in the words of the options.

use std::path::Path;
use std::process::{Command, Output};

fn onecopy(repository: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_onecopy"))
        .env("ONECOPY_REPO", repository)
        .env("ONECOPY_PASSWORD", "test password")
        .args(args)
        .output()
        .expect("onecopy runs")
}

/// Runs onecopy and returns its standard output; fails the test unless it succeeds.
fn succeeds(repository: &Path, args: &[&str]) -> String {
    let output = onecopy(repository, args);
    assert!(
        output.status.success(),
        "onecopy {args:?} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8 output")
}

/// Runs onecopy and returns its standard error; fails the test if it succeeds.
fn fails(repository: &Path, args: &[&str]) -> String {
    let output = onecopy(repository, args);
    assert!(
        !output.status.success(),
        "onecopy {args:?} succeeded: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    String::from_utf8(output.stderr).expect("UTF-8 output")
}

fn volume_size(repository: &Path, name: &str) -> u64 {
    let listed: serde_json::Value =
        serde_json::from_str(&succeeds(repository, &["volume", "list", "--json"])).unwrap();
    listed
        .as_array()
        .unwrap()
        .iter()
        .find(|volume| volume["name"] == name)
        .unwrap_or_else(|| panic!("volume {name} is listed: {listed}"))["size_bytes"]
        .as_u64()
        .unwrap()
}

/// Goal: the README's setup (`init`, then `volume create`) succeeds when run a second time
/// and changes nothing; a second `volume create` asking for something else is refused with
/// the command that does it. Method: run the commands twice on a fresh repository.
#[test]
fn setup_commands_run_twice() {
    let directory = tempfile::tempdir().unwrap();
    let repository = directory.path().join("repository");
    let created = succeeds(&repository, &["init"]);
    assert!(created.starts_with("created repository"), "{created}");
    let again = succeeds(&repository, &["init"]);
    assert!(again.contains("existing repository"), "{again}");
    let id = |text: &str| text.split_whitespace().nth(2).map(str::to_string);
    assert_eq!(id(&created), id(&again.replace("using the existing", "x")));

    let create = ["volume", "create", "disk", "--size", "16MiB"];
    succeeds(&repository, &create);
    let kept = succeeds(&repository, &create);
    assert!(kept.contains("already exists"), "{kept}");
    assert_eq!(volume_size(&repository, "disk"), 16 << 20);

    let other = fails(
        &repository,
        &["volume", "create", "disk", "--size", "32MiB"],
    );
    assert!(other.contains("volume resize disk"), "{other}");
    let block = [
        "volume",
        "create",
        "disk",
        "--size",
        "16MiB",
        "--block-size",
        "512",
    ];
    assert!(fails(&repository, &block).contains("block size cannot change"));
    assert_eq!(volume_size(&repository, "disk"), 16 << 20);
}

/// Goal: `init` on a repository of another format is refused, not silently accepted.
/// Method: write a configuration with a format number this onecopy does not read.
#[test]
fn init_refuses_another_format() {
    let directory = tempfile::tempdir().unwrap();
    let repository = directory.path().join("repository");
    succeeds(&repository, &["init"]);
    let config = repository.join("config.json");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, text.replace("\"format\": 1", "\"format\": 99")).unwrap();
    let refused = fails(&repository, &["init"]);
    assert!(refused.contains("format 99"), "{refused}");
}

/// Goal: `init --flash --flash-fingerprint crc32c` creates a flash-mode block device with
/// paper 5's 32-bit fingerprint, runs twice, and refuses a strong fingerprint, the option
/// without `--flash`, and another fingerprint later. Method: run init with each.
#[test]
fn init_flash_chooses_the_weak_fingerprint() {
    let directory = tempfile::tempdir().unwrap();
    let repository = directory.path().join("repository");
    let flash = ["init", "--flash", "--flash-fingerprint", "crc32c"];
    let created = succeeds(&repository, &flash);
    assert!(created.contains("crc32c fingerprints"), "{created}");
    succeeds(&repository, &flash);
    let config = std::fs::read_to_string(repository.join("block/config.json")).unwrap();
    assert!(config.contains("crc32c"), "{config}");
    let strong = fails(
        &repository,
        &["init", "--flash", "--flash-fingerprint", "blake3"],
    );
    assert!(strong.contains("not a weak fingerprint"), "{strong}");
    let alone = fails(&repository, &["init", "--flash-fingerprint", "crc32c"]);
    assert!(alone.contains("--flash"), "{alone}");
    let other = fails(
        &repository,
        &["init", "--flash", "--flash-fingerprint", "xxh3"],
    );
    assert!(other.contains("cannot change"), "{other}");
}

/// Goal: an operating-system error appears once in a message, not once per level of the
/// error chain. Method: analyze a path that does not exist and count the OS error's text.
#[test]
fn os_errors_are_printed_once() {
    let directory = tempfile::tempdir().unwrap();
    let missing = directory.path().join("missing");
    let message = fails(
        &directory.path().join("repository"),
        &["analyze", missing.to_str().unwrap()],
    );
    assert_eq!(
        message.matches("No such file or directory").count(),
        1,
        "{message}"
    );
}

/// Goal: `--size` takes GB as 10^9 bytes and GiB as 2^30; a bare number that makes no volume
/// hints at the missing unit; an overflowing size says it is too large. Method: create
/// volumes with each spelling and read their sizes back.
#[test]
fn sizes_say_what_they_mean() {
    let directory = tempfile::tempdir().unwrap();
    let repository = directory.path().join("repository");
    succeeds(&repository, &["init"]);
    succeeds(
        &repository,
        &["volume", "create", "decimal", "--size", "8192MB"],
    );
    assert_eq!(volume_size(&repository, "decimal"), 8_192_000_000);
    succeeds(
        &repository,
        &["volume", "create", "binary", "--size", "8GiB"],
    );
    assert_eq!(volume_size(&repository, "binary"), 8 << 30);

    let bare = fails(&repository, &["volume", "create", "bare", "--size", "10"]);
    assert!(bare.contains("did you mean 10GiB"), "{bare}");
    let huge = [
        "volume",
        "create",
        "huge",
        "--size",
        "99999999999999999999GiB",
    ];
    let huge = fails(&repository, &huge);
    assert!(huge.contains("too large"), "{huge}");
    assert!(!huge.contains("whole number"), "{huge}");
}

/// Goal: `volume resize` to a smaller size needs `--shrink`, since it discards the end of
/// the volume; growing needs nothing. Method: shrink without and with the flag, then grow.
#[test]
fn shrinking_needs_the_flag() {
    let directory = tempfile::tempdir().unwrap();
    let repository = directory.path().join("repository");
    succeeds(&repository, &["init"]);
    succeeds(
        &repository,
        &["volume", "create", "disk", "--size", "16MiB"],
    );
    let refused = fails(&repository, &["volume", "resize", "disk", "--size", "8MiB"]);
    assert!(refused.contains("--shrink"), "{refused}");
    assert_eq!(volume_size(&repository, "disk"), 16 << 20);
    let shrink = ["volume", "resize", "disk", "--size", "8MiB", "--shrink"];
    succeeds(&repository, &shrink);
    assert_eq!(volume_size(&repository, "disk"), 8 << 20);
    succeeds(
        &repository,
        &["volume", "resize", "disk", "--size", "32MiB"],
    );
    assert_eq!(volume_size(&repository, "disk"), 32 << 20);
}

/// Goal: `volume hint` prints text, and JSON only with `--json`. Method: set a source and a
/// range, read both outputs.
#[test]
fn hint_prints_text_unless_json() {
    let directory = tempfile::tempdir().unwrap();
    let repository = directory.path().join("repository");
    succeeds(&repository, &["init"]);
    succeeds(
        &repository,
        &["volume", "create", "disk", "--size", "16MiB"],
    );
    let text = succeeds(
        &repository,
        &[
            "volume",
            "hint",
            "disk",
            "--sources",
            "explicit",
            "--no-dedup",
            "0..1MiB",
        ],
    );
    assert!(!text.trim_start().starts_with('{'), "{text}");
    assert!(text.contains("hint sources      explicit\n"), "{text}");
    assert!(text.contains("no-dedup range    0 B..1.00 MiB"), "{text}");
    let json = succeeds(&repository, &["volume", "hint", "disk", "--json"]);
    let record: serde_json::Value = serde_json::from_str(&json).expect("JSON with --json");
    assert_eq!(record["hints"]["filesystem"], false);
}

/// Goal: `--repo` before a command that uses no repository is refused instead of ignored.
/// Method: run `analyze` with `--repo` on the command line, then with ONECOPY_REPO only.
#[test]
fn repo_is_refused_where_it_does_nothing() {
    let directory = tempfile::tempdir().unwrap();
    let file = directory.path().join("file");
    std::fs::write(&file, [7u8; 8192]).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_onecopy"))
        .args(["--repo", "/nonexistent", "analyze", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(message.contains("uses no repository"), "{message}");
    succeeds(
        Path::new("/nonexistent"),
        &["analyze", file.to_str().unwrap()],
    );
}

/// Goal: backup output names modes and methods as the options spell them, not as Rust
/// debug names, and `backup list` says what its STORED column counts. Method: create,
/// list, read the stats and delete a backup of a small file.
#[test]
fn backup_output_uses_option_names() {
    let directory = tempfile::tempdir().unwrap();
    let repository = directory.path().join("repository");
    let file = directory.path().join("file");
    std::fs::write(&file, vec![7u8; 1 << 20]).unwrap();
    succeeds(&repository, &["init"]);
    succeeds(
        &repository,
        &["backup", "create", "s", file.to_str().unwrap()],
    );
    let listed = succeeds(&repository, &["backup", "list"]);
    assert!(
        listed.contains("STORED: what each backup added"),
        "{listed}"
    );
    let stats = succeeds(&repository, &["backup", "stats"]);
    assert!(stats.contains("mode              revdedup,"), "{stats}");
    let deleted = succeeds(&repository, &["backup", "delete", "s@1"]);
    assert!(deleted.contains("(timestamp)"), "{deleted}");
}

/// Goal: a reader that stops early (`onecopy ... | head`) ends the command quietly, without a
/// panic message. Method: `backup ls` of a 2000-file backup into a pipe whose reading end is
/// closed at once; standard error must hold no panic.
#[test]
fn closed_pipe_ends_quietly() {
    let scratch = tempfile::tempdir().unwrap();
    let repository = scratch.path().join("repository");
    let init = onecopy(&repository, &["init"]);
    assert!(init.status.success());
    let source = scratch.path().join("source");
    std::fs::create_dir_all(&source).unwrap();
    for index in 0..2000 {
        std::fs::write(source.join(format!("file-{index}")), b"x").unwrap();
    }
    let created = onecopy(
        &repository,
        &["backup", "create", "s", source.to_str().unwrap()],
    );
    assert!(created.status.success());
    let mut child = Command::new(env!("CARGO_BIN_EXE_onecopy"))
        .env("ONECOPY_REPO", &repository)
        .env("ONECOPY_PASSWORD", "test password")
        .args(["backup", "ls", "s"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains("Broken pipe"), "{stderr}");
}
