//! [`LruCache`]: evicts the least recently used entry.

use super::table::List;
use super::{CacheKey, EntryCache, Residents};
use crate::fingerprint::Fingerprint;

/// Least recently used replacement. Demand accesses and prefetches alike put the entry at the
/// front (most recent end) of one list, as paper 1 §4.4 does for its LRU cache; the back entry
/// is evicted when a new entry needs room.
#[derive(Debug)]
pub struct LruCache<K = Fingerprint> {
    pub(super) residents: Residents<K>,
    list: List,
    entries_limit: usize,
}

impl<K: CacheKey> LruCache<K> {
    /// A cache of at most `entries_limit` entries (at least one); memory is reserved now.
    pub fn new(entries_limit: usize) -> Self {
        assert!(entries_limit > 0, "a cache holds at least one entry");
        LruCache {
            residents: Residents::new(entries_limit),
            list: List::default(),
            entries_limit,
        }
    }

    /// Bytes of memory a cache of `entries_limit` entries holds.
    pub const fn memory_bytes_for(entries_limit: usize) -> usize {
        Residents::<K>::memory_bytes_for(entries_limit)
    }

    /// Cached keys from most to least recently used (for tests).
    #[cfg(test)]
    pub(crate) fn order(&self) -> Vec<K> {
        self.list
            .indices(&self.residents.slab)
            .into_iter()
            .map(|index| self.residents.slab.item(index).key)
            .collect()
    }

    fn store(&mut self, key: &K, value: u64) {
        if let Some(index) = self.residents.find(key) {
            self.residents.slab.item_mut(index).value = value;
            self.list.move_to_front(&mut self.residents.slab, index);
            return;
        }
        if self.residents.len() == self.entries_limit {
            let victim = self.list.back().expect("a full cache has a back entry");
            self.list.unlink(&mut self.residents.slab, victim);
            self.residents.delete(victim);
        }
        let index = self.residents.add(key, value, 0);
        self.list.push_front(&mut self.residents.slab, index);
        assert!(self.residents.len() <= self.entries_limit);
    }
}

impl<K: CacheKey> EntryCache<K> for LruCache<K> {
    #[inline]
    fn get(&mut self, key: &K) -> Option<u64> {
        let index = self.residents.find(key)?;
        self.list.move_to_front(&mut self.residents.slab, index);
        Some(self.residents.slab.item(index).value)
    }

    #[inline]
    fn peek(&self, key: &K) -> Option<u64> {
        let index = self.residents.find(key)?;
        Some(self.residents.slab.item(index).value)
    }

    fn insert(&mut self, key: &K, value: u64) {
        self.store(key, value);
    }

    fn prefetch(&mut self, key: &K, value: u64) {
        match self.residents.find(key) {
            Some(index) => self.residents.slab.item_mut(index).value = value,
            None => self.store(key, value),
        }
    }

    fn remove(&mut self, key: &K) -> Option<u64> {
        let index = self.residents.find(key)?;
        self.list.unlink(&mut self.residents.slab, index);
        Some(self.residents.delete(index).value)
    }

    fn len(&self) -> usize {
        self.residents.len()
    }

    fn entries_limit(&self) -> usize {
        self.entries_limit
    }

    fn memory_bytes(&self) -> usize {
        self.residents.memory_bytes()
    }

    fn clear(&mut self) {
        self.residents.clear();
        self.list = List::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::cache::conformance::fingerprint;

    /// Goal: LRU keeps recency order and evicts the least recently used entry. Method: a
    /// three-entry cache, accesses in a known order.
    #[test]
    fn evicts_least_recently_used() {
        let mut cache = LruCache::new(3);
        for n in 0..3 {
            cache.insert(&fingerprint(n), n);
        }
        assert_eq!(cache.get(&fingerprint(0)), Some(0));
        assert_eq!(
            cache.order(),
            vec![fingerprint(0), fingerprint(2), fingerprint(1)]
        );
        cache.insert(&fingerprint(3), 3);
        assert_eq!(
            cache.peek(&fingerprint(1)),
            None,
            "1 was least recently used"
        );
        // A prefetch goes to the front like any insert (paper 1 §4.4), and peek changes nothing.
        cache.prefetch(&fingerprint(4), 4);
        assert_eq!(cache.peek(&fingerprint(2)), None);
        assert_eq!(
            cache.order(),
            vec![fingerprint(4), fingerprint(3), fingerprint(0)]
        );
    }
}
