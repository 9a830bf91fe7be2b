//! Damage to the face's metadata, injected on the simulated storage, against a reference
//! model of what must survive: a flipped byte in a journal record (refused by a writable
//! open, reported by a check, salvaged by a repair that marks exactly the damaged record's
//! bytes lost), a journal cut short, a damaged manifest (nothing lost), and a damaged record
//! that created a file (the file survives in /lost+found).

use std::collections::BTreeMap;
use std::sync::Arc;

use onecopy_core::check::{CheckOptions, ExitStatus, FaceReport, FindingKind};
use onecopy_core::journal::{Journal, JournalScan};
use onecopy_core::storage::{CrashMode, SimulatedStorage, Storage};
use onecopy_fs::engine::{AttributeChanges, Caller, NewNode, LOST_AND_FOUND};
use onecopy_fs::node::{Kind, ROOT};
use onecopy_fs::summary::{RangeSet, RecordSummary};
use onecopy_fs::{FsEngine, FsError, FsId, FsOptions, OpenMode, RuntimeOptions};

const ROOT_CALLER: Caller = Caller { uid: 0, gid: 0 };
const FILES: usize = 4;

fn bytes(seed: u64, length: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..length)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            // Never zero: an all-zero write would be a hole, which changes no mapping.
            (state as u8) | 1
        })
        .collect()
}

fn open(storage: &SimulatedStorage, mode: OpenMode) -> onecopy_fs::Result<Arc<FsEngine>> {
    let storage: Arc<dyn Storage> = Arc::new(storage.clone());
    let runtime = RuntimeOptions {
        // No checkpoint during the operations (their records hold no data, only metadata):
        // they all stay in one journal.
        checkpoint_journal_bytes: 4 << 20,
        ..RuntimeOptions::default()
    };
    FsEngine::open(storage, runtime, mode)
}

fn new_node(kind: Kind) -> NewNode {
    NewNode {
        kind,
        mode: 0o700,
        rdev: 0,
        target: Vec::new(),
    }
}

/// A change of one file, one journal record.
#[derive(Clone, Copy, Debug)]
enum Operation {
    Write {
        offset: u64,
        length: usize,
        seed: u64,
    },
    Truncate {
        size: u64,
    },
}

/// What the operations did: the files' contents after each, and the byte range each changed.
struct History {
    /// The durable image after the last fsync and a crash.
    storage: SimulatedStorage,
    fs: FsId,
    inos: Vec<u64>,
    /// Contents of every file before operation i (and, at the end, after all).
    states: Vec<Vec<Vec<u8>>>,
    /// The file and byte range operation i changed (empty for a truncation to the same size).
    changed: Vec<(usize, u64, u64)>,
}

/// Creates the files, checkpoints, then runs `count` random operations, each its own
/// journal record, and fsyncs.
fn history(seed: u64, count: usize) -> History {
    let storage = SimulatedStorage::new();
    let engine = open(&storage, OpenMode::ReadWrite).unwrap();
    let fs = engine
        .create_file_system("salvage", FsOptions::default(), ROOT_CALLER)
        .unwrap();
    let mut files = Vec::new();
    let mut inos = Vec::new();
    for index in 0..FILES {
        let name = format!("f{index}");
        let ino = engine
            .create_node(fs, ROOT, name.as_bytes(), new_node(Kind::File), ROOT_CALLER)
            .unwrap()
            .ino;
        let content = bytes(seed * 100 + index as u64, 150_000 + index * 10_000);
        engine.write(fs, ino, 0, &content).unwrap();
        files.push(content);
        inos.push(ino);
    }
    engine.checkpoint().unwrap();
    let mut random = seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1;
    let mut next = |bound: u64| {
        random ^= random << 13;
        random ^= random >> 7;
        random ^= random << 17;
        random % bound
    };
    let mut states = Vec::new();
    let mut changed = Vec::new();
    for step in 0..count {
        states.push(files.clone());
        let file = next(FILES as u64) as usize;
        let size = files[file].len() as u64;
        let operation = if next(5) == 0 {
            Operation::Truncate {
                size: next(size + 100_000),
            }
        } else {
            Operation::Write {
                offset: next(size + 50_000),
                length: 1 + next(100_000) as usize,
                seed: seed * 1000 + step as u64,
            }
        };
        let content = &mut files[file];
        match operation {
            Operation::Write {
                offset,
                length,
                seed,
            } => {
                let data = bytes(seed, length);
                engine.write(fs, inos[file], offset, &data).unwrap();
                let end = offset as usize + length;
                if content.len() < end {
                    content.resize(end, 0);
                }
                content[offset as usize..end].copy_from_slice(&data);
                // From the old end when the write starts past it (the gap became a hole).
                changed.push((file, offset.min(size), end as u64));
            }
            Operation::Truncate { size: new_size } => {
                let changes = AttributeChanges {
                    size: Some(new_size),
                    ..AttributeChanges::default()
                };
                engine.setattr(fs, inos[file], changes).unwrap();
                content.resize(new_size as usize, 0);
                changed.push((file, new_size.min(size), new_size.max(size)));
            }
        }
    }
    states.push(files);
    engine.flush().unwrap();
    let storage = storage.crash(CrashMode::Clean);
    History {
        storage,
        fs,
        inos,
        states,
        changed,
    }
}

