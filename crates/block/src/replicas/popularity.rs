//! Popularity of content over days, for selective duplication (paper 4 §3.4): the paper's
//! duplicator "calculates the list of frequently used content across multiple days by
//! extending the ARC replacement algorithm". Generic over the key (the engine's content keys,
//! the lab's content numbers) and over what a key's *source* is (a chunk holding it, a
//! sector), so the engine and the lab's replay rank the same way.
//!
//! Path:
//! 1. Each read served by the device counts for its content today ([`Popularity::note`]),
//!    within [`Popularity::today_limit`] keys (a key first seen once the limit is reached is
//!    not counted today).
//! 2. At the end of a day ([`Popularity::end_day`]) every key read that day is one access to an
//!    ARC whose time unit is the day: content read on two days moves to its T2, and the ARC
//!    adapts between content read once lately (T1) and content read on several days (T2), as
//!    it does between recency and frequency in a cache. Each resident key also keeps a score:
//!    its reads, halved for every day since they were counted.
//! 3. [`Popularity::ranked`] lists the candidates: T2 before T1 (read on several days first,
//!    the paper's predictor of future reads), each by score, with the source last seen.
//!
//! Not guaranteed: a source may have changed since it was noted (the block overwritten, the
//! chunk freed); the caller checks it before copying.

use std::collections::HashMap;
use std::hash::Hash;

use onecopy_core::index::cache::{Cache, CacheKey, CachePolicy, EntryCache};

/// Value of an ARC entry between its insertion and the assignment of its slot.
const SLOT_PENDING: u64 = u64::MAX;

/// What the ARC of days keeps per key.
#[derive(Clone, Copy, Debug)]
struct DayEntry<S> {
    /// Reads, halved for every day since `day`.
    score: f64,
    /// The day the score was last brought up to date.
    day: u32,
    source: S,
}

/// One candidate for duplication.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate<K, S> {
    pub key: K,
    pub source: S,
    /// Reads, each day's halved for every day since.
    pub score: f64,
    /// Read on at least two days (in the ARC's T2).
    pub frequent: bool,
}

/// Popularity of content over days; see the module documentation.
pub struct Popularity<K: CacheKey, S> {
    days: Cache<K>,
    entries: Vec<Option<DayEntry<S>>>,
    free: Vec<u32>,
    today: HashMap<K, (u32, S)>,
    today_limit: usize,
    day: u32,
}

impl<K: CacheKey + Hash, S: Copy> Popularity<K, S> {
    /// Tracks up to `keys_limit` keys over days and `today_limit` keys within a day.
    pub fn new(keys_limit: usize, today_limit: usize) -> Popularity<K, S> {
        assert!(keys_limit > 0, "popularity tracks at least one key");
        Popularity {
            days: Cache::with_entries(CachePolicy::Arc, keys_limit),
            entries: vec![None; keys_limit],
            free: (0..keys_limit as u32).rev().collect(),
            today: HashMap::new(),
            today_limit,
            day: 0,
        }
    }

    /// Keys counted today at most.
    pub fn today_limit(&self) -> usize {
        self.today_limit
    }

    /// Days ended so far.
    pub fn day(&self) -> u32 {
        self.day
    }

    /// Counts one read of `key` today, from `source`.
    pub fn note(&mut self, key: K, source: S) {
        let limit = self.today_limit;
        let entries = self.today.len();
        match self.today.entry(key) {
            std::collections::hash_map::Entry::Occupied(mut entry) => {
                let (reads, noted) = entry.get_mut();
                *reads = reads.saturating_add(1);
                *noted = source;
            }
            std::collections::hash_map::Entry::Vacant(entry) => {
                if entries < limit {
                    entry.insert((1, source));
                }
            }
        }
    }

