//! [`CuckooFilter`]: a filter that supports deletion (Fan, Andersen, Kaminsky and
//! Mitzenmacher, "Cuckoo filter: practically better than Bloom", CoNEXT 2014).
//!
//! Each fingerprint is reduced to a *tag* of `f` bits (never zero: zero marks an empty slot)
//! stored in one of two *buckets* of four slots. The second bucket is computed from the first
//! and the tag alone, `alternate(i) = (H(tag) - i) mod buckets`, which is its own inverse, so a
//! tag can move between its buckets without the fingerprint (partial-key cuckoo hashing) and
//! the bucket count need not be a power of two. When both buckets are full, a random tag is
//! kicked to its other bucket, up to [`KICKS_MAX`] times; a tag still homeless after that goes
//! to a one-entry *stash*, and the filter reports that it needs to grow.
//!
//! Buckets are bit-packed (`4f` bits each) so memory follows `f` exactly. Sizing: a query
//! compares against 8 slots, each holding a matching tag with probability `1/(2^f - 1)`, so
//! `f` is the least number of bits with `8 * load / (2^f - 1) <= target`; the capacity is
//! reached at a load of 0.9 (inserts fail rarely below 0.95). At the default 1%, `f = 10` and a
//! full filter costs 11.1 bits (1.39 bytes) per entry. Tags are capped at 16 bits, so rates
//! below about 1.1e-4 are not reached.

use super::{fingerprint_halves, reduce, FilterKind, FilterShape, FilterWords, MembershipFilter};
use crate::fingerprint::Fingerprint;

const SLOTS_PER_BUCKET: u32 = 4;
/// Fraction of slots in use at capacity.
const LOAD_AT_CAPACITY: f64 = 0.9;
const TAG_BITS_MIN: u32 = 4;
const TAG_BITS_MAX: u32 = 16;
/// Displacements tried before a tag goes to the stash.
pub const KICKS_MAX: u32 = 500;
/// Odd multiplier spreading a tag over the bucket range for the alternate bucket.
const TAG_MULTIPLIER: u64 = 0x9E37_79B9_7F4A_7C15;

/// A cuckoo filter; see the module documentation.
#[derive(Debug, Clone)]
pub struct CuckooFilter {
    words: FilterWords,
    buckets: u64,
    tag_bits: u32,
    capacity: u64,
    len: u64,
    target_false_positive_rate: f64,
    /// A tag that found no slot, and one of its buckets (tag 0: empty).
    stash_tag: u32,
    stash_bucket: u64,
    /// State of the generator choosing which tag to kick (needs no persistence).
    kick_random: u64,
}

fn tag_bits_for(target: f64) -> u32 {
    let slots_compared = 2.0 * SLOTS_PER_BUCKET as f64 * LOAD_AT_CAPACITY;
    (TAG_BITS_MIN..=TAG_BITS_MAX)
        .find(|&bits| slots_compared / ((1u64 << bits) - 1) as f64 <= target)
        .unwrap_or(TAG_BITS_MAX)
}

fn words_for(buckets: u64, tag_bits: u32) -> usize {
    // One spare word lets every bucket be read as a 128-bit window.
    (buckets * (SLOTS_PER_BUCKET * tag_bits) as u64).div_ceil(64) as usize + 1
}

impl CuckooFilter {
    /// A filter for `capacity` fingerprints at `false_positive_rate` (checked by
    /// [`super::check_parameters`]).
    pub fn new(capacity: u64, false_positive_rate: f64) -> Self {
        super::check_parameters(capacity, false_positive_rate).expect("valid filter parameters");
        let tag_bits = tag_bits_for(false_positive_rate);
        let slots = (capacity as f64 / LOAD_AT_CAPACITY).ceil() as u64;
        let buckets = slots.div_ceil(SLOTS_PER_BUCKET as u64).max(1);
        CuckooFilter {
            words: FilterWords::zeroed(words_for(buckets, tag_bits)),
            buckets,
            tag_bits,
            capacity,
            len: 0,
            target_false_positive_rate: false_positive_rate,
            stash_tag: 0,
            stash_bucket: 0,
            kick_random: 0x2545_F491_4F6C_DD1D,
        }
    }

    /// Bits per tag (`f`).
    pub fn tag_bits(&self) -> u32 {
        self.tag_bits
    }

    pub(crate) fn shape(&self) -> FilterShape {
        FilterShape {
            kind: FilterKind::Cuckoo,
            capacity: self.capacity,
            target_false_positive_rate: self.target_false_positive_rate,
            len: self.len,
            units: self.buckets,
            hash_parameter: self.tag_bits,
            stash_tag: self.stash_tag,
            stash_bucket: self.stash_bucket,
        }
    }

