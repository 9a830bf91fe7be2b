//! Table 2 of paper 2: backup and restore throughput on unique data (nothing to deduplicate),
//! beside the limits of the machine measured in the same run.
//!
//! The paper writes 8 GB of unique data into RevDedup and reads it back, and compares with
//! the native file system's raw write and read rates (20 runs, mean and standard deviation).
//! Here one run of [`run_unique`] does, on one buffer of random bytes:
//!
//! 1. *memcpy*: copy the buffer once (the rate no step that touches every byte can beat);
//! 2. *hash*: BLAKE3 of every 4 KiB piece on one thread (the store's fingerprint, per chunk,
//!    without chunking);
//! 3. *raw write*: write the buffer to a file in the work directory and `fdatasync` it;
//! 4. *raw read*: drop the page cache and read that file sequentially in 1 MiB reads;
//! 5. for each store configuration (Conv and RevDedup with 1, 4 and 8 MiB segments, no
//!    compression, as the paper's): back the file up into an empty store (chunking,
//!    fingerprinting, index, packing and the sync of the containers), then drop the page
//!    cache and restore it into a sink that compares it with the buffer.
//!
//! Ratios within one run (store against raw) are what to read: the machine is shared and its
//! virtual disk's rate varies between runs more than between steps of one run.

use std::fs;
use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;

use onecopy_backup::BackupSource;
use onecopy_core::error::IoContext;
use serde::{Deserialize, Serialize};

use super::measure::{drop_page_cache, timed, StoreConfig, StoreUnderTest, Timing};
use super::synthetic::SplitMix64;
use crate::error::Result;

/// Size of the pieces the hash limit is measured on (the store's average chunk).
const HASH_PIECE_BYTES: usize = 4 << 10;
/// Size of each read of the raw read.
const READ_BYTES: usize = 1 << 20;

/// The store configurations of Table 2.
pub fn unique_stores() -> Vec<StoreConfig> {
    vec![
        StoreConfig::conventional(),
        StoreConfig::revdedup(1 << 20, 32 << 20, 1),
        StoreConfig::revdedup(4 << 20, 32 << 20, 1),
        StoreConfig::revdedup(8 << 20, 32 << 20, 1),
    ]
}

/// One run of the machine's limits.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LimitsRun {
    pub run: u32,
    pub memcpy: Timing,
    pub hash: Timing,
    pub raw_write: Timing,
    pub raw_read: Timing,
    /// The page cache was dropped before the raw read.
    pub cold_cache: bool,
}

/// One store's backup and restore of the unique data in one run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UniqueRun {
    pub store: String,
    pub run: u32,
    pub backup: Timing,
    /// Container bytes written (the data, chunk headers and container ends).
    pub stored_bytes: u64,
    pub restore: Timing,
    pub restore_read_bytes: u64,
    pub restore_cold_cache: bool,
}

/// Everything Table 2 measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UniqueResults {
    pub bytes: u64,
    pub limits: Vec<LimitsRun>,
    pub stores: Vec<UniqueRun>,
}

/// Runs the unique-data test `runs` times on `bytes` of random data in `work` (created and
/// removed).
pub fn run_unique(
    bytes: u64,
    runs: u32,
    work: &Path,
    read_threads: usize,
    log: &mut dyn FnMut(&str),
) -> Result<UniqueResults> {
    fs::create_dir_all(work).context_io(|| format!("creating {}", work.display()))?;
    let mut data = vec![0u8; bytes as usize];
    SplitMix64::new(0x7ab1e2).fill(&mut data);
    let data = Arc::new(data);
    let file = work.join("unique.bin");
    let mut results = UniqueResults {
        bytes,
        limits: Vec::new(),
        stores: Vec::new(),
    };
    for run in 0..runs {
        let limits = measure_limits(&data, &file, run)?;
        log(&format!(
            "unique data, run {}/{runs}: memcpy {:.0} MB/s, hash {:.0} MB/s, raw write {:.0} \
             MB/s, raw read {:.0} MB/s",
            run + 1,
            megabytes_per_second(bytes, limits.memcpy.seconds),
            megabytes_per_second(bytes, limits.hash.seconds),
            megabytes_per_second(bytes, limits.raw_write.seconds),
            megabytes_per_second(bytes, limits.raw_read.seconds),
        ));
        results.limits.push(limits);
        for config in unique_stores() {
            let label = config.label.clone();
            let mut store =
                StoreUnderTest::create(config, &work.join(format!("store-{label}")), read_threads)?;
            let backup = store.backup("unique", BackupSource::File(file.clone()))?;
            let restore = store.restore_compared("unique", 1, Arc::clone(&data))?;
            log(&format!(
                "unique data, run {}/{runs}: {label} backup {:.0} MB/s, restore {:.0} MB/s",
                run + 1,
                megabytes_per_second(bytes, backup.timing.seconds),
                megabytes_per_second(bytes, restore.timing.seconds),
            ));
            results.stores.push(UniqueRun {
                store: label,
                run,
                backup: backup.timing,
                stored_bytes: backup.new_stored_bytes,
                restore: restore.timing,
                restore_read_bytes: restore.read_bytes,
                restore_cold_cache: restore.cold_cache,
            });
            store.destroy()?;
        }
    }
    fs::remove_dir_all(work).context_io(|| format!("removing {}", work.display()))?;
    Ok(results)
}

