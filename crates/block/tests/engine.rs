//! Engine tests through the public API: data round trips, deduplication across volumes,
//! partial writes, unmapping, reopening, and crash recovery against a reference model.

use std::sync::Arc;

use onecopy_block::{BlockConfig, Engine, HintSettings, RuntimeOptions, WriteRequest};
use onecopy_core::container::{ContainerOptions, CONTAINER_BYTES_MIN};
use onecopy_core::storage::{CrashMode, SimulatedStorage, Storage};

const BLOCK: usize = 4096;

fn runtime() -> RuntimeOptions {
    RuntimeOptions {
        content_cache_bytes: 1 << 20,
        // Small limits so that checkpoints happen in the middle of the tests.
        checkpoint_journal_bytes: 64 << 10,
        checkpoint_dirty_pages: 64,
        ..RuntimeOptions::default()
    }
}

fn open(storage: &SimulatedStorage) -> onecopy_block::Result<Arc<Engine>> {
    Engine::open(
        Arc::new(storage.clone()) as Arc<dyn Storage>,
        None,
        runtime(),
    )
}

/// Deterministic block contents: `seed` picks one of a few patterns so duplicates occur.
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

fn read_all(engine: &Engine, volume: u32, size: usize) -> Vec<u8> {
    let mut out = vec![0u8; size];
    engine.read(volume, 0, &mut out).unwrap();
    out
}

/// Goal: a batch of writes (whole, partial, duplicate, overlapping, all-zero, and one out of
/// range in the middle) leaves the volume as the same writes one by one do, with one result
/// per write. Method: two volumes of one engine, one written by batches, one serially.
#[test]
fn write_batch_equals_serial_writes() {
    let storage = SimulatedStorage::new();
    let engine = open(&storage).unwrap();
    let size = 256 * BLOCK;
    let batched = engine
        .create_volume("batched", size as u64, 4096, HintSettings::default())
        .unwrap()
        .id;
    let serial = engine
        .create_volume("serial", size as u64, 4096, HintSettings::default())
        .unwrap()
        .id;
    let mut state = 11u64;
    for round in 0..20u64 {
        let mut owned = Vec::new();
        for index in 0..12u64 {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let blocks = 1 + (state >> 60) as usize % 3;
            let offset = ((state >> 20) as usize % (size / BLOCK - 4)) * BLOCK
                + if index % 5 == 0 { 512 } else { 0 };
            let data = match index % 4 {
                0 => vec![0; blocks * BLOCK],
                1 => pattern(state % 3, blocks * BLOCK),
                _ => pattern(state, blocks * BLOCK - if index % 5 == 0 { 512 } else { 0 }),
            };
            owned.push((offset as u64, data));
        }
        // One write past the end: it alone fails.
        owned.insert(6, (size as u64 - 2048, vec![7; BLOCK]));
        let writes: Vec<WriteRequest<'_>> = owned
            .iter()
            .map(|(offset, data)| WriteRequest {
                offset: *offset,
                data,
                fua: round % 7 == 0,
            })
            .collect();
        let mut results = Vec::new();
        engine.write_batch(batched, &writes, &mut results);
        assert_eq!(results.len(), writes.len());
        for (index, (write, result)) in writes.iter().zip(&results).enumerate() {
            let expected = engine.write(serial, write.offset, write.data, write.fua);
            assert_eq!(
                result.is_ok(),
                expected.is_ok(),
                "round {round} write {index}"
            );
            assert_eq!(result.is_err(), index == 6, "round {round} write {index}");
        }
        assert_eq!(
            read_all(&engine, batched, size),
            read_all(&engine, serial, size)
        );
    }
    assert_eq!(
        engine.volume_stats("batched").unwrap().stored_bytes,
        engine.volume_stats("serial").unwrap().stored_bytes
    );
}

