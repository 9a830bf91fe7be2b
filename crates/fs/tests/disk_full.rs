//! A full disk: requests that add data get ENOSPC before they change anything, reads and
//! fsync go on, writes resume when room comes back, and acknowledged writes still become
//! durable (the reserve). Engine-level, on the simulated storage with a capacity;
//! crates/cli/tests/fs_cli.rs has the same through a mount on a small tmpfs.

use std::sync::Arc;
use std::time::Duration;

use onecopy_core::check::CheckOptions;
use onecopy_core::storage::{CrashMode, SimulatedStorage, Storage};
use onecopy_fs::engine::{Caller, NewNode};
use onecopy_fs::node::{Kind, ROOT};
use onecopy_fs::{FsEngine, FsId, FsOptions, OpenMode, RuntimeOptions};

const MIB: usize = 1 << 20;
const ROOT_CALLER: Caller = Caller { uid: 0, gid: 0 };

fn pattern(seed: u64, length: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..length)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state as u8) | 1
        })
        .collect()
}

fn open(storage: &SimulatedStorage) -> Arc<FsEngine> {
    let runtime = RuntimeOptions {
        checkpoint_journal_bytes: 1 << 20,
        ..RuntimeOptions::default()
    };
    FsEngine::open(
        Arc::new(storage.clone()) as Arc<dyn Storage>,
        runtime,
        OpenMode::ReadWrite,
    )
    .unwrap()
}

fn create(engine: &FsEngine, fs: FsId, name: &str) -> u64 {
    let node = NewNode {
        kind: Kind::File,
        mode: 0o600,
        rdev: 0,
        target: Vec::new(),
    };
    engine
        .create_node(fs, ROOT, name.as_bytes(), node, ROOT_CALLER)
        .unwrap()
        .ino
}

fn read_all(engine: &FsEngine, fs: FsId, ino: u64) -> Vec<u8> {
    let size = engine.getattr(fs, ino).unwrap().attributes.size;
    let mut out = Vec::new();
    while (out.len() as u64) < size {
        out.extend(engine.read(fs, ino, out.len() as u64, MIB as u32).unwrap());
    }
    out
}

/// Goal: at the capacity, writes fail with ENOSPC and change nothing; reads, fsync, and the
/// requests that free space keep working; removing a file and compacting (which copies
/// nothing on the full disk) frees room and writes resume without a reopen; after a crash everything fsync'd reads back and the check
/// is clean. Method: 1 MiB writes until one is refused, then the checks.
#[test]
fn full_disk_refuses_writes_then_resumes() {
    let storage = SimulatedStorage::new();
    storage.set_capacity(Some(96 * MIB as u64));
    let engine = open(&storage);
    let fs = engine
        .create_file_system("full", FsOptions::default(), ROOT_CALLER)
        .unwrap();
    let keep = create(&engine, fs, "keep");
    engine.write(fs, keep, 0, &pattern(1000, 4 * MIB)).unwrap();
    let scratch = create(&engine, fs, "scratch");
    let mut written = 0;
    let refused = loop {
        match engine.write(
            fs,
            scratch,
            (written * MIB) as u64,
            &pattern(written as u64, MIB),
        ) {
            Ok(_) => written += 1,
            Err(error) => break error,
        }
        assert!(written < 96, "the disk never filled");
    };
    assert_eq!(refused.errno(), libc::ENOSPC, "{refused}");
    assert!(written > 20, "{written} MiB before the disk filled");
    let stats = engine.stats(fs).unwrap();
    assert!(stats.face.space.writes_refused, "{stats:?}");
    // Refused writes and creates changed nothing; reads and fsync work.
    let again = engine.write(fs, keep, (4 * MIB) as u64, &pattern(7, MIB));
    assert_eq!(again.unwrap_err().errno(), libc::ENOSPC);
    assert_eq!(
        engine.getattr(fs, keep).unwrap().attributes.size,
        (4 * MIB) as u64
    );
    let node = NewNode {
        kind: Kind::File,
        mode: 0o600,
        rdev: 0,
        target: Vec::new(),
    };
    let create_refused = engine.create_node(fs, ROOT, b"new", node, ROOT_CALLER);
    assert_eq!(create_refused.unwrap_err().errno(), libc::ENOSPC);
    assert!(engine.lookup(fs, ROOT, b"new").is_err());
    assert_eq!(read_all(&engine, fs, keep), pattern(1000, 4 * MIB));
    engine.flush().unwrap();

    // Removing a file and compacting gives the room back; writes resume.
    // On the full disk a compaction copies nothing: it retires what holds no live chunk.
    engine.remove(fs, ROOT, b"scratch", false).unwrap();
    let (plan, report) = engine.compact(false).unwrap();
    assert_eq!(plan.copy_bytes, 0, "{plan:?}");
    assert!(report.unwrap().containers_retired > 0, "{plan:?}");
    std::thread::sleep(Duration::from_millis(150));
    engine
        .write(fs, keep, (4 * MIB) as u64, &pattern(7, MIB))
        .unwrap();
    engine.flush().unwrap();
    drop(engine);

    let engine = open(&storage.crash(CrashMode::Clean));
    let mut expected = pattern(1000, 4 * MIB);
    expected.extend(pattern(7, MIB));
    assert_eq!(read_all(&engine, fs, keep), expected);
    assert!(engine.check(CheckOptions::default()).unwrap().is_clean());
}

