//! FastCDC: content-defined chunking with a gear hash and normalized chunking (Xia et al.,
//! USENIX ATC 2016).
//!
//! The **gear hash** rolls one byte per step, `hash = (hash << 1) + GEAR[byte]`, so bit `k`
//! of the hash depends on the last `k + 1` bytes; the masks therefore test high bits (bit 60
//! and below), which mix the last 61 bytes. A cut falls after the first byte where
//! `hash & mask == 0`.
//!
//! **Normalized chunking** uses two masks: before the average size a *harder* mask with
//! `log2(average) + 2` bits, from the average on an *easier* one with `log2(average) - 2`
//! bits. Chunk sizes then cluster around the average instead of following a geometric
//! distribution, and the average comes out close to the configured one.
//!
//! Bytes before the minimum size are skipped without hashing (the hash starts from zero at the
//! minimum), which is also what makes FastCDC fast. Defaults: `min = average / 4` and
//! `max = average * 4` (`fastcdc:8192` means 2 KiB / 8 KiB / 32 KiB).

use super::{assert_cut_input, Chunker, Cut, SizeRange};

/// Bits added to (before the average) and removed from (after it) the mask: normalization
/// level 2, as the FastCDC paper recommends.
const NORMALIZATION_BITS: u32 = 2;

/// The gear table: 256 pseudo-random 64-bit values, generated at compile time with splitmix64
/// from a fixed seed so that chunk boundaries never change between builds.
pub(crate) static GEAR: [u64; 256] = gear_table(0x6f6e_6563_6f70_7931);

const fn gear_table(seed: u64) -> [u64; 256] {
    let mut table = [0u64; 256];
    let mut state = seed;
    let mut index = 0;
    while index < 256 {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut mixed = state;
        mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        table[index] = mixed ^ (mixed >> 31);
        index += 1;
    }
    table
}

/// The gear table shifted left by `k` bits (`GEAR_SHIFTED[k]`), for rolling four bytes per
/// step (see [`scan`]).
static GEAR_SHIFTED: [[u64; 256]; 4] = {
    let mut tables = [[0u64; 256]; 4];
    let mut shift = 0;
    while shift < 4 {
        let mut index = 0;
        while index < 256 {
            tables[shift][index] = GEAR[index] << shift;
            index += 1;
        }
        shift += 1;
    }
    tables
};

/// Bytes rolled per step of [`scan`].
const STEP_BYTES: usize = 4;

/// The highest bit a mask may test: the masks shifted left by up to `STEP_BYTES - 1` bits
/// (see [`scan`]) must still fit in 64 bits.
const MASK_TOP_BIT: u32 = 64 - STEP_BYTES as u32;

/// A mask of `bits` consecutive bits ending at bit [`MASK_TOP_BIT`]; bit 60 of the gear hash
/// mixes the last 61 bytes.
const fn high_mask(bits: u32) -> u64 {
    ((1u64 << bits) - 1) << (MASK_TOP_BIT + 1 - bits)
}

/// The FastCDC chunker; see the module documentation.
#[derive(Clone, Debug)]
pub struct FastCdcChunker {
    sizes: SizeRange,
    mask_hard: u64,
    mask_easy: u64,
}

impl FastCdcChunker {
    /// A chunker for `sizes` (validated by [`super::ChunkerSpec`]: power-of-two average,
    /// `64 <= min <= average <= max`).
    pub fn new(sizes: SizeRange) -> Self {
        assert!(sizes.bytes_average.is_power_of_two());
        assert!(sizes.bytes_min <= sizes.bytes_average && sizes.bytes_average <= sizes.bytes_max);
        let bits = sizes.bytes_average.trailing_zeros();
        assert!(bits > NORMALIZATION_BITS && bits + NORMALIZATION_BITS <= MASK_TOP_BIT);
        FastCdcChunker {
            sizes,
            mask_hard: high_mask(bits + NORMALIZATION_BITS),
            mask_easy: high_mask(bits - NORMALIZATION_BITS),
        }
    }

    /// The default size range for an average: `average / 4`, `average`, `average * 4`.
    pub fn default_sizes(bytes_average: usize) -> SizeRange {
        SizeRange {
            bytes_min: bytes_average / 4,
            bytes_average,
            bytes_max: bytes_average * 4,
        }
    }
}

