//! Options of the store and of its series: deduplication mode, sizes, windows.
//!
//! - [`StoreOptions`] are fixed when the backup store is created (they are recorded in its
//!   catalog): the [`DedupMode`], segment, chunk and container sizes, compression, fingerprint
//!   and the default [`DeleteMethod`].
//! - [`SeriesOptions`] belong to one series: the *live window* (how many of the newest backups
//!   stay segment-deduplicated and fast to restore, paper 2 §2.2.1; default one) and the
//!   *retention window* (how many backups are kept; `None` keeps all). The *archival window*
//!   is what lies between them.
//! - [`RuntimeOptions`] change nothing on disk: threads, restore windows, index cache.

use onecopy_core::chunking::{ChunkerSpec, RollingHash};
use onecopy_core::container::{ContainerOptions, CONTAINER_BYTES_MAX, CONTAINER_BYTES_MIN};
use onecopy_core::fingerprint::FingerprintAlgorithm;
use onecopy_core::index::IndexOptions;
use serde::{Deserialize, Serialize};

use crate::error::{BackupError, Result};

/// Paper 2's segment size: 4 MiB average.
pub const SEGMENT_BYTES_DEFAULT: usize = 4 << 20;
/// Paper 2's chunk size: 4 KiB average.
pub const CHUNK_BYTES_DEFAULT: usize = 4 << 10;
/// Paper 2's container size: 32 MiB.
pub const CONTAINER_BYTES_DEFAULT: u64 = 32 << 20;
/// zstd level of stored chunks by default: compression is most of a first backup's time, so
/// the write path compresses at zstd's fastest positive level, with zstd's own parameters, and
/// recompression stores the frames smaller later (docs/BENCHMARKS.md, "Recompression").
pub const COMPRESSION_LEVEL_DEFAULT: i32 = 1;
/// zstd level at which a backup compresses again the frames that earlier backups wrote
/// (docs/DESIGN.md, "Recompression"): on the Debian series of docs/BENCHMARKS.md the store
/// ends about 8% smaller than with level 1 alone; zstd's benchmark compresses at level 7 at
/// about a quarter of level 1's speed, time the first backup and every restore never spend.
pub const RECOMPRESSION_LEVEL_DEFAULT: i32 = 7;
/// Largest live window accepted.
pub const LIVE_WINDOW_MAX: u32 = 1 << 16;
/// Segments the segment index's filter is first sized for: 4 GiB of unique data in 4 MiB
/// segments. The filter grows with the index (rebuilt from its buckets, see
/// `onecopy_core::index`), and every writable open reads it whole, so it starts small: the
/// index's own default, a million entries, is a 1.2 MiB filter, read by every backup of even
/// the smallest store.
pub const SEGMENT_INDEX_EXPECTED_ENTRIES: u64 = 1 << 10;
/// Logical bytes a restore assembles at once (per window) by default. Up to four windows are
/// in memory at once (one assembled, two queued for the writer, one being written), with the
/// frames read for one, so the window sets a restore's memory (docs/BENCHMARKS.md, "Figures
/// the design refers to").
pub const RESTORE_WINDOW_BYTES_DEFAULT: usize = 8 << 20;
/// Smallest space reserve by default; it grows with the catalog (see
/// [`crate::store::reserve_bytes`]).
pub const RESERVE_BYTES_MIN: u64 = 1 << 20;

/// How new backups are deduplicated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum DedupMode {
    /// Paper 2: segment-level inline deduplication, then reverse deduplication of chunks when
    /// a backup leaves the live window.
    #[default]
    Revdedup,
    /// The paper's baseline: inline deduplication of chunks (each chunk is a one-chunk
    /// segment), no reverse deduplication.
    Conventional,
}

impl std::str::FromStr for DedupMode {
    type Err = BackupError;
    fn from_str(text: &str) -> Result<Self> {
        match text {
            "revdedup" => Ok(DedupMode::Revdedup),
            "conventional" => Ok(DedupMode::Conventional),
            _ => Err(BackupError::InvalidArgument(format!(
                "mode {text:?}: use revdedup or conventional"
            ))),
        }
    }
}

