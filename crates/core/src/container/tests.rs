//! Container tests: round trips, compression, sealing, scanning after crashes, corruption.

use std::sync::Arc;

use super::*;
use crate::fingerprint::FingerprintAlgorithm;
use crate::storage::{CrashMode, SimulatedStorage};

fn chunk(seed: u64, length: usize) -> Vec<u8> {
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

fn store(storage: &SimulatedStorage, compression_level: Option<i32>) -> ContainerStore {
    ContainerStore::new(
        Arc::new(storage.clone()),
        "containers",
        ContainerOptions {
            container_bytes: 256 << 10,
            compression_level,
        },
    )
    .unwrap()
}

/// Goal: chunks read back byte-exact from the buffer, the file and a sealed container, with
/// and without compression, and the trailer lists them all.
#[test]
fn append_read_seal_round_trip() {
    for level in [None, Some(3)] {
        let storage = SimulatedStorage::new();
        let containers = store(&storage, level);
        let mut writer = containers.create(7, 1000).unwrap();
        let mut written = Vec::new();
        for index in 0..20u64 {
            // Half the chunks are compressible text, half random.
            let data = if index % 2 == 0 {
                format!("chunk {index} ").repeat(400).into_bytes()
            } else {
                chunk(index, 4096)
            };
            let fingerprint = FingerprintAlgorithm::Blake3.hash(&data);
            let location = writer.append(&fingerprint, &data, 0).unwrap();
            let mut out = vec![0u8; data.len()];
            assert!(writer.read_buffered(&location, &mut out).unwrap());
            assert_eq!(out, data);
            written.push((fingerprint, location, data));
        }
        if level.is_some() {
            assert!(written[0].1.flags & CHUNK_COMPRESSED != 0);
            assert!(written[1].1.flags & CHUNK_COMPRESSED == 0);
        }
        let sealed = writer.seal(42).unwrap();
        assert_eq!(sealed.chunk_count, 20);
        for (_, location, data) in &written {
            let mut out = vec![0u8; data.len()];
            containers.read_chunk(location, &mut out).unwrap();
            assert_eq!(&out, data);
        }
        let contents = containers.read_contents(7).unwrap();
        assert_eq!(contents.timestamp, 42);
        assert_eq!(contents.chunks.len(), 20);
        for (stored, (fingerprint, location, _)) in contents.chunks.iter().zip(&written) {
            assert_eq!(&stored.fingerprint, fingerprint);
            assert_eq!(&stored.location, location);
        }
        let scan = containers.scan(7).unwrap();
        assert!(scan.sealed);
        assert_eq!(scan.chunks, contents.chunks);
        assert_eq!(containers.list().unwrap(), vec![7]);
    }
}

/// Goal: a container hit by a torn crash scans to a prefix of its appended chunks that holds
/// at least everything synced, and never yields a chunk with wrong bytes.
#[test]
fn scan_after_torn_crash_finds_synced_prefix() {
    for seed in 0..30 {
        let storage = SimulatedStorage::new();
        let containers = store(&storage, None);
        let mut writer = containers.create(1, 0).unwrap();
        let mut written = Vec::new();
        for index in 0..30u64 {
            let data = chunk(index + seed * 100, 1000 + (index as usize * 131) % 3000);
            let fingerprint = FingerprintAlgorithm::Blake3.hash(&data);
            written.push((writer.append(&fingerprint, &data, 0).unwrap(), data));
            if index == 14 {
                writer.sync().unwrap();
            }
        }
        writer.write_out().unwrap();
        let after = storage.crash(CrashMode::Torn { seed });
        let containers =
            ContainerStore::new(Arc::new(after), "containers", containers.options()).unwrap();
        let scan = containers.scan(1).unwrap();
        assert!(!scan.sealed);
        assert!(scan.chunks.len() >= 15);
        for (found, (location, data)) in scan.chunks.iter().zip(&written) {
            assert_eq!(&found.location, location);
            let mut out = vec![0u8; data.len()];
            containers.read_chunk(location, &mut out).unwrap();
            assert_eq!(&out, data);
        }
    }
}

/// Goal: flipped bits are reported as corruption with the container's name, never returned.
#[test]
fn corruption_is_detected() {
    let storage = SimulatedStorage::new();
    let containers = store(&storage, None);
    let mut writer = containers.create(3, 0).unwrap();
    let data = chunk(1, 4096);
    let location = writer
        .append(&FingerprintAlgorithm::Blake3.hash(&data), &data, 0)
        .unwrap();
    writer.seal(0).unwrap();
    let file = storage.open(&containers.name(3), false).unwrap();
    file.write_at(location.offset as u64 + 100, &[data[100] ^ 1])
        .unwrap();
    let mut out = vec![0u8; 4096];
    let error = containers.read_chunk(&location, &mut out).unwrap_err();
    assert!(error.is_corrupt());
    assert!(error.to_string().contains("container 0000000000000003"));
    // The scan stops before the damaged record.
    assert!(containers.scan(3).unwrap().chunks.is_empty());
}

/// Goal: containers seal when full, and oversized chunks still get a container.
#[test]
fn room_accounting() {
    let storage = SimulatedStorage::new();
    let containers = store(&storage, None);
    let mut writer = containers.create(9, 0).unwrap();
    assert!(writer.has_room(1 << 20));
    let mut appended = 0;
    while writer.has_room(4096) {
        let data = chunk(appended, 4096);
        writer
            .append(&Fingerprint::ZERO, &data, CHUNK_UNFINGERPRINTED)
            .unwrap();
        appended += 1;
    }
    assert!(writer.bytes() <= 256 << 10);
    assert_eq!(appended, ((256 << 10) - 64) / (4096 + 48));
    assert!(is_zero(&[0u8; 4096]));
    assert!(!is_zero(&chunk(1, 4096)));
}

/// Goal: a removal is durable after `sync_removals`, also when it empties its shard
/// directory; without the sync a crash brings the container back.
#[test]
fn removals_are_durable_after_sync() {
    let storage = SimulatedStorage::new();
    let containers = store(&storage, None);
    for id in [5u64, 5 + 256] {
        let mut writer = containers.create(id, 0).unwrap();
        let data = chunk(id, 1000);
        writer
            .append(&FingerprintAlgorithm::Blake3.hash(&data), &data, 0)
            .unwrap();
        writer.seal(0).unwrap();
    }
    containers.remove(5).unwrap();
    let unsynced = storage.crash(CrashMode::Clean);
    assert!(unsynced.exists(&containers.name(5)).unwrap());
    containers.sync_removals().unwrap();
    containers.remove(5 + 256).unwrap();
    containers.sync_removals().unwrap();
    let after = storage.crash(CrashMode::Clean);
    assert!(!after.exists(&containers.name(5)).unwrap());
    assert!(!after.exists(&containers.name(5 + 256)).unwrap());
}

/// Goal: a writer's buffer goes to the next writer, and the next container holds only its
/// own header and chunks, whether the previous writer was sealed or dropped with unwritten
/// bytes.
#[test]
fn writers_pass_their_buffer_on() {
    let storage = SimulatedStorage::new();
    let containers = store(&storage, None);
    let append = |writer: &mut ContainerWriter, seed: u64| {
        let data = chunk(seed, 4096);
        let fingerprint = FingerprintAlgorithm::Blake3.hash(&data);
        (writer.append(&fingerprint, &data, 0).unwrap(), data)
    };
    let mut first = containers.create(1, 0).unwrap();
    append(&mut first, 1);
    first.seal(1).unwrap();
    assert!(
        containers.spare_buffer.lock().is_some(),
        "a sealed writer's buffer is kept"
    );
    // Taken by the next writer, then returned by a drop with bytes never written out.
    let mut dropped = containers.create(2, 0).unwrap();
    assert!(containers.spare_buffer.lock().is_none());
    append(&mut dropped, 2);
    drop(dropped);
    let mut third = containers.create(3, 0).unwrap();
    let written: Vec<_> = (10..13).map(|seed| append(&mut third, seed)).collect();
    third.seal(3).unwrap();
    let contents = containers.read_contents(3).unwrap();
    assert_eq!(contents.chunks.len(), written.len());
    for (stored, (location, data)) in contents.chunks.iter().zip(&written) {
        assert_eq!(&stored.location, location);
        let mut out = vec![0u8; data.len()];
        containers.read_chunk(location, &mut out).unwrap();
        assert_eq!(&out, data);
    }
    assert!(containers.scan(3).unwrap().sealed);
}

/// Appends `count` chunks of 4 KiB (seeds from `first`) with their checksums given, as the
/// block device does; returns where each went and its bytes.
fn append_chunks(
    writer: &mut ContainerWriter,
    first: u64,
    count: u64,
) -> Vec<(ChunkLocation, Vec<u8>)> {
    (first..first + count)
        .map(|seed| {
            let data = chunk(seed, 4096);
            let fingerprint = FingerprintAlgorithm::Blake3.hash(&data);
            let checksum = Some(crc32c::crc32c(&data));
            let location = writer
                .append_checked(&fingerprint, &data, 0, checksum)
                .unwrap();
            (location, data)
        })
        .collect()
}

/// A store with write-behind and containers of `container_bytes`.
fn write_behind_store(storage: &SimulatedStorage, container_bytes: u64) -> ContainerStore {
    ContainerStore::with_write_behind(
        Arc::new(storage.clone()),
        "containers",
        ContainerOptions {
            container_bytes,
            compression_level: None,
        },
    )
    .unwrap()
}

/// Goal: with write-behind, a full write buffer is queued instead of written, its chunks
/// read back from the queue until a run writes them, a seal syncs nothing, and
/// `sync_deferred` makes the name, the bytes and the seal durable. Method: 300 chunks of
/// 4 KiB (more than one 1 MiB buffer) in a 4 MiB container, clean crashes before and after
/// the deferred sync.
#[test]
fn write_behind_queues_buffers_and_defers_durability() {
    let storage = SimulatedStorage::new();
    let containers = write_behind_store(&storage, 4 << 20);
    let write_behind = Arc::clone(containers.write_behind().unwrap());
    let mut writer = containers.create(5, 0).unwrap();
    let written = append_chunks(&mut writer, 0, 300);
    let file = storage.open(&containers.name(5), false).unwrap();
    assert_eq!(
        file.len().unwrap(),
        0,
        "the full buffer is queued, not written"
    );
    assert!(write_behind.has_unsynced());
    let mut out = vec![0u8; 4096];
    let (first, data) = &written[0];
    assert!(containers.read_queued(first, &mut out).unwrap());
    assert_eq!(&out, data);
    let (last, _) = written.last().unwrap();
    assert!(
        !containers.read_queued(last, &mut out).unwrap(),
        "the last chunks are still in the writer's buffer"
    );
    write_behind.run().unwrap();
    assert!(
        file.len().unwrap() >= 1 << 20,
        "run wrote the queued buffer"
    );
    assert!(!containers.read_queued(first, &mut out).unwrap());
    for (location, data) in &written[..200] {
        containers.read_chunk(location, &mut out).unwrap();
        assert_eq!(&out, data);
    }

    let sealed = writer.seal(9).unwrap();
    let syncs = storage.sync_count();
    write_behind.run().unwrap();
    assert_eq!(storage.sync_count(), syncs, "sealing synced nothing");
    let before_sync = storage.crash(CrashMode::Clean);
    assert!(
        !before_sync.exists(&containers.name(5)).unwrap(),
        "the container's name is not durable before the deferred sync"
    );

    containers.sync_deferred().unwrap();
    assert!(!write_behind.has_unsynced());
    let after = storage.crash(CrashMode::Clean);
    let containers =
        ContainerStore::new(Arc::new(after), "containers", containers.options()).unwrap();
    assert_eq!(containers.container_bytes(5).unwrap(), sealed.bytes);
    assert_eq!(containers.read_contents(5).unwrap().chunks.len(), 300);
    for (location, data) in &written {
        containers.read_chunk(location, &mut out).unwrap();
        assert_eq!(&out, data);
    }
}

/// Goal: a queued write that fails keeps its bytes readable and fails every later sync, so
/// nothing that depends on it is reported durable. Method: a crash armed to strike at the
/// next sync, then a run and a sync.
#[test]
fn failed_write_behind_fails_the_sync_and_keeps_the_bytes() {
    let storage = SimulatedStorage::new();
    let containers = write_behind_store(&storage, 4 << 20);
    let write_behind = Arc::clone(containers.write_behind().unwrap());
    let mut writer = containers.create(2, 0).unwrap();
    let written = append_chunks(&mut writer, 1000, 300);
    storage.crash_after_syncs(1);
    storage.sync_directory("containers").unwrap();
    assert!(storage.is_crashed());
    assert!(write_behind.run().is_err());
    assert!(containers.sync_deferred().is_err());
    assert!(writer.sync().is_err());
    let (location, data) = &written[0];
    let mut out = vec![0u8; 4096];
    assert!(containers.read_queued(location, &mut out).unwrap());
    assert_eq!(&out, data);
}

/// Goal: a chunk encoded by the codec and appended with `append_encoded` is stored exactly as
/// `append` stores it (one compression rule for every face), and decodes back. Method: append
/// compressible, incompressible and barely compressible chunks both ways and compare records.
#[test]
fn codec_encoding_matches_the_writer() {
    let storage = SimulatedStorage::new();
    let containers = store(&storage, Some(3));
    let mut by_writer = containers.create(1, 0).unwrap();
    let mut by_codec = containers.create(2, 0).unwrap();
    let mut barely = chunk(9, 4096);
    barely[..600].fill(b'a');
    for data in [b"text ".repeat(800), chunk(3, 4096), barely] {
        let fingerprint = FingerprintAlgorithm::Blake3.hash(&data);
        let written = by_writer.append(&fingerprint, &data, 0).unwrap();
        let encoded = codec::encode(&data, Some(3)).unwrap();
        assert_eq!(
            encoded != Encoded::Raw,
            written.is_compressed(),
            "the same decision"
        );
        let appended = by_codec
            .append_encoded(&fingerprint, &data, &encoded)
            .unwrap();
        assert_eq!(
            appended.header(fingerprint),
            written.header(fingerprint),
            "the same record"
        );
        let stored = encoded.stored(&data);
        assert_eq!(codec::decode_to_vec(&appended, stored).unwrap(), data);
    }
    assert_eq!(codec::encode(b"abcd", None).unwrap(), Encoded::Raw);
}

/// Goal: compression is kept exactly when it saves at least an eighth. Method: the boundary
/// of `compression_pays` on both sides.
#[test]
fn compression_pays_from_an_eighth() {
    assert!(codec::compression_pays(4096, 3584));
    assert!(!codec::compression_pays(4096, 3585));
    assert!(codec::compression_pays(8, 7));
    assert!(!codec::compression_pays(8, 8));
}

/// Goal: decoding refuses damaged stored bytes and a location that does not fit them, with a
/// corruption error rather than a panic. Method: flip a byte, shorten the bytes, and claim a
/// raw chunk is shorter than it is stored.
#[test]
fn codec_decode_refuses_damage() {
    let data = b"some text ".repeat(300);
    let encoded = codec::encode(&data, Some(3)).unwrap();
    let stored = encoded.stored(&data).to_vec();
    let location = ChunkLocation {
        container: 5,
        offset: 64 + CHUNK_HEADER_BYTES as u32,
        stored_bytes: stored.len() as u32,
        raw_bytes: data.len() as u32,
        flags: CHUNK_COMPRESSED,
        checksum: codec::checksum(&stored),
    };
    assert_eq!(codec::decode_to_vec(&location, &stored).unwrap(), data);
    let mut flipped = stored.clone();
    flipped[3] ^= 1;
    assert!(codec::decode_to_vec(&location, &flipped)
        .unwrap_err()
        .is_corrupt());
    assert!(codec::decode_to_vec(&location, &stored[1..])
        .unwrap_err()
        .is_corrupt());
    let raw = ChunkLocation {
        stored_bytes: 10,
        raw_bytes: 9,
        flags: 0,
        checksum: codec::checksum(&data[..10]),
        ..location
    };
    assert!(codec::decode_to_vec(&raw, &data[..10])
        .unwrap_err()
        .is_corrupt());
}
