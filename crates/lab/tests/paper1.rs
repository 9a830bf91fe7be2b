//! Paper 1's experiment end to end at a tiny scale, through the real testbed (engine, NBD
//! server, nbdfuse, loop device, kernel ext3/ext4). Needs root, /dev/fuse and the tools of
//! scripts/setup.sh; without them the tests fail saying what is missing.

use std::path::Path;

use onecopy_lab::mount::require_program;
use onecopy_lab::paper1::{
    self, uniqueness, Paper1Options, Scale, Setup, UniquenessScale, Workload,
};

/// Fails the test, saying what is missing, unless the testbed can run here.
fn require_testbed() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    assert!(
        root,
        "the testbed mounts a file system and must run as root"
    );
    for program in [
        "nbdfuse",
        "losetup",
        "fusermount3",
        "mkfs.ext4",
        "mkfs.ext3",
        "mount",
    ] {
        assert!(
            require_program(program).is_ok(),
            "{program} is not installed: run scripts/setup.sh"
        );
    }
    assert!(
        Path::new("/dev/fuse").exists(),
        "/dev/fuse is missing: nbdfuse needs the fuse module (modprobe fuse)"
    );
}

/// A scale small enough for a test: a 256 MiB volume, 1 MiB of warm-up, a few files.
fn tiny_scale(warm_source: &Path) -> Scale {
    Scale {
        volume_bytes: 256 << 20,
        warm_source: warm_source.to_path_buf(),
        warm_bytes: 1 << 20,
        fileserver_files: 24,
        fileserver_mean_blocks: 8,
        fileserver_threads: 2,
        fileserver_iterations: 6,
        data_journal_files: 8,
        data_journal_threads: 2,
        data_journal_appends: 200,
        tree_files: 400,
        tree_operations: 100,
        ..Scale::quick()
    }
}

/// Goal: Table 5.1's census sees a new file system's few distinct chunks, then the inode
/// tables and directory the files wrote, on ext3 and ext4. Method: 2,000 empty files on a
/// 128 MiB volume; counts at 512 B and 4 KiB.
#[test]
fn uniqueness_counts_metadata_chunks() {
    require_testbed();
    let work = tempfile::tempdir().unwrap();
    for file_system in uniqueness::FILE_SYSTEMS {
        let records = uniqueness::measure(work.path(), file_system, 128 << 20, 2_000, 2).unwrap();
        assert_eq!(records.len(), 2);
        for record in &records {
            let chunks = (128 << 20) / record.after.chunk_bytes;
            assert_eq!(record.before.chunks, chunks);
            assert_eq!(record.after.chunks, chunks);
            assert!(record.before.distinct >= 2, "{file_system}: {record:?}");
            // 2,000 inodes of 256 bytes at least fill 1,000 distinct 512-byte chunks (or 125
            // of 4 KiB).
            let minimum = 2_000 * 256 / record.after.chunk_bytes;
            assert!(
                record.after.distinct >= record.before.distinct + minimum / 2,
                "{file_system}: {record:?}"
            );
            assert!(record.after.once <= record.after.distinct);
        }
    }
}

/// Goal: one run of every new workload and setup completes and records what the figures
/// need: the tree's two kinds, processor time, and for deferred deduplication a pass that
/// merges the duplicates the run left and raises the dedup ratio. Method: the tree, the
/// data-journal and the file-server workloads at one latency, one run each, then the figures.
#[test]
fn workloads_run_and_deferred_pass_deduplicates() {
    require_testbed();
    let work = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let options = Paper1Options {
        output_directory: out.path().to_path_buf(),
        work_directory: work.path().to_path_buf(),
        workloads: vec![Workload::Tree, Workload::DataJournal, Workload::FileServer],
        latencies_ns: vec![100_000],
        policies: None,
        repetitions: 1,
        scale: tiny_scale(Path::new("/usr/share")),
        uniqueness: None,
    };
    let written = paper1::run_experiment(&options, &mut |_| {}).unwrap();
    let results = paper1::read_results(&out.path().join("results.json")).unwrap();
    assert_eq!(results.runs.len(), 2 + 2 + 3);
    for run in &results.runs {
        assert!(run.operations > 0 && run.elapsed_seconds > 0.0, "{run:?}");
        assert!(run.cpu.process > 0.0 && run.cpu.total() > 0.0, "{run:?}");
        assert!(run.cpu.workload <= run.cpu.process + 0.05, "{run:?}");
        let hinted = run.counters.hint_metadata_blocks + run.counters.hint_journal_blocks;
        assert_eq!(hinted > 0, Setup::of(run) != Setup::Off, "{run:?}");
    }
    let tree = results
        .runs
        .iter()
        .find(|run| run.workload == Workload::Tree)
        .unwrap();
    let kinds: Vec<(&str, u64)> = tree
        .kinds
        .iter()
        .map(|kind| (kind.name.as_str(), kind.operations))
        .collect();
    assert_eq!(kinds, [("create", 100), ("delete", 100)]);
    let deferred = results
        .runs
        .iter()
        .find(|run| Setup::of(run) == Setup::Deferred)
        .unwrap();
    assert_eq!(
        deferred.counters.disk_lookups, 0,
        "nothing is looked up during the run"
    );
    let pass = deferred.deferred_pass.as_ref().unwrap();
    assert!(pass.examined > 0 && pass.deduplicated > 0, "{pass:?}");
    assert!(pass.dedup_ratio > deferred.dedup_ratio, "{pass:?}");
    assert!(pass.stored_bytes < deferred.stored_bytes, "{pass:?}");
    for figure in [
        "paper1-tree.svg",
        "paper1-data-journal.svg",
        "paper1-file-server.svg",
    ] {
        assert!(
            written.iter().any(|path| path.ends_with(figure)),
            "{figure} in {written:?}"
        );
    }
    let summary = std::fs::read_to_string(out.path().join("summary.md")).unwrap();
    assert!(summary.contains("deferred pass s"), "{summary}");
}

/// Goal: the quick and full scales pass validation with Table 5.1 (the command's defaults).
#[test]
fn default_scales_are_valid() {
    for (scale, uniqueness) in [
        (Scale::quick(), UniquenessScale::quick()),
        (Scale::full(), UniquenessScale::full()),
    ] {
        let options = Paper1Options {
            output_directory: "/nonexistent".into(),
            work_directory: std::env::temp_dir(),
            workloads: Workload::ALL.to_vec(),
            latencies_ns: paper1::PAPER_LATENCIES_NS.to_vec(),
            policies: None,
            repetitions: 3,
            scale,
            uniqueness: Some(uniqueness),
        };
        options.validate().unwrap();
    }
}
