//! BLAKE3 for many independent small inputs at once, one input chunk per SIMD lane.
//!
//! The `blake3` crate hashes one input at a time; it spreads a *large* input's 1 KiB chunks
//! over SIMD lanes, but a 4 KiB input has only four chunks to spread, so single small inputs
//! leave most of an AVX-512 register idle. Here the full 1 KiB chunks of *many* inputs are
//! compressed side by side, 16 per AVX-512 register (each lane with its own chunk counter),
//! and only the few remaining compressions (a partial last chunk, the parent nodes of each
//! input's tree) run one at a time. The output is byte-identical to `blake3::hash` (the
//! property test `matches_blake3_crate` checks it over random lengths and batch sizes).
//!
//! BLAKE3 terms (from the BLAKE3 specification): an input is split into 1024-byte **chunks**
//! of sixteen 64-byte **blocks**; compressing a chunk's blocks in turn gives its 8-word
//! **chaining value** (CV); CVs are merged pairwise by **parent** compressions up a binary tree
//! whose left subtrees are always complete powers of two; the last compression carries the
//! **root** flag and its output is the hash. An input of at most one chunk is its own root.
//!
//! Which path an input takes: inputs up to one chunk, and inputs of [`WIDE_INPUT_BYTES`] or
//! more (which the crate already spreads over all lanes), go to `blake3::hash`; everything
//! in between goes through the lanes when the CPU has AVX-512 (detected at run time), and to
//! `blake3::hash` otherwise (the portable fallback).

use super::Fingerprint;

const IV: [u32; 8] = [
    0x6A09_E667,
    0xBB67_AE85,
    0x3C6E_F372,
    0xA54F_F53A,
    0x510E_527F,
    0x9B05_688C,
    0x1F83_D9AB,
    0x5BE0_CD19,
];
const CHUNK_START: u32 = 1;
const CHUNK_END: u32 = 2;
const PARENT: u32 = 4;
const ROOT: u32 = 8;

/// Bytes per BLAKE3 block and chunk.
const BLOCK_BYTES: usize = 64;
const CHUNK_BYTES: usize = 1024;
const BLOCKS_PER_CHUNK: usize = CHUNK_BYTES / BLOCK_BYTES;

/// Inputs at least this long are hashed by the `blake3` crate, which already fills all 16
/// lanes with their own chunks.
pub const WIDE_INPUT_BYTES: usize = 16 * CHUNK_BYTES;

/// Lanes of an AVX-512 register of 32-bit words.
const LANES: usize = 16;

/// The message word order of each of the seven rounds: the specification's permutation
/// applied `round` times.
const SCHEDULE: [[usize; 16]; 7] = {
    const PERMUTATION: [usize; 16] = [2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8];
    let mut schedule = [[0usize; 16]; 7];
    let mut word = 0;
    while word < 16 {
        schedule[0][word] = word;
        word += 1;
    }
    let mut round = 1;
    while round < 7 {
        let mut word = 0;
        while word < 16 {
            schedule[round][word] = schedule[round - 1][PERMUTATION[word]];
            word += 1;
        }
        round += 1;
    }
    schedule
};

/// One compression, one lane at a time: the portable reference, used for parents and partial
/// chunks. Returns the full 16-word state; the CV is its first 8 words.
fn compress(
    cv: &[u32; 8],
    block: &[u8; BLOCK_BYTES],
    counter: u64,
    block_len: u32,
    flags: u32,
) -> [u32; 16] {
    let mut message = [0u32; 16];
    for (word, bytes) in message.iter_mut().zip(block.chunks_exact(4)) {
        *word = u32::from_le_bytes(bytes.try_into().expect("4 bytes"));
    }
    let mut state = [
        cv[0],
        cv[1],
        cv[2],
        cv[3],
        cv[4],
        cv[5],
        cv[6],
        cv[7],
        IV[0],
        IV[1],
        IV[2],
        IV[3],
        counter as u32,
        (counter >> 32) as u32,
        block_len,
        flags,
    ];
    #[inline(always)]
    fn mix(state: &mut [u32; 16], a: usize, b: usize, c: usize, d: usize, x: u32, y: u32) {
        state[a] = state[a].wrapping_add(state[b]).wrapping_add(x);
        state[d] = (state[d] ^ state[a]).rotate_right(16);
        state[c] = state[c].wrapping_add(state[d]);
        state[b] = (state[b] ^ state[c]).rotate_right(12);
        state[a] = state[a].wrapping_add(state[b]).wrapping_add(y);
        state[d] = (state[d] ^ state[a]).rotate_right(8);
        state[c] = state[c].wrapping_add(state[d]);
        state[b] = (state[b] ^ state[c]).rotate_right(7);
    }
    for order in &SCHEDULE {
        let m = |index: usize| message[order[index]];
        mix(&mut state, 0, 4, 8, 12, m(0), m(1));
        mix(&mut state, 1, 5, 9, 13, m(2), m(3));
        mix(&mut state, 2, 6, 10, 14, m(4), m(5));
        mix(&mut state, 3, 7, 11, 15, m(6), m(7));
        mix(&mut state, 0, 5, 10, 15, m(8), m(9));
        mix(&mut state, 1, 6, 11, 12, m(10), m(11));
        mix(&mut state, 2, 7, 8, 13, m(12), m(13));
        mix(&mut state, 3, 4, 9, 14, m(14), m(15));
    }
    for index in 0..8 {
        state[index] ^= state[index + 8];
        state[index + 8] ^= cv[index];
    }
    state
}

