//! `check` and `check --repair` on targeted damage: record headers, chunk bytes, copies
//! elsewhere, the segment index, leftovers, a catalog that does not open.

mod common;

use std::sync::Arc;

use common::*;
use onecopy_backup::{
    BackupError, BackupSource, BackupStore, CheckOptions, CreateOptions, DedupMode, ExitStatus,
    FindingKind, OpenOptions, RestoreTarget, StoreOptions,
};
use onecopy_core::storage::{CrashMode, LocalStorage, SimulatedStorage, Storage};

const READ_DATA: CheckOptions = CheckOptions {
    read_data: true,
    repair: false,
};
const REPAIR: CheckOptions = CheckOptions {
    read_data: true,
    repair: true,
};

/// Uncompressed store options, so that stored bytes are the data.
fn raw_options() -> StoreOptions {
    StoreOptions {
        compression_level: None,
        ..small_options(DedupMode::Revdedup)
    }
}

fn simulated() -> Arc<dyn Storage> {
    Arc::new(SimulatedStorage::new())
}

/// Opens an existing store for writing, with the options it was made with.
fn reopen(storage: &Arc<dyn Storage>) -> BackupStore {
    BackupStore::open(
        Arc::clone(storage),
        OpenOptions {
            runtime: small_runtime(),
            ..OpenOptions::default()
        },
    )
    .unwrap()
}

fn random_bytes(seed: u64, bytes: usize) -> Vec<u8> {
    let mut data = vec![0u8; bytes];
    Random(seed).fill(&mut data);
    data
}

/// Goal: a changed fingerprint or length field in a sealed container's record header is
/// reported (naming the container and the chunk) and repaired without loss, although
/// restores never read record headers. Method: flip a byte of the fingerprint, then of the
/// stored size, of the first record; check with --read-data, repair, check again.
#[test]
fn record_header_damage_is_found_and_repaired() {
    for field_offset in [5u64, 33] {
        let storage = simulated();
        let mut store = open_with(Arc::clone(&storage), raw_options());
        let image = random_bytes(1, 150 << 10);
        backup_bytes(&mut store, "vm", &image, true);
        let name = container_files(&storage)[0].clone();
        let first = container_records(&storage, &name)[0];
        flip_byte(&storage, &name, first.header + field_offset, 0x01);
        assert_eq!(restore_bytes(&store, "vm", Some(1)), image);

        let report = store.check(READ_DATA).unwrap();
        assert_eq!(report.status(), ExitStatus::Problems, "{report:#?}");
        let id = name.rsplit('/').next().unwrap();
        assert!(
            report
                .findings
                .iter()
                .any(|finding| finding.kind == FindingKind::Damage
                    && finding.object.contains(id)
                    && finding.detail.contains("record header")),
            "{report:#?}"
        );
        let repaired = store.check(REPAIR).unwrap();
        assert_eq!(repaired.status(), ExitStatus::Clean, "{repaired:#?}");
        assert!(repaired
            .findings
            .iter()
            .all(|finding| finding.lost.is_empty()));
        let again = store.check(READ_DATA).unwrap();
        assert!(again.findings.is_empty(), "{again:#?}");
        assert_eq!(restore_bytes(&store, "vm", Some(1)), image);
    }
}

