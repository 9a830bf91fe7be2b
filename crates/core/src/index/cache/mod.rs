//! The entry cache: entries (key -> value) kept in memory under a hard memory budget, with a
//! choice of replacement policy. The index keys them by fingerprint; any [`CacheKey`] will do
//! (the block device's content cache keys copies' names by their location).
//!
//! Terms:
//! - *demand access*: a lookup or insert made because a chunk is being written
//!   ([`EntryCache::get`], [`EntryCache::insert`]);
//! - *prefetch*: an entry loaded because a hint says it will be needed soon
//!   ([`EntryCache::prefetch`]); policies treat it differently from a demand access (paper 1
//!   §4.4);
//! - *entry limit*: the number of entries the memory budget allows, derived from the exact
//!   memory each policy allocates per entry ([`CachePolicy::entries_for_budget`]).
//!
//! Policies: [`LruCache`] (least recently used), [`ArcCache`] (adaptive replacement, Megiddo
//! and Modha, with paper 1's prefetch rules) and [`LfuCache`] (least frequently used, paper 5
//! §3.6, ties broken by recency, O(1) per operation). All memory is reserved when the cache is
//! built, so the budget holds at every moment, not on average.
//!
//! Memory per entry of fingerprint keys on x86-64 (the hash table adds 8 bytes per slot at a load of 3/8 to 3/4,
//! so 10.7 to 21.3 bytes per entry). The last column is the measured budget per entry of a
//! 64 MiB cache (`cargo bench -p onecopy-core --bench index` prints it):
//!
//! | policy | per entry | why | 64 MiB |
//! | --- | --- | --- | --- |
//! | LRU | 56 + table | fingerprint (32), value (8), state (4), list links (8), padding | 74.7 B (898,779 entries) |
//! | ARC | 56 + 24 + 2 tables | a resident entry plus room for one ghost (8-byte fingerprint prefix, list, links) | 106.7 B (629,145) |
//! | LFU | 56 + 24 + table | a resident entry plus a frequency group in the worst case | 91.4 B (734,003) |
//!
//! **Lookup cost.** A hit reads one slot of the slot table (8 bytes, random) and then the
//! entry's slab node. Slab nodes are handed out in insertion order (and an LRU eviction frees
//! the node the next insertion takes), so lookups that follow an earlier insertion stream, as
//! a repeated backup does, read nodes almost sequentially and the list neighbours they relink
//! are the nodes read next. In random order a hit reads two unrelated lines (slot, node)
//! and relinks two more (the list neighbours).
//!
//! Ghost entries of ARC keep only the key's 64-bit prefix ([`CacheKey::prefix_u64`], the first
//! 8 bytes of a fingerprint): a ghost hit only steers the policy, so a (2^-64) false match
//! costs nothing but a slightly different decision.

mod arc;
mod lfu;
mod lru;
mod table;

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

pub use arc::ArcCache;
pub use lfu::LfuCache;
pub use lru::LruCache;

use crate::fingerprint::Fingerprint;
use crate::{Error, Result};
use table::{Slab, SlotTable};

/// What a cache is keyed by. The index keys its caches by [`Fingerprint`]; a cache of other
/// content (the block device's content cache names copies by where they are stored) brings its own
/// key type and gets the same policies.
///
/// Contract: [`CacheKey::prefix_u64`] is a well-mixed 64-bit summary of the key (the hash
/// tables index by its bits), and two keys with the same summary are treated as one by ARC's
/// ghost lists, which keep only the summary: a false match there only steers the policy.
pub trait CacheKey: Copy + Eq + fmt::Debug {
    /// The key's well-mixed 64-bit summary.
    fn prefix_u64(&self) -> u64;
}

impl CacheKey for Fingerprint {
    #[inline]
    fn prefix_u64(&self) -> u64 {
        Fingerprint::prefix_u64(self)
    }
}

/// A bounded map from keys (fingerprints unless said otherwise) to values with a replacement
/// policy.
///
/// Contract shared by every implementation (checked by one conformance suite):
/// `len() <= entries_limit()` and `memory_bytes() <= ` the budget it was built with, at all
/// times; a value read back is the last one inserted for that fingerprint unless the entry was
/// evicted or removed; `peek` never changes what the policy will evict next.
pub trait EntryCache<K = Fingerprint> {
    /// The cached value, counting a demand access.
    fn get(&mut self, key: &K) -> Option<u64>;

    /// The cached value, without counting an access.
    fn peek(&self, key: &K) -> Option<u64>;

    /// Stores `value` for `key` (replacing any cached value) as a demand access; may
    /// evict another entry.
    fn insert(&mut self, key: &K, value: u64);

    /// Stores an entry loaded by a prefetch. A cached entry only has its value replaced; a new
    /// one is placed as the policy says for prefetched entries (paper 1 §4.4).
    fn prefetch(&mut self, key: &K, value: u64);

    /// Removes the entry (and any policy history of it); returns its value if it was cached.
    fn remove(&mut self, key: &K) -> Option<u64>;

    /// Entries cached now.
    fn len(&self) -> usize;

