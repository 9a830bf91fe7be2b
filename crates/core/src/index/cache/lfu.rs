//! [`LfuCache`]: evicts the least frequently used entry (paper 5 §3.6), in O(1).
//!
//! Every entry has a use counter, incremented on each demand access. Entries with equal
//! counts form a *frequency group*; groups are linked in increasing order of frequency, and
//! each group lists its entries from most to least recently used. Eviction takes the least
//! recently used entry of the lowest group, so ties are broken by recency. An access moves the
//! entry to the group of the next frequency (created next to its own group when missing), so
//! every operation touches a constant number of nodes (the O(1) LFU scheme of Shah, Mitra and
//! Matani, 2010).
//!
//! Demand inserts start at frequency 1; prefetched entries start at 0, so a prefetch that is
//! never used is the first to go. Counters saturate at `u32::MAX`. LFU has no aging: an entry
//! that was popular long ago stays; paper 5 notes that a mix of LFU and LRU would fix this, and
//! ARC is that mix here.

use super::table::{List, Slab};
use super::{CacheKey, EntryCache, Residents};
use crate::fingerprint::Fingerprint;

const DEMAND_FREQUENCY: u32 = 1;
const PREFETCH_FREQUENCY: u32 = 0;

#[derive(Clone, Copy, Debug)]
struct Group {
    frequency: u32,
    members: List,
}

/// Least frequently used replacement; see the module documentation.
#[derive(Debug)]
pub struct LfuCache<K = Fingerprint> {
    pub(super) residents: Residents<K>,
    /// Groups, linked front (lowest frequency) to back (highest).
    groups: Slab<Group>,
    order: List,
    entries_limit: usize,
}

impl<K: CacheKey> LfuCache<K> {
    /// A cache of at most `entries_limit` entries (at least one). There is at most one group
    /// per entry, so as many groups are reserved.
    pub fn new(entries_limit: usize) -> Self {
        assert!(entries_limit > 0, "a cache holds at least one entry");
        LfuCache {
            residents: Residents::new(entries_limit),
            groups: Slab::with_capacity(entries_limit),
            order: List::default(),
            entries_limit,
        }
    }

    /// Bytes of memory a cache of `entries_limit` entries holds.
    pub const fn memory_bytes_for(entries_limit: usize) -> usize {
        Residents::<K>::memory_bytes_for(entries_limit) + Slab::<Group>::bytes_for(entries_limit)
    }

    /// The use counter of a cached entry (for statistics and tests).
    pub fn frequency(&self, key: &K) -> Option<u32> {
        let index = self.residents.find(key)?;
        let group = self.residents.slab.item(index).state;
        Some(self.groups.item(group).frequency)
    }

    /// Unlinks resident `index` from its group, releasing the group when it empties.
    fn leave_group(&mut self, index: u32) {
        let group = self.residents.slab.item(index).state;
        let members = &mut self.groups.item_mut(group).members;
        members.unlink(&mut self.residents.slab, index);
        if members.is_empty() {
            self.order.unlink(&mut self.groups, group);
            self.groups.release(group);
        }
    }

    /// Links resident `index` at the front of group `group`.
    fn join_group(&mut self, index: u32, group: u32) {
        self.residents.slab.item_mut(index).state = group;
        let mut members = self.groups.item(group).members;
        members.push_front(&mut self.residents.slab, index);
        self.groups.item_mut(group).members = members;
    }

    fn new_group(&mut self, frequency: u32) -> u32 {
        self.groups.allocate(Group {
            frequency,
            members: List::default(),
        })
    }

    /// A demand access to resident `index`: its counter goes up by one.
    #[inline]
    fn touch(&mut self, index: u32) {
        let group = self.residents.slab.item(index).state;
        let Group { frequency, members } = *self.groups.item(group);
        let Some(next_frequency) = frequency.checked_add(1) else {
            // Saturated: only recency changes.
            let mut members = members;
            members.move_to_front(&mut self.residents.slab, index);
            self.groups.item_mut(group).members = members;
            return;
        };
        let next = self.order_next(group);
        let next_matches =
            next.is_some_and(|next| self.groups.item(next).frequency == next_frequency);
        if members.len() == 1 && !next_matches {
            // Alone in its group: raising the group's frequency keeps the order.
            self.groups.item_mut(group).frequency = next_frequency;
            return;
        }
        let target = match next {
            Some(next) if next_matches => next,
            _ => {
                let created = self.new_group(next_frequency);
                self.order.insert_after(&mut self.groups, group, created);
                created
            }
        };
        self.leave_group(index);
        self.join_group(index, target);
    }

    fn order_next(&self, group: u32) -> Option<u32> {
        let next = self.groups.next_of(group);
        (next != super::table::NIL).then_some(next)
    }

    fn evict(&mut self) {
        let lowest = self.order.front().expect("a full cache has groups");
        let victim = self
            .groups
            .item(lowest)
            .members
            .back()
            .expect("groups are never empty");
        self.leave_group(victim);
        self.residents.delete(victim);
    }

