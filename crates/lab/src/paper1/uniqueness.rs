//! Paper 1 §5.4.1, Table 5.1: how unique file-system metadata is.
//!
//! The paper formatted a 1 GB zero-filled loop device with ext3 (and NILFS2), counted the
//! unique 512-byte chunks on it, created one million empty files in one directory, and counted
//! again: 43 unique chunks before and 548,623 (26% of 2,097,152) after on ext3. We do the same
//! on an onecopy volume through the testbed (nbdfuse, a loop device, the kernel's file system;
//! the volume is new, so it reads as zeros before mkfs), for ext3 and ext4, and count at 512
//! bytes (the paper's chunk) and at 4 KiB (our deduplication unit). The census reads the volume
//! from the engine after `syncfs`, so it sees exactly what the file system wrote.
//!
//! "Unique" is counted two ways: *distinct* contents (what a perfect deduplication stores)
//! and chunks whose content occurs *once* on the volume.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use onecopy_block::{HintSettings, RuntimeOptions};

use super::workloads::create_empty_files;
use crate::error::Result;
use crate::mount::{FileSystemOptions, Testbed, TestbedOptions};

/// The chunk sizes counted: the paper's and our deduplication unit.
pub const CHUNK_SIZES: [usize; 2] = [512, 4096];
/// Bytes read from the engine at a time.
const READ_BYTES: usize = 1 << 20;
// Every chunk size divides a read.
const _: () =
    assert!(READ_BYTES.is_multiple_of(CHUNK_SIZES[0]) && READ_BYTES.is_multiple_of(CHUNK_SIZES[1]));

/// The file systems of Table 5.1 here: ext3 is the paper's; ext4 is what the other workloads
/// run on.
pub const FILE_SYSTEMS: [&str; 2] = ["ext3", "ext4"];

/// Unique chunks of a volume at one chunk size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Census {
    pub chunk_bytes: u64,
    pub chunks: u64,
    /// Distinct contents.
    pub distinct: u64,
    /// Chunks whose content occurs exactly once.
    pub once: u64,
}

/// One row of Table 5.1: a file system at one chunk size, before and after the files.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct UniquenessRecord {
    pub file_system: String,
    pub volume_bytes: u64,
    pub inodes: u64,
    pub files: u64,
    /// Seconds to create the files and sync.
    pub create_seconds: f64,
    pub before: Census,
    pub after: Census,
}

/// Runs Table 5.1 for one file system (`ext3` or `ext4`): format, count, create `files`
/// empty files in one directory with `threads` threads, sync, count. Returns one record per
/// chunk size.
pub fn measure(
    parent_directory: &Path,
    file_system: &str,
    volume_bytes: u64,
    files: u64,
    threads: usize,
) -> Result<Vec<UniquenessRecord>> {
    // Every file needs an inode; the rest is a margin for the root, lost+found and the
    // directory.
    let inodes = files + files / 16 + 1024;
    let options = match file_system {
        "ext3" => FileSystemOptions::ext3(),
        "ext4" => FileSystemOptions::ext4(),
        other => panic!("Table 5.1 is measured on ext3 and ext4, not {other}"),
    }
    .with_inodes(inodes);
    let runtime = RuntimeOptions {
        content_cache_bytes: 0,
        ..RuntimeOptions::default()
    };
    let testbed = Testbed::attach(&TestbedOptions {
        parent_directory: parent_directory.to_path_buf(),
        volume_bytes,
        block_bytes: 4096,
        runtime,
        hints: HintSettings::none(),
        file_system: options,
    })?;
    testbed.sync()?;
    let before = census(&testbed, volume_bytes)?;
    let started = Instant::now();
    create_empty_files(&testbed.mount_point().join("files"), files, threads)?;
    testbed.sync()?;
    let create_seconds = started.elapsed().as_secs_f64();
    let after = census(&testbed, volume_bytes)?;
    testbed.teardown()?;
    Ok(before
        .into_iter()
        .zip(after)
        .map(|(before, after)| UniquenessRecord {
            file_system: file_system.to_string(),
            volume_bytes,
            inodes,
            files,
            create_seconds,
            before,
            after,
        })
        .collect())
}

/// Counts the chunks of the whole volume at every size of [`CHUNK_SIZES`].
fn census(testbed: &Testbed, volume_bytes: u64) -> Result<Vec<Census>> {
    let mut counters: Vec<ChunkCounter> = CHUNK_SIZES
        .iter()
        .map(|&size| ChunkCounter::new(size))
        .collect();
    let mut buffer = vec![0u8; READ_BYTES];
    let mut offset = 0;
    while offset < volume_bytes {
        let length = (volume_bytes - offset).min(READ_BYTES as u64) as usize;
        testbed.read_volume(offset, &mut buffer[..length])?;
        for counter in &mut counters {
            counter.add(&buffer[..length]);
        }
        offset += length as u64;
    }
    Ok(counters.iter().map(ChunkCounter::census).collect())
}

/// Counts how often each chunk content occurs, keyed by a 128-bit BLAKE3 prefix (a collision
/// among a few million chunks has a probability below 2^-80).
struct ChunkCounter {
    chunk_bytes: usize,
    chunks: u64,
    counts: HashMap<[u8; 16], u32>,
}

impl ChunkCounter {
    fn new(chunk_bytes: usize) -> ChunkCounter {
        ChunkCounter {
            chunk_bytes,
            chunks: 0,
            counts: HashMap::new(),
        }
    }

    /// Adds the chunks of `data` (a whole number of chunks).
    fn add(&mut self, data: &[u8]) {
        assert!(
            data.len().is_multiple_of(self.chunk_bytes),
            "whole chunks only"
        );
        for chunk in data.chunks_exact(self.chunk_bytes) {
            let hash = blake3::hash(chunk);
            let key: [u8; 16] = hash.as_bytes()[..16].try_into().expect("16 bytes");
            *self.counts.entry(key).or_insert(0) += 1;
            self.chunks += 1;
        }
    }

    fn census(&self) -> Census {
        Census {
            chunk_bytes: self.chunk_bytes as u64,
            chunks: self.chunks,
            distinct: self.counts.len() as u64,
            once: self.counts.values().filter(|&&count| count == 1).count() as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: distinct and once-only chunks are counted per chunk size; method: 4 KiB of
    /// zeros, a repeated 512-byte pattern and one unique chunk.
    #[test]
    fn counter_counts_distinct_and_once() {
        let mut data = vec![0u8; 8192];
        data[4096..4608].fill(7);
        data[4608..5120].fill(7);
        data[5120..5632].fill(9);
        let mut small = ChunkCounter::new(512);
        let mut large = ChunkCounter::new(4096);
        small.add(&data);
        large.add(&data);
        assert_eq!(
            small.census(),
            Census {
                chunk_bytes: 512,
                chunks: 16,
                distinct: 3,
                once: 1
            }
        );
        assert_eq!(
            large.census(),
            Census {
                chunk_bytes: 4096,
                chunks: 2,
                distinct: 2,
                once: 2
            }
        );
    }
}