/// How deleting a backup reclaims space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeleteMethod {
    /// Paper 2 §2.5: drop whole containers whose segments all died with the deleted backup
    /// (the repackaged containers stamped with its time), reading no container.
    Timestamp,
    /// The baseline: after the metadata update, read every container and rewrite those that
    /// hold unreferenced chunks (mark and sweep).
    MarkAndSweep,
}

impl std::str::FromStr for DeleteMethod {
    type Err = BackupError;
    fn from_str(text: &str) -> Result<Self> {
        match text {
            "timestamp" => Ok(DeleteMethod::Timestamp),
            "mark-and-sweep" => Ok(DeleteMethod::MarkAndSweep),
            _ => Err(BackupError::InvalidArgument(format!(
                "delete method {text:?}: use timestamp or mark-and-sweep"
            ))),
        }
    }
}

/// Options fixed when the store is created.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoreOptions {
    pub mode: DedupMode,
    /// Average segment size (min and max are half and twice). Ignored in conventional mode.
    pub segment_bytes: usize,
    /// Average chunk size (min and max are half and twice).
    pub chunk_bytes: usize,
    /// The rolling hash that finds chunk and segment boundaries.
    pub rolling_hash: RollingHash,
    /// A container is sealed when the next segment would not fit.
    pub container_bytes: u64,
    /// zstd level of stored chunks; `None` stores them uncompressed.
    pub compression_level: Option<i32>,
    /// zstd level at which frames are compressed again once a later backup commits; `None`
    /// keeps them as the write path stored them.
    pub recompression_level: Option<i32>,
    pub fingerprint: FingerprintAlgorithm,
    /// Used by `delete` and `expire` unless the caller picks one.
    pub delete_method: DeleteMethod,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions::for_mode(DedupMode::Revdedup)
    }
}

impl StoreOptions {
    /// Paper 2's defaults for `mode` (conventional deletes by mark and sweep, as there are no
    /// per-backup containers to drop).
    pub fn for_mode(mode: DedupMode) -> Self {
        StoreOptions {
            mode,
            segment_bytes: SEGMENT_BYTES_DEFAULT,
            chunk_bytes: CHUNK_BYTES_DEFAULT,
            // Gear rather than the paper's Rabin: the same content-defined boundaries at
            // several times the speed (docs/DESIGN.md, "Backup store").
            rolling_hash: RollingHash::Gear,
            container_bytes: CONTAINER_BYTES_DEFAULT,
            compression_level: Some(COMPRESSION_LEVEL_DEFAULT),
            recompression_level: Some(RECOMPRESSION_LEVEL_DEFAULT),
            fingerprint: FingerprintAlgorithm::Blake3,
            delete_method: match mode {
                DedupMode::Revdedup => DeleteMethod::Timestamp,
                DedupMode::Conventional => DeleteMethod::MarkAndSweep,
            },
        }
    }

    /// The chunker of the write path: two-level `segment:S/C` (Rabin) or `segment-gear:S/C`
    /// for RevDedup. Conventional mode makes every chunk a segment of its own, so it uses the
    /// same chunk boundaries (`segment-gear:S/C`, its segment ends ignored) or, with Rabin,
    /// plain `rabin:C` as the paper does.
    pub fn chunker_spec(&self) -> Result<ChunkerSpec> {
        let text = match (self.mode, self.rolling_hash) {
            (DedupMode::Revdedup, RollingHash::Rabin) => {
                format!("segment:{}/{}", self.segment_bytes, self.chunk_bytes)
            }
            (_, RollingHash::Gear) => {
                format!("segment-gear:{}/{}", self.segment_bytes, self.chunk_bytes)
            }
            (DedupMode::Conventional, RollingHash::Rabin) => format!("rabin:{}", self.chunk_bytes),
        };
        text.parse().map_err(BackupError::from)
    }

    /// Options of the container store.
    pub fn container_options(&self) -> ContainerOptions {
        // Chunks are compressed by the write path's worker threads and appended in stored
        // form, so the container writer itself never compresses.
        ContainerOptions {
            container_bytes: self.container_bytes,
            compression_level: None,
        }
    }

