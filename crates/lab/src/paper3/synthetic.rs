//! The synthetic data sets of paper 3, Table 4: a file set with a high dedup ratio and one
//! with a low one, the same file-size distribution (4 KiB up to a largest size, most files
//! small, Fig. 8).
//!
//! A file is built in one of two ways:
//!
//! 1. while whole-file copies hold less than `whole_file_duplicate_share` of the bytes so
//!    far, the next file is a copy of the earlier file nearest in size to the size drawn:
//!    such copies deduplicate with any chunk size, which gives big chunks their share;
//! 2. otherwise it is a sequence of runs of 1 to 64 blocks of 4 KiB; while copied runs hold
//!    less than `run_duplicate_share` of the bytes of such files so far, the next run copies
//!    a run of an earlier file starting at one of its 4 KiB blocks, else it is random. A
//!    copied run lines up with the 4 KiB chunk grid of both files but rarely with a 256 KiB
//!    one, so runs deduplicate with small chunks only.
//!
//! Keeping the shares by bytes (rather than drawing each choice) makes the savings the
//! same at every size of the set: about `w` with big chunks and `w + (1 - w) r` with small
//! ones (`w`, `r` the two shares).
//!
//! Every file size is a multiple of 4 KiB. The generator is deterministic: one seed, one
//! data set.

use serde::Serialize;

/// Bytes of the block grid of the data sets (the small chunk size of the paper).
pub const BLOCK_BYTES: u64 = 4096;
/// Longest run of blocks copied or generated in one piece.
const RUN_BLOCKS_MAX: u64 = 64;

/// One of the two workloads of Table 4.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct WorkloadSpec {
    /// "high" or "low".
    pub name: &'static str,
    pub whole_file_duplicate_share: f64,
    pub run_duplicate_share: f64,
    /// Table 4's space savings (1 - stored / logical) with big and small chunks.
    pub paper_big_savings: f64,
    pub paper_small_savings: f64,
}

/// Table 4's workload #1: savings of about 20% with 256 KiB chunks and 70% with 4 KiB ones.
pub const HIGH: WorkloadSpec = WorkloadSpec {
    name: "high",
    whole_file_duplicate_share: 0.20,
    run_duplicate_share: 0.63,
    paper_big_savings: 0.20,
    paper_small_savings: 0.703,
};

/// Table 4's workload #2: savings of about 5% with 256 KiB chunks and 20% with 4 KiB ones.
pub const LOW: WorkloadSpec = WorkloadSpec {
    name: "low",
    whole_file_duplicate_share: 0.051,
    run_duplicate_share: 0.163,
    paper_big_savings: 0.051,
    paper_small_savings: 0.205,
};

/// A deterministic xorshift generator (the lab's data need no better).
pub struct Random(u64);

