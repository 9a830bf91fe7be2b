//! The conveniences restic and borg users expect, through the binary: several paths per
//! backup, excludes, one file system, tags and host, the change summary, `ls`, `diff`,
//! partial restores and calendar retention.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

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

fn run_json(command: &mut Command) -> Value {
    let output = run(command.arg("--json"));
    serde_json::from_slice(&output.stdout).expect("--json prints JSON")
}

fn fails(command: &mut Command) -> String {
    let output = command.output().expect("onecopy runs");
    assert!(!output.status.success(), "{command:?} must fail");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Small sizes so that a few hundred KiB make many chunks, some across file boundaries.
const SMALL: [&str; 6] = [
    "--segment-size",
    "64KiB",
    "--chunk-size",
    "2KiB",
    "--container-size",
    "256KiB",
];

/// Distinct, incompressible-enough bytes.
fn data(seed: u64, bytes: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..bytes)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

fn write(path: &Path, bytes: &[u8]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

/// A repository with a small store, initialised.
fn repository(scratch: &Path) -> PathBuf {
    let repository = scratch.join("repository");
    run(onecopy(&repository).arg("init"));
    repository
}

/// Every regular file beneath `root` (relative path to bytes).
fn files(root: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut found = BTreeMap::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(directory) = pending.pop() {
        for child in std::fs::read_dir(&directory).unwrap() {
            let path = child.unwrap().path();
            let metadata = std::fs::symlink_metadata(&path).unwrap();
            if metadata.is_dir() {
                pending.push(path);
            } else if metadata.is_file() {
                let relative = path.strip_prefix(root).unwrap().display().to_string();
                found.insert(relative, std::fs::read(&path).unwrap());
            }
        }
    }
    found
}

/// Compares restored files with the expected ones, naming the paths that differ (not their
/// bytes).
fn assert_same_files(actual: &BTreeMap<String, Vec<u8>>, expected: &BTreeMap<String, Vec<u8>>) {
    let differing: Vec<&String> = actual
        .keys()
        .chain(expected.keys())
        .filter(|path| actual.get(*path) != expected.get(*path))
        .collect();
    assert!(
        differing.is_empty(),
        "these files differ or are missing: {differing:?}"
    );
}

/// The paths `backup ls --json` lists.
fn listed_paths(listing: &Value) -> Vec<String> {
    listing
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| entry["path"].as_str().unwrap().to_string())
        .collect()
}

/// Goal: several paths make one tree beneath their common directory, excludes (given and
/// from a file) leave names out, tags and host are recorded and listed, and the summary
/// counts new, changed and unchanged files against the previous backup. Method: back up two
/// paths of a tree twice, changing it between; read `list`, `ls` and `create` as JSON and
/// restore.
#[test]
fn several_paths_excludes_labels_and_summary() {
    let scratch = tempfile::tempdir().unwrap();
    let repository = repository(scratch.path());
    let source = scratch.path().join("source");
    write(&source.join("docs/a.txt"), &data(1, 30_000));
    write(&source.join("docs/b.tmp"), &data(2, 1_000));
    write(&source.join("docs/cache/big.bin"), &data(3, 5_000));
    write(&source.join("docs/keep.bin"), &data(4, 7_000));
    write(&source.join("music/x/song"), &data(5, 50_000));
    write(&source.join("music/x/other"), &data(6, 2_000));
    write(&source.join("outside/never"), &data(7, 100));
    let exclude_file = scratch.path().join("excludes");
    std::fs::write(&exclude_file, "# caches\ncache\n\n").unwrap();
    let create = |extra: &[&str]| {
        let mut command = onecopy(&repository);
        command
            .args(["backup", "create", "home"])
            .arg(source.join("docs"))
            .arg(source.join("music/x"))
            .args(["--exclude", "*.tmp", "--exclude-file"])
            .arg(&exclude_file)
            .args(["--tag", "daily", "--tag", "laptop,work", "--host", "box"])
            .args(extra);
        run_json(&mut command)
    };
    let first = create(&SMALL);
    assert_eq!(first["summary"]["previous_version"], Value::Null);
    assert_eq!(first["summary"]["files_new"], 4);
    assert_eq!(
        first["summary"]["bytes_new"],
        30_000 + 7_000 + 50_000 + 2_000
    );

    let listed = run_json(onecopy(&repository).args(["backup", "list", "home"]));
    assert_eq!(listed[0]["host"], "box");
    assert_eq!(
        listed[0]["tags"],
        serde_json::json!(["daily", "laptop", "work"])
    );
    assert_eq!(listed[0]["paths"].as_array().unwrap().len(), 2);
    let plain = run(onecopy(&repository).args(["backup", "list"]));
    let plain = String::from_utf8_lossy(&plain.stdout);
    assert!(
        plain.contains("box") && plain.contains("daily,laptop,work"),
        "{plain}"
    );

    let listing = run_json(onecopy(&repository).args(["backup", "ls", "home"]));
    assert_eq!(
        listed_paths(&listing),
        [
            "docs",
            "docs/a.txt",
            "docs/keep.bin",
            "music",
            "music/x",
            "music/x/other",
            "music/x/song"
        ]
    );

    // Change one file (new size), add one, leave the rest.
    write(&source.join("docs/a.txt"), &data(8, 31_000));
    write(&source.join("music/x/new"), &data(9, 4_000));
    let second = create(&[]);
    let summary = &second["summary"];
    assert_eq!(summary["previous_version"], 1);
    assert_eq!(
        (
            &summary["files_new"],
            &summary["files_changed"],
            &summary["files_unchanged"]
        ),
        (&Value::from(1), &Value::from(1), &Value::from(3))
    );
    assert_eq!(summary["bytes_changed"], 31_000);
    assert_eq!(summary["bytes_unchanged"], 7_000 + 50_000 + 2_000);
    let text = run(onecopy(&repository)
        .args(["backup", "create", "home"])
        .arg(source.join("docs"))
        .arg(source.join("music/x")));
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("2 new") && text.contains("5 unchanged") && text.contains("compared with @2"),
        "{text}"
    );

    let target = scratch.path().join("restored");
    run(onecopy(&repository)
        .args(["backup", "restore", "home@2"])
        .arg(&target));
    let mut expected = files(&source);
    expected.retain(|path, _| {
        !path.ends_with(".tmp") && !path.contains("cache") && !path.starts_with("outside")
    });
    assert_same_files(&files(&target), &expected);

    // One directory alone is rooted at itself, as before.
    let single = run_json(
        onecopy(&repository)
            .args(["backup", "create", "docs"])
            .arg(source.join("docs")),
    );
    assert_eq!(single["summary"]["files_new"], 4);
    let listing = run_json(onecopy(&repository).args(["backup", "ls", "docs", "cache"]));
    assert_eq!(listed_paths(&listing), ["cache", "cache/big.bin"]);
    let error = fails(
        onecopy(&repository)
            .args(["backup", "create", "bad", "--exclude", "[oops"])
            .arg(&source),
    );
    assert!(error.contains("[oops"), "{error}");
}

