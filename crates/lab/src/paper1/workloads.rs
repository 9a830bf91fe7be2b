//! The workload drivers of paper 1 §5, as plain file operations on a mounted file system.
//!
//! | paper 1 (filebench, `cp`)                               | driver                        |
//! | ------------------------------------------------------- | ----------------------------- |
//! | §5.3 warm-up: copy a kernel tree and a CentOS root      | [`copy_tree`] of a host tree  |
//! | §5.4.2 create 1.5 M empty files in one directory, 16 threads | [`create_empty_files`]   |
//! | §5.4.2 append 4 KiB blocks to one file, fsync every 100  | [`append_with_fsync`]         |
//! | §5.4.4 step 2: unique data to push hashes out of the cache | [`write_unique_file`]       |
//! | §5.4.4 step 3: `cp` of the tree in the same mount point | [`copy_tree`] with flushes    |
//!
//! Paper 1 modified filebench to write data drawn from a duplicate distribution; our
//! [`BlockSource`] does the same with one parameter, the fraction of blocks that repeat an
//! earlier block of the run.

use std::fs;
use std::io::{Read, Write};
use std::path::Path;

use onecopy_core::error::IoContext;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::mount::sync_file_system;
use crate::results::create_directory;

/// Bytes of one appended or generated block.
pub const BLOCK_BYTES: usize = 4096;
/// Buffer of the copy loop.
const COPY_BUFFER_BYTES: usize = 1 << 20;

/// What a tree copy copied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeCopy {
    pub files: u64,
    pub directories: u64,
    pub bytes: u64,
}

/// Copies the directories and regular files under `source` into `destination` (created),
/// visiting names in sorted order so every run copies the same files, and stops after the
/// file that reaches `bytes_max`. Symbolic links, special files and unreadable entries are
/// skipped. With `flush_every_bytes`, the destination file system is synced after each such
/// amount (paper 1 §5.4.4 ran `cp` on a 2 GB machine so that writeback ran while copying; a
/// sync every few MiB gives the same interleaving of reads and writes on a large machine).
pub fn copy_tree(
    source: &Path,
    destination: &Path,
    bytes_max: u64,
    flush_every_bytes: Option<u64>,
) -> Result<TreeCopy> {
    let mut copy = TreeCopy::default();
    let mut unflushed_bytes = 0u64;
    let mut buffer = vec![0u8; COPY_BUFFER_BYTES];
    create_directory(destination)?;
    copy.directories += 1;
    let mut stack = vec![(source.to_path_buf(), destination.to_path_buf())];
    while let Some((from, to)) = stack.pop() {
        let mut entries: Vec<_> = match fs::read_dir(&from) {
            Ok(entries) => entries.filter_map(|entry| entry.ok()).collect(),
            Err(_) => continue,
        };
        entries.sort_by_key(|entry| entry.file_name());
        let mut subdirectories = Vec::new();
        for entry in entries {
            if copy.bytes >= bytes_max {
                return Ok(copy);
            }
            let Ok(metadata) = entry.path().symlink_metadata() else {
                continue;
            };
            let target = to.join(entry.file_name());
            if metadata.is_dir() {
                create_directory(&target)?;
                copy.directories += 1;
                subdirectories.push((entry.path(), target));
            } else if metadata.is_file() {
                let Ok(mut input) = fs::File::open(entry.path()) else {
                    continue;
                };
                let copied = copy_file(&mut input, &target, &mut buffer)?;
                copy.files += 1;
                copy.bytes += copied;
                unflushed_bytes += copied;
                if let Some(every) = flush_every_bytes {
                    if unflushed_bytes >= every {
                        sync_file_system(destination)?;
                        unflushed_bytes = 0;
                    }
                }
            }
        }
        // Depth first in name order: push in reverse so the smallest name is visited next.
        stack.extend(subdirectories.into_iter().rev());
    }
    Ok(copy)
}

