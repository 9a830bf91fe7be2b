//! The fingerprint index. This interim version keeps entries in a hash map; the persistent
//! index (filter, bounded cache, on-disk hash table) replaces it.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::fingerprint::Fingerprint;
use crate::pages::PageStore;
use crate::Result;

/// Index options.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct IndexOptions {}

/// Index counters.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct IndexCounters {
    pub lookups: u64,
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
    ) -> Result<()> {
        self.entries.insert(*fingerprint, value);
        Ok(())
    }
    pub fn remove(&mut self, _pages: &mut PageStore, fingerprint: &Fingerprint) -> Result<()> {
        self.entries.remove(fingerprint);
        Ok(())
    }
    pub fn prefetch(&mut self, _pages: &mut PageStore, _fingerprint: &Fingerprint) -> Result<()> {
        Ok(())
    }
    pub fn counters(&self) -> IndexCounters {
        self.counters.clone()
    }
    pub fn memory_bytes(&self) -> u64 {
        (self.entries.len() * 48) as u64
    }
}
