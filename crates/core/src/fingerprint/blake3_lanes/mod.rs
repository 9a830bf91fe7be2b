//! BLAKE3 for many independent small inputs at once, one input chunk per SIMD lane.
//!
//! The `blake3` crate hashes one input at a time; it spreads a *large* input's 1 KiB chunks
//! over SIMD lanes, but a 4 KiB input has only four chunks to spread, so single small inputs
//! leave most of an AVX-512 register idle. Here the full 1 KiB chunks of *many* inputs are
//! compressed side by side, 16 per AVX-512 register (each lane with its own chunk counter),
//! and only the few remaining compressions (a partial last chunk, the parent nodes of each
//! input's tree) run one at a time. The output is byte-identical to `blake3::hash`, or with a
//! key to `blake3::keyed_hash` (the property test `matches_blake3_crate` checks both over
//! random lengths and batch sizes).
//!
//! BLAKE3 terms (from the BLAKE3 specification): an input is split into 1024-byte **chunks**
//! of sixteen 64-byte **blocks**; compressing a chunk's blocks in turn gives its 8-word
//! **chaining value** (CV); CVs are merged pairwise by **parent** compressions up a binary tree
//! whose left subtrees are always complete powers of two; the last compression carries the
//! **root** flag and its output is the hash. An input of at most one chunk is its own root.
//! The **keyed** mode starts every chunk and every parent from the key's words instead of the
//! IV and sets the KEYED_HASH flag in every compression.
//!
//! Which path an input takes: empty inputs and inputs of [`WIDE_INPUT_BYTES`] or more (which
//! the crate already spreads over all lanes) go to `blake3::hash`; every other input goes
//! through the lanes, with the fastest [`Kernel`] the CPU has (detected at run time): AVX-512
//! (16 lanes, `avx512.rs`), AVX2 (8 lanes, two halves per group, `avx2.rs`), or the portable
//! fallback, `blake3::hash` one input at a time. A partial chunk is copied into a zero-padded
//! 1 KiB scratch chunk first, so lanes always read whole blocks; lanes whose chunk has fewer
//! blocks than their group's longest are masked once they are done.
//!
//! `cargo bench -p onecopy-core --bench fingerprint` measures it against `blake3::hash` one
//! block at a time and on one large input (docs/BENCHMARKS.md gives the figures).

use super::Fingerprint;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

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
const KEYED_HASH: u32 = 16;

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

/// Which BLAKE3 a batch computes: the plain hash, or the keyed hash under a 32-byte key.
#[derive(Clone, Copy)]
struct Mode<'a> {
    key: Option<&'a [u8; 32]>,
    /// The first CV of every chunk and the key of every parent: the IV, or the key's words.
    words: [u32; 8],
    /// Flags every compression carries.
    flags: u32,
}

