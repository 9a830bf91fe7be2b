//! A backup store under test: one configuration of the paper (mode, segment and container
//! sizes, live window) in a directory of its own, driven in-process, with every operation
//! timed in wall time and in the process's CPU time (user + system of all threads, from
//! `getrusage`), and the host's load average recorded with it (the machine is shared).
//!
//! Restores go to a hashing sink ([`HashingWriter`]) or a directory, after the page cache is
//! dropped (`sync; echo 3 > /proc/sys/vm/drop_caches`, as the paper does before each read)
//! when the process may; whether it could is recorded with each measurement.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use onecopy_backup::{
    BackupSource, BackupStore, CreateOptions, DedupMode, DeleteMethod, OpenOptions, RestoreTarget,
    RuntimeOptions, SeriesOptions, StoreOptions,
};
use onecopy_core::error::IoContext;
use onecopy_core::storage::LocalStorage;
use serde::{Deserialize, Serialize};

use super::files::{compare_trees, copy_tree, repository_bytes};
use crate::error::{LabError, Result};

/// One configuration of the store, as the paper's figures name them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoreConfig {
    /// Short name used in tables and figures, e.g. `rev-4M` or `conv`.
    pub label: String,
    pub mode: DedupMode,
    pub segment_bytes: usize,
    pub container_bytes: u64,
    pub live_window: u32,
    /// zstd level; the paper's experiments run without compression.
    pub compression_level: Option<i32>,
}

impl StoreConfig {
    /// RevDedup with `segment_bytes` segments and `container_bytes` containers.
    pub fn revdedup(segment_bytes: usize, container_bytes: u64, live_window: u32) -> Self {
        let mut label = format!("rev-{}M", segment_bytes >> 20);
        if container_bytes != 32 << 20 {
            label.push_str(&format!("-c{}M", container_bytes >> 20));
        }
        if live_window != 1 {
            label.push_str(&format!("-lw{live_window}"));
        }
        StoreConfig {
            label,
            mode: DedupMode::Revdedup,
            segment_bytes,
            container_bytes,
            live_window,
            compression_level: None,
        }
    }

    /// The paper's Conv: 4 KiB chunks deduplicated inline, 32 MiB containers.
    pub fn conventional() -> Self {
        StoreConfig {
            label: "conv".to_string(),
            mode: DedupMode::Conventional,
            segment_bytes: 4 << 20,
            container_bytes: 32 << 20,
            live_window: 1,
            compression_level: None,
        }
    }

    fn store_options(&self) -> StoreOptions {
        let mut options = StoreOptions::for_mode(self.mode);
        options.segment_bytes = self.segment_bytes;
        options.container_bytes = self.container_bytes;
        options.compression_level = self.compression_level;
        options
    }
}

/// Wall and CPU time of one operation and the load it ran under.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    pub seconds: f64,
    /// User + system CPU time of this process (all threads) during the operation.
    pub cpu_seconds: f64,
    /// One-minute load average when the operation started.
    pub load_average: f64,
}

/// Measures `operation`.
pub fn timed<T>(operation: impl FnOnce() -> Result<T>) -> Result<(T, Timing)> {
    let load_average = crate::results::load_average();
    let cpu_before = cpu_seconds();
    let started = Instant::now();
    let value = operation()?;
    Ok((
        value,
        Timing {
            seconds: started.elapsed().as_secs_f64(),
            cpu_seconds: cpu_seconds() - cpu_before,
            load_average,
        },
    ))
}

/// CPU time (user + system) used by this process so far, all threads included.
pub fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct we pass and keeps no pointer.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let status = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    if status != 0 {
        return 0.0;
    }
    let seconds = |time: libc::timeval| time.tv_sec as f64 + time.tv_usec as f64 * 1e-6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// Writes dirty pages back and drops the page cache; false when not permitted (not root, or
