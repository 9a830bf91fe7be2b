//! The set of fingerprints seen so far in a pass.
//!
//! Keys are the first 16 bytes of the BLAKE3 fingerprint. With `n` distinct chunks the chance
//! that two of them share a 128-bit prefix is about `n^2 / 2^129`: for 2^30 chunks (4 TiB at
//! 4 KiB) about 2^-69, far below the chance of a disk error, and an estimate needs no more.
//!
//! Memory: a `HashSet<u128>` stores 16 bytes per bucket plus one control byte, with 1/8 to 9/16
//! of the buckets empty (it doubles when 7/8 full), so 19.4 to 38.9 bytes per unique chunk in
//! steady state; while it doubles, the old and the new table coexist, so the peak is 1.5 times
//! that. [`SeenSet::memory_bytes`] reports the table's size. Measured with
//! `scripts/bench-analyze.sh` (peak resident memory of `onecopy analyze --chunker fixed:4096`
//! on random data, all chunks unique): 48.9 MiB for 1 GiB (262,144 chunks), 61.6 MiB for 2 GiB,
//! 87.1 MiB for 4 GiB (1,048,576 chunks); the 2 to 4 GiB step, 25.5 MiB for 524,288 more
//! chunks, is 51 bytes per unique chunk at the peak of a doubling (34 bytes in the table after
//! it). The rest, about 35 MiB, is the read blocks and the program.

use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hasher};

use onecopy_core::fingerprint::Fingerprint;

/// Bytes per bucket of the table: a 16-byte key and one control byte.
const BUCKET_BYTES: usize = 16 + 1;

/// A hasher for keys that are already uniformly random: it passes the key's low 64 bits
/// through instead of hashing again.
#[derive(Default)]
pub struct PrefixHasher {
    state: u64,
}

impl Hasher for PrefixHasher {
    fn finish(&self) -> u64 {
        self.state
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only used if a key is hashed byte-wise; fold the bytes in so the result stays sound.
        for &byte in bytes {
            self.state = self.state.rotate_left(8) ^ byte as u64;
        }
    }

    fn write_u128(&mut self, value: u128) {
        self.state = value as u64;
    }
}

/// Distinct chunk keys seen in a pass.
#[derive(Default)]
pub struct SeenSet {
    keys: HashSet<u128, BuildHasherDefault<PrefixHasher>>,
}

impl SeenSet {
    pub fn new() -> SeenSet {
        SeenSet::default()
    }

    /// The key of a fingerprint: its first 16 bytes.
    pub fn key(fingerprint: &Fingerprint) -> u128 {
        u128::from_le_bytes(fingerprint.0[..16].try_into().expect("16 bytes"))
    }

    /// Adds `key`; true if it was not there yet.
    pub fn insert(&mut self, key: u128) -> bool {
        self.keys.insert(key)
    }

    /// Bytes of the table (buckets times bucket size).
    pub fn memory_bytes(&self) -> usize {
        // The std set reports capacity as 7/8 of its power-of-two bucket count.
        let buckets = if self.keys.capacity() == 0 {
            0
        } else {
            (self.keys.capacity() * 8 / 7).next_power_of_two()
        };
        buckets * BUCKET_BYTES
    }
}