    /// Ends the day: folds today's reads into the ARC of days (see the module documentation).
    pub fn end_day(&mut self) {
        self.day += 1;
        let day = self.day;
        let mut today: Vec<(K, (u32, S))> = self.today.drain().collect();
        // One order for equal inputs, so runs repeat exactly.
        today.sort_by_key(|(key, (reads, _))| (*reads, key.prefix_u64()));
        for (key, (reads, source)) in today {
            let reads = f64::from(reads);
            if let Some(slot) = self.days.get(&key) {
                let entry = self.entries[slot as usize]
                    .as_mut()
                    .expect("a resident key has its entry");
                entry.score = decayed(entry.score, day - entry.day) + reads;
                entry.day = day;
                entry.source = source;
                continue;
            }
            if let Some(evicted) = self.days.insert_evicting(&key, SLOT_PENDING) {
                assert_ne!(
                    evicted, SLOT_PENDING,
                    "the key inserted is never the victim"
                );
                self.entries[evicted as usize] = None;
                self.free.push(evicted as u32);
            }
            let slot = self.free.pop().expect("an insertion leaves a free slot");
            self.days.set_value(&key, u64::from(slot));
            self.entries[slot as usize] = Some(DayEntry {
                score: reads,
                day,
                source,
            });
        }
    }

    /// The candidates for duplication, most popular first: T2 then T1, each by score (ties by
    /// key, so runs repeat exactly).
    pub fn ranked(&self) -> Vec<Candidate<K, S>> {
        let (frequent, recent) = self
            .days
            .entries_by_list()
            .expect("the ARC of days is an ARC");
        let mut ranked = Vec::with_capacity(frequent.len() + recent.len());
        for (list, is_frequent) in [(frequent, true), (recent, false)] {
            let mut part: Vec<Candidate<K, S>> = list
                .into_iter()
                .map(|(key, slot)| {
                    let entry = self.entries[slot as usize].expect("a resident key has its entry");
                    Candidate {
                        key,
                        source: entry.source,
                        score: decayed(entry.score, self.day - entry.day),
                        frequent: is_frequent,
                    }
                })
                .collect();
            part.sort_by(|a, b| {
                b.score
                    .total_cmp(&a.score)
                    .then(a.key.prefix_u64().cmp(&b.key.prefix_u64()))
            });
            ranked.extend(part);
        }
        ranked
    }

    /// Memory held: the ARC of days, its entries, and today's counts.
    pub fn memory_bytes(&self) -> usize {
        self.days.memory_bytes()
            + self.entries.capacity() * std::mem::size_of::<Option<DayEntry<S>>>()
            + self.free.capacity() * 4
            + self.today.capacity() * (std::mem::size_of::<(K, (u32, S))>() + 1)
    }

    /// Forgets `key` (its content is gone from the device).
    pub fn forget(&mut self, key: &K) {
        self.today.remove(key);
        if let Some(slot) = self.days.remove(key) {
            self.entries[slot as usize] = None;
            self.free.push(slot as u32);
        }
    }
}

fn decayed(score: f64, days: u32) -> f64 {
    score / 2f64.powi(days.min(1000) as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    struct Key(u64);

    impl CacheKey for Key {
        fn prefix_u64(&self) -> u64 {
            self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        }
    }

    /// Goal: content read on several days ranks before content read much on one day, scores
    /// halve each day, the limits hold, and forgotten content leaves. Method: three days of
    /// reads of a few keys into a popularity of four keys.
    #[test]
    fn several_days_rank_first() {
        let mut popularity: Popularity<Key, u64> = Popularity::new(4, 3);
        for _ in 0..10 {
            popularity.note(Key(1), 100);
        }
        popularity.note(Key(2), 200);
        popularity.note(Key(3), 300);
        popularity.note(Key(4), 400); // Past today's limit of three keys: not counted.
        popularity.end_day();
        popularity.note(Key(2), 201);
        popularity.end_day();
        let ranked = popularity.ranked();
        let keys: Vec<u64> = ranked.iter().map(|candidate| candidate.key.0).collect();
        assert_eq!(keys, vec![2, 1, 3], "read on two days first");
        assert!(ranked[0].frequent && !ranked[1].frequent);
        assert_eq!(ranked[0].source, 201, "the source last seen");
        assert_eq!(ranked[0].score, 0.5 + 1.0);
        assert_eq!(ranked[1].score, 5.0);
        // More keys than the ARC holds: it stays within its limit.
        for key in 10..20 {
            popularity.note(Key(key), key);
        }
        popularity.end_day();
        assert!(popularity.ranked().len() <= 4);
        popularity.forget(&Key(2));
        assert!(popularity
            .ranked()
            .iter()
            .all(|candidate| candidate.key.0 != 2));
    }
}