    pub(crate) fn words(&self) -> &FilterWords {
        &self.words
    }

    pub(crate) fn words_mut(&mut self) -> &mut FilterWords {
        &mut self.words
    }

    pub(crate) fn restore(shape: FilterShape, words: Vec<u64>) -> Option<Self> {
        let tag_bits = shape.hash_parameter;
        let fits = shape.kind == FilterKind::Cuckoo
            && (TAG_BITS_MIN..=TAG_BITS_MAX).contains(&tag_bits)
            && shape.units > 0
            && shape.units <= (1 << 48)
            && words.len() == words_for(shape.units, tag_bits)
            && shape.stash_tag < (1 << tag_bits)
            && shape.stash_bucket < shape.units
            && super::check_parameters(shape.capacity, shape.target_false_positive_rate).is_ok();
        fits.then(|| CuckooFilter {
            words: FilterWords::from_saved(words),
            buckets: shape.units,
            tag_bits,
            capacity: shape.capacity,
            len: shape.len,
            target_false_positive_rate: shape.target_false_positive_rate,
            stash_tag: shape.stash_tag,
            stash_bucket: shape.stash_bucket,
            kick_random: 0x2545_F491_4F6C_DD1D,
        })
    }

    #[inline]
    fn tag_mask(&self) -> u64 {
        (1u64 << self.tag_bits) - 1
    }

    /// The first bucket and the tag of a fingerprint.
    #[inline]
    fn locate(&self, fingerprint: &Fingerprint) -> (u64, u32) {
        let (first, second) = fingerprint_halves(fingerprint);
        let tag = reduce(second, self.tag_mask()) as u32 + 1;
        (reduce(first, self.buckets), tag)
    }

    #[inline]
    fn alternate(&self, bucket: u64, tag: u32) -> u64 {
        let pivot = reduce((tag as u64).wrapping_mul(TAG_MULTIPLIER), self.buckets);
        if pivot >= bucket {
            pivot - bucket
        } else {
            pivot + self.buckets - bucket
        }
    }

    #[inline]
    fn bucket_position(&self, bucket: u64) -> (usize, u32) {
        let bit = bucket * (SLOTS_PER_BUCKET * self.tag_bits) as u64;
        ((bit / 64) as usize, (bit % 64) as u32)
    }

    #[inline]
    fn read_bucket(&self, bucket: u64) -> u64 {
        let (word, shift) = self.bucket_position(bucket);
        let window = self.words.get(word) as u128 | (self.words.get(word + 1) as u128) << 64;
        let bucket_bits = SLOTS_PER_BUCKET * self.tag_bits;
        ((window >> shift) as u64) & (u64::MAX >> (64 - bucket_bits))
    }

    fn write_bucket(&mut self, bucket: u64, content: u64) {
        let (word, shift) = self.bucket_position(bucket);
        let bucket_bits = SLOTS_PER_BUCKET * self.tag_bits;
        let mask = ((u64::MAX >> (64 - bucket_bits)) as u128) << shift;
        let window = self.words.get(word) as u128 | (self.words.get(word + 1) as u128) << 64;
        let updated = (window & !mask) | ((content as u128) << shift);
        self.words.set(word, updated as u64);
        self.words.set(word + 1, (updated >> 64) as u64);
    }

    #[inline]
    fn slot(&self, content: u64, slot: u32) -> u32 {
        ((content >> (slot * self.tag_bits)) & self.tag_mask()) as u32
    }

    #[inline]
    fn bucket_holds(&self, bucket: u64, tag: u32) -> bool {
        let content = self.read_bucket(bucket);
        (0..SLOTS_PER_BUCKET).any(|slot| self.slot(content, slot) == tag)
    }

    /// Replaces the first slot of `bucket` holding `old` with `new`; false if none holds it.
    fn replace_in_bucket(&mut self, bucket: u64, old: u32, new: u32) -> bool {
        let content = self.read_bucket(bucket);
        for slot in 0..SLOTS_PER_BUCKET {
            if self.slot(content, slot) == old {
                let shift = slot * self.tag_bits;
                let cleared = content & !(self.tag_mask() << shift);
                self.write_bucket(bucket, cleared | ((new as u64) << shift));
                return true;
            }
        }
        false
    }

