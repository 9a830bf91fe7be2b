//! The content cache keys chunks by what they hold (paper 4 §3.2): one entry serves every
//! stored copy of the same bytes, deduplicated or not, and writes of cached content count as
//! write hits.

use std::sync::Arc;

use onecopy_block::{BlockConfig, Engine, HintSettings, RuntimeOptions};
use onecopy_core::container::{ContainerOptions, CONTAINER_BYTES_MIN};
use onecopy_core::fingerprint::FingerprintAlgorithm;
use onecopy_core::storage::{SimulatedStorage, Storage};

const BLOCK: usize = 4096;

fn engine(fingerprint: FingerprintAlgorithm) -> Arc<Engine> {
    let config = BlockConfig {
        fingerprint,
        // The smallest containers, so that chunks leave the open container's buffer and are
        // read from files (through the cache) after a few blocks.
        containers: ContainerOptions {
            container_bytes: CONTAINER_BYTES_MIN,
            compression_level: None,
        },
    };
    let runtime = RuntimeOptions {
        content_cache_bytes: 1 << 20,
        ..RuntimeOptions::default()
    };
    let storage = Arc::new(SimulatedStorage::new()) as Arc<dyn Storage>;
    Engine::open(storage, Some(config), runtime).unwrap()
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

/// Goal: a block stored twice, once deduplicated and once without deduplication (a deferred
/// copy), is one cache entry: reading it through the second copy hits the entry the first
/// read made (with a strong fingerprint already on the first read of that copy, which its
/// write named; with a weak one, whose writes digest nothing more, from the second read); a
/// later write of the same content is a write hit (strong fingerprints). Method: two volumes,
/// one deduplicating inline, one deferring; containers sealed by filler blocks; cache figures
/// compared read by read.
#[test]
fn one_entry_serves_deduplicated_and_deferred_copies() {
    for fingerprint in [FingerprintAlgorithm::Blake3, FingerprintAlgorithm::Crc32c] {
        let engine = engine(fingerprint);
        let size = 64 * BLOCK as u64;
        let inline = engine
            .create_volume("inline", size, BLOCK as u32, HintSettings::none())
            .unwrap()
            .id;
        let deferred_hints = HintSettings {
            deferred_seconds: Some(3600),
            ..HintSettings::none()
        };
        let deferred = engine
            .create_volume("deferred", size, BLOCK as u32, deferred_hints)
            .unwrap()
            .id;
        let shared = block_of(7);
        engine.write(inline, 0, &shared, false).unwrap();
        engine.write(deferred, 0, &shared, false).unwrap();
        // Filler blocks seal the containers that hold the two copies.
        for seed in 1..48u64 {
            engine
                .write(inline, seed * BLOCK as u64, &block_of(1000 + seed), false)
                .unwrap();
        }
        engine.flush().unwrap();
        assert_eq!(engine.stats().requests.deferred_blocks, 1, "{fingerprint}");

        let mut out = vec![0u8; BLOCK];
        engine.read(inline, 0, &mut out).unwrap();
        assert_eq!(out, shared);
        let first = engine.stats().content_cache;
        assert_eq!(first.hits, 0, "{fingerprint}: the first read misses");
        let weak = fingerprint.is_weak();
        engine.read(deferred, 0, &mut out).unwrap();
        assert_eq!(out, shared);
        if weak {
            // Not named by its write: this read digests it and finds the entry there.
            assert_eq!(engine.stats().content_cache.hits, 0, "{fingerprint}");
            engine.read(deferred, 0, &mut out).unwrap();
            assert_eq!(out, shared);
        }
        let second = engine.stats().content_cache;
        assert_eq!(
            second.hits, 1,
            "{fingerprint}: the deferred copy hits the entry of the deduplicated one"
        );
        assert_eq!(second.entries, first.entries, "{fingerprint}: one entry");

        // Content already cached, written to a third place: a write hit.
        engine
            .write(inline, 60 * BLOCK as u64, &shared, false)
            .unwrap();
        let write_hits = u64::from(!weak);
        assert_eq!(
            engine.stats().content_cache.write_hits,
            write_hits,
            "{fingerprint}"
        );
        // New content is no write hit.
        engine
            .write(inline, 61 * BLOCK as u64, &block_of(99), false)
            .unwrap();
        assert_eq!(
            engine.stats().content_cache.write_hits,
            write_hits,
            "{fingerprint}"
        );
    }
}
