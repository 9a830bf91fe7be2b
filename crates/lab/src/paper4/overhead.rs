//! Paper 4 §4.5 (Figs. 12 and 13) on the block engine's content cache: the time of one lookup
//! and one insertion against the cache's size.
//!
//! Paper 4's cache has two hash tables, by sector and by content; ours has the content table
//! and the names (which content a stored location holds), the counterpart of its sector
//! table. Each operation is timed over many repetitions on a cache filled to its limit, so
//! insertions evict: name lookup ([`ContentCache::key_of`] of an unfingerprinted chunk), content
//! lookup ([`ContentCache::get`] of a cached key, copying the 4 KiB out), and the content
//! lookup with the digest a write computes first (BLAKE3 of 4 KiB); and the insertions of
//! names and of data. Paper 4 counts CPU cycles on a 2 GHz Pentium 4; we give nanoseconds on
//! this machine. Its hash tables' bucket counts (the x axis of its second panels) have no
//! counterpart: ours size their tables to their entries.

use std::time::Instant;

use serde::Serialize;

use onecopy_block::cache::{ContentCache, ContentKey};
use onecopy_core::chunk_store::ChunkRecord;
use onecopy_core::container::ChunkLocation;
use onecopy_core::fingerprint::FingerprintAlgorithm;

/// Bytes of one cached page.
const PAGE_BYTES: usize = 4096;

/// The costs at one cache size.
#[derive(Clone, Debug, Serialize)]
pub struct OverheadPoint {
    /// Pages the cache holds.
    pub cache_pages: u64,
    pub name_lookup_ns: f64,
    pub content_lookup_ns: f64,
    pub content_lookup_with_digest_ns: f64,
    pub name_insert_ns: f64,
    pub content_insert_ns: f64,
    pub content_insert_with_digest_ns: f64,
}

fn key(index: u64) -> ContentKey {
    ContentKey(FingerprintAlgorithm::Blake3.hash(&index.to_le_bytes()))
}

fn record(index: u64) -> ChunkRecord {
    ChunkRecord {
        location: ChunkLocation {
            container: index / 1024,
            offset: (index % 1024) as u32 * PAGE_BYTES as u32,
            stored_bytes: PAGE_BYTES as u32,
            raw_bytes: PAGE_BYTES as u32,
            flags: 0,
            checksum: 0,
        },
        ..ChunkRecord::default()
    }
}

/// Nanoseconds per call of `operation` over `operations` calls.
fn time(operations: u64, mut operation: impl FnMut(u64)) -> f64 {
    let start = Instant::now();
    for index in 0..operations {
        operation(index);
    }
    start.elapsed().as_nanos() as f64 / operations as f64
}

/// Measures every cache size of `pages` with `operations` calls per operation.
pub fn measure(pages: &[usize], operations: u64) -> Vec<OverheadPoint> {
    pages
        .iter()
        .map(|&pages| measure_one(pages, operations))
        .collect()
}

fn measure_one(pages: usize, operations: u64) -> OverheadPoint {
    // The budget of `pages` data slots and their bookkeeping.
    let budget = (pages * (PAGE_BYTES + 512)) as u64;
    let cache = ContentCache::new(budget, "arc", FingerprintAlgorithm::Blake3)
        .expect("the arc policy exists");
    let stats = cache.stats();
    let (entries, names) = (stats.entries_limit, stats.names_limit);
    assert!(entries > 0, "a budget of {pages} pages holds pages");
    let mut data = vec![0u8; PAGE_BYTES];
    for index in 0..entries {
        cache.insert(key(index), &data);
    }
    for index in 0..names {
        cache.name(&record(index).location, key(index % entries));
    }
    // Pseudo-random resident indexes, so lookups do not walk memory in order.
    let resident = |index: u64, limit: u64| index.wrapping_mul(0x9E37_79B9_7F4A_7C15) % limit;
    let mut sink = 0u64;
    let name_lookup_ns = time(operations, |index| {
        let found = cache.key_of(&record(resident(index, names)));
        sink = sink.wrapping_add(found.map_or(0, |key| key.0 .0[0] as u64));
    });
    let keys: Vec<ContentKey> = (0..operations.min(1 << 20))
        .map(|index| key(resident(index, entries)))
        .collect();
    let mut out = vec![0u8; PAGE_BYTES];
    let content_lookup_ns = time(operations, |index| {
        let hit = cache.get(Some(keys[index as usize % keys.len()]), &mut out);
        sink = sink.wrapping_add(u64::from(hit));
    });
    let content_lookup_with_digest_ns = time(operations, |index| {
        data[..8].copy_from_slice(&index.to_le_bytes());
        let digested = cache.key_of_bytes(&data);
        let hit = cache.get(Some(digested), &mut out);
        sink = sink.wrapping_add(u64::from(hit));
    });
    let fresh: Vec<ContentKey> = (0..operations.min(1 << 20))
        .map(|index| key(u64::MAX / 2 + index))
        .collect();
    let name_insert_ns = time(operations, |index| {
        cache.name(
            &record(names + index).location,
            fresh[index as usize % fresh.len()],
        );
    });
    let content_insert_ns = time(operations, |index| {
        cache.insert(key(u64::MAX / 4 + index), &data);
    });
    // `content_insert_ns` includes deriving the test key (a BLAKE3 of 8 bytes): the key is
    // made in the loop because precomputed keys for every insertion would not fit in memory
    // at the largest sizes. The digest variant hashes the whole page instead.
    let content_insert_with_digest_ns = time(operations, |index| {
        data[..8].copy_from_slice(&(u64::MAX / 8 + index).to_le_bytes());
        let digested = cache.key_of_bytes(&data);
        cache.insert(digested, &data);
    });
    std::hint::black_box(sink);
    OverheadPoint {
        cache_pages: entries,
        name_lookup_ns,
        content_lookup_ns,
        content_lookup_with_digest_ns,
        name_insert_ns,
        content_insert_ns,
        content_insert_with_digest_ns,
    }
}
