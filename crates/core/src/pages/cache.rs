//! The clean page cache.

use std::collections::HashMap;

use super::{AreaId, Page};
use crate::integer_hash::IntegerBuildHasher;

/// A fixed-capacity cache of clean pages with CLOCK replacement.
#[derive(Debug)]
pub(super) struct PageCache {
    capacity: usize,
    positions: HashMap<(AreaId, u64), usize, IntegerBuildHasher>,
    entries: Vec<CacheEntry>,
    hand: usize,
}

#[derive(Debug)]
struct CacheEntry {
    key: (AreaId, u64),
    page: Box<Page>,
    referenced: bool,
}

impl PageCache {
    pub(super) fn new(capacity: usize) -> Self {
        PageCache {
            capacity,
            positions: HashMap::default(),
            entries: Vec::new(),
            hand: 0,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(super) fn contains(&self, key: (AreaId, u64)) -> bool {
        self.positions.contains_key(&key)
    }

    /// The page, without counting it as used.
    pub(super) fn peek(&self, key: (AreaId, u64)) -> Option<&Page> {
        let position = *self.positions.get(&key)?;
        Some(&self.entries[position].page)
    }

    pub(super) fn get(&mut self, key: (AreaId, u64)) -> Option<&Page> {
        let position = *self.positions.get(&key)?;
        let entry = &mut self.entries[position];
        entry.referenced = true;
        Some(&entry.page)
    }

    pub(super) fn insert(&mut self, key: (AreaId, u64), page: Box<Page>) {
        if let Some(&position) = self.positions.get(&key) {
            self.entries[position].page = page;
            return;
        }
        if self.entries.len() < self.capacity {
            self.positions.insert(key, self.entries.len());
            self.entries.push(CacheEntry {
                key,
                page,
                referenced: false,
            });
            return;
        }
        // CLOCK: clear reference bits until an unreferenced entry comes under the hand.
        loop {
            self.hand %= self.entries.len();
            let entry = &mut self.entries[self.hand];
            if entry.referenced {
                entry.referenced = false;
                self.hand += 1;
                continue;
            }
            self.positions.remove(&entry.key);
            self.positions.insert(key, self.hand);
            *entry = CacheEntry {
                key,
                page,
                referenced: false,
            };
            self.hand += 1;
            return;
        }
    }

    pub(super) fn remove(&mut self, key: (AreaId, u64)) -> Option<Box<Page>> {
        let position = self.positions.remove(&key)?;
        let entry = self.entries.swap_remove(position);
        if position < self.entries.len() {
            let moved = self.entries[position].key;
            self.positions.insert(moved, position);
        }
        Some(entry.page)
    }
}