/// Goal: `ls` lists mode, size and time of everything at and beneath a path, accepts the
/// path as it was on the backed-up machine, and refuses a path the backup does not hold.
/// Method: back up a tree with a link and a hard link; list as text and JSON.
#[test]
fn ls_lists_a_subtree() {
    let scratch = tempfile::tempdir().unwrap();
    let repository = repository(scratch.path());
    let source = scratch.path().join("source");
    write(&source.join("d/e/f"), b"hello");
    write(&source.join("g"), &data(1, 10_000));
    std::os::unix::fs::symlink("d/e/f", source.join("link")).unwrap();
    std::fs::hard_link(source.join("g"), source.join("d/hard")).unwrap();
    std::fs::set_permissions(
        source.join("d/e/f"),
        std::os::unix::fs::PermissionsExt::from_mode(0o640),
    )
    .unwrap();
    run(onecopy(&repository)
        .args(["backup", "create", "s"])
        .arg(&source));
    let all = run_json(onecopy(&repository).args(["backup", "ls", "s@1"]));
    assert_eq!(
        listed_paths(&all),
        ["d", "d/e", "d/e/f", "d/hard", "g", "link"]
    );
    let file = &all[2];
    assert_eq!(
        (&file["entry_type"], &file["size"], &file["mode"]),
        (&Value::from("file"), &Value::from(5), &Value::from(0o640))
    );
    assert_eq!(all[3]["size"], 10_000);
    assert_eq!(all[5]["link_target"], "d/e/f");
    let absolute = source.join("d").display().to_string();
    let under = run_json(onecopy(&repository).args(["backup", "ls", "s", &absolute]));
    assert_eq!(listed_paths(&under), ["d", "d/e", "d/e/f", "d/hard"]);
    let text = run(onecopy(&repository).args(["backup", "ls", "s", "d/e"]));
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("-rw-r-----") && text.contains("d/e/f"),
        "{text}"
    );
    let error = fails(onecopy(&repository).args(["backup", "ls", "s", "nothing"]));
    assert!(error.contains("nothing"), "{error}");
}

