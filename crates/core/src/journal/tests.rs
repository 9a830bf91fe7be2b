use super::*;
use crate::storage::{CrashMode, SimulatedStorage};

const DIRECTORY: &str = "j";

fn tag(index: u64) -> RecordTag {
    let mut tag = [0u8; TAG_BYTES];
    tag[..8].copy_from_slice(&index.to_le_bytes());
    tag[8..].copy_from_slice(&(!index).to_le_bytes());
    tag
}

fn payload(index: u64) -> Vec<u8> {
    (0..300 + (index as usize * 37) % 900)
        .map(|at| (at as u64 * 31 + index * 7) as u8 | 1)
        .collect()
}

/// The payloads of the records a replay applies (the intact prefix).
fn replayed(scan: &JournalScan) -> Vec<Vec<u8>> {
    let mut seen = Vec::new();
    scan.for_each_payload(&scan.records[..scan.prefix], |_, payload| {
        seen.push(payload.to_vec());
        Ok::<(), crate::Error>(())
    })
    .unwrap();
    seen
}

fn flip(storage: &SimulatedStorage, name: &str, offset: u64) {
    let file = storage.open(name, false).unwrap();
    let mut byte = [0u8];
    file.read_at(offset, &mut byte).unwrap();
    file.write_at(offset, &[byte[0] ^ 0x10]).unwrap();
    file.sync_data().unwrap();
}

/// Writes `batches` of `per_batch` records, syncing after each batch; returns the storage
/// and the offset of every record.
fn journal_of(batches: u64, per_batch: u64) -> (SimulatedStorage, Vec<u64>) {
    let storage = SimulatedStorage::new();
    let shared: Arc<dyn Storage> = Arc::new(storage.clone());
    let mut journal = Journal::create(shared, DIRECTORY, 3, 1 << 20).unwrap();
    let mut offsets = Vec::new();
    for index in 0..batches * per_batch {
        offsets.push(FILE_HEADER_BYTES + journal.bytes());
        journal.append(&tag(index), &payload(index)).unwrap();
        if (index + 1) % per_batch == 0 {
            journal.sync().unwrap();
        }
    }
    (storage, offsets)
}

/// Goal: synced records replay in order with their tags, across rotation, and the old
/// generation stays until its owner removes it.
#[test]
fn records_replay_in_order() {
    let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
    let mut journal = Journal::create(storage.clone(), DIRECTORY, 7, 4096).unwrap();
    for index in 0..100 {
        journal.append(&tag(index), &payload(index)).unwrap();
    }
    journal.sync().unwrap();
    let scan = Journal::scan(storage.as_ref(), DIRECTORY, 7).unwrap();
    assert!(scan.is_intact());
    assert_eq!(scan.end, JournalEnd::Clean);
    assert_eq!(scan.records.len(), 100);
    assert_eq!(scan.records[3].tag, tag(3));
    assert_eq!(replayed(&scan)[42], payload(42));

    assert_eq!(journal.rotate(8).unwrap(), 7);
    journal.append(&tag(0), b"next").unwrap();
    journal.sync().unwrap();
    assert_eq!(
        Journal::generations(storage.as_ref(), DIRECTORY).unwrap(),
        vec![7, 8]
    );
    let scan = Journal::scan(storage.as_ref(), DIRECTORY, 8).unwrap();
    assert_eq!(replayed(&scan), vec![b"next".to_vec()]);
    Journal::remove(storage.as_ref(), DIRECTORY, 7).unwrap();
    assert_eq!(
        Journal::generations(storage.as_ref(), DIRECTORY).unwrap(),
        vec![8]
    );
    assert!(Journal::create(storage.clone(), DIRECTORY, 8, 4096).is_err());
    assert!(matches!(
        Journal::scan(storage.as_ref(), DIRECTORY, 9),
        Err(Error::NotFound(_))
    ));
}

/// Goal: after torn crashes the replay is always a prefix of the appended records that
/// includes every synced record, and a torn tail is never reported as damage. Method: 200
/// seeds of torn crashes after a sync in the middle, with unsynced writes of several sizes.
#[test]
fn torn_tail_is_a_prefix_and_never_damage() {
    for seed in 0..200u64 {
        let storage = SimulatedStorage::new();
        let shared: Arc<dyn Storage> = Arc::new(storage.clone());
        let mut journal = Journal::create(shared, DIRECTORY, 1, 1 << 20).unwrap();
        let mut appended = Vec::new();
        for index in 0..40u64 {
            let payload = payload(index * (seed + 1));
            journal.append(&tag(index), &payload).unwrap();
            appended.push(payload);
            if index == 19 {
                journal.sync().unwrap();
            }
            if index == 29 && seed % 2 == 0 {
                journal.write_buffered().unwrap();
            }
        }
        journal.write_buffered().unwrap();
        let after = storage.crash(CrashMode::Torn { seed });
        let scan = Journal::scan(&after, DIRECTORY, 1).unwrap();
        assert!(scan.damage.is_empty(), "seed {seed}: {:?}", scan.damage);
        let seen = replayed(&scan);
        assert!(seen.len() >= 20, "seed {seed}: synced records survive");
        assert_eq!(seen[..], appended[..seen.len()], "seed {seed}: a prefix");
    }
}