impl Random {
    pub fn new(seed: u64) -> Random {
        Random(seed.max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [0, bound); `bound` > 0.
    pub fn below(&mut self, bound: u64) -> u64 {
        assert!(bound > 0, "an empty range");
        self.next_u64() % bound
    }
}

/// A file size: 4 KiB times 2^(e), e = u^3 * log2(largest / 4 KiB) for u uniform in [0, 1),
/// so that most files are small and a few reach the largest size.
fn file_size(random: &mut Random, file_bytes_max: u64) -> u64 {
    let octaves = (file_bytes_max / BLOCK_BYTES).max(1).ilog2() as f64;
    let exponent = random.unit().powi(3) * octaves;
    let blocks = 2f64.powf(exponent).round().max(1.0) as u64;
    blocks * BLOCK_BYTES
}

/// Files of `spec` until their sizes add up to at least `total_bytes`, none larger than
/// `file_bytes_max`.
pub fn generate(spec: &WorkloadSpec, total_bytes: u64, file_bytes_max: u64) -> Vec<Vec<u8>> {
    assert!(
        file_bytes_max >= BLOCK_BYTES,
        "files hold at least one block"
    );
    assert!(
        total_bytes >= file_bytes_max,
        "the set holds at least one largest file"
    );
    let mut random = Random::new(0x5EED_0000 ^ spec.name.len() as u64 ^ total_bytes);
    let mut files: Vec<Vec<u8>> = Vec::new();
    // Every block of `files`: its file and its index in it.
    let mut blocks: Vec<(u32, u32)> = Vec::new();
    let mut bytes = 0u64;
    let mut whole_file_copy_bytes = 0u64;
    let (mut run_bytes, mut run_copy_bytes) = (0u64, 0u64);
    while bytes < total_bytes {
        let size = file_size(&mut random, file_bytes_max);
        let copy_whole_file = !files.is_empty()
            && (whole_file_copy_bytes as f64) < spec.whole_file_duplicate_share * bytes as f64;
        let file = if copy_whole_file {
            // The earlier file nearest in size: copies keep the size distribution, so that
            // their share of the bytes is their share of the files.
            let nearest = files
                .iter()
                .min_by_key(|file| (file.len() as u64).abs_diff(size))
                .expect("files is not empty");
            whole_file_copy_bytes += nearest.len() as u64;
            nearest.clone()
        } else {
            let mut data = Vec::with_capacity(size as usize);
            let file_blocks = size / BLOCK_BYTES;
            let mut done = 0;
            while done < file_blocks {
                let run = (random.below(RUN_BLOCKS_MAX) + 1).min(file_blocks - done);
                let copy_run = !files.is_empty()
                    && (run_copy_bytes as f64) < spec.run_duplicate_share * run_bytes as f64;
                let copied = if copy_run {
                    // A block of all earlier data, so that big files are sources in
                    // proportion to their size.
                    let (owner, block) = blocks[random.below(blocks.len() as u64) as usize];
                    let source = &files[owner as usize];
                    let source_blocks = source.len() as u64 / BLOCK_BYTES;
                    let length = run.min(source_blocks);
                    let start = (block as u64).min(source_blocks - length);
                    let from = (start * BLOCK_BYTES) as usize;
                    data.extend_from_slice(&source[from..from + (length * BLOCK_BYTES) as usize]);
                    length
                } else {
                    0
                };
                if copied == 0 {
                    for _ in 0..run * BLOCK_BYTES / 8 {
                        data.extend_from_slice(&random.next_u64().to_le_bytes());
                    }
                    done += run;
                    run_bytes += run * BLOCK_BYTES;
                } else {
                    done += copied;
                    run_bytes += copied * BLOCK_BYTES;
                    run_copy_bytes += copied * BLOCK_BYTES;
                }
            }
            data
        };
        assert_eq!(
            file.len() as u64 % BLOCK_BYTES,
            0,
            "sizes stay on the block grid"
        );
        bytes += file.len() as u64;
        let owner = files.len() as u32;
        blocks.extend((0..file.len() as u64 / BLOCK_BYTES).map(|block| (owner, block as u32)));
        files.push(file);
    }
    files
}

/// Space savings (1 - unique / logical) of `files` cut into fixed chunks of `chunk_bytes`
/// (the last chunk of a file shorter), computed in memory: what an ideal deduplicator with
/// that chunk size saves.
pub fn savings(files: &[Vec<u8>], chunk_bytes: usize) -> f64 {
    let mut seen = std::collections::HashSet::new();
    let mut logical = 0u64;
    let mut unique = 0u64;
    for file in files {
        for chunk in file.chunks(chunk_bytes) {
            logical += chunk.len() as u64;
            if seen.insert(blake3::hash(chunk)) {
                unique += chunk.len() as u64;
            }
        }
    }
    if logical == 0 {
        0.0
    } else {
        1.0 - unique as f64 / logical as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the two data sets have Table 4's character (savings with 4 KiB and 256 KiB
    /// chunks near the paper's) and sizes on the 4 KiB grid within the limits. Method:
    /// generate each at the quick size and compute the ideal savings in memory.
    #[test]
    fn data_sets_match_table_4() {
        for (spec, total, largest) in [
            (HIGH, 48 << 20, 4 << 20),
            (LOW, 48 << 20, 4 << 20),
            (HIGH, 96 << 20, 8 << 20),
            (LOW, 96 << 20, 8 << 20),
        ] {
            let files = generate(&spec, total, largest);
            assert!(files.len() > 100, "{}: {} files", spec.name, files.len());
            assert!(files
                .iter()
                .all(|f| !f.is_empty() && f.len() as u64 <= largest));
            let small = savings(&files, 4096);
            let big = savings(&files, 256 << 10);
            assert!(
                (small - spec.paper_small_savings).abs() < 0.04,
                "{}: small-chunk savings {small:.3}, the paper {}",
                spec.name,
                spec.paper_small_savings
            );
            assert!(
                (big - spec.paper_big_savings).abs() < 0.04,
                "{}: big-chunk savings {big:.3}, the paper {}",
                spec.name,
                spec.paper_big_savings
            );
        }
    }
}
