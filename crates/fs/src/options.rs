//! The settings of one file system: the ranker's parameters (paper 3, Table 2) and the
//! deduplicator's chunk sizes.

use serde::{Deserialize, Serialize};

use crate::error::{FsError, Result};

/// Seconds in a day.
const DAY_SECONDS: u64 = 24 * 60 * 60;
/// Smallest chunk the deduplicator cuts.
pub const CHUNK_BYTES_MIN: u64 = 4 << 10;
/// Largest chunk the deduplicator cuts (and largest plain chunk a write stores).
pub const CHUNK_BYTES_MAX: u64 = 1 << 20;

/// How the deduplicator cuts a file with small chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SmallChunking {
    /// Fixed-size chunks at multiples of the chunk size (the paper's).
    Fixed,
    /// Content-defined chunks (FastCDC) averaging the chunk size: finds duplicates that are
    /// shifted within files.
    ContentDefined,
}

/// Ranker and deduplicator settings of one file system. `onecopy fs create` and
/// `onecopy fs config` set them; the defaults are the paper's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsOptions {
    /// MIN_EVALUATION_INT: a file modified more recently than this stays rank 0.
    pub min_evaluation_interval_seconds: u64,
    /// MAX_HOT_INT: a file not accessed for longer than this is cold (rank 3).
    pub max_hot_interval_seconds: u64,
    /// MIN_EVALUATION_CNT: reads a hot file needs before it is ranked 1 or 2.
    pub min_evaluation_count: u64,
    /// Seconds without a request after which the ranker and deduplicator run by themselves;
    /// 0 runs them only on `onecopy fs dedup`.
    pub idle_seconds: u64,
    /// Chunk size of rank-1 (sequentially read) files.
    pub big_chunk_bytes: u64,
    /// Chunk size of rank-2 (randomly read) and rank-3 (cold) files.
    pub small_chunk_bytes: u64,
    /// How small chunks are cut.
    pub small_chunking: SmallChunking,
    /// Share of its time a deduplication run started by idleness works (it pauses the
    /// rest), 1 to 100 percent; `onecopy fs dedup` always runs at full speed.
    #[serde(default = "dedup_share_default")]
    pub dedup_share_percent: u64,
}

fn dedup_share_default() -> u64 {
    50
}

impl Default for FsOptions {
    fn default() -> Self {
        FsOptions {
            min_evaluation_interval_seconds: 2 * DAY_SECONDS,
            max_hot_interval_seconds: 14 * DAY_SECONDS,
            min_evaluation_count: 100,
            idle_seconds: 60,
            big_chunk_bytes: 256 << 10,
            small_chunk_bytes: 4 << 10,
            small_chunking: SmallChunking::Fixed,
            dedup_share_percent: dedup_share_default(),
        }
    }
}

impl FsOptions {
    /// Checks the documented ranges.
    pub fn validate(&self) -> Result<()> {
        for (what, bytes) in [
            ("big chunk", self.big_chunk_bytes),
            ("small chunk", self.small_chunk_bytes),
        ] {
            if !(CHUNK_BYTES_MIN..=CHUNK_BYTES_MAX).contains(&bytes) || !bytes.is_power_of_two() {
                return Err(FsError::InvalidArgument(format!(
                    "the {what} size {bytes} must be a power of two between {CHUNK_BYTES_MIN} \
                     and {CHUNK_BYTES_MAX} bytes"
                )));
            }
        }
        if !(1..=100).contains(&self.dedup_share_percent) {
            return Err(FsError::InvalidArgument(format!(
                "the deduplicator's share {}% must be between 1 and 100",
                self.dedup_share_percent
            )));
        }
        if self.small_chunk_bytes > self.big_chunk_bytes {
            return Err(FsError::InvalidArgument(format!(
                "the small chunk size ({}) is larger than the big one ({})",
                self.small_chunk_bytes, self.big_chunk_bytes
            )));
        }
        Ok(())
    }
}

/// Changes to [`FsOptions`]: each field that is set replaces the current value.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OptionChanges {
    pub min_evaluation_interval_seconds: Option<u64>,
    pub max_hot_interval_seconds: Option<u64>,
    pub min_evaluation_count: Option<u64>,
    pub idle_seconds: Option<u64>,
    pub big_chunk_bytes: Option<u64>,
    pub small_chunk_bytes: Option<u64>,
    pub small_chunking: Option<SmallChunking>,
    #[serde(default)]
    pub dedup_share_percent: Option<u64>,
}

impl OptionChanges {
    /// `options` with these changes, validated.
    pub fn applied_to(&self, options: &FsOptions) -> Result<FsOptions> {
        let mut changed = options.clone();
        let pairs = [
            (
                &mut changed.min_evaluation_interval_seconds,
                self.min_evaluation_interval_seconds,
            ),
            (
                &mut changed.max_hot_interval_seconds,
                self.max_hot_interval_seconds,
            ),
            (&mut changed.min_evaluation_count, self.min_evaluation_count),
            (&mut changed.idle_seconds, self.idle_seconds),
            (&mut changed.big_chunk_bytes, self.big_chunk_bytes),
            (&mut changed.small_chunk_bytes, self.small_chunk_bytes),
            (&mut changed.dedup_share_percent, self.dedup_share_percent),
        ];
        for (field, value) in pairs {
            if let Some(value) = value {
                *field = value;
            }
        }
        if let Some(chunking) = self.small_chunking {
            changed.small_chunking = chunking;
        }
        changed.validate()?;
        Ok(changed)
    }
}
