//! Fault injection over every kind of file and area of the backup face: the catalog (its
//! header, its pages), each part of a container (header, record headers, chunk bytes,
//! trailer, footer), the segment index's pages and manifests, and the space reserve; each
//! flipped, truncated or deleted in turn. After each fault:
//!
//! 1. no restore returns wrong data with success;
//! 2. `check --read-data` names the damage (a finding whose object names the file, the
//!    container, or the segment index);
//! 3. `check --repair` brings back everything that was intact: afterwards a check finds
//!    nothing but recorded losses, every backup restores byte for byte or fails as a
//!    recorded loss, and what failed is exactly what the report lists as lost (and nothing
//!    when the fault hit no chunk's bytes).
//!
//! Deterministic (the seed picks the bytes; `ONECOPY_FAULT_SEED=N` runs another seed) and a
//! few seconds long.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use common::*;
use onecopy_backup::{
    BackupError, BackupSource, BackupStore, CheckOptions, CreateOptions, DedupMode, DeleteMethod,
    ExitStatus, FaceReport, FindingKind, OpenOptions, RestoreTarget,
};
use onecopy_core::storage::{CrashMode, SimulatedStorage, Storage};

const READ_DATA: CheckOptions = CheckOptions {
    read_data: true,
    repair: false,
};
const REPAIR: CheckOptions = CheckOptions {
    read_data: true,
    repair: true,
};

/// What each backup holds: a directory's files or an image's bytes.
#[derive(Clone)]
enum Expected {
    Directory(BTreeMap<String, Vec<u8>>),
    Image(Vec<u8>),
}

struct Reference {
    storage: SimulatedStorage,
    backups: BTreeMap<(String, u32), Expected>,
}

fn write_tree(root: &Path, files: &BTreeMap<String, Vec<u8>>) {
    if root.exists() {
        std::fs::remove_dir_all(root).unwrap();
    }
    for (name, data) in files {
        let path = root.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, data).unwrap();
    }
}

/// A store with two directory backups (the first reverse-deduplicated against the second)
/// and three image versions of which the second is deleted, all synced.
fn reference() -> Reference {
    let storage = SimulatedStorage::new();
    let shared: Arc<dyn Storage> = Arc::new(storage.clone());
    let mut store = open(Arc::clone(&shared), DedupMode::Revdedup);
    let mut backups = BTreeMap::new();
    let mut random = Random(7);
    let mut files = BTreeMap::new();
    for (index, name) in ["a", "dir/b", "dir/c", "d"].iter().enumerate() {
        let mut data = vec![0u8; 9_000 + index * 17_000];
        random.fill(&mut data);
        files.insert(name.to_string(), data);
    }
    let source = tempfile::tempdir().unwrap();
    for version in 1..=2u32 {
        if version == 2 {
            let data = files.get_mut("dir/b").unwrap();
            random.fill(&mut data[100..3000]);
            files.insert("e".to_string(), vec![b'e'; 5000]);
        }
        write_tree(source.path(), &files);
        store
            .create_backup(
                "home",
                BackupSource::Directory(source.path().to_path_buf()),
                CreateOptions::default(),
            )
            .unwrap();
        backups.insert(
            ("home".to_string(), version),
            Expected::Directory(files.clone()),
        );
    }
    let mut image = first_image(&mut random, 180 << 10);
    for version in 1..=3u32 {
        if version > 1 {
            image = next_image(&mut random, &image);
        }
        backup_bytes(&mut store, "vm", &image, false);
        backups.insert(("vm".to_string(), version), Expected::Image(image.clone()));
    }
    store
        .delete("vm", 2, Some(DeleteMethod::Timestamp))
        .unwrap();
    backups.remove(&("vm".to_string(), 2));
    assert_check_ok(&mut store);
    drop(store);
    Reference { storage, backups }
}

