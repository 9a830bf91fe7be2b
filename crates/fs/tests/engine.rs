//! The engine without FUSE: map replication and reference counts, rank-1 layout, recovery.

use std::sync::Arc;

use onecopy_core::check::CheckOptions;
use onecopy_core::repository::Repository;
use onecopy_core::storage::Storage;
use onecopy_fs::dedup::{self, Yield};
use onecopy_fs::engine::{Caller, NewNode};
use onecopy_fs::node::{Chunking, Kind, ROOT};
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

/// Options that rank every file at once: no evaluation interval or count.
fn eager() -> FsOptions {
    FsOptions {
        min_evaluation_interval_seconds: 0,
        min_evaluation_count: 0,
        idle_seconds: 0,
        ..FsOptions::default()
    }
}

fn open(storage: &Arc<dyn Storage>) -> Arc<FsEngine> {
    FsEngine::open(
        Arc::clone(storage),
        RuntimeOptions::default(),
        OpenMode::ReadWrite,
    )
    .unwrap()
}

fn file(engine: &FsEngine, fs: FsId, name: &str, data: &[u8]) -> u64 {
    let node = NewNode {
        kind: Kind::File,
        mode: 0o644,
        rdev: 0,
        target: Vec::new(),
    };
    let info = engine
        .create_node(fs, ROOT, name.as_bytes(), node, ROOT_CALLER)
        .unwrap();
    for (index, piece) in data.chunks(1 << 20).enumerate() {
        engine
            .write(fs, info.ino, (index as u64) << 20, piece)
            .unwrap();
    }
    info.ino
}

fn contents(engine: &FsEngine, fs: FsId, ino: u64) -> Vec<u8> {
    let size = engine.getattr(fs, ino).unwrap().attributes.size;
    let mut out = Vec::new();
    while (out.len() as u64) < size {
        out.extend(engine.read(fs, ino, out.len() as u64, 1 << 20).unwrap());
    }
    out
}

fn assert_clean(engine: &FsEngine) {
    let report = engine
        .check(CheckOptions {
            repair: false,
            read_data: true,
        })
        .unwrap();
    assert!(report.findings.is_empty(), "{:#?}", report.findings);
}

/// Goal: after deduplication two identical files share chunks; a write into one splits its
/// map without changing the shared chunk, reference counts stay right, and deleting the
/// other leaves it readable. Method: engine calls, `check` after each step.
#[test]
fn map_replication_keeps_shared_chunks_and_counts() {
    let directory = tempfile::tempdir().unwrap();
    let repository = Repository::init(directory.path()).unwrap();
    let storage = repository.face_storage("fs").unwrap();
    let engine = open(&storage);
    let fs = engine
        .create_file_system("data", eager(), ROOT_CALLER)
        .unwrap();
    let original = bytes(1, 600_000);
    let a = file(&engine, fs, "a", &original);
    let b = file(&engine, fs, "b", &original);
    let before = engine.stats(fs).unwrap();
    assert_eq!(before.pending_bytes, 1_200_000);
    let plan = dedup::plan(&engine, fs).unwrap();
    assert_eq!(plan.files.len(), 2, "{plan:?}");
    assert!(plan
        .files
        .iter()
        .all(|file| file.chunking == Chunking::Small));
    let report = dedup::execute(&engine, fs, &plan, Yield::Never).unwrap();
    assert_eq!(report.files_deduplicated, 2);
    let after = engine.stats(fs).unwrap();
    assert_eq!(after.pending_bytes, 0);
    assert!(
        after.stored_bytes < 620_000,
        "the copy shares the original's chunks: {after:?}"
    );
    assert_clean(&engine);

    // A write into the middle of a shared chunk of b.
    engine.write(fs, b, 10_000, b"changed").unwrap();
    let mut expected_b = original.clone();
    expected_b[10_000..10_007].copy_from_slice(b"changed");
    assert_eq!(contents(&engine, fs, a), original);
    assert_eq!(contents(&engine, fs, b), expected_b);
    let layout = engine.file_layout(fs, b).unwrap();
    let split: Vec<_> = layout
        .iter()
        .filter(|place| place.offset >= 8192 && place.offset < 12_288)
        .collect();
    assert_eq!(
        split.len(),
        3,
        "the chunk's map is split in three: {layout:?}"
    );
    assert!(split[1].plain);
    assert_eq!(split[0].chunk, split[2].chunk);
    assert_eq!(split[0].references, 3, "a's extent and b's two pieces");
    assert_clean(&engine);

    engine.remove(fs, ROOT, b"a", false).unwrap();
    assert_eq!(contents(&engine, fs, b), expected_b);
    assert_clean(&engine);
    // Everything survives a reopen (journal replay after a flush, no checkpoint).
    engine.flush().unwrap();
    drop(engine);
    let engine = open(&storage);
    assert_eq!(contents(&engine, fs, b), expected_b);
    assert_clean(&engine);
}