fn first_eight(state: [u32; 16]) -> [u32; 8] {
    state[..8].try_into().expect("8 words")
}

/// The CV of a chunk of 1 to 1024 bytes that is not the root (the portable reference the
/// tests check the tree merge with).
#[cfg(test)]
fn chunk_cv(chunk: &[u8], counter: u64) -> [u32; 8] {
    assert!(!chunk.is_empty() && chunk.len() <= CHUNK_BYTES);
    let mut cv = IV;
    let block_count = chunk.len().div_ceil(BLOCK_BYTES);
    for (index, block) in chunk.chunks(BLOCK_BYTES).enumerate() {
        let mut padded = [0u8; BLOCK_BYTES];
        padded[..block.len()].copy_from_slice(block);
        let mut flags = 0;
        if index == 0 {
            flags |= CHUNK_START;
        }
        if index + 1 == block_count {
            flags |= CHUNK_END;
        }
        cv = first_eight(compress(&cv, &padded, counter, block.len() as u32, flags));
    }
    cv
}

fn parent_block(left: &[u32; 8], right: &[u32; 8]) -> [u8; BLOCK_BYTES] {
    let mut block = [0u8; BLOCK_BYTES];
    for (bytes, word) in block.chunks_exact_mut(4).zip(left.iter().chain(right)) {
        bytes.copy_from_slice(&word.to_le_bytes());
    }
    block
}

