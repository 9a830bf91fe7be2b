//! A full disk: writes get ENOSPC before they change anything, reads go on, writes resume
//! when room comes back, acknowledged writes still become durable (the reserve), and
//! deleting a volume frees its space. Engine-level, on the simulated storage with a capacity;
//! crates/cli/tests has the same over NBD on a small tmpfs.

use std::sync::Arc;
use std::time::Duration;

use onecopy_block::{Engine, HintSettings, OpenMode, RuntimeOptions};
use onecopy_core::check::CheckOptions;
use onecopy_core::storage::{CrashMode, SimulatedStorage, Storage};

const MIB: usize = 1 << 20;

fn runtime() -> RuntimeOptions {
    RuntimeOptions {
        content_cache_bytes: 0,
        checkpoint_journal_bytes: 1 << 20,
        checkpoint_dirty_pages: 256,
        ..RuntimeOptions::default()
    }
}

fn open(storage: &SimulatedStorage) -> Arc<Engine> {
    Engine::open_with(
        Arc::new(storage.clone()) as Arc<dyn Storage>,
        None,
        runtime(),
        OpenMode::ReadWrite,
    )
    .unwrap()
}

fn pattern(seed: u64, length: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..length)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// Writes unique MiBs to `volume` from `first` until a write is refused; returns how many
/// were accepted.
fn fill(engine: &Engine, volume: u32, first: usize, limit: usize) -> usize {
    for index in first..limit {
        match engine.write(
            volume,
            (index * MIB) as u64,
            &pattern(index as u64, MIB),
            false,
        ) {
            Ok(()) => {}
            Err(error) => {
                assert!(error.is_full(), "a full disk is ENOSPC, not: {error}");
                return index - first;
            }
        }
    }
    panic!("the disk never filled");
}

/// Goal: at the capacity, writes fail with ENOSPC and change nothing; reads of both volumes
/// keep working; a FLUSH makes every accepted write durable; deleting a volume frees its
/// containers and writes resume without a restart; after a crash everything flushed reads
/// back and the check is clean.
#[test]
fn full_disk_refuses_writes_then_resumes() {
    let storage = SimulatedStorage::new();
    storage.set_capacity(Some(160 * MIB as u64));
    let engine = open(&storage);
    let keep = engine
        .create_volume("keep", 256 * MIB as u64, 4096, HintSettings::none())
        .unwrap()
        .id;
    let scratch = engine
        .create_volume("scratch", 256 * MIB as u64, 4096, HintSettings::none())
        .unwrap()
        .id;
    engine
        .write(keep, 0, &pattern(1000, 4 * MIB), false)
        .unwrap();
    let scratch_written = fill(&engine, scratch, 0, 256);
    assert!(
        scratch_written > 20,
        "{scratch_written} MiB before the disk filled"
    );
    assert!(engine.stats().space.writes_refused);
    // Refused writes changed nothing, reads work, FLUSH works.
    assert!(engine
        .write(keep, 4 * MIB as u64, &pattern(7, MIB), false)
        .unwrap_err()
        .is_full());
    let mut read = vec![0u8; 4 * MIB];
    engine.read(keep, 0, &mut read).unwrap();
    assert_eq!(read, pattern(1000, 4 * MIB));
    engine.read(keep, 4 * MIB as u64, &mut read[..MIB]).unwrap();
    assert!(read[..MIB].iter().all(|&byte| byte == 0));
    engine.flush().unwrap();

    let deletion = engine.delete_volume("scratch").unwrap();
    assert!(
        deletion.freed_bytes >= (scratch_written as u64 - 8) * MIB as u64,
        "{deletion:?} after {scratch_written} MiB"
    );
    std::thread::sleep(Duration::from_millis(150));
    engine
        .write(keep, 4 * MIB as u64, &pattern(7, MIB), false)
        .unwrap();
    engine.flush().unwrap();
    drop(engine);

    let engine = open(&storage.crash(CrashMode::Clean));
    let mut read = vec![0u8; 5 * MIB];
    engine.read(keep, 0, &mut read).unwrap();
    assert_eq!(&read[..4 * MIB], &pattern(1000, 4 * MIB)[..]);
    assert_eq!(&read[4 * MIB..], &pattern(7, MIB)[..]);
    assert!(engine.check(CheckOptions::default()).unwrap().is_clean());
}