/// Goal: writes read back exactly, identical blocks across volumes are stored once, zero
/// blocks are never stored, and everything survives a clean reopen.
#[test]
fn round_trip_and_dedup_across_volumes() {
    let storage = SimulatedStorage::new();
    let engine = open(&storage).unwrap();
    let a = engine
        .create_volume("a", 1 << 20, 4096, HintSettings::default())
        .unwrap();
    let b = engine
        .create_volume("b", 1 << 20, 4096, HintSettings::default())
        .unwrap();
    let image: Vec<u8> = (0..64u64)
        .flat_map(|index| {
            if index % 8 == 0 {
                vec![0u8; BLOCK]
            } else {
                pattern(index, BLOCK)
            }
        })
        .collect();
    engine.write(a.id, 0, &image, false).unwrap();
    engine.write(b.id, 8 * BLOCK as u64, &image, true).unwrap();
    assert_eq!(&read_all(&engine, a.id, 1 << 20)[..image.len()], &image[..]);
    let stats_a = engine.volume_stats("a").unwrap();
    let stats_b = engine.volume_stats("b").unwrap();
    assert_eq!(stats_a.mapped_bytes, 56 * BLOCK as u64);
    assert_eq!(stats_a.stored_bytes, 56 * BLOCK as u64);
    assert_eq!(stats_b.mapped_bytes, 56 * BLOCK as u64);
    // Both volumes share all 56 distinct chunks.
    assert_eq!(engine.stats().store.live_chunks, 56);
    engine.shutdown().unwrap();
    drop(engine);

    let engine = open(&storage).unwrap();
    let mut out = vec![0u8; image.len()];
    engine.read(b.id, 8 * BLOCK as u64, &mut out).unwrap();
    assert_eq!(out, image);
    assert!(engine
        .check(onecopy_core::check::CheckOptions::default())
        .unwrap()
        .is_clean());
}

/// Goal: unaligned writes merge with existing bytes (read-modify-write), and reads at odd
/// offsets return the right slice.
#[test]
fn partial_writes_and_reads() {
    let storage = SimulatedStorage::new();
    let engine = open(&storage).unwrap();
    let volume = engine
        .create_volume("v", 64 * BLOCK as u64, 4096, HintSettings::default())
        .unwrap();
    let mut model = vec![0u8; 64 * BLOCK];
    let writes = [
        (100u64, 50usize, 1u64),
        (4000, 300, 2),
        (8192, 4096, 3),
        (12000, 20000, 4),
        (1, 1, 5),
    ];
    for (offset, length, seed) in writes {
        let data = pattern(seed, length);
        engine.write(volume.id, offset, &data, false).unwrap();
        model[offset as usize..offset as usize + length].copy_from_slice(&data);
    }
    assert_eq!(read_all(&engine, volume.id, model.len()), model);
    let mut piece = vec![0u8; 777];
    engine.read(volume.id, 4001, &mut piece).unwrap();
    assert_eq!(piece, model[4001..4001 + 777]);
    assert!(engine.stats().requests.read_modify_writes > 0);
}

/// Goal: trim and write-zeroes release whole blocks, zero partial ones (write-zeroes only),
/// and block status reports holes.
#[test]
fn unmap_and_block_status() {
    let storage = SimulatedStorage::new();
    let engine = open(&storage).unwrap();
    let volume = engine
        .create_volume("v", 16 * BLOCK as u64, 4096, HintSettings::default())
        .unwrap();
    let data = pattern(9, 16 * BLOCK);
    engine.write(volume.id, 0, &data, false).unwrap();
    engine
        .trim(volume.id, 2 * BLOCK as u64, 2 * BLOCK as u64, false)
        .unwrap();
    engine
        .write_zeroes(volume.id, 6 * BLOCK as u64 + 100, 2 * BLOCK as u64, false)
        .unwrap();
    let mut model = data.clone();
    model[2 * BLOCK..4 * BLOCK].fill(0);
    model[6 * BLOCK + 100..8 * BLOCK + 100].fill(0);
    assert_eq!(read_all(&engine, volume.id, 16 * BLOCK), model);
    let extents = engine
        .block_status(volume.id, 0, 16 * BLOCK as u64)
        .unwrap();
    let holes: Vec<(u64, bool)> = extents
        .iter()
        .map(|e| (e.length / BLOCK as u64, e.hole))
        .collect();
    assert_eq!(
        holes,
        vec![(2, false), (2, true), (3, false), (1, true), (8, false)]
    );
    assert_eq!(
        engine.volume_stats("v").unwrap().mapped_bytes,
        13 * BLOCK as u64
    );
    // Unmapping may span more than any read or write could (mkfs discards whole devices).
    let big = engine
        .create_volume("big", 4 << 30, 4096, HintSettings::default())
        .unwrap();
    engine
        .write(big.id, 3 << 30, &data[..BLOCK], false)
        .unwrap();
    engine.trim(big.id, 0, 4 << 30, false).unwrap();
    engine.write_zeroes(big.id, 0, 4 << 30, false).unwrap();
    assert_eq!(engine.volume_stats("big").unwrap().mapped_bytes, 0);
    // Out-of-range requests are refused without effect.
    assert!(engine
        .write(volume.id, 16 * BLOCK as u64 - 1, &[1, 2], false)
        .is_err());
    assert!(engine.read(volume.id, u64::MAX - 1, &mut [0u8; 4]).is_err());
}

