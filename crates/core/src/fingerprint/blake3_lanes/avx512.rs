//! The AVX-512 kernel: 16 lanes of 32-bit words per register.
//!
//! Every helper carries the AVX-512 target feature so that the intrinsics inline into it and it
//! inlines into [`chunk_cvs`].

use std::arch::x86_64::*;

use super::{
    ChunkLanes, BLOCKS_PER_CHUNK, BLOCK_BYTES, CHUNK_END, CHUNK_START, IV, LANES, ROOT, SCHEDULE,
};

#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn add(left: __m512i, right: __m512i) -> __m512i {
    _mm512_add_epi32(left, right)
}

#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn xor(left: __m512i, right: __m512i) -> __m512i {
    _mm512_xor_si512(left, right)
}

#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn mix(
    v: &mut [__m512i; 16],
    a: usize,
    b: usize,
    c: usize,
    d: usize,
    x: __m512i,
    y: __m512i,
) {
    v[a] = add(add(v[a], v[b]), x);
    v[d] = _mm512_ror_epi32::<16>(xor(v[d], v[a]));
    v[c] = add(v[c], v[d]);
    v[b] = _mm512_ror_epi32::<12>(xor(v[b], v[c]));
    v[a] = add(add(v[a], v[b]), y);
    v[d] = _mm512_ror_epi32::<8>(xor(v[d], v[a]));
    v[c] = add(v[c], v[d]);
    v[b] = _mm512_ror_epi32::<7>(xor(v[b], v[c]));
}

/// Round `ROUND` of the compression. The round is a const parameter so that every message
/// index is a constant: the message stays in registers and needs no bounds checks.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn round<const ROUND: usize>(v: &mut [__m512i; 16], message: &[__m512i; 16]) {
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

/// Loads block `block` of each lane's chunk into `message`, transposed: word `w` of the
/// result holds word `w` of every lane's block. Works in place in `message` (no arrays are
/// returned by value, which the compiler would copy with `memcpy`).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load_message(chunks: &[*const u8; LANES], block: usize, message: &mut [__m512i; 16]) {
    for (row, chunk) in message.iter_mut().zip(chunks) {
        *row = _mm512_loadu_si512(chunk.add(block * BLOCK_BYTES) as *const _);
    }
    // Interleave words of neighbouring lanes, then pairs of words: afterwards 128-bit block
    // `l` of vector `4k + c` holds word `4l + c` of lanes `4k..4k+4`.
    for pair in 0..8 {
        let (even, odd) = (message[2 * pair], message[2 * pair + 1]);
        message[2 * pair] = _mm512_unpacklo_epi32(even, odd);
        message[2 * pair + 1] = _mm512_unpackhi_epi32(even, odd);
    }
    for group in 0..4 {
        let base = 4 * group;
        let (w0, w1, w2, w3) = (
            message[base],
            message[base + 1],
            message[base + 2],
            message[base + 3],
        );
        message[base] = _mm512_unpacklo_epi64(w0, w2);
        message[base + 1] = _mm512_unpackhi_epi64(w0, w2);
        message[base + 2] = _mm512_unpacklo_epi64(w1, w3);
        message[base + 3] = _mm512_unpackhi_epi64(w1, w3);
    }
    // Transpose the 4 x 4 grid of 128-bit blocks of the vectors `c, 4 + c, 8 + c, 12 + c`:
    // block `l` of the four lane groups becomes word `4l + c`.
    for column in 0..4 {
        let (x0, x1, x2, x3) = (
            message[column],
            message[4 + column],
            message[8 + column],
            message[12 + column],
        );
        let y0 = _mm512_shuffle_i32x4::<0x44>(x0, x1);
        let y1 = _mm512_shuffle_i32x4::<0xEE>(x0, x1);
        let y2 = _mm512_shuffle_i32x4::<0x44>(x2, x3);
        let y3 = _mm512_shuffle_i32x4::<0xEE>(x2, x3);
        message[column] = _mm512_shuffle_i32x4::<0x88>(y0, y2);
        message[4 + column] = _mm512_shuffle_i32x4::<0xDD>(y0, y2);
        message[8 + column] = _mm512_shuffle_i32x4::<0x88>(y1, y3);
        message[12 + column] = _mm512_shuffle_i32x4::<0xDD>(y1, y3);
    }
}

/// Compresses one block in every lane: `cv` is updated to the output CV (the first 8 words
/// of the output, which for a root compression is the hash).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn compress_block(
    cv: &mut [__m512i; 8],
    message: &[__m512i; 16],
    counter_low: __m512i,
    counter_high: __m512i,
    block_len: __m512i,
    flags: __m512i,
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
        _mm512_set1_epi32(IV[0] as i32),
        _mm512_set1_epi32(IV[1] as i32),
        _mm512_set1_epi32(IV[2] as i32),
        _mm512_set1_epi32(IV[3] as i32),
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
#[target_feature(enable = "avx512f")]
unsafe fn initial_cv(key: &[u32; 8]) -> [__m512i; 8] {
    let mut cv = [_mm512_setzero_si512(); 8];
    for (vector, &word) in cv.iter_mut().zip(key) {
        *vector = _mm512_set1_epi32(word as i32);
    }
    cv
}