/// a read-only /proc), in which case reads may be served from memory.
pub fn drop_page_cache() -> bool {
    // SAFETY: sync takes no argument and cannot fail.
    unsafe { libc::sync() };
    fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

/// One backup of a series into one store.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BackupMeasure {
    pub store: String,
    pub series: String,
    pub version: u32,
    /// Which run of the dataset (0 for the first; the paper averages five).
    #[serde(default)]
    pub run: u32,
    pub logical_bytes: u64,
    pub zero_bytes: u64,
    pub duplicate_bytes: u64,
    /// Raw bytes of the new segments' non-null chunks.
    pub new_raw_bytes: u64,
    /// Container bytes written for them.
    pub new_stored_bytes: u64,
    pub index_lookups: u64,
    /// New segments (in conventional mode every chunk is a segment, so these are its new
    /// chunks).
    #[serde(default)]
    pub segments_new: u64,
    pub index_seconds: f64,
    /// Packing new segments into containers: their records and the buffered container
    /// writes, whose disk writeback starts in the background.
    pub write_seconds: f64,
    /// Sealing the last container, which waits for the disk to take every container.
    #[serde(default)]
    pub seal_seconds: f64,
    /// Encoding (compression, in frames) of new chunks.
    #[serde(default)]
    pub compress_seconds: f64,
    #[serde(default)]
    pub fingerprint_seconds: f64,
    /// The whole `create` (walk, inline phase, commit), reverse deduplication excluded.
    pub timing: Timing,
}

/// One reverse deduplication.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReverseMeasure {
    pub store: String,
    pub series: String,
    pub version: u32,
    #[serde(default)]
    pub run: u32,
    pub logical_bytes: u64,
    pub read_bytes: u64,
    pub written_bytes: u64,
    pub chunks_removed: u64,
    pub timing: Timing,
}

/// One restore.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RestoreMeasure {
    pub store: String,
    pub series: String,
    pub version: u32,
    #[serde(default)]
    pub run: u32,
    pub prefetch: bool,
    pub cold_cache: bool,
    pub logical_bytes: u64,
    pub read_bytes: u64,
    /// Read requests (chunks close together in a container are read at once).
    #[serde(default)]
    pub reads: u64,
    pub containers_read: u64,
    /// Time the restore's writer spent in the lab's sink (hashing or comparing the stream),
    /// which a restore to disk would spend writing instead.
    #[serde(default)]
    pub sink_seconds: f64,
    /// Longest chain of indirect references followed.
    pub chain_length_max: u32,
    /// The restored bytes matched the source (hash or tree comparison).
    pub verified: bool,
    pub timing: Timing,
}

/// Space used by a store.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SpaceMeasure {
    /// Bytes of all container files (chunk data with its headers, and garbage).
    pub container_bytes: u64,
    /// Bytes of the chunks some record still references.
    pub referenced_bytes: u64,
    /// Every file of the store: containers, catalog and index.
    pub repository_bytes: u64,
}

/// A store configuration opened in its own directory.
pub struct StoreUnderTest {
    pub config: StoreConfig,
    directory: PathBuf,
    store: Option<BackupStore>,
    prefetch: bool,
    read_threads: usize,
}

impl StoreUnderTest {
    /// Creates the store in `directory` (which must not exist).
    pub fn create(config: StoreConfig, directory: &Path, read_threads: usize) -> Result<Self> {
        if directory.exists() {
            return Err(LabError::InvalidOption(format!(
                "{} exists; each store under test starts empty",
                directory.display()
            )));
        }
        let mut store = StoreUnderTest {
            config,
            directory: directory.to_path_buf(),
            store: None,
            prefetch: false,
            read_threads,
        };
        store.open(false)?;
        Ok(store)
    }

    /// Opens (or reopens) the store with prefetching on or off.
    pub fn open(&mut self, prefetch: bool) -> Result<()> {
        self.store = None;
        let storage = LocalStorage::create(&self.directory).map_err(|error| {
            LabError::engine(format!("opening {}", self.directory.display()), error)
        })?;
        let runtime = RuntimeOptions {
            prefetch,
            read_threads: self.read_threads,
            ..RuntimeOptions::default()
        };
        let store = BackupStore::open(
            Arc::new(storage),
            OpenOptions {
                store: Some(self.config.store_options()),
                runtime,
                read_only: false,
            },
        )
        .map_err(|error| LabError::engine(format!("opening store {}", self.config.label), error))?;
        self.store = Some(store);
        self.prefetch = prefetch;
        Ok(())
    }