fn megabytes_per_second(bytes: u64, seconds: f64) -> f64 {
    bytes as f64 / 1e6 / seconds
}

/// Measures memcpy, hashing and the raw disk on `data`, leaving it in `file` (written and
/// then read, so a backup of it reads it from the page cache, as the paper's precomputed
/// input came from memory).
fn measure_limits(data: &Arc<Vec<u8>>, file: &Path, run: u32) -> Result<LimitsRun> {
    let mut copy = vec![0u8; data.len()];
    // The target is touched first so the copy does not time page faults.
    copy.iter_mut().step_by(4096).for_each(|byte| *byte = 1);
    let ((), memcpy) = timed(|| {
        copy.copy_from_slice(data);
        Ok(())
    })?;
    assert_eq!(copy[..], data[..], "a copy equals its source");
    drop(copy);
    let (digest, hash) = timed(|| {
        let mut fold = [0u8; 32];
        for piece in data.chunks(HASH_PIECE_BYTES) {
            let digest = blake3::hash(piece);
            fold[0] ^= digest.as_bytes()[0];
        }
        Ok(fold)
    })?;
    std::hint::black_box(digest);
    let _ = fs::remove_file(file);
    drop_page_cache();
    let ((), raw_write) = timed(|| {
        let mut output =
            fs::File::create(file).context_io(|| format!("creating {}", file.display()))?;
        output
            .write_all(data)
            .context_io(|| format!("writing {}", file.display()))?;
        output
            .sync_data()
            .context_io(|| format!("syncing {}", file.display()))?;
        Ok(())
    })?;
    let cold_cache = drop_page_cache();
    let (read, raw_read) = timed(|| {
        let mut input =
            fs::File::open(file).context_io(|| format!("opening {}", file.display()))?;
        let mut buffer = vec![0u8; READ_BYTES];
        let mut total = 0usize;
        loop {
            let count = input
                .read(&mut buffer)
                .context_io(|| format!("reading {}", file.display()))?;
            if count == 0 {
                break;
            }
            total += count;
        }
        Ok(total)
    })?;
    assert_eq!(read, data.len(), "the raw read reads what was written");
    Ok(LimitsRun {
        run,
        memcpy,
        hash,
        raw_write,
        raw_read,
        cold_cache,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the unique-data test measures every limit and every store in every run, and
    /// stores all the data (nothing deduplicates); method: two runs on 4 MiB in a
    /// temporary directory.
    #[test]
    fn unique_runs_measure_every_store() {
        let directory = tempfile::tempdir().expect("temporary directory");
        let bytes = 4 << 20;
        let results = run_unique(bytes, 2, &directory.path().join("unique"), 2, &mut |_| {})
            .expect("unique test");
        assert_eq!(results.limits.len(), 2);
        assert_eq!(results.stores.len(), 2 * unique_stores().len());
        for limits in &results.limits {
            for timing in [
                limits.memcpy,
                limits.hash,
                limits.raw_write,
                limits.raw_read,
            ] {
                assert!(timing.seconds > 0.0, "{limits:?}");
            }
        }
        for run in &results.stores {
            assert!(run.stored_bytes >= bytes, "{run:?}");
            assert!(run.restore_read_bytes >= bytes, "{run:?}");
            assert!(run.backup.seconds > 0.0 && run.restore.seconds > 0.0);
        }
        assert!(!directory.path().join("unique").exists());
    }
}
