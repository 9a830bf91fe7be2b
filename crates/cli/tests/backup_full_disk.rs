//! `onecopy backup` on a full file system, end to end: a repository on a small tmpfs the
//! test mounts (root, as in CI; without root it fails saying so). `create` fails with a
//! message that says the disk is full and what to do; at 100% full `list`, `restore` and
//! `check` work and `delete` frees space; `compact` runs.

use std::io::Write;
use std::path::{Path, PathBuf};
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

/// A tmpfs mounted for the test, unmounted when dropped.
struct Tmpfs {
    path: PathBuf,
    _parent: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(bytes: u64) -> Tmpfs {
        let parent = tempfile::tempdir().unwrap();
        let path = parent.path().join("tmpfs");
        std::fs::create_dir(&path).unwrap();
        let output = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}")])
            .arg("tmpfs")
            .arg(&path)
            .output()
            .expect("running mount(8): install util-linux (mount) to run this test");
        assert!(
            output.status.success(),
            "this test mounts a tmpfs and needs root (as in CI): mount failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        Tmpfs {
            path,
            _parent: parent,
        }
    }

    /// Fills the file system to the last byte with a file outside the repository.
    fn fill(&self) -> PathBuf {
        let filler = self.path.join("filler");
        let mut file = std::fs::File::create(&filler).unwrap();
        for block in [1 << 20, 4096, 1] {
            let data = vec![0x5a_u8; block];
            while file.write_all(&data).is_ok() {}
        }
        filler
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.path).status();
    }
}

fn random_file(path: &Path, seed: u64, bytes: usize) {
    let mut state = seed;
    let mut data = vec![0u8; bytes];
    for chunk in data.chunks_mut(8) {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        chunk.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes()[..chunk.len()]);
    }
    std::fs::write(path, data).unwrap();
}

/// Goal: see the module documentation. Method: back up 2 MiB images into a 40 MiB tmpfs
/// until `create` fails, fill the rest with a file, then run the read-only commands, delete
/// the two oldest backups and compact.
#[test]
fn commands_on_a_full_disk() {
    let tmpfs = Tmpfs::mount(40 << 20);
    let repository = tmpfs.path.join("repository");
    let scratch = tempfile::tempdir().unwrap();
    run(onecopy(&repository).arg("init"));
    let mut versions = 0;
    let failure = loop {
        let image = scratch.path().join(format!("image-{versions}"));
        random_file(&image, versions, 2 << 20);
        let output = onecopy(&repository)
            .args(["backup", "create", "vm"])
            .arg(&image)
            .args(["--compression", "none", "--container-size", "1MiB"])
            .output()
            .unwrap();
        if !output.status.success() {
            break String::from_utf8_lossy(&output.stderr).into_owned();
        }
        versions += 1;
        assert!(versions < 40, "the file system never filled");
    };
    assert!(versions >= 2, "some versions fit: {failure}");
    assert!(
        failure.contains("file system holding the repository is full")
            && failure.contains("onecopy backup"),
        "{failure}"
    );
    let _filler = tmpfs.fill();

    let listed = run(onecopy(&repository).args(["backup", "list", "--json"]));
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), versions as usize);
    let restored = scratch.path().join("restored");
    run(onecopy(&repository)
        .args(["backup", "restore", "vm@1"])
        .arg(&restored));
    assert_eq!(
        std::fs::read(&restored).unwrap(),
        std::fs::read(scratch.path().join("image-0")).unwrap()
    );
    let check = run(onecopy(&repository).args(["backup", "check", "--read-data"]));
    let text = String::from_utf8_lossy(&check.stdout);
    assert!(text.contains("no problems found"), "{text}");

    let deleted = run(onecopy(&repository).args(["backup", "delete", "vm@1"]));
    let text = String::from_utf8_lossy(&deleted.stdout);
    assert!(text.contains("freed"), "{text}");
    run(onecopy(&repository).args(["backup", "delete", "vm@2"]));
    let compacted = run(onecopy(&repository).args(["backup", "compact"]));
    assert!(
        String::from_utf8_lossy(&compacted.stdout).contains("compacted"),
        "{compacted:?}"
    );
    run(onecopy(&repository).args(["backup", "check", "--read-data"]));
}
