//! The content-addressed read cache (paper 4 §3.2).
//!
//! Terms:
//! - *content key*: a collision-resistant digest of a chunk's bytes. When the store's
//!   fingerprint is collision resistant, a chunk's fingerprint is its content key; with a weak
//!   fingerprint (xxh3, CRC-32C), where distinct chunks may share one, the cache digests with
//!   BLAKE3 instead ([`ContentCache::key_algorithm`]).
//! - *copy*: one stored chunk holding some content. Deduplication leaves one copy of most
//!   content, but blocks written without deduplication (hinted or deferred) are copies of
//!   their own, and so are chunks of the same content stored before they could be matched.
//! - *name*: what the cache knows of a copy whose record carries no usable content key (an
//!   unfingerprinted chunk, or any chunk under a weak fingerprint): its location and the
//!   content key it holds, as paper 4's sector lists record which sectors hold which content.
//!
//! Path of a read: the chunk's content key (its fingerprint, or its name) -> the data slot of
//! that key. A copy whose name is unknown is read from the media, digested, and named, so the
//! next read of it hits. Writes digest the blocks they store without deduplication (when the
//! cache is on), name them, and count a *write hit* when their content is cached (paper 4
//! Fig. 1 and Fig. 9); the written data does not enter the cache, which fills on read misses.
//! Under a weak fingerprint, writes digest nothing more (the weak hash is there to keep writes
//! cheap, paper 5): copies are named at their first read, and write hits are not counted.
//!
//! So the same content read through any copy (cloned images, a deduplicated and a hinted copy
//! of one block) is one entry and is read from the media once. Entries never need
//! invalidating: a content key names bytes, not a place, and a name's location (container and
//! offset) never changes meaning, because containers are append-only and their ids are never
//! reused. Names of freed chunks are left to age out. Replacement of data is the index's cache
//! policy machinery (ARC by default, as paper 4 recommends for a second-level cache; LRU or
//! LFU for comparison); names are kept in LRU order. Both fit one memory budget.
//!
//! Not guaranteed: a copy written by a partial-block write, moved by compaction, or stored
//! under a weak fingerprint has no name until it is first read, so that read misses even when
//! its content is cached (it adds no second entry).

use std::str::FromStr;

use parking_lot::Mutex;
use serde::Serialize;

use crate::error::Result;
use onecopy_core::chunk_store::ChunkRecord;
use onecopy_core::container::{ChunkLocation, ContainerId};
use onecopy_core::fingerprint::{Fingerprint, FingerprintAlgorithm};
use onecopy_core::index::cache::{Cache, CacheKey, CachePolicy, EntryCache};

/// Bytes of one data slot: the largest block size.
const SLOT_BYTES: usize = 4096;
/// Value of an entry between its insertion and the assignment of its slot.
const SLOT_PENDING: u64 = u64::MAX;
/// Names kept per data slot: a name costs about 1/40 of a slot, and copies of cached content
/// outnumber it where duplication is high (paper 4 Table 2 measures 2 to 4 copies per block).
const NAMES_PER_SLOT: usize = 4;

/// The content key of a chunk: a collision-resistant digest of its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ContentKey(pub Fingerprint);

impl CacheKey for ContentKey {
    #[inline]
    fn prefix_u64(&self) -> u64 {
        self.0.prefix_u64()
    }
}

/// Where a copy is stored: the key of a name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LocationKey {
    container: ContainerId,
    offset: u32,
}

impl LocationKey {
    fn of(location: &ChunkLocation) -> LocationKey {
        LocationKey {
            container: location.container,
            offset: location.offset,
        }
    }
}

impl CacheKey for LocationKey {
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
    /// Reads served from memory.
    pub hits: u64,
    pub misses: u64,
    /// Blocks written whose content was cached (paper 4's write hits).
    pub write_hits: u64,
    /// Blocks written whose content key was looked up.
    pub write_lookups: u64,
    /// Copies named (see the module documentation), and the most kept.
    pub names: u64,
    pub names_limit: u64,
    pub memory_bytes: u64,
}

struct Slots {
    policy: Cache<ContentKey>,
    data: Vec<u8>,
    lengths: Vec<u16>,
    free: Vec<u32>,
    /// Names: location -> index into `name_keys`.
    names: Cache<LocationKey>,
    name_keys: Vec<ContentKey>,
    names_free: Vec<u32>,
    hits: u64,
    misses: u64,
    write_hits: u64,
    write_lookups: u64,
}

/// The content cache; internally locked, so reads can use it without the engine lock.
pub struct ContentCache {
    slots: Option<Mutex<Slots>>,
    key_algorithm: FingerprintAlgorithm,
    /// The store's fingerprints are content keys.
    fingerprints_are_keys: bool,
}

