//! The file system face through the `onecopy` binary: mount in the background, commands
//! while mounted, real programs on the mount (git, tar, make and a C compiler, fio), kill -9
//! after fsync, SIGTERM and `onecopy umount`.

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Fails (never skips) when FUSE cannot run here, saying what to install.
fn require_fuse() {
    assert!(
        Path::new("/dev/fuse").exists(),
        "this test mounts a FUSE file system: /dev/fuse is missing (load the fuse module, or \
         pass --device /dev/fuse to the container)"
    );
    let found = std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|directory| directory.join("fusermount3").exists())
    });
    assert!(
        found,
        "this test needs fusermount3: install the fuse3 package"
    );
}

struct Setup {
    _base: tempfile::TempDir,
    repository: PathBuf,
    mount_point: PathBuf,
}

impl Setup {
    fn new() -> Setup {
        require_fuse();
        let base = tempfile::tempdir().unwrap();
        let repository = base.path().join("repository");
        let mount_point = base.path().join("mnt");
        std::fs::create_dir(&mount_point).unwrap();
        let setup = Setup {
            _base: base,
            repository,
            mount_point,
        };
        setup.ok(&["init"]);
        setup
    }

    fn run(&self, arguments: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_onecopy"))
            .arg("--repo")
            .arg(&self.repository)
            .args(arguments)
            .output()
            .unwrap()
    }