fn copy_file(input: &mut fs::File, target: &Path, buffer: &mut [u8]) -> Result<u64> {
    let mut output =
        fs::File::create(target).context_io(|| format!("creating {}", target.display()))?;
    let mut copied = 0u64;
    loop {
        // A source file that cannot be read further is copied as far as it could be read.
        let read = match input.read(buffer) {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        output
            .write_all(&buffer[..read])
            .context_io(|| format!("writing {}", target.display()))?;
        copied += read as u64;
    }
    Ok(copied)
}

/// Creates `count` empty files in `directory` from `threads` threads (names `t{thread}-{n}`),
/// each created and closed (paper 1 §5.4.2: 16 threads, 1.5 M files, one directory).
pub fn create_empty_files(directory: &Path, count: u64, threads: usize) -> Result<u64> {
    assert!(threads > 0, "at least one thread");
    create_directory(directory)?;
    let per_thread = count.div_ceil(threads as u64);
    let results: Vec<Result<u64>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|thread| {
                scope.spawn(move || -> Result<u64> {
                    let first = thread as u64 * per_thread;
                    let last = (first + per_thread).min(count);
                    for index in first..last {
                        let path = directory.join(format!("t{thread:02}-{index:09}"));
                        fs::File::create(&path)
                            .context_io(|| format!("creating {}", path.display()))?;
                    }
                    Ok(last.saturating_sub(first))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| handle.join().expect("a create thread panicked"))
            .collect()
    });
    let mut created = 0;
    for result in results {
        created += result?;
    }
    assert_eq!(created, count);
    Ok(created)
}

/// Appends `appends` blocks from `source` to the file at `path`, calling `fsync` after every
/// `fsync_every` appends and once at the end (paper 1 §5.4.2: one thread, 4 KiB appends,
/// fsync every 100). Returns the number of fsync calls.
pub fn append_with_fsync(
    path: &Path,
    appends: u64,
    fsync_every: u64,
    source: &mut BlockSource,
) -> Result<u64> {
    assert!(fsync_every > 0, "fsync_every must be positive");
    let mut file = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .context_io(|| format!("opening {}", path.display()))?;
    let mut block = [0u8; BLOCK_BYTES];
    let mut fsyncs = 0;
    let fsync = |file: &fs::File| {
        file.sync_all()
            .context_io(|| format!("fsync of {}", path.display()))
    };
    for index in 1..=appends {
        source.next_block(&mut block);
        file.write_all(&block)
            .context_io(|| format!("appending to {}", path.display()))?;
        if index % fsync_every == 0 {
            fsync(&file)?;
            fsyncs += 1;
        }
    }
    if !appends.is_multiple_of(fsync_every) {
        fsync(&file)?;
        fsyncs += 1;
    }
    Ok(fsyncs)
}

/// Writes `bytes` of never-repeating data to a new file at `path` and syncs its file system
/// (paper 1 §5.4.4 step 2: unique data that replaces the cached fingerprints).
pub fn write_unique_file(path: &Path, bytes: u64, seed: u64) -> Result<()> {
    let mut source = BlockSource::new(seed, 0.0);
    let mut file = fs::File::create(path).context_io(|| format!("creating {}", path.display()))?;
    let mut block = [0u8; BLOCK_BYTES];
    for _ in 0..bytes.div_ceil(BLOCK_BYTES as u64) {
        source.next_block(&mut block);
        file.write_all(&block)
            .context_io(|| format!("writing {}", path.display()))?;
    }
    drop(file);
    sync_file_system(path.parent().unwrap_or(path))
}

/// Deterministic 4 KiB blocks of which a chosen fraction repeats an earlier block of the same
/// source (chosen uniformly), the rest being new pseudo-random content. The same seed and
/// fraction always give the same sequence.
#[derive(Clone, Debug)]
pub struct BlockSource {
    state: u64,
    duplicate_fraction: f64,
    /// Seeds of the distinct blocks generated so far.
    seeds: Vec<u64>,
}

impl BlockSource {
    /// A source whose blocks repeat an earlier one with probability `duplicate_fraction`.
    pub fn new(seed: u64, duplicate_fraction: f64) -> BlockSource {
        assert!(
            (0.0..=1.0).contains(&duplicate_fraction),
            "duplicate_fraction {duplicate_fraction} is not a probability"
        );
        BlockSource {
            state: seed ^ 0x9E37_79B9_7F4A_7C15,
            duplicate_fraction,
            seeds: Vec::new(),
        }
    }

    /// Fills `block` with the next block.
    pub fn next_block(&mut self, block: &mut [u8; BLOCK_BYTES]) {
        let draw = (self.next_random() >> 11) as f64 / (1u64 << 53) as f64;
        let seed = if draw < self.duplicate_fraction && !self.seeds.is_empty() {
            let pick = self.next_random() % self.seeds.len() as u64;
            self.seeds[pick as usize]
        } else {
            let seed = self.next_random();
            self.seeds.push(seed);
            seed
        };
        fill_block(seed, block);
    }

    /// Distinct blocks generated so far.
    pub fn distinct_blocks(&self) -> usize {
        self.seeds.len()
    }

    fn next_random(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        splitmix(self.state)
    }
}

fn splitmix(mut value: u64) -> u64 {
    value = (value ^ (value >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    value = (value ^ (value >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    value ^ (value >> 31)
}

/// Pseudo-random content determined by `seed` (never all zeros in practice).
fn fill_block(seed: u64, block: &mut [u8; BLOCK_BYTES]) {
    let mut state = seed;
    for word in block.chunks_exact_mut(8) {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        word.copy_from_slice(&splitmix(state).to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// Goal: the duplicate fraction is honoured and sequences are reproducible; method: count
    /// distinct blocks of 4,000 draws at 25% and compare two sources with one seed.
    #[test]
    fn block_source_repeats_the_chosen_fraction() {
        let mut source = BlockSource::new(7, 0.25);
        let mut again = BlockSource::new(7, 0.25);
        let mut distinct = HashSet::new();
        let (mut block, mut other) = ([0u8; BLOCK_BYTES], [0u8; BLOCK_BYTES]);
        for _ in 0..4000 {
            source.next_block(&mut block);
            again.next_block(&mut other);
            assert_eq!(block, other);
            distinct.insert(block);
        }
        let unique_fraction = distinct.len() as f64 / 4000.0;
        assert!((0.72..0.78).contains(&unique_fraction), "{unique_fraction}");
        assert_eq!(distinct.len(), source.distinct_blocks());
        let mut unique = BlockSource::new(1, 0.0);
        let mut seen = HashSet::new();
        for _ in 0..1000 {
            unique.next_block(&mut block);
            assert!(seen.insert(block));
        }
    }

    /// Goal: a tree copy copies files in name order up to the byte limit and skips symlinks;
    /// method: copy a small tree with and without a limit.
    #[test]
    fn copy_tree_copies_in_order_up_to_the_limit() {
        let directory = tempfile::tempdir().unwrap();
        let source = directory.path().join("source");
        fs::create_dir_all(source.join("b/inner")).unwrap();
        fs::write(source.join("a.txt"), vec![1u8; 1000]).unwrap();
        fs::write(source.join("b/inner/c.txt"), vec![2u8; 3000]).unwrap();
        fs::write(source.join("d.txt"), vec![3u8; 500]).unwrap();
        std::os::unix::fs::symlink("a.txt", source.join("link")).unwrap();
        let all = copy_tree(&source, &directory.path().join("all"), u64::MAX, None).unwrap();
        assert_eq!(
            all,
            TreeCopy {
                files: 3,
                directories: 3,
                bytes: 4500
            }
        );
        assert_eq!(
            fs::read(directory.path().join("all/b/inner/c.txt")).unwrap(),
            vec![2u8; 3000]
        );
        assert!(!directory.path().join("all/link").exists());
        // a.txt (1000) then d.txt (500) come before the directory b is entered.
        let part = copy_tree(&source, &directory.path().join("part"), 1200, Some(1)).unwrap();
        assert_eq!(part.files, 2);
        assert_eq!(part.bytes, 1500);
        assert!(!directory.path().join("part/b/inner/c.txt").exists());
    }

    /// Goal: file creation and append drivers do what they count; method: run them in a
    /// temporary directory and inspect the result.
    #[test]
    fn create_and_append_drivers_count_their_work() {
        let directory = tempfile::tempdir().unwrap();
        let files = directory.path().join("files");
        assert_eq!(create_empty_files(&files, 103, 4).unwrap(), 103);
        assert_eq!(fs::read_dir(&files).unwrap().count(), 103);
        let log = directory.path().join("log");
        let mut source = BlockSource::new(3, 0.5);
        assert_eq!(append_with_fsync(&log, 250, 100, &mut source).unwrap(), 3);
        assert_eq!(fs::metadata(&log).unwrap().len(), 250 * BLOCK_BYTES as u64);
        let unique = directory.path().join("unique");
        write_unique_file(&unique, 10_000, 9).unwrap();
        assert_eq!(fs::metadata(&unique).unwrap().len(), 3 * BLOCK_BYTES as u64);
    }
}
