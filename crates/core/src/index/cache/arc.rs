//! [`ArcCache`]: adaptive replacement (Megiddo and Modha, FAST 2003) with the prefetch rules
//! of paper 1 §4.4.
//!
//! Terms: `c` is the entry limit. Resident entries live in T1 (seen once recently) or T2 (seen
//! at least twice); the ghost lists B1 and B2 remember entries recently evicted from T1 and T2
//! (their key's 64-bit prefix only). `p` is the adaptive target size of T1: a demand hit in B1
//! means T1 was too small and raises `p`, a hit in B2 lowers it. Invariants (asserted):
//! `|T1| + |T2| <= c`, `|T1| + |B1| <= c`, `|T1| + |T2| + |B1| + |B2| <= 2c`.
//!
//! Prefetched entries (paper 1 §4.4, which follows Butt et al.'s buffer-cache study):
//! 1. a prefetched entry that is in no list enters the front of T1 with a *prefetched* flag;
//! 2. a prefetched entry found in B1 or B2 enters T1 (flagged), never T2, and does not adapt
//!    `p` (a prefetch is not evidence that the list was too small);
//! 3. the first demand access to a flagged entry clears the flag and leaves the entry in T1
//!    (at its front): together with the prefetch it is one reference, not two, so it does not
//!    yet deserve T2. A later demand access moves it to T2 as for any entry. This is how the
//!    paper's rule "the flag ensures that we do not move this prefetched entry to the T2 list
//!    on the next on-demand access" and "if prefetched correctly, it gets moved to T2 on
//!    subsequent on-demand access" fit together;
//! 4. a flagged entry (prefetched, never used) that is evicted leaves no ghost.

use super::table::{List, Slab, SlotTable};
use super::{CacheKey, Entries, EntryCache, Residents};
use crate::fingerprint::Fingerprint;

const IN_T1: u32 = 1;
const IN_T2: u32 = 2;
const PREFETCHED: u32 = 4;
const LIST_BITS: u32 = IN_T1 | IN_T2;

const IN_B1: u32 = 1;
const IN_B2: u32 = 2;

/// A ghost: the first eight bytes of an evicted entry's fingerprint and its list.
#[derive(Clone, Copy, Debug)]
struct Ghost {
    prefix: u64,
    list: u32,
}

/// Lengths of the four ARC lists and the target `p`, for statistics and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ArcLengths {
    pub t1: usize,
    pub t2: usize,
    pub b1: usize,
    pub b2: usize,
    pub target_t1: usize,
}

/// Adaptive replacement; see the module documentation.
#[derive(Debug)]
pub struct ArcCache<K = Fingerprint> {
    pub(super) residents: Residents<K>,
    t1: List,
    t2: List,
    ghosts: Slab<Ghost>,
    ghost_table: SlotTable,
    b1: List,
    b2: List,
    /// Target size of T1 (`p` in the ARC paper), in entries.
    target_t1: usize,
    entries_limit: usize,
}

impl<K: CacheKey> ArcCache<K> {
    /// A cache of at most `entries_limit` entries (at least one); memory for as many ghosts
    /// is reserved too.
    pub fn new(entries_limit: usize) -> Self {
        assert!(entries_limit > 0, "a cache holds at least one entry");
        ArcCache {
            residents: Residents::new(entries_limit),
            t1: List::default(),
            t2: List::default(),
            ghosts: Slab::with_capacity(entries_limit),
            ghost_table: SlotTable::for_entries(entries_limit),
            b1: List::default(),
            b2: List::default(),
            target_t1: 0,
            entries_limit,
        }
    }

    /// Bytes of memory a cache of `entries_limit` entries holds.
    pub const fn memory_bytes_for(entries_limit: usize) -> usize {
        Residents::<K>::memory_bytes_for(entries_limit)
            + Slab::<Ghost>::bytes_for(entries_limit)
            + SlotTable::bytes_for(entries_limit)
    }

    /// The list lengths and the adaptive target.
    pub fn lengths(&self) -> ArcLengths {
        ArcLengths {
            t1: self.t1.len(),
            t2: self.t2.len(),
            b1: self.b1.len(),
            b2: self.b2.len(),
            target_t1: self.target_t1,
        }
    }