/// Goal: records of one generation never replay under another.
#[test]
fn generation_is_part_of_the_checksum() {
    let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
    let mut journal = Journal::create(storage.clone(), DIRECTORY, 1, 4096).unwrap();
    journal.append(&tag(1), b"old").unwrap();
    journal.sync().unwrap();
    storage
        .rename(
            &Journal::file_name(DIRECTORY, 1),
            &Journal::file_name(DIRECTORY, 2),
        )
        .unwrap();
    let scan = Journal::scan(storage.as_ref(), DIRECTORY, 2).unwrap();
    assert!(scan.records.is_empty());
    assert!(scan.header_damaged);
}

/// Goal: one flipped byte anywhere in a synced record that later syncs followed is damage,
/// never a torn tail: the scan names its offset and its tag (from the header or the footer,
/// whichever is intact), replays only the records before it, and lists every record after
/// it. Method: flip every byte of one record in the middle of 16 synced batches.
#[test]
fn flipped_byte_in_synced_records_is_damage() {
    let (storage, offsets) = journal_of(16, 3);
    let name = Journal::file_name(DIRECTORY, 3);
    let victim = 20usize;
    for offset in offsets[victim]..offsets[victim + 1] {
        let image = storage.crash(CrashMode::Clean);
        flip(&image, &name, offset);
        let scan = Journal::scan(&image, DIRECTORY, 3).unwrap();
        assert_eq!(scan.damage.len(), 1, "byte {offset}");
        let damage = &scan.damage[0];
        assert_eq!(damage.offset, offsets[victim], "byte {offset}");
        assert_eq!(damage.end, offsets[victim + 1], "byte {offset}");
        assert_eq!(damage.tag, Some(tag(victim as u64)), "byte {offset}");
        assert_eq!(scan.prefix, victim);
        assert_eq!(scan.records.len(), 47, "every other record is intact");
        assert_eq!(scan.records[victim].tag, tag(victim as u64 + 1));
    }
}

/// Goal: a flipped byte in the last synced batch, which no later sync proves durable, is
/// still damage (no sector of it reads as zeros), while the same batch torn by a crash is a
/// torn tail.
#[test]
fn flipped_byte_in_the_last_batch_is_damage() {
    let (storage, offsets) = journal_of(4, 3);
    let name = Journal::file_name(DIRECTORY, 3);
    for victim in [9usize, 11] {
        let bytes = (payload(victim as u64).len() + RECORD_OVERHEAD_BYTES) as u64;
        for delta in [0u64, 5, 40, 200, bytes - 8, bytes - 1] {
            let image = storage.crash(CrashMode::Clean);
            flip(&image, &name, offsets[victim] + delta);
            let scan = Journal::scan(&image, DIRECTORY, 3).unwrap();
            assert_eq!(scan.damage.len(), 1, "record {victim} byte +{delta}");
            assert_eq!(scan.damage[0].offset, offsets[victim]);
            assert_eq!(scan.damage[0].tag, Some(tag(victim as u64)));
            assert_eq!(scan.prefix, victim);
        }
    }
}

/// Goal: a journal cut short or with a damaged file header is damage, and a missing one is
/// NotFound; the records before the cut still replay.
#[test]
fn truncation_and_header_damage_are_reported() {
    let (storage, offsets) = journal_of(8, 2);
    let name = Journal::file_name(DIRECTORY, 3);
    for cut in [offsets[10] + 50, offsets[10]] {
        let image = storage.crash(CrashMode::Clean);
        let file = image.open(&name, false).unwrap();
        file.set_len(cut).unwrap();
        file.sync_data().unwrap();
        let scan = Journal::scan(&image, DIRECTORY, 3).unwrap();
        assert_eq!(scan.damage.len(), 1, "cut at {cut}");
        assert!(
            scan.damage[0].detail.contains("truncated"),
            "{:?}",
            scan.damage
        );
        assert_eq!(scan.prefix, 10);
        assert_eq!(replayed(&scan).len(), 10);
    }
    let image = storage.crash(CrashMode::Clean);
    flip(&image, &name, 10);
    let scan = Journal::scan(&image, DIRECTORY, 3).unwrap();
    assert!(scan.header_damaged);
    assert!(!scan.is_intact());
    assert_eq!(
        scan.records.len(),
        16,
        "records are read without the header"
    );
    image.remove(&name).unwrap();
    assert!(matches!(
        Journal::scan(&image, DIRECTORY, 3),
        Err(Error::NotFound(_))
    ));
}