/// Goal: when another program fills the disk under the engine (the writes it accepted are
/// queued in memory), the FLUSH still makes them durable, by releasing the reserve; new
/// writes get ENOSPC until room comes back, then resume.
#[test]
fn reserve_lets_a_flush_through_a_full_disk() {
    let storage = SimulatedStorage::new();
    storage.set_capacity(Some(256 * MIB as u64));
    let engine = open(&storage);
    assert!(engine.stats().space.reserve_held);
    let volume = engine
        .create_volume("disk", 64 * MIB as u64, 4096, HintSettings::none())
        .unwrap()
        .id;
    let data = pattern(5, 8 * MIB);
    engine.write(volume, 0, &data[..4 * MIB], false).unwrap();
    engine.flush().unwrap();
    // Another program takes all the room but a little: less than the data written next.
    let used = 256 * MIB as u64 - storage.available_bytes().unwrap().unwrap();
    storage.set_capacity(Some(used + 2 * MIB as u64));
    engine
        .write(volume, 4 * MIB as u64, &data[4 * MIB..], false)
        .unwrap();
    engine
        .flush()
        .expect("the reserve makes room for the flush");
    assert!(!engine.stats().space.reserve_held);
    std::thread::sleep(Duration::from_millis(150));
    let refused = engine
        .write(volume, 8 * MIB as u64, &data[..MIB], false)
        .unwrap_err();
    assert!(refused.is_full(), "{refused}");
    let mut read = vec![0u8; 8 * MIB];
    engine.read(volume, 0, &mut read).unwrap();
    assert_eq!(read, data);
    let after_crash = open(&storage.crash(CrashMode::Clean));
    after_crash.read(volume, 0, &mut read).unwrap();
    assert_eq!(read, data, "the flushed writes are durable");
    drop(after_crash);

    storage.set_capacity(Some(used + 128 * MIB as u64));
    std::thread::sleep(Duration::from_millis(150));
    engine
        .write(volume, 8 * MIB as u64, &data[..MIB], false)
        .unwrap();
    engine.flush().unwrap();
    assert!(
        engine.stats().space.reserve_held,
        "the reserve is taken back"
    );
}

/// Goal: duplicates (derived data) give their room back when the disk fills: the engine
/// drops them and removes their files when it starts refusing writes, every block still
/// reads back, and a round on the full disk writes nothing. Method: 4 MiB read on two days
/// and duplicated into ten regions, then another volume written until ENOSPC.
#[test]
fn duplicates_give_their_room_back_on_a_full_disk() {
    use onecopy_block::replicas::device::DeviceProfile;
    use onecopy_block::replicas::{ReplicaOptions, SCRATCH_DIRECTORY};

    let storage = SimulatedStorage::new();
    storage.set_capacity(Some(160 * MIB as u64));
    let mut runtime = runtime();
    runtime.replicas = ReplicaOptions {
        device_profile: DeviceProfile::Hdd,
        scratch_bytes: 10 * 4 * MIB as u64,
        ..ReplicaOptions::default()
    };
    let engine = Engine::open_with(
        Arc::new(storage.clone()) as Arc<dyn Storage>,
        None,
        runtime,
        OpenMode::ReadWrite,
    )
    .unwrap();
    let keep = engine
        .create_volume("keep", 64 * MIB as u64, 4096, HintSettings::none())
        .unwrap()
        .id;
    let filler = engine
        .create_volume("filler", 256 * MIB as u64, 4096, HintSettings::none())
        .unwrap()
        .id;
    let data = pattern(1000, 4 * MIB);
    engine.write(keep, 0, &data, false).unwrap();
    // Beyond the open container, so the reads go to the files.
    engine
        .write(keep, 8 * MIB as u64, &pattern(1001, 8 * MIB), false)
        .unwrap();
    engine.flush().unwrap();
    let mut read = vec![0u8; 4 * MIB];
    for _day in 0..2 {
        for block in 0..1024u64 {
            engine.read(keep, block * 4096, &mut read[..4096]).unwrap();
        }
        engine.duplicate_popular().unwrap();
    }
    assert!(engine.stats().replicas.duplicates > 0);
    assert!(!storage.list(SCRATCH_DIRECTORY).unwrap().is_empty());

    fill(&engine, filler, 0, 256);
    let stats = engine.stats().replicas;
    assert_eq!(stats.duplicates, 0, "{stats:?}");
    assert!(storage.list(SCRATCH_DIRECTORY).unwrap().is_empty());
    engine.read(keep, 0, &mut read).unwrap();
    assert_eq!(read, data);
    let round = engine.duplicate_popular().unwrap();
    assert!(round.skipped_for_space, "{round:?}");
    assert!(storage.list(SCRATCH_DIRECTORY).unwrap().is_empty());
}
