//! Sealed storage against its limits: 16 MiB written and read back in 1 MiB requests through
//! `SealedStorage` (single and paired layouts) over a local directory in /dev/shm (memory, so
//! no disk time hides the cipher), the same through the local directory alone (the
//! yardstick), and AES-256-GCM sealing 16 MiB in 4 KiB
//! blocks with `ring` directly (the cipher's limit). Single-threaded; CPU time of the thread.
//!
//! Run: `cargo bench -p onecopy-core --bench sealed`.

mod thread_time;

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use onecopy_core::storage::{Layout, LocalStorage, SealedStorage, SealingKey, Storage};
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use thread_time::ThreadTime;

const DATA_BYTES: usize = 16 << 20;
const REQUEST_BYTES: usize = 1 << 20;

fn data() -> Vec<u8> {
    let mut state = 0x1234_5678_9abc_def1u64;
    (0..DATA_BYTES)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

fn storage(directory: &std::path::Path, layout: Option<Layout>) -> Arc<dyn Storage> {
    let inner: Arc<dyn Storage> = Arc::new(LocalStorage::create(directory).unwrap());
    match layout {
        None => inner,
        Some(Layout::Single) => Arc::new(SealedStorage::new(
            inner,
            SealingKey::from_bytes(&[9; 32]),
            |_| Layout::Single,
        )),
        Some(Layout::Paired) => Arc::new(SealedStorage::new(
            inner,
            SealingKey::from_bytes(&[9; 32]),
            |_| Layout::Paired,
        )),
        Some(Layout::Paged) => Arc::new(SealedStorage::new(
            inner,
            SealingKey::from_bytes(&[9; 32]),
            |_| Layout::Paged,
        )),
    }
}

fn write_and_read(storage: &dyn Storage, data: &[u8], buffer: &mut [u8]) {
    storage.remove("f").unwrap();
    let file = storage.open("f", true).unwrap();
    for (index, request) in data.chunks(REQUEST_BYTES).enumerate() {
        file.write_at((index * REQUEST_BYTES) as u64, request)
            .unwrap();
    }
    for (index, request) in buffer.chunks_mut(REQUEST_BYTES).enumerate() {
        file.read_at((index * REQUEST_BYTES) as u64, request)
            .unwrap();
    }
}

fn bench(c: &mut Criterion<ThreadTime>) {
    let data = data();
    let mut buffer = vec![0u8; DATA_BYTES];
    let mut group = c.benchmark_group("sealed");
    group.throughput(Throughput::Bytes(DATA_BYTES as u64));
    group.sample_size(10);
    let memory = tempfile::Builder::new()
        .prefix("onecopy-sealed-bench")
        .tempdir_in("/dev/shm")
        .unwrap();
    for (name, layout) in [
        ("write_read/plain", None),
        ("write_read/single", Some(Layout::Single)),
        ("write_read/paired", Some(Layout::Paired)),
        ("write_read/paged", Some(Layout::Paged)),
    ] {
        let storage = storage(&memory.path().join(name.replace('/', "-")), layout);
        group.bench_function(name, |b| {
            b.iter(|| write_and_read(&*storage, &data, &mut buffer));
        });
    }
    let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &[7; 32]).unwrap());
    let mut work = data.clone();
    group.bench_function("aes_256_gcm_seal_4k", |b| {
        b.iter(|| {
            for block in work.chunks_mut(4096) {
                let tag = key
                    .seal_in_place_separate_tag(
                        Nonce::assume_unique_for_key([1; 12]),
                        Aad::empty(),
                        block,
                    )
                    .unwrap();
                let _ = black_box(tag);
            }
        });
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().with_measurement(ThreadTime);
    targets = bench
}
criterion_main!(benches);