/// Goal: a file read sequentially becomes rank 1, gets big chunks written contiguously in
/// file order, and reads the same; a file read randomly becomes rank 2 with small chunks.
/// Method: reads through the engine (the I/O monitor), then a deduplication run.
#[test]
fn sequential_files_get_contiguous_big_chunks() {
    let directory = tempfile::tempdir().unwrap();
    let repository = Repository::init(directory.path()).unwrap();
    let engine = open(&repository.face_storage("fs").unwrap());
    let options = FsOptions {
        min_evaluation_count: 4,
        ..eager()
    };
    let fs = engine
        .create_file_system("seq", options, ROOT_CALLER)
        .unwrap();
    let data = bytes(2, 3 << 20);
    let sequential = file(&engine, fs, "sequential", &data);
    let random = file(&engine, fs, "random", &bytes(3, 1 << 20));
    for offset in (0..(3u64 << 20)).step_by(256 << 10) {
        engine.read(fs, sequential, offset, 256 << 10).unwrap();
    }
    for offset in [900_000u64, 5, 400_000, 77_777, 12] {
        engine.read(fs, random, offset, 4096).unwrap();
    }
    let plan = dedup::plan(&engine, fs).unwrap();
    let ranks: Vec<(u64, u8)> = plan
        .files
        .iter()
        .map(|file| (file.ino, file.rank))
        .collect();
    assert!(ranks.contains(&(sequential, 1)), "{plan:?}");
    assert!(ranks.contains(&(random, 2)), "{plan:?}");
    dedup::execute(&engine, fs, &plan, Yield::Never).unwrap();
    let layout = engine.file_layout(fs, sequential).unwrap();
    assert_eq!(layout.len(), 12, "3 MiB in 256 KiB chunks: {layout:?}");
    for pair in layout.windows(2) {
        assert_eq!(pair[0].length, 256 << 10);
        let contiguous = pair[0].container == pair[1].container
            && pair[1].container_offset > pair[0].container_offset;
        let next_container = pair[1].container == pair[0].container + 1;
        assert!(contiguous || next_container, "file order on disk: {pair:?}");
    }
    let ranks = engine.ranks(fs).unwrap();
    let rank_of = |ino| ranks.iter().find(|file| file.ino == ino).unwrap().clone();
    assert_eq!(rank_of(sequential).chunking, Some(Chunking::Big));
    assert_eq!(
        rank_of(sequential).sequential_reads,
        0,
        "counters reset when ranked"
    );
    assert_eq!(rank_of(random).chunking, Some(Chunking::Small));
    assert_eq!(contents(&engine, fs, sequential), data);
    assert_clean(&engine);
}