/// Goal: a damaged chunk of a directory backup is reported, and after the repair it is a
/// recorded loss: the next check reports it as lost (exit 3), not as new damage; a restore
/// leaves out exactly the file whose bytes are lost, restores the rest byte for byte, and
/// fails naming the file. Method: three files, flip a byte of the first stored chunk (the
/// first file's first bytes).
#[test]
fn damaged_chunk_becomes_a_recorded_loss() {
    let source = tempfile::tempdir().unwrap();
    let files = [
        ("a", random_bytes(2, 40 << 10)),
        ("b", random_bytes(3, 40 << 10)),
        ("c", b"small".to_vec()),
    ];
    for (name, data) in &files {
        std::fs::write(source.path().join(name), data).unwrap();
    }
    let storage = simulated();
    let mut store = open_with(Arc::clone(&storage), raw_options());
    store
        .create_backup(
            "home",
            BackupSource::Directory(source.path().to_path_buf()),
            CreateOptions::default(),
        )
        .unwrap();
    let name = container_files(&storage)[0].clone();
    let first = container_records(&storage, &name)[0];
    flip_byte(&storage, &name, first.stored + 10, 0x40);

    let report = store.check(Default::default()).unwrap();
    assert!(
        report.is_clean(),
        "a metadata check reads no chunk: {report:#?}"
    );
    let report = store.check(READ_DATA).unwrap();
    assert_eq!(report.status(), ExitStatus::Problems);
    let damaged = report
        .findings
        .iter()
        .find(|finding| finding.kind == FindingKind::Damage)
        .expect("the chunk is reported");
    assert!(
        damaged.object.starts_with("chunk 0 of segment")
            && damaged.object.contains(&format!("offset {}", first.stored)),
        "{damaged:#?}"
    );

    let repaired = store.check(REPAIR).unwrap();
    assert_eq!(repaired.status(), ExitStatus::DataLost, "{repaired:#?}");
    let lost: Vec<&String> = repaired
        .findings
        .iter()
        .flat_map(|finding| &finding.lost)
        .collect();
    assert_eq!(lost, ["backup home@1: file a"], "{repaired:#?}");

    let again = store.check(READ_DATA).unwrap();
    assert_eq!(again.status(), ExitStatus::DataLost, "{again:#?}");
    assert!(
        again
            .findings
            .iter()
            .all(|finding| finding.kind == FindingKind::Lost),
        "{again:#?}"
    );
    assert_eq!(again.findings[0].object, "backup home@1");
    assert_eq!(again.findings[0].lost, ["backup home@1: file a"]);

    let target = tempfile::tempdir().unwrap();
    let error = store
        .restore(
            "home",
            Some(1),
            RestoreTarget::Directory(target.path().join("out")),
        )
        .unwrap_err();
    assert!(matches!(error, BackupError::Lost { .. }), "{error}");
    assert!(error.to_string().contains(": a;"), "{error}");
    let out = target.path().join("out");
    assert!(!out.join("a").exists(), "a lost file is not restored");
    for (name, data) in &files[1..] {
        assert_eq!(std::fs::read(out.join(name)).unwrap(), *data);
    }
    let stream = store
        .restore(
            "home",
            Some(1),
            RestoreTarget::Writer(Box::new(SharedBuffer::default())),
        )
        .unwrap_err();
    assert!(stream.to_string().contains("bytes 0-"), "{stream}");

    // Reopened, the loss is still known, and a new backup of the same data is whole.
    drop(store);
    let mut store = open_with(Arc::clone(&storage), raw_options());
    store
        .create_backup(
            "home",
            BackupSource::Directory(source.path().to_path_buf()),
            CreateOptions::default(),
        )
        .unwrap();
    let target = tempfile::tempdir().unwrap();
    store
        .restore(
            "home",
            Some(2),
            RestoreTarget::Directory(target.path().to_path_buf()),
        )
        .unwrap();
    for (name, data) in &files {
        assert_eq!(std::fs::read(target.path().join(name)).unwrap(), *data);
    }
}

/// Goal: the chunks of a damaged frame whose fingerprints are stored intact elsewhere are
/// repaired from those copies, and only the others are lost: the loss names the bytes of the
/// one chunk no other backup holds, the other series restores whole. Method: two series whose
/// first segments differ in one byte (so both store the first segment's other chunks, in
/// frames of their own); damage the first series' first frame.
#[test]
fn damaged_chunk_is_taken_from_a_copy() {
    let storage = simulated();
    let mut store = open_with(Arc::clone(&storage), raw_options());
    let one = random_bytes(4, 150 << 10);
    let mut two = one.clone();
    two[30_000] ^= 0xff;
    backup_bytes(&mut store, "one", &one, true);
    backup_bytes(&mut store, "two", &two, true);
    let names = container_files(&storage);
    assert!(names.len() >= 2);
    let first = container_records(&storage, &names[0])[0];
    flip_byte(&storage, &names[0], first.stored + 3, 0x08);

    let repaired = store.check(REPAIR).unwrap();
    assert_eq!(repaired.status(), ExitStatus::DataLost, "{repaired:#?}");
    let finding = repaired
        .findings
        .iter()
        .find(|finding| {
            finding
                .repair
                .as_deref()
                .unwrap_or("")
                .contains("intact copies")
        })
        .unwrap_or_else(|| panic!("chunks were taken from copies: {repaired:#?}"));
    // Only the chunk holding byte 30,000 of `one` (chunks of at most 4 KiB) is lost.
    assert_eq!(finding.lost.len(), 1, "{repaired:#?}");
    let lost = &finding.lost[0];
    assert!(lost.starts_with("backup one@1: bytes "), "{lost}");
    let range: Vec<u64> = lost["backup one@1: bytes ".len()..]
        .split(|c: char| !c.is_ascii_digit())
        .filter(|part| !part.is_empty())
        .take(2)
        .map(|part| part.parse().unwrap())
        .collect();
    assert!(
        range[0] <= 30_000 && 30_000 <= range[1] && range[1] - range[0] < 4096,
        "{lost}"
    );
    assert_eq!(
        store.check(READ_DATA).unwrap().status(),
        ExitStatus::DataLost,
        "later checks report the loss as lost"
    );
    assert_eq!(restore_bytes(&store, "two", None), two);
}

