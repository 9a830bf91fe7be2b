//! Membership filters: a compact in-memory answer to "might this fingerprint be stored?".
//!
//! A filter never answers "no" for a fingerprint it holds (no false negatives) and answers
//! "maybe" for an absent one with a small *false-positive rate*. A "no" spares the index a
//! cache probe and an on-disk lookup, which is most of the lookups of new data.
//!
//! Two kinds ([`FilterKind`]):
//! - [`BlockedBloomFilter`]: a Bloom filter whose bits for one fingerprint all lie in one
//!   64-byte cache line, so a query costs one cache miss. It cannot forget a fingerprint.
//! - [`CuckooFilter`]: a cuckoo filter (Fan et al., CoNEXT 2014) storing a short tag per
//!   fingerprint in one of two buckets of four slots. It supports deletion, which the index
//!   needs when garbage collection removes chunks; it uses less memory than a counting Bloom
//!   filter (4 counter bits per Bloom bit) at the same rate, and is simpler and faster to query
//!   than a quotient filter (one or two buckets instead of a run scan). Paper 1 §3.3.1 names the
//!   same trade-off.
//!
//! Terms: *capacity* is the number of fingerprints a filter holds at its target rate;
//! *bits per entry* is its memory divided by its capacity. Filters do not grow themselves: they
//! cannot, because they do not keep the fingerprints. [`MembershipFilter::needs_growth`] says
//! when the owner must rebuild a bigger one from the keys of the on-disk index (the policy is
//! in [`crate::index`]).
//!
//! Fingerprints are uniformly random, so the filters hash nothing: they take their bits from
//! the first 16 bytes of the fingerprint (every algorithm fills at least 16).

mod bloom;
mod cuckoo;
pub(crate) mod store;

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

pub use bloom::BlockedBloomFilter;
pub use cuckoo::CuckooFilter;

use crate::fingerprint::Fingerprint;
use crate::pages::PAGE_BYTES;
use crate::{Error, Result};

/// Lowest accepted target false-positive rate (below it the filters would need more than 16
/// bits per entry, defeating their purpose).
pub const FALSE_POSITIVE_RATE_MIN: f64 = 1e-4;
/// Highest accepted target false-positive rate.
pub const FALSE_POSITIVE_RATE_MAX: f64 = 0.5;
/// Largest capacity of one filter (2^40 fingerprints: far beyond any repository's RAM).
pub const FILTER_CAPACITY_MAX: u64 = 1 << 40;

/// A set of fingerprints with false positives but no false negatives.
pub trait MembershipFilter {
    /// Adds `fingerprint`. Returns false when the filter is too full to represent it (the
    /// owner must then rebuild a bigger filter including it); true otherwise.
    fn insert(&mut self, fingerprint: &Fingerprint) -> bool;

    /// False only if `fingerprint` was never inserted (or was removed).
    fn may_contain(&self, fingerprint: &Fingerprint) -> bool;

    /// Starts loading the memory [`may_contain`](Self::may_contain) reads for `fingerprint`
    /// into the processor's caches; changes nothing ([`warm`](crate::index::warm)).
    fn warm(&self, fingerprint: &Fingerprint);

    /// True when [`remove`](Self::remove) is supported.
    fn supports_remove(&self) -> bool;

    /// Forgets one insertion of `fingerprint`, which must have been inserted: removing a
    /// fingerprint that was not inserted may remove another one's trace. Returns false when
    /// removal is unsupported or nothing matched.
    fn remove(&mut self, fingerprint: &Fingerprint) -> bool;

    /// Insertions not yet removed (for filters without removal: all insertions).
    fn len(&self) -> u64;

    /// True when nothing was inserted.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Fingerprints held at the target false-positive rate.
    fn capacity(&self) -> u64;

    /// True when the filter holds its capacity (or could not place a fingerprint): the owner
    /// should rebuild a bigger one.
    fn needs_growth(&self) -> bool;

    /// Bytes of memory held.
    fn memory_bytes(&self) -> usize;

    /// The rate the filter was sized for, at its capacity.
    fn target_false_positive_rate(&self) -> f64;

    /// The rate expected with the current number of entries (from the filter's analysis).
    fn expected_false_positive_rate(&self) -> f64;
}

/// A filter kind, as named in options and on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum FilterKind {
    /// Blocked Bloom filter (no deletion): the default, fastest to query.
    #[default]
    Bloom,
    /// Cuckoo filter (supports deletion).
    Cuckoo,
}

