//! Flash mode with paper 5's 32-bit weak fingerprint (CRC-32C): blocks whose CRCs collide
//! are all stored, each later duplicate finds its own chunk along the chain, reads never
//! return another block's bytes, and a reopen or a crash keeps the chains right.
//!
//! Method: collisions are crafted, not searched for. CRC-32C is affine over GF(2) in the
//! message bits, so the last four bytes of a block can be solved for any CRC (`forge`): every
//! block of a test can be given one CRC.

use std::sync::Arc;

use onecopy_block::{BlockConfig, Engine, HintSettings, RuntimeOptions};
use onecopy_core::check::CheckOptions;
use onecopy_core::fingerprint::FingerprintAlgorithm;
use onecopy_core::storage::{CrashMode, SimulatedStorage, Storage};

const BLOCK: usize = 4096;
/// The CRC every crafted block of these tests has.
const SHARED_CRC: u32 = 0x0dd5_c0de;

fn runtime(config: &BlockConfig) -> RuntimeOptions {
    RuntimeOptions {
        content_cache_bytes: 0,
        // Small limits so that checkpoints happen in the middle of the tests.
        checkpoint_journal_bytes: 64 << 10,
        checkpoint_dirty_pages: 64,
        ..RuntimeOptions::for_config(config)
    }
}

fn open(storage: &SimulatedStorage) -> Arc<Engine> {
    let config = BlockConfig::flash_with(FingerprintAlgorithm::Crc32c);
    let runtime = runtime(&config);
    Engine::open(
        Arc::new(storage.clone()) as Arc<dyn Storage>,
        Some(config),
        runtime,
    )
    .unwrap()
}