    /// The resident entries as (key, value), in two lists: T2 (seen at least twice) and T1
    /// (seen once lately), each most recently used first. Selective duplication reads an ARC
    /// of days this way (paper 4 §3.4): its T2 holds the content used on several days.
    pub fn entries_by_list(&self) -> (Entries<K>, Entries<K>) {
        let slab = &self.residents.slab;
        let entries = |list: &List| -> Entries<K> {
            list.indices(slab)
                .into_iter()
                .map(|index| {
                    let entry = slab.item(index);
                    (entry.key, entry.value)
                })
                .collect()
        };
        (entries(&self.t2), entries(&self.t1))
    }

    /// Where `key` is: "T1", "T1 prefetched", "T2", "B1", "B2" or "absent" (tests).
    #[cfg(test)]
    pub(crate) fn place(&self, key: &K) -> &'static str {
        if let Some(index) = self.residents.find(key) {
            let state = self.residents.slab.item(index).state;
            return match (state & LIST_BITS, state & PREFETCHED != 0) {
                (IN_T1, false) => "T1",
                (IN_T1, true) => "T1 prefetched",
                (IN_T2, _) => "T2",
                _ => unreachable!("resident entries are in T1 or T2"),
            };
        }
        match self.find_ghost(key) {
            Some(index) if self.ghosts.item(index).list == IN_B1 => "B1",
            Some(_) => "B2",
            None => "absent",
        }
    }

    fn find_ghost(&self, key: &K) -> Option<u32> {
        let prefix = key.prefix_u64();
        self.ghost_table
            .find(prefix, |index| self.ghosts.item(index).prefix == prefix)
    }

    fn check_invariants(&self) {
        let c = self.entries_limit;
        assert!(self.t1.len() + self.t2.len() <= c);
        assert!(self.t1.len() + self.b1.len() <= c);
        assert!(self.t1.len() + self.t2.len() + self.b1.len() + self.b2.len() <= 2 * c);
        assert!(self.target_t1 <= c);
    }

    fn resident_len(&self) -> usize {
        self.t1.len() + self.t2.len()
    }

    /// A demand hit on resident node `index`.
    #[inline]
    fn hit(&mut self, index: u32) {
        let state = self.residents.slab.item(index).state;
        if state & IN_T2 != 0 {
            self.t2.move_to_front(&mut self.residents.slab, index);
        } else if state & PREFETCHED != 0 {
            // Rule 3: the first use of a prefetched entry is its first reference.
            self.residents.slab.item_mut(index).state = IN_T1;
            self.t1.move_to_front(&mut self.residents.slab, index);
        } else {
            self.t1.unlink(&mut self.residents.slab, index);
            self.residents.slab.item_mut(index).state = IN_T2;
            self.t2.push_front(&mut self.residents.slab, index);
        }
    }

    fn remove_ghost(&mut self, index: u32) -> u32 {
        let ghost = *self.ghosts.item(index);
        match ghost.list {
            IN_B1 => self.b1.unlink(&mut self.ghosts, index),
            _ => self.b2.unlink(&mut self.ghosts, index),
        }
        self.ghost_table.remove(ghost.prefix, index);
        self.ghosts.release(index);
        ghost.list
    }

    fn drop_back_ghost(&mut self, list: u32) {
        let back = match list {
            IN_B1 => self.b1.back(),
            _ => self.b2.back(),
        };
        let index = back.expect("the ghost list to shorten is not empty");
        self.remove_ghost(index);
    }

    /// Evicts one resident entry into a ghost list (ARC's REPLACE). `requested_in_b2` says the
    /// entry being brought in was found in B2.
    fn replace(&mut self, requested_in_b2: bool) {
        let t1_len = self.t1.len();
        let t1_over_target =
            (requested_in_b2 && t1_len == self.target_t1) || t1_len > self.target_t1;
        let from_t1 = (t1_len >= 1 && t1_over_target) || self.t2.is_empty();
        let (victim, ghost_list) = if from_t1 {
            let victim = self.t1.back().expect("T1 holds the victim");
            self.t1.unlink(&mut self.residents.slab, victim);
            (victim, IN_B1)
        } else {
            let victim = self.t2.back().expect("T2 holds the victim");
            self.t2.unlink(&mut self.residents.slab, victim);
            (victim, IN_B2)
        };
        let entry = self.residents.delete(victim);
        if entry.state & PREFETCHED != 0 {
            // Rule 4: a prefetch that was never used leaves no history.
            return;
        }
        let prefix = entry.key.prefix_u64();
        let ghost = self.ghosts.allocate(Ghost {
            prefix,
            list: ghost_list,
        });
        self.ghost_table.insert(prefix, ghost);
        match ghost_list {
            IN_B1 => self.b1.push_front(&mut self.ghosts, ghost),
            _ => self.b2.push_front(&mut self.ghosts, ghost),
        }
    }

    /// Makes room for an entry in no list (ARC's case IV) and adds it to the front of T1.
    fn admit_to_t1(&mut self, key: &K, value: u64, state: u32) {
        let c = self.entries_limit;
        if self.t1.len() + self.b1.len() == c {
            if self.t1.len() < c {
                self.drop_back_ghost(IN_B1);
                if self.resident_len() == c {
                    self.replace(false);
                }
            } else {
                // T1 alone fills the cache: its back entry leaves without a ghost, as in ARC.
                let victim = self.t1.back().expect("T1 is full");
                self.t1.unlink(&mut self.residents.slab, victim);
                self.residents.delete(victim);
            }
        } else {
            let total = self.resident_len() + self.b1.len() + self.b2.len();
            if total >= c {
                if total == 2 * c {
                    self.drop_back_ghost(IN_B2);
                }
                if self.resident_len() == c {
                    self.replace(false);
                }
            }
        }
        // Removals and unused prefetches can leave the cache below its limit while ghosts
        // exist, which is why `replace` above runs only when the cache is full.
        assert!(self.resident_len() < c);
        let index = self.residents.add(key, value, state);
        self.t1.push_front(&mut self.residents.slab, index);
        self.check_invariants();
    }

    /// A demand access to an entry found in ghost list `list` (ARC's cases II and III).
    fn admit_from_ghost(&mut self, key: &K, value: u64, list: u32) {
        let (b1, b2) = (self.b1.len().max(1), self.b2.len().max(1));
        if list == IN_B1 {
            let step = if self.b1.len() >= self.b2.len() {
                1
            } else {
                b2 / b1
            };
            self.target_t1 = (self.target_t1 + step).min(self.entries_limit);
        } else {
            let step = if self.b2.len() >= self.b1.len() {
                1
            } else {
                b1 / b2
            };
            self.target_t1 = self.target_t1.saturating_sub(step);
        }
        let ghost = self.find_ghost(key).expect("ghost present");
        self.remove_ghost(ghost);
        if self.resident_len() == self.entries_limit {
            self.replace(list == IN_B2);
        }
        let index = self.residents.add(key, value, IN_T2);
        self.t2.push_front(&mut self.residents.slab, index);
        self.check_invariants();
    }
}