impl ContentCache {
    /// A cache using at most `memory_bytes` (data, names and policy together) with `policy`
    /// (`arc`, `lru` or `lfu`), for a store whose chunks are fingerprinted with
    /// `store_fingerprint`. Zero bytes turns the cache off.
    pub fn new(
        memory_bytes: u64,
        policy: &str,
        store_fingerprint: FingerprintAlgorithm,
    ) -> Result<ContentCache> {
        let policy = CachePolicy::from_str(policy)?;
        let fingerprints_are_keys = !store_fingerprint.is_weak();
        let key_algorithm = if fingerprints_are_keys {
            store_fingerprint
        } else {
            FingerprintAlgorithm::Blake3
        };
        let off = ContentCache {
            slots: None,
            key_algorithm,
            fingerprints_are_keys,
        };
        if memory_bytes == 0 {
            return Ok(off);
        }
        // The most entries whose slots, names and bookkeeping fit the budget.
        let mut entries = (memory_bytes / SLOT_BYTES as u64) as usize;
        while entries > 0 && ContentCache::memory_bytes_for(entries, policy) > memory_bytes {
            entries -= entries / 64 + 1;
        }
        // The coarse steps may overshoot by a few entries.
        while ContentCache::memory_bytes_for(entries + 1, policy) <= memory_bytes {
            entries += 1;
        }
        if entries == 0 {
            return Ok(off);
        }
        let names = entries * NAMES_PER_SLOT;
        Ok(ContentCache {
            slots: Some(Mutex::new(Slots {
                policy: Cache::with_entries(policy, entries),
                data: vec![0u8; entries * SLOT_BYTES],
                lengths: vec![0; entries],
                free: (0..entries as u32).rev().collect(),
                names: Cache::with_entries(CachePolicy::Lru, names),
                name_keys: vec![ContentKey(Fingerprint::ZERO); names],
                names_free: (0..names as u32).rev().collect(),
                hits: 0,
                misses: 0,
                write_hits: 0,
                write_lookups: 0,
            })),
            ..off
        })
    }

    /// The memory a cache of `entries` data slots takes with `policy`, names and bookkeeping
    /// included: the budget that gives exactly that many slots.
    pub fn memory_bytes_for(entries: usize, policy: CachePolicy) -> u64 {
        let names = entries * NAMES_PER_SLOT;
        (entries * (SLOT_BYTES + 2)) as u64
            + policy.memory_bytes_with_keys::<ContentKey>(entries) as u64
            + (names * std::mem::size_of::<ContentKey>()) as u64
            + CachePolicy::Lru.memory_bytes_with_keys::<LocationKey>(names) as u64
    }

    /// True unless the cache was configured with no memory.
    pub fn enabled(&self) -> bool {
        self.slots.is_some()
    }

    /// The digest of content keys.
    pub fn key_algorithm(&self) -> FingerprintAlgorithm {
        self.key_algorithm
    }

    /// True when the store's fingerprints are content keys, so writes that deduplicate need
    /// no digest of their own.
    pub fn fingerprints_are_keys(&self) -> bool {
        self.fingerprints_are_keys
    }

    /// The content key of `data`.
    pub fn key_of_bytes(&self, data: &[u8]) -> ContentKey {
        ContentKey(self.key_algorithm.hash(data))
    }

    /// The content key of the chunk `record` describes, if known: its fingerprint when that is
    /// a content key, else the name of its location.
    pub fn key_of(&self, record: &ChunkRecord) -> Option<ContentKey> {
        if record.indexed && self.fingerprints_are_keys {
            return Some(ContentKey(record.fingerprint));
        }
        let slots = self.slots.as_ref()?.lock();
        let index = slots.names.peek(&LocationKey::of(&record.location))?;
        Some(slots.name_keys[index as usize])
    }

    /// True when the chunk `record` describes carries its content key in its record, so its
    /// copy needs no name.
    pub fn needs_name(&self, record_indexed: bool) -> bool {
        !(record_indexed && self.fingerprints_are_keys)
    }