    fn ok(&self, arguments: &[&str]) -> String {
        let output = self.run(arguments);
        assert!(
            output.status.success(),
            "onecopy {arguments:?} failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    }

    fn json(&self, arguments: &[&str]) -> Value {
        serde_json::from_str(&self.ok(arguments)).unwrap()
    }

    fn mount(&self, name: &str) {
        let mount_point = self.mount_point.to_str().unwrap();
        self.ok(&["mount", name, mount_point]);
    }

    /// The pid of the process serving the mount, from the face's lock.
    fn server_pid(&self) -> i32 {
        let holder = std::fs::read_to_string(self.repository.join("fs/lock")).unwrap();
        holder
            .strip_prefix("pid ")
            .and_then(|rest| rest.split(':').next())
            .and_then(|pid| pid.parse().ok())
            .unwrap_or_else(|| panic!("lock holder {holder:?}"))
    }
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks for the process.
    unsafe { libc::kill(pid, 0) == 0 }
}

fn wait_gone(pid: i32, within: Duration) {
    let started = Instant::now();
    while alive(pid) {
        // Reap it if it is our child (it is not: the mount command's child was re-parented).
        assert!(
            started.elapsed() < within,
            "process {pid} still runs after {within:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn is_mounted(path: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    let path = path.to_str().unwrap();
    mounts
        .lines()
        .any(|line| line.split(' ').nth(1) == Some(path))
}

fn git(directory: &Path, arguments: &[&str]) {
    let output = Command::new("git")
        .current_dir(directory)
        .args(arguments)
        .output()
        .expect("git is installed");
    assert!(
        output.status.success(),
        "git {arguments:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Goal: the commands of the issue work while mounted, answered by the mounting process
/// (list shows the mount, stats and ranks see live I/O, dedup plans and executes, config
/// changes options, delete of the mounted file system is refused), and `umount` ends the
/// serving process. Method: the binary, its JSON output.
#[test]
fn commands_work_while_mounted() {
    let setup = Setup::new();
    setup.ok(&[
        "fs",
        "create",
        "data",
        "--min-evaluation-interval",
        "0",
        "--idle",
        "0",
    ]);
    setup.mount("data");
    let mounted = &setup.mount_point;
    let payload: Vec<u8> = (0..3u32 << 20).map(|i| (i / 4096) as u8).collect();
    std::fs::write(mounted.join("one"), &payload).unwrap();
    std::fs::write(mounted.join("two"), &payload).unwrap();

    let list = setup.json(&["fs", "list", "--json"]);
    assert_eq!(list[0]["name"], "data");
    assert_eq!(
        list[0]["mount_point"],
        mounted.canonicalize().unwrap().to_str().unwrap()
    );
    let stats = setup.json(&["fs", "stats", "data", "--json"]);
    assert_eq!(stats["files"], 2);
    assert_eq!(stats["logical_bytes"], 6 << 20);
    assert_eq!(stats["pending_bytes"], 6 << 20);
    assert_eq!(stats["ranks"][0]["files"], 2);

    // Not read enough yet (MIN_EVALUATION_CNT is 100): nothing to do.
    let plan = setup.json(&["fs", "dedup", "data", "--dry-run", "--json"]);
    assert_eq!(plan["plan"]["files"].as_array().unwrap().len(), 0, "{plan}");
    setup.ok(&["fs", "config", "data", "--min-evaluation-count", "0"]);
    let plan = setup.json(&["fs", "dedup", "data", "--dry-run", "--json"]);
    assert_eq!(plan["plan"]["files"].as_array().unwrap().len(), 2, "{plan}");
    assert!(plan["report"].is_null());
    let run = setup.json(&["fs", "dedup", "data", "--json"]);
    assert_eq!(run["report"]["files_deduplicated"], 2, "{run}");
    let stats = setup.json(&["fs", "stats", "data", "--json"]);
    assert_eq!(stats["pending_bytes"], 0);
    assert!(
        stats["stored_bytes"].as_u64().unwrap() < (1 << 20),
        "repeated blocks and the copy deduplicate: {stats}"
    );
    assert_eq!(std::fs::read(mounted.join("two")).unwrap(), payload);
    // The plain copies the run freed wait in their containers until a compaction.
    let waiting = |stats: &Value| {
        stats["face"]["container_bytes"]
            .as_u64()
            .unwrap()
            .saturating_sub(stats["face"]["live_stored_bytes"].as_u64().unwrap())
    };
    assert!(waiting(&stats) > (4 << 20), "{stats}");
    let compact = setup.json(&["fs", "compact", "--json"]);
    assert!(
        compact["report"]["containers_retired"].as_u64().unwrap() > 0,
        "{compact}"
    );
    let stats = setup.json(&["fs", "stats", "data", "--json"]);
    assert!(waiting(&stats) < (1 << 20), "{stats}");
    assert_eq!(std::fs::read(mounted.join("one")).unwrap(), payload);
    let ranks = setup.json(&["fs", "ranks", "data", "--json"]);
    assert_eq!(ranks.as_array().unwrap().len(), 2);
    assert!(
        ranks[1]["sequential_reads"].as_u64().unwrap() > 0,
        "{ranks}"
    );

    // `onecopy check` asks the mounting process for the face's report.
    let check = setup.json(&["check", "--read-data", "--json"]);
    let face = check["faces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|face| face["face"] == "fs")
        .unwrap_or_else(|| panic!("the fs face is checked: {check}"));
    assert_eq!(face["findings"], serde_json::json!([]), "{check}");
    assert!(face["checked"]["chunks"].as_u64().unwrap() > 0, "{check}");

    // Another file system of the repository mounts too, served by the same process.
    setup.ok(&["fs", "create", "other"]);
    let second = setup._base.path().join("second");
    std::fs::create_dir(&second).unwrap();
    setup.ok(&["mount", "other", second.to_str().unwrap()]);
    std::fs::write(second.join("file"), b"other").unwrap();
    assert_eq!(setup.json(&["fs", "stats", "other", "--json"])["files"], 1);
    setup.ok(&["umount", second.to_str().unwrap()]);
    assert!(!is_mounted(&second.canonicalize().unwrap()));
    setup.ok(&["fs", "delete", "other"]);

    let refused = setup.run(&["fs", "delete", "data"]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("unmount it first"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let pid = setup.server_pid();
    setup.ok(&["umount", mounted.to_str().unwrap()]);
    assert!(!is_mounted(&mounted.canonicalize().unwrap()));
    wait_gone(pid, Duration::from_secs(10));
    // Without a mount the commands open the face themselves.
    let stats = setup.json(&["fs", "stats", "data", "--json"]);
    assert_eq!(stats["files"], 2);
    setup.ok(&["check", "--read-data"]);
    setup.ok(&["fs", "delete", "data"]);
    assert_eq!(setup.json(&["fs", "list", "--json"]), serde_json::json!([]));
}

/// Goal: real programs work on the mount: `git clone` of a local repository then `git fsck`,
/// `tar x` of a real source tree that compares equal with `diff -r`, and `fio
/// --verify=crc32c` before and after deduplication. Method: the binary mounts; the programs
/// run on the mount.
#[test]
fn git_and_tar_on_the_mount() {
    let setup = Setup::new();
    setup.ok(&["fs", "create", "work"]);
    setup.mount("work");
    let mounted = setup.mount_point.canonicalize().unwrap();
    // A small repository with history, made here.
    let origin = setup._base.path().join("origin");
    std::fs::create_dir(&origin).unwrap();
    git(&origin, &["init", "-q"]);
    for round in 0..5 {
        for file in 0..20 {
            let mut content = format!("round {round} file {file}\n").repeat(200 + file);
            content.push_str(&"x".repeat(round * 1000));
            std::fs::write(origin.join(format!("f{file}.txt")), content).unwrap();
        }
        git(&origin, &["add", "."]);
        git(
            &origin,
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "commit",
                "-q",
                "-m",
                "round",
            ],
        );
    }
    let origin_url = format!("file://{}", origin.display());
    git(&mounted, &["clone", "-q", &origin_url, "clone"]);
    git(&mounted.join("clone"), &["fsck", "--full", "--strict"]);
    git(&mounted.join("clone"), &["gc", "-q"]);
    git(&mounted.join("clone"), &["fsck", "--full"]);

    // tar x of this crate's source tree, compared with the original.
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../core");
    let tar = Command::new("tar")
        .arg("-C")
        .arg(&source)
        .args(["-cf", "-", "."])
        .output()
        .unwrap();
    assert!(tar.status.success());
    std::fs::create_dir(mounted.join("core")).unwrap();
    let mut untar = Command::new("tar")
        .arg("-C")
        .arg(mounted.join("core"))
        .args(["-xf", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    untar.stdin.take().unwrap().write_all(&tar.stdout).unwrap();
    assert!(untar.wait().unwrap().success());
    let diff = Command::new("diff")
        .arg("-r")
        .arg(&source)
        .arg(mounted.join("core"))
        .output()
        .unwrap();
    assert!(
        diff.status.success(),
        "{}",
        String::from_utf8_lossy(&diff.stdout)
    );
    // fio writes random 4 KiB blocks with checksums and verifies them, before and after a
    // deduplication run.
    let fio = |arguments: &[&str]| {
        let output = Command::new("fio")
            .args([
                "--name=verify",
                "--size=16M",
                "--bs=4k",
                "--verify=crc32c",
                "--ioengine=psync",
            ])
            .arg(format!("--filename={}", mounted.join("fio.dat").display()))
            .args(arguments)
            .output()
            .expect("fio is installed (scripts/setup.sh)");
        assert!(
            output.status.success(),
            "fio {arguments:?}: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    };
    fio(&["--rw=randwrite", "--do_verify=1"]);
    setup.ok(&[
        "fs",
        "config",
        "work",
        "--min-evaluation-interval",
        "0",
        "--min-evaluation-count",
        "0",
    ]);
    setup.ok(&["fs", "dedup", "work"]);
    fio(&["--rw=read", "--verify_only"]);

    let pid = setup.server_pid();
    setup.ok(&["umount", mounted.to_str().unwrap()]);
    wait_gone(pid, Duration::from_secs(10));
}

/// The C sources of the zstd library that this workspace builds (the `zstd-sys` crate of
/// Cargo.lock, unpacked by cargo in its registry): a real source tree every machine that runs
/// these tests has.
fn zstd_sources() -> PathBuf {
    let lock =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.lock"))
            .unwrap();
    let version = lock
        .split("[[package]]")
        .find(|package| package.contains("name = \"zstd-sys\""))
        .and_then(|package| {
            package
                .lines()
                .find_map(|line| line.strip_prefix("version = "))
        })
        .expect("Cargo.lock names zstd-sys")
        .trim_matches('"')
        .to_string();
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cargo"));
    let registry = cargo_home.join("registry/src");
    std::fs::read_dir(&registry)
        .unwrap_or_else(|error| panic!("reading {}: {error}", registry.display()))
        .map(|entry| {
            entry
                .unwrap()
                .path()
                .join(format!("zstd-sys-{version}/zstd/lib"))
        })
        .find(|path| path.join("zstd.h").exists())
        .unwrap_or_else(|| {
            panic!(
                "zstd-sys {version}'s sources are not under {}",
                registry.display()
            )
        })
}

/// Goal: a real source tree untars and builds on the mount, and what it built runs, before
/// and after deduplication. Method: tar the zstd library's C sources (about 40 files) onto the
/// mount, build them with make (two jobs) into a static library and a program that compresses
/// and decompresses 1 MiB through it, run the program; deduplicate the file system and run
/// the program again from the deduplicated files.
#[test]
fn source_tree_builds_on_the_mount() {
    let setup = Setup::new();
    setup.ok(&["fs", "create", "build"]);
    setup.mount("build");
    let mounted = setup.mount_point.canonicalize().unwrap();
    let tree = mounted.join("zstd");
    std::fs::create_dir_all(tree.join("lib")).unwrap();
    let untar = Command::new("sh")
        .arg("-c")
        .arg("tar -C \"$1\" -cf - . | tar -C \"$2\" -xf -")
        .arg("untar")
        .arg(zstd_sources())
        .arg(tree.join("lib"))
        .output()
        .unwrap();
    assert!(
        untar.status.success(),
        "{}",
        String::from_utf8_lossy(&untar.stderr)
    );
    std::fs::write(
        tree.join("Makefile"),
        "SOURCES := $(wildcard lib/common/*.c lib/compress/*.c lib/decompress/*.c)\n\
         OBJECTS := $(SOURCES:.c=.o)\n\
         CFLAGS := -O0 -DZSTD_DISABLE_ASM -Ilib -Ilib/common\n\
         roundtrip: roundtrip.o libzstd.a\n\t$(CC) -o $@ $^\n\
         libzstd.a: $(OBJECTS)\n\t$(AR) rcs $@ $^\n",
    )
    .unwrap();
    std::fs::write(
        tree.join("roundtrip.c"),
        r#"#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "zstd.h"
int main(void) {
    size_t size = 1 << 20, bound = ZSTD_compressBound(1 << 20);
    char *data = malloc(size), *back = malloc(size), *packed = malloc(bound);
    for (size_t i = 0; i < size; i++) data[i] = (char)((i * 7) ^ (i >> 9));
    size_t packed_size = ZSTD_compress(packed, bound, data, size, 3);
    if (ZSTD_isError(packed_size)) return 2;
    size_t back_size = ZSTD_decompress(back, size, packed, packed_size);
    if (ZSTD_isError(back_size) || back_size != size || memcmp(data, back, size)) return 3;
    printf("round trip of %zu bytes through %zu\n", size, packed_size);
    return 0;
}
"#,
    )
    .unwrap();
    let make = Command::new("make")
        .args(["-j2", "-s"])
        .current_dir(&tree)
        .output()
        .expect("make is installed");
    assert!(
        make.status.success(),
        "make: {}{}",
        String::from_utf8_lossy(&make.stdout),
        String::from_utf8_lossy(&make.stderr)
    );
    let run = || {
        let output = Command::new(tree.join("roundtrip")).output().unwrap();
        assert!(
            output.status.success(),
            "the built program failed: {output:?}"
        );
        assert!(String::from_utf8_lossy(&output.stdout).starts_with("round trip of 1048576 bytes"));
    };
    run();
    setup.ok(&[
        "fs",
        "config",
        "build",
        "--min-evaluation-interval",
        "0",
        "--min-evaluation-count",
        "0",
    ]);
    let report = setup.json(&["fs", "dedup", "build", "--json"]);
    assert!(
        report["report"]["files_deduplicated"].as_u64().unwrap() > 40,
        "the sources, objects, library and program are deduplicated: {report}"
    );
    run();
    let pid = setup.server_pid();
    setup.ok(&["umount", mounted.to_str().unwrap()]);
    wait_gone(pid, Duration::from_secs(10));
}

/// Goal: what fsync acknowledged survives kill -9 of the mounting process, and the file
/// system mounts again; SIGTERM unmounts cleanly; a server ends after its last unmount even
/// when its control socket's path is gone. Method: write and fsync through the mount, kill
/// -9 the server, clear the dead mount, mount again and read; then SIGTERM; then remove the
/// socket's path, unmount, and wait for the server to end.
#[test]
fn fsync_survives_kill_9_and_sigterm_unmounts() {
    let setup = Setup::new();
    setup.ok(&["fs", "create", "crash"]);
    setup.mount("crash");
    let mounted = setup.mount_point.canonicalize().unwrap();
    let synced: Vec<u8> = (0..2_500_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let file = std::fs::File::create(mounted.join("synced")).unwrap();
    file.write_all_at(&synced, 0).unwrap();
    file.write_all_at(b"patch", 1_000_000).unwrap();
    file.sync_all().unwrap();
    drop(file);
    std::fs::create_dir(mounted.join("directory")).unwrap();
    std::fs::write(mounted.join("directory/small"), b"small").unwrap();
    std::fs::File::open(mounted.join("directory/small"))
        .unwrap()
        .sync_all()
        .unwrap();
    let pid = setup.server_pid();
    // SAFETY: kill sends a signal.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    wait_gone(pid, Duration::from_secs(10));
    let cleared = Command::new("fusermount3")
        .arg("-u")
        .arg(&mounted)
        .status()
        .unwrap();
    assert!(cleared.success(), "the dead mount is cleared");

    setup.mount("crash");
    let mut expected = synced;
    expected[1_000_000..1_000_005].copy_from_slice(b"patch");
    assert!(std::fs::read(mounted.join("synced")).unwrap() == expected);
    assert_eq!(
        std::fs::read(mounted.join("directory/small")).unwrap(),
        b"small"
    );
    let check = setup.json(&["fs", "stats", "crash", "--json"]);
    assert_eq!(check["files"], 2);
    // New writes after the crash get new containers, whatever the killed process left.
    let after: Vec<u8> = (0..6_000_000u32).map(|i| (i * 13 % 241) as u8).collect();
    std::fs::write(mounted.join("after"), &after).unwrap();
    assert!(std::fs::read(mounted.join("after")).unwrap() == after);

    let pid = setup.server_pid();
    // SAFETY: kill sends a signal.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    wait_gone(pid, Duration::from_secs(10));
    assert!(!is_mounted(&mounted), "SIGTERM unmounted");
    // A clean end: the next open replays nothing and the data is there.
    setup.mount("crash");
    assert!(std::fs::read(mounted.join("synced")).unwrap() == expected);
    assert!(std::fs::read(mounted.join("after")).unwrap() == after);
    // The server ends after its last unmount even when its control socket's path is gone
    // (a repository directory removed as the server ends).
    let pid = setup.server_pid();
    std::fs::remove_file(setup.repository.join("fs/control.sock")).unwrap();
    setup.ok(&["umount", mounted.to_str().unwrap()]);
    wait_gone(pid, Duration::from_secs(10));
}

/// Goal: deduplication runs by itself once the file system has been idle for `--idle`
/// seconds, and not while requests keep arriving. Method: a mount with --idle 1 and no
/// evaluation thresholds; writes every 100 ms for 2 s leave the data pending, then an idle
/// second deduplicates it.
#[test]
fn idle_file_system_deduplicates_by_itself() {
    let setup = Setup::new();
    setup.ok(&[
        "fs",
        "create",
        "idle",
        "--idle",
        "1",
        "--min-evaluation-interval",
        "0",
        "--min-evaluation-count",
        "0",
    ]);
    setup.mount("idle");
    let mounted = setup.mount_point.canonicalize().unwrap();
    let started = Instant::now();
    let mut round = 0u8;
    while started.elapsed() < Duration::from_secs(2) {
        std::fs::write(
            mounted.join(format!("f{}", round % 4)),
            vec![round + 1; 100_000],
        )
        .unwrap();
        round = round.wrapping_add(1);
        std::thread::sleep(Duration::from_millis(100));
    }
    let busy = setup.json(&["fs", "stats", "idle", "--json"]);
    assert!(busy["pending_bytes"].as_u64().unwrap() > 0, "{busy}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let stats = setup.json(&["fs", "stats", "idle", "--json"]);
        if stats["pending_bytes"] == 0 {
            assert_eq!(stats["ranks"][0]["files"], 0, "{stats}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not deduplicated when idle: {stats}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let pid = setup.server_pid();
    setup.ok(&["umount", mounted.to_str().unwrap()]);
    wait_gone(pid, Duration::from_secs(10));
}

/// Runs `script` as user nobody; its output and whether it succeeded.
fn as_nobody(script: &str) -> (bool, String) {
    let output = Command::new("su")
        .args(["nobody", "-s", "/bin/sh", "-c", script])
        .output()
        .expect("su is installed (util-linux / login)");
    (
        output.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    )
}

/// Goal: with allow_other the kernel's permission checks apply to other users (modes,
/// owners, who may chmod), new files belong to their creator, and `-o ro` refuses writes.
/// Method: the binary mounts; `su nobody` tries reads, writes and a chmod.
#[test]
fn permissions_and_read_only_mounts() {
    assert!(
        unsafe { libc::geteuid() } == 0,
        "this test switches to user nobody and must run as root"
    );
    let setup = Setup::new();
    // Other users must reach the mount point.
    let mut path = setup.mount_point.clone();
    while path.pop() {
        let mode = std::fs::metadata(&path).unwrap().permissions();
        if std::os::unix::fs::PermissionsExt::mode(&mode) & 0o001 == 0 {
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .unwrap();
        }
        if path == Path::new("/tmp") || path == Path::new("/") {
            break;
        }
    }
    setup.ok(&["fs", "create", "shared"]);
    let mounted = setup.mount_point.canonicalize().unwrap();
    let mount_point = mounted.to_str().unwrap();
    setup.ok(&["mount", "shared", mount_point, "-o", "allow_other"]);
    std::fs::create_dir(mounted.join("public")).unwrap();
    std::fs::create_dir(mounted.join("private")).unwrap();
    let set_mode = |name: &str, mode| {
        std::fs::set_permissions(
            mounted.join(name),
            std::os::unix::fs::PermissionsExt::from_mode(mode),
        )
        .unwrap()
    };
    set_mode("public", 0o777);
    set_mode("private", 0o700);
    std::fs::write(mounted.join("private/secret"), b"secret").unwrap();

    let (read, output) = as_nobody(&format!("cat {mount_point}/private/secret"));
    assert!(!read && output.contains("Permission denied"), "{output}");
    let (chmod, output) = as_nobody(&format!("chmod 777 {mount_point}/private"));
    assert!(
        !chmod && output.contains("Operation not permitted"),
        "{output}"
    );
    let (created, output) = as_nobody(&format!(
        "echo mine > {mount_point}/public/mine && stat -c '%U %a' {mount_point}/public/mine"
    ));
    assert!(created, "{output}");
    assert!(output.starts_with("nobody "), "{output}");
    let pid = setup.server_pid();
    setup.ok(&["umount", mount_point]);
    wait_gone(pid, Duration::from_secs(10));

    setup.ok(&["mount", "shared", mount_point, "-o", "ro"]);
    assert_eq!(
        std::fs::read(mounted.join("public/mine")).unwrap(),
        b"mine\n"
    );
    let refused = std::fs::write(mounted.join("new"), b"x").unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::EROFS));
    let pid = setup.server_pid();
    setup.ok(&["umount", mount_point]);
    wait_gone(pid, Duration::from_secs(10));
}

/// The face's journals, oldest first.
fn journals(setup: &Setup) -> Vec<PathBuf> {
    let meta = setup.repository.join("fs/meta");
    let mut journals: Vec<PathBuf> = std::fs::read_dir(&meta)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            path.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("journal-")
        })
        .collect();
    journals.sort();
    journals
}

fn face_report(output: &Output) -> Value {
    let report: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
        panic!(
            "{error}: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    });
    report["faces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|face| face["face"] == "fs")
        .unwrap()
        .clone()
}

/// Goal: a damaged durable journal record is never replayed as data: mounting refuses with
/// a message naming the journal, `onecopy check` names the damage (file and offset, exit
/// status 1), `onecopy check --repair` salvages the rest and lists exactly what was lost
/// (file system, path, byte range; exit 3), the file system mounts again, the lost bytes
/// read EIO while every other file reads back whole, the next check reports the recorded
/// loss (exit 3), and rewriting the bytes ends it (exit 0). Method: fsync'd writes of five
/// files, kill -9 (so the journal holds them), a flipped byte in the payload of the record
/// that wrote file f2 (found by its tag), then the commands as a user runs them.
#[test]
fn damaged_journal_is_salvaged_by_check_repair() {
    let setup = Setup::new();
    setup.ok(&["fs", "create", "damaged"]);
    setup.mount("damaged");
    let mounted = setup.mount_point.canonicalize().unwrap();
    let content = |index: u8| vec![index + 1; 10_000];
    for index in 0..5u8 {
        let file = std::fs::File::create(mounted.join(format!("f{index}"))).unwrap();
        file.write_all_at(&content(index), 0).unwrap();
        file.sync_all().unwrap();
    }
    let pid = setup.server_pid();
    // SAFETY: kill sends a signal.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    wait_gone(pid, Duration::from_secs(10));
    assert!(Command::new("fusermount3")
        .arg("-u")
        .arg(&mounted)
        .status()
        .unwrap()
        .success());

    // The record that wrote f2: a Data tag naming its inode and bytes 0..10000.
    let storage = onecopy_core::storage::LocalStorage::open(setup.repository.join("fs")).unwrap();
    let journal = journals(&setup).pop().unwrap();
    let generation = u64::from_str_radix(
        journal
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .trim_start_matches("journal-"),
        16,
    )
    .unwrap();
    let scan = onecopy_core::journal::Journal::scan(&storage, "meta", generation).unwrap();
    let data_records: Vec<_> = scan
        .records
        .iter()
        .filter(|record| {
            matches!(
                onecopy_fs::summary::RecordSummary::of_tag(&record.tag),
                onecopy_fs::summary::RecordSummary::Data {
                    start: 0,
                    end: 10_000,
                    ..
                }
            )
        })
        .collect();
    assert_eq!(data_records.len(), 5, "one write record per file");
    let victim = data_records[2].offset;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&journal)
        .unwrap();
    let mut byte = [0u8; 1];
    file.read_exact_at(&mut byte, victim + 32 + 20).unwrap();
    byte[0] ^= 0x40;
    file.write_all_at(&byte, victim + 32 + 20).unwrap();
    drop(file);

    let refused = setup.run(&["mount", "damaged", mounted.to_str().unwrap()]);
    assert!(!refused.status.success());
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(
        message.contains("journal") && message.contains("check --repair"),
        "{message}"
    );
    let check = setup.run(&["check", "--json"]);
    assert_eq!(check.status.code(), Some(1));
    let face = face_report(&check);
    let name = journal.file_name().unwrap().to_str().unwrap();
    assert_eq!(face["findings"][0]["kind"], "damage", "{face}");
    assert!(
        face["findings"][0]["object"]
            .as_str()
            .unwrap()
            .ends_with(&format!("{name} at byte {victim}")),
        "{face}"
    );
    assert!(
        face["findings"][0]["detail"]
            .as_str()
            .unwrap()
            .contains("/f2 (inode"),
        "what the record changed is named: {face}"
    );

    let repair = setup.run(&["check", "--repair", "--json"]);
    assert_eq!(
        repair.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&repair.stdout)
    );
    let face = face_report(&repair);
    let lost: Vec<&str> = face["findings"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|finding| finding["lost"].as_array().unwrap())
        .map(|lost| lost.as_str().unwrap())
        .collect();
    assert_eq!(lost.len(), 1, "{face}");
    assert!(
        lost[0].starts_with("fs damaged: /f2 (inode") && lost[0].ends_with("bytes 0..10000"),
        "{face}"
    );

    setup.mount("damaged");
    for index in [0u8, 1, 3, 4] {
        assert_eq!(
            std::fs::read(mounted.join(format!("f{index}"))).unwrap(),
            content(index)
        );
    }
    let unreadable = std::fs::read(mounted.join("f2")).unwrap_err();
    assert_eq!(unreadable.raw_os_error(), Some(libc::EIO));
    let check = setup.run(&["check", "--json"]);
    assert_eq!(check.status.code(), Some(3), "the recorded loss");
    assert_eq!(face_report(&check)["findings"][0]["kind"], "lost");
    std::fs::write(mounted.join("f2"), b"rewritten").unwrap();
    assert_eq!(std::fs::read(mounted.join("f2")).unwrap(), b"rewritten");
    setup.ok(&["check"]);
    setup.ok(&["umount", mounted.to_str().unwrap()]);
}

/// Mounts a tmpfs of `size` at `path` (root only).
fn mount_tmpfs(path: &Path, size: &str) {
    let status = Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            &format!("size={size},mode=0700"),
            "tmpfs",
        ])
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success(), "mount -t tmpfs (the test runs as root)");
}

/// Goal: on a full disk writes fail with ENOSPC (not EIO) before they change anything,
/// reads and fsync keep working, the mount stays up, and writes resume once there is room,
/// without a remount; everything written reads back after a clean unmount and the check is
/// clean. Method: the repository on a 64 MiB tmpfs; 1 MiB writes until ENOSPC; then the
/// tmpfs grows (`mount -o remount,size=`), and writing goes on.
#[test]
fn full_disk_refuses_writes_with_enospc_until_there_is_room() {
    assert!(
        unsafe { libc::geteuid() } == 0,
        "this test mounts a tmpfs and must run as root"
    );
    require_fuse();
    let base = tempfile::tempdir().unwrap();
    let disk = base.path().join("disk");
    std::fs::create_dir(&disk).unwrap();
    mount_tmpfs(&disk, "64m");
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(disk.clone());
    let mount_point = base.path().join("mnt");
    std::fs::create_dir(&mount_point).unwrap();
    let setup = Setup {
        _base: tempfile::tempdir().unwrap(),
        repository: disk.join("repository"),
        mount_point: mount_point.clone(),
    };
    setup.ok(&["init"]);
    setup.ok(&["fs", "create", "full", "--idle", "0"]);
    setup.mount("full");
    let mounted = mount_point.canonicalize().unwrap();
    let megabyte = |index: usize| -> Vec<u8> {
        (0..1 << 20)
            .map(|i: usize| ((i / 7) ^ (index * 131)) as u8 | 1)
            .collect()
    };
    std::fs::write(mounted.join("keep"), megabyte(1000)).unwrap();
    let mut file = std::fs::File::create(mounted.join("fill")).unwrap();
    let mut written = 0;
    let refused = loop {
        match file.write_all(&megabyte(written)) {
            Ok(()) => written += 1,
            Err(error) => break error,
        }
        assert!(written < 64, "the disk never filled");
    };
    assert_eq!(refused.raw_os_error(), Some(libc::ENOSPC), "{refused}");
    assert!(written >= 8, "{written} MiB before the disk filled");
    // Refused again, reads and fsync work, the mount answers commands.
    let again = std::fs::write(mounted.join("new"), megabyte(7)).unwrap_err();
    assert_eq!(again.raw_os_error(), Some(libc::ENOSPC));
    file.sync_all().unwrap();
    assert_eq!(std::fs::read(mounted.join("keep")).unwrap(), megabyte(1000));
    let stats = setup.json(&["fs", "stats", "full", "--json"]);
    assert_eq!(stats["face"]["space"]["writes_refused"], true, "{stats}");

    let grown = Command::new("mount")
        .args(["-o", "remount,size=256m"])
        .arg(&disk)
        .status()
        .unwrap();
    assert!(grown.success());
    std::thread::sleep(Duration::from_millis(300));
    file.write_all(&megabyte(written)).unwrap();
    written += 1;
    file.sync_all().unwrap();
    drop(file);
    std::fs::write(mounted.join("new"), megabyte(7)).unwrap();
    let pid = setup.server_pid();
    setup.ok(&["umount", mounted.to_str().unwrap()]);
    wait_gone(pid, Duration::from_secs(10));
    setup.mount("full");
    let fill = std::fs::read(mounted.join("fill")).unwrap();
    assert_eq!(fill.len(), written << 20);
    for index in 0..written {
        assert!(fill[index << 20..(index + 1) << 20] == megabyte(index));
    }
    assert_eq!(std::fs::read(mounted.join("new")).unwrap(), megabyte(7));
    setup.ok(&["umount", mounted.to_str().unwrap()]);
    setup.ok(&["check"]);
}

/// Goal: with the kernel's writeback cache on, what fsync acknowledged survives kill -9 of
/// the mounting process. Method: a mount with `-o writeback_cache`; writes, fsync, more
/// writes without fsync, kill -9, mount again and read.
#[test]
fn writeback_cache_fsync_survives_kill_9() {
    let setup = Setup::new();
    setup.ok(&["fs", "create", "cached"]);
    let mounted = setup.mount_point.canonicalize().unwrap();
    setup.ok(&[
        "mount",
        "cached",
        mounted.to_str().unwrap(),
        "-o",
        "writeback_cache",
    ]);
    let synced: Vec<u8> = (0..3_000_000u32).map(|i| (i * 11 % 239) as u8).collect();
    let file = std::fs::File::create(mounted.join("synced")).unwrap();
    for (index, piece) in synced.chunks(4096).enumerate() {
        file.write_all_at(piece, index as u64 * 4096).unwrap();
    }
    file.sync_all().unwrap();
    file.write_all_at(b"not synced", 0).unwrap();
    let pid = setup.server_pid();
    // SAFETY: kill sends a signal.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    wait_gone(pid, Duration::from_secs(10));
    drop(file);
    assert!(Command::new("fusermount3")
        .arg("-u")
        .arg(&mounted)
        .status()
        .unwrap()
        .success());
    setup.ok(&[
        "mount",
        "cached",
        mounted.to_str().unwrap(),
        "-o",
        "writeback_cache",
    ]);
    let read = std::fs::read(mounted.join("synced")).unwrap();
    assert_eq!(read.len(), synced.len());
    assert!(read[10..] == synced[10..], "the fsync'd data survived");
    setup.ok(&["umount", mounted.to_str().unwrap()]);
}

/// Mount points under the test's directory, created, canonical.
fn mount_points(setup: &Setup, names: &[&str]) -> Vec<PathBuf> {
    names
        .iter()
        .map(|name| {
            let path = setup._base.path().join(name);
            std::fs::create_dir_all(&path).unwrap();
            path.canonicalize().unwrap()
        })
        .collect()
}

/// The mount point `fs list --json` gives for file system `name`.
fn listed_mount_point(setup: &Setup, name: &str) -> Value {
    let list = setup.json(&["fs", "list", "--json"]);
    list.as_array()
        .unwrap()
        .iter()
        .find(|record| record["name"] == name)
        .unwrap_or_else(|| panic!("{name} listed: {list}"))["mount_point"]
        .clone()
}

/// Goal: several file systems of one repository are mounted at once, one process serving
/// them all: each reads and writes on its own, the `fs` commands answer for each, a file
/// system is mounted only once, each mount ends on its own (`onecopy umount`, `fusermount3
/// -u`, SIGTERM to a `mount --foreground` of it) with what it wrote durable while the others
/// go on, the idle deduplicator works on the file system whose `--idle` calls for it, kill -9
/// loses nothing fsync'd on any of them, and SIGTERM to the server ends every mount. Method:
/// the binary; mounts, commands and signals as users give them.
#[test]
fn several_file_systems_mounted_at_once() {
    let setup = Setup::new();
    setup.ok(&["fs", "create", "a", "--idle", "0"]);
    let quick = [
        "--idle",
        "1",
        "--min-evaluation-interval",
        "0",
        "--min-evaluation-count",
        "0",
    ];
    setup.ok(&[&["fs", "create", "b"][..], &quick[..]].concat());
    setup.ok(&["fs", "create", "c"]);
    let points = mount_points(&setup, &["a", "b", "c", "again"]);
    let (a, b, c) = (&points[0], &points[1], &points[2]);
    setup.ok(&["mount", "a", a.to_str().unwrap()]);
    let server = setup.server_pid();
    let delegated = setup.ok(&["mount", "b", b.to_str().unwrap()]);
    assert!(
        delegated.contains(&format!("(pid {server};")),
        "the holder serves the second mount: {delegated}"
    );
    assert!(is_mounted(a) && is_mounted(b));

    let content_a: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
    let content_b: Vec<u8> = (0..2_000_000u32).map(|i| (i / 4096) as u8).collect();
    std::fs::write(a.join("file"), &content_a).unwrap();
    std::fs::write(b.join("file"), &content_b).unwrap();
    std::fs::write(b.join("copy"), &content_b).unwrap();
    assert!(std::fs::read(a.join("file")).unwrap() == content_a);
    assert!(std::fs::read(b.join("file")).unwrap() == content_b);
    assert!(
        !a.join("copy").exists(),
        "each mount shows its own file system"
    );
    assert_eq!(listed_mount_point(&setup, "a"), a.to_str().unwrap());
    assert_eq!(listed_mount_point(&setup, "b"), b.to_str().unwrap());
    assert_eq!(listed_mount_point(&setup, "c"), Value::Null);
    assert_eq!(setup.json(&["fs", "stats", "a", "--json"])["files"], 1);
    assert_eq!(setup.json(&["fs", "stats", "b", "--json"])["files"], 2);
    assert_eq!(
        setup
            .json(&["fs", "ranks", "b", "--json"])
            .as_array()
            .unwrap()
            .len(),
        2
    );
    setup.ok(&["fs", "config", "a", "--big-chunk", "128KiB"]);
    let plan = setup.json(&["fs", "dedup", "a", "--dry-run", "--json"]);
    assert_eq!(plan["plan"]["file_system"], "a", "{plan}");

    // A file system is mounted once; a mounted one is not deleted.
    let again = setup.run(&["mount", "b", points[3].to_str().unwrap()]);
    assert!(!again.status.success());
    let message = String::from_utf8_lossy(&again.stderr);
    assert!(message.contains("is mounted at"), "{message}");
    assert!(!is_mounted(&points[3]));
    let refused = setup.run(&["fs", "delete", "b"]);
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("unmount it first"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );

    // The idle deduplicator deduplicates b (idle 1 s) and leaves a (idle 0) plain.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let stats = setup.json(&["fs", "stats", "b", "--json"]);
        if stats["pending_bytes"] == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "b not deduplicated: {stats}");
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(
        setup.json(&["fs", "stats", "a", "--json"])["pending_bytes"],
        content_a.len() as u64
    );

    // `onecopy umount` ends one mount; the process serves the others on, and what the ended
    // one wrote is durable: after a kill -9 now, a mounts again with it.
    setup.ok(&["umount", a.to_str().unwrap()]);
    assert!(!is_mounted(a));
    assert!(alive(server));
    assert!(std::fs::read(b.join("copy")).unwrap() == content_b);
    setup.ok(&["mount", "c", c.to_str().unwrap()]);
    std::fs::write(c.join("synced"), b"synced").unwrap();
    std::fs::File::open(c.join("synced"))
        .unwrap()
        .sync_all()
        .unwrap();
    // SAFETY: kill sends a signal.
    assert_eq!(unsafe { libc::kill(server, libc::SIGKILL) }, 0);
    wait_gone(server, Duration::from_secs(10));
    for dead in [b, c] {
        assert!(Command::new("fusermount3")
            .arg("-u")
            .arg(dead)
            .status()
            .unwrap()
            .success());
    }
    setup.ok(&["mount", "c", c.to_str().unwrap()]);
    let server = setup.server_pid();
    setup.ok(&["mount", "a", a.to_str().unwrap()]);
    setup.ok(&["mount", "b", b.to_str().unwrap()]);
    assert!(std::fs::read(a.join("file")).unwrap() == content_a);
    assert!(std::fs::read(b.join("copy")).unwrap() == content_b);
    assert_eq!(std::fs::read(c.join("synced")).unwrap(), b"synced");

    // fusermount3 -u ends one mount the same way.
    assert!(Command::new("fusermount3")
        .arg("-u")
        .arg(c)
        .status()
        .unwrap()
        .success());
    let deadline = Instant::now() + Duration::from_secs(10);
    while listed_mount_point(&setup, "c") != Value::Null {
        assert!(Instant::now() < deadline, "c still listed as mounted");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(std::fs::read(a.join("file")).unwrap() == content_a);

    // `mount --foreground` of a file system another process serves lives as long as the
    // mount, and SIGTERM to it unmounts that mount alone.
    let mut follower = Command::new(env!("CARGO_BIN_EXE_onecopy"))
        .arg("--repo")
        .arg(&setup.repository)
        .args(["mount", "c", c.to_str().unwrap(), "--foreground"])
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !is_mounted(c) {
        assert!(Instant::now() < deadline, "c not mounted in the foreground");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(std::fs::read(c.join("synced")).unwrap(), b"synced");
    // SAFETY: kill sends a signal.
    assert_eq!(
        unsafe { libc::kill(follower.id() as i32, libc::SIGTERM) },
        0
    );
    assert!(follower.wait().unwrap().success());
    assert!(!is_mounted(c));
    assert!(is_mounted(a) && is_mounted(b) && alive(server));

    // SIGTERM to the serving process ends every mount, cleanly.
    // SAFETY: kill sends a signal.
    assert_eq!(unsafe { libc::kill(server, libc::SIGTERM) }, 0);
    wait_gone(server, Duration::from_secs(10));
    assert!(!is_mounted(a) && !is_mounted(b));
    setup.ok(&["check", "--read-data"]);
}