impl<K: CacheKey> EntryCache<K> for ArcCache<K> {
    #[inline]
    fn get(&mut self, key: &K) -> Option<u64> {
        let index = self.residents.find(key)?;
        self.hit(index);
        Some(self.residents.slab.item(index).value)
    }

    #[inline]
    fn peek(&self, key: &K) -> Option<u64> {
        let index = self.residents.find(key)?;
        Some(self.residents.slab.item(index).value)
    }

    fn insert(&mut self, key: &K, value: u64) {
        if let Some(index) = self.residents.find(key) {
            self.residents.slab.item_mut(index).value = value;
            self.hit(index);
            return;
        }
        match self.find_ghost(key) {
            Some(ghost) => {
                let list = self.ghosts.item(ghost).list;
                self.admit_from_ghost(key, value, list);
            }
            None => self.admit_to_t1(key, value, IN_T1),
        }
    }

    fn prefetch(&mut self, key: &K, value: u64) {
        if let Some(index) = self.residents.find(key) {
            self.residents.slab.item_mut(index).value = value;
            return;
        }
        // Rule 2: a remembered entry comes back through T1 without adapting the target.
        if let Some(ghost) = self.find_ghost(key) {
            self.remove_ghost(ghost);
        }
        self.admit_to_t1(key, value, IN_T1 | PREFETCHED);
    }