/// Goal: damaged derived data never stops a backup command. A damaged page of the segment
/// index makes the store rebuild the index from the catalog (and say so) when it reads the
/// page: at a writable open for the pages an open loads, during a backup for the bucket a
/// lookup reads, and deduplication goes on. Damage in a page no backup read is reported by
/// check as derived data, and a repair rebuilds the index. Missing manifests make a writable
/// open rebuild it, and a read-only open goes on without it. Method: flip a byte of every
/// used index page in turn, then remove the manifests.
#[test]
fn damaged_segment_index_is_rebuilt() {
    let storage = simulated();
    let mut store = open_with(Arc::clone(&storage), raw_options());
    let image = random_bytes(5, 150 << 10);
    backup_bytes(&mut store, "vm", &image, true);
    drop(store);
    let pages = storage.open("meta/pages", false).unwrap();
    let slots = pages.len().unwrap() / 4096;
    assert!(slots > 0);
    let mut rebuilt = 0;
    for slot in 0..slots {
        // A rebuild writes a new, possibly shorter, file.
        if slot >= storage.open("meta/pages", false).unwrap().len().unwrap() / 4096 {
            break;
        }
        flip_byte(&storage, "meta/pages", slot * 4096 + 100, 0x20);
        let report = BackupStore::check_at(Arc::clone(&storage), READ_DATA).unwrap();
        let damaged = report.findings.iter().any(|finding| {
            finding.kind == FindingKind::Derived && finding.object.contains("segment index")
        });
        let mut store = reopen(&storage);
        // Every later backup of the same data is a duplicate, the index whole or rebuilt.
        let created = create_report(&mut store, "vm", &image, true);
        assert_eq!(created.inline.segments_new, 0, "slot {slot}");
        let notices = store.take_notices();
        let rebuilding = notices.iter().any(|notice| notice.contains("rebuilding"));
        assert!(
            damaged || !rebuilding,
            "slot {slot}: {report:#?} {notices:?}"
        );
        rebuilt += usize::from(rebuilding);
        assert_eq!(restore_bytes(&store, "vm", None), image);
        let after = store.check(READ_DATA).unwrap();
        if damaged && !rebuilding {
            // A page the backup did not read is still damaged: check names it, and a repair
            // rebuilds the index.
            assert_eq!(
                after.status(),
                ExitStatus::Problems,
                "slot {slot}: {after:#?}"
            );
            assert!(after.findings.iter().all(|finding| {
                finding.kind == FindingKind::Derived && finding.object.contains("segment index")
            }));
            let repaired = store.check(REPAIR).unwrap();
            assert_eq!(
                repaired.status(),
                ExitStatus::Clean,
                "slot {slot}: {repaired:#?}"
            );
        } else {
            assert_eq!(after.status(), ExitStatus::Clean, "slot {slot}: {after:#?}");
        }
    }
    assert!(rebuilt > 0, "some slot held a page in use");
    for manifest in ["meta/manifest.0", "meta/manifest.1"] {
        storage.remove(manifest).unwrap();
    }
    let read_only = BackupStore::open(
        Arc::clone(&storage),
        OpenOptions {
            read_only: true,
            ..OpenOptions::default()
        },
    )
    .unwrap();
    assert_eq!(restore_bytes(&read_only, "vm", Some(1)), image);
    drop(read_only);
    let report = BackupStore::check_at(Arc::clone(&storage), READ_DATA).unwrap();
    assert_eq!(report.status(), ExitStatus::Problems, "{report:#?}");
    let report = BackupStore::check_at(Arc::clone(&storage), REPAIR).unwrap();
    assert_eq!(report.status(), ExitStatus::Clean, "{report:#?}");
    let report = BackupStore::check_at(Arc::clone(&storage), READ_DATA).unwrap();
    assert!(report.findings.is_empty(), "{report:#?}");
}

