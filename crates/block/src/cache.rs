//! The content-addressed read cache (paper 4 §3.2).
//!
//! Reads are cached by *what* they return, not *where* they were asked for: the key is the
//! stored chunk's location (container and offset), which deduplication makes unique per
//! content, and which never changes meaning because containers are append-only and their ids
//! are never reused. So the same content read through different blocks or volumes (cloned VM
//! images, copies) is read from the media once, and no write ever needs to invalidate an
//! entry. Replacement is the index's cache policy machinery (ARC by default, as paper 4
//! recommends for a second-level cache; LRU or LFU for comparison); the data lives in
//! fixed slots beside it.

use std::str::FromStr;

use parking_lot::Mutex;
use serde::Serialize;

use crate::error::Result;
use onecopy_core::container::{ChunkLocation, ContainerId};
use onecopy_core::index::cache::{Cache, CacheKey, CachePolicy, EntryCache};

/// Bytes of one data slot: the largest block size.
const SLOT_BYTES: usize = 4096;
/// Value of an entry between its insertion and the assignment of its slot.
const SLOT_PENDING: u64 = u64::MAX;

/// The cache key of a stored chunk: the container that holds it and its offset there, which
/// name its content for good (containers are append-only and their ids are never reused).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContentKey {
    container: ContainerId,
    offset: u32,
}

impl ContentKey {
    /// The key of the chunk stored at `location`.
    pub fn of(location: &ChunkLocation) -> ContentKey {
        ContentKey {
            container: location.container,
            offset: location.offset,
        }
    }
}

impl CacheKey for ContentKey {
    /// The policies' tables hash these bits, so they get a well-mixed value; distinct for
    /// distinct keys while container ids stay below 2^32.
    #[inline]
    fn prefix_u64(&self) -> u64 {
        mix(self.container.rotate_left(32) ^ u64::from(self.offset))
    }
}

fn mix(mut value: u64) -> u64 {
    value ^= value >> 33;
    value = value.wrapping_mul(0xff51_afd7_ed55_8ccd);
    value ^= value >> 33;
    value = value.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    value ^ (value >> 33)
}

/// Figures of the content cache.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct ContentCacheStats {
    pub policy: &'static str,
    pub entries: u64,
    pub entries_limit: u64,
    pub hits: u64,
    pub misses: u64,
    pub memory_bytes: u64,
}

struct Slots {
    policy: Cache<ContentKey>,
    data: Vec<u8>,
    lengths: Vec<u16>,
    free: Vec<u32>,
    hits: u64,
    misses: u64,
}

/// The content cache; internally locked, so reads can use it without the engine lock.
pub struct ContentCache {
    slots: Option<Mutex<Slots>>,
}

impl ContentCache {
    /// A cache using at most `memory_bytes` (data and policy together) with `policy` (`arc`,
    /// `lru` or `lfu`). Zero bytes turns the cache off.
    pub fn new(memory_bytes: u64, policy: &str) -> Result<ContentCache> {
        let policy = CachePolicy::from_str(policy)?;
        if memory_bytes == 0 {
            return Ok(ContentCache { slots: None });
        }
        // The most entries whose slots and policy bookkeeping fit the budget.
        let mut entries = (memory_bytes / SLOT_BYTES as u64) as usize;
        while entries > 0
            && (entries * (SLOT_BYTES + 2)) as u64
                + policy.memory_bytes_with_keys::<ContentKey>(entries) as u64
                > memory_bytes
        {
            entries -= entries / 64 + 1;
        }
        if entries == 0 {
            return Ok(ContentCache { slots: None });
        }
        Ok(ContentCache {
            slots: Some(Mutex::new(Slots {
                policy: Cache::with_entries(policy, entries),
                data: vec![0u8; entries * SLOT_BYTES],
                lengths: vec![0; entries],
                free: (0..entries as u32).rev().collect(),
                hits: 0,
                misses: 0,
            })),
        })
    }