    /// Closes the store (before its directory is copied).
    pub fn close(&mut self) {
        self.store = None;
    }

    pub fn directory(&self) -> &Path {
        &self.directory
    }

    fn store(&mut self) -> Result<&mut BackupStore> {
        if self.store.is_none() {
            self.open(self.prefetch)?;
        }
        Ok(self.store.as_mut().expect("opened above"))
    }

    /// Backs `source` up as the next version of `series`, deferring reverse deduplication.
    pub fn backup(&mut self, series: &str, source: BackupSource) -> Result<BackupMeasure> {
        let label = self.config.label.clone();
        let series_options = SeriesOptions {
            live_window: self.config.live_window,
            retention: None,
        };
        let store = self.store()?;
        let (report, timing) = timed(|| {
            store
                .create_backup(
                    series,
                    source,
                    CreateOptions {
                        series_options: Some(series_options),
                        defer_reverse: true,
                        ..CreateOptions::default()
                    },
                )
                .map_err(|error| {
                    LabError::engine(format!("backing {series} up into {label}"), error)
                })
        })?;
        let inline = &report.inline;
        Ok(BackupMeasure {
            store: label,
            series: series.to_string(),
            version: report.version,
            logical_bytes: inline.logical_bytes,
            zero_bytes: inline.zero_bytes,
            duplicate_bytes: inline.duplicate_bytes,
            new_raw_bytes: inline.new_raw_bytes,
            new_stored_bytes: inline.new_stored_bytes,
            index_lookups: inline.index_lookups,
            segments_new: inline.segments_new,
            index_seconds: inline.index_seconds,
            write_seconds: inline.write_seconds,
            seal_seconds: inline.seal_seconds,
            compress_seconds: inline.compress_seconds,
            fingerprint_seconds: inline.fingerprint_seconds,
            run: 0,
            timing,
        })
    }

    /// Runs the reverse deduplications `series` is waiting for, one measure each.
    pub fn reverse_pending(&mut self, series: &str) -> Result<Vec<ReverseMeasure>> {
        let label = self.config.label.clone();
        let store = self.store()?;
        let versions = store.pending_reverse(series).map_err(|error| {
            LabError::engine(format!("listing pending reverses of {label}"), error)
        })?;
        let mut measures = Vec::new();
        for version in versions {
            let (report, timing) = timed(|| {
                store.reverse(series, version).map_err(|error| {
                    LabError::engine(format!("reverse of {series}@{version} in {label}"), error)
                })
            })?;
            measures.push(ReverseMeasure {
                store: label.clone(),
                series: series.to_string(),
                version,
                run: 0,
                logical_bytes: report.plan.logical_bytes,
                read_bytes: report.copy.read_bytes,
                written_bytes: report.copy.written_bytes,
                chunks_removed: report.plan.settlement.chunks_removed,
                timing,
            });
        }
        Ok(measures)
    }

    /// Restores `series@version` into a hashing sink after dropping the page cache, and
    /// compares the hash with `expected` when given.
    pub fn restore_hashed(
        &mut self,
        series: &str,
        version: u32,
        expected: Option<[u8; 32]>,
    ) -> Result<RestoreMeasure> {
        let sink = Arc::new(shared_sink::Sink::new(shared_sink::Check::Hash(Box::new(
            blake3::Hasher::new(),
        ))));
        let mut measure = self.restore_stream(series, version, &sink)?;
        let (hash, bytes) = sink.hash();
        if let Some(expected) = expected {
            if expected != hash || bytes != measure.logical_bytes {
                return Err(self.differs(series, version));
            }
            measure.verified = true;
        }
        Ok(measure)
    }

