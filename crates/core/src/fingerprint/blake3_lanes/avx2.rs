//! The AVX2 kernel: 8 lanes of 32-bit words per register; a 16-lane group runs as two halves.
//!
//! AVX2 has no rotate instruction: rotations by 16 and 8 bits are byte shuffles, by 12 and 7
//! bits two shifts and an OR. Every helper carries the AVX2 target feature so that the
//! intrinsics inline into it and it inlines into the kernels.

use std::arch::x86_64::*;

use super::PREFETCH_BLOCKS_AHEAD;
use super::{
    ChunkLanes, BLOCKS_PER_CHUNK, BLOCK_BYTES, CHUNK_END, CHUNK_START, IV, LANES, ROOT, SCHEDULE,
};

/// Lanes of one AVX2 register.
const HALF: usize = 8;
const _: () = assert!(2 * HALF == LANES);

#[inline]
#[target_feature(enable = "avx2")]
unsafe fn add(left: __m256i, right: __m256i) -> __m256i {
    _mm256_add_epi32(left, right)
}

#[inline]
#[target_feature(enable = "avx2")]
unsafe fn xor(left: __m256i, right: __m256i) -> __m256i {
    _mm256_xor_si256(left, right)
}

#[inline]
#[target_feature(enable = "avx2")]
unsafe fn rotate_right_16(value: __m256i) -> __m256i {
    let order = _mm256_setr_epi8(
        2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9,
        14, 15, 12, 13,
    );
    _mm256_shuffle_epi8(value, order)
}

#[inline]
#[target_feature(enable = "avx2")]
unsafe fn rotate_right_8(value: __m256i) -> __m256i {
    let order = _mm256_setr_epi8(
        1, 2, 3, 0, 5, 6, 7, 4, 9, 10, 11, 8, 13, 14, 15, 12, 1, 2, 3, 0, 5, 6, 7, 4, 9, 10, 11, 8,
        13, 14, 15, 12,
    );
    _mm256_shuffle_epi8(value, order)
}

#[inline]
#[target_feature(enable = "avx2")]
unsafe fn rotate_right_12(value: __m256i) -> __m256i {
    _mm256_or_si256(
        _mm256_srli_epi32::<12>(value),
        _mm256_slli_epi32::<20>(value),
    )
}

#[inline]
#[target_feature(enable = "avx2")]
unsafe fn rotate_right_7(value: __m256i) -> __m256i {
    _mm256_or_si256(
        _mm256_srli_epi32::<7>(value),
        _mm256_slli_epi32::<25>(value),
    )
}

#[inline]
#[target_feature(enable = "avx2")]
unsafe fn mix(
    v: &mut [__m256i; 16],
    a: usize,
    b: usize,
    c: usize,
    d: usize,
    x: __m256i,
    y: __m256i,
) {
    v[a] = add(add(v[a], v[b]), x);
    v[d] = rotate_right_16(xor(v[d], v[a]));
    v[c] = add(v[c], v[d]);
    v[b] = rotate_right_12(xor(v[b], v[c]));
    v[a] = add(add(v[a], v[b]), y);
    v[d] = rotate_right_8(xor(v[d], v[a]));
    v[c] = add(v[c], v[d]);
    v[b] = rotate_right_7(xor(v[b], v[c]));
}

/// Round `ROUND`; a const parameter so that every message index is a constant.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn round<const ROUND: usize>(v: &mut [__m256i; 16], message: &[__m256i; 16]) {
    let order = &SCHEDULE[ROUND];
    mix(v, 0, 4, 8, 12, message[order[0]], message[order[1]]);
    mix(v, 1, 5, 9, 13, message[order[2]], message[order[3]]);
    mix(v, 2, 6, 10, 14, message[order[4]], message[order[5]]);
    mix(v, 3, 7, 11, 15, message[order[6]], message[order[7]]);
    mix(v, 0, 5, 10, 15, message[order[8]], message[order[9]]);
    mix(v, 1, 6, 11, 12, message[order[10]], message[order[11]]);
    mix(v, 2, 7, 8, 13, message[order[12]], message[order[13]]);
    mix(v, 3, 4, 9, 14, message[order[14]], message[order[15]]);
}