    /// Checks every field; the error names the field and its range.
    pub fn validate(&self) -> Result<()> {
        self.chunker_spec()?;
        if !(CONTAINER_BYTES_MIN..=CONTAINER_BYTES_MAX).contains(&self.container_bytes) {
            return Err(BackupError::InvalidArgument(format!(
                "container size {} must be between {CONTAINER_BYTES_MIN} and {CONTAINER_BYTES_MAX}",
                self.container_bytes
            )));
        }
        for level in [self.compression_level, self.recompression_level]
            .into_iter()
            .flatten()
        {
            if !(1..=19).contains(&level) {
                return Err(BackupError::InvalidArgument(format!(
                    "zstd level {level} must be between 1 and 19"
                )));
            }
        }
        if let (Some(level), Some(recompression)) =
            (self.compression_level, self.recompression_level)
        {
            if recompression <= level {
                return Err(BackupError::InvalidArgument(format!(
                    "recompression level {recompression} must be above the compression level \
                     {level}, or `none`"
                )));
            }
        }
        if self.fingerprint.is_weak() {
            return Err(BackupError::InvalidArgument(format!(
                "fingerprint {} is not collision resistant; the backup store needs blake3, \
                 sha256, sha1 or md5",
                self.fingerprint.name()
            )));
        }
        Ok(())
    }
}

/// Options of one series.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeriesOptions {
    /// Newest backups kept segment-deduplicated (at least one).
    pub live_window: u32,
    /// Backups kept by `expire` without `--keep` and after each `create`; `None` keeps all.
    pub retention: Option<u32>,
}

impl Default for SeriesOptions {
    fn default() -> Self {
        SeriesOptions {
            live_window: 1,
            retention: None,
        }
    }
}

impl SeriesOptions {
    /// Checks the windows: the live window holds one to [`LIVE_WINDOW_MAX`] backups and the
    /// retention window at least the live window.
    pub fn validate(&self) -> Result<()> {
        if !(1..=LIVE_WINDOW_MAX).contains(&self.live_window) {
            return Err(BackupError::InvalidArgument(format!(
                "live window {} must be between 1 and {LIVE_WINDOW_MAX} backups",
                self.live_window
            )));
        }
        if let Some(retention) = self.retention {
            if retention < self.live_window {
                return Err(BackupError::InvalidArgument(format!(
                    "retention window {retention} must hold at least the live window ({})",
                    self.live_window
                )));
            }
        }
        Ok(())
    }
}

/// Options that change nothing on disk.
#[derive(Clone, Debug)]
pub struct RuntimeOptions {
    /// Threads reading containers during restore and reverse deduplication.
    pub read_threads: usize,
    /// Logical bytes a restore assembles at once.
    pub restore_window_bytes: usize,
    /// Ask the kernel to read the containers of the next window ahead (posix_fadvise).
    pub prefetch: bool,
    /// The segment index's cache and filter.
    pub index: IndexOptions,
    /// Smallest space reserve kept for the commits that free space (see
    /// [`crate::store`], which keeps it); it grows with the catalog.
    pub reserve_bytes_min: u64,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        RuntimeOptions {
            read_threads: std::thread::available_parallelism().map_or(2, |count| count.get()),
            restore_window_bytes: RESTORE_WINDOW_BYTES_DEFAULT,
            prefetch: true,
            index: IndexOptions {
                expected_entries: SEGMENT_INDEX_EXPECTED_ENTRIES,
                ..IndexOptions::default()
            },
            reserve_bytes_min: RESERVE_BYTES_MIN,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: recorded options name their rolling hash; a record without one is refused
    /// rather than read as some default, which would chunk new backups differently from the
    /// old ones. Method: drop the field from the recorded JSON and read it back.
    #[test]
    fn options_without_a_rolling_hash_are_refused() {
        let mut recorded = serde_json::to_value(StoreOptions::default()).unwrap();
        assert_eq!(recorded["rolling_hash"], "gear", "new stores use gear");
        let options: StoreOptions = serde_json::from_value(recorded.clone()).unwrap();
        assert_eq!(options, StoreOptions::default());
        recorded.as_object_mut().unwrap().remove("rolling_hash");
        assert!(serde_json::from_value::<StoreOptions>(recorded).is_err());
    }
}