/// Goal: a file read whole again after each open counts only sequential reads (the
/// monitor's position starts at 0 with each open, as the paper's file position does), so a
/// small file read whole twice ranks 1, not 2. Method: open, read whole, release, twice,
/// for a one-request file and a four-request file; then the ranker's plan.
#[test]
fn rereading_after_open_is_sequential() {
    let directory = tempfile::tempdir().unwrap();
    let repository = Repository::init(directory.path()).unwrap();
    let engine = open(&repository.face_storage("fs").unwrap());
    let options = FsOptions {
        min_evaluation_count: 2,
        ..eager()
    };
    let fs = engine
        .create_file_system("reread", options, ROOT_CALLER)
        .unwrap();
    let small = file(&engine, fs, "small", &bytes(4, 3000));
    let large = file(&engine, fs, "large", &bytes(5, 1 << 20));
    for _ in 0..2 {
        engine.open_handle(fs, small).unwrap();
        engine.read(fs, small, 0, 4096).unwrap();
        engine.release_handle(fs, small).unwrap();
        engine.open_handle(fs, large).unwrap();
        for offset in (0..(1u64 << 20)).step_by(256 << 10) {
            engine.read(fs, large, offset, 256 << 10).unwrap();
        }
        engine.release_handle(fs, large).unwrap();
    }
    let ranks = engine.ranks(fs).unwrap();
    let counts = |ino| {
        let file = ranks.iter().find(|file| file.ino == ino).unwrap();
        (file.sequential_reads, file.random_reads)
    };
    assert_eq!(counts(small), (2, 0));
    assert_eq!(counts(large), (8, 0));
    let plan = dedup::plan(&engine, fs).unwrap();
    let ranked: Vec<(u64, u8)> = plan.files.iter().map(|f| (f.ino, f.rank)).collect();
    assert!(ranked.contains(&(small, 1)), "{plan:?}");
    assert!(ranked.contains(&(large, 1)), "{plan:?}");
}

/// Goal: a write to a file while it is deduplicated stops that file's deduplication and
/// loses nothing. Method: plan, write, execute the stale plan.
#[test]
fn write_during_dedup_wins() {
    let directory = tempfile::tempdir().unwrap();
    let repository = Repository::init(directory.path()).unwrap();
    let engine = open(&repository.face_storage("fs").unwrap());
    let fs = engine
        .create_file_system("race", eager(), ROOT_CALLER)
        .unwrap();
    let data = bytes(4, 100_000);
    let ino = file(&engine, fs, "f", &data);
    let plan = dedup::plan(&engine, fs).unwrap();
    engine.write(fs, ino, 50, b"new").unwrap();
    // The plan still names the file, which was written since: the run skips it.
    let report = dedup::execute(&engine, fs, &plan, Yield::Never).unwrap();
    let mut expected = data;
    expected[50..53].copy_from_slice(b"new");
    assert_eq!(contents(&engine, fs, ino), expected);
    assert_eq!((report.files_deduplicated, report.files_skipped), (0, 1));
    assert_eq!(engine.stats(fs).unwrap().pending_bytes, 100_000);
    assert_clean(&engine);
}

/// Goal: content-defined small chunks find a duplicate shifted within a file, which fixed
/// chunks miss. Method: a file and a copy with 777 bytes inserted at the front, deduplicated
/// once with each small chunking; stored bytes compared.
#[test]
fn content_defined_chunks_find_shifted_duplicates() {
    let stored = |small_chunking| {
        let directory = tempfile::tempdir().unwrap();
        let repository = Repository::init(directory.path()).unwrap();
        let engine = open(&repository.face_storage("fs").unwrap());
        let options = FsOptions {
            small_chunking,
            ..eager()
        };
        let fs = engine
            .create_file_system("cdc", options, ROOT_CALLER)
            .unwrap();
        let original = bytes(5, 800_000);
        let mut shifted = bytes(6, 777);
        shifted.extend_from_slice(&original);
        let a = file(&engine, fs, "a", &original);
        let b = file(&engine, fs, "b", &shifted);
        let plan = dedup::plan(&engine, fs).unwrap();
        dedup::execute(&engine, fs, &plan, Yield::Never).unwrap();
        assert_eq!(contents(&engine, fs, a), original);
        assert_eq!(contents(&engine, fs, b), shifted);
        assert_clean(&engine);
        engine.stats(fs).unwrap().stored_bytes
    };
    let fixed = stored(onecopy_fs::SmallChunking::Fixed);
    let content_defined = stored(onecopy_fs::SmallChunking::ContentDefined);
    assert!(
        fixed > 1_500_000,
        "fixed chunks miss the shifted copy: {fixed}"
    );
    assert!(
        content_defined < 900_000,
        "content-defined chunks find it: {content_defined}"
    );
}