/// True when this CPU can run the lanes.
pub fn lanes_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Fingerprints `inputs` with BLAKE3 into `out`, using the lanes where they help (see the
/// module documentation).
pub fn hash_batch(inputs: &[&[u8]], out: &mut [Fingerprint]) {
    assert_eq!(inputs.len(), out.len(), "one output per input");
    if lanes_available() {
        hash_batch_lanes(inputs, out);
    } else {
        hash_batch_portable(inputs, out);
    }
}

/// The portable path: the `blake3` crate, one input at a time.
pub fn hash_batch_portable(inputs: &[&[u8]], out: &mut [Fingerprint]) {
    assert_eq!(inputs.len(), out.len(), "one output per input");
    for (input, slot) in inputs.iter().zip(out.iter_mut()) {
        *slot = Fingerprint(*blake3::hash(input).as_bytes());
    }
}

/// A chunk waiting for a lane.
struct LaneJob {
    /// Its bytes: `block_count` blocks, readable in full (a partial chunk is first copied into
    /// a zero-padded scratch buffer, so no lane reads past its input).
    chunk: *const u8,
    counter: u64,
    block_count: u8,
    /// Bytes in the last block, 1 to 64.
    last_block_len: u8,
    /// True for an input of a single chunk: its last block gets the ROOT flag.
    root: bool,
    /// Where its CV goes in the batch's CV table.
    slot: usize,
}

fn words_to_fingerprint(words: &[u32; 8]) -> Fingerprint {
    let mut out = [0u8; super::FINGERPRINT_BYTES];
    for (bytes, word) in out.chunks_exact_mut(4).zip(words) {
        bytes.copy_from_slice(&word.to_le_bytes());
    }
    Fingerprint(out)
}

fn hash_batch_lanes(inputs: &[&[u8]], out: &mut [Fingerprint]) {
    // Each input gets a run of slots in `cvs`, one per chunk. Partial chunks (a short last
    // chunk, or a whole input under 1 KiB) are copied into zero-padded scratch blocks first;
    // the copies are made before any pointer is taken, so the scratch never moves under one.
    let mut first_slot = vec![usize::MAX; inputs.len()];
    let mut root_slot = vec![usize::MAX; inputs.len()];
    let mut scratch: Vec<[u8; CHUNK_BYTES]> = Vec::new();
    for input in inputs {
        if !input.is_empty() && input.len() < WIDE_INPUT_BYTES && input.len() % CHUNK_BYTES != 0 {
            let tail = &input[input.len() / CHUNK_BYTES * CHUNK_BYTES..];
            let mut padded = [0u8; CHUNK_BYTES];
            padded[..tail.len()].copy_from_slice(tail);
            scratch.push(padded);
        }
    }
    let mut scratch_blocks = scratch.iter();
    let mut cvs: Vec<[u32; 8]> = Vec::new();
    let mut jobs: Vec<LaneJob> = Vec::new();
    for (index, (input, slot)) in inputs.iter().zip(out.iter_mut()).enumerate() {
        if input.is_empty() || input.len() >= WIDE_INPUT_BYTES {
            *slot = Fingerprint(*blake3::hash(input).as_bytes());
            continue;
        }
        let root = input.len() <= CHUNK_BYTES;
        if root {
            root_slot[index] = cvs.len();
        } else {
            first_slot[index] = cvs.len();
        }
        for (counter, chunk) in input.chunks(CHUNK_BYTES).enumerate() {
            let bytes = if chunk.len() == CHUNK_BYTES {
                chunk.as_ptr()
            } else {
                scratch_blocks
                    .next()
                    .expect("one scratch block per partial chunk")
                    .as_ptr()
            };
            jobs.push(LaneJob {
                chunk: bytes,
                counter: counter as u64,
                block_count: chunk.len().div_ceil(BLOCK_BYTES) as u8,
                last_block_len: (chunk.len() - (chunk.len() - 1) / BLOCK_BYTES * BLOCK_BYTES) as u8,
                root,
                slot: cvs.len(),
            });
            cvs.push(IV);
        }
    }
    // Lanes of a group run as many blocks as its longest chunk; sorting by length keeps the
    // lengths in a group alike, so few lanes idle. The sort is stable so that neighbouring
    // lanes keep reading neighbouring memory, which the hardware prefetcher follows (an
    // unstable sort scatters equal-length chunks and made every block load a cache miss).
    jobs.sort_by_key(|job| std::cmp::Reverse(job.block_count));
    for group in jobs.chunks(LANES) {
        // Idle lanes of a short last group repeat its first job; their CVs are dropped.
        let mut lanes = avx512::ChunkLanes {
            chunks: [group[0].chunk; LANES],
            counters: [group[0].counter; LANES],
            block_counts: [group[0].block_count; LANES],
            last_block_lens: [group[0].last_block_len; LANES],
            roots: [group[0].root; LANES],
        };
        for (lane, job) in group.iter().enumerate() {
            lanes.chunks[lane] = job.chunk;
            lanes.counters[lane] = job.counter;
            lanes.block_counts[lane] = job.block_count;
            lanes.last_block_lens[lane] = job.last_block_len;
            lanes.roots[lane] = job.root;
        }
        // SAFETY: `lanes_available` confirmed AVX-512F, and every pointer addresses
        // `block_count` full blocks (an input's full chunk, or a padded scratch copy), which
        // outlive the call.
        let lane_cvs = unsafe { avx512::chunk_cvs(&lanes) };
        for (lane, job) in group.iter().enumerate() {
            cvs[job.slot] = lane_cvs[lane];
        }
    }
    for (index, &slot) in root_slot.iter().enumerate() {
        if slot != usize::MAX {
            out[index] = words_to_fingerprint(&cvs[slot]);
        }
    }
    merge_trees(inputs, &first_slot, &cvs, out);
}

/// Parent jobs below this count per level are compressed one at a time: a 16-lane compression
/// costs several single ones.
const PARENT_LANES_MIN: usize = 4;

/// Merges each input's chunk CVs (`cvs[first_slot[i]..]`, one per chunk) up to its root, level
/// by level for all inputs at once, so that parent compressions fill the lanes too. Pairing
/// neighbours level by level and carrying an odd last node up unchanged builds exactly
/// BLAKE3's left-complete tree (the left subtree always holds the largest power of two of
/// chunks that leaves the right one non-empty).
fn merge_trees(inputs: &[&[u8]], first_slot: &[usize], cvs: &[[u32; 8]], out: &mut [Fingerprint]) {
    // (input, nodes of this level) for every input still to finish.
    let mut levels: Vec<(usize, Vec<[u32; 8]>)> = inputs
        .iter()
        .enumerate()
        .filter(|&(index, _)| first_slot[index] != usize::MAX)
        .map(|(index, input)| {
            let start = first_slot[index];
            (
                index,
                cvs[start..start + input.len().div_ceil(CHUNK_BYTES)].to_vec(),
            )
        })
        .collect();
    while !levels.is_empty() {
        // One job per pair of neighbours: the 64-byte parent block, its flags, and where the
        // result goes (input, position in the next level).
        let mut blocks: Vec<[u8; BLOCK_BYTES]> = Vec::new();
        let mut jobs: Vec<(usize, usize, u32)> = Vec::new();
        let mut next: Vec<(usize, Vec<[u32; 8]>)> = Vec::with_capacity(levels.len());
        for (level_index, (input, nodes)) in levels.iter().enumerate() {
            assert!(nodes.len() >= 2, "an input with one node is finished");
            let flags = if nodes.len() == 2 {
                PARENT | ROOT
            } else {
                PARENT
            };
            for (pair, children) in nodes.chunks_exact(2).enumerate() {
                blocks.push(parent_block(&children[0], &children[1]));
                jobs.push((level_index, pair, flags));
            }
            let mut carried = vec![IV; nodes.len().div_ceil(2)];
            if nodes.len() % 2 == 1 {
                *carried.last_mut().expect("an odd level has a carried node") =
                    *nodes.last().expect("nodes");
            }
            next.push((*input, carried));
        }
        let mut results = vec![IV; jobs.len()];
        if jobs.len() >= PARENT_LANES_MIN && lanes_available() {
            for (group_index, (group, results)) in jobs
                .chunks(LANES)
                .zip(results.chunks_mut(LANES))
                .enumerate()
            {
                let offset = group_index * LANES;
                let mut pointers = [blocks[offset].as_ptr(); LANES];
                let mut flags = [PARENT; LANES];
                for (lane, job) in group.iter().enumerate() {
                    pointers[lane] = blocks[offset + lane].as_ptr();
                    flags[lane] = job.2;
                }
                // SAFETY: the lanes are available (checked above) and every pointer addresses a
                // 64-byte block in `blocks`, which outlives the call.
                let lane_cvs = unsafe { avx512::parent_cvs(&pointers, &flags) };
                results.copy_from_slice(&lane_cvs[..group.len()]);
            }
        } else {
            for ((block, job), result) in blocks.iter().zip(&jobs).zip(results.iter_mut()) {
                *result = first_eight(compress(&IV, block, 0, BLOCK_BYTES as u32, job.2));
            }
        }
        for (&(level_index, pair, flags), result) in jobs.iter().zip(&results) {
            if flags & ROOT != 0 {
                out[next[level_index].0] = words_to_fingerprint(result);
            } else {
                next[level_index].1[pair] = *result;
            }
        }
        next.retain(|(_, nodes)| nodes.len() >= 2);
        levels = next;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    //! Every helper carries the AVX-512 target feature so that the intrinsics inline into it
    //! and it inlines into [`chunk_cvs`].

    use std::arch::x86_64::*;

    use super::{BLOCKS_PER_CHUNK, BLOCK_BYTES, CHUNK_END, CHUNK_START, IV, LANES, ROOT, SCHEDULE};

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
    unsafe fn initial_cv() -> [__m512i; 8] {
        let mut cv = [_mm512_setzero_si512(); 8];
        for (vector, word) in cv.iter_mut().zip(IV) {
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

    /// How many blocks ahead of the one being compressed each lane's data is prefetched.
    const PREFETCH_BLOCKS_AHEAD: usize = 2;

    /// One chunk per lane (see [`chunk_cvs`]).
    pub struct ChunkLanes {
        pub chunks: [*const u8; LANES],
        pub counters: [u64; LANES],
        /// Blocks in each chunk, 1 to 16; every pointer addresses 1024 readable bytes anyway.
        pub block_counts: [u8; LANES],
        /// Bytes in each chunk's last block, 1 to 64 (the block is zero-padded).
        pub last_block_lens: [u8; LANES],
        /// Lanes whose chunk is a whole input: its last block gets the ROOT flag.
        pub roots: [bool; LANES],
    }

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
        let block_counts =
            _mm512_loadu_si512(lanes.block_counts.map(u32::from).as_ptr() as *const _);
        let last_block_lens =
            _mm512_loadu_si512(lanes.last_block_lens.map(u32::from).as_ptr() as *const _);
        let end_flags = lanes
            .roots
            .map(|root| if root { CHUNK_END | ROOT } else { CHUNK_END });
        let end_flags = _mm512_loadu_si512(end_flags.as_ptr() as *const _);
        let full_block_len = _mm512_set1_epi32(BLOCK_BYTES as i32);
        let mut cv = initial_cv();
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
            let start = _mm512_set1_epi32(if block == 0 { CHUNK_START as i32 } else { 0 });
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
    /// left and right child CVs, `flags[lane]` is PARENT, or PARENT | ROOT for a root.
    ///
    /// # Safety
    /// The CPU must support AVX-512F, and every pointer must address 64 readable bytes.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn parent_cvs(
        blocks: &[*const u8; LANES],
        flags: &[u32; LANES],
    ) -> [[u32; 8]; LANES] {
        let mut message = [_mm512_setzero_si512(); 16];
        load_message(blocks, 0, &mut message);
        let zero = _mm512_setzero_si512();
        let flags = _mm512_loadu_si512(flags.as_ptr() as *const _);
        let mut cv = initial_cv();
        let block_len = _mm512_set1_epi32(BLOCK_BYTES as i32);
        compress_block(&mut cv, &message, zero, zero, block_len, flags);
        lane_cvs(&cv)
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod avx512 {
    use super::LANES;

    /// Never called: `lanes_available` is false off x86-64.
    pub unsafe fn chunk_cvs(
        _chunks: &[*const u8; LANES],
        _counters: &[u64; LANES],
    ) -> [[u32; 8]; LANES] {
        unreachable!("lanes are only used on x86-64")
    }

    /// Never called: `lanes_available` is false off x86-64.
    pub unsafe fn parent_cvs(
        _blocks: &[*const u8; LANES],
        _flags: &[u32; LANES],
    ) -> [[u32; 8]; LANES] {
        unreachable!("lanes are only used on x86-64")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn reference(input: &[u8]) -> Fingerprint {
        Fingerprint(*blake3::hash(input).as_bytes())
    }

    /// Goal: the portable chunk compression and the level-by-level tree merge reproduce the
    /// crate; method: hash single inputs of tricky lengths (one byte past chunk and tree
    /// boundaries, up to 33 chunks so that both the one-at-a-time and the lane parents run).
    #[test]
    fn portable_tree_matches_blake3_crate() {
        for len in [
            1025usize,
            2048,
            2049,
            3072,
            4096,
            4097,
            5000,
            8192,
            9217,
            33 * 1024 + 7,
        ] {
            let input: Vec<u8> = (0..len).map(|index| (index * 31 % 251) as u8).collect();
            let cvs: Vec<[u32; 8]> = input
                .chunks(CHUNK_BYTES)
                .enumerate()
                .map(|(counter, chunk)| chunk_cv(chunk, counter as u64))
                .collect();
            let mut out = [Fingerprint::ZERO];
            merge_trees(&[&input], &[0], &cvs, &mut out);
            assert_eq!(out[0], reference(&input), "length {len}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Goal: batches hash byte-identically to `blake3::hash`, whatever the lengths (equal
        /// or mixed) and batch sizes; method: random batches through `hash_batch` (lanes on
        /// this CPU when it has AVX-512) compared input by input.
        #[test]
        fn matches_blake3_crate(
            lengths in prop::collection::vec(prop_oneof![0usize..20_000, 0usize..1100, Just(4096usize), Just(1024usize), Just(8192usize)], 0..40),
            equal in any::<bool>(),
            seed in any::<u8>(),
        ) {
            let lengths: Vec<usize> = if equal { vec![*lengths.first().unwrap_or(&4096); lengths.len()] } else { lengths };
            let inputs: Vec<Vec<u8>> = lengths
                .iter()
                .enumerate()
                .map(|(index, &len)| (0..len).map(|byte| (byte as u8).wrapping_mul(seed | 1).wrapping_add(index as u8)).collect())
                .collect();
            let slices: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
            let mut out = vec![Fingerprint::ZERO; slices.len()];
            hash_batch(&slices, &mut out);
            for (input, fingerprint) in slices.iter().zip(&out) {
                prop_assert_eq!(*fingerprint, reference(input));
            }
        }
    }
}