    /// Restores `series@version` after dropping the page cache into a sink that compares the
    /// stream with `expected` as it arrives (a memory comparison, far cheaper than hashing,
    /// so the restore is timed nearly alone).
    pub fn restore_compared(
        &mut self,
        series: &str,
        version: u32,
        expected: Arc<Vec<u8>>,
    ) -> Result<RestoreMeasure> {
        let length = expected.len() as u64;
        let sink = Arc::new(shared_sink::Sink::new(shared_sink::Check::Compare {
            expected,
            position: 0,
            equal: true,
        }));
        let mut measure = self.restore_stream(series, version, &sink)?;
        if !sink.equal() || measure.logical_bytes != length {
            return Err(self.differs(series, version));
        }
        measure.verified = true;
        Ok(measure)
    }

    fn differs(&self, series: &str, version: u32) -> LabError {
        LabError::Engine {
            context: format!("restoring {series}@{version} from {}", self.config.label),
            detail: "the restored stream differs from the backed-up one".into(),
        }
    }

    /// Restores `series@version` into `sink`, timed, after dropping the page cache.
    fn restore_stream(
        &mut self,
        series: &str,
        version: u32,
        sink: &Arc<shared_sink::Sink>,
    ) -> Result<RestoreMeasure> {
        let label = self.config.label.clone();
        let prefetch = self.prefetch;
        let store = self.store()?;
        let cold_cache = drop_page_cache();
        let writer = shared_sink::SharedWriter(Arc::clone(sink));
        let (report, timing) = timed(|| {
            store
                .restore(
                    series,
                    Some(version),
                    RestoreTarget::Writer(Box::new(writer)),
                )
                .map_err(|error| {
                    LabError::engine(format!("restoring {series}@{version} from {label}"), error)
                })
        })?;
        Ok(RestoreMeasure {
            store: label,
            series: series.to_string(),
            version,
            run: 0,
            prefetch,
            cold_cache,
            logical_bytes: report.logical_bytes,
            read_bytes: report.read_bytes,
            reads: report.reads,
            containers_read: report.containers_read,
            sink_seconds: sink.seconds(),
            chain_length_max: report.resolve.chain_length_max,
            verified: false,
            timing,
        })
    }

    /// Restores the directory backup `series@version` into `target` (created) after dropping
    /// the page cache, and compares the restored tree with `expected` when given.
    pub fn restore_directory(
        &mut self,
        series: &str,
        version: u32,
        target: &Path,
        expected: Option<&Path>,
    ) -> Result<RestoreMeasure> {
        let label = self.config.label.clone();
        let prefetch = self.prefetch;
        let store = self.store()?;
        let cold_cache = drop_page_cache();
        let (report, timing) = timed(|| {
            store
                .restore(
                    series,
                    Some(version),
                    RestoreTarget::Directory(target.to_path_buf()),
                )
                .map_err(|error| {
                    LabError::engine(format!("restoring {series}@{version} from {label}"), error)
                })
        })?;
        let verified = match expected {
            Some(expected) => match compare_trees(expected, target)? {
                None => true,
                Some(difference) => {
                    return Err(LabError::Engine {
                        context: format!("restoring {series}@{version} from {label}"),
                        detail: format!("the restored tree differs: {difference}"),
                    })
                }
            },
            None => false,
        };
        Ok(RestoreMeasure {
            store: label,
            series: series.to_string(),
            version,
            run: 0,
            prefetch,
            cold_cache,
            logical_bytes: report.logical_bytes,
            read_bytes: report.read_bytes,
            reads: report.reads,
            containers_read: report.containers_read,
            sink_seconds: 0.0,
            chain_length_max: report.resolve.chain_length_max,
            verified,
            timing,
        })
    }

    /// Space used now.
    pub fn space(&mut self) -> Result<SpaceMeasure> {
        let label = self.config.label.clone();
        let stats = self
            .store()?
            .stats()
            .map_err(|error| LabError::engine(format!("statistics of {label}"), error))?;
        Ok(SpaceMeasure {
            container_bytes: stats.container_bytes_shared + stats.container_bytes_archival,
            referenced_bytes: stats.referenced_bytes,
            repository_bytes: repository_bytes(&self.directory)?,
        })
    }

