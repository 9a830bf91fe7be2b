//! A full disk over NBD, on a small tmpfs: writes get ENOSPC (not EIO) and change nothing,
//! reads of every volume keep working, writes resume when room comes back without a
//! restart, a 100% full repository still opens (`volume list`, `check`, `serve`), and
//! deleting a volume frees its space.

mod block_support;

use std::path::{Path, PathBuf};
use std::process::Command;

use block_support::nbd_client::{NbdClient, COMMAND_FLUSH, COMMAND_WRITE};
use block_support::{pattern, require_root, TestRepository, MIB};

/// NBD's ENOSPC.
const ENOSPC: u32 = 28;

/// A tmpfs of a given size, unmounted when dropped.
struct Tmpfs {
    path: PathBuf,
    _directory: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(megabytes: u64) -> Tmpfs {
        require_root();
        let directory = tempfile::Builder::new()
            .prefix("onecopy-full-")
            .tempdir()
            .expect("mount point");
        let path = directory.path().to_path_buf();
        let status = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={megabytes}m,mode=0700"),
                "tmpfs",
            ])
            .arg(&path)
            .status()
            .expect("running mount");
        assert!(status.success(), "mounting a tmpfs at {}", path.display());
        Tmpfs {
            path,
            _directory: directory,
        }
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// Bytes of the files under `path`.
fn directory_bytes(path: &Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(path).unwrap() {
        let entry = entry.unwrap();
        let metadata = entry.metadata().unwrap();
        total += if metadata.is_dir() {
            directory_bytes(&entry.path())
        } else {
            metadata.len()
        };
    }
    total
}

/// Writes `data` at `offset` and returns the NBD error (0: success).
fn write(client: &mut NbdClient, offset: u64, data: &[u8]) -> u32 {
    client
        .send(COMMAND_WRITE, 0, 1, offset, data.len() as u32, data)
        .expect("sending a write");
    client.receive().expect("a reply").error
}

fn flush(client: &mut NbdClient) -> u32 {
    client
        .send(COMMAND_FLUSH, 0, 2, 0, 0, &[])
        .expect("sending a flush");
    client.receive().expect("a reply").error
}

/// Fills the file system with a file of zeros until it is full (`dd` stops at ENOSPC).
fn fill_file(path: &Path) {
    let _ = Command::new("dd")
        .args(["if=/dev/zero", "bs=1M", "status=none"])
        .arg(format!("of={}", path.display()))
        .status()
        .expect("running dd");
}

/// Goal: at a full disk NBD writes fail with ENOSPC, reads and FLUSH keep working, and
/// writes resume once room comes back, without a restart; then at 100% full the
/// repository still opens (list, check, serve reads) and deleting a volume frees space.
#[test]
fn full_disk_over_nbd() {
    let tmpfs = Tmpfs::mount(200);
    let test = TestRepository::inside(tmpfs.path());
    test.create_volume("keep", "32MiB");
    test.create_volume("scratch", "512MiB");
    // Room that another program holds and gives back later.
    let held = tmpfs.path().join("held");
    std::fs::write(&held, vec![1u8; 48 * MIB as usize]).unwrap();

    let server = test.serve(&[]);
    let mut keep = NbdClient::connect(server.socket(), "keep").unwrap();
    let kept = pattern(4 * MIB as usize, 1);
    assert_eq!(write(&mut keep, 0, &kept), 0);
    assert_eq!(flush(&mut keep), 0);
    let mut scratch = NbdClient::connect(server.socket(), "scratch").unwrap();
    let mut written = 0u64;
    let refusal = loop {
        let error = write(
            &mut scratch,
            written * MIB,
            &pattern(MIB as usize, 100 + written),
        );
        if error != 0 {
            break error;
        }
        written += 1;
        assert!(written < 512, "the disk never filled");
    };
    assert_eq!(
        refusal, ENOSPC,
        "a full disk is ENOSPC, after {written} MiB"
    );
    assert!(written > 16, "{written} MiB written before the disk filled");
    assert_eq!(write(&mut keep, 4 * MIB, &pattern(MIB as usize, 2)), ENOSPC);
    assert_eq!(keep.read(0, 4 * MIB as u32).unwrap(), kept);
    assert_eq!(
        keep.read(4 * MIB, MIB as u32).unwrap(),
        vec![0u8; MIB as usize]
    );
    for index in [0, written / 2, written - 1] {
        assert_eq!(
            scratch.read(index * MIB, MIB as u32).unwrap(),
            pattern(MIB as usize, 100 + index),
            "MiB {index} of scratch"
        );
    }
    assert_eq!(flush(&mut scratch), 0);

    // Room comes back: writes resume without a restart.
    std::fs::remove_file(&held).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(write(&mut keep, 4 * MIB, &pattern(MIB as usize, 2)), 0);
    assert_eq!(flush(&mut keep), 0);
    drop(keep);
    drop(scratch);
    server.stop();

    // 100% full: every byte taken by another file.
    fill_file(&tmpfs.path().join("filler"));
    let listed = test.onecopy_json(&["volume", "list"]);
    assert_eq!(listed.as_array().map(Vec::len), Some(2), "{listed}");
    let check = test.onecopy_output(&["check"]);
    assert_eq!(check.status.code(), Some(0), "{check:?}");
    let server = test.serve(&[]);
    let mut keep = NbdClient::connect(server.socket(), "keep").unwrap();
    assert_eq!(keep.read(0, 4 * MIB as u32).unwrap(), kept);
    assert_eq!(
        keep.read(4 * MIB, MIB as u32).unwrap(),
        pattern(MIB as usize, 2)
    );
    drop(keep);
    server.stop();
    let before = directory_bytes(&test.repository().join("block/containers"));
    let deleted = test.onecopy(&["volume", "delete", "scratch"]);
    let after = directory_bytes(&test.repository().join("block/containers"));
    assert!(deleted.contains("freed"), "{deleted}");
    assert!(
        before - after >= (written - 8) * MIB,
        "deleting {written} MiB freed {} bytes: {deleted}",
        before - after
    );
    std::fs::remove_file(tmpfs.path().join("filler")).unwrap();
    let free = test.onecopy(&["volume", "list"]);
    assert!(free.contains("keep") && !free.contains("scratch"), "{free}");
}