/// Splits the lanes' CVs out of the 8 word vectors.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn lane_cvs(cv: &[__m512i; 8]) -> [[u32; 8]; LANES] {
    let mut words = [[0u32; LANES]; 8];
    for (row, vector) in words.iter_mut().zip(cv) {
        _mm512_storeu_si512(row.as_mut_ptr() as *mut _, *vector);
    }
    let mut out = [[0u32; 8]; LANES];
    for (lane, lane_cv) in out.iter_mut().enumerate() {
        for (word, row) in lane_cv.iter_mut().zip(&words) {
            *word = row[lane];
        }
    }
    out
}

use super::PREFETCH_BLOCKS_AHEAD;

/// The CV of each lane's chunk (for a root chunk, its hash). Lanes run as many blocks as the
/// longest chunk; a lane whose chunk has ended keeps its CV (masked update).
///
/// # Safety
/// The CPU must support AVX-512F, and each pointer must address 1024 readable bytes (a
/// full chunk, or a zero-padded copy of a partial one).
#[target_feature(enable = "avx512f")]
pub unsafe fn chunk_cvs(lanes: &ChunkLanes) -> [[u32; 8]; LANES] {
    let low = lanes.counters.map(|counter| counter as u32);
    let high = lanes.counters.map(|counter| (counter >> 32) as u32);
    let counter_low = _mm512_loadu_si512(low.as_ptr() as *const _);
    let counter_high = _mm512_loadu_si512(high.as_ptr() as *const _);
    let block_count_max = lanes.block_counts.iter().copied().max().expect("16 lanes") as usize;
    assert!((1..=BLOCKS_PER_CHUNK).contains(&block_count_max));
    // Per-lane constants as vectors, so that each block's flags, lengths and active lanes
    // take a few vector instructions.
    let block_counts = _mm512_loadu_si512(lanes.block_counts.map(u32::from).as_ptr() as *const _);
    let last_block_lens =
        _mm512_loadu_si512(lanes.last_block_lens.map(u32::from).as_ptr() as *const _);
    let end_flags = lanes
        .roots
        .map(|root| if root { CHUNK_END | ROOT } else { CHUNK_END });
    let end_flags = _mm512_loadu_si512(end_flags.as_ptr() as *const _);
    let full_block_len = _mm512_set1_epi32(BLOCK_BYTES as i32);
    let mut cv = initial_cv(&lanes.key);
    let mut message = [_mm512_setzero_si512(); 16];
    for block in 0..block_count_max {
        // A lane past its last block reads on inside its 1024 bytes; its result is masked.
        load_message(&lanes.chunks, block, &mut message);
        // Sixteen interleaved streams are more than the hardware prefetcher follows well:
        // ask for the blocks after next explicitly (a hint: never faults, even past an end).
        for chunk in &lanes.chunks {
            _mm_prefetch::<_MM_HINT_T0>(
                chunk.wrapping_add((block + PREFETCH_BLOCKS_AHEAD) * BLOCK_BYTES) as *const i8,
            );
        }
        let ending = _mm512_cmpeq_epi32_mask(block_counts, _mm512_set1_epi32(block as i32 + 1));
        let active = _mm512_cmpgt_epi32_mask(block_counts, _mm512_set1_epi32(block as i32));
        let start = _mm512_set1_epi32(if block == 0 {
            (CHUNK_START | lanes.mode_flags) as i32
        } else {
            lanes.mode_flags as i32
        });
        let flags = _mm512_or_si512(start, _mm512_maskz_mov_epi32(ending, end_flags));
        let block_lens = _mm512_mask_mov_epi32(full_block_len, ending, last_block_lens);
        if active == 0xFFFF {
            compress_block(
                &mut cv,
                &message,
                counter_low,
                counter_high,
                block_lens,
                flags,
            );
        } else {
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
                *word = _mm512_mask_mov_epi32(*word, active, new);
            }
        }
    }
    lane_cvs(&cv)
}

/// Parent compressions, one per lane: `blocks[lane]` addresses the 64-byte block of the
/// left and right child CVs, `flags[lane]` is PARENT, or PARENT | ROOT for a root (with the
/// mode's flags), and `key` is the mode's key words.
///
/// # Safety
/// The CPU must support AVX-512F, and every pointer must address 64 readable bytes.
#[target_feature(enable = "avx512f")]
pub unsafe fn parent_cvs(
    blocks: &[*const u8; LANES],
    flags: &[u32; LANES],
    key: &[u32; 8],
) -> [[u32; 8]; LANES] {
    let mut message = [_mm512_setzero_si512(); 16];
    load_message(blocks, 0, &mut message);
    let zero = _mm512_setzero_si512();
    let flags = _mm512_loadu_si512(flags.as_ptr() as *const _);
    let mut cv = initial_cv(key);
    let block_len = _mm512_set1_epi32(BLOCK_BYTES as i32);
    compress_block(&mut cv, &message, zero, zero, block_len, flags);
    lane_cvs(&cv)
}