/// Goal: removing a file of more extents than one journal record can hold works and
/// survives a reopen (the removal spans several records). Method: 600,000 one-byte writes
/// two bytes apart (one extent each), unlink, reopen, check.
#[test]
fn removing_a_file_of_many_extents_spans_records() {
    let directory = tempfile::tempdir().unwrap();
    let repository = Repository::init(directory.path()).unwrap();
    let storage = repository.face_storage("fs").unwrap();
    let engine = open(&storage);
    let fs = engine
        .create_file_system("many", eager(), ROOT_CALLER)
        .unwrap();
    let ino = file(&engine, fs, "many", &[]);
    for index in 0..600_000u64 {
        engine.write(fs, ino, index * 2, &[1]).unwrap();
    }
    assert_eq!(engine.file_layout(fs, ino).unwrap().len(), 600_000);
    engine.remove(fs, ROOT, b"many", false).unwrap();
    assert_eq!(engine.stats(fs).unwrap().face.live_chunks, 0);
    engine.flush().unwrap();
    drop(engine);
    let engine = open(&storage);
    assert_eq!(engine.stats(fs).unwrap().files, 0);
    assert_clean(&engine);
}

/// Goal: `check` finds a chunk whose stored reference count disagrees with the extents
/// that map it, a repair sets it right, and the next check is clean. Method: the face is
/// closed, one chunk's count is raised directly in its chunk table (core API, the same
/// checkpoint state kept), then the face is opened and checked.
#[test]
fn check_repairs_reference_counts() {
    use onecopy_core::bytes::ByteReader;
    use onecopy_core::chunk_store::{ChunkStore, ChunkStoreOptions, ChunkStoreState};
    use onecopy_core::container::ContainerStore;
    use onecopy_core::pages::{PageStore, PageStoreOptions};

    let directory = tempfile::tempdir().unwrap();
    let repository = Repository::init(directory.path()).unwrap();
    let storage = repository.face_storage("fs").unwrap();
    let engine = open(&storage);
    let fs = engine
        .create_file_system("counts", eager(), ROOT_CALLER)
        .unwrap();
    let ino = file(&engine, fs, "f", &bytes(7, 10_000));
    let chunk = engine.file_layout(fs, ino).unwrap()[0].chunk;
    engine.shutdown().unwrap();
    drop(engine);

    {
        let (mut pages, user_state) =
            PageStore::open(Arc::clone(&storage), "meta", PageStoreOptions::default()).unwrap();
        let mut reader = ByteReader::new(&user_state);
        let length = reader.u32().unwrap() as usize;
        let saved: serde_json::Value =
            serde_json::from_slice(reader.take(length).unwrap()).unwrap();
        let state: ChunkStoreState = serde_json::from_value(saved["chunk_store"].clone()).unwrap();
        let containers = Arc::new(
            ContainerStore::new(Arc::clone(&storage), "containers", Default::default()).unwrap(),
        );
        let mut chunks = ChunkStore::open(
            &mut pages,
            containers,
            state,
            ChunkStoreOptions {
                fingerprint: Default::default(),
                index: Default::default(),
            },
        )
        .unwrap();
        let mut changes = Vec::new();
        chunks.reference(&mut pages, chunk, &mut changes).unwrap();
        chunks.prepare_checkpoint(&mut pages).unwrap();
        pages.checkpoint(&user_state).unwrap();
    }

    let engine = open(&storage);
    let found = engine
        .check(onecopy_core::check::CheckOptions::default())
        .unwrap();
    assert_eq!(found.findings.len(), 1, "{:#?}", found.findings);
    assert_eq!(
        found.findings[0].kind,
        onecopy_core::check::FindingKind::Derived
    );
    assert!(
        found.findings[0].detail.contains("reference count 2 but 1"),
        "{found:?}"
    );
    let repaired = engine
        .check(onecopy_core::check::CheckOptions {
            repair: true,
            read_data: false,
        })
        .unwrap();
    assert!(repaired.repaired, "{repaired:?}");
    drop(engine);
    let engine = open(&storage);
    assert_clean(&engine);
    assert_eq!(contents(&engine, fs, ino), bytes(7, 10_000));
}