    fn add(&mut self, key: &K, value: u64, frequency: u32) {
        if self.residents.len() == self.entries_limit {
            self.evict();
        }
        // The new entry's group is among the first two: frequencies start at 0 or 1.
        let mut before = None;
        let mut cursor = self.order.front();
        while let Some(group) = cursor {
            if self.groups.item(group).frequency >= frequency {
                break;
            }
            before = Some(group);
            cursor = self.order_next(group);
        }
        let group = match cursor {
            Some(group) if self.groups.item(group).frequency == frequency => group,
            _ => {
                let created = self.new_group(frequency);
                match before {
                    Some(before) => self.order.insert_after(&mut self.groups, before, created),
                    None => self.order.push_front(&mut self.groups, created),
                }
                created
            }
        };
        let index = self.residents.add(key, value, group);
        self.join_group(index, group);
        assert!(self.residents.len() <= self.entries_limit);
        assert!(self.groups.len() <= self.residents.len());
    }
}

impl<K: CacheKey> EntryCache<K> for LfuCache<K> {
    #[inline]
    fn get(&mut self, key: &K) -> Option<u64> {
        let index = self.residents.find(key)?;
        self.touch(index);
        Some(self.residents.slab.item(index).value)
    }

    #[inline]
    fn peek(&self, key: &K) -> Option<u64> {
        let index = self.residents.find(key)?;
        Some(self.residents.slab.item(index).value)
    }

    fn insert(&mut self, key: &K, value: u64) {
        match self.residents.find(key) {
            Some(index) => {
                self.residents.slab.item_mut(index).value = value;
                self.touch(index);
            }
            None => self.add(key, value, DEMAND_FREQUENCY),
        }
    }

    fn prefetch(&mut self, key: &K, value: u64) {
        match self.residents.find(key) {
            Some(index) => self.residents.slab.item_mut(index).value = value,
            None => self.add(key, value, PREFETCH_FREQUENCY),
        }
    }

    fn remove(&mut self, key: &K) -> Option<u64> {
        let index = self.residents.find(key)?;
        self.leave_group(index);
        Some(self.residents.delete(index).value)
    }

    fn len(&self) -> usize {
        self.residents.len()
    }

    fn entries_limit(&self) -> usize {
        self.entries_limit
    }

    fn memory_bytes(&self) -> usize {
        self.residents.memory_bytes() + self.groups.memory_bytes()
    }

    fn clear(&mut self) {
        self.residents.clear();
        self.groups.clear();
        self.order = List::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::cache::conformance::fingerprint;

    /// Goal: LFU keeps frequently used entries and breaks ties by recency. Method: a
    /// three-entry cache with known use counts.
    #[test]
    fn keeps_frequent_entries() {
        let mut cache = LfuCache::new(3);
        cache.insert(&fingerprint(0), 0);
        for _ in 0..3 {
            cache.get(&fingerprint(0));
        }
        cache.insert(&fingerprint(1), 1);
        cache.get(&fingerprint(1));
        cache.insert(&fingerprint(2), 2);
        assert_eq!(cache.frequency(&fingerprint(0)), Some(4));
        assert_eq!(cache.frequency(&fingerprint(1)), Some(2));
        cache.insert(&fingerprint(3), 3);
        assert_eq!(cache.peek(&fingerprint(2)), None, "2 was least frequent");
        // 3 is now the only entry used once, so the next newcomer replaces it.
        cache.insert(&fingerprint(4), 4);
        assert_eq!(cache.peek(&fingerprint(3)), None, "3 was least frequent");
        assert_eq!(cache.peek(&fingerprint(0)), Some(0));
        assert_eq!(cache.peek(&fingerprint(1)), Some(1));
    }

    /// Goal: ties are broken by recency: among equal counts the least recently used goes.
    #[test]
    fn ties_go_to_least_recent() {
        let mut cache = LfuCache::new(3);
        for n in 0..3 {
            cache.insert(&fingerprint(n), n);
        }
        for n in [2, 0, 1] {
            cache.get(&fingerprint(n));
        }
        cache.insert(&fingerprint(9), 9);
        assert_eq!(cache.peek(&fingerprint(2)), None);
        assert_eq!(cache.frequency(&fingerprint(9)), Some(1));
    }

    /// Goal: a prefetched entry starts at frequency 0, so it is evicted before used entries,
    /// and its first use brings it to 1.
    #[test]
    fn prefetches_start_lowest() {
        let mut cache = LfuCache::new(2);
        cache.insert(&fingerprint(0), 0);
        cache.prefetch(&fingerprint(1), 1);
        assert_eq!(cache.frequency(&fingerprint(1)), Some(0));
        cache.insert(&fingerprint(2), 2);
        assert_eq!(cache.peek(&fingerprint(1)), None);
        cache.prefetch(&fingerprint(3), 3);
        assert_eq!(cache.get(&fingerprint(3)), Some(3));
        assert_eq!(cache.frequency(&fingerprint(3)), Some(1));
    }
}
