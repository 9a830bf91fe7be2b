//! Crashes at every sync of deduplication and of fsync'd writes, on the core's simulated
//! storage (clean and torn), each followed by recovery, a comparison with a reference model
//! and a check.

use std::sync::Arc;

use onecopy_core::check::{CheckOptions, FindingKind};
use onecopy_core::storage::{CrashMode, SimulatedStorage, Storage};
use onecopy_fs::dedup::{self, Yield};
use onecopy_fs::engine::{Caller, NewNode};
use onecopy_fs::node::{Kind, ROOT};
use onecopy_fs::{FsEngine, FsId, FsOptions, OpenMode, RuntimeOptions};

const ROOT_CALLER: Caller = Caller { uid: 0, gid: 0 };

fn bytes(seed: u64, length: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..length)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

fn open(storage: &SimulatedStorage) -> onecopy_fs::Result<Arc<FsEngine>> {
    let storage: Arc<dyn Storage> = Arc::new(storage.clone());
    let runtime = RuntimeOptions {
        // Small containers: deduplication crosses several.
        checkpoint_journal_bytes: 256 << 10,
        ..RuntimeOptions::default()
    };
    FsEngine::open(storage, runtime, OpenMode::ReadWrite)
}

fn create_file(engine: &FsEngine, fs: FsId, name: &str) -> u64 {
    let node = NewNode {
        kind: Kind::File,
        mode: 0o600,
        rdev: 0,
        target: Vec::new(),
    };
    engine
        .create_node(fs, ROOT, name.as_bytes(), node, ROOT_CALLER)
        .unwrap()
        .ino
}

fn contents(engine: &FsEngine, fs: FsId, name: &str) -> Vec<u8> {
    let ino = engine.lookup(fs, ROOT, name.as_bytes()).unwrap().ino;
    let size = engine.getattr(fs, ino).unwrap().attributes.size;
    let mut out = Vec::new();
    while (out.len() as u64) < size {
        out.extend(engine.read(fs, ino, out.len() as u64, 1 << 20).unwrap());
    }
    out
}

fn assert_checks_clean(engine: &FsEngine, context: &str) {
    let report = engine.check(CheckOptions::default()).unwrap();
    let problems: Vec<_> = report
        .findings
        .iter()
        .filter(|finding| finding.kind != FindingKind::Leftover)
        .collect();
    assert!(problems.is_empty(), "{context}: {problems:#?}");
}