    /// Deletes `series@version` with `method`, timing the metadata step (plan, commit,
    /// cleanup: the paper's *mark*) apart from the container scan (*sweep*).
    pub fn delete(
        &mut self,
        series: &str,
        version: u32,
        method: DeleteMethod,
    ) -> Result<DeleteMeasure> {
        let label = self.config.label.clone();
        let store = self.store()?;
        let cold_cache = drop_page_cache();
        let (report, timing) = timed(|| {
            store
                .delete(series, version, Some(method))
                .map_err(|error| {
                    LabError::engine(format!("deleting {series}@{version} from {label}"), error)
                })
        })?;
        let sweep_seconds = report.sweep.map_or(0.0, |sweep| sweep.seconds);
        Ok(DeleteMeasure {
            store: label,
            series: series.to_string(),
            version,
            run: 0,
            method,
            cold_cache,
            metadata_seconds: (timing.seconds - sweep_seconds).max(0.0),
            sweep_seconds,
            containers_removed: report.plan.settlement.dropped_containers.len() as u64
                + report.sweep.map_or(0, |sweep| sweep.containers_removed),
            scanned_bytes: report.sweep.map_or(0, |sweep| sweep.scanned_bytes),
            timing,
        })
    }

    /// Deletes the `count` oldest backups of `series` at once (Fig. 10b), after dropping the
    /// page cache. By time stamps that is the metadata step of each deletion, oldest first;
    /// by mark and sweep the same steps (the mark) and then one sweep of every container,
    /// as the paper's batch deletion scans the containers once.
    pub fn delete_oldest(
        &mut self,
        series: &str,
        count: u32,
        method: DeleteMethod,
    ) -> Result<BatchDeleteMeasure> {
        let label = self.config.label.clone();
        let store = self.store()?;
        let versions: Vec<u32> = store
            .plan_expire_with(series, &onecopy_backup::RetentionPolicy::last(1))
            .map_err(|error| LabError::engine(format!("listing backups of {label}"), error))?
            .versions
            .into_iter()
            .take(count as usize)
            .collect();
        if versions.len() != count as usize {
            return Err(LabError::InvalidOption(format!(
                "{label} has {} backups of {series} besides the newest; cannot delete {count}",
                versions.len()
            )));
        }
        let cold_cache = drop_page_cache();
        let mut containers_removed = 0;
        let (sweep, timing) = timed(|| {
            for &version in &versions {
                let report = store
                    .delete(series, version, Some(DeleteMethod::Timestamp))
                    .map_err(|error| {
                        LabError::engine(format!("deleting {series}@{version} from {label}"), error)
                    })?;
                containers_removed += report.plan.settlement.dropped_containers.len() as u64;
            }
            match method {
                DeleteMethod::Timestamp => Ok(None),
                DeleteMethod::MarkAndSweep => store
                    .sweep()
                    .map(Some)
                    .map_err(|error| LabError::engine(format!("sweeping {label}"), error)),
            }
        })?;
        let sweep_seconds = sweep.map_or(0.0, |sweep| sweep.seconds);
        Ok(BatchDeleteMeasure {
            store: label,
            run: 0,
            deleted: count,
            method,
            cold_cache,
            metadata_seconds: (timing.seconds - sweep_seconds).max(0.0),
            sweep_seconds,
            containers_removed: containers_removed
                + sweep.map_or(0, |sweep| sweep.containers_removed),
            scanned_bytes: sweep.map_or(0, |sweep| sweep.scanned_bytes),
            timing,
        })
    }

    /// Copies the (closed) store into `target` and opens the copy.
    pub fn copy_to(&mut self, target: &Path) -> Result<StoreUnderTest> {
        self.close();
        copy_tree(&self.directory, target)?;
        let mut copy = StoreUnderTest {
            config: self.config.clone(),
            directory: target.to_path_buf(),
            store: None,
            prefetch: self.prefetch,
            read_threads: self.read_threads,
        };
        copy.open(self.prefetch)?;
        Ok(copy)
    }