    fn remove(&mut self, key: &K) -> Option<u64> {
        let Some(index) = self.residents.find(key) else {
            if let Some(ghost) = self.find_ghost(key) {
                self.remove_ghost(ghost);
            }
            return None;
        };
        match self.residents.slab.item(index).state & LIST_BITS {
            IN_T1 => self.t1.unlink(&mut self.residents.slab, index),
            _ => self.t2.unlink(&mut self.residents.slab, index),
        }
        Some(self.residents.delete(index).value)
    }

    fn len(&self) -> usize {
        self.residents.len()
    }

    fn entries_limit(&self) -> usize {
        self.entries_limit
    }

    fn memory_bytes(&self) -> usize {
        self.residents.memory_bytes() + self.ghosts.memory_bytes() + self.ghost_table.memory_bytes()
    }

    fn clear(&mut self) {
        self.residents.clear();
        self.ghosts.clear();
        self.ghost_table.clear();
        self.t1 = List::default();
        self.t2 = List::default();
        self.b1 = List::default();
        self.b2 = List::default();
        self.target_t1 = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::cache::conformance::fingerprint;
    use crate::index::cache::LruCache;

    fn demand(cache: &mut impl EntryCache, n: u64) -> bool {
        let hit = cache.get(&fingerprint(n)).is_some();
        if !hit {
            cache.insert(&fingerprint(n), n);
        }
        hit
    }

    /// Goal: a hit in B1 raises the target size of T1 and a hit in B2 lowers it. Method: a
    /// four-entry cache driven into each ghost list, with the target read after each hit.
    #[test]
    fn target_adapts_to_ghost_hits() {
        let mut cache = ArcCache::new(4);
        for n in 0..4 {
            demand(&mut cache, n);
        }
        demand(&mut cache, 0);
        demand(&mut cache, 1);
        // T2 = {1, 0}, T1 = {3, 2}; two new entries push 2 and 3 into B1.
        demand(&mut cache, 10);
        demand(&mut cache, 11);
        assert_eq!(cache.place(&fingerprint(2)), "B1");
        assert_eq!(cache.lengths().target_t1, 0);
        assert!(!demand(&mut cache, 2));
        assert_eq!(cache.place(&fingerprint(2)), "T2");
        let raised = cache.lengths().target_t1;
        assert!(raised >= 1, "a B1 hit raises p: {:?}", cache.lengths());
        // With p >= 1 and T1 short, REPLACE now takes from T2: its victims reach B2.
        for n in 20..26 {
            demand(&mut cache, n);
        }
        let in_b2 = [0, 1, 2]
            .into_iter()
            .find(|&n| cache.place(&fingerprint(n)) == "B2")
            .expect("a T2 entry was demoted to B2");
        demand(&mut cache, in_b2);
        assert!(
            cache.lengths().target_t1 < raised,
            "a B2 hit lowers p: {:?}",
            cache.lengths()
        );
    }

    /// Goal: `entries_by_list` lists T2 and T1 apart, each most recent first, with their
    /// values. Method: four entries, two of them used twice.
    #[test]
    fn entries_by_list_shows_both_lists() {
        let mut cache = ArcCache::new(4);
        for n in 0..4 {
            demand(&mut cache, n);
        }
        demand(&mut cache, 1);
        demand(&mut cache, 3);
        let (t2, t1) = cache.entries_by_list();
        assert_eq!(t2, vec![(fingerprint(3), 3), (fingerprint(1), 1)]);
        assert_eq!(t1, vec![(fingerprint(2), 2), (fingerprint(0), 0)]);
    }

    /// Goal: paper 1 §4.4 rules 1 and 3: a prefetched entry enters T1 flagged, its first
    /// demand access keeps it in T1, the second moves it to T2.
    #[test]
    fn prefetched_entries_reach_t2_on_second_use() {
        let mut cache = ArcCache::new(4);
        cache.prefetch(&fingerprint(1), 1);
        assert_eq!(cache.place(&fingerprint(1)), "T1 prefetched");
        assert_eq!(cache.get(&fingerprint(1)), Some(1));
        assert_eq!(cache.place(&fingerprint(1)), "T1");
        assert_eq!(cache.get(&fingerprint(1)), Some(1));
        assert_eq!(cache.place(&fingerprint(1)), "T2");
        // A demand-inserted entry reaches T2 on its first re-use, for comparison.
        cache.insert(&fingerprint(2), 2);
        cache.get(&fingerprint(2));
        assert_eq!(cache.place(&fingerprint(2)), "T2");
    }

    /// Goal: rule 2: a prefetch of an entry remembered in B1 or B2 goes to T1, not T2, and
    /// leaves the target unchanged.
    #[test]
    fn prefetch_from_ghost_lists_goes_to_t1() {
        let mut cache = ArcCache::new(4);
        for n in 0..4 {
            demand(&mut cache, n);
        }
        demand(&mut cache, 0);
        demand(&mut cache, 1);
        demand(&mut cache, 10);
        demand(&mut cache, 11);
        assert_eq!(cache.place(&fingerprint(2)), "B1");
        let target = cache.lengths().target_t1;
        cache.prefetch(&fingerprint(2), 2);
        assert_eq!(cache.place(&fingerprint(2)), "T1 prefetched");
        assert_eq!(cache.lengths().target_t1, target);

        let mut cache = ArcCache::new(2);
        demand(&mut cache, 0);
        demand(&mut cache, 0);
        demand(&mut cache, 1);
        demand(&mut cache, 1);
        demand(&mut cache, 2);
        assert_eq!(cache.place(&fingerprint(0)), "B2");
        cache.prefetch(&fingerprint(0), 0);
        assert_eq!(cache.place(&fingerprint(0)), "T1 prefetched");
    }

    /// Goal: rule 4: a prefetched entry evicted before any use leaves no ghost, while a used
    /// one does. Method: a two-entry cache pushed past its limit.
    #[test]
    fn unused_prefetches_leave_no_ghost() {
        let mut cache = ArcCache::new(2);
        demand(&mut cache, 0);
        demand(&mut cache, 0);
        cache.prefetch(&fingerprint(1), 1);
        demand(&mut cache, 2);
        assert_eq!(cache.place(&fingerprint(1)), "absent");
        assert_eq!(cache.lengths().b1, 0);
        demand(&mut cache, 3);
        assert_eq!(
            cache.place(&fingerprint(2)),
            "B1",
            "a used entry leaves a ghost"
        );
    }

    /// Goal: ARC resists scans where LRU does not. Method: each round uses a hot set of half
    /// the cache twice, then scans never-repeated entries twice the cache size; the hit rate
    /// of the first use of the hot set after each scan is compared.
    #[test]
    fn arc_resists_scans_better_than_lru() {
        fn hot_hit_rate(cache: &mut impl EntryCache) -> f64 {
            let (hot, scan, rounds) = (50u64, 200u64, 40u64);
            let (mut hits, mut accesses) = (0u64, 0u64);
            let mut next_unique = 1_000_000u64;
            for round in 0..rounds {
                for n in 0..hot {
                    let hit = demand(cache, n);
                    if round > 0 {
                        accesses += 1;
                        hits += hit as u64;
                    }
                }
                for n in 0..hot {
                    demand(cache, n);
                }
                for _ in 0..scan {
                    demand(cache, next_unique);
                    next_unique += 1;
                }
            }
            hits as f64 / accesses as f64
        }
        let arc = hot_hit_rate(&mut ArcCache::new(100));
        let lru = hot_hit_rate(&mut LruCache::new(100));
        assert!(lru < 0.05, "LRU loses the hot set to every scan: {lru}");
        assert!(arc > 0.9, "ARC keeps the hot set in T2: {arc}");
    }
}
