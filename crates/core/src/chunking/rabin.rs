//! Rabin fingerprinting over a sliding window (Rabin 1981; used by LBFS and by paper 2,
//! RevDedup §2.2.2).
//!
//! The **Rabin fingerprint** of a byte string is the string read as a polynomial over GF(2)
//! (eight coefficients per byte, first byte highest), reduced modulo an irreducible polynomial
//! [`POLYNOMIAL`] of degree 53. The **window** is the last [`WINDOW_BYTES`] bytes; sliding it
//! one byte costs two table lookups: the leaving byte's contribution is removed with
//! [`RabinTables::remove`] and the new byte is appended with [`RabinTables::append`]. So the
//! new rolling hash is computed from the last one, as the paper requires.
//!
//! A chunk ends after the first byte (at or past the minimum size) where the low `n` bits of
//! the window's fingerprint are all ones (the *target pattern*; all ones rather than zeros so
//! that runs of zero bytes, whose fingerprint is 0, are cut at the maximum size instead of
//! the minimum). `n = round(log2(average - min))`, so that the expected chunk, the minimum
//! plus a geometric tail, is close to the average. Defaults (paper 2): `min = average / 2`
//! and `max = average * 2` (`rabin:8192` means 4 KiB / 8 KiB / 16 KiB).

use super::{assert_cut_input, Chunker, Cut, SizeRange};

/// The modulus: an irreducible polynomial of degree 53 over GF(2) (bit `k` is the
/// coefficient of `x^k`), chosen at random once and fixed so that boundaries never change.
/// The test `polynomial_is_irreducible` proves irreducibility.
pub const POLYNOMIAL: u64 = 0x002a_2b8c_6c88_c537;

/// Degree of [`POLYNOMIAL`]: fingerprints are below `2^53`.
const DEGREE: u32 = 53;

/// Bytes in the sliding window.
pub const WINDOW_BYTES: usize = 48;

/// Lookup tables for appending a byte to and removing a byte from the window.
pub struct RabinTables {
    /// `append[t]` is `t * x^53 + (t * x^53 mod P)`: XOR-ing it into `hash << 8` clears the
    /// eight bits shifted past the degree and adds their remainder.
    pub append: [u64; 256],
    /// `remove[b]` is `b * x^(8 * (WINDOW_BYTES - 1)) mod P`: the contribution of byte `b` at
    /// the oldest window position.
    pub remove: [u64; 256],
}

/// The tables for [`POLYNOMIAL`] and [`WINDOW_BYTES`], computed at compile time.
pub static TABLES: RabinTables = build_tables();

const fn build_tables() -> RabinTables {
    let mut append = [0u64; 256];
    let mut top = 0;
    while top < 256 {
        let mut value = (top as u64) << DEGREE;
        let mut bit = DEGREE + 7;
        while bit >= DEGREE {
            if value & (1u64 << bit) != 0 {
                value ^= POLYNOMIAL << (bit - DEGREE);
            }
            bit -= 1;
        }
        append[top] = value | ((top as u64) << DEGREE);
        top += 1;
    }
    let mut remove = [0u64; 256];
    let mut byte = 0;
    while byte < 256 {
        let mut hash = byte as u64;
        let mut step = 1;
        while step < WINDOW_BYTES {
            hash = (hash << 8) ^ append[(hash >> (DEGREE - 8)) as usize];
            step += 1;
        }
        remove[byte] = hash;
        byte += 1;
    }
    RabinTables { append, remove }
}

/// Appends `byte` to a fingerprint: `(hash * x^8 + byte) mod P`.
#[inline(always)]
pub fn append_byte(hash: u64, byte: u8) -> u64 {
    ((hash << 8) | byte as u64) ^ TABLES.append[(hash >> (DEGREE - 8)) as usize]
}

/// Slides the window by one byte: removes `leaving` (the oldest byte) and appends `entering`.
#[inline(always)]
pub fn roll(hash: u64, leaving: u8, entering: u8) -> u64 {
    append_byte(hash ^ TABLES.remove[leaving as usize], entering)
}

/// Mask of the low `bits` bits: the target pattern for a match.
pub(crate) fn pattern_mask(bits: u32) -> u64 {
    assert!(bits < DEGREE);
    (1u64 << bits) - 1
}

/// Bits of the pattern that make the expected length of the geometric tail `tail_bytes`.
pub(crate) fn pattern_bits(tail_bytes: usize) -> u32 {
    if tail_bytes <= 1 {
        return 0;
    }
    let floor = usize::BITS - 1 - tail_bytes.leading_zeros();
    // Round to the nearer power of two: up when the remainder is at least half of 2^floor.
    if (tail_bytes - (1 << floor)) * 2 >= (1 << floor) {
        floor + 1
    } else {
        floor
    }
}