/// Goal: `restore --include` restores the chosen paths with what they hold, the directories
/// leading to them and the file of a chosen hard link, byte-exact, and nothing else; an
/// unknown path fails before anything is written. Method: files of many sizes with small
/// chunks (chunks cross file boundaries), include two scattered subtrees and a hard link.
#[test]
fn restore_includes_part_of_a_tree() {
    let scratch = tempfile::tempdir().unwrap();
    let repository = repository(scratch.path());
    let source = scratch.path().join("source");
    for index in 0..40u64 {
        let bytes = (index as usize * 3_733) % 20_000 + 1;
        write(
            &source.join(format!("dir{}/file{index:02}", index % 4)),
            &data(index, bytes),
        );
    }
    std::fs::hard_link(source.join("dir1/file01"), source.join("dir3/hard")).unwrap();
    // Two chosen files a few bytes apart: one chunk holds the end of one and the start of
    // the other.
    write(&source.join("dir4/a"), &data(100, 3_001));
    write(&source.join("dir4/b"), b"between");
    write(&source.join("dir4/c"), &data(101, 2_999));
    let mut create = onecopy(&repository);
    create
        .args(["backup", "create", "s"])
        .arg(&source)
        .args(SMALL);
    run(&mut create);

    let target = scratch.path().join("part");
    run(onecopy(&repository)
        .args(["backup", "restore", "s"])
        .arg(&target)
        .args(["--include", "dir2", "--include", "dir0/file08", "dir3/hard"])
        .args(["--include", "dir4/a", "--include", "dir4/c"]));
    let mut expected = files(&source);
    expected.retain(|path, _| {
        path.starts_with("dir2/")
            || [
                "dir0/file08",
                "dir3/hard",
                "dir1/file01",
                "dir4/a",
                "dir4/c",
            ]
            .contains(&path.as_str())
    });
    assert_same_files(&files(&target), &expected);
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata(target.join("dir3/hard")).unwrap().ino(),
        std::fs::metadata(target.join("dir1/file01")).unwrap().ino()
    );

    // The same choice as a tar archive on standard output.
    let archive =
        run(onecopy(&repository).args(["backup", "restore", "s", "-", "--include", "dir4/c"]));
    let archive_path = scratch.path().join("part.tar");
    std::fs::write(&archive_path, &archive.stdout).unwrap();
    let listing = Command::new("tar")
        .arg("-tf")
        .arg(&archive_path)
        .output()
        .expect("tar runs (install GNU tar)");
    assert!(listing.status.success());
    assert_eq!(
        String::from_utf8_lossy(&listing.stdout)
            .lines()
            .collect::<Vec<_>>(),
        ["./", "dir4/", "dir4/c"]
    );

    let refused = scratch.path().join("refused");
    let error = fails(
        onecopy(&repository)
            .args(["backup", "restore", "s"])
            .arg(&refused)
            .args(["--include", "dir9"]),
    );
    assert!(error.contains("dir9"), "{error}");
    assert!(!refused.exists(), "nothing is written for an unknown path");
    let error = fails(
        onecopy(&repository)
            .args(["backup", "restore", "s", "--to-file"])
            .arg(&refused)
            .args(["--include", "dir2"]),
    );
    assert!(error.contains("--include"), "{error}");
    assert!(
        !refused.exists(),
        "nothing is written for a stream restore with --include"
    );
}