/// One fault: what to do to which file, and what a check must name.
#[derive(Clone, Debug)]
struct Fault {
    label: String,
    file: String,
    action: Action,
    /// Text a finding's object must contain.
    names: String,
    /// True when the fault touches no chunk's bytes: nothing may be lost.
    keeps_data: bool,
    /// True when the fault may be harmless (bytes nothing reads): a clean check is allowed
    /// if every restore is exact.
    may_be_harmless: bool,
    /// True when no repair can bring the backups back (the catalog's pages): the check must
    /// still name the damage and no restore may return wrong data.
    unrepairable: bool,
}

#[derive(Clone, Debug)]
enum Action {
    Flip { offset: u64, mask: u8 },
    Truncate { length: u64 },
    Delete,
}

fn apply(storage: &Arc<dyn Storage>, fault: &Fault) {
    match fault.action {
        Action::Flip { offset, mask } => flip_byte(storage, &fault.file, offset, mask),
        Action::Truncate { length } => storage
            .open(&fault.file, false)
            .unwrap()
            .set_len(length)
            .unwrap(),
        Action::Delete => storage.remove(&fault.file).unwrap(),
    }
}

fn file_length(storage: &Arc<dyn Storage>, name: &str) -> u64 {
    storage.open(name, false).unwrap().len().unwrap()
}

/// Every fault of the suite, the offsets drawn from `random`.
fn faults(storage: &Arc<dyn Storage>, random: &mut Random) -> Vec<Fault> {
    let mut faults = Vec::new();
    let mut add = |label: String,
                   file: &str,
                   action: Action,
                   names: &str,
                   keeps_data: bool,
                   may_be_harmless: bool,
                   unrepairable: bool| {
        faults.push(Fault {
            label,
            file: file.to_string(),
            action,
            names: names.to_string(),
            keeps_data,
            may_be_harmless,
            unrepairable,
        });
    };
    let catalog = "catalog.redb";
    let catalog_length = file_length(storage, catalog);
    for _ in 0..3 {
        let offset = random.below(320);
        // The region counts (bytes 24-32) are outside every checksum; redb recomputes them
        // from the file's length, so a change that makes the file look longer goes unnoticed
        // and harms nothing.
        let region_counts = (24..32).contains(&offset);
        add(
            format!("catalog header byte {offset}"),
            catalog,
            Action::Flip {
                offset,
                mask: 1 << random.below(8),
            },
            "catalog.redb",
            true,
            region_counts,
            false,
        );
    }
    for _ in 0..3 {
        let offset = 4096 + random.below(catalog_length - 4096);
        add(
            format!("catalog page byte {offset}"),
            catalog,
            Action::Flip { offset, mask: 0x10 },
            "catalog.redb",
            true,
            true,
            true,
        );
    }
    add(
        "catalog truncated".into(),
        catalog,
        Action::Truncate {
            length: catalog_length / 2,
        },
        "catalog.redb",
        true,
        false,
        true,
    );
    add(
        "catalog deleted".into(),
        catalog,
        Action::Delete,
        "catalog.redb",
        true,
        false,
        true,
    );
    let containers = container_files(storage);
    let picked = [
        containers[0].clone(),
        containers[containers.len() / 2].clone(),
        containers[containers.len() - 1].clone(),
    ];
    for name in &picked {
        let id = name.rsplit('/').next().unwrap().to_string();
        let length = file_length(storage, name);
        let records = container_records(storage, name);
        let record = records[random.below(records.len() as u64) as usize];
        let trailer_start = records
            .last()
            .map_or(64, |last| last.stored + last.stored_bytes);
        let header_byte = [random.below(8), 16 + random.below(8)][random.below(2) as usize];
        let cases = [
            (
                "header",
                Action::Flip {
                    offset: header_byte,
                    mask: 0x02,
                },
                true,
            ),
            (
                "record header",
                Action::Flip {
                    offset: record.header + random.below(44),
                    mask: 0x01,
                },
                true,
            ),
            (
                "chunk bytes",
                Action::Flip {
                    offset: record.stored + random.below(record.stored_bytes),
                    mask: 0x80,
                },
                false,
            ),
            (
                "trailer",
                Action::Flip {
                    offset: trailer_start + random.below(length - 32 - trailer_start),
                    mask: 0x04,
                },
                true,
            ),
            (
                "footer",
                Action::Flip {
                    offset: length - 32 + random.below(24),
                    mask: 0x08,
                },
                true,
            ),
            (
                "truncated",
                Action::Truncate {
                    length: length * 2 / 3,
                },
                false,
            ),
            ("deleted", Action::Delete, false),
        ];
        for (what, action, keeps_data) in cases {
            add(
                format!("container {id} {what}"),
                name,
                action,
                &id,
                keeps_data,
                false,
                false,
            );
        }
    }
    let pages = "meta/pages";
    let slots = file_length(storage, pages) / 4096;
    for _ in 0..3 {
        let offset = random.below(slots) * 4096 + random.below(4096);
        add(
            format!("segment index page byte {offset}"),
            pages,
            Action::Flip { offset, mask: 0x40 },
            "segment index",
            true,
            true,
            false,
        );
    }
    add(
        "segment index pages deleted".into(),
        pages,
        Action::Delete,
        "segment index",
        true,
        false,
        false,
    );
    for manifest in ["meta/manifest.0", "meta/manifest.1"] {
        let length = file_length(storage, manifest);
        add(
            format!("{manifest} byte"),
            manifest,
            Action::Flip {
                offset: random.below(length),
                mask: 0x20,
            },
            manifest,
            true,
            false,
            false,
        );
        add(
            format!("{manifest} truncated"),
            manifest,
            Action::Truncate { length: length / 2 },
            manifest,
            true,
            false,
            false,
        );
        add(
            format!("{manifest} deleted"),
            manifest,
            Action::Delete,
            "segment index",
            true,
            false,
            false,
        );
    }
    add(
        "reserve deleted".into(),
        "reserve",
        Action::Delete,
        "reserve",
        true,
        true,
        false,
    );
    faults
}