/// Scans `data[..end]` for the first chunk end at or after `min`: the length `L` such that the
/// fingerprint of `data[L - WINDOW_BYTES..L]` has its low bits (`mask`) all set. Returns the
/// length and that fingerprint.
#[inline]
pub(crate) fn scan(data: &[u8], min: usize, end: usize, mask: u64) -> Option<(usize, u64)> {
    assert!(
        min >= WINDOW_BYTES,
        "the window must fit before the minimum size"
    );
    assert!(min <= end && end <= data.len());
    let mut hash = 0u64;
    for &byte in &data[min - WINDOW_BYTES..min] {
        hash = append_byte(hash, byte);
    }
    if hash & mask == mask {
        return Some((min, hash));
    }
    let leaving = &data[min - WINDOW_BYTES..end - WINDOW_BYTES];
    let entering = &data[min..end];
    for (index, (&old, &new)) in leaving.iter().zip(entering).enumerate() {
        hash = roll(hash, old, new);
        if hash & mask == mask {
            return Some((min + index + 1, hash));
        }
    }
    None
}

/// The Rabin chunker; see the module documentation.
#[derive(Clone, Debug)]
pub struct RabinChunker {
    sizes: SizeRange,
    mask: u64,
}

impl RabinChunker {
    /// A chunker for `sizes` (validated by [`super::ChunkerSpec`]: power-of-two average,
    /// `64 <= min <= average <= max`).
    pub fn new(sizes: SizeRange) -> Self {
        assert!(sizes.bytes_min >= WINDOW_BYTES);
        assert!(sizes.bytes_min <= sizes.bytes_average && sizes.bytes_average <= sizes.bytes_max);
        RabinChunker {
            sizes,
            mask: pattern_mask(pattern_bits(sizes.bytes_average - sizes.bytes_min)),
        }
    }

    /// The default size range for an average (paper 2): half, the average, twice.
    pub fn default_sizes(bytes_average: usize) -> SizeRange {
        SizeRange {
            bytes_min: bytes_average / 2,
            bytes_average,
            bytes_max: bytes_average * 2,
        }
    }
}

impl Chunker for RabinChunker {
    fn next_cut(&mut self, data: &[u8], end_of_stream: bool) -> Cut {
        assert_cut_input(data, end_of_stream, self.sizes.bytes_max);
        let limit = data.len().min(self.sizes.bytes_max);
        let len = if limit <= self.sizes.bytes_min {
            limit
        } else {
            scan(data, self.sizes.bytes_min, limit, self.mask).map_or(limit, |(len, _)| len)
        };
        Cut {
            len,
            ends_segment: false,
        }
    }

    fn chunk_bytes_max(&self) -> usize {
        self.sizes.bytes_max
    }

    fn cut_state(&self) -> u64 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Product of two polynomials modulo [`POLYNOMIAL`] (test-only, bit by bit).
    fn multiply_mod(mut left: u64, mut right: u64) -> u64 {
        let mut product = 0u64;
        while right != 0 {
            if right & 1 != 0 {
                product ^= left;
            }
            right >>= 1;
            left <<= 1;
            if left & (1 << DEGREE) != 0 {
                left ^= POLYNOMIAL;
            }
        }
        product
    }

    fn degree(value: u64) -> i32 {
        63 - value.leading_zeros() as i32
    }

    fn remainder(mut value: u64, modulus: u64) -> u64 {
        while value != 0 && degree(value) >= degree(modulus) {
            value ^= modulus << (degree(value) - degree(modulus));
        }
        value
    }

    fn gcd(mut left: u64, mut right: u64) -> u64 {
        while right != 0 {
            let next = remainder(left, right);
            left = right;
            right = next;
        }
        left
    }

    /// Goal: the modulus is irreducible, as Rabin fingerprints require; method: Ben-Or's test,
    /// gcd(x^(2^i) - x, P) = 1 for every i up to half the degree.
    #[test]
    fn polynomial_is_irreducible() {
        assert_eq!(degree(POLYNOMIAL), DEGREE as i32);
        let x = 2u64;
        let mut power = x;
        for _ in 1..=DEGREE / 2 {
            power = multiply_mod(power, power);
            assert_eq!(gcd(POLYNOMIAL, power ^ x), 1);
        }
    }

    /// Goal: the rolling hash equals the fingerprint of the window computed from scratch;
    /// method: roll over pseudo-random bytes and recompute each window directly.
    #[test]
    fn rolling_equals_direct() {
        let data: Vec<u8> = (0..500u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        let direct = |window: &[u8]| {
            window.iter().fold(0u64, |hash, &byte| {
                let shifted = (0..8).fold(hash, |value, _| multiply_mod(value, 2));
                shifted ^ byte as u64
            })
        };
        let mut hash = data[..WINDOW_BYTES]
            .iter()
            .fold(0, |hash, &byte| append_byte(hash, byte));
        for end in WINDOW_BYTES..data.len() {
            assert_eq!(hash, direct(&data[end - WINDOW_BYTES..end]));
            assert!(hash < 1 << DEGREE);
            hash = roll(hash, data[end - WINDOW_BYTES], data[end]);
        }
    }

    /// Goal: the pattern width rounds log2 to the nearer integer.
    #[test]
    fn pattern_bits_round() {
        assert_eq!(pattern_bits(4096), 12);
        assert_eq!(pattern_bits(6143), 12);
        assert_eq!(pattern_bits(6144), 13);
        assert_eq!(pattern_bits(1), 0);
    }
}