impl<'a> Mode<'a> {
    fn new(key: Option<&'a [u8; 32]>) -> Mode<'a> {
        match key {
            None => Mode {
                key,
                words: IV,
                flags: 0,
            },
            Some(bytes) => {
                let mut words = [0u32; 8];
                for (word, bytes) in words.iter_mut().zip(bytes.chunks_exact(4)) {
                    *word = u32::from_le_bytes(bytes.try_into().expect("4 bytes"));
                }
                Mode {
                    key,
                    words,
                    flags: KEYED_HASH,
                }
            }
        }
    }

    /// One input through the `blake3` crate.
    fn hash_one(&self, input: &[u8]) -> Fingerprint {
        let hash = match self.key {
            None => blake3::hash(input),
            Some(key) => blake3::keyed_hash(key, input),
        };
        Fingerprint(*hash.as_bytes())
    }
}

/// The CV of a chunk of 1 to 1024 bytes that is not the root (the portable reference the
/// tests check the tree merge with).
#[cfg(test)]
fn chunk_cv(mode: Mode, chunk: &[u8], counter: u64) -> [u32; 8] {
    assert!(!chunk.is_empty() && chunk.len() <= CHUNK_BYTES);
    let mut cv = mode.words;
    let block_count = chunk.len().div_ceil(BLOCK_BYTES);
    for (index, block) in chunk.chunks(BLOCK_BYTES).enumerate() {
        let mut padded = [0u8; BLOCK_BYTES];
        padded[..block.len()].copy_from_slice(block);
        let mut flags = mode.flags;
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

/// Which code compresses the lanes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// 16 lanes per AVX-512 register.
    Avx512,
    /// 8 lanes per AVX2 register, a 16-lane group in two halves.
    Avx2,
    /// No lanes: the `blake3` crate, one input at a time.
    Portable,
}

impl Kernel {
    /// Every kernel, fastest first.
    pub const ALL: [Kernel; 3] = [Kernel::Avx512, Kernel::Avx2, Kernel::Portable];

    /// True when this CPU can run the kernel (detected at run time; the standard library
    /// caches the CPU's answer).
    pub fn is_supported(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => std::arch::is_x86_feature_detected!("avx2"),
            #[cfg(not(target_arch = "x86_64"))]
            Kernel::Avx512 | Kernel::Avx2 => false,
            Kernel::Portable => true,
        }
    }

    /// The fastest kernel this CPU supports.
    pub fn detect() -> Kernel {
        Kernel::ALL
            .into_iter()
            .find(|kernel| kernel.is_supported())
            .expect("the portable kernel is always supported")
    }

    /// The CV of each lane's chunk.
    fn chunk_cvs(self, lanes: &ChunkLanes) -> [[u32; 8]; LANES] {
        assert!(self.is_supported());
        match self {
            // SAFETY: the CPU supports the kernel (asserted above), and every pointer in
            // `lanes` addresses 1024 readable bytes (see `ChunkLanes`).
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => unsafe { avx512::chunk_cvs(lanes) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { avx2::chunk_cvs(lanes) },
            _ => unreachable!("only SIMD kernels run lanes"),
        }
    }

    /// Parent compressions, one per lane.
    fn parent_cvs(
        self,
        blocks: &[*const u8; LANES],
        flags: &[u32; LANES],
        key: &[u32; 8],
    ) -> [[u32; 8]; LANES] {
        assert!(self.is_supported());
        match self {
            // SAFETY: the CPU supports the kernel (asserted above), and every pointer addresses a
            // 64-byte parent block.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => unsafe { avx512::parent_cvs(blocks, flags, key) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { avx2::parent_cvs(blocks, flags, key) },
            _ => unreachable!("only SIMD kernels run lanes"),
        }
    }
}

/// Fingerprints `inputs` with BLAKE3 (keyed with `key` when one is given) into `out` with the
/// fastest kernel this CPU supports (see the module documentation).
pub fn hash_batch(key: Option<&[u8; 32]>, inputs: &[&[u8]], out: &mut [Fingerprint]) {
    hash_batch_with(Kernel::detect(), key, inputs, out);
}

/// Like [`hash_batch`] with a chosen kernel, which the CPU must support (for tests and
/// benchmarks).
pub fn hash_batch_with(
    kernel: Kernel,
    key: Option<&[u8; 32]>,
    inputs: &[&[u8]],
    out: &mut [Fingerprint],
) {
    assert_eq!(inputs.len(), out.len(), "one output per input");
    assert!(
        kernel.is_supported(),
        "{kernel:?} is not supported on this CPU"
    );
    let mode = Mode::new(key);
    match kernel {
        Kernel::Portable => {
            for (input, slot) in inputs.iter().zip(out.iter_mut()) {
                *slot = mode.hash_one(input);
            }
        }
        Kernel::Avx512 | Kernel::Avx2 => hash_batch_lanes(kernel, mode, inputs, out),
    }
}

/// How many blocks ahead of the one being compressed each lane's data is prefetched.
const PREFETCH_BLOCKS_AHEAD: usize = 2;

/// One chunk per lane, as the kernels take them.
pub(crate) struct ChunkLanes {
    pub chunks: [*const u8; LANES],
    pub counters: [u64; LANES],
    /// Blocks in each chunk, 1 to 16; every pointer addresses 1024 readable bytes anyway.
    pub block_counts: [u8; LANES],
    /// Bytes in each chunk's last block, 1 to 64 (the block is zero-padded).
    pub last_block_lens: [u8; LANES],
    /// Lanes whose chunk is a whole input: its last block gets the ROOT flag.
    pub roots: [bool; LANES],
    /// Every lane's first CV: the IV, or a keyed mode's key words.
    pub key: [u32; 8],
    /// Flags every compression carries (KEYED_HASH in the keyed mode).
    pub mode_flags: u32,
}

/// A chunk waiting for a lane.
struct LaneJob {
    /// Its bytes: 1024 readable bytes (a partial chunk is first copied into a zero-padded
    /// scratch chunk, so that no lane reads past its input).
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

fn hash_batch_lanes(kernel: Kernel, mode: Mode, inputs: &[&[u8]], out: &mut [Fingerprint]) {
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
            *slot = mode.hash_one(input);
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
        let mut lanes = ChunkLanes {
            chunks: [group[0].chunk; LANES],
            counters: [group[0].counter; LANES],
            block_counts: [group[0].block_count; LANES],
            last_block_lens: [group[0].last_block_len; LANES],
            roots: [group[0].root; LANES],
            key: mode.words,
            mode_flags: mode.flags,
        };
        for (lane, job) in group.iter().enumerate() {
            lanes.chunks[lane] = job.chunk;
            lanes.counters[lane] = job.counter;
            lanes.block_counts[lane] = job.block_count;
            lanes.last_block_lens[lane] = job.last_block_len;
            lanes.roots[lane] = job.root;
        }
        // Every pointer addresses 1024 readable bytes (an input's full chunk, or a padded
        // scratch copy), which outlive the call.
        let lane_cvs = kernel.chunk_cvs(&lanes);
        for (lane, job) in group.iter().enumerate() {
            cvs[job.slot] = lane_cvs[lane];
        }
    }
    for (index, &slot) in root_slot.iter().enumerate() {
        if slot != usize::MAX {
            out[index] = words_to_fingerprint(&cvs[slot]);
        }
    }
    merge_trees(kernel, mode, inputs, &first_slot, &cvs, out);
}

/// Parent jobs below this count per level are compressed one at a time: a 16-lane compression
/// costs several single ones.
const PARENT_LANES_MIN: usize = 4;

/// Merges each input's chunk CVs (`cvs[first_slot[i]..]`, one per chunk) up to its root, level
/// by level for all inputs at once, so that parent compressions fill the lanes too. Pairing
/// neighbours level by level and carrying an odd last node up unchanged builds exactly
/// BLAKE3's left-complete tree (the left subtree always holds the largest power of two of
/// chunks that leaves the right one non-empty).
fn merge_trees(
    kernel: Kernel,
    mode: Mode,
    inputs: &[&[u8]],
    first_slot: &[usize],
    cvs: &[[u32; 8]],
    out: &mut [Fingerprint],
) {
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
            let flags = mode.flags
                | if nodes.len() == 2 {
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
        if jobs.len() >= PARENT_LANES_MIN && kernel != Kernel::Portable {
            for (group_index, (group, results)) in jobs
                .chunks(LANES)
                .zip(results.chunks_mut(LANES))
                .enumerate()
            {
                let offset = group_index * LANES;
                let mut pointers = [blocks[offset].as_ptr(); LANES];
                let mut flags = [mode.flags | PARENT; LANES];
                for (lane, job) in group.iter().enumerate() {
                    pointers[lane] = blocks[offset + lane].as_ptr();
                    flags[lane] = job.2;
                }
                // Every pointer addresses a 64-byte block in `blocks`, which outlives the call.
                let lane_cvs = kernel.parent_cvs(&pointers, &flags, &mode.words);
                results.copy_from_slice(&lane_cvs[..group.len()]);
            }
        } else {
            for ((block, job), result) in blocks.iter().zip(&jobs).zip(results.iter_mut()) {
                *result = first_eight(compress(&mode.words, block, 0, BLOCK_BYTES as u32, job.2));
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const KEY: [u8; 32] = *b"a key of thirty-two bytes, fixed";

    fn reference(key: Option<&[u8; 32]>, input: &[u8]) -> Fingerprint {
        Mode::new(key).hash_one(input)
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
            for key in [None, Some(&KEY)] {
                let mode = Mode::new(key);
                let input: Vec<u8> = (0..len).map(|index| (index * 31 % 251) as u8).collect();
                let cvs: Vec<[u32; 8]> = input
                    .chunks(CHUNK_BYTES)
                    .enumerate()
                    .map(|(counter, chunk)| chunk_cv(mode, chunk, counter as u64))
                    .collect();
                let mut out = [Fingerprint::ZERO];
                merge_trees(Kernel::Portable, mode, &[&input], &[0], &cvs, &mut out);
                assert_eq!(out[0], reference(key, &input), "length {len}, key {key:?}");
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Goal: batches hash byte-identically to `blake3::hash` and, with a key, to
        /// `blake3::keyed_hash`, whatever the lengths (equal or mixed) and batch sizes; method:
        /// random batches through every kernel this CPU supports (AVX-512, AVX2, portable),
        /// unkeyed and keyed, compared input by input.
        #[test]
        fn matches_blake3_crate(
            lengths in prop::collection::vec(prop_oneof![0usize..20_000, 0usize..1100, Just(4096usize), Just(1024usize), Just(8192usize)], 0..40),
            equal in any::<bool>(),
            seed in any::<u8>(),
            keyed in any::<bool>(),
        ) {
            let key = keyed.then_some(&KEY);
            let lengths: Vec<usize> = if equal { vec![*lengths.first().unwrap_or(&4096); lengths.len()] } else { lengths };
            let inputs: Vec<Vec<u8>> = lengths
                .iter()
                .enumerate()
                .map(|(index, &len)| (0..len).map(|byte| (byte as u8).wrapping_mul(seed | 1).wrapping_add(index as u8)).collect())
                .collect();
            let slices: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
            for kernel in Kernel::ALL.into_iter().filter(|kernel| kernel.is_supported()) {
                let mut out = vec![Fingerprint::ZERO; slices.len()];
                hash_batch_with(kernel, key, &slices, &mut out);
                for (input, fingerprint) in slices.iter().zip(&out) {
                    prop_assert_eq!(*fingerprint, reference(key, input), "{:?}", kernel);
                }
            }
        }
    }
}