    /// True when nothing is cached.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Most entries this cache ever holds.
    fn entries_limit(&self) -> usize;

    /// Bytes of memory held (fixed at construction).
    fn memory_bytes(&self) -> usize;

    /// Forgets every entry and all policy history.
    fn clear(&mut self);
}

/// A replacement policy, as named in options and on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum CachePolicy {
    /// Least recently used.
    Lru,
    /// Adaptive replacement cache (the default: it resists scans and adapts to the workload).
    #[default]
    Arc,
    /// Least frequently used, ties broken by recency.
    Lfu,
}

impl CachePolicy {
    /// Every policy.
    pub const ALL: [CachePolicy; 3] = [CachePolicy::Lru, CachePolicy::Arc, CachePolicy::Lfu];

    /// The name used in options and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            CachePolicy::Lru => "lru",
            CachePolicy::Arc => "arc",
            CachePolicy::Lfu => "lfu",
        }
    }

    /// Bytes of memory a cache of this policy holding `entries` fingerprint entries allocates.
    pub fn memory_bytes_for(self, entries: usize) -> usize {
        self.memory_bytes_with_keys::<Fingerprint>(entries)
    }

    /// Bytes of memory a cache of this policy holding `entries` entries keyed by `K`
    /// allocates.
    pub fn memory_bytes_with_keys<K: CacheKey>(self, entries: usize) -> usize {
        match self {
            CachePolicy::Lru => LruCache::<K>::memory_bytes_for(entries),
            CachePolicy::Arc => ArcCache::<K>::memory_bytes_for(entries),
            CachePolicy::Lfu => LfuCache::<K>::memory_bytes_for(entries),
        }
    }

    /// The largest entry limit whose memory fits `memory_bytes_limit` (0 if not even one).
    pub fn entries_for_budget(self, memory_bytes_limit: u64) -> usize {
        self.entries_for_budget_with_keys::<Fingerprint>(memory_bytes_limit)
    }

    /// [`CachePolicy::entries_for_budget`] for entries keyed by `K`.
    pub fn entries_for_budget_with_keys<K: CacheKey>(self, memory_bytes_limit: u64) -> usize {
        let budget = usize::try_from(memory_bytes_limit).unwrap_or(usize::MAX);
        // Memory grows with the entry count, so the limit is found by bisection.
        let (mut fits, mut too_many) = (0usize, table::SLAB_NODES_MAX / 2 + 1);
        if self.memory_bytes_with_keys::<K>(too_many - 1) <= budget {
            return too_many - 1;
        }
        while too_many - fits > 1 {
            let middle = fits + (too_many - fits) / 2;
            if self.memory_bytes_with_keys::<K>(middle) <= budget {
                fits = middle;
            } else {
                too_many = middle;
            }
        }
        fits
    }
}

impl fmt::Display for CachePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for CachePolicy {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        CachePolicy::ALL
            .into_iter()
            .find(|policy| policy.name().eq_ignore_ascii_case(text))
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "unknown cache policy {text:?}; choose lru, arc or lfu"
                ))
            })
    }
}

/// Cached entries as (key, value), in an order the producer states.
pub type Entries<K> = Vec<(K, u64)>;

/// A cache of any policy, dispatched without virtual calls.
#[derive(Debug)]
pub enum Cache<K = Fingerprint> {
    Lru(LruCache<K>),
    Arc(ArcCache<K>),
    Lfu(LfuCache<K>),
}

macro_rules! dispatch {
    ($self:ident, $cache:ident => $body:expr) => {
        match $self {
            Cache::Lru($cache) => $body,
            Cache::Arc($cache) => $body,
            Cache::Lfu($cache) => $body,
        }
    };
}

impl<K: CacheKey> Cache<K> {
    /// A cache of `policy` using at most `memory_bytes_limit` bytes. Fails when the budget
    /// does not fit a single entry.
    pub fn new(policy: CachePolicy, memory_bytes_limit: u64) -> Result<Cache<K>> {
        let entries = policy.entries_for_budget_with_keys::<K>(memory_bytes_limit);
        if entries == 0 {
            return Err(Error::InvalidArgument(format!(
                "a {policy} cache needs at least {} bytes for one entry; {memory_bytes_limit} \
                 bytes were given",
                policy.memory_bytes_with_keys::<K>(1)
            )));
        }
        let cache = Cache::<K>::with_entries(policy, entries);
        assert!(cache.memory_bytes() as u64 <= memory_bytes_limit);
        Ok(cache)
    }

    /// A cache of `policy` holding at most `entries` entries (at least one).
    pub fn with_entries(policy: CachePolicy, entries: usize) -> Cache<K> {
        match policy {
            CachePolicy::Lru => Cache::Lru(LruCache::new(entries)),
            CachePolicy::Arc => Cache::Arc(ArcCache::new(entries)),
            CachePolicy::Lfu => Cache::Lfu(LfuCache::new(entries)),
        }
    }