/// The journal holding the operations' records, scanned.
fn scan_journal(storage: &SimulatedStorage) -> (u64, JournalScan) {
    let generations = Journal::generations(storage, "meta").unwrap();
    for &generation in generations.iter().rev() {
        let scan = Journal::scan(storage, "meta", generation).unwrap();
        if !scan.records.is_empty() {
            return (generation, scan);
        }
    }
    panic!("no journal holds records: {generations:?}");
}

fn flip(storage: &SimulatedStorage, name: &str, offset: u64) {
    let file = storage.open(name, false).unwrap();
    let mut byte = [0u8; 1];
    file.read_at(offset, &mut byte).unwrap();
    byte[0] ^= 0x5a;
    file.write_at(offset, &byte).unwrap();
    file.sync_data().unwrap();
}

/// Lost ranges by file, from `report`'s findings (`... bytes A..B, C..D`).
fn lost_ranges(report: &FaceReport, inos: &[u64]) -> BTreeMap<usize, Vec<(u64, u64)>> {
    let mut lost: BTreeMap<usize, Vec<(u64, u64)>> = BTreeMap::new();
    for finding in &report.findings {
        for entry in &finding.lost {
            let Some((object, ranges)) = entry.split_once(" bytes ") else {
                continue;
            };
            let Some(file) = inos
                .iter()
                .position(|ino| object.ends_with(&format!("(inode {ino})")))
            else {
                continue;
            };
            for range in ranges.split(", ") {
                let (start, end) = range.split_once("..").unwrap();
                lost.entry(file)
                    .or_default()
                    .push((start.parse().unwrap(), end.parse().unwrap()));
            }
        }
    }
    lost
}

/// What a repair must mark lost when operation `victim`'s record is damaged: its range,
/// less what the later operations on the same file changed again.
fn expected_lost(
    history: &History,
    victim: usize,
    last: usize,
) -> BTreeMap<usize, Vec<(u64, u64)>> {
    let (file, start, end) = history.changed[victim];
    let mut ranges = RangeSet::default();
    ranges.add(start, end);
    for &(other, start, end) in &history.changed[victim + 1..last] {
        if other == file {
            ranges.remove(start, end);
        }
    }
    let mut lost = BTreeMap::new();
    if !ranges.is_empty() {
        lost.insert(file, ranges.iter().collect());
    }
    lost
}

