//! Figs. 16 and 17: how much a deduplication run slows the work in the foreground.
//!
//! A file system of the face holds two copies of the high-dedup workload: one already
//! deduplicated (the *served* set), one written just before the run and still plain (the
//! *pending* set). Foreground work runs for the whole timeline — before, during and after
//! a deduplication run of the pending set at full speed (`onecopy fs dedup`, the worst case:
//! a run started by idleness stops at the first foreground request):
//!
//! - **file serving** (Fig. 16, the paper's Filebench webserver): threads that each open a
//!   random file of the served set, read it whole and close it, again and again; its
//!   throughput and per-file latency per interval;
//! - **computing** (Fig. 17, the paper's Netperf: no disk I/O): one thread hashing a buffer
//!   in memory; its rate per interval.
//!
//! Both run at the same time; each interval reports both. The deduplication run's start and
//! end are marked on the timeline.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::bed::MountedFs;
use super::mixes::{self, BIG_CHUNK_BYTES, SMALL_CHUNK_BYTES};
use super::synthetic::{self, Random};
use crate::error::{LabError, Result};
use onecopy_fs::FsOptions;

/// Width of one interval of the timeline.
pub const INTERVAL: Duration = Duration::from_millis(100);
/// Foreground threads serving files.
const SERVING_THREADS: usize = 2;
/// Bytes hashed per step of the computing thread.
const COMPUTE_BYTES: usize = 256 << 10;

/// One interval of the timeline.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Interval {
    /// Start of the interval, seconds since the timeline began.
    pub start_seconds: f64,
    pub files_served: u64,
    pub serving_mb_per_second: f64,
    /// Mean response time of the files served in the interval.
    pub serving_latency_ms: f64,
    pub computing_mb_per_second: f64,
}

/// The timeline and its summary.
#[derive(Clone, Debug, Serialize)]
pub struct InterferenceResult {
    pub served_bytes: u64,
    pub pending_bytes: u64,
    pub dedup_start_seconds: f64,
    pub dedup_end_seconds: f64,
    /// Files the run deduplicated and bytes it read.
    pub dedup_files: u64,
    pub dedup_bytes_read: u64,
    pub intervals: Vec<Interval>,
    /// Means over the intervals wholly outside and wholly inside the run.
    pub serving_mb_per_second_idle: f64,
    pub serving_mb_per_second_during: f64,
    pub serving_latency_ms_idle: f64,
    pub serving_latency_ms_during: f64,
    pub computing_mb_per_second_idle: f64,
    pub computing_mb_per_second_during: f64,
}

/// An event of the foreground: when it ended (since the start), bytes, and its latency.
#[derive(Clone, Copy)]
struct Served {
    at: f64,
    bytes: u64,
    latency_ms: f64,
}