/// Goal: a run started by idleness works at most its configured share of the time, and a
/// foreground request stops it. Method: a run over 24 MiB with a 25% share (busy time
/// against elapsed time), then a run interrupted by a noted request.
#[test]
fn idle_runs_keep_to_their_share_and_yield() {
    let directory = tempfile::tempdir().unwrap();
    let repository = Repository::init(directory.path()).unwrap();
    let engine = open(&repository.face_storage("fs").unwrap());
    let options = FsOptions {
        dedup_share_percent: 25,
        ..eager()
    };
    let fs = engine
        .create_file_system("share", options, ROOT_CALLER)
        .unwrap();
    for index in 0..6 {
        file(
            &engine,
            fs,
            &format!("f{index}"),
            &bytes(20 + index, 4 << 20),
        );
    }
    let plan = dedup::plan(&engine, fs).unwrap();
    let report = dedup::execute(&engine, fs, &plan, Yield::ToForeground).unwrap();
    assert_eq!(report.files_deduplicated, 6, "{report:?}");
    assert!(report.busy_ms > 0, "{report:?}");
    let share = report.busy_ms as f64 / report.elapsed_ms as f64;
    assert!(share < 0.4, "worked {share:.2} of the time: {report:?}");

    for index in 6..9 {
        file(
            &engine,
            fs,
            &format!("f{index}"),
            &bytes(20 + index, 4 << 20),
        );
    }
    let plan = dedup::plan(&engine, fs).unwrap();
    let stopper = std::thread::scope(|scope| {
        let engine = &engine;
        scope.spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(5));
            engine.note_request();
        });
        dedup::execute(engine, fs, &plan, Yield::ToForeground).unwrap()
    });
    assert!(stopper.stopped_for_foreground, "{stopper:?}");
    assert!(stopper.files_deduplicated < 3, "{stopper:?}");
    assert_clean(&engine);
}

/// Goal: the small chunks of a randomly read file find data that lies inside a
/// sequentially read file's big chunks (the piece index), in the same run although the
/// random file was written first; the big chunks they reference stay while the big file is
/// removed and compacted; entries of freed chunks deduplicate nothing and compaction
/// removes them. Method: engine calls; layouts, stored bytes and piece entries compared;
/// `check` (with data) after each step.
#[test]
fn small_chunks_find_data_inside_big_chunks() {
    let directory = tempfile::tempdir().unwrap();
    let repository = Repository::init(directory.path()).unwrap();
    let engine = open(&repository.face_storage("fs").unwrap());
    let options = FsOptions {
        min_evaluation_count: 1,
        ..eager()
    };
    let fs = engine
        .create_file_system("pieces", options, ROOT_CALLER)
        .unwrap();
    let big = bytes(7, 1 << 20);
    // Two runs of the big file on the 4 KiB grid, off the 256 KiB one: 49 and 75 blocks.
    let runs = [(3 * 4096, 49 * 4096), (147 * 4096, 75 * 4096)];
    let mut mixed = big[runs[0].0..runs[0].0 + runs[0].1].to_vec();
    mixed.extend(bytes(8, 10 * 4096));
    mixed.extend_from_slice(&big[runs[1].0..runs[1].0 + runs[1].1]);
    let mixed_ino = file(&engine, fs, "mixed", &mixed);
    let big_ino = file(&engine, fs, "big", &big);
    engine.read(fs, big_ino, 0, 1 << 20).unwrap();
    engine.read(fs, mixed_ino, 8192, 4096).unwrap();
    let plan = dedup::plan(&engine, fs).unwrap();
    let order: Vec<(u64, Chunking)> = plan.files.iter().map(|f| (f.ino, f.chunking)).collect();
    assert_eq!(
        order,
        vec![(big_ino, Chunking::Big), (mixed_ino, Chunking::Small)],
        "files cut big go first"
    );
    let report = dedup::execute(&engine, fs, &plan, Yield::Never).unwrap();
    assert_eq!(report.pieces_deduplicated, 49 + 75, "{report:?}");
    let big_chunks: Vec<u64> = engine
        .file_layout(fs, big_ino)
        .unwrap()
        .iter()
        .map(|place| place.chunk)
        .collect();
    assert_eq!(big_chunks.len(), 4);
    let layout = engine.file_layout(fs, mixed_ino).unwrap();
    let inside = layout
        .iter()
        .filter(|place| big_chunks.contains(&place.chunk))
        .count();
    assert_eq!(inside, 49 + 75, "{layout:?}");
    let stats = engine.stats(fs).unwrap();
    assert!(
        stats.stored_bytes < (1 << 20) + 11 * 4096,
        "only the 10 new blocks are stored besides the big file: {stats:?}"
    );
    assert_eq!(stats.face.piece_entries, 4 * 64);
    assert_eq!(contents(&engine, fs, mixed_ino), mixed);
    assert_clean(&engine);

    // The big file goes: its second chunk (no piece referenced) is freed, the others stay.
    engine.remove(fs, ROOT, b"big", false).unwrap();
    assert_eq!(engine.stats(fs).unwrap().face.live_chunks, 3 + 10);
    assert_eq!(contents(&engine, fs, mixed_ino), mixed);
    assert_clean(&engine);
    // A copy of the freed chunk's data finds only stale entries: it is stored.
    let copy = big[(256 << 10)..(512 << 10)].to_vec();
    let copy_ino = file(&engine, fs, "copy", &copy);
    engine.read(fs, copy_ino, 4096, 4096).unwrap();
    let plan = dedup::plan(&engine, fs).unwrap();
    let report = dedup::execute(&engine, fs, &plan, Yield::Never).unwrap();
    assert_eq!(report.pieces_deduplicated, 0, "{report:?}");
    assert_eq!(report.chunks_stored, 64);
    assert_eq!(contents(&engine, fs, copy_ino), copy);
    assert_clean(&engine);
    // Compaction removes the entries of the freed chunk that the lookups left.
    engine.compact(false).unwrap();
    assert_eq!(engine.stats(fs).unwrap().face.piece_entries, 3 * 64);
    assert_eq!(contents(&engine, fs, mixed_ino), mixed);
    assert_eq!(contents(&engine, fs, copy_ino), copy);
    assert_clean(&engine);
}

