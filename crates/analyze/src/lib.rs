//! `onecopy analyze`: how much would deduplication save on these files, images or devices?
//!
//! [`analyze`] reads every regular file and block device under the given paths (see
//! [`sources`] for which files count), cuts each from its first byte with each chunker, and
//! counts, per chunker:
//!
//! - **total bytes** and **chunks**: everything read (a file's last chunk may be shorter);
//! - **zero bytes**: bytes in chunks that are entirely zero. Such a chunk is counted in the
//!   totals but never stored (a deduplicating store keeps holes), so it is not unique;
//! - **unique bytes** and **unique chunks**: distinct non-zero chunk contents, by BLAKE3
//!   fingerprint (the first 16 bytes, see [`seen`]): what a store would keep.
//!
//! Each chunker makes its own **pass** over the data, so [`ChunkerReport::seconds`] is that
//! pass's wall-clock time and `total_bytes / seconds` its throughput; data that is not in the
//! page cache is read once per chunker. A pass uses both cores even on a single large file: a
//! reader thread reads 8 MiB blocks while one core cuts the next block and both fingerprint the
//! current one (see `pass.rs`).
//!
//! Memory: a few blocks of buffers (4 × 8 MiB plus one maximum chunk each) and the set of seen
//! fingerprints, 19 to 39 bytes per unique chunk, up to 1.5 times that while the set grows (see
//! [`seen`] for measurements); only one pass's set exists at a time.
//!
//! ```no_run
//! use onecopy_analyze::{analyze, NoProgress};
//! let chunkers = ["fixed:4096".parse().unwrap(), "fastcdc:8192".parse().unwrap()];
//! let report = analyze(&["/usr/lib".into()], &chunkers, &NoProgress).unwrap();
//! for result in &report.results {
//!     println!("{}: {} of {} bytes unique", result.chunker, result.unique_bytes, result.total_bytes);
//! }
//! ```

mod pass;
mod reader;
pub mod seen;
pub mod sources;

use std::io;
use std::path::{Path, PathBuf};

use onecopy_core::chunking::ChunkerSpec;
use serde::Serialize;

pub use sources::SourceList;

/// The chunkers analyzed when none are given: fixed blocks as a block device sees them, the
/// two content-defined chunkers at the common 8 KiB average, and RevDedup's two-level chunking
/// with 4 MiB segments of 4 KiB chunks.
pub const DEFAULT_CHUNKERS: [&str; 4] = [
    "fixed:4096",
    "fastcdc:8192",
    "rabin:8192",
    "segment:4MiB/4KiB",
];

/// The default chunkers, parsed.
pub fn default_chunkers() -> Vec<ChunkerSpec> {
    DEFAULT_CHUNKERS
        .iter()
        .map(|text| text.parse().expect("default chunkers are valid"))
        .collect()
}

/// Errors of `onecopy analyze`: which path, what was being done, and why it failed.
#[derive(Debug, thiserror::Error)]
pub enum AnalyzeError {
    #[error("{action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("no chunkers to analyze with")]
    NoChunkers,
}

impl AnalyzeError {
    pub(crate) fn io(action: &'static str, path: &Path, source: io::Error) -> AnalyzeError {
        AnalyzeError::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Results of one chunker.
#[derive(Clone, Debug, Serialize)]
pub struct ChunkerReport {
    /// The chunker (serialized as its canonical text).
    pub chunker: ChunkerSpec,
    pub total_bytes: u64,
    pub zero_bytes: u64,
    pub unique_bytes: u64,
    pub chunks: u64,
    pub unique_chunks: u64,
    /// Wall-clock seconds of this chunker's pass.
    pub seconds: f64,
    /// Bytes of the set of seen fingerprints at the end of the pass.
    #[serde(skip)]
    pub index_bytes: u64,
}

impl ChunkerReport {
    /// Bytes a deduplicating store would not keep (duplicates and zero chunks), as a fraction
    /// of the total; 0 for no data.
    pub fn saved_fraction(&self) -> f64 {
        if self.total_bytes == 0 {
            0.0
        } else {
            1.0 - self.unique_bytes as f64 / self.total_bytes as f64
        }
    }
}

/// Results of [`analyze`]: one entry per chunker, in the order given.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub results: Vec<ChunkerReport>,
    /// Regular files read.
    #[serde(skip)]
    pub files: u64,
    /// Block devices read.
    #[serde(skip)]
    pub block_devices: u64,
    /// Symbolic links and special files skipped.
    #[serde(skip)]
    pub skipped: u64,
}

/// Observes the progress of [`analyze`] (the CLI draws a progress bar).
pub trait Progress: Sync {
    /// A pass with `chunker` starts; it will read about `total_bytes`.
    fn begin_pass(&self, chunker: &ChunkerSpec, total_bytes: u64);
    /// `bytes` more have been counted in the current pass.
    fn advance(&self, bytes: u64);
}

/// A [`Progress`] that ignores everything.
pub struct NoProgress;

impl Progress for NoProgress {
    fn begin_pass(&self, _chunker: &ChunkerSpec, _total_bytes: u64) {}
    fn advance(&self, _bytes: u64) {}
}

/// Analyzes `paths` with each of `chunkers` (see the crate documentation). Fails on the first
/// path that cannot be listed, opened or read, naming it.
pub fn analyze(
    paths: &[PathBuf],
    chunkers: &[ChunkerSpec],
    progress: &dyn Progress,
) -> Result<Report, AnalyzeError> {
    if chunkers.is_empty() {
        return Err(AnalyzeError::NoChunkers);
    }
    let list = SourceList::walk(paths)?;
    let total_bytes = list.total_bytes();
    let mut results = Vec::with_capacity(chunkers.len());
    for chunker in chunkers {
        progress.begin_pass(chunker, total_bytes);
        results.push(pass::run_pass(chunker, &list, progress)?);
    }
    let block_devices = list
        .sources
        .iter()
        .filter(|source| source.kind == sources::SourceKind::BlockDevice)
        .count() as u64;
    Ok(Report {
        results,
        files: list.sources.len() as u64 - block_devices,
        block_devices,
        skipped: list.skipped_symlinks + list.skipped_special,
    })
}