/// Goal: `diff` lists added, removed, modified and metadata-only changes with sizes, as
/// text and JSON. Method: two backups of a tree changed between them.
#[test]
fn diff_lists_changes() {
    let scratch = tempfile::tempdir().unwrap();
    let repository = repository(scratch.path());
    let source = scratch.path().join("source");
    write(&source.join("same"), b"same");
    write(&source.join("grows"), &data(1, 100));
    write(&source.join("goes"), &data(2, 300));
    write(&source.join("mode"), b"m");
    run(onecopy(&repository)
        .args(["backup", "create", "s"])
        .arg(&source));
    write(&source.join("grows"), &data(1, 250));
    std::fs::remove_file(source.join("goes")).unwrap();
    write(&source.join("new/file"), &data(3, 40));
    std::fs::set_permissions(
        source.join("mode"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    run(onecopy(&repository)
        .args(["backup", "create", "s"])
        .arg(&source));
    let report = run_json(onecopy(&repository).args(["backup", "diff", "s@1", "s@2"]));
    let changes: Vec<(String, String)> = report["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|change| {
            (
                change["path"].as_str().unwrap().to_string(),
                change["change"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let expected = [
        ("goes", "removed"),
        ("grows", "modified"),
        ("mode", "metadata"),
        ("new", "added"),
        ("new/file", "added"),
    ];
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(path, change)| (path.to_string(), change.to_string()))
        .collect();
    assert_eq!(changes, expected);
    assert_eq!(report["added_bytes"], 40);
    assert_eq!(report["removed_bytes"], 300);
    assert_eq!(report["modified_bytes_delta"], 150);
    let text = run(onecopy(&repository).args(["backup", "diff", "s@1", "s@2"]));
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("M    grows"), "{text}");
    assert!(text.contains("-    goes"), "{text}");
    assert!(text.contains("U    mode"), "{text}");
    let error = fails(onecopy(&repository).args(["backup", "diff", "s", "s@2"]));
    assert!(error.contains("SERIES@VERSION"), "{error}");
}

/// Goal: `expire` with calendar rules keeps the newest backup of each bucket and names the
/// rule, `--dry-run` changes nothing, the plan runs as shown, and `--keep` still works.
/// Method: four backups within one hour; keep-hourly 1 with keep-last 2.
#[test]
fn expire_by_calendar_rules() {
    let scratch = tempfile::tempdir().unwrap();
    let repository = repository(scratch.path());
    let source = scratch.path().join("source");
    for version in 0..4u64 {
        write(&source.join("file"), &data(version, 5_000));
        run(onecopy(&repository)
            .args(["backup", "create", "s"])
            .arg(&source));
    }
    let expire = |extra: &[&str]| {
        let mut command = onecopy(&repository);
        command.args(["backup", "expire", "s"]).args(extra);
        command
    };
    let plan = run_json(&mut expire(&[
        "--keep-hourly",
        "1",
        "--keep-last",
        "2",
        "--dry-run",
    ]));
    assert_eq!(plan["versions"], serde_json::json!([1, 2]));
    let kept = plan["kept"].as_array().unwrap();
    assert_eq!(kept[0]["version"], 4);
    let reasons = kept[0]["reasons"].as_array().unwrap();
    assert_eq!(reasons[0], "last");
    assert!(
        reasons[1].as_str().unwrap().starts_with("hourly "),
        "{reasons:?}"
    );
    assert_eq!(kept[1]["reasons"], serde_json::json!(["last"]));
    let listed = run_json(onecopy(&repository).args(["backup", "list", "s"]));
    assert_eq!(
        listed.as_array().unwrap().len(),
        4,
        "a dry run changes nothing"
    );

    let text = run(&mut expire(&["--keep-hourly", "1", "--keep-last", "2"]));
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("keep   s@4"), "{text}");
    let listed = run_json(onecopy(&repository).args(["backup", "list", "s"]));
    let versions: Vec<u64> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|backup| backup["version"].as_u64().unwrap())
        .collect();
    assert_eq!(versions, [3, 4]);
    let done = run_json(&mut expire(&["--keep-daily", "1"]));
    assert_eq!(done["plan"]["versions"], serde_json::json!([3]));
    assert_eq!(done["deleted"].as_array().unwrap().len(), 1);
    let error = fails(&mut expire(&["--keep-daily", "0"]));
    assert!(error.contains("keep at least one"), "{error}");
    run(&mut expire(&["--keep", "1"]));
    let restored = scratch.path().join("restored");
    run(onecopy(&repository)
        .args(["backup", "restore", "s"])
        .arg(&restored));
    assert_eq!(
        std::fs::read(restored.join("file")).unwrap(),
        data(3, 5_000)
    );
    let check = run(onecopy(&repository).args(["backup", "check"]));
    assert!(check.status.success());
}

/// Unmounts a tmpfs when the test ends, however it ends.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Goal: `--one-file-system` records a mount point without what it holds, and a backup
/// without it goes in. Method: mount a tmpfs inside the tree (tests run as root).
#[test]
fn one_file_system_stops_at_mount_points() {
    let scratch = tempfile::tempdir().unwrap();
    let repository = repository(scratch.path());
    let source = scratch.path().join("source");
    write(&source.join("here"), b"here");
    let mount_point = source.join("mnt");
    std::fs::create_dir_all(&mount_point).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&mount_point)
        .status()
        .expect("mount runs (install util-linux mount)");
    assert!(
        mounted.success(),
        "mounting a tmpfs needs root (tests run as root on this machine and in CI)"
    );
    let _guard = Mounted(mount_point.clone());
    write(&mount_point.join("there"), b"there");
    run(onecopy(&repository)
        .args(["backup", "create", "one", "--one-file-system"])
        .arg(&source));
    run(onecopy(&repository)
        .args(["backup", "create", "all"])
        .arg(&source));
    let one = run_json(onecopy(&repository).args(["backup", "ls", "one"]));
    assert_eq!(listed_paths(&one), ["here", "mnt"]);
    let all = run_json(onecopy(&repository).args(["backup", "ls", "all"]));
    assert_eq!(listed_paths(&all), ["here", "mnt", "mnt/there"]);
}

