//! The testbed end to end: engine + NBD server + nbdfuse + loop device + ext4, then teardown.
//! Needs root, /dev/fuse and the tools of scripts/setup.sh; without them the tests fail
//! saying what is missing.

use std::fs;
use std::path::Path;

use onecopy_block::{HintSettings, RuntimeOptions};
use onecopy_lab::mount::{require_program, run, FileSystemOptions, Testbed, TestbedOptions};

/// Fails the test, saying what is missing, unless the testbed can run here.
fn require_testbed() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    assert!(
        root,
        "the testbed mounts a file system and must run as root"
    );
    for program in ["nbdfuse", "losetup", "fusermount3", "mkfs.ext4", "mount"] {
        assert!(
            require_program(program).is_ok(),
            "{program} is not installed: run scripts/setup.sh"
        );
    }
    assert!(
        Path::new("/dev/fuse").exists(),
        "/dev/fuse is missing: nbdfuse needs the fuse module (modprobe fuse)"
    );
}

fn options(parent: &Path) -> TestbedOptions {
    let runtime = RuntimeOptions {
        content_cache_bytes: 0,
        ..RuntimeOptions::default()
    };
    TestbedOptions {
        parent_directory: parent.to_path_buf(),
        volume_bytes: 256 << 20,
        block_bytes: 4096,
        runtime,
        hints: HintSettings::default(),
        file_system: FileSystemOptions::ext4(),
    }
}

/// Backing files of the loop devices in use.
fn loop_backing_files() -> String {
    run(
        "losetup",
        &["--list", "--noheadings", "--output", "BACK-FILE"],
    )
    .unwrap_or_default()
}

/// Goal: a file written through ext4 reaches the engine (hints see the file system), survives
/// a remount, and teardown leaves no mount, loop device or directory behind.
#[test]
fn ext4_on_a_volume_round_trips_and_tears_down() {
    require_testbed();
    let parent = tempfile::tempdir().unwrap();
    let mut testbed = Testbed::attach(&options(parent.path())).unwrap();
    let file = testbed.mount_point().join("hello.bin");
    let content: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    fs::write(&file, &content).unwrap();
    testbed.sync().unwrap();
    let stats = testbed.volume_stats().unwrap();
    assert!(stats.file_system.is_some(), "the engine recognised ext4");
    assert!(stats.engine.requests.hint_metadata_blocks > 0);
    assert!(stats.mapped_bytes >= content.len() as u64);
    testbed.remount().unwrap();
    assert_eq!(fs::read(&file).unwrap(), content);
    let reads_before = testbed.engine().stats().requests.reads;
    assert!(reads_before > 0, "reads after remount reached the engine");
    let mount_point = testbed.mount_point().to_path_buf();
    testbed.teardown().unwrap();
    assert!(!mount_point.exists(), "the temporary directory is removed");
    assert!(!loop_backing_files().contains(&parent.path().display().to_string()));
    let left: Vec<_> = fs::read_dir(parent.path())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// Goal: dropping a testbed without teardown (as on an error path) still unmounts and
/// detaches everything.
#[test]
fn dropping_a_testbed_tears_it_down() {
    require_testbed();
    let parent = tempfile::tempdir().unwrap();
    let testbed = Testbed::attach(&options(parent.path())).unwrap();
    let mount_point = testbed.mount_point().to_path_buf();
    fs::write(mount_point.join("x"), b"x").unwrap();
    drop(testbed);
    let mounts = fs::read_to_string("/proc/mounts").unwrap();
    assert!(!mounts.contains(&mount_point.display().to_string()));
    assert!(!loop_backing_files().contains(&parent.path().display().to_string()));
    let left: Vec<_> = fs::read_dir(parent.path())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