impl FilterKind {
    /// Every kind.
    pub const ALL: [FilterKind; 2] = [FilterKind::Bloom, FilterKind::Cuckoo];

    /// The name used in options and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            FilterKind::Bloom => "bloom",
            FilterKind::Cuckoo => "cuckoo",
        }
    }

    fn code(self) -> u32 {
        match self {
            FilterKind::Bloom => 1,
            FilterKind::Cuckoo => 2,
        }
    }

    fn from_code(code: u32) -> Option<FilterKind> {
        FilterKind::ALL.into_iter().find(|kind| kind.code() == code)
    }
}

impl fmt::Display for FilterKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for FilterKind {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        FilterKind::ALL
            .into_iter()
            .find(|kind| kind.name().eq_ignore_ascii_case(text))
            .ok_or_else(|| {
                Error::InvalidArgument(format!("unknown filter {text:?}; choose bloom or cuckoo"))
            })
    }
}

/// Words of filter memory in one page of the page store.
pub const WORDS_PER_PAGE: usize = PAGE_BYTES / 8;

/// The memory of a filter: 64-bit words, plus a bitmap of the pages (groups of
/// [`WORDS_PER_PAGE`] words) changed since they were last saved, so saving a filter writes
/// only what changed.
#[derive(Debug, Clone)]
pub struct FilterWords {
    words: Vec<u64>,
    dirty_pages: Vec<u64>,
}

impl FilterWords {
    pub(crate) fn zeroed(count: usize) -> Self {
        let pages = count.div_ceil(WORDS_PER_PAGE);
        FilterWords {
            words: vec![0; count],
            // A new filter differs from whatever a page store holds: every page is dirty.
            dirty_pages: vec![u64::MAX; pages.div_ceil(64)],
        }
    }

    pub(crate) fn from_saved(words: Vec<u64>) -> Self {
        let pages = words.len().div_ceil(WORDS_PER_PAGE);
        FilterWords {
            words,
            dirty_pages: vec![0; pages.div_ceil(64)],
        }
    }

    #[inline]
    pub(crate) fn get(&self, index: usize) -> u64 {
        self.words[index]
    }

    #[inline]
    pub(crate) fn set(&mut self, index: usize, value: u64) {
        if self.words[index] != value {
            self.words[index] = value;
            let page = index / WORDS_PER_PAGE;
            self.dirty_pages[page / 64] |= 1 << (page % 64);
        }
    }

    pub(crate) fn as_slice(&self) -> &[u64] {
        &self.words
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        (self.words.capacity() + self.dirty_pages.capacity()) * 8
    }

    /// Pages changed since the last call, and clears the record.
    pub(crate) fn take_dirty_pages(&mut self) -> Vec<usize> {
        let page_count = self.words.len().div_ceil(WORDS_PER_PAGE);
        let mut pages = Vec::new();
        for (chunk, bits) in self.dirty_pages.iter_mut().enumerate() {
            let mut remaining = std::mem::take(bits);
            while remaining != 0 {
                let page = chunk * 64 + remaining.trailing_zeros() as usize;
                remaining &= remaining - 1;
                if page < page_count {
                    pages.push(page);
                }
            }
        }
        pages
    }
}

/// What is needed, besides its words, to rebuild a filter exactly (saved with it).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FilterShape {
    pub kind: FilterKind,
    pub capacity: u64,
    pub target_false_positive_rate: f64,
    pub len: u64,
    /// Blocks (Bloom) or buckets (cuckoo).
    pub units: u64,
    /// Bits set per fingerprint (Bloom) or tag bits (cuckoo).
    pub hash_parameter: u32,
    /// Cuckoo only: the tag that could not be placed (0: none) and its bucket.
    pub stash_tag: u32,
    pub stash_bucket: u64,
}

/// A filter of either kind, dispatched without virtual calls.
#[derive(Debug, Clone)]
pub enum Filter {
    Bloom(BlockedBloomFilter),
    Cuckoo(CuckooFilter),
}

macro_rules! dispatch {
    ($self:ident, $filter:ident => $body:expr) => {
        match $self {
            Filter::Bloom($filter) => $body,
            Filter::Cuckoo($filter) => $body,
        }
    };
}

