//! Regression test found by the end-to-end crash test (crates/cli/tests/block_crash.rs): a
//! crash after the engine created a new container but before the journal record that opens
//! it was durable left the container's file behind; after recovery the engine handed out the
//! same container id again, `create` failed with "already exists", and every later write
//! failed until the orphan was removed by hand.

use std::sync::Arc;

use onecopy_block::{BlockConfig, Engine, HintSettings, RuntimeOptions};
use onecopy_core::storage::{CrashMode, SimulatedStorage, Storage};

const MIB: usize = 1 << 20;
const BLOCK_BYTES: usize = 4096;

fn open(storage: &SimulatedStorage) -> Arc<Engine> {
    Engine::open(
        Arc::new(storage.clone()) as Arc<dyn Storage>,
        None,
        RuntimeOptions {
            content_cache_bytes: 0,
            ..RuntimeOptions::default()
        },
    )
    .expect("engine opens")
}

/// Unique 4 KiB blocks: every block starts with its own number.
fn unique_blocks(first_block: u64, bytes: usize) -> Vec<u8> {
    let mut data = vec![0x5a; bytes];
    for (index, block) in data.chunks_mut(BLOCK_BYTES).enumerate() {
        block[..8].copy_from_slice(&(first_block + index as u64).to_le_bytes());
    }
    data
}

// Goal: after a crash that loses the journal record of a freshly created container, the
// reopened engine accepts writes that need new containers, and check stays clean; method:
// simulated storage, a flushed write, an unflushed write larger than a container, a clean
// crash (only synced state survives), reopen, write more than a container, read back.
#[test]
fn writes_after_losing_a_new_container_record() {
    let storage = SimulatedStorage::new();
    let engine = open(&storage);
    assert_eq!(engine.config(), &BlockConfig::default());
    let container_bytes = engine.config().containers.container_bytes as usize;
    let volume_bytes = 8 * container_bytes;
    let volume = engine
        .create_volume("v", volume_bytes as u64, 4096, HintSettings::none())
        .expect("volume");
    let durable = unique_blocks(0, MIB);
    engine.write(volume.id, 0, &durable, false).expect("write");
    engine.flush().expect("flush");
    // More than a container of unflushed data: at least one new container is created.
    let lost = unique_blocks(1 << 20, container_bytes + MIB);
    engine
        .write(volume.id, MIB as u64, &lost, false)
        .expect("unflushed write");
    drop(engine);

    let engine = open(&storage.crash(CrashMode::Clean));
    let later = unique_blocks(2 << 20, 2 * container_bytes);
    let offset = (MIB + container_bytes + MIB) as u64;
    engine
        .write(volume.id, offset, &later, false)
        .expect("writes after recovery need new containers");
    engine.flush().expect("flush after recovery");
    let mut read = vec![0u8; durable.len()];
    engine.read(volume.id, 0, &mut read).expect("read");
    assert!(read == durable, "the flushed write changed");
    let mut read = vec![0u8; later.len()];
    engine.read(volume.id, offset, &mut read).expect("read");
    assert!(read == later, "the write after recovery reads back wrong");
    let report = engine
        .check(onecopy_core::check::CheckOptions::default())
        .expect("check");
    assert!(report.is_clean(), "{report:?}");
}