/// Goal: `backup create` does not read files unchanged since the series' previous backup and
/// says so (text and JSON); `--force` reads them all; both restore byte-exact. Method: back
/// up a settled tree three times (the third with `--force`) and read the `files` report.
#[test]
fn files_cache_and_force() {
    let scratch = tempfile::tempdir().unwrap();
    let repository = repository(scratch.path());
    let source = scratch.path().join("source");
    for n in 0..12u64 {
        write(
            &source.join(format!("dir{}/file{n:02}", n % 3)),
            &data(n, 3_000 + n as usize * 1_000),
        );
    }
    write(&source.join("large"), &data(99, 200_000));
    // Files modified in the last two seconds are read again by the next backup.
    std::thread::sleep(std::time::Duration::from_millis(2_100));
    let create = |extra: &[&str]| {
        let mut command = onecopy(&repository);
        command
            .args(["backup", "create", "s"])
            .arg(&source)
            .args(SMALL)
            .args(extra);
        command
    };
    let first = run_json(&mut create(&[]));
    assert_eq!(first["files"]["files_read"], 13);
    assert_eq!(first["files"]["previous_version"], Value::Null);
    let second = run_json(&mut create(&[]));
    assert_eq!(second["files"]["files_read"], 0, "{second}");
    assert_eq!(second["files"]["bytes_read"], 0);
    assert_eq!(second["files"]["files_kept"], 13);
    assert_eq!(second["files"]["previous_version"], 1);
    assert_eq!(second["summary"]["files_unchanged"], 13);
    let text = run(&mut create(&[])).stdout;
    let text = String::from_utf8_lossy(&text);
    assert!(
        text.contains("read     0 files")
            && text.contains("13 files")
            && text.contains("unchanged since @2"),
        "{text}"
    );
    let forced = run_json(&mut create(&["--force"]));
    assert_eq!(forced["files"]["files_read"], 13, "{forced}");
    assert_eq!(forced["files"]["files_kept"], 0);
    assert_eq!(forced["files"]["previous_version"], Value::Null);
    for version in ["s@2", "s@4"] {
        let target = scratch.path().join(version.replace('@', "-"));
        run(onecopy(&repository)
            .args(["backup", "restore", version])
            .arg(&target));
        assert_same_files(&files(&target), &files(&source));
    }
}

/// Goal: a store created with a compression level at or above the default recompression
/// level gets no recompression unless asked; a lower one keeps the default; an explicit
/// recompression level at or below the compression level is refused, saying why.
#[test]
fn recompression_follows_the_compression_level() {
    let scratch = tempfile::tempdir().unwrap();
    let source = scratch.path().join("source");
    write(&source.join("a"), &data(1, 10 << 10));
    let level_of = |name: &str, compression: &str| {
        let repository = repository(&scratch.path().join(name));
        let mut create = onecopy(&repository);
        create.args(["backup", "create", "s"]).arg(&source);
        run(create.args(["--compression", compression]));
        let stats = run_json(onecopy(&repository).args(["backup", "stats"]));
        stats["options"]["recompression_level"].clone()
    };
    assert_eq!(level_of("strong", "9"), Value::Null);
    assert_eq!(level_of("fast", "3"), Value::from(7));

    let repository = repository(&scratch.path().join("refused"));
    let mut create = onecopy(&repository);
    create.args(["backup", "create", "s"]).arg(&source);
    let error = fails(create.args(["--compression", "9", "--recompression", "7"]));
    assert!(
        error.contains("recompression level 7 must be above the compression level 9"),
        "{error}"
    );
}