    /// Closes and removes the store.
    pub fn destroy(mut self) -> Result<()> {
        self.close();
        Ok(fs::remove_dir_all(&self.directory)
            .context_io(|| format!("removing {}", self.directory.display()))?)
    }
}

/// One deletion.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeleteMeasure {
    pub store: String,
    pub series: String,
    pub version: u32,
    #[serde(default)]
    pub run: u32,
    pub method: DeleteMethod,
    pub cold_cache: bool,
    /// Reference updates, settlement and container removal (the paper's mark phase).
    pub metadata_seconds: f64,
    /// Reading and rewriting containers (mark and sweep only).
    pub sweep_seconds: f64,
    pub containers_removed: u64,
    pub scanned_bytes: u64,
    pub timing: Timing,
}

/// Deleting the oldest backups of a series at once (Fig. 10b).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BatchDeleteMeasure {
    pub store: String,
    pub run: u32,
    /// Backups deleted (the oldest ones).
    pub deleted: u32,
    pub method: DeleteMethod,
    pub cold_cache: bool,
    /// The metadata steps of every deletion (the paper's mark phase).
    pub metadata_seconds: f64,
    /// The one scan of every container (mark and sweep only).
    pub sweep_seconds: f64,
    pub containers_removed: u64,
    pub scanned_bytes: u64,
    pub timing: Timing,
}

/// The sink of a stream restore: the restore's writer thread owns a [`SharedWriter`] while
/// the caller keeps the [`Sink`] to read the result and the time spent in it afterwards.
mod shared_sink {
    use std::io::Write;
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    /// What the sink does with the stream.
    pub enum Check {
        Hash(Box<blake3::Hasher>),
        Compare {
            expected: Arc<Vec<u8>>,
            position: usize,
            equal: bool,
        },
    }

    struct State {
        check: Check,
        bytes: u64,
        seconds: f64,
    }

    pub struct Sink(Mutex<State>);

    impl Sink {
        pub fn new(check: Check) -> Sink {
            Sink(Mutex::new(State {
                check,
                bytes: 0,
                seconds: 0.0,
            }))
        }

        fn state(&self) -> std::sync::MutexGuard<'_, State> {
            self.0.lock().expect("the writer thread does not panic")
        }

        /// The hash of the stream and its length (a hashing sink).
        pub fn hash(&self) -> ([u8; 32], u64) {
            let state = self.state();
            match &state.check {
                Check::Hash(hasher) => (*hasher.finalize().as_bytes(), state.bytes),
                Check::Compare { .. } => panic!("a comparing sink has no hash"),
            }
        }

        /// Whether every byte matched so far (a comparing sink).
        pub fn equal(&self) -> bool {
            match &self.state().check {
                Check::Compare { equal, .. } => *equal,
                Check::Hash(_) => panic!("a hashing sink compares nothing"),
            }
        }