/// Transposes 8 rows of 8 words in place: word `w` of lane `l` moves to row `w`, lane `l`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn transpose(rows: &mut [__m256i]) {
    assert_eq!(rows.len(), HALF);
    // Interleave words, then pairs of words: afterwards 128-bit half `h` of `pairs[4k + c]`
    // holds word `4h + c` of rows `4k..4k+4`.
    let mut words = [_mm256_setzero_si256(); HALF];
    for pair in 0..4 {
        words[2 * pair] = _mm256_unpacklo_epi32(rows[2 * pair], rows[2 * pair + 1]);
        words[2 * pair + 1] = _mm256_unpackhi_epi32(rows[2 * pair], rows[2 * pair + 1]);
    }
    let mut pairs = [_mm256_setzero_si256(); HALF];
    for group in 0..2 {
        let base = 4 * group;
        pairs[base] = _mm256_unpacklo_epi64(words[base], words[base + 2]);
        pairs[base + 1] = _mm256_unpackhi_epi64(words[base], words[base + 2]);
        pairs[base + 2] = _mm256_unpacklo_epi64(words[base + 1], words[base + 3]);
        pairs[base + 3] = _mm256_unpackhi_epi64(words[base + 1], words[base + 3]);
    }
    for column in 0..4 {
        rows[column] = _mm256_permute2x128_si256::<0x20>(pairs[column], pairs[4 + column]);
        rows[4 + column] = _mm256_permute2x128_si256::<0x31>(pairs[column], pairs[4 + column]);
    }
}

/// Loads block `block` of each lane's chunk into `message`, transposed.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load_message(chunks: &[*const u8], block: usize, message: &mut [__m256i; 16]) {
    assert_eq!(chunks.len(), HALF);
    for (lane, chunk) in chunks.iter().enumerate() {
        let address = chunk.add(block * BLOCK_BYTES);
        message[lane] = _mm256_loadu_si256(address as *const __m256i);
        message[HALF + lane] = _mm256_loadu_si256(address.add(32) as *const __m256i);
    }
    let (low, high) = message.split_at_mut(HALF);
    transpose(low);
    transpose(high);
}

#[inline]
#[target_feature(enable = "avx2")]
unsafe fn compress_block(
    cv: &mut [__m256i; 8],
    message: &[__m256i; 16],
    counter_low: __m256i,
    counter_high: __m256i,
    block_len: __m256i,
    flags: __m256i,
) {
    let mut v = [
        cv[0],
        cv[1],
        cv[2],
        cv[3],
        cv[4],
        cv[5],
        cv[6],
        cv[7],
        _mm256_set1_epi32(IV[0] as i32),
        _mm256_set1_epi32(IV[1] as i32),
        _mm256_set1_epi32(IV[2] as i32),
        _mm256_set1_epi32(IV[3] as i32),
        counter_low,
        counter_high,
        block_len,
        flags,
    ];
    round::<0>(&mut v, message);
    round::<1>(&mut v, message);
    round::<2>(&mut v, message);
    round::<3>(&mut v, message);
    round::<4>(&mut v, message);
    round::<5>(&mut v, message);
    round::<6>(&mut v, message);
    for index in 0..8 {
        cv[index] = xor(v[index], v[index + 8]);
    }
}

#[inline]
#[target_feature(enable = "avx2")]
unsafe fn initial_cv(key: &[u32; 8]) -> [__m256i; 8] {
    let mut cv = [_mm256_setzero_si256(); 8];
    for (vector, &word) in cv.iter_mut().zip(key) {
        *vector = _mm256_set1_epi32(word as i32);
    }
    cv
}

/// Writes the 8 lanes' CVs out of the 8 word vectors.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn store_cvs(cv: &[__m256i; 8], out: &mut [[u32; 8]]) {
    let mut words = [[0u32; HALF]; 8];
    for (row, vector) in words.iter_mut().zip(cv) {
        _mm256_storeu_si256(row.as_mut_ptr() as *mut __m256i, *vector);
    }
    for (lane, lane_cv) in out.iter_mut().enumerate() {
        for (word, row) in lane_cv.iter_mut().zip(&words) {
            *word = row[lane];
        }
    }
}

#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load_words(words: &[u32]) -> __m256i {
    assert_eq!(words.len(), HALF);
    _mm256_loadu_si256(words.as_ptr() as *const __m256i)
}