/// Rolls the gear hash over `data[start..end]` and returns the position after the first byte
/// whose hash matches `mask`, or `None` (then `hash` holds the hash after `end`; after a match
/// it is meaningless).
///
/// Four bytes per step, to shorten the chain of dependent instructions: with `base = hash << 4`
/// the hash after the `k`-th byte of the step, shifted left by `4 - k`, is `base` plus a sum of
/// shifted gear values that does not depend on `hash`. Testing it against `mask << (4 - k)`
/// tests the `k`-th hash against `mask`, because the mask's top bit is at most
/// [`MASK_TOP_BIT`], so no tested bit is shifted out.
#[inline(always)]
fn scan(data: &[u8], start: usize, end: usize, hash: &mut u64, mask: u64) -> Option<usize> {
    let bytes = &data[start..end];
    let mut steps = bytes.chunks_exact(STEP_BYTES);
    let mut position = start;
    let mut rolling = *hash;
    for step in &mut steps {
        let term_first = GEAR_SHIFTED[3][step[0] as usize];
        let term_second = term_first.wrapping_add(GEAR_SHIFTED[2][step[1] as usize]);
        let term_third = term_second.wrapping_add(GEAR_SHIFTED[1][step[2] as usize]);
        let term_fourth = term_third.wrapping_add(GEAR[step[3] as usize]);
        let base = rolling << 4;
        // Computed before the tests so that the compiler keeps `next` off the chain of the
        // tested values (it would otherwise add the fourth term to the third hash, lengthening
        // the dependency chain between steps).
        let next = base.wrapping_add(term_fourth);
        if base.wrapping_add(term_first) & (mask << 3) == 0 {
            return Some(position + 1);
        }
        if base.wrapping_add(term_second) & (mask << 2) == 0 {
            return Some(position + 2);
        }
        if base.wrapping_add(term_third) & (mask << 1) == 0 {
            return Some(position + 3);
        }
        rolling = next;
        if rolling & mask == 0 {
            return Some(position + 4);
        }
        position += STEP_BYTES;
    }
    for &byte in steps.remainder() {
        rolling = (rolling << 1).wrapping_add(GEAR[byte as usize]);
        position += 1;
        if rolling & mask == 0 {
            return Some(position);
        }
    }
    *hash = rolling;
    None
}

impl Chunker for FastCdcChunker {
    fn next_cut(&mut self, data: &[u8], end_of_stream: bool) -> Cut {
        assert_cut_input(data, end_of_stream, self.sizes.bytes_max);
        let len = data.len().min(self.sizes.bytes_max);
        let cut = |len| Cut {
            len,
            ends_segment: false,
        };
        if len <= self.sizes.bytes_min {
            return cut(len);
        }
        let normal = self.sizes.bytes_average.min(len);
        let mut hash = 0u64;
        if let Some(end) = scan(
            data,
            self.sizes.bytes_min,
            normal,
            &mut hash,
            self.mask_hard,
        ) {
            return cut(end);
        }
        if let Some(end) = scan(data, normal, len, &mut hash, self.mask_easy) {
            return cut(end);
        }
        cut(len)
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

    /// Goal: the four-bytes-per-step scan finds exactly the cut of the plain one-byte gear
    /// rule; method: compare with a direct implementation on random data and several masks.
    #[test]
    fn paired_scan_matches_plain_gear_rule() {
        let mut state = 12345u64;
        let data: Vec<u8> = (0..200_000)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (state >> 56) as u8
            })
            .collect();
        for bits in [4u32, 7, 10, 13] {
            let mask = high_mask(bits);
            let mut start = 0;
            while start < data.len() - 1 {
                for end in [data.len(), data.len() - 1] {
                    let mut plain_hash = 0u64;
                    let plain = data[start..end].iter().position(|&byte| {
                        plain_hash = (plain_hash << 1).wrapping_add(GEAR[byte as usize]);
                        plain_hash & mask == 0
                    });
                    let mut hash = 0;
                    let paired = scan(&data, start, end, &mut hash, mask);
                    assert_eq!(paired, plain.map(|index| start + index + 1));
                    if plain.is_none() {
                        assert_eq!(hash, plain_hash);
                    }
                }
                start += 1 + (start % 977);
            }
        }
    }
}
