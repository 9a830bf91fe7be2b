//! [`BlockedBloomFilter`]: a Bloom filter with one cache line per fingerprint.
//!
//! The bit array is cut into 512-bit blocks (one 64-byte cache line). A fingerprint selects a
//! block with its first 8 bytes and `k` bits inside the block with its next 8 bytes, so an
//! insert or a query touches one cache line. The price is a slightly higher false-positive
//! rate than a classic Bloom filter with the same bits, because blocks receive unequal numbers
//! of fingerprints; the sizing below accounts for it exactly.
//!
//! Sizing: a block holding `j` fingerprints has each bit set with probability
//! `1 - (1 - 1/512)^(k j)`; `j` is Poisson-distributed with mean `512 / bits_per_entry`, so the
//! false-positive rate is `sum_j Poisson(j) (1 - (1 - 1/512)^(k j))^k`. The constructor picks
//! the `k` and the bits per entry that reach the target with the least memory. At the default
//! 1% this gives k = 6 and 9.9 bits (1.24 bytes) per entry, against 9.6 bits for a classic
//! Bloom filter; `cargo bench -p onecopy-core --bench index` prints the measured rate.

use super::{fingerprint_halves, reduce, FilterKind, FilterShape, FilterWords, MembershipFilter};
use crate::fingerprint::Fingerprint;

const BLOCK_BITS: u64 = 512;
const WORDS_PER_BLOCK: usize = (BLOCK_BITS / 64) as usize;
/// Most bits set per fingerprint.
const HASH_COUNT_MAX: u32 = 16;
/// Odd multiplier deriving successive bit positions from the fingerprint's second half.
const POSITION_MULTIPLIER: u64 = 0x9E37_79B9_7F4A_7C15;

const _: () = assert!(super::WORDS_PER_PAGE.is_multiple_of(WORDS_PER_BLOCK));

/// A blocked Bloom filter; see the module documentation.
#[derive(Debug, Clone)]
pub struct BlockedBloomFilter {
    words: FilterWords,
    blocks: u64,
    hash_count: u32,
    capacity: u64,
    len: u64,
    target_false_positive_rate: f64,
}

/// The false-positive rate of a blocked Bloom filter whose blocks hold on average
/// `entries_per_block` fingerprints, each setting `hash_count` bits.
fn false_positive_rate(entries_per_block: f64, hash_count: u32) -> f64 {
    let bit_clear_per_entry = (1.0 - 1.0 / BLOCK_BITS as f64).powi(hash_count as i32);
    let terms = (entries_per_block + 12.0 * entries_per_block.sqrt() + 30.0) as u32;
    let mut poisson = (-entries_per_block).exp();
    let mut rate = 0.0;
    for j in 0..terms {
        let bit_set = 1.0 - bit_clear_per_entry.powi(j as i32);
        rate += poisson * bit_set.powi(hash_count as i32);
        poisson *= entries_per_block / (j + 1) as f64;
    }
    rate
}

/// The (bits per entry, bits set per fingerprint) reaching `target` with the least memory.
fn design(target: f64) -> (f64, u32) {
    let mut best = (f64::INFINITY, 1);
    for hash_count in 1..=HASH_COUNT_MAX {
        // The rate falls as bits per entry grow: bisect for the least that reaches the target.
        let (mut low, mut high) = (0.5f64, 64.0f64);
        if false_positive_rate(BLOCK_BITS as f64 / high, hash_count) > target {
            continue;
        }
        for _ in 0..60 {
            let middle = (low + high) / 2.0;
            if false_positive_rate(BLOCK_BITS as f64 / middle, hash_count) <= target {
                high = middle;
            } else {
                low = middle;
            }
        }
        if high < best.0 {
            best = (high, hash_count);
        }
    }
    assert!(best.0.is_finite(), "no design reaches rate {target}");
    best
}

impl BlockedBloomFilter {
    /// A filter for `capacity` fingerprints at `false_positive_rate` (checked by
    /// [`super::check_parameters`]).
    pub fn new(capacity: u64, false_positive_rate: f64) -> Self {
        super::check_parameters(capacity, false_positive_rate).expect("valid filter parameters");
        let (bits_per_entry, hash_count) = design(false_positive_rate);
        let blocks = ((capacity as f64 * bits_per_entry / BLOCK_BITS as f64).ceil() as u64).max(1);
        BlockedBloomFilter {
            words: FilterWords::zeroed(blocks as usize * WORDS_PER_BLOCK),
            blocks,
            hash_count,
            capacity,
            len: 0,
            target_false_positive_rate: false_positive_rate,
        }
    }

    /// Bits set per fingerprint (`k`).
    pub fn hash_count(&self) -> u32 {
        self.hash_count
    }

