//! Dynamic replica retrieval and selective duplication (paper 4 §3.3, §3.4) in the engine: a
//! block is read from the copy of its content nearest the modelled head, a copy that is no
//! longer live or holds other bytes is never returned, duplicates of popular content are made
//! within the scratch budget and dropped when their chunk is freed, and a reopen removes them.

use std::sync::Arc;

use onecopy_block::cache::ContentCache;
use onecopy_block::replicas::device::DeviceProfile;
use onecopy_block::replicas::{ReplicaOptions, SCRATCH_DIRECTORY};
use onecopy_block::{BlockConfig, Engine, HintSettings, RuntimeOptions};
use onecopy_core::check::CheckOptions;
use onecopy_core::container::{ContainerOptions, CONTAINER_BYTES_MIN};
use onecopy_core::index::cache::CachePolicy;
use onecopy_core::storage::{SimulatedStorage, Storage};

const BLOCK: usize = 4096;

fn config() -> BlockConfig {
    BlockConfig {
        // The smallest containers (15 blocks), so that chunks leave the open container after a
        // few blocks and are read from files.
        containers: ContainerOptions {
            container_bytes: CONTAINER_BYTES_MIN,
            compression_level: None,
        },
        ..BlockConfig::default()
    }
}

/// The `hdd` profile, a content cache of one block (a block read twice in a row hits it, any
/// other read evicts it: hinted copies get their content key when it is on), and
/// `scratch_bytes` of scratch space in ten regions.
fn runtime(scratch_bytes: u64) -> RuntimeOptions {
    RuntimeOptions {
        content_cache_bytes: ContentCache::memory_bytes_for(1, CachePolicy::Arc),
        // A journal file is created at this capacity, in memory here.
        checkpoint_journal_bytes: 1 << 20,
        replicas: ReplicaOptions {
            device_profile: DeviceProfile::Hdd,
            scratch_bytes,
            duplicate_copies: 10,
            ..ReplicaOptions::default()
        },
        ..RuntimeOptions::default()
    }
}

fn open(storage: &SimulatedStorage, scratch_bytes: u64) -> Arc<Engine> {
    Engine::open(
        Arc::new(storage.clone()) as Arc<dyn Storage>,
        Some(config()),
        runtime(scratch_bytes),
    )
    .unwrap()
}

fn block_of(seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..BLOCK)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

fn read(engine: &Engine, volume: u32, block: u64) -> Vec<u8> {
    let mut out = vec![0u8; BLOCK];
    engine.read(volume, block * BLOCK as u64, &mut out).unwrap();
    out
}

fn write(engine: &Engine, volume: u32, block: u64, data: &[u8]) {
    engine
        .write(volume, block * BLOCK as u64, data, false)
        .unwrap();
}

/// Goal: a block whose content has a second copy (a deferred copy in another volume) is read
/// from the copy nearest the head; once that copy is freed, the planner's choice of it is
/// caught in the chunk table and the own copy is read. Method: the same block written to an
/// inline and a deferring volume, 200 filler blocks apart; the head put beside the deferred
/// copy by reading its neighbour; then the deferred block overwritten and the read repeated.
#[test]
fn reads_the_nearest_live_copy() {
    let storage = SimulatedStorage::new();
    let engine = open(&storage, 0);
    let size = 512 * BLOCK as u64;
    let inline = engine
        .create_volume("inline", size, BLOCK as u32, HintSettings::none())
        .unwrap()
        .id;
    let deferred = engine
        .create_volume(
            "deferred",
            size,
            BLOCK as u32,
            HintSettings {
                deferred_seconds: Some(3600),
                ..HintSettings::none()
            },
        )
        .unwrap()
        .id;
    let shared = block_of(1);
    write(&engine, inline, 0, &shared);
    for block in 1..200 {
        write(&engine, inline, block, &block_of(1000 + block));
    }
    write(&engine, deferred, 0, &shared);
    write(&engine, deferred, 1, &block_of(2));
    for block in 200..260 {
        write(&engine, inline, block, &block_of(1000 + block));
    }
    engine.flush().unwrap();

    // The head beside the deferred copy: the inline block is read from there.
    assert_eq!(read(&engine, deferred, 1), block_of(2));
    assert_eq!(read(&engine, inline, 0), shared);
    let stats = engine.stats().replicas;
    assert_eq!(stats.device_profile, "hdd");
    assert_eq!(stats.redirected_reads, 1, "{stats:?}");
    assert_eq!(stats.fallback_reads, 0);
    // With the head beside the inline copy, it is read in place.
    assert_eq!(read(&engine, inline, 1), block_of(1001));
    assert_eq!(read(&engine, inline, 0), shared);
    assert_eq!(engine.stats().replicas.redirected_reads, 1);

    // The deferred copy is freed by an overwrite; the copy table still lists it.
    write(&engine, deferred, 0, &block_of(3));
    for block in 260..300 {
        write(&engine, inline, block, &block_of(1000 + block));
    }
    engine.flush().unwrap();
    assert_eq!(read(&engine, deferred, 1), block_of(2));
    assert_eq!(read(&engine, inline, 0), shared);
    let stats = engine.stats().replicas;
    assert_eq!(stats.redirected_reads, 1, "{stats:?}");
    assert_eq!(stats.stale_copies, 1, "the freed copy is caught: {stats:?}");
    let report = engine
        .check(CheckOptions {
            repair: false,
            read_data: true,
        })
        .unwrap();
    assert!(report.is_clean(), "{report:#?}");
}