/// Goal: explicit no-dedup ranges store duplicates separately; deferred deduplication merges
/// them later; deleting a volume frees its chunks.
#[test]
fn hints_deferred_dedup_and_delete() {
    let storage = SimulatedStorage::new();
    let engine = open(&storage).unwrap();
    let plain = engine
        .create_volume("plain", 32 * BLOCK as u64, 4096, HintSettings::default())
        .unwrap();
    let hinted = engine
        .create_volume("hinted", 32 * BLOCK as u64, 4096, HintSettings::default())
        .unwrap();
    let data = pattern(1, 8 * BLOCK);
    engine.write(plain.id, 0, &data, false).unwrap();
    engine
        .set_no_dedup(
            "hinted",
            onecopy_block::ByteRange {
                start: 0,
                end: 8 * BLOCK as u64,
            },
            true,
        )
        .unwrap();
    engine.write(hinted.id, 0, &data, false).unwrap();
    assert_eq!(engine.stats().store.live_chunks, 16);
    assert_eq!(engine.stats().requests.hint_explicit_blocks, 8);

    let deferred = engine
        .create_volume(
            "deferred",
            32 * BLOCK as u64,
            4096,
            HintSettings {
                deferred_seconds: Some(3600),
                ..HintSettings::default()
            },
        )
        .unwrap();
    engine
        .write(deferred.id, 4 * BLOCK as u64, &data, false)
        .unwrap();
    assert_eq!(engine.stats().store.live_chunks, 24);
    let too_soon = engine.deduplicate_deferred(None, None).unwrap();
    assert_eq!((too_soon.examined, too_soon.too_recent), (8, 8));
    let report = engine.deduplicate_deferred(None, Some(0)).unwrap();
    assert_eq!(report.deduplicated, 8);
    assert_eq!(engine.stats().store.live_chunks, 16);
    let mut out = vec![0u8; data.len()];
    engine
        .read(deferred.id, 4 * BLOCK as u64, &mut out)
        .unwrap();
    assert_eq!(out, data);

    engine.delete_volume("plain").unwrap();
    engine.delete_volume("deferred").unwrap();
    assert_eq!(engine.stats().store.live_chunks, 8);
    assert!(engine.volume("plain").is_err());
    let check = engine
        .check(onecopy_core::check::CheckOptions::default())
        .unwrap();
    assert!(check.is_clean(), "{check:?}");
}

/// Goal: compaction after heavy overwrites reclaims containers and keeps data intact.
#[test]
fn compaction_reclaims_overwritten_space() {
    let storage = SimulatedStorage::new();
    let engine = open(&storage).unwrap();
    let volume = engine
        .create_volume("v", 4096 * BLOCK as u64, 4096, HintSettings::default())
        .unwrap();
    for round in 0..3u64 {
        let data = pattern(round + 100, 2048 * BLOCK);
        engine.write(volume.id, 0, &data, false).unwrap();
    }
    let last = pattern(102, 2048 * BLOCK);
    let (plan, report) = engine
        .compact(&onecopy_core::gc::CompactionOptions::default(), false)
        .unwrap();
    assert!(!plan.containers.is_empty());
    assert!(report.unwrap().containers_retired > 0);
    let mut out = vec![0u8; last.len()];
    engine.read(volume.id, 0, &mut out).unwrap();
    assert_eq!(out, last);
    assert!(engine
        .check(onecopy_core::check::CheckOptions::default())
        .unwrap()
        .is_clean());
}