        /// Seconds spent in the sink's writes.
        pub fn seconds(&self) -> f64 {
            self.state().seconds
        }
    }

    pub struct SharedWriter(pub Arc<Sink>);

    impl Write for SharedWriter {
        fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
            let started = Instant::now();
            let mut state = self.0.state();
            match &mut state.check {
                Check::Hash(hasher) => {
                    hasher.update(data);
                }
                Check::Compare {
                    expected,
                    position,
                    equal,
                } => {
                    let end = *position + data.len();
                    *equal &= expected.get(*position..end) == Some(data);
                    *position = end;
                }
            }
            state.bytes += data.len() as u64;
            state.seconds += started.elapsed().as_secs_f64();
            Ok(data.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a store under test backs up, reverse-deduplicates, restores byte-exact and
    /// deletes by either method; method: three versions of a small stream with shared parts.
    #[test]
    fn store_round_trip_and_deletion() {
        let directory = tempfile::tempdir().expect("temporary directory");
        let mut store = StoreUnderTest::create(
            StoreConfig::revdedup(1 << 20, 4 << 20, 1),
            &directory.path().join("store"),
            2,
        )
        .expect("create");
        let mut hashes = Vec::new();
        let mut data = vec![0u8; 3 << 20];
        let mut rng = super::super::synthetic::SplitMix64::new(3);
        rng.fill(&mut data);
        for version in 0..3usize {
            let start = version * 100_000;
            rng.fill(&mut data[start..start + 5000]);
            let path = directory.path().join(format!("v{version}"));
            fs::write(&path, &data).expect("write");
            hashes.push(super::super::synthetic::hash_file(&path).expect("hash"));
            let measure = store.backup("s", BackupSource::File(path)).expect("backup");
            assert_eq!(measure.logical_bytes, data.len() as u64);
            store.reverse_pending("s").expect("reverse");
        }
        for (index, hash) in hashes.iter().enumerate() {
            let measure = store
                .restore_hashed("s", index as u32 + 1, Some(*hash))
                .expect("restore");
            assert!(measure.verified);
        }
        let before = store.space().expect("space");
        assert!(before.container_bytes < 2 * data.len() as u64);
        let mut copy = store.copy_to(&directory.path().join("copy")).expect("copy");
        let timestamp = store
            .delete("s", 1, DeleteMethod::Timestamp)
            .expect("delete");
        assert_eq!(timestamp.sweep_seconds, 0.0);
        let sweep = copy
            .delete("s", 1, DeleteMethod::MarkAndSweep)
            .expect("delete");
        assert!(sweep.scanned_bytes > 0);
        copy.restore_hashed("s", 3, Some(hashes[2]))
            .expect("restore after delete");
        store
            .restore_hashed("s", 2, Some(hashes[1]))
            .expect("restore after delete");
    }

    /// Goal: a batch deletion removes exactly the n oldest backups, by time stamps without
    /// reading a container and by mark and sweep with one scan of every container, and the
    /// newest still restores byte-exact into the comparing sink (which also catches a wrong
    /// stream). Method: five versions of a stream with changed parts, two copies, n = 3.
    #[test]
    fn batch_deletion_removes_the_oldest() {
        let directory = tempfile::tempdir().expect("temporary directory");
        let mut store = StoreUnderTest::create(
            StoreConfig::revdedup(1 << 20, 4 << 20, 1),
            &directory.path().join("store"),
            2,
        )
        .expect("create");
        let mut data = vec![0u8; 3 << 20];
        let mut rng = super::super::synthetic::SplitMix64::new(5);
        rng.fill(&mut data);
        for version in 0..5usize {
            let start = version * 300_000;
            rng.fill(&mut data[start..start + 70_000]);
            let path = directory.path().join(format!("v{version}"));
            fs::write(&path, &data).expect("write");
            store.backup("s", BackupSource::File(path)).expect("backup");
            store.reverse_pending("s").expect("reverse");
        }
        let newest = Arc::new(data.clone());
        let mut sweep_copy = store.copy_to(&directory.path().join("copy")).expect("copy");
        let stamps = store
            .delete_oldest("s", 3, DeleteMethod::Timestamp)
            .expect("batch by time stamps");
        assert_eq!(stamps.deleted, 3);
        assert_eq!((stamps.sweep_seconds, stamps.scanned_bytes), (0.0, 0));
        let swept = sweep_copy
            .delete_oldest("s", 3, DeleteMethod::MarkAndSweep)
            .expect("batch by mark and sweep");
        assert!(swept.scanned_bytes > 0 && swept.sweep_seconds > 0.0);
        for copy in [&mut store, &mut sweep_copy] {
            let listed = copy
                .store()
                .expect("open")
                .plan_expire_with("s", &onecopy_backup::RetentionPolicy::last(1))
                .expect("list")
                .versions;
            assert_eq!(listed, vec![4], "versions 1-3 are gone, 4 and 5 remain");
            let measure = copy
                .restore_compared("s", 5, Arc::clone(&newest))
                .expect("the newest restores");
            assert!(measure.verified && measure.sink_seconds > 0.0);
            let mut wrong = data.clone();
            wrong[1] ^= 1;
            assert!(copy.restore_compared("s", 5, Arc::new(wrong)).is_err());
        }
        assert!(store
            .delete_oldest("s", 2, DeleteMethod::Timestamp)
            .is_err());
    }
}
