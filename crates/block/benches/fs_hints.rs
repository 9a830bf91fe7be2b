//! Costs of the file-system hints on the write path: map lookup, superblock detection and
//! block classification, and the one-off derivation of a map for a large ext4 volume.
//!
//! Run: `cargo bench -p onecopy-block --bench fs_hints`. Needs mke2fs (scripts/setup.sh).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use onecopy_block::hints::fs::{
    classify_block, derive_metadata_map, detect_superblock, SUPERBLOCK_PROBE_BYTES,
};
use std::fs::File;
use std::hint::black_box;
use std::os::unix::fs::FileExt;
use std::process::Command;

const VOLUME_BYTES: u64 = 256 << 30;
const LOOKUPS: usize = 4096;

/// A deterministic xorshift stream.
fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// A 4 KiB directory block of 64-byte records ending exactly at the block's end.
fn directory_block() -> Vec<u8> {
    let mut block = vec![0u8; 4096];
    for (index, at) in (0..4096).step_by(64).enumerate() {
        block[at..at + 4].copy_from_slice(&(100 + index as u32).to_le_bytes());
        block[at + 4..at + 6].copy_from_slice(&64u16.to_le_bytes());
        let name = format!("file-with-a-long-name-{index:020}");
        block[at + 6] = name.len() as u8;
        block[at + 7] = 1;
        block[at + 8..at + 8 + name.len()].copy_from_slice(name.as_bytes());
    }
    block
}

fn benches(criterion: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("volume.img");
    File::create(&image).unwrap().set_len(VOLUME_BYTES).unwrap();
    // Without flex_bg every group keeps its own bitmaps and inode table: the most ranges.
    let status = Command::new("mke2fs")
        .args(["-q", "-F", "-t", "ext4", "-O", "^flex_bg"])
        .args(["-E", "lazy_itable_init=1,lazy_journal_init=1"])
        .arg(&image)
        .status()
        .expect("mke2fs runnable (scripts/setup.sh)");
    assert!(status.success());
    let file = File::open(&image).unwrap();
    let mut read = |offset: u64, buffer: &mut [u8]| file.read_exact_at(buffer, offset);
    let map = derive_metadata_map(VOLUME_BYTES, &mut read).unwrap();
    eprintln!(
        "map of a 256 GiB ext4 volume without flex_bg: {} ranges",
        map.ranges().len()
    );

    criterion.bench_function("derive_metadata_map ext4 256 GiB ^flex_bg", |bencher| {
        bencher.iter(|| {
            let mut read = |offset: u64, buffer: &mut [u8]| file.read_exact_at(buffer, offset);
            black_box(derive_metadata_map(VOLUME_BYTES, &mut read).unwrap())
        })
    });

    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let offsets: Vec<u64> = (0..LOOKUPS)
        .map(|_| (xorshift(&mut state) % VOLUME_BYTES) & !4095)
        .collect();
    let mut group = criterion.benchmark_group("lookup");
    group.throughput(Throughput::Elements(LOOKUPS as u64));
    group.bench_function("4 KiB writes at random offsets", |bencher| {
        bencher.iter(|| {
            let mut hits = 0usize;
            for &offset in &offsets {
                hits += usize::from(map.lookup(offset, 4096).is_some());
            }
            black_box(hits)
        })
    });
    group.finish();

    let mut head = vec![0u8; SUPERBLOCK_PROBE_BYTES];
    file.read_exact_at(&mut head, 0).unwrap();
    criterion.bench_function("detect_superblock ext4", |bencher| {
        bencher.iter(|| black_box(detect_superblock(0, black_box(&head))))
    });

    let random: Vec<u8> = (0..512)
        .flat_map(|_| xorshift(&mut state).to_le_bytes())
        .collect();
    let directory = directory_block();
    assert!(classify_block(&directory).is_some());
    let mut group = criterion.benchmark_group("classify_block 4 KiB");
    group.throughput(Throughput::Bytes(4096));
    group.bench_function("random data", |bencher| {
        bencher.iter(|| black_box(classify_block(black_box(&random))))
    });
    group.bench_function("zeros", |bencher| {
        let zeros = vec![0u8; 4096];
        bencher.iter(|| black_box(classify_block(black_box(&zeros))))
    });
    group.bench_function("directory block", |bencher| {
        bencher.iter(|| black_box(map.classify_block(black_box(&directory))))
    });
    group.finish();
}

criterion_group!(fs_hints, benches);
criterion_main!(fs_hints);