/// The CVs of lanes `first..first + 8` of `lanes` (see [`super::avx512::chunk_cvs`]).
#[target_feature(enable = "avx2")]
unsafe fn chunk_cvs_half(lanes: &ChunkLanes, first: usize, out: &mut [[u32; 8]]) {
    let range = first..first + HALF;
    let chunks = &lanes.chunks[range.clone()];
    let low = lanes.counters.map(|counter| counter as u32);
    let high = lanes.counters.map(|counter| (counter >> 32) as u32);
    let counter_low = load_words(&low[range.clone()]);
    let counter_high = load_words(&high[range.clone()]);
    let counts = lanes.block_counts.map(u32::from);
    let block_counts = load_words(&counts[range.clone()]);
    let lens = lanes.last_block_lens.map(u32::from);
    let last_block_lens = load_words(&lens[range.clone()]);
    let end_flags = lanes
        .roots
        .map(|root| if root { CHUNK_END | ROOT } else { CHUNK_END });
    let end_flags = load_words(&end_flags[range.clone()]);
    let block_count_max = lanes.block_counts[range]
        .iter()
        .copied()
        .max()
        .expect("8 lanes") as usize;
    assert!((1..=BLOCKS_PER_CHUNK).contains(&block_count_max));
    let full_block_len = _mm256_set1_epi32(BLOCK_BYTES as i32);
    let mut cv = initial_cv(&lanes.key);
    let mut message = [_mm256_setzero_si256(); 16];
    for block in 0..block_count_max {
        // A lane past its last block reads on inside its 1024 bytes; its result is masked.
        load_message(chunks, block, &mut message);
        for chunk in chunks {
            _mm_prefetch::<_MM_HINT_T0>(
                chunk.wrapping_add((block + PREFETCH_BLOCKS_AHEAD) * BLOCK_BYTES) as *const i8,
            );
        }
        let ending = _mm256_cmpeq_epi32(block_counts, _mm256_set1_epi32(block as i32 + 1));
        let active = _mm256_cmpgt_epi32(block_counts, _mm256_set1_epi32(block as i32));
        let start = _mm256_set1_epi32(if block == 0 {
            (CHUNK_START | lanes.mode_flags) as i32
        } else {
            lanes.mode_flags as i32
        });
        let flags = _mm256_or_si256(start, _mm256_and_si256(ending, end_flags));
        let block_lens = _mm256_blendv_epi8(full_block_len, last_block_lens, ending);
        let mut next = cv;
        compress_block(
            &mut next,
            &message,
            counter_low,
            counter_high,
            block_lens,
            flags,
        );
        for (word, new) in cv.iter_mut().zip(next) {
            *word = _mm256_blendv_epi8(*word, new, active);
        }
    }
    store_cvs(&cv, out);
}

/// The CV of each lane's chunk, as [`super::avx512::chunk_cvs`] computes it, in two halves.
///
/// # Safety
/// The CPU must support AVX2, and each pointer must address 1024 readable bytes.
#[target_feature(enable = "avx2")]
pub unsafe fn chunk_cvs(lanes: &ChunkLanes) -> [[u32; 8]; LANES] {
    let mut out = [[0u32; 8]; LANES];
    let (low, high) = out.split_at_mut(HALF);
    chunk_cvs_half(lanes, 0, low);
    chunk_cvs_half(lanes, HALF, high);
    out
}

/// Parent compressions, as [`super::avx512::parent_cvs`] computes them, in two halves.
///
/// # Safety
/// The CPU must support AVX2, and every pointer must address 64 readable bytes.
#[target_feature(enable = "avx2")]
pub unsafe fn parent_cvs(
    blocks: &[*const u8; LANES],
    flags: &[u32; LANES],
    key: &[u32; 8],
) -> [[u32; 8]; LANES] {
    let mut out = [[0u32; 8]; LANES];
    let zero = _mm256_setzero_si256();
    let block_len = _mm256_set1_epi32(BLOCK_BYTES as i32);
    for (half, out) in out.chunks_mut(HALF).enumerate() {
        let range = half * HALF..(half + 1) * HALF;
        let mut message = [_mm256_setzero_si256(); 16];
        load_message(&blocks[range.clone()], 0, &mut message);
        let mut cv = initial_cv(key);
        compress_block(
            &mut cv,
            &message,
            zero,
            zero,
            block_len,
            load_words(&flags[range]),
        );
        store_cvs(&cv, out);
    }
    out
}