/// One step of the crash test's random workload.
#[derive(Clone, Debug)]
enum Step {
    Write {
        offset: u64,
        seed: u64,
        length: usize,
    },
    Trim {
        block: u64,
        blocks: u64,
    },
    Flush,
}

/// `distinct` patterns are written: few make duplicates plenty, many make new chunks fill
/// containers.
fn workload(seed: u64, steps: usize, volume_blocks: u64, distinct: u64) -> Vec<Step> {
    let mut state = seed | 1;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (0..steps)
        .map(|_| match next() % 10 {
            0 => Step::Flush,
            1 => Step::Trim {
                block: next() % volume_blocks,
                blocks: 1 + next() % 3,
            },
            2 => Step::Write {
                offset: next() % (volume_blocks * BLOCK as u64 - 5000),
                seed: next() % distinct.min(5),
                length: 1 + (next() % 5000) as usize,
            },
            _ => {
                let blocks = 1 + next() % 4;
                Step::Write {
                    offset: (next() % (volume_blocks - blocks)) * BLOCK as u64,
                    seed: next() % distinct,
                    length: (blocks as usize) * BLOCK,
                }
            }
        })
        .collect()
}

fn apply_model(model: &mut [u8], step: &Step) {
    match step {
        Step::Write {
            offset,
            seed,
            length,
        } => {
            model[*offset as usize..*offset as usize + length]
                .copy_from_slice(&pattern(*seed, *length));
        }
        Step::Trim { block, blocks } => {
            let start = (*block as usize * BLOCK).min(model.len());
            let end = ((*block + *blocks) as usize * BLOCK).min(model.len());
            model[start..end].fill(0);
        }
        Step::Flush => {}
    }
}

/// Runs steps until the storage dies; returns the index of the last completed flush (model
/// snapshot index) and how many steps completed.
fn run_until_crash(
    engine: &Engine,
    volume: u32,
    steps: &[Step],
    volume_bytes: u64,
) -> (usize, usize) {
    let mut last_flush = 0;
    for (index, step) in steps.iter().enumerate() {
        let result = match step {
            Step::Write {
                offset,
                seed,
                length,
            } => engine.write(volume, *offset, &pattern(*seed, *length), false),
            Step::Trim { block, blocks } => {
                let start = block * BLOCK as u64;
                let length = (blocks * BLOCK as u64).min(volume_bytes - start);
                engine.trim(volume, start, length, false)
            }
            Step::Flush => engine.flush(),
        };
        if result.is_err() {
            return (last_flush, index);
        }
        if matches!(step, Step::Flush) {
            last_flush = index + 1;
        }
    }
    (last_flush, steps.len())
}

/// Goal: after a crash at any sync point (torn writes included), the volume reopens by
/// itself, holds every write acknowledged before the last completed FLUSH, equals the model
/// after some prefix of the requests, and `check` finds maps, reference counts and index in
/// agreement. Method: reference model snapshots after every step.
#[test]
fn crash_recovery_matches_model() {
    // Few distinct patterns: plenty of duplicates.
    let crash_points = crash_recovery_case(None, 6, 1..=10);
    assert!(
        crash_points >= 100,
        "the workload must reach many sync points"
    );
}

/// Goal: the same, where containers fill and are sealed between flushes, so that container
/// bytes written behind the lock, seals and new container names whose syncs wait for the
/// next FLUSH are all cut by crashes (torn seals, missing names). Method: the smallest
/// containers (64 KiB, 16 blocks) and mostly new data.
#[test]
fn crash_recovery_matches_model_across_sealed_containers() {
    let config = BlockConfig {
        containers: ContainerOptions {
            container_bytes: CONTAINER_BYTES_MIN,
            compression_level: None,
        },
        ..BlockConfig::default()
    };
    let crash_points = crash_recovery_case(Some(config), 400, 1..=6);
    assert!(
        crash_points >= 100,
        "the workload must reach many sync points"
    );
}