/// Goal: when another program fills the disk under the engine (a write it admitted is still
/// buffered), fsync still makes it durable by releasing the reserve; later writes get ENOSPC
/// until room comes back, then resume, and the reserve is taken back. Method: shrink the
/// capacity to what is used between a write and its fsync.
#[test]
fn reserve_lets_an_fsync_through_a_full_disk() {
    let storage = SimulatedStorage::new();
    storage.set_capacity(Some(256 * MIB as u64));
    let engine = open(&storage);
    let fs = engine
        .create_file_system("reserve", FsOptions::default(), ROOT_CALLER)
        .unwrap();
    let ino = create(&engine, fs, "file");
    let data = pattern(5, 4 * MIB + 256 * 1024);
    engine.write(fs, ino, 0, &data[..4 * MIB]).unwrap();
    engine.flush().unwrap();
    assert!(engine.stats(fs).unwrap().face.space.reserve_held);
    // A write small enough to stay in the container buffer, then another program takes
    // every free byte.
    engine
        .write(fs, ino, (4 * MIB) as u64, &data[4 * MIB..])
        .unwrap();
    let used = 256 * MIB as u64 - storage.available_bytes().unwrap().unwrap();
    storage.set_capacity(Some(used));
    engine
        .flush()
        .expect("the reserve makes room for the fsync");
    assert!(!engine.stats(fs).unwrap().face.space.reserve_held);
    std::thread::sleep(Duration::from_millis(150));
    let refused = engine.write(fs, ino, data.len() as u64, &data[..MIB]);
    assert_eq!(refused.unwrap_err().errno(), libc::ENOSPC);
    assert_eq!(read_all(&engine, fs, ino), data);
    // The machine restarts with some room (a writable open checkpoints).
    let rebooted = storage.crash(CrashMode::Clean);
    rebooted.set_capacity(Some(used + 64 * MIB as u64));
    let after_crash = open(&rebooted);
    assert_eq!(
        read_all(&after_crash, fs, ino),
        data,
        "the fsync'd writes are durable"
    );
    drop(after_crash);

    storage.set_capacity(Some(used + 128 * MIB as u64));
    std::thread::sleep(Duration::from_millis(150));
    engine
        .write(fs, ino, data.len() as u64, &data[..MIB])
        .unwrap();
    engine.flush().unwrap();
    assert!(
        engine.stats(fs).unwrap().face.space.reserve_held,
        "the reserve is taken back"
    );
}