/// Runs the timeline: `quiet` seconds of foreground alone, the deduplication run, `quiet`
/// seconds more.
pub fn run(
    work: &Path,
    total_bytes: u64,
    file_bytes_max: u64,
    quiet: Duration,
) -> Result<InterferenceResult> {
    let files = synthetic::generate(&synthetic::HIGH, total_bytes, file_bytes_max);
    let options = FsOptions {
        min_evaluation_interval_seconds: 0,
        min_evaluation_count: 0,
        idle_seconds: 0,
        big_chunk_bytes: BIG_CHUNK_BYTES,
        small_chunk_bytes: SMALL_CHUNK_BYTES,
        ..FsOptions::default()
    };
    let bed = MountedFs::create(work, options)?;
    let served_root = bed.mount_point().join("served");
    let pending_root = bed.mount_point().join("pending");
    mixes::write_files(&served_root, &files)?;
    mixes::deduplicate(&bed)?;
    // The pending copy differs from the served one in its first block of every file, so
    // that it is new data to rank and cut, mostly duplicates of the served set.
    let pending: Vec<Vec<u8>> = files
        .iter()
        .enumerate()
        .map(|(index, data)| {
            let mut copy = data.clone();
            copy[..8].copy_from_slice(&(index as u64 ^ 0xFEED).to_le_bytes());
            copy
        })
        .collect();
    mixes::write_files(&pending_root, &pending)?;

    let stop = Arc::new(AtomicBool::new(false));
    let served: Arc<Mutex<Vec<Served>>> = Arc::default();
    let computed: Arc<Mutex<Vec<f64>>> = Arc::default();
    let started = Instant::now();
    let mut threads = Vec::new();
    for thread in 0..SERVING_THREADS {
        let stop = Arc::clone(&stop);
        let served = Arc::clone(&served);
        let root = served_root.clone();
        let sizes: Vec<u64> = files.iter().map(|file| file.len() as u64).collect();
        threads.push(std::thread::spawn(move || -> Result<()> {
            let mut random = Random::new(0x5E4E ^ thread as u64);
            let mut buffer = vec![0u8; 1 << 20];
            while !stop.load(Ordering::Relaxed) {
                let index = random.below(sizes.len() as u64) as usize;
                let path = mixes::file_path(&root, index);
                let begun = Instant::now();
                let mut file = std::fs::File::open(&path).map_err(|source| {
                    LabError::io(format!("opening {}", path.display()), source)
                })?;
                let mut bytes = 0u64;
                loop {
                    use std::io::Read;
                    let read = file.read(&mut buffer).map_err(|source| {
                        LabError::io(format!("reading {}", path.display()), source)
                    })?;
                    if read == 0 {
                        break;
                    }
                    bytes += read as u64;
                }
                assert_eq!(bytes, sizes[index], "a whole file is read");
                served.lock().expect("not poisoned").push(Served {
                    at: started.elapsed().as_secs_f64(),
                    bytes,
                    latency_ms: begun.elapsed().as_secs_f64() * 1e3,
                });
            }
            Ok(())
        }));
    }
    {
        let stop = Arc::clone(&stop);
        let computed = Arc::clone(&computed);
        threads.push(std::thread::spawn(move || -> Result<()> {
            let buffer = vec![7u8; COMPUTE_BYTES];
            while !stop.load(Ordering::Relaxed) {
                std::hint::black_box(blake3::hash(&buffer));
                computed
                    .lock()
                    .expect("not poisoned")
                    .push(started.elapsed().as_secs_f64());
            }
            Ok(())
        }));
    }
    std::thread::sleep(quiet);
    let dedup_start_seconds = started.elapsed().as_secs_f64();
    let deduplicated = mixes::deduplicate_with_report(&bed);
    let dedup_end_seconds = started.elapsed().as_secs_f64();
    if deduplicated.is_ok() {
        std::thread::sleep(quiet);
    }
    stop.store(true, Ordering::Relaxed);
    let end_seconds = started.elapsed().as_secs_f64();
    for thread in threads {
        thread.join().expect("a foreground thread panicked")?;
    }
    let report = deduplicated?;
    bed.teardown()?;

    let served = served.lock().expect("not poisoned").clone();
    let computed = computed.lock().expect("not poisoned").clone();
    let width = INTERVAL.as_secs_f64();
    let count = (end_seconds / width).floor() as usize;
    let mut intervals: Vec<Interval> = (0..count)
        .map(|index| Interval {
            start_seconds: index as f64 * width,
            ..Interval::default()
        })
        .collect();
    let mut latency_sums = vec![0.0; count];
    for event in &served {
        let index = (event.at / width) as usize;
        if index < count {
            intervals[index].files_served += 1;
            intervals[index].serving_mb_per_second += event.bytes as f64 / 1e6 / width;
            latency_sums[index] += event.latency_ms;
        }
    }
    for at in &computed {
        let index = (at / width) as usize;
        if index < count {
            intervals[index].computing_mb_per_second += COMPUTE_BYTES as f64 / 1e6 / width;
        }
    }
    for (interval, sum) in intervals.iter_mut().zip(latency_sums) {
        if interval.files_served > 0 {
            interval.serving_latency_ms = sum / interval.files_served as f64;
        }
    }
    let inside = |interval: &Interval| {
        interval.start_seconds >= dedup_start_seconds
            && interval.start_seconds + width <= dedup_end_seconds
    };
    let outside = |interval: &Interval| {
        interval.start_seconds + width <= dedup_start_seconds
            || interval.start_seconds >= dedup_end_seconds
    };
    let mean = |keep: &dyn Fn(&Interval) -> bool, value: &dyn Fn(&Interval) -> f64| {
        let values: Vec<f64> = intervals.iter().filter(|i| keep(i)).map(value).collect();
        if values.is_empty() {
            0.0
        } else {
            values.iter().sum::<f64>() / values.len() as f64
        }
    };
    Ok(InterferenceResult {
        served_bytes: files.iter().map(|file| file.len() as u64).sum(),
        pending_bytes: pending.iter().map(|file| file.len() as u64).sum(),
        dedup_start_seconds,
        dedup_end_seconds,
        dedup_files: report.files_deduplicated,
        dedup_bytes_read: report.bytes_read,
        serving_mb_per_second_idle: mean(&outside, &|i| i.serving_mb_per_second),
        serving_mb_per_second_during: mean(&inside, &|i| i.serving_mb_per_second),
        serving_latency_ms_idle: mean(&outside, &|i| i.serving_latency_ms),
        serving_latency_ms_during: mean(&inside, &|i| i.serving_latency_ms),
        computing_mb_per_second_idle: mean(&outside, &|i| i.computing_mb_per_second),
        computing_mb_per_second_during: mean(&inside, &|i| i.computing_mb_per_second),
        intervals,
    })
}