/// Goal: a damaged bucket page of the segment index, which a writable open does not read, is
/// found by the lookup that reads it: the store rebuilds the index from the catalog (and says
/// so), the backup is deduplicated as before, and the segments it wrote before the rebuild
/// are indexed too. Method: on a copy of a store per page slot, flip a byte of the slot; for
/// the slots check names as a bucket page, open (no notice yet) and back up new data (several
/// batches) followed by the stored data; check the index, and back the same up once more.
#[test]
fn damaged_bucket_page_is_rebuilt_when_a_lookup_reads_it() {
    let simulated = SimulatedStorage::new();
    let storage: Arc<dyn Storage> = Arc::new(simulated.clone());
    let mut store = open_with(Arc::clone(&storage), raw_options());
    let image = random_bytes(7, 600 << 10);
    let stored_segments = create_report(&mut store, "vm", &image, true)
        .inline
        .segments;
    drop(store);
    // New data of several batches first: its segments are written before the lookups of the
    // stored data's segments read the damaged page.
    let mut grown = random_bytes(9, 3 << 20);
    grown.extend_from_slice(&image);
    let slots = storage.open("meta/pages", false).unwrap().len().unwrap() / 4096;
    let mut buckets = 0;
    for slot in 0..slots {
        let copy: Arc<dyn Storage> = Arc::new(simulated.crash(CrashMode::Clean));
        flip_byte(&copy, "meta/pages", slot * 4096 + 100, 0x20);
        let report = BackupStore::check_at(Arc::clone(&copy), READ_DATA).unwrap();
        // A damaged bucket page reads as an empty bucket, short of the entries recorded.
        let bucket = report.findings.iter().any(|finding| {
            finding.kind == FindingKind::Derived
                && (finding.detail.contains("segments.buckets")
                    || finding.detail.contains("entries found"))
        });
        if !bucket {
            continue;
        }
        buckets += 1;
        let mut store = reopen(&copy);
        let notices = store.take_notices();
        assert!(notices.is_empty(), "slot {slot}: {notices:?}");
        let created = create_report(&mut store, "vm", &grown, true);
        // All but the segment that spans the junction are found stored.
        assert!(
            created.inline.segments_duplicate + 1 >= stored_segments,
            "slot {slot}: {} of {stored_segments}",
            created.inline.segments_duplicate
        );
        let notices = store.take_notices();
        assert!(
            notices.iter().any(|notice| notice.contains("damaged page")),
            "slot {slot}: {notices:?}"
        );
        let after = store.check(READ_DATA).unwrap();
        assert_eq!(after.status(), ExitStatus::Clean, "slot {slot}: {after:#?}");
        let again = create_report(&mut store, "vm", &grown, true);
        assert_eq!(again.inline.segments_new, 0, "slot {slot}");
    }
    assert!(buckets > 0, "some slot held a bucket page");
}