/// Goal: selective duplication copies the popular blocks into every region within the
/// budget, a read far from a block's own copy is served by a duplicate, a duplicate whose
/// bytes are damaged is never returned (the own copy is read and the duplicates dropped), a
/// duplicate of a freed chunk is dropped, and a reopen removes the scratch files. Method: 310
/// blocks, 20 of them read on two days; a round; reads with the head at the far end; one
/// scratch file damaged; the popular blocks overwritten; a reopen.
#[test]
fn duplicates_serve_popular_blocks_and_never_confuse() {
    let storage = SimulatedStorage::new();
    // Room for 16 blocks in each of ten regions.
    let engine = open(&storage, 10 * 16 * BLOCK as u64);
    let volume = engine
        .create_volume(
            "disk",
            512 * BLOCK as u64,
            BLOCK as u32,
            HintSettings::none(),
        )
        .unwrap()
        .id;
    // 310 blocks: the last container, still open, holds blocks past 299.
    for block in 0..310 {
        write(&engine, volume, block, &block_of(block));
    }
    engine.flush().unwrap();
    for day in 0..2 {
        for block in 0..20 {
            assert_eq!(read(&engine, volume, block), block_of(block));
        }
        if day == 0 {
            let first = engine.duplicate_popular().unwrap();
            assert_eq!(first.chosen, 16, "the budget holds 16 a region: {first:?}");
        }
    }
    let report = engine.duplicate_popular().unwrap();
    assert_eq!(report.chosen, 16, "{report:?}");
    assert_eq!(report.duplicated, 16, "{report:?}");
    assert_eq!(report.blocks_written, 160, "{report:?}");
    let files = storage.list(SCRATCH_DIRECTORY).unwrap();
    assert_eq!(files.len(), 10, "one file a region: {files:?}");
    let stats = engine.stats().replicas;
    assert_eq!(stats.duplicates, 160);

    // The head at the far end: a popular block is read from the nearest duplicate.
    assert_eq!(read(&engine, volume, 299), block_of(299));
    let duplicated = (0..20)
        .find(|&block| {
            let before = engine.stats().replicas.duplicate_reads;
            assert_eq!(read(&engine, volume, 299), block_of(299));
            assert_eq!(read(&engine, volume, block), block_of(block));
            engine.stats().replicas.duplicate_reads > before
        })
        .expect("a popular block is read from a duplicate");

    // Damage every scratch file: the next read of a duplicated block finds other bytes,
    // returns the right ones from its own copy, and drops that content's duplicates.
    for name in &files {
        let file = storage.open(name, false).unwrap();
        let length = file.len().unwrap();
        file.write_at(0, &vec![0x5a; length as usize]).unwrap();
    }
    assert_eq!(read(&engine, volume, 299), block_of(299));
    assert_eq!(read(&engine, volume, duplicated), block_of(duplicated));
    let stats = engine.stats().replicas;
    assert_eq!(stats.fallback_reads, 1, "{stats:?}");
    assert_eq!(stats.duplicates, 150, "{stats:?}");

    // Overwriting the popular blocks frees their chunks: their duplicates go at once.
    for block in 0..20 {
        write(&engine, volume, block, &block_of(5000 + block));
    }
    engine.flush().unwrap();
    let stats = engine.stats().replicas;
    assert_eq!(stats.duplicates, 0, "{stats:?}");
    assert_eq!(stats.duplicates_dropped, 160, "{stats:?}");
    assert_eq!(read(&engine, volume, 299), block_of(299));
    for block in 0..20 {
        assert_eq!(read(&engine, volume, block), block_of(5000 + block));
    }

    // A reopen trusts no duplicate: the files are removed.
    engine.shutdown().unwrap();
    drop(engine);
    let engine = open(&storage, 10 * 16 * BLOCK as u64);
    assert!(storage.list(SCRATCH_DIRECTORY).unwrap().is_empty());
    assert_eq!(engine.stats().replicas.duplicates, 0);
    for block in 0..310 {
        let want = if block < 20 { 5000 + block } else { block };
        assert_eq!(read(&engine, volume, block), block_of(want));
    }
}

/// Goal: selective duplication runs by itself in idle time once its interval has passed.
/// Method: popular reads, then the background thread with an interval of zero and a short
/// idle threshold, polled until a round has run.
#[test]
fn idle_time_runs_a_duplication_round() {
    let storage = SimulatedStorage::new();
    let mut runtime = runtime(10 * 16 * BLOCK as u64);
    runtime.idle_milliseconds = 100;
    runtime.replicas.duplication_interval_seconds = 0;
    let engine = Engine::open(
        Arc::new(storage.clone()) as Arc<dyn Storage>,
        Some(config()),
        runtime,
    )
    .unwrap();
    let volume = engine
        .create_volume(
            "disk",
            64 * BLOCK as u64,
            BLOCK as u32,
            HintSettings::none(),
        )
        .unwrap()
        .id;
    for block in 0..40 {
        write(&engine, volume, block, &block_of(block));
    }
    engine.flush().unwrap();
    for block in 0..8 {
        assert_eq!(read(&engine, volume, block), block_of(block));
    }
    let background = engine.start_background();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while engine.stats().replicas.duplication_rounds == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "a round runs in idle time"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    drop(background);
    assert!(engine.stats().replicas.duplicates > 0);
}