/// The idle-started run: foreground bursts separated by pauses longer than the file
/// system's idle time, so that the mount's own deduplicator runs in the pauses and must
/// stop at the first request of each burst.
#[derive(Clone, Debug, Serialize)]
pub struct IdleResult {
    pub pending_bytes: u64,
    pub idle_seconds: u64,
    pub dedup_share_percent: u64,
    pub burst_seconds: f64,
    pub pause_seconds: f64,
    /// Bytes still plain, sampled every [`INTERVAL`]: (seconds, bytes).
    pub pending_over_time: Vec<(f64, u64)>,
    /// Files served per interval (MB/s): (seconds, MB/s).
    pub serving_over_time: Vec<(f64, f64)>,
    /// Response time of the first file of each burst after a pause in which the
    /// deduplicator was at work (pending bytes fell and some were left), in milliseconds.
    pub first_file_after_dedup_ms: Vec<f64>,
    /// Median response time of the other files.
    pub other_files_median_ms: f64,
    /// Seconds until nothing was pending (or the end of the timeline).
    pub seconds_to_done: f64,
}

/// Runs bursts of file serving for `burst` with pauses of `pause` until the pending set is
/// deduplicated or `bursts_max` bursts ran.
pub fn run_idle(
    work: &Path,
    total_bytes: u64,
    file_bytes_max: u64,
    burst: Duration,
    pause: Duration,
    bursts_max: usize,
) -> Result<IdleResult> {
    let files = synthetic::generate(&synthetic::HIGH, total_bytes, file_bytes_max);
    let idle_seconds = 1;
    let options = FsOptions {
        min_evaluation_interval_seconds: 0,
        min_evaluation_count: 0,
        idle_seconds: 0,
        big_chunk_bytes: BIG_CHUNK_BYTES,
        small_chunk_bytes: SMALL_CHUNK_BYTES,
        ..FsOptions::default()
    };
    // A small share stretches the runs over several pauses, so that bursts interrupt them.
    let dedup_share_percent = 5;
    let bed = MountedFs::create_serving(work, options)?;
    let served_root = bed.mount_point().join("served");
    let pending_root = bed.mount_point().join("pending");
    mixes::write_files(&served_root, &files)?;
    mixes::deduplicate(&bed)?;
    let pending: Vec<Vec<u8>> = files
        .iter()
        .enumerate()
        .map(|(index, data)| {
            let mut copy = data.clone();
            copy[..8].copy_from_slice(&(index as u64 ^ 0xFEED).to_le_bytes());
            copy
        })
        .collect();
    mixes::write_files(&pending_root, &pending)?;
    let pending_bytes = |bed: &MountedFs| -> Result<u64> {
        bed.engine()
            .stats(bed.fs())
            .map(|stats| stats.pending_bytes)
            .map_err(|error| LabError::engine("reading file system statistics", error))
    };
    let pending_at_start = pending_bytes(&bed)?;
    bed.engine()
        .configure(
            bed.fs(),
            &onecopy_fs::OptionChanges {
                idle_seconds: Some(idle_seconds),
                dedup_share_percent: Some(dedup_share_percent),
                ..Default::default()
            },
        )
        .map_err(|error| LabError::engine("turning the idle deduplicator on", error))?;

    let started = Instant::now();
    let mut random = Random::new(0x1D1E);
    let mut buffer = vec![0u8; 1 << 20];
    let mut served: Vec<Served> = Vec::new();
    let mut pending_over_time = vec![(0.0, pending_at_start)];
    let mut first_file_after_dedup_ms = Vec::new();
    let mut first_of_burst = Vec::new();
    let mut seconds_to_done = None;
    for _ in 0..bursts_max {
        let pending_before_pause = pending_bytes(&bed)?;
        let pause_end = Instant::now() + pause;
        while Instant::now() < pause_end {
            std::thread::sleep(INTERVAL.min(pause_end - Instant::now()));
            pending_over_time.push((started.elapsed().as_secs_f64(), pending_bytes(&bed)?));
        }
        let pending_after_pause = pending_bytes(&bed)?;
        if pending_after_pause == 0 && seconds_to_done.is_none() {
            seconds_to_done = pending_over_time
                .iter()
                .find(|(_, bytes)| *bytes == 0)
                .map(|(at, _)| *at);
        }
        let deduplicating = pending_after_pause < pending_before_pause && pending_after_pause > 0;
        let burst_end = Instant::now() + burst;
        let mut first = true;
        while Instant::now() < burst_end {
            let index = random.below(files.len() as u64) as usize;
            let path = mixes::file_path(&served_root, index);
            let begun = Instant::now();
            let mut file = std::fs::File::open(&path)
                .map_err(|source| LabError::io(format!("opening {}", path.display()), source))?;
            let mut bytes = 0u64;
            loop {
                use std::io::Read;
                let read = file.read(&mut buffer).map_err(|source| {
                    LabError::io(format!("reading {}", path.display()), source)
                })?;
                if read == 0 {
                    break;
                }
                bytes += read as u64;
            }
            let latency_ms = begun.elapsed().as_secs_f64() * 1e3;
            if first && deduplicating {
                first_file_after_dedup_ms.push(latency_ms);
            }
            if first {
                first_of_burst.push(served.len());
            }
            first = false;
            served.push(Served {
                at: started.elapsed().as_secs_f64(),
                bytes,
                latency_ms,
            });
        }
        pending_over_time.push((started.elapsed().as_secs_f64(), pending_bytes(&bed)?));
        if pending_after_pause == 0 {
            break;
        }
    }
    let end_seconds = started.elapsed().as_secs_f64();
    bed.teardown()?;

    let width = INTERVAL.as_secs_f64();
    let count = (end_seconds / width).ceil() as usize;
    let mut serving_over_time: Vec<(f64, f64)> = (0..count)
        .map(|index| (index as f64 * width, 0.0))
        .collect();
    for event in &served {
        let index = ((event.at / width) as usize).min(count.saturating_sub(1));
        serving_over_time[index].1 += event.bytes as f64 / 1e6 / width;
    }
    let mut others: Vec<f64> = served
        .iter()
        .enumerate()
        .filter(|(index, _)| !first_of_burst.contains(index))
        .map(|(_, event)| event.latency_ms)
        .collect();
    others.sort_by(f64::total_cmp);
    Ok(IdleResult {
        pending_bytes: pending_at_start,
        idle_seconds,
        dedup_share_percent,
        burst_seconds: burst.as_secs_f64(),
        pause_seconds: pause.as_secs_f64(),
        pending_over_time,
        serving_over_time,
        first_file_after_dedup_ms,
        other_files_median_ms: others.get(others.len() / 2).copied().unwrap_or(0.0),
        seconds_to_done: seconds_to_done.unwrap_or(end_seconds),
    })
}
