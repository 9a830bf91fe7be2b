//! Paper 3's experiments end to end on tiny data: file systems of the face mounted through
//! FUSE, read cold, deduplicated, measured. Needs root, /dev/fuse and fusermount3 (fuse3),
//! tar, grep and cp; without them the tests fail saying what is missing.

use std::path::Path;
use std::time::Duration;

use onecopy_lab::paper3::{interference, mixes, programs, releases, synthetic};

fn require_fuse() {
    assert!(
        Path::new("/dev/fuse").exists(),
        "/dev/fuse is missing: load the fuse module (modprobe fuse)"
    );
    assert!(
        onecopy_lab::mount::require_program("fusermount3").is_ok(),
        "fusermount3 is not installed: run scripts/setup.sh (fuse3)"
    );
}

/// Goal: the four systems of Figs. 9 to 11 give what they stand for: none saves nothing,
/// all-small saves the ideal 4 KiB savings and all-big the 256 KiB ones, selective lies
/// between them and ranks more files 1 when more are read sequentially; every file gets a
/// response time. Method: the high workload at 4 MiB under every system and mix.
#[test]
fn four_systems_on_a_tiny_workload() {
    require_fuse();
    let work = tempfile::tempdir().unwrap();
    let result = mixes::run_workload(
        work.path(),
        &synthetic::HIGH,
        4 << 20,
        512 << 10,
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(result.runs.len(), mixes::SYSTEMS.len() * mixes::MIXES.len());
    for run in &result.runs {
        assert_eq!(run.file_latencies_ms.len() as u64, result.files);
        assert!(run.file_latencies_ms.iter().all(|latency| *latency > 0.0));
        assert_eq!(run.logical_bytes, result.bytes);
    }
    let savings = |system: &str, percent| result.run(system, percent).unwrap().savings;
    assert_eq!(savings("none", 90), 0.0);
    assert!((savings("all-small", 90) - result.ideal_small_savings).abs() < 1e-9);
    assert!((savings("all-big", 90) - result.ideal_big_savings).abs() < 1e-9);
    assert!(savings("all-small", 10) > savings("all-big", 10));
    for percent in mixes::MIXES {
        assert!(savings("selective", percent) <= savings("all-small", percent) + 1e-9);
    }
    let rank_1 = |percent| result.run("selective", percent).unwrap().rank_files[1];
    assert!(
        rank_1(90) > rank_1(10),
        "90%: {} files rank 1, 10%: {}",
        rank_1(90),
        rank_1(10)
    );
}

/// Goal: Table 6's timeline ranks the old releases cold (3), the newest release's used
/// files 1 and 2 and its edited files 0. Method: three releases of 512 KiB of /usr/include.
#[test]
fn releases_rank_old_cold_and_newest_by_use() {
    require_fuse();
    let work = tempfile::tempdir().unwrap();
    let result = releases::run(work.path(), None, 3, 512 << 10, &mut |_| {}).unwrap();
    let selective = result
        .runs
        .iter()
        .find(|run| run.system == "selective")
        .unwrap();
    let [rank_0, rank_1, rank_2, rank_3] = selective.rank_shares;
    assert!(rank_3 > 0.5, "{:?}", selective.rank_shares);
    assert!(
        rank_0 > 0.0 && rank_1 > 0.0 && rank_2 > 0.0,
        "{:?}",
        selective.rank_shares
    );
    let none = result.runs.iter().find(|run| run.system == "none").unwrap();
    assert_eq!(none.savings, 0.0);
    assert!(
        selective.savings > 0.3,
        "three near copies: {}",
        selective.savings
    );
}

/// Goal: Fig. 15's programs run on both mounts and every measurement is positive.
/// Method: one round on 1 MiB of /usr/include.
#[test]
fn programs_run_with_and_without_the_monitor() {
    require_fuse();
    let work = tempfile::tempdir().unwrap();
    let result = programs::run(work.path(), 1 << 20, 1).unwrap();
    assert_eq!(result.programs.len(), programs::PROGRAMS.len());
    assert!(result.files > 0);
    for program in &result.programs {
        assert!(program.monitored_seconds > 0.0, "{program:?}");
        assert!(program.unmonitored_seconds > 0.0, "{program:?}");
    }
}

/// Goal: Figs. 16 and 17's timeline covers the deduplication run, which deduplicates the
/// whole pending set, with foreground work before it. Method: 4 MiB served and pending,
/// half a second of foreground alone on each side.
#[test]
fn interference_timeline_covers_the_run() {
    require_fuse();
    let work = tempfile::tempdir().unwrap();
    let result =
        interference::run(work.path(), 4 << 20, 512 << 10, Duration::from_millis(500)).unwrap();
    assert!(result.dedup_start_seconds >= 0.5);
    assert!(result.dedup_end_seconds >= result.dedup_start_seconds);
    assert_eq!(result.dedup_bytes_read, result.pending_bytes);
    assert!(!result.intervals.is_empty());
    assert!(result.serving_mb_per_second_idle > 0.0);
    assert!(result.computing_mb_per_second_idle > 0.0);
}

/// Goal: the mount's own deduplicator runs in the pauses of the foreground and finishes the
/// pending set, which the statistics then show as done. Method: 4 MiB pending, bursts of a
/// quarter second, pauses of two seconds (one more than the idle time).
#[test]
fn idle_deduplicator_works_in_the_pauses() {
    require_fuse();
    let work = tempfile::tempdir().unwrap();
    let result = interference::run_idle(
        work.path(),
        4 << 20,
        512 << 10,
        Duration::from_millis(250),
        Duration::from_secs(2),
        6,
    )
    .unwrap();
    assert!(result.pending_bytes > 0);
    assert_eq!(
        result.pending_over_time.last().map(|(_, bytes)| *bytes),
        Some(0),
        "{:?}",
        result.pending_over_time
    );
    assert!(result.serving_over_time.iter().any(|(_, rate)| *rate > 0.0));
}