/// Goal: a check without repair writes nothing; leftovers are reported as leftovers and a
/// repair removes them. Method: a container file no record names, a temporary catalog;
/// compare every file before and after the check.
#[test]
fn check_writes_nothing_and_repair_removes_leftovers() {
    let directory = tempfile::tempdir().unwrap();
    let storage: Arc<dyn Storage> = Arc::new(LocalStorage::create(directory.path()).unwrap());
    let mut store = open_with(Arc::clone(&storage), raw_options());
    backup_bytes(&mut store, "vm", &random_bytes(6, 100 << 10), true);
    drop(store);
    let name = container_files(&storage)[0].clone();
    let copy = "containers/77/0000000000000077";
    let bytes = std::fs::read(directory.path().join(&name)).unwrap();
    std::fs::create_dir_all(directory.path().join("containers/77")).unwrap();
    std::fs::write(directory.path().join(copy), &bytes).unwrap();
    std::fs::write(directory.path().join("catalog.redb.new"), b"x").unwrap();
    let snapshot = || {
        let mut files = Vec::new();
        for entry in walk(directory.path()) {
            files.push((entry.clone(), std::fs::read(&entry).unwrap()));
        }
        files
    };
    let before = snapshot();
    let report = BackupStore::check_at(Arc::clone(&storage), READ_DATA).unwrap();
    assert_eq!(before, snapshot(), "check without repair changed files");
    assert!(report.is_clean(), "{report:#?}");
    let leftovers: Vec<&str> = report
        .findings
        .iter()
        .map(|finding| finding.object.as_str())
        .collect();
    assert_eq!(
        leftovers,
        [
            "container 0000000000000077 (backup/containers/77/0000000000000077)",
            "backup/catalog.redb.new"
        ]
    );
    let repaired = BackupStore::check_at(Arc::clone(&storage), REPAIR).unwrap();
    assert!(repaired
        .findings
        .iter()
        .all(|finding| finding.repair.is_some()));
    assert!(!directory.path().join(copy).exists());
    assert!(!directory.path().join("catalog.redb.new").exists());
    assert!(BackupStore::check_at(storage, READ_DATA)
        .unwrap()
        .findings
        .is_empty());
}

fn walk(path: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(path)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for entry in entries {
        if entry.is_dir() {
            files.extend(walk(&entry));
        } else {
            files.push(entry);
        }
    }
    files
}

/// Goal: a catalog that does not open is reported as damage naming the file and what redb
/// found, instead of the check failing to run (opening the store fails naming it), and the
/// repair puts the header right so that every backup restores again. Method: damage redb's
/// magic number.
#[test]
fn damaged_catalog_is_reported() {
    let storage = simulated();
    let mut store = open_with(Arc::clone(&storage), raw_options());
    backup_bytes(&mut store, "vm", &random_bytes(7, 60 << 10), true);
    drop(store);
    flip_byte(&storage, "catalog.redb", 0, 0xff);
    let error = BackupStore::open(Arc::clone(&storage), OpenOptions::default()).unwrap_err();
    assert!(error.to_string().contains("catalog.redb"), "{error}");
    let report = BackupStore::check_at(Arc::clone(&storage), READ_DATA).unwrap();
    assert_eq!(report.status(), ExitStatus::Problems);
    assert_eq!(report.findings[0].object, "backup/catalog.redb");
    assert!(
        report.findings[0].detail.contains("magic number"),
        "{report:#?}"
    );
    let repaired = BackupStore::check_at(Arc::clone(&storage), REPAIR).unwrap();
    assert_eq!(repaired.status(), ExitStatus::Clean, "{repaired:#?}");
    assert!(repaired.findings[0]
        .repair
        .as_deref()
        .unwrap()
        .contains("magic number"));
    let store = BackupStore::open(
        Arc::clone(&storage),
        OpenOptions {
            read_only: true,
            ..OpenOptions::default()
        },
    )
    .unwrap();
    assert_eq!(
        restore_bytes(&store, "vm", Some(1)),
        random_bytes(7, 60 << 10)
    );
}

