//! The fingerprint index. This interim composite keeps entries in a hash map; the persistent
//! composite (filter, bounded cache, on-disk hash table) replaces it.
pub mod cache;
pub mod disk;
pub mod filter;

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::fingerprint::Fingerprint;
use crate::pages::PageStore;
use crate::Result;

/// Index options.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct IndexOptions {
    pub cache_bytes: u64,
}

/// Index counters.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct IndexCounters {
    pub lookups: u64,
}

/// Index memory.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct IndexMemory {
    pub filter_bytes: u64,
    pub cache_bytes: u64,
    pub directory_bytes: u64,
}

/// Maps fingerprints to u64 values.
#[derive(Debug, Default)]
pub struct FingerprintIndex {
    entries: HashMap<Fingerprint, u64>,
    counters: IndexCounters,
}

impl FingerprintIndex {
    pub fn open(_pages: &mut PageStore, _name: &str, _options: IndexOptions) -> Result<Self> {
        Ok(Self::default())
    }
    pub fn lookup(
        &mut self,
        _pages: &mut PageStore,
        fingerprint: &Fingerprint,
    ) -> Result<Option<u64>> {
        self.counters.lookups += 1;
        Ok(self.entries.get(fingerprint).copied())
    }
    pub fn insert(
        &mut self,
        _pages: &mut PageStore,
        fingerprint: &Fingerprint,
        value: u64,
    ) -> Result<Option<u64>> {
        Ok(self.entries.insert(*fingerprint, value))
    }
    pub fn remove(
        &mut self,
        _pages: &mut PageStore,
        fingerprint: &Fingerprint,
    ) -> Result<Option<u64>> {
        Ok(self.entries.remove(fingerprint))
    }
    pub fn prefetch(&mut self, _pages: &mut PageStore, _fingerprint: &Fingerprint) -> Result<bool> {
        Ok(false)
    }
    pub fn prefetch_known(&mut self, _fingerprint: &Fingerprint, _value: u64) {}
    pub fn prepare_checkpoint(&mut self, _pages: &mut PageStore) -> Result<()> {
        Ok(())
    }
    pub fn len(&self) -> u64 {
        self.entries.len() as u64
    }
    pub fn memory(&self) -> IndexMemory {
        IndexMemory::default()
    }
    pub fn for_each_entry(
        &mut self,
        _pages: &mut PageStore,
        mut visit: impl FnMut(&Fingerprint, u64),
    ) -> Result<()> {
        for (fingerprint, value) in &self.entries {
            visit(fingerprint, *value);
        }
        Ok(())
    }
    pub fn counters(&self) -> IndexCounters {
        self.counters.clone()
    }
    pub fn memory_bytes(&self) -> u64 {
        (self.entries.len() * 48) as u64
    }
}