/// Goal: a batch whose small chunks lie in more big chunks than a run keeps decoded (and
/// than it reads per batch) still deduplicates, and reads back right. Method: a 24 MiB file
/// cut big (96 chunks), a file of one block from each of its chunks, twice over, cut small.
#[test]
fn pieces_from_many_chunks_in_one_batch() {
    let directory = tempfile::tempdir().unwrap();
    let repository = Repository::init(directory.path()).unwrap();
    let engine = open(&repository.face_storage("fs").unwrap());
    let options = FsOptions {
        min_evaluation_count: 1,
        ..eager()
    };
    let fs = engine
        .create_file_system("many", options, ROOT_CALLER)
        .unwrap();
    let big = bytes(9, 24 << 20);
    let mut scattered = Vec::new();
    for round in 0..2 {
        for chunk in 0..96 {
            let at = chunk * (256 << 10) + (round * 7 + 5) * 4096;
            scattered.extend_from_slice(&big[at..at + 4096]);
        }
    }
    let big_ino = file(&engine, fs, "big", &big);
    let scattered_ino = file(&engine, fs, "scattered", &scattered);
    for offset in (0..(24u64 << 20)).step_by(1 << 20) {
        engine.read(fs, big_ino, offset, 1 << 20).unwrap();
    }
    engine.read(fs, scattered_ino, 4096, 4096).unwrap();
    let plan = dedup::plan(&engine, fs).unwrap();
    let report = dedup::execute(&engine, fs, &plan, Yield::Never).unwrap();
    assert_eq!(report.pieces_deduplicated, 192, "{report:?}");
    assert_eq!(contents(&engine, fs, scattered_ino), scattered);
    assert_clean(&engine);
}