/// Every file reads as `expected`, except `lost` ranges, which fail naming their loss;
/// a file longer than expected is longer only by lost bytes.
fn assert_files(
    engine: &FsEngine,
    history: &History,
    expected: &[Vec<u8>],
    lost: &BTreeMap<usize, Vec<(u64, u64)>>,
    context: &str,
) {
    for (file, content) in expected.iter().enumerate() {
        let ino = history.inos[file];
        let size = engine.getattr(history.fs, ino).unwrap().attributes.size;
        let mut lost_here = RangeSet::default();
        for &(start, end) in lost.get(&file).into_iter().flatten() {
            lost_here.add(start, end);
        }
        assert!(
            size >= content.len() as u64,
            "{context}: f{file} is {size} bytes, {} expected",
            content.len()
        );
        if size > content.len() as u64 {
            let mut beyond = RangeSet::default();
            beyond.add(content.len() as u64, size);
            for (start, end) in lost_here.iter() {
                beyond.remove(start, end);
            }
            assert!(
                beyond.is_empty(),
                "{context}: f{file} is {size} bytes, {} expected, and the rest is not lost",
                content.len()
            );
        }
        // Readable pieces between lost ranges, and the lost ranges themselves.
        let mut at = 0u64;
        let mut pieces: Vec<(u64, u64, bool)> = Vec::new();
        for (start, end) in lost_here.iter() {
            if start > at {
                pieces.push((at, start.min(size), false));
            }
            pieces.push((start, end.min(size), true));
            at = end;
        }
        if at < size {
            pieces.push((at, size, false));
        }
        for (start, end, is_lost) in pieces.into_iter().filter(|(s, e, _)| s < e) {
            let mut offset = start;
            while offset < end {
                let length = (end - offset).min(1 << 20) as u32;
                let read = engine.read(history.fs, ino, offset, length);
                if is_lost {
                    match read {
                        Err(FsError::Lost(what)) => {
                            assert!(what.contains(&format!("inode {ino}")), "{what}")
                        }
                        other => panic!(
                            "{context}: f{file} bytes {offset}.. are lost but read {:?}",
                            other.map(|data| data.len())
                        ),
                    }
                } else {
                    let data = read.unwrap_or_else(|error| {
                        panic!("{context}: f{file} bytes {offset}..{end}: {error}")
                    });
                    assert!(
                        data[..] == content[offset as usize..offset as usize + data.len()],
                        "{context}: f{file} bytes {offset}..{end} differ from the model"
                    );
                }
                offset += length as u64;
            }
        }
    }
}