    /// Bits of memory per fingerprint at capacity.
    pub fn bits_per_entry(&self) -> f64 {
        (self.blocks * BLOCK_BITS) as f64 / self.capacity as f64
    }

    pub(crate) fn shape(&self) -> FilterShape {
        FilterShape {
            kind: FilterKind::Bloom,
            capacity: self.capacity,
            target_false_positive_rate: self.target_false_positive_rate,
            len: self.len,
            units: self.blocks,
            hash_parameter: self.hash_count,
            stash_tag: 0,
            stash_bucket: 0,
        }
    }

    pub(crate) fn words(&self) -> &FilterWords {
        &self.words
    }

    pub(crate) fn words_mut(&mut self) -> &mut FilterWords {
        &mut self.words
    }

    pub(crate) fn restore(shape: FilterShape, words: Vec<u64>) -> Option<Self> {
        let fits = shape.kind == FilterKind::Bloom
            && shape.units > 0
            && words.len() as u64 == shape.units.checked_mul(WORDS_PER_BLOCK as u64)?
            && (1..=HASH_COUNT_MAX).contains(&shape.hash_parameter)
            && super::check_parameters(shape.capacity, shape.target_false_positive_rate).is_ok();
        fits.then(|| BlockedBloomFilter {
            words: FilterWords::from_saved(words),
            blocks: shape.units,
            hash_count: shape.hash_parameter,
            capacity: shape.capacity,
            len: shape.len,
            target_false_positive_rate: shape.target_false_positive_rate,
        })
    }

    /// The first word of the fingerprint's block and the seed of its bit positions.
    #[inline]
    fn locate(&self, fingerprint: &Fingerprint) -> (usize, u64) {
        let (first, second) = fingerprint_halves(fingerprint);
        let block = reduce(first, self.blocks) as usize;
        (block * WORDS_PER_BLOCK, second)
    }
}

impl MembershipFilter for BlockedBloomFilter {
    fn insert(&mut self, fingerprint: &Fingerprint) -> bool {
        let (base, mut position_seed) = self.locate(fingerprint);
        let mut masks = [0u64; WORDS_PER_BLOCK];
        for _ in 0..self.hash_count {
            position_seed = position_seed.wrapping_mul(POSITION_MULTIPLIER);
            let bit = position_seed >> 55;
            masks[(bit >> 6) as usize] |= 1 << (bit & 63);
        }
        for (offset, mask) in masks.into_iter().enumerate() {
            if mask != 0 {
                let word = self.words.get(base + offset);
                self.words.set(base + offset, word | mask);
            }
        }
        self.len += 1;
        true
    }

    #[inline]
    fn may_contain(&self, fingerprint: &Fingerprint) -> bool {
        let (base, mut position_seed) = self.locate(fingerprint);
        let block = &self.words.as_slice()[base..base + WORDS_PER_BLOCK];
        for _ in 0..self.hash_count {
            position_seed = position_seed.wrapping_mul(POSITION_MULTIPLIER);
            let bit = position_seed >> 55;
            if block[(bit >> 6) as usize] & (1 << (bit & 63)) == 0 {
                return false;
            }
        }
        true
    }

    #[inline]
    fn warm(&self, fingerprint: &Fingerprint) {
        let (base, _) = self.locate(fingerprint);
        crate::index::warm::warm(&self.words.as_slice()[base]);
    }

    fn supports_remove(&self) -> bool {
        false
    }

    fn remove(&mut self, _fingerprint: &Fingerprint) -> bool {
        false
    }

    fn len(&self) -> u64 {
        self.len
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn needs_growth(&self) -> bool {
        self.len >= self.capacity
    }

    fn memory_bytes(&self) -> usize {
        self.words.memory_bytes()
    }

    fn target_false_positive_rate(&self) -> f64 {
        self.target_false_positive_rate
    }

    fn expected_false_positive_rate(&self) -> f64 {
        false_positive_rate(self.len as f64 / self.blocks as f64, self.hash_count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the sizing reaches each target rate with a plausible number of bits, never fewer
    /// than a classic Bloom filter needs. Method: compare with -ln(p)/ln(2)^2.
    #[test]
    fn design_is_close_to_a_classic_bloom_filter() {
        for target in [0.1, 0.01, 0.001] {
            let (bits, hash_count) = design(target);
            let classic = -target.ln() / std::f64::consts::LN_2.powi(2);
            assert!(bits >= classic, "{target}: {bits} < classic {classic}");
            assert!(
                bits <= classic * 1.3,
                "{target}: {bits} bits, k {hash_count}"
            );
            let rate = false_positive_rate(BLOCK_BITS as f64 / bits, hash_count);
            assert!(rate <= target * 1.0001);
        }
    }
}