/// Goal: a sequentially read file references the runs it shares with another rank-1 file
/// where they are at least half a big chunk long (one chunk read each), stores the shorter
/// ones, and reads back right. Method: a 1 MiB file cut big; a second file of a 192 KiB run
/// and a 64 KiB run of it (off the 256 KiB grid) between new data, also read sequentially;
/// its layout after one run.
#[test]
fn rank_1_files_reference_long_runs_of_stored_chunks() {
    let directory = tempfile::tempdir().unwrap();
    let repository = Repository::init(directory.path()).unwrap();
    let engine = open(&repository.face_storage("fs").unwrap());
    let options = FsOptions {
        min_evaluation_count: 1,
        ..eager()
    };
    let fs = engine
        .create_file_system("runs", options, ROOT_CALLER)
        .unwrap();
    let first = bytes(10, 1 << 20);
    let mut second = bytes(11, 40 << 10);
    second.extend_from_slice(&first[(260 << 10)..(452 << 10)]);
    second.extend(bytes(12, 100 << 10));
    second.extend_from_slice(&first[(600 << 10)..(664 << 10)]);
    second.extend(bytes(13, 20 << 10));
    let first_ino = file(&engine, fs, "first", &first);
    let second_ino = file(&engine, fs, "second", &second);
    for ino in [first_ino, second_ino] {
        engine.read(fs, ino, 0, 1 << 20).unwrap();
    }
    let plan = dedup::plan(&engine, fs).unwrap();
    assert!(plan.files.iter().all(|file| file.chunking == Chunking::Big));
    let report = dedup::execute(&engine, fs, &plan, Yield::Never).unwrap();
    assert_eq!(report.pieces_deduplicated, 48, "{report:?}");
    let first_chunks: Vec<u64> = engine
        .file_layout(fs, first_ino)
        .unwrap()
        .iter()
        .map(|place| place.chunk)
        .collect();
    let layout = engine.file_layout(fs, second_ino).unwrap();
    let shape: Vec<(u64, u64, bool)> = layout
        .iter()
        .map(|place| {
            let shared = first_chunks.contains(&place.chunk);
            (place.offset >> 10, place.length >> 10, shared)
        })
        .collect();
    assert_eq!(
        shape,
        vec![
            (0, 40, false),
            (40, 192, true),
            (232, 24, false),
            // The short run stays in the file's own last chunk.
            (256, 160, false),
        ],
        "{layout:?}"
    );
    assert_eq!(contents(&engine, fs, second_ino), second);
    assert_clean(&engine);
}

/// Goal: a small file read sequentially (rank 1) is cut small, so its blocks find their
/// data inside big chunks; a file just over the bound is cut big. Method: a big file cut
/// big, then a 12 KiB file of two of its blocks around a new one and a 36 KiB file, both
/// read whole; ranks, chunkings and pieces after one run.
#[test]
fn small_files_read_sequentially_are_cut_small() {
    let directory = tempfile::tempdir().unwrap();
    let repository = Repository::init(directory.path()).unwrap();
    let engine = open(&repository.face_storage("fs").unwrap());
    let options = FsOptions {
        min_evaluation_count: 1,
        ..eager()
    };
    let fs = engine
        .create_file_system("small", options, ROOT_CALLER)
        .unwrap();
    let big = bytes(14, 1 << 20);
    let mut small = big[(40 << 10)..(44 << 10)].to_vec();
    small.extend(bytes(15, 4096));
    small.extend_from_slice(&big[(400 << 10)..(404 << 10)]);
    let big_ino = file(&engine, fs, "big", &big);
    let small_ino = file(&engine, fs, "small", &small);
    let over_ino = file(&engine, fs, "over", &bytes(16, 36 << 10));
    for ino in [big_ino, small_ino, over_ino] {
        engine.read(fs, ino, 0, 1 << 20).unwrap();
    }
    let plan = dedup::plan(&engine, fs).unwrap();
    let report = dedup::execute(&engine, fs, &plan, Yield::Never).unwrap();
    assert_eq!(report.pieces_deduplicated, 2, "{report:?}");
    let ranks = engine.ranks(fs).unwrap();
    let of = |ino| {
        let file = ranks.iter().find(|file| file.ino == ino).unwrap();
        (file.rank, file.chunking)
    };
    assert_eq!(of(small_ino), (1, Some(Chunking::Small)));
    assert_eq!(of(over_ino), (1, Some(Chunking::Big)));
    assert_eq!(of(big_ino), (1, Some(Chunking::Big)));
    assert_eq!(contents(&engine, fs, small_ino), small);
    assert_clean(&engine);
}