/// Runs the crash test of `seeds` on engines created with `config`; returns the number of
/// crash points tested.
fn crash_recovery_case(
    config: Option<BlockConfig>,
    distinct: u64,
    seeds: std::ops::RangeInclusive<u64>,
) -> usize {
    let open = |storage: &SimulatedStorage| {
        Engine::open(
            Arc::new(storage.clone()) as Arc<dyn Storage>,
            config.clone(),
            runtime(),
        )
    };
    let volume_blocks = 24u64;
    let volume_bytes = volume_blocks * BLOCK as u64;
    let mut crash_points = 0;
    let mut sealed = 0;
    for seed in seeds {
        let steps = workload(seed, 80, volume_blocks, distinct);
        let mut snapshots = vec![vec![0u8; volume_bytes as usize]];
        for step in &steps {
            let mut next = snapshots.last().unwrap().clone();
            apply_model(&mut next, step);
            snapshots.push(next);
        }
        let total_syncs = {
            let storage = SimulatedStorage::new();
            let engine = open(&storage).unwrap();
            let volume = engine
                .create_volume("v", volume_bytes, 4096, HintSettings::default())
                .unwrap();
            let before = storage.sync_count();
            run_until_crash(&engine, volume.id, &steps, volume_bytes);
            // Every container but the last one opened was sealed.
            sealed += engine.stats().store.container_id_next.saturating_sub(2);
            (before, storage.sync_count())
        };
        for crash_at in total_syncs.0 + 1..=total_syncs.1 {
            let storage = SimulatedStorage::new();
            let engine = open(&storage).unwrap();
            let volume = engine
                .create_volume("v", volume_bytes, 4096, HintSettings::default())
                .unwrap();
            storage.crash_after_syncs(crash_at - total_syncs.0);
            let (last_flush, completed) = run_until_crash(&engine, volume.id, &steps, volume_bytes);
            drop(engine);
            let after = storage.crash(CrashMode::Torn { seed: crash_at });
            let engine = open(&after)
                .unwrap_or_else(|error| panic!("seed {seed} crash {crash_at}: {error}"));
            let content = read_all(&engine, volume.id, volume_bytes as usize);
            let matching: Vec<usize> = (last_flush..=completed.min(steps.len()))
                .filter(|&index| snapshots[index] == content)
                .collect();
            assert!(
                !matching.is_empty(),
                "seed {seed} crash at sync {crash_at}: recovered volume matches no state from \
                 step {last_flush} to {completed}"
            );
            let report = engine
                .check(onecopy_core::check::CheckOptions::default())
                .unwrap();
            assert!(
                report.is_clean(),
                "seed {seed} crash {crash_at}: {report:?}"
            );
            crash_points += 1;
        }
    }
    eprintln!("crash points tested: {crash_points}, containers sealed in the full runs: {sealed}");
    if config.is_some() {
        assert!(sealed >= 20, "the workload must seal containers ({sealed})");
    }
    crash_points
}