/// Goal: a flipped byte in any journal record is refused by a writable open (naming the
/// journal, the offset and what the record changed), reported by a check (exit status 1),
/// and salvaged by a repair that marks exactly the damaged record's bytes lost (less what
/// later records wrote again) and keeps everything else as the model has it; the lost
/// bytes read EIO until written again, the next check reports them (exit 3), and the file
/// system mounts again. Method: random writes and truncations of four files, one record
/// each; for several seeds and several victims, a flipped byte in the victim's payload (or
/// header).
#[test]
fn flipped_byte_in_a_journal_record_is_salvaged() {
    let mut losses = 0;
    for seed in 1..=3u64 {
        let count = 24;
        let history = history(seed, count);
        let (generation, scan) = scan_journal(&history.storage);
        assert_eq!(scan.records.len(), count, "one record per operation");
        let journal = Journal::file_name("meta", generation);
        // A byte of the payload, and for one victim a byte of the header (the tag is then
        // read from the footer).
        let victims = [0, count / 3, count / 2, count - 2, count - 1]
            .into_iter()
            .map(|victim| (victim, 32 + 9))
            .chain([(count / 2, 5)]);
        for (victim, at) in victims {
            let context = format!("seed {seed}, record {victim}, byte {at}");
            let storage = history.storage.crash(CrashMode::Clean);
            let record = scan.records[victim];
            flip(&storage, &journal, record.offset + at);

            let refused = open(&storage, OpenMode::ReadWrite).unwrap_err().to_string();
            assert!(
                refused.contains(&format!("{journal} at byte {}", record.offset))
                    && refused.contains("check --repair"),
                "{context}: {refused}"
            );
            let looked = open(&storage, OpenMode::ReadOnly).unwrap();
            let report = looked.check(CheckOptions::default()).unwrap();
            assert_eq!(
                report.status(),
                ExitStatus::Problems,
                "{context}: {report:#?}"
            );
            assert!(
                report
                    .findings
                    .iter()
                    .any(|finding| finding.kind == FindingKind::Damage
                        && finding
                            .object
                            .contains(&format!("at byte {}", record.offset))),
                "{context}: {report:#?}"
            );
            drop(looked);

            let expected = expected_lost(&history, victim, count);
            losses += expected.len();
            let repaired = open(&storage, OpenMode::Repair).unwrap();
            let report = repaired
                .check(CheckOptions {
                    repair: true,
                    read_data: true,
                })
                .unwrap();
            assert_eq!(
                lost_ranges(&report, &history.inos),
                expected,
                "{context}: {report:#?}"
            );
            // A record that changed no bytes (a truncation to the same size) lost the
            // file's times: reported as lost too, but nothing is recorded lost in the file.
            let (_, start, end) = history.changed[victim];
            let status = if expected.is_empty() {
                ExitStatus::Clean
            } else {
                ExitStatus::DataLost
            };
            let repair_status = if start == end {
                ExitStatus::DataLost
            } else {
                status
            };
            assert_eq!(report.status(), repair_status, "{context}: {report:#?}");
            drop(repaired);

            let engine = open(&storage, OpenMode::ReadWrite).unwrap();
            assert_files(
                &engine,
                &history,
                &history.states[count],
                &expected,
                &context,
            );
            let report = engine.check(CheckOptions::default()).unwrap();
            assert_eq!(report.status(), status, "{context}: {report:#?}");
            assert_eq!(lost_ranges(&report, &history.inos), expected, "{context}");
            // Written again, the lost bytes read, and nothing is lost any more.
            for (&file, ranges) in &expected {
                for &(start, end) in ranges {
                    let data = bytes(start, (end - start) as usize);
                    engine
                        .write(history.fs, history.inos[file], start, &data)
                        .unwrap();
                    let read = engine
                        .read(
                            history.fs,
                            history.inos[file],
                            start,
                            data.len().min(4096) as u32,
                        )
                        .unwrap();
                    assert_eq!(read[..], data[..read.len()], "{context}");
                }
            }
            let report = engine.check(CheckOptions::default()).unwrap();
            assert_eq!(report.status(), ExitStatus::Clean, "{context}: {report:#?}");
        }
    }
    assert!(losses >= 8, "most victims lost bytes: {losses}");
}

/// Goal: a journal cut short loses the record at the cut (its bytes, named by its header's
/// tag) and whatever followed (reported as unknown); the rest is the model before the cut. A
/// deleted journal loses every change since the checkpoint (reported as unknown). Method:
/// truncate the journal file inside a record, then repair and compare; then delete it.
#[test]
fn truncated_journal_is_salvaged_up_to_the_cut() {
    let count = 16;
    let history = history(7, count);
    let (generation, scan) = scan_journal(&history.storage);
    let journal = Journal::file_name("meta", generation);
    let victim = count / 2;
    let storage = history.storage.crash(CrashMode::Clean);
    let file = storage.open(&journal, false).unwrap();
    file.set_len(scan.records[victim].offset + 40).unwrap();
    file.sync_data().unwrap();
    drop(file);

    assert!(open(&storage, OpenMode::ReadWrite).is_err());
    let repaired = open(&storage, OpenMode::Repair).unwrap();
    let report = repaired
        .check(CheckOptions {
            repair: true,
            read_data: false,
        })
        .unwrap();
    assert_eq!(report.status(), ExitStatus::DataLost, "{report:#?}");
    assert!(
        report
            .findings
            .iter()
            .flat_map(|finding| &finding.lost)
            .any(|lost| lost.contains("files unknown")),
        "{report:#?}"
    );
    let expected = expected_lost(&history, victim, victim + 1);
    assert_eq!(lost_ranges(&report, &history.inos), expected, "{report:#?}");
    drop(repaired);
    let engine = open(&storage, OpenMode::ReadWrite).unwrap();
    assert_files(
        &engine,
        &history,
        &history.states[victim],
        &expected,
        "truncated journal",
    );
    drop(engine);

    // A deleted journal loses everything since the checkpoint, and says so.
    let storage = history.storage.crash(CrashMode::Clean);
    storage.remove(&journal).unwrap();
    storage.sync_directory("meta").unwrap();
    let refused = open(&storage, OpenMode::ReadWrite).unwrap_err().to_string();
    assert!(refused.contains("missing"), "{refused}");
    let report = open(&storage, OpenMode::Repair)
        .unwrap()
        .check(CheckOptions::default())
        .unwrap();
    assert_eq!(report.status(), ExitStatus::DataLost, "{report:#?}");
    let engine = open(&storage, OpenMode::ReadWrite).unwrap();
    assert_files(
        &engine,
        &history,
        &history.states[0],
        &BTreeMap::new(),
        "deleted journal",
    );
}