/// A failed restore: the error and the files a directory restore left out.
type Failure = (BackupError, Vec<String>);

/// Restores every backup; returns, per backup, `None` when it restored exactly and the error
/// otherwise. Panics on a restore that succeeds with wrong data.
fn restore_all(
    storage: &Arc<dyn Storage>,
    reference: &Reference,
    label: &str,
) -> BTreeMap<(String, u32), Option<Failure>> {
    let mut outcomes = BTreeMap::new();
    let store = BackupStore::open(
        Arc::clone(storage),
        OpenOptions {
            read_only: true,
            runtime: small_runtime(),
            ..OpenOptions::default()
        },
    );
    for ((series, version), expected) in &reference.backups {
        let store = match &store {
            Ok(store) => store,
            Err(error) => {
                let error = BackupError::InvalidArgument(error.to_string());
                outcomes.insert((series.clone(), *version), Some((error, Vec::new())));
                continue;
            }
        };
        let outcome = match expected {
            Expected::Image(bytes) => {
                let buffer = SharedBuffer::default();
                match store.restore(
                    series,
                    Some(*version),
                    RestoreTarget::Writer(Box::new(buffer.clone())),
                ) {
                    Ok(_) => {
                        assert!(
                            *buffer.0.lock().unwrap() == *bytes,
                            "{label}: {series}@{version} restored wrong bytes"
                        );
                        None
                    }
                    Err(error) => Some((error, Vec::new())),
                }
            }
            Expected::Directory(files) => {
                let target = tempfile::tempdir().unwrap();
                let result = store.restore(
                    series,
                    Some(*version),
                    RestoreTarget::Directory(target.path().to_path_buf()),
                );
                // Whatever was restored must be right, even when the restore failed.
                let mut missing = Vec::new();
                for (name, data) in files {
                    match std::fs::read(target.path().join(name)) {
                        Ok(restored) => assert!(
                            restored == *data || result.is_err(),
                            "{label}: {series}@{version}: {name} restored wrong bytes"
                        ),
                        Err(_) => missing.push(name.clone()),
                    }
                }
                match result {
                    Ok(_) => {
                        assert!(
                            missing.is_empty(),
                            "{label}: {series}@{version} misses {missing:?}"
                        );
                        None
                    }
                    Err(error) => {
                        if matches!(error, BackupError::Lost { .. }) {
                            // A lost-data failure restores the rest exactly.
                            for (name, data) in files {
                                if let Ok(restored) = std::fs::read(target.path().join(name)) {
                                    assert!(
                                        restored == *data,
                                        "{label}: {series}@{version}: {name} wrong after a loss"
                                    );
                                }
                            }
                        }
                        Some((error, missing))
                    }
                }
            }
        };
        outcomes.insert((series.clone(), *version), outcome);
    }
    outcomes
}