/// Files by name with their contents: the reference model.
type Model = Vec<(&'static str, Vec<u8>)>;

/// The files of the deduplication crash test: two copies of one file and one that shares
/// part of it, all written and synced, not yet deduplicated. The original and the mixed file
/// will be cut big, the copy small: the copy maps pieces of the original's big chunks, the
/// mixed file references the original's chunks where its runs of them are long.
fn dedup_setup(storage: &SimulatedStorage) -> (Arc<FsEngine>, FsId, Model) {
    let engine = open(storage).unwrap();
    let options = FsOptions {
        min_evaluation_interval_seconds: 0,
        min_evaluation_count: 0,
        idle_seconds: 0,
        small_chunk_bytes: 16 << 10,
        big_chunk_bytes: 64 << 10,
        ..FsOptions::default()
    };
    let fs = engine
        .create_file_system("crash", options, ROOT_CALLER)
        .unwrap();
    let original = bytes(1, 400_000);
    // Nine small chunks, then the original's start: on the piece grid of both.
    let mut mixed = bytes(2, 147_456);
    mixed.extend_from_slice(&original[..200_000]);
    let files = vec![("a", original.clone()), ("b", original), ("c", mixed)];
    for (name, data) in &files {
        let ino = create_file(&engine, fs, name);
        engine.write(fs, ino, 0, data).unwrap();
    }
    // Two files are read sequentially enough to be rank 1 (big chunks), the copy rank 2.
    for name in [b"a", b"c"] {
        let ino = engine.lookup(fs, ROOT, name).unwrap().ino;
        engine.read(fs, ino, 0, 1 << 20).unwrap();
    }
    engine.flush().unwrap();
    (engine, fs, files)
}

/// Goal: a crash at any sync of a deduplication run (and of the sync after it), clean or
/// torn, recovers to the same file contents with consistent reference counts. Method: count
/// the syncs of one run, then crash after each count in turn, reopen, compare, check.
#[test]
fn crash_at_every_sync_of_deduplication() {
    let reference = SimulatedStorage::new();
    let (engine, fs, _) = dedup_setup(&reference);
    let before = reference.sync_count();
    let plan = dedup::plan(&engine, fs).unwrap();
    assert_eq!(plan.files.len(), 3, "{plan:?}");
    let report = dedup::execute(&engine, fs, &plan, Yield::Never).unwrap();
    // The copy's small chunks (24) and the mixed file's runs of the original's first three
    // chunks (12 pieces) map into the original's big chunks: the crash points cover piece
    // references and the piece index's changes.
    assert_eq!(report.pieces_deduplicated, 24 + 12, "{report:?}");
    engine.flush().unwrap();
    engine.checkpoint().unwrap();
    let syncs = reference.sync_count() - before;
    assert!(syncs >= 3, "the run syncs: {syncs}");
    drop(engine);

    for crash_after in 1..=syncs {
        let storage = SimulatedStorage::new();
        let (engine, fs, files) = dedup_setup(&storage);
        storage.crash_after_syncs(crash_after);
        let run = dedup::plan(&engine, fs)
            .and_then(|plan| dedup::execute(&engine, fs, &plan, Yield::Never))
            .and_then(|_| engine.flush())
            .and_then(|_| engine.checkpoint());
        assert!(
            run.is_err() || storage.is_crashed(),
            "crash point {crash_after} of {syncs} is reached"
        );
        drop(engine);
        for mode in [CrashMode::Clean, CrashMode::Torn { seed: crash_after }] {
            let context = format!("crash after sync {crash_after} of {syncs}, {mode:?}");
            let recovered = open(&storage.crash(mode))
                .unwrap_or_else(|error| panic!("{context}: reopening fails: {error}"));
            let fs = recovered.find("crash").unwrap();
            for (name, data) in &files {
                assert!(
                    contents(&recovered, fs, name) == *data,
                    "{context}: file {name} differs"
                );
            }
            assert_checks_clean(&recovered, &context);
            // And a deduplication run finishes the job.
            let plan = dedup::plan(&recovered, fs).unwrap();
            dedup::execute(&recovered, fs, &plan, Yield::Never).unwrap();
            for (name, data) in &files {
                assert!(
                    contents(&recovered, fs, name) == *data,
                    "{context}: {name} after"
                );
            }
            assert_checks_clean(&recovered, &context);
        }
    }
}

/// Goal: what an fsync acknowledged survives a crash at any later sync; what follows it is
/// either there or not, never half a write. Method: overwrite and extend one file with an
/// fsync after each step, crash after each sync count, and compare the recovered contents
/// with the states from the last acknowledged step on.
#[test]
fn acknowledged_writes_survive_a_crash_at_every_sync() {
    let steps: Vec<(u64, Vec<u8>)> = (0..8u64)
        .map(|step| {
            (
                step * 70_001 % 300_000,
                bytes(10 + step, 50_000 + step as usize * 9_000),
            )
        })
        .collect();
    let run = |storage: &SimulatedStorage, arm: Option<u64>| -> (Vec<Vec<u8>>, usize) {
        let engine = open(storage).unwrap();
        let fs = engine
            .create_file_system("writes", FsOptions::default(), ROOT_CALLER)
            .unwrap();
        let ino = create_file(&engine, fs, "f");
        engine.flush().unwrap();
        if let Some(syncs) = arm {
            storage.crash_after_syncs(syncs);
        }
        let mut states = vec![Vec::new()];
        let mut acknowledged = 0;
        let mut content = Vec::new();
        for (offset, data) in &steps {
            let end = *offset as usize + data.len();
            if content.len() < end {
                content.resize(end, 0);
            }
            content[*offset as usize..end].copy_from_slice(data);
            states.push(content.clone());
            let written = engine
                .write(fs, ino, *offset, data)
                .and_then(|_| engine.flush());
            if written.is_err() {
                break;
            }
            acknowledged = states.len() - 1;
        }
        (states, acknowledged)
    };
    let reference = SimulatedStorage::new();
    let (states, acknowledged) = run(&reference, None);
    assert_eq!(acknowledged, steps.len());
    let total = reference.sync_count();
    for crash_after in 1..=total {
        let storage = SimulatedStorage::new();
        let (_, acknowledged) = run(&storage, Some(crash_after));
        for mode in [CrashMode::Clean, CrashMode::Torn { seed: crash_after }] {
            let context = format!("crash after sync {crash_after}, {mode:?}");
            let recovered = match open(&storage.crash(mode)) {
                Ok(engine) => engine,
                Err(error) => panic!("{context}: reopening fails: {error}"),
            };
            let Ok(fs) = recovered.find("writes") else {
                // The crash came before the file system's creation was synced.
                assert_eq!(acknowledged, 0, "{context}");
                continue;
            };
            let found = match recovered.lookup(fs, ROOT, b"f") {
                Ok(_) => contents(&recovered, fs, "f"),
                Err(_) => {
                    assert_eq!(acknowledged, 0, "{context}");
                    continue;
                }
            };
            assert!(
                states[acknowledged..].contains(&found),
                "{context}: {} bytes recovered, acknowledged step {acknowledged}",
                found.len()
            );
            assert_checks_clean(&recovered, &context);
            // The recovered face takes new writes (new containers, whatever the crash left).
            let fresh = create_file(&recovered, fs, "after");
            let data = bytes(99, 5 << 20);
            for (index, piece) in data.chunks(1 << 20).enumerate() {
                recovered
                    .write(fs, fresh, (index as u64) << 20, piece)
                    .unwrap_or_else(|error| panic!("{context}: writing after recovery: {error}"));
            }
            recovered.flush().unwrap();
            assert!(contents(&recovered, fs, "after") == data, "{context}");
        }
    }
}

/// Goal: a crash at any sync while piece references lose their big file, compaction sweeps
/// the piece index and a later run meets stale entries recovers the acknowledged contents
/// with consistent reference counts, and the face deduplicates on afterwards. Method: the
/// deduplicated files of `dedup_setup` (the copy referencing pieces of the original),
/// then remove the original, compact, write a copy of its data and deduplicate it; crash
/// after each sync of that sequence, reopen, compare, check, deduplicate again.
#[test]
fn crash_at_every_sync_of_piece_cleanup() {
    let deduplicated = |storage: &SimulatedStorage| {
        let (engine, fs, files) = dedup_setup(storage);
        let plan = dedup::plan(&engine, fs).unwrap();
        dedup::execute(&engine, fs, &plan, Yield::Never).unwrap();
        engine.checkpoint().unwrap();
        (engine, fs, files)
    };
    let original = bytes(1, 400_000);
    let sequence = |engine: &FsEngine, fs: FsId| -> onecopy_fs::Result<()> {
        engine.remove(fs, ROOT, b"a", false)?;
        engine.compact(false)?;
        let node = NewNode {
            kind: Kind::File,
            mode: 0o600,
            rdev: 0,
            target: Vec::new(),
        };
        let d = engine.create_node(fs, ROOT, b"d", node, ROOT_CALLER)?.ino;
        engine.write(fs, d, 0, &original[65_536..262_144])?;
        engine.flush()?;
        let plan = dedup::plan(engine, fs)?;
        dedup::execute(engine, fs, &plan, Yield::Never)?;
        engine.flush()?;
        engine.checkpoint()
    };
    let reference = SimulatedStorage::new();
    let (engine, fs, _) = deduplicated(&reference);
    let before = reference.sync_count();
    sequence(&engine, fs).unwrap();
    let syncs = reference.sync_count() - before;
    assert!(syncs >= 4, "the sequence syncs: {syncs}");
    drop(engine);

    for crash_after in 1..=syncs {
        let storage = SimulatedStorage::new();
        let (engine, fs, files) = deduplicated(&storage);
        storage.crash_after_syncs(crash_after);
        let run = sequence(&engine, fs);
        assert!(
            run.is_err() || storage.is_crashed(),
            "crash point {crash_after} of {syncs} is reached"
        );
        drop(engine);
        for mode in [CrashMode::Clean, CrashMode::Torn { seed: crash_after }] {
            let context = format!("crash after sync {crash_after} of {syncs}, {mode:?}");
            let recovered = open(&storage.crash(mode))
                .unwrap_or_else(|error| panic!("{context}: reopening fails: {error}"));
            let fs = recovered.find("crash").unwrap();
            let check_files = |engine: &FsEngine, when: &str| {
                for (name, data) in &files {
                    match engine.lookup(fs, ROOT, name.as_bytes()) {
                        Ok(_) => assert!(
                            contents(engine, fs, name) == *data,
                            "{context}: file {name} differs {when}"
                        ),
                        Err(_) => assert_eq!(*name, "a", "{context}: only a is removed"),
                    }
                }
                if engine.lookup(fs, ROOT, b"d").is_ok() {
                    let found = contents(engine, fs, "d");
                    assert!(
                        found.is_empty() || found == original[65_536..262_144],
                        "{context}: file d differs {when}"
                    );
                }
            };
            check_files(&recovered, "after recovery");
            assert_checks_clean(&recovered, &context);
            let plan = dedup::plan(&recovered, fs).unwrap();
            dedup::execute(&recovered, fs, &plan, Yield::Never).unwrap();
            recovered.compact(false).unwrap();
            check_files(&recovered, "after a run and compaction");
            assert_checks_clean(&recovered, &context);
        }
    }
}