/// Deterministic bytes, different for every seed.
fn pattern(seed: u64) -> Vec<u8> {
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

/// `data` with its last four bytes replaced so that its CRC-32C is `target`. The CRC of a
/// fixed-length message is an affine function of its bits: crc(x) = crc(0) xor M x, where
/// column i of M is crc(e_i) xor crc(0) for the unit vector e_i. The 32 x 32 matrix of the
/// last 32 bits is invertible, so Gaussian elimination over GF(2) solves M x = target xor
/// crc(prefix, 0).
fn forge(data: &[u8], target: u32) -> Vec<u8> {
    let tail = data.len() - 4;
    let mut out = data.to_vec();
    out[tail..].fill(0);
    let base = crc32c::crc32c(&out);
    // basis[bit] = (a combination of columns, which columns), with `bit` its highest set bit.
    let mut basis: [Option<(u32, u32)>; 32] = [None; 32];
    for column in 0..32 {
        out[tail + column / 8] = 1 << (column % 8);
        let (mut vector, mut columns) = (crc32c::crc32c(&out) ^ base, 1u32 << column);
        out[tail + column / 8] = 0;
        for bit in (0..32).rev() {
            if vector >> bit & 1 == 0 {
                continue;
            }
            match basis[bit] {
                Some((other, other_columns)) => {
                    vector ^= other;
                    columns ^= other_columns;
                }
                None => {
                    basis[bit] = Some((vector, columns));
                    break;
                }
            }
        }
    }
    let (mut rest, mut solution) = (target ^ base, 0u32);
    for bit in (0..32).rev() {
        if rest >> bit & 1 == 1 {
            let (vector, columns) = basis[bit].expect("the last 32 bits reach every CRC");
            rest ^= vector;
            solution ^= columns;
        }
    }
    assert_eq!(rest, 0);
    out[tail..].copy_from_slice(&solution.to_le_bytes());
    assert_eq!(crc32c::crc32c(&out), target);
    out
}

/// `count` different blocks that all have CRC-32C [`SHARED_CRC`].
fn colliding_blocks(count: u64) -> Vec<Vec<u8>> {
    let blocks: Vec<Vec<u8>> = (0..count)
        .map(|seed| forge(&pattern(seed), SHARED_CRC))
        .collect();
    for (index, block) in blocks.iter().enumerate() {
        assert!(blocks[..index].iter().all(|other| other != block));
    }
    blocks
}

fn read_block(engine: &Engine, volume: u32, block: u64) -> Vec<u8> {
    let mut out = vec![0u8; BLOCK];
    engine.read(volume, block * BLOCK as u64, &mut out).unwrap();
    out
}

/// Goal: blocks whose weak fingerprints collide are each stored once and each later
/// duplicate is deduplicated against its own chunk, through the engine's write path, its
/// check, a clean reopen, and overwrites that free chain members. Method: four crafted
/// blocks with one CRC-32C, written twice each, read back, reopened, overwritten.
#[test]
fn colliding_blocks_deduplicate_against_their_own_chunks() {
    let storage = SimulatedStorage::new();
    let engine = open(&storage);
    let volume = engine
        .create_volume("f", 64 * BLOCK as u64, 4096, HintSettings::none())
        .unwrap()
        .id;
    let blocks = colliding_blocks(4);
    for (index, block) in blocks.iter().enumerate() {
        engine
            .write(volume, index as u64 * BLOCK as u64, block, false)
            .unwrap();
    }
    for (index, block) in blocks.iter().enumerate() {
        engine
            .write(volume, (8 + index as u64) * BLOCK as u64, block, false)
            .unwrap();
    }
    let stats = engine.stats();
    assert_eq!(
        stats.store.live_chunks, 4,
        "each distinct block stored once"
    );
    assert!(stats.chunks.weak_collisions >= 6, "{:?}", stats.chunks);
    assert_eq!(stats.chunks.chain_limit_copies, 0);
    for (index, block) in blocks.iter().enumerate() {
        assert_eq!(&read_block(&engine, volume, index as u64), block);
        assert_eq!(&read_block(&engine, volume, 8 + index as u64), block);
    }
    assert!(engine.check(CheckOptions::default()).unwrap().is_clean());
    engine.shutdown().unwrap();
    drop(engine);

    let engine = open(&storage);
    // Overwrite both copies of block 1 (a middle member): it is freed and unlinked.
    let other = pattern(1000);
    engine.write(volume, BLOCK as u64, &other, false).unwrap();
    engine
        .write(volume, 9 * BLOCK as u64, &other, false)
        .unwrap();
    assert_eq!(engine.stats().store.live_chunks, 4);
    // The others still deduplicate after the reopen and the unlink; block 1 is stored anew.
    for (index, block) in blocks.iter().enumerate() {
        engine
            .write(volume, (16 + index as u64) * BLOCK as u64, block, false)
            .unwrap();
    }
    assert_eq!(engine.stats().store.live_chunks, 5);
    for (index, block) in blocks.iter().enumerate() {
        assert_eq!(&read_block(&engine, volume, 16 + index as u64), block);
    }
    assert!(engine.check(CheckOptions::default()).unwrap().is_clean());
}

/// Goal: after a crash at any sync point, the chains are what the recovered chunk records
/// say: every durable block reads back, `check` (which walks every chain) is clean, and
/// writing every colliding block again adds exactly the blocks the volume lost. Method: a
/// workload of crafted colliding blocks with overwrites (which free chain members) and
/// flushes; crash after every sync (torn), reopen, compare with the model.
#[test]
fn chains_survive_crashes_at_every_sync() {
    let blocks = colliding_blocks(6);
    // (volume block, which colliding block), with a FLUSH after every third write.
    let steps: Vec<(u64, usize)> = (0..36u64)
        .map(|step| ((step * 7) % 12, (step * 5 % 11) as usize % blocks.len()))
        .collect();
    let run =
        |engine: &Engine, volume: u32, model: &mut Vec<Option<usize>>| -> Vec<Option<usize>> {
            let mut durable = model.clone();
            for (index, &(block, which)) in steps.iter().enumerate() {
                if engine
                    .write(volume, block * BLOCK as u64, &blocks[which], false)
                    .is_err()
                {
                    break;
                }
                model[block as usize] = Some(which);
                if index % 3 == 2 {
                    if engine.flush().is_err() {
                        break;
                    }
                    durable = model.clone();
                }
            }
            durable
        };
    let volume_bytes = 12 * BLOCK as u64;
    let total_syncs = {
        let storage = SimulatedStorage::new();
        let engine = open(&storage);
        let volume = engine
            .create_volume("f", volume_bytes, 4096, HintSettings::none())
            .unwrap()
            .id;
        let before = storage.sync_count();
        run(&engine, volume, &mut vec![None; 12]);
        (before, storage.sync_count())
    };
    let mut crash_points = 0;
    for crash_at in total_syncs.0 + 1..=total_syncs.1 {
        let storage = SimulatedStorage::new();
        let engine = open(&storage);
        let volume = engine
            .create_volume("f", volume_bytes, 4096, HintSettings::none())
            .unwrap()
            .id;
        storage.crash_after_syncs(crash_at - total_syncs.0);
        let mut model = vec![None; 12];
        let durable = run(&engine, volume, &mut model);
        drop(engine);
        let after = storage.crash(CrashMode::Torn { seed: crash_at });
        let engine = open(&after);
        for (block, which) in durable.iter().enumerate() {
            let content = read_block(&engine, volume, block as u64);
            match which {
                // A durable write reads back.
                Some(which) => assert_eq!(content, blocks[*which], "crash {crash_at}"),
                // A later, unflushed write may have survived, but never foreign bytes.
                None => assert!(
                    content.iter().all(|&byte| byte == 0) || blocks.contains(&content),
                    "crash {crash_at}: block {block} holds bytes never written"
                ),
            }
        }
        // Blocks written after the last flush may or may not have survived; any surviving
        // block holds one of the colliding blocks, whole.
        for block in 0..12 {
            let content = read_block(&engine, volume, block);
            assert!(content.iter().all(|&byte| byte == 0) || blocks.contains(&content));
        }
        let report = engine.check(CheckOptions::default()).unwrap();
        assert!(report.is_clean(), "crash {crash_at}: {report:?}");
        // Every distinct block the volume holds is one chunk, found along the chain.
        let held: std::collections::BTreeSet<Vec<u8>> = (0..12)
            .map(|block| read_block(&engine, volume, block))
            .filter(|content| content.iter().any(|&byte| byte != 0))
            .collect();
        assert_eq!(engine.stats().store.live_chunks, held.len() as u64);
        for (index, block) in blocks.iter().enumerate() {
            engine
                .write(volume, (index as u64 % 12) * BLOCK as u64, block, false)
                .unwrap();
        }
        assert_eq!(
            engine.stats().store.live_chunks,
            blocks.len() as u64,
            "crash {crash_at}: a duplicate missed its chunk or a chunk leaked"
        );
        assert!(engine.check(CheckOptions::default()).unwrap().is_clean());
        crash_points += 1;
    }
    assert!(
        crash_points >= 10,
        "the workload reaches {crash_points} syncs"
    );
}