    /// Inserts like [`EntryCache::insert`] and returns the value of the resident entry the
    /// insertion evicted, if any (an insertion evicts at most one). Caches that keep data
    /// beside the policy, such as the block device's content cache, use it to reuse the
    /// evicted entry's storage.
    pub fn insert_evicting(&mut self, key: &K, value: u64) -> Option<u64> {
        dispatch!(self, cache => cache.residents.last_deleted = None);
        self.insert(key, value);
        dispatch!(self, cache => cache.residents.last_deleted.take().map(|entry| entry.value))
    }

    /// Replaces the value of a cached entry without counting an access; false when the entry
    /// is not cached.
    pub fn set_value(&mut self, key: &K, value: u64) -> bool {
        dispatch!(self, cache => match cache.residents.find(key) {
            Some(index) => {
                cache.residents.slab.item_mut(index).value = value;
                true
            }
            None => false,
        })
    }

    /// Starts loading the memory a lookup of `key` reads first (its slot-table line)
    /// into the processor's caches; changes nothing ([`warm`](crate::index::warm)).
    #[inline]
    pub fn warm(&self, key: &K) {
        dispatch!(self, cache => cache.residents.table.warm(key.prefix_u64()))
    }

    /// For an ARC cache, its resident entries as (key, value) in two lists, T2 (seen at
    /// least twice) and T1 ([`ArcCache::entries_by_list`]); `None` for the other policies.
    pub fn entries_by_list(&self) -> Option<(Entries<K>, Entries<K>)> {
        match self {
            Cache::Arc(cache) => Some(cache.entries_by_list()),
            Cache::Lru(_) | Cache::Lfu(_) => None,
        }
    }

    /// The policy of this cache.
    pub fn policy(&self) -> CachePolicy {
        match self {
            Cache::Lru(_) => CachePolicy::Lru,
            Cache::Arc(_) => CachePolicy::Arc,
            Cache::Lfu(_) => CachePolicy::Lfu,
        }
    }
}

impl<K: CacheKey> EntryCache<K> for Cache<K> {
    #[inline]
    fn get(&mut self, key: &K) -> Option<u64> {
        dispatch!(self, cache => cache.get(key))
    }
    #[inline]
    fn peek(&self, key: &K) -> Option<u64> {
        dispatch!(self, cache => cache.peek(key))
    }
    #[inline]
    fn insert(&mut self, key: &K, value: u64) {
        dispatch!(self, cache => cache.insert(key, value))
    }
    fn prefetch(&mut self, key: &K, value: u64) {
        dispatch!(self, cache => cache.prefetch(key, value))
    }
    fn remove(&mut self, key: &K) -> Option<u64> {
        dispatch!(self, cache => cache.remove(key))
    }
    fn len(&self) -> usize {
        dispatch!(self, cache => cache.len())
    }
    fn entries_limit(&self) -> usize {
        dispatch!(self, cache => cache.entries_limit())
    }
    fn memory_bytes(&self) -> usize {
        dispatch!(self, cache => cache.memory_bytes())
    }
    fn clear(&mut self) {
        dispatch!(self, cache => cache.clear())
    }
}

/// A cached entry. `state` belongs to the policy (list membership, flags, frequency group).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Resident<K> {
    pub(crate) key: K,
    pub(crate) value: u64,
    pub(crate) state: u32,
}

/// The resident entries of a cache: a slab of linked nodes and a table finding them by
/// fingerprint. Policies thread their lists through the slab.
#[derive(Debug)]
pub(crate) struct Residents<K> {
    pub(crate) slab: Slab<Resident<K>>,
    table: SlotTable,
    /// The entry most recently deleted, so [`Cache::insert_evicting`] can report evictions.
    last_deleted: Option<Resident<K>>,
}

impl<K: CacheKey> Residents<K> {
    pub(crate) fn new(entries: usize) -> Self {
        Residents {
            slab: Slab::with_capacity(entries),
            table: SlotTable::for_entries(entries),
            last_deleted: None,
        }
    }

    pub(crate) const fn memory_bytes_for(entries: usize) -> usize {
        Slab::<Resident<K>>::bytes_for(entries) + SlotTable::bytes_for(entries)
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        self.slab.memory_bytes() + self.table.memory_bytes()
    }

    pub(crate) fn len(&self) -> usize {
        self.slab.len()
    }

    #[inline]
    pub(crate) fn find(&self, key: &K) -> Option<u32> {
        self.table
            .find(key.prefix_u64(), |index| self.slab.item(index).key == *key)
    }

    /// Adds an absent entry (unlinked) and returns its node.
    pub(crate) fn add(&mut self, key: &K, value: u64, state: u32) -> u32 {
        let index = self.slab.allocate(Resident {
            key: *key,
            value,
            state,
        });
        self.table.insert(key.prefix_u64(), index);
        index
    }

    /// Deletes node `index`, already unlinked from its list; returns the entry.
    pub(crate) fn delete(&mut self, index: u32) -> Resident<K> {
        let entry = *self.slab.item(index);
        self.table.remove(entry.key.prefix_u64(), index);
        self.slab.release(index);
        self.last_deleted = Some(entry);
        entry
    }

    pub(crate) fn clear(&mut self) {
        self.slab.clear();
        self.table.clear();
    }
}

#[cfg(test)]
pub(crate) mod conformance;