/// Goal: damaged catalog records are rebuilt when other records hold what they held, and
/// recorded as lost when nothing does: a segment head and a container record that do not
/// decode are derived data; a series record that is gone is rebuilt from its backups'
/// records; a recipe that does not decode is a loss, reported as lost by every later check
/// instead of as new damage. Method: write bad records straight into the catalog.
#[test]
fn damaged_records_are_rebuilt_or_recorded() {
    use onecopy_core::catalog::{Catalog, IdTable, NamedTable};
    let storage = simulated();
    let mut store = open_with(Arc::clone(&storage), raw_options());
    let first = random_bytes(8, 120 << 10);
    let mut second = first.clone();
    second[50_000..52_000].copy_from_slice(&random_bytes(9, 2000));
    backup_bytes(&mut store, "vm", &first, false);
    backup_bytes(&mut store, "vm", &second, false);
    let other = random_bytes(10, 30 << 10);
    backup_bytes(&mut store, "other", &other, false);
    drop(store);
    {
        let catalog = Catalog::open(&storage, "catalog.redb").unwrap();
        let mut write = catalog.write().unwrap();
        write
            .put_id(IdTable("segment_heads"), 1, b"not a head")
            .unwrap();
        write
            .put_id(IdTable("containers"), 1, b"not a container record")
            .unwrap();
        write.remove(NamedTable("series"), "vm").unwrap();
        // The recipe of "other" (backup id 3): its first part.
        write
            .put_id(IdTable("recipes"), 3 << 20, b"not a recipe")
            .unwrap();
        write.commit().unwrap();
    }
    let report = BackupStore::check_at(Arc::clone(&storage), READ_DATA).unwrap();
    assert_eq!(report.status(), ExitStatus::Problems, "{report:#?}");
    let objects: Vec<&str> = report
        .findings
        .iter()
        .map(|finding| finding.object.as_str())
        .collect();
    assert!(objects.contains(&"backup other@1"), "{objects:?}");
    let derived = report
        .findings
        .iter()
        .find(|finding| finding.kind == FindingKind::Derived)
        .expect("derived records are reported");
    assert!(
        derived.detail.contains("head of segment 1")
            && derived.detail.contains("container 0000000000000001"),
        "{derived:#?}"
    );
    assert!(
        objects
            .iter()
            .any(|object| object.starts_with("backup vm@1 (catalog record backups/")),
        "{objects:?}"
    );
    let repaired = BackupStore::check_at(Arc::clone(&storage), REPAIR).unwrap();
    assert_eq!(repaired.status(), ExitStatus::DataLost, "{repaired:#?}");
    let again = BackupStore::check_at(Arc::clone(&storage), READ_DATA).unwrap();
    assert_eq!(again.status(), ExitStatus::DataLost, "{again:#?}");
    assert_eq!(again.findings.len(), 1, "{again:#?}");
    assert_eq!(again.findings[0].kind, FindingKind::Lost);
    assert_eq!(again.findings[0].object, "backup other@1");
    assert_eq!(again.findings[0].lost, ["backup other@1 (all of it)"]);
    let mut store = open_with(Arc::clone(&storage), raw_options());
    assert_eq!(restore_bytes(&store, "vm", Some(1)), first);
    assert_eq!(restore_bytes(&store, "vm", Some(2)), second);
    backup_bytes(&mut store, "vm", &second, false);
    assert_eq!(restore_bytes(&store, "vm", Some(3)), second);
}

/// Goal: a store on sealed storage fingerprints with BLAKE3 keyed by a secret of its sealing
/// key, so that its fingerprints say nothing about content to anyone without the key, while
/// everything that reads fingerprints still works: deduplication, restores, and `check
/// --read-data`, which recomputes every stored chunk's fingerprint. Method: the same bytes
/// backed up twice into stores sealed under two keys and into a plain store; the second
/// backup stores nothing new in each, and the fingerprints in the three stores' record
/// headers have none in common.
#[test]
fn sealed_stores_key_their_fingerprints() {
    use onecopy_core::storage::{SealedStorage, SealingKey};
    let image = random_bytes(3, 150 << 10);
    let mut fingerprints: Vec<std::collections::HashSet<[u8; 32]>> = Vec::new();
    for key in [Some([1u8; 32]), Some([2u8; 32]), None] {
        let plain = simulated();
        let storage: Arc<dyn Storage> = match key {
            Some(key) => Arc::new(SealedStorage::new(
                plain,
                SealingKey::from_bytes(&key),
                onecopy_backup::store::sealed_layout,
            )),
            None => plain,
        };
        let mut store = open_with(Arc::clone(&storage), raw_options());
        backup_bytes(&mut store, "vm", &image, false);
        let again = create_report(&mut store, "vm", &image, false);
        assert_eq!(again.inline.new_stored_bytes, 0, "key {key:?}");
        assert_eq!(restore_bytes(&store, "vm", Some(1)), image);
        assert_eq!(restore_bytes(&store, "vm", None), image);
        assert_check_ok(&mut store);
        let mut found = std::collections::HashSet::new();
        for name in container_files(&storage) {
            let file = storage.open(&name, false).unwrap();
            for record in container_records(&storage, &name) {
                let mut fingerprint = [0u8; 32];
                file.read_at(record.header, &mut fingerprint).unwrap();
                found.insert(fingerprint);
            }
        }
        assert!(!found.is_empty());
        fingerprints.push(found);
    }
    assert!(fingerprints[0].is_disjoint(&fingerprints[1]));
    assert!(fingerprints[0].is_disjoint(&fingerprints[2]));
    assert!(fingerprints[1].is_disjoint(&fingerprints[2]));
}