/// Goal: a journal cut inside a record whose bytes before the cut end in zeros is still a cut
/// record (damage naming its tag, records after it unknown), never a torn tail dropped in
/// silence. Method: a record whose payload is mostly zeros, cut in the zeros.
#[test]
fn truncation_in_zeros_of_a_record_names_its_tag() {
    let storage = SimulatedStorage::new();
    let shared: Arc<dyn Storage> = Arc::new(storage.clone());
    let mut journal = Journal::create(shared, DIRECTORY, 3, 1 << 20).unwrap();
    let mut zeros = vec![0u8; 4000];
    zeros[0] = 1;
    journal.append(&tag(0), &payload(0)).unwrap();
    let cut_record = FILE_HEADER_BYTES + journal.bytes();
    journal.append(&tag(1), &zeros).unwrap();
    journal.append(&tag(2), &payload(2)).unwrap();
    journal.sync().unwrap();
    let name = Journal::file_name(DIRECTORY, 3);
    let file = storage.open(&name, false).unwrap();
    file.set_len(cut_record + RECORD_HEADER_BYTES as u64 + 2000)
        .unwrap();
    let scan = Journal::scan(&storage, DIRECTORY, 3).unwrap();
    assert_eq!(scan.damage.len(), 1, "{:?}", scan.damage);
    assert_eq!(scan.damage[0].offset, cut_record);
    assert_eq!(scan.damage[0].tag, Some(tag(1)));
    assert!(scan.damage[0].cut);
    assert_eq!(scan.end, JournalEnd::Clean);
    assert_eq!(replayed(&scan).len(), 1);
}

/// Goal: records larger than the capacity grow the file, and the grown file scans whole.
#[test]
fn records_past_the_capacity_grow_the_file() {
    let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
    let mut journal = Journal::create(storage.clone(), DIRECTORY, 5, 0).unwrap();
    let big = vec![7u8; 700 << 10];
    for index in 0..4 {
        journal.append(&tag(index), &big).unwrap();
        journal.sync().unwrap();
    }
    let scan = Journal::scan(storage.as_ref(), DIRECTORY, 5).unwrap();
    assert!(scan.is_intact(), "{:?}", scan.damage);
    assert_eq!(scan.records.len(), 4);
    assert!(scan.length >= FILE_HEADER_BYTES + 4 * (big.len() + RECORD_OVERHEAD_BYTES) as u64);
}

/// Goal: a write cut short (a process killed inside `pwrite`, or a disk that wrote the
/// first sectors of a request) is a torn tail wherever the cut falls, also when the cut
/// leaves a record's header, or all of it but its last bytes, on the media. Method: one
/// synced batch, then an unsynced one cut at every sector boundary inside it.
#[test]
fn write_cut_at_any_sector_is_a_torn_tail() {
    let storage = SimulatedStorage::new();
    let shared: Arc<dyn Storage> = Arc::new(storage.clone());
    let mut journal = Journal::create(shared, DIRECTORY, 5, 1 << 20).unwrap();
    let mut appended = Vec::new();
    for index in 0..60u64 {
        let payload = payload(index);
        journal.append(&tag(index), &payload).unwrap();
        appended.push(payload);
        if index == 19 {
            journal.sync().unwrap();
        }
    }
    let synced_end = FILE_HEADER_BYTES + journal.bytes()
        - appended[20..]
            .iter()
            .map(|payload| (payload.len() + RECORD_OVERHEAD_BYTES) as u64)
            .sum::<u64>();
    // Synced so that a clean crash keeps the whole batch; the cut below then removes its
    // tail as an interrupted write would (the records still state the earlier synced end).
    journal.sync().unwrap();
    let written_end = FILE_HEADER_BYTES + journal.bytes();
    let name = Journal::file_name(DIRECTORY, 5);
    let mut cut = synced_end.next_multiple_of(SECTOR_BYTES);
    while cut < written_end {
        let image = storage.crash(CrashMode::Clean);
        let file = image.open(&name, false).unwrap();
        file.write_at(cut, &vec![0u8; (written_end - cut) as usize])
            .unwrap();
        file.sync_data().unwrap();
        let scan = Journal::scan(&image, DIRECTORY, 5).unwrap();
        assert!(scan.damage.is_empty(), "cut at {cut}: {:?}", scan.damage);
        let seen = replayed(&scan);
        assert!(seen.len() >= 20, "cut at {cut}: synced records survive");
        assert_eq!(seen[..], appended[..seen.len()], "cut at {cut}: a prefix");
        cut += SECTOR_BYTES;
    }
}