/// Goal: flash mode (paper 5) deduplicates with weak xxh3 fingerprints confirmed by byte
/// comparison and an LFU index cache, and a restart loads the checkpointed index instead of
/// rescanning anything. Method: write duplicates, reopen, write them again and count.
#[test]
fn flash_mode_deduplicates_and_restarts_without_rescan() {
    let storage = SimulatedStorage::new();
    let config = onecopy_block::BlockConfig::flash();
    let runtime = RuntimeOptions::for_config(&config);
    assert_eq!(
        runtime.index.cache_policy,
        onecopy_core::index::cache::CachePolicy::Lfu
    );
    let shared = || Arc::new(storage.clone()) as Arc<dyn Storage>;
    let engine = Engine::open(shared(), Some(config.clone()), runtime.clone()).unwrap();
    let volume = engine
        .create_volume("f", 64 * BLOCK as u64, 4096, HintSettings::none())
        .unwrap();
    let data: Vec<u8> = (0..8u64).flat_map(|seed| pattern(seed, BLOCK)).collect();
    engine.write(volume.id, 0, &data, false).unwrap();
    engine
        .write(volume.id, 8 * BLOCK as u64, &data, false)
        .unwrap();
    assert_eq!(engine.stats().store.live_chunks, 8);
    assert_eq!(engine.stats().chunks.weak_collisions, 0);
    engine.shutdown().unwrap();
    drop(engine);

    let engine = Engine::open(shared(), None, runtime).unwrap();
    assert_eq!(
        engine.config().fingerprint,
        onecopy_core::fingerprint::FingerprintAlgorithm::Xxh3
    );
    engine
        .write(volume.id, 16 * BLOCK as u64, &data, false)
        .unwrap();
    let stats = engine.stats();
    assert_eq!(
        stats.store.live_chunks, 8,
        "duplicates found after the restart"
    );
    assert_eq!(
        stats.index.filter_rebuilds, 0,
        "the saved index is loaded, not rebuilt"
    );
    let mut out = vec![0u8; data.len()];
    engine.read(volume.id, 16 * BLOCK as u64, &mut out).unwrap();
    assert_eq!(out, data);
    assert!(engine
        .check(onecopy_core::check::CheckOptions::default())
        .unwrap()
        .is_clean());
}

/// Goal: the idle-time background pass deduplicates deferred blocks once they are old enough,
/// without being asked. Method: poll the chunk count for up to 30 seconds.
#[test]
fn background_pass_deduplicates_deferred_blocks() {
    let storage = SimulatedStorage::new();
    let runtime = RuntimeOptions {
        idle_milliseconds: 1,
        ..runtime()
    };
    let engine =
        Engine::open(Arc::new(storage.clone()) as Arc<dyn Storage>, None, runtime).unwrap();
    let hints = HintSettings {
        deferred_seconds: Some(1),
        ..HintSettings::default()
    };
    let volume = engine
        .create_volume("d", 64 * BLOCK as u64, 4096, hints)
        .unwrap();
    let data = pattern(5, 4 * BLOCK);
    engine.write(volume.id, 0, &data, false).unwrap();
    engine
        .write(volume.id, 4 * BLOCK as u64, &data, false)
        .unwrap();
    assert_eq!(engine.stats().store.live_chunks, 8);
    let background = engine.start_background();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while engine.stats().store.live_chunks != 4 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    drop(background);
    assert_eq!(engine.stats().store.live_chunks, 4);
    assert_eq!(
        read_all(&engine, volume.id, 8 * BLOCK)[4 * BLOCK..],
        data[..]
    );
}

/// Goal: NBD CACHE of stored blocks that are not in the content cache loads them (from the
/// open container's buffer and from container files) instead of failing as corruption.
/// Method: write blocks, reopen (empty cache, chunks in files), CACHE the range, then write
/// more (chunks in the open buffer) and CACHE those; reads return the data written.
#[test]
fn cache_loads_stored_blocks() {
    let storage = SimulatedStorage::new();
    let size = 64 * BLOCK;
    let data = pattern(5, 16 * BLOCK);
    {
        let engine = open(&storage).unwrap();
        let volume = engine
            .create_volume("cached", size as u64, 4096, HintSettings::default())
            .unwrap()
            .id;
        engine.write(volume, 0, &data, false).unwrap();
        engine.cache(volume, 0, data.len() as u64).unwrap();
        engine.shutdown().unwrap();
    }
    let engine = open(&storage).unwrap();
    let volume = engine.volume_id("cached").unwrap();
    engine.cache(volume, 0, data.len() as u64).unwrap();
    engine.cache(volume, 512, 4 * BLOCK as u64).unwrap();
    let fresh = pattern(6, 8 * BLOCK);
    engine
        .write(volume, 32 * BLOCK as u64, &fresh, false)
        .unwrap();
    engine
        .cache(volume, 32 * BLOCK as u64, fresh.len() as u64)
        .unwrap();
    let all = read_all(&engine, volume, size);
    assert_eq!(&all[..data.len()], &data[..]);
    assert_eq!(&all[32 * BLOCK..40 * BLOCK], &fresh[..]);
}