/// Goal: a damaged newest manifest loses nothing: the face falls back to the older one and
/// the journals a checkpoint keeps, a check reports the damage, and a writable open serves
/// every file as the model has it. Method: flip a byte in the body of the manifest with the
/// higher sequence number.
#[test]
fn damaged_manifest_falls_back_without_loss() {
    let count = 12;
    let history = history(11, count);
    let storage = history.storage.crash(CrashMode::Clean);
    let sequence = |name: &str| {
        let file = storage.open(name, false).unwrap();
        let mut header = [0u8; 16];
        file.read_at(0, &mut header).unwrap();
        assert_eq!(&header[..8], b"OCPAGES1");
        u64::from_le_bytes(header[8..16].try_into().unwrap())
    };
    let newest = ["meta/manifest.0", "meta/manifest.1"]
        .into_iter()
        .max_by_key(|name| sequence(name))
        .unwrap();
    flip(&storage, newest, 40);

    let looked = open(&storage, OpenMode::ReadOnly).unwrap();
    let report = looked.check(CheckOptions::default()).unwrap();
    let finding = report
        .findings
        .iter()
        .find(|finding| finding.object.ends_with(newest.trim_start_matches("meta/")))
        .unwrap_or_else(|| panic!("{report:#?}"));
    assert!(finding.detail.contains("nothing is lost"), "{finding:?}");
    assert!(finding.lost.is_empty());
    drop(looked);
    let engine = open(&storage, OpenMode::ReadWrite).unwrap();
    assert_files(
        &engine,
        &history,
        &history.states[count],
        &BTreeMap::new(),
        "damaged manifest",
    );
    let report = engine.check(CheckOptions::default()).unwrap();
    assert_eq!(report.status(), ExitStatus::Clean, "{report:#?}");
}

