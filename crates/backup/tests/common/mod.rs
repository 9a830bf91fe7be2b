//! Helpers shared by the backup store's tests: small sizes, deterministic data, stores on
//! simulated or local storage.
#![allow(dead_code)]

use std::sync::Arc;

use onecopy_backup::{
    BackupSource, BackupStore, CheckOptions, CreateOptions, CreateReport, DedupMode, OpenOptions,
    RestoreTarget, RuntimeOptions, StoreOptions,
};
use onecopy_core::storage::Storage;

/// Store options scaled down so that tests run in milliseconds: 64 KiB segments of 2 KiB
/// chunks in 256 KiB containers.
pub fn small_options(mode: DedupMode) -> StoreOptions {
    StoreOptions {
        segment_bytes: 64 << 10,
        chunk_bytes: 2 << 10,
        container_bytes: 256 << 10,
        ..StoreOptions::for_mode(mode)
    }
}

/// Runtime options with small restore windows, so that windows and prefetching are exercised.
pub fn small_runtime() -> RuntimeOptions {
    RuntimeOptions {
        restore_window_bytes: 96 << 10,
        reserve_bytes_min: 64 << 10,
        ..RuntimeOptions::default()
    }
}

pub fn open(storage: Arc<dyn Storage>, mode: DedupMode) -> BackupStore {
    open_with(storage, small_options(mode))
}

pub fn open_with(storage: Arc<dyn Storage>, options: StoreOptions) -> BackupStore {
    BackupStore::open(
        storage,
        OpenOptions {
            store: Some(options),
            runtime: small_runtime(),
            read_only: false,
        },
    )
    .expect("open store")
}

/// Container files of a store, sorted by id (storage names).
pub fn container_files(storage: &Arc<dyn Storage>) -> Vec<String> {
    let mut names = Vec::new();
    for shard in 0..=0xffu32 {
        names.extend(storage.list(&format!("containers/{shard:02x}")).unwrap());
    }
    names.sort_by_key(|name| name.rsplit('/').next().unwrap().to_string());
    names
}

/// One chunk record found by walking a container from the front.
#[derive(Clone, Copy, Debug)]
pub struct RecordAt {
    /// Offset of its 48-byte header.
    pub header: u64,
    /// Offset and length of its stored bytes.
    pub stored: u64,
    pub stored_bytes: u64,
}

/// The chunk records of a sealed container, read from the front (header 64 bytes, then
/// records of a 48-byte header and the stored bytes, until the trailer's first entry).
pub fn container_records(storage: &Arc<dyn Storage>, name: &str) -> Vec<RecordAt> {
    let file = storage.open(name, false).unwrap();
    let length = file.len().unwrap();
    let mut data = vec![0u8; length as usize];
    file.read_at(0, &mut data).unwrap();
    let footer = &data[data.len() - 32..];
    let trailer_offset = u64::from_le_bytes(footer[8..16].try_into().unwrap());
    let mut records = Vec::new();
    let mut position = 64u64;
    let header_bytes = onecopy_core::container::CHUNK_HEADER_BYTES as u64;
    while position < trailer_offset {
        let header = &data[position as usize..(position + header_bytes) as usize];
        let stored_bytes = u32::from_le_bytes(header[32..36].try_into().unwrap()) as u64;
        records.push(RecordAt {
            header: position,
            stored: position + header_bytes,
            stored_bytes,
        });
        position += header_bytes + stored_bytes;
    }
    records
}

/// Flips the bits of `mask` in byte `offset` of file `name`.
pub fn flip_byte(storage: &Arc<dyn Storage>, name: &str, offset: u64, mask: u8) {
    let file = storage.open(name, false).unwrap();
    let mut byte = [0u8];
    file.read_at(offset, &mut byte).unwrap();
    byte[0] ^= mask;
    file.write_at(offset, &byte).unwrap();
}

/// A deterministic generator (SplitMix64).
pub struct Random(pub u64);

impl Random {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound.max(1)
    }

    /// Bytes that compress about 2:1 (random bytes over a 16-letter alphabet), with zero runs.
    pub fn fill(&mut self, out: &mut [u8]) {
        for chunk in out.chunks_mut(8) {
            let value = self.next();
            for (index, byte) in chunk.iter_mut().enumerate() {
                *byte = b'a' + ((value >> (index * 4)) & 0xf) as u8;
            }
        }
    }
}

/// A first "image" of `bytes` with a zero region in the middle and its first eighth repeated
/// near the end (so that new segments borrow chunks of earlier ones).
pub fn first_image(random: &mut Random, bytes: usize) -> Vec<u8> {
    let mut image = vec![0u8; bytes];
    random.fill(&mut image);
    let hole = bytes / 3;
    image[hole..hole + bytes / 8].fill(0);
    let repeat = bytes / 4 * 3;
    image.copy_within(..bytes / 8, repeat);
    image
}

/// The next version of an image, as paper 2's synthetic workload makes them: a few regions
/// rewritten, and some new bytes inserted.
pub fn next_image(random: &mut Random, previous: &[u8]) -> Vec<u8> {
    let mut image = previous.to_vec();
    for _ in 0..4 {
        let length = 1 + random.below(8 << 10) as usize;
        let start = random.below((image.len() - length) as u64) as usize;
        random.fill(&mut image[start..start + length]);
    }
    let insert_at = random.below(image.len() as u64) as usize;
    let mut inserted = vec![0u8; 3000];
    random.fill(&mut inserted);
    image.splice(insert_at..insert_at, inserted);
    image
}

pub fn backup_bytes(store: &mut BackupStore, series: &str, data: &[u8], defer: bool) -> u32 {
    create_report(store, series, data, defer).version
}

/// Backs up `data` from memory as the next version of `series` and returns the report.
pub fn create_report(
    store: &mut BackupStore,
    series: &str,
    data: &[u8],
    defer: bool,
) -> CreateReport {
    store
        .create_backup(
            series,
            BackupSource::Reader {
                reader: Box::new(std::io::Cursor::new(data.to_vec())),
                name: "test".into(),
            },
            CreateOptions {
                defer_reverse: defer,
                ..CreateOptions::default()
            },
        )
        .expect("create backup")
}

/// A writer that appends into a shared buffer.
#[derive(Clone, Default)]
pub struct SharedBuffer(pub Arc<parking_lot_free::Mutex<Vec<u8>>>);

pub mod parking_lot_free {
    pub type Mutex<T> = std::sync::Mutex<T>;
}

impl std::io::Write for SharedBuffer {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

pub fn restore_bytes(store: &BackupStore, series: &str, version: Option<u32>) -> Vec<u8> {
    let buffer = SharedBuffer::default();
    store
        .restore(
            series,
            version,
            RestoreTarget::Writer(Box::new(buffer.clone())),
        )
        .expect("restore");
    let bytes = buffer.0.lock().unwrap().clone();
    bytes
}

/// Checks with every stored byte read and asserts that nothing but leftovers was found.
pub fn assert_check_ok(store: &mut BackupStore) {
    let report = store
        .check(CheckOptions {
            read_data: true,
            repair: false,
        })
        .expect("check runs");
    assert!(
        report.is_clean(),
        "check found problems: {:#?}",
        report.findings
    );
}