impl Filter {
    /// A filter of `kind` for `capacity` fingerprints at `false_positive_rate`.
    pub fn new(kind: FilterKind, capacity: u64, false_positive_rate: f64) -> Result<Filter> {
        check_parameters(capacity, false_positive_rate)?;
        Ok(match kind {
            FilterKind::Bloom => {
                Filter::Bloom(BlockedBloomFilter::new(capacity, false_positive_rate))
            }
            FilterKind::Cuckoo => Filter::Cuckoo(CuckooFilter::new(capacity, false_positive_rate)),
        })
    }

    /// The kind of this filter.
    pub fn kind(&self) -> FilterKind {
        match self {
            Filter::Bloom(_) => FilterKind::Bloom,
            Filter::Cuckoo(_) => FilterKind::Cuckoo,
        }
    }

    /// The parameters that, with [`words`](Self::words), rebuild this filter.
    pub fn shape(&self) -> FilterShape {
        dispatch!(self, filter => filter.shape())
    }

    /// The filter's memory.
    pub fn words(&self) -> &FilterWords {
        dispatch!(self, filter => filter.words())
    }

    pub(crate) fn words_mut(&mut self) -> &mut FilterWords {
        dispatch!(self, filter => filter.words_mut())
    }

    /// Rebuilds a saved filter; `None` when the shape and words do not fit together.
    pub fn restore(shape: FilterShape, words: Vec<u64>) -> Option<Filter> {
        match shape.kind {
            FilterKind::Bloom => BlockedBloomFilter::restore(shape, words).map(Filter::Bloom),
            FilterKind::Cuckoo => CuckooFilter::restore(shape, words).map(Filter::Cuckoo),
        }
    }
}

/// Checks the arguments shared by every filter constructor.
pub fn check_parameters(capacity: u64, false_positive_rate: f64) -> Result<()> {
    if !(FALSE_POSITIVE_RATE_MIN..=FALSE_POSITIVE_RATE_MAX).contains(&false_positive_rate) {
        return Err(Error::InvalidArgument(format!(
            "false-positive rate {false_positive_rate} is outside \
             [{FALSE_POSITIVE_RATE_MIN}, {FALSE_POSITIVE_RATE_MAX}]"
        )));
    }
    if capacity == 0 || capacity > FILTER_CAPACITY_MAX {
        return Err(Error::InvalidArgument(format!(
            "filter capacity {capacity} is outside [1, {FILTER_CAPACITY_MAX}]"
        )));
    }
    Ok(())
}

impl MembershipFilter for Filter {
    #[inline]
    fn insert(&mut self, fingerprint: &Fingerprint) -> bool {
        dispatch!(self, filter => filter.insert(fingerprint))
    }
    #[inline]
    fn may_contain(&self, fingerprint: &Fingerprint) -> bool {
        dispatch!(self, filter => filter.may_contain(fingerprint))
    }
    #[inline]
    fn warm(&self, fingerprint: &Fingerprint) {
        dispatch!(self, filter => filter.warm(fingerprint))
    }
    fn supports_remove(&self) -> bool {
        dispatch!(self, filter => filter.supports_remove())
    }
    fn remove(&mut self, fingerprint: &Fingerprint) -> bool {
        dispatch!(self, filter => filter.remove(fingerprint))
    }
    fn len(&self) -> u64 {
        dispatch!(self, filter => filter.len())
    }
    fn capacity(&self) -> u64 {
        dispatch!(self, filter => filter.capacity())
    }
    fn needs_growth(&self) -> bool {
        dispatch!(self, filter => filter.needs_growth())
    }
    fn memory_bytes(&self) -> usize {
        dispatch!(self, filter => filter.memory_bytes())
    }
    fn target_false_positive_rate(&self) -> f64 {
        dispatch!(self, filter => filter.target_false_positive_rate())
    }
    fn expected_false_positive_rate(&self) -> f64 {
        dispatch!(self, filter => filter.expected_false_positive_rate())
    }
}

/// The two independent 64-bit values a filter uses from a fingerprint.
#[inline]
pub(crate) fn fingerprint_halves(fingerprint: &Fingerprint) -> (u64, u64) {
    let second = u64::from_le_bytes(fingerprint.0[8..16].try_into().expect("8 bytes"));
    (fingerprint.prefix_u64(), second)
}

/// Maps a uniform 64-bit value onto `0..range` without division (Lemire's multiply-shift).
#[inline]
pub(crate) fn reduce(value: u64, range: u64) -> u64 {
    ((value as u128 * range as u128) >> 64) as u64
}

#[cfg(test)]
mod conformance;