    fn next_random(&mut self) -> u64 {
        self.kick_random ^= self.kick_random << 13;
        self.kick_random ^= self.kick_random >> 7;
        self.kick_random ^= self.kick_random << 17;
        self.kick_random
    }

    /// Places `tag` in `bucket` or its alternate, kicking other tags as needed; returns the
    /// homeless tag and its bucket if it ran out of kicks.
    fn place(&mut self, bucket: u64, tag: u32) -> Option<(u32, u64)> {
        let alternate = self.alternate(bucket, tag);
        if self.replace_in_bucket(bucket, 0, tag) || self.replace_in_bucket(alternate, 0, tag) {
            return None;
        }
        let (mut bucket, mut tag) = if self.next_random() & 1 == 0 {
            (bucket, tag)
        } else {
            (alternate, tag)
        };
        for _ in 0..KICKS_MAX {
            let slot = (self.next_random() % SLOTS_PER_BUCKET as u64) as u32;
            let content = self.read_bucket(bucket);
            let evicted = self.slot(content, slot);
            let shift = slot * self.tag_bits;
            let cleared = content & !(self.tag_mask() << shift);
            self.write_bucket(bucket, cleared | ((tag as u64) << shift));
            tag = evicted;
            bucket = self.alternate(bucket, tag);
            if self.replace_in_bucket(bucket, 0, tag) {
                return None;
            }
        }
        Some((tag, bucket))
    }
}

impl MembershipFilter for CuckooFilter {
    fn insert(&mut self, fingerprint: &Fingerprint) -> bool {
        if self.stash_tag != 0 {
            // Full: the owner must rebuild a bigger filter that includes this fingerprint.
            return false;
        }
        let (bucket, tag) = self.locate(fingerprint);
        if let Some((homeless, homeless_bucket)) = self.place(bucket, tag) {
            self.stash_tag = homeless;
            self.stash_bucket = homeless_bucket;
        }
        self.len += 1;
        true
    }

    #[inline]
    fn may_contain(&self, fingerprint: &Fingerprint) -> bool {
        let (bucket, tag) = self.locate(fingerprint);
        if self.bucket_holds(bucket, tag) {
            return true;
        }
        let alternate = self.alternate(bucket, tag);
        self.bucket_holds(alternate, tag)
            || (self.stash_tag == tag
                && (self.stash_bucket == bucket || self.stash_bucket == alternate))
    }

    #[inline]
    fn warm(&self, fingerprint: &Fingerprint) {
        let (bucket, tag) = self.locate(fingerprint);
        for bucket in [bucket, self.alternate(bucket, tag)] {
            let (word, _) = self.bucket_position(bucket);
            crate::index::warm::warm(&self.words.as_slice()[word]);
        }
    }

    fn supports_remove(&self) -> bool {
        true
    }

    fn remove(&mut self, fingerprint: &Fingerprint) -> bool {
        let (bucket, tag) = self.locate(fingerprint);
        let alternate = self.alternate(bucket, tag);
        let removed = if self.replace_in_bucket(bucket, tag, 0)
            || self.replace_in_bucket(alternate, tag, 0)
        {
            // A slot came free: the stashed tag may fit now.
            if self.stash_tag != 0 {
                let (stash_tag, stash_bucket) = (self.stash_tag, self.stash_bucket);
                let stash_alternate = self.alternate(stash_bucket, stash_tag);
                if self.replace_in_bucket(stash_bucket, 0, stash_tag)
                    || self.replace_in_bucket(stash_alternate, 0, stash_tag)
                {
                    self.stash_tag = 0;
                }
            }
            true
        } else if self.stash_tag == tag
            && (self.stash_bucket == bucket || self.stash_bucket == alternate)
        {
            self.stash_tag = 0;
            true
        } else {
            false
        };
        if removed {
            assert!(self.len > 0, "removed more than was inserted");
            self.len -= 1;
        }
        removed
    }

    fn len(&self) -> u64 {
        self.len
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn needs_growth(&self) -> bool {
        self.len >= self.capacity || self.stash_tag != 0
    }

    fn memory_bytes(&self) -> usize {
        self.words.memory_bytes()
    }

    fn target_false_positive_rate(&self) -> f64 {
        self.target_false_positive_rate
    }

    fn expected_false_positive_rate(&self) -> f64 {
        let load = self.len as f64 / (self.buckets * SLOTS_PER_BUCKET as u64) as f64;
        let slots_compared = 2.0 * SLOTS_PER_BUCKET as f64 * load.min(1.0);
        1.0 - (1.0 - 1.0 / self.tag_mask() as f64).powf(slots_compared)
    }
}