/// Goal: when the damaged record is the one that created a file, the file's later writes
/// are still applied and the file survives, named `/lost+found/#INODE` (its name is what was
/// lost, and the repair says so); the directory it was in is consistent. Method: mkdir,
/// create, write, fsync; flip a byte in the create's record; repair; read the file back.
#[test]
fn damaged_create_keeps_the_file_in_lost_and_found() {
    let storage = SimulatedStorage::new();
    let engine = open(&storage, OpenMode::ReadWrite).unwrap();
    let fs = engine
        .create_file_system("names", FsOptions::default(), ROOT_CALLER)
        .unwrap();
    engine.checkpoint().unwrap();
    let directory = engine
        .create_node(fs, ROOT, b"d", new_node(Kind::Directory), ROOT_CALLER)
        .unwrap()
        .ino;
    let file = engine
        .create_node(fs, directory, b"x", new_node(Kind::File), ROOT_CALLER)
        .unwrap()
        .ino;
    let content = bytes(5, 300_000);
    engine.write(fs, file, 0, &content).unwrap();
    engine.flush().unwrap();
    drop(engine);
    let storage = storage.crash(CrashMode::Clean);
    let (generation, scan) = scan_journal(&storage);
    let create = scan
        .records
        .iter()
        .find(|record| {
            RecordSummary::of_tag(&record.tag)
                == RecordSummary::Entries {
                    fs,
                    parent: directory,
                    other_parent: 0,
                    ino: file,
                }
        })
        .expect("the create's record is tagged with its directory and inode");
    flip(
        &storage,
        &Journal::file_name("meta", generation),
        create.offset + 32 + 7,
    );

    let repaired = open(&storage, OpenMode::Repair).unwrap();
    let report = repaired
        .check(CheckOptions {
            repair: true,
            read_data: true,
        })
        .unwrap();
    assert_eq!(report.status(), ExitStatus::DataLost, "{report:#?}");
    let found = format!("/{}/#{file}", String::from_utf8_lossy(LOST_AND_FOUND));
    assert!(
        report
            .findings
            .iter()
            .any(|finding| finding.repair.as_deref() == Some(&format!("linked as {found}"))),
        "{report:#?}"
    );
    drop(repaired);
    let engine = open(&storage, OpenMode::ReadWrite).unwrap();
    let lost_and_found = engine.lookup(fs, ROOT, LOST_AND_FOUND).unwrap().ino;
    let named = engine
        .lookup(fs, lost_and_found, format!("#{file}").as_bytes())
        .unwrap();
    assert_eq!(named.ino, file);
    assert_eq!(named.attributes.nlink, 1);
    let mut read = Vec::new();
    while read.len() < content.len() {
        read.extend(engine.read(fs, file, read.len() as u64, 1 << 20).unwrap());
    }
    assert!(read == content, "the file's data survived");
    assert!(engine.lookup(fs, directory, b"x").is_err());
    assert_eq!(engine.getattr(fs, directory).unwrap().attributes.nlink, 2);
    let report = engine.check(CheckOptions::default()).unwrap();
    assert!(report.is_clean(), "{report:#?}");
}

/// Goal: a later record's range is exactly what it was when the record was written, even
/// where the damaged record's changes are missing: a truncation after a lost write clears
/// the old data the write had split off, so that extending the file again reads zeros there,
/// not stale bytes. Method: write a file, damage a write into its middle, truncate into that
/// write, extend; the repair keeps only the write's surviving part lost.
#[test]
fn later_truncation_clears_what_the_damaged_write_split() {
    let storage = SimulatedStorage::new();
    let engine = open(&storage, OpenMode::ReadWrite).unwrap();
    let fs = engine
        .create_file_system("split", FsOptions::default(), ROOT_CALLER)
        .unwrap();
    let ino = engine
        .create_node(fs, ROOT, b"f", new_node(Kind::File), ROOT_CALLER)
        .unwrap()
        .ino;
    let original = bytes(1, 400_000);
    engine.write(fs, ino, 0, &original).unwrap();
    engine.checkpoint().unwrap();
    let write = bytes(2, 100_000);
    engine.write(fs, ino, 100_000, &write).unwrap();
    for size in [120_000, 1_000_000] {
        let changes = AttributeChanges {
            size: Some(size),
            ..AttributeChanges::default()
        };
        engine.setattr(fs, ino, changes).unwrap();
    }
    engine.flush().unwrap();
    drop(engine);
    let storage = storage.crash(CrashMode::Clean);
    let (generation, scan) = scan_journal(&storage);
    assert_eq!(scan.records.len(), 3);
    flip(
        &storage,
        &Journal::file_name("meta", generation),
        scan.records[0].offset + 32 + 9,
    );
    let report = open(&storage, OpenMode::Repair)
        .unwrap()
        .check(CheckOptions::default())
        .unwrap();
    let expected = BTreeMap::from([(0, vec![(100_000, 120_000)])]);
    assert_eq!(lost_ranges(&report, &[ino]), expected, "{report:#?}");
    let engine = open(&storage, OpenMode::ReadWrite).unwrap();
    let mut model = original[..100_000].to_vec();
    model.extend_from_slice(&write[..20_000]);
    model.resize(1_000_000, 0);
    let history = History {
        storage,
        fs,
        inos: vec![ino],
        states: Vec::new(),
        changed: Vec::new(),
    };
    assert_files(&engine, &history, &[model], &expected, "split");
}