    /// True unless the cache was configured with no memory.
    pub fn enabled(&self) -> bool {
        self.slots.is_some()
    }

    /// Copies the cached chunk into `out` and returns true on a hit.
    pub fn get(&self, key: ContentKey, out: &mut [u8]) -> bool {
        let Some(slots) = &self.slots else {
            return false;
        };
        let mut slots = slots.lock();
        match slots.policy.get(&key) {
            Some(slot) if slots.lengths[slot as usize] as usize == out.len() => {
                let start = slot as usize * SLOT_BYTES;
                out.copy_from_slice(&slots.data[start..start + out.len()]);
                slots.hits += 1;
                true
            }
            _ => {
                slots.misses += 1;
                false
            }
        }
    }

    /// True when the chunk is cached (without counting an access).
    pub fn contains(&self, key: ContentKey) -> bool {
        self.slots
            .as_ref()
            .is_some_and(|slots| slots.lock().policy.peek(&key).is_some())
    }

    /// Caches a chunk just read from the media.
    pub fn insert(&self, key: ContentKey, data: &[u8]) {
        let Some(slots) = &self.slots else {
            return;
        };
        if data.len() > SLOT_BYTES {
            return;
        }
        let mut slots = slots.lock();
        if slots.policy.peek(&key).is_some() {
            return;
        }
        if let Some(evicted) = slots.policy.insert_evicting(&key, SLOT_PENDING) {
            assert_ne!(
                evicted, SLOT_PENDING,
                "the entry being inserted is never the victim"
            );
            slots.free.push(evicted as u32);
        }
        let slot = slots.free.pop().expect("an insertion leaves a free slot");
        slots.policy.set_value(&key, slot as u64);
        let start = slot as usize * SLOT_BYTES;
        slots.data[start..start + data.len()].copy_from_slice(data);
        slots.lengths[slot as usize] = data.len() as u16;
    }

    /// Current figures.
    pub fn stats(&self) -> ContentCacheStats {
        let Some(slots) = &self.slots else {
            return ContentCacheStats::default();
        };
        let slots = slots.lock();
        ContentCacheStats {
            policy: slots.policy.policy().name(),
            entries: slots.policy.len() as u64,
            entries_limit: slots.policy.entries_limit() as u64,
            hits: slots.hits,
            misses: slots.misses,
            memory_bytes: (slots.data.len() + slots.lengths.len() * 2 + slots.policy.memory_bytes())
                as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn location(container: u64, offset: u32) -> ChunkLocation {
        ChunkLocation {
            container,
            offset,
            stored_bytes: 4096,
            raw_bytes: 4096,
            flags: 0,
            checksum: 0,
        }
    }

    /// Goal: cached chunks come back byte-exact; the budget bounds the entries; evicted slots
    /// are reused without mixing data (each slot's bytes always match its key).
    #[test]
    fn caches_within_budget_without_mixing_data() {
        for policy in ["arc", "lru", "lfu"] {
            let cache = ContentCache::new(64 * 4096, policy).unwrap();
            let limit = cache.stats().entries_limit;
            assert!(limit > 0 && cache.stats().memory_bytes <= 64 * 4096);
            // A hot set that fits, interleaved with a scan that does not: the hot set must
            // hit, and the scan's evictions must never mix up slots.
            for round in 0..3u64 {
                for index in (0..200u64).flat_map(|scan| [scan % 16, 1000 + scan]) {
                    let key = ContentKey::of(&location(index % 7, (index * 4144) as u32));
                    let data = vec![(index % 251) as u8; 4096];
                    let mut out = vec![0u8; 4096];
                    if cache.get(key, &mut out) {
                        assert_eq!(out, data, "policy {policy} round {round}");
                    } else {
                        cache.insert(key, &data);
                    }
                }
            }
            let stats = cache.stats();
            assert!(stats.entries <= limit);
            assert!(stats.hits > 0);
        }
        assert!(!ContentCache::new(0, "arc").unwrap().enabled());
        assert!(ContentCache::new(1 << 20, "fifo").is_err());
    }
}