fn names_damage(report: &FaceReport, names: &str) -> bool {
    report
        .findings
        .iter()
        .any(|finding| finding.object.contains(names))
}

/// Goal: see the module documentation. Method: every fault of [`faults`] on a fresh copy of
/// one reference store.
#[test]
fn every_fault_is_found_and_repaired() {
    let reference = reference();
    let snapshot: Arc<dyn Storage> = Arc::new(reference.storage.crash(CrashMode::Clean));
    let seed = std::env::var("ONECOPY_FAULT_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or(2024);
    let mut random = Random(seed);
    let faults = faults(&snapshot, &mut random);
    assert!(faults.len() > 30);
    for fault in &faults {
        let storage: Arc<dyn Storage> = Arc::new(reference.storage.crash(CrashMode::Clean));
        apply(&storage, fault);
        let label = &fault.label;
        let before = restore_all(&storage, &reference, label);
        let report = BackupStore::check_at(Arc::clone(&storage), READ_DATA)
            .unwrap_or_else(|error| panic!("{label}: check failed to run: {error}"));
        if report.findings.is_empty() {
            assert!(fault.may_be_harmless, "{label}: nothing found: {report:#?}");
            assert!(
                before.values().all(Option::is_none),
                "{label}: a clean check with failing restores"
            );
            continue;
        }
        assert!(
            names_damage(&report, &fault.names),
            "{label}: no finding names {}: {report:#?}",
            fault.names
        );
        let repaired = BackupStore::check_at(Arc::clone(&storage), REPAIR)
            .unwrap_or_else(|error| panic!("{label}: repair failed to run: {error}"));
        if fault.unrepairable && repaired.status() == ExitStatus::Problems {
            assert!(
                names_damage(&repaired, &fault.names),
                "{label}: {repaired:#?}"
            );
            continue;
        }
        assert_ne!(
            repaired.status(),
            ExitStatus::Problems,
            "{label}: {repaired:#?}"
        );
        let after = BackupStore::check_at(Arc::clone(&storage), READ_DATA).unwrap();
        assert!(
            after
                .findings
                .iter()
                .all(|finding| finding.kind == FindingKind::Lost),
            "{label}: after the repair: {after:#?}"
        );
        let lost: Vec<String> = after
            .findings
            .iter()
            .flat_map(|finding| finding.lost.clone())
            .collect();
        if fault.keeps_data {
            assert!(
                lost.is_empty(),
                "{label}: intact data reported lost: {lost:?}"
            );
        }
        let outcomes = restore_all(&storage, &reference, label);
        for ((series, version), outcome) in &outcomes {
            let prefix = format!("backup {series}@{version}: ");
            let named: Vec<&String> = lost
                .iter()
                .filter(|line| line.starts_with(&prefix))
                .collect();
            match outcome {
                None => assert!(
                    named.is_empty(),
                    "{label}: {prefix} restores but is listed lost"
                ),
                Some((BackupError::Lost { .. }, missing)) => {
                    assert!(
                        !named.is_empty(),
                        "{label}: {prefix} fails but is not listed lost"
                    );
                    let tree_lost = named
                        .iter()
                        .any(|line| line.starts_with(&format!("{prefix}its directory tree")));
                    for name in missing.iter().filter(|_| !tree_lost) {
                        let line = format!("{prefix}file {name}");
                        assert!(
                            named.iter().any(|named| **named == line),
                            "{label}: {name} is missing but not listed: {named:?}"
                        );
                    }
                }
                Some((error, _)) => panic!("{label}: {prefix} fails after the repair: {error}"),
            }
        }
    }
}