    /// Copies the cached content `key` into `out` and returns true on a hit. `None` (a copy
    /// whose content is not known yet) is a miss.
    pub fn get(&self, key: Option<ContentKey>, out: &mut [u8]) -> bool {
        let Some(slots) = &self.slots else {
            return false;
        };
        let mut slots = slots.lock();
        let slot = key.and_then(|key| slots.policy.get(&key));
        match slot {
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

    /// True when the content is cached (without counting an access).
    pub fn contains(&self, key: ContentKey) -> bool {
        self.slots
            .as_ref()
            .is_some_and(|slots| slots.lock().policy.peek(&key).is_some())
    }

    /// Caches content just read from the media.
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

    /// Records that the copy at `location` holds content `key`.
    pub fn name(&self, location: &ChunkLocation, key: ContentKey) {
        let Some(slots) = &self.slots else {
            return;
        };
        let mut slots = slots.lock();
        let location = LocationKey::of(location);
        if let Some(index) = slots.names.get(&location) {
            // A location's bytes never change, so neither does its key.
            debug_assert_eq!(slots.name_keys[index as usize], key);
            return;
        }
        if let Some(evicted) = slots.names.insert_evicting(&location, SLOT_PENDING) {
            assert_ne!(
                evicted, SLOT_PENDING,
                "the name being inserted is never the victim"
            );
            slots.names_free.push(evicted as u32);
        }
        let index = slots
            .names_free
            .pop()
            .expect("an insertion leaves a free name");
        slots.names.set_value(&location, u64::from(index));
        slots.name_keys[index as usize] = key;
    }

    /// Counts a block written with content `key`: a write hit when that content is cached,
    /// which is then as recently used as a read hit would make it.
    pub fn note_write(&self, key: ContentKey) {
        let Some(slots) = &self.slots else {
            return;
        };
        let mut slots = slots.lock();
        slots.write_lookups += 1;
        if slots.policy.get(&key).is_some() {
            slots.write_hits += 1;
        }
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
            write_hits: slots.write_hits,
            write_lookups: slots.write_lookups,
            names: slots.names.len() as u64,
            names_limit: slots.names.entries_limit() as u64,
            memory_bytes: (slots.data.len()
                + slots.lengths.len() * 2
                + slots.policy.memory_bytes()
                + slots.name_keys.len() * std::mem::size_of::<ContentKey>()
                + slots.names.memory_bytes()) as u64,
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

    fn key(index: u64) -> ContentKey {
        ContentKey(FingerprintAlgorithm::Blake3.hash(&index.to_le_bytes()))
    }

    /// Goal: cached chunks come back byte-exact; the budget bounds the entries; evicted slots
    /// are reused without mixing data (each slot's bytes always match its key).
    #[test]
    fn caches_within_budget_without_mixing_data() {
        for policy in ["arc", "lru", "lfu"] {
            let cache = ContentCache::new(64 * 4096, policy, FingerprintAlgorithm::Blake3).unwrap();
            let limit = cache.stats().entries_limit;
            assert!(limit > 0 && cache.stats().memory_bytes <= 64 * 4096);
            // A hot set that fits, interleaved with a scan that does not: the hot set must
            // hit, and the scan's evictions must never mix up slots.
            for round in 0..3u64 {
                for index in (0..200u64).flat_map(|scan| [scan % 16, 1000 + scan]) {
                    let data = vec![(index % 251) as u8; 4096];
                    let mut out = vec![0u8; 4096];
                    if cache.get(Some(key(index)), &mut out) {
                        assert_eq!(out, data, "policy {policy} round {round}");
                    } else {
                        cache.insert(key(index), &data);
                    }
                }
            }
            let stats = cache.stats();
            assert!(stats.entries <= limit);
            assert!(stats.hits > 0);
        }
        let blake3 = FingerprintAlgorithm::Blake3;
        assert!(!ContentCache::new(0, "arc", blake3).unwrap().enabled());
        assert!(ContentCache::new(1 << 20, "fifo", blake3).is_err());
    }

    /// Goal: names map locations to content keys within their limit, the oldest leaving first,
    /// and a weak store fingerprint is never taken for a content key. Method: more names than
    /// the limit; a record of an indexed chunk under a strong and under a weak fingerprint.
    #[test]
    fn names_are_bounded_and_weak_fingerprints_are_not_keys() {
        let cache = ContentCache::new(64 * 4096, "arc", FingerprintAlgorithm::Blake3).unwrap();
        let limit = cache.stats().names_limit;
        assert!(limit >= 4 * cache.stats().entries_limit);
        let exact = ContentCache::memory_bytes_for(100, CachePolicy::Arc);
        let sized = ContentCache::new(exact, "arc", FingerprintAlgorithm::Blake3).unwrap();
        assert_eq!(sized.stats().entries_limit, 100);
        assert!(sized.stats().memory_bytes <= exact);
        for index in 0..limit * 2 {
            cache.name(&location(index, 0), key(index));
        }
        assert_eq!(cache.stats().names, limit);
        let mut record = ChunkRecord {
            location: location(limit * 2 - 1, 0),
            ..ChunkRecord::default()
        };
        assert_eq!(cache.key_of(&record), Some(key(limit * 2 - 1)));
        record.location = location(0, 0);
        assert_eq!(cache.key_of(&record), None, "the oldest name left");
        record.indexed = true;
        record.fingerprint = key(5).0;
        assert_eq!(cache.key_of(&record), Some(key(5)));
        let weak = ContentCache::new(64 * 4096, "arc", FingerprintAlgorithm::Crc32c).unwrap();
        assert_eq!(weak.key_algorithm(), FingerprintAlgorithm::Blake3);
        assert_eq!(weak.key_of(&record), None);
    }
}
