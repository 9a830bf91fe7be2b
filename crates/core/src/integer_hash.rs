//! A hasher for hash maps keyed by small integers the engine chooses itself: page numbers,
//! area ids, volume ids. SipHash, the standard default, resists keys chosen to collide, which
//! none of these can be, and cost a few percent of a 4 KiB write's CPU in maps consulted for
//! every block (the page store's dirty pages and clean cache, the block engine's volumes).

use std::hash::{BuildHasherDefault, Hasher};

/// Builds [`IntegerHasher`]s: `HashMap<K, V, IntegerBuildHasher>`.
pub type IntegerBuildHasher = BuildHasherDefault<IntegerHasher>;

/// Folds each integer written into the state with one multiplication (Fibonacci hashing).
#[derive(Clone, Copy, Debug, Default)]
pub struct IntegerHasher(u64);

const MULTIPLIER: u64 = 0x9e37_79b9_7f4a_7c15;

impl IntegerHasher {
    #[inline]
    fn add(&mut self, value: u64) {
        self.0 = (self.0.rotate_left(26) ^ value).wrapping_mul(MULTIPLIER);
    }
}

impl Hasher for IntegerHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        // Not used by integer keys; correct for any other key, only slower.
        for &byte in bytes {
            self.add(u64::from(byte));
        }
    }
    #[inline]
    fn write_u8(&mut self, value: u8) {
        self.add(u64::from(value));
    }
    #[inline]
    fn write_u16(&mut self, value: u16) {
        self.add(u64::from(value));
    }
    #[inline]
    fn write_u32(&mut self, value: u32) {
        self.add(u64::from(value));
    }
    #[inline]
    fn write_u64(&mut self, value: u64) {
        self.add(value);
    }
    #[inline]
    fn write_usize(&mut self, value: usize) {
        self.add(value as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        // A product's high bits depend on all the input bits, its low bits only on the low
        // ones; tables index with the low bits, so fold the high bits down.
        self.0 ^ (self.0 >> 29)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};
    use std::hash::BuildHasher;

    #[test]
    fn consecutive_and_strided_keys_spread_over_low_bits() {
        // Page numbers are dense, and pages of one area often share their low bits (every
        // 256th page, say): both must fill a table's buckets about as a random function would
        // (4096 random keys land in about 2589 of 4096 buckets; a hash that kept only the low
        // bits of page numbers 4096 apart would put them all in one).
        for stride in [1u64, 64, 256, 4096] {
            let builder = IntegerBuildHasher::default();
            let buckets: HashSet<u64> = (0..4096u64)
                .map(|key| builder.hash_one(key * stride) & 4095)
                .collect();
            assert!(
                buckets.len() > 2300,
                "stride {stride}: 4096 keys in {} of 4096 buckets",
                buckets.len()
            );
        }
    }

    #[test]
    fn tuple_keys_differ_by_either_part() {
        let builder = IntegerBuildHasher::default();
        assert_ne!(
            builder.hash_one((1usize, 2u64)),
            builder.hash_one((2usize, 1u64))
        );
        let mut map: HashMap<(usize, u64), u64, IntegerBuildHasher> = HashMap::default();
        for area in 0..8usize {
            for page in 0..1000u64 {
                map.insert((area, page), area as u64 * 1000 + page);
            }
        }
        assert_eq!(map.len(), 8000);
        assert_eq!(map[&(3, 999)], 3999);
    }
}
