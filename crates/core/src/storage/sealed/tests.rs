use std::sync::Arc;

use super::*;
use crate::storage::{read_all, CrashMode, SimulatedStorage};

fn key(byte: u8) -> SealingKey {
    SealingKey::from_bytes(&[byte; 32])
}

fn single(_: &str) -> Layout {
    Layout::Single
}

fn paired(_: &str) -> Layout {
    Layout::Paired
}

fn paged(_: &str) -> Layout {
    Layout::Paged
}

/// The content length a file of `length` bytes has in `layout`.
fn stored_length(layout: Layout, length: usize) -> usize {
    if layout == Layout::Paged {
        length.next_multiple_of(BLOCK_BYTES)
    } else {
        length
    }
}

fn sealed(inner: &Arc<SimulatedStorage>, policy: LayoutPolicy) -> SealedStorage {
    SealedStorage::new(Arc::clone(inner) as Arc<dyn Storage>, key(7), policy)
}

/// Deterministic bytes (xorshift), so failures replay.
fn pattern(seed: u64, length: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..length)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// Goal: random writes, truncations and growths read back exactly as a plain byte vector
/// would (padded with zeros to whole blocks in the paged layout), in every layout and through
/// two handles. Method: a seeded sequence of operations against the model, reading the whole
/// file after each.
#[test]
fn random_operations_match_a_byte_vector() {
    for policy in [single as LayoutPolicy, paired, paged] {
        for seed in 0..6u64 {
            let inner = Arc::new(SimulatedStorage::new());
            let storage = sealed(&inner, policy);
            let file = storage.open("f", true).unwrap();
            let other = storage.open("f", false).unwrap();
            let mut model: Vec<u8> = Vec::new();
            let random = pattern(seed, 4000);
            let mut next = random.iter().map(|&byte| byte as u64).cycle();
            let mut draw = |limit: u64| {
                let value =
                    (next.next().unwrap() << 8 | next.next().unwrap()) << 8 | next.next().unwrap();
                value % limit
            };
            for step in 0..60 {
                match draw(5) {
                    0 => {
                        let length = draw(30_000);
                        file.set_len(length).unwrap();
                        model.resize(length as usize, 0);
                        model.resize(stored_length(policy(""), model.len()), 0);
                    }
                    _ => {
                        let offset = draw(40_000);
                        let length = draw(9_000) as usize;
                        let data = pattern(seed * 1000 + step, length);
                        let writer = if step % 2 == 0 { &file } else { &other };
                        writer.write_at(offset, &data).unwrap();
                        let end = offset as usize + length;
                        if model.len() < end && length > 0 {
                            model.resize(end, 0);
                        }
                        model[offset as usize..offset as usize + length].copy_from_slice(&data);
                        model.resize(stored_length(policy(""), model.len()), 0);
                    }
                }
                assert_eq!(
                    file.len().unwrap(),
                    model.len() as u64,
                    "seed {seed} step {step}"
                );
                let mut all = vec![0u8; model.len()];
                other.read_at(0, &mut all).unwrap();
                assert!(all == model, "seed {seed} step {step}: content differs");
                // A storage sharing no state with the writers reads the same: the slots and
                // generations the writers chose from what they remember are the media's.
                let fresh = read_all(&sealed(&inner, policy), "f").unwrap();
                assert!(
                    fresh == model,
                    "seed {seed} step {step}: reopened content differs"
                );
                if !model.is_empty() {
                    let mut past = vec![0u8; 2];
                    assert!(file
                        .read_at(model.len() as u64 - 1, &mut past)
                        .unwrap_err()
                        .is_corrupt());
                }
            }
        }
    }
}

/// Goal: a changed byte anywhere in a synced sealed file is an error naming the file, never
/// wrong content (not even a block's previous content in the paired layout).
/// Method: for every physical byte of a three-block file (every byte of the header and the
/// slot prefixes, a sample of the rest), flip it, reopen, read everything, flip it back.
#[test]
fn every_flipped_byte_is_an_error_or_right_content() {
    for policy in [single as LayoutPolicy, paired, paged] {
        let inner = Arc::new(SimulatedStorage::new());
        let storage = sealed(&inner, policy);
        let content = pattern(3, 3 * BLOCK_BYTES - 100);
        let file = storage.open("dir/file", true).unwrap();
        file.write_at(0, &content).unwrap();
        // A second version of the first block, so a paired block has both slots written.
        file.write_at(5, b"second").unwrap();
        let mut expected = content.clone();
        expected[5..11].copy_from_slice(b"second");
        expected.resize(stored_length(policy(""), expected.len()), 0);
        file.sync_data().unwrap();
        drop(file);
        let raw = inner.open("dir/file", false).unwrap();
        let physical = raw.len().unwrap();
        let mut errors = 0;
        for position in 0..physical {
            let within_slot = (position.saturating_sub(HEADER_BYTES as u64)) % SLOT_BYTES as u64;
            // Every layout's blocks start at whole slots after the header.
            let probe = position < HEADER_BYTES as u64
                || within_slot < SLOT_PREFIX_BYTES as u64 + 4
                || within_slot >= (SLOT_BYTES - TAG_BYTES - 2) as u64
                || position % 97 == 0;
            if !probe {
                continue;
            }
            let mut byte = [0u8; 1];
            raw.read_at(position, &mut byte).unwrap();
            raw.write_at(position, &[byte[0] ^ 0x10]).unwrap();
            let outcome = storage.open("dir/file", false).and_then(|file| {
                let length = file.len()?;
                let mut all = vec![0u8; length as usize];
                file.read_at(0, &mut all)?;
                Ok(all)
            });
            let last_block_start = HEADER_BYTES as u64 + policy("").block_start(2);
            match outcome {
                // The paired layout's rule for an interrupted growth: a last block none of
                // whose slots authenticates is not part of the file (the catalog above
                // refuses a file shorter than its recorded layout).
                Ok(all)
                    if policy("") == Layout::Paired
                        && position >= last_block_start
                        && all == expected[..2 * BLOCK_BYTES] => {}
                Ok(all) => assert!(
                    all == expected,
                    "{policy:?}: byte {position} flipped gave wrong content",
                    policy = policy("")
                ),
                Err(error) => {
                    assert!(error.is_corrupt(), "{error}");
                    assert!(error.to_string().contains("dir/file"), "{error}");
                    errors += 1;
                }
            }
            raw.write_at(position, &byte).unwrap();
        }
        assert!(errors > 100, "flips were detected ({errors})");
    }
}

/// Goal: the paired layout makes every block write atomic across a crash: after torn crashes
/// each block reads as its old or its new content, never an error; once synced, the new
/// content survives a torn crash of the erasure that follows. Method: a synced version, an
/// unsynced rewrite spanning three blocks, torn crashes over many seeds; then the same with
/// the rewrite synced.
#[test]
fn paired_blocks_survive_torn_writes() {
    let old = pattern(1, 3 * BLOCK_BYTES);
    let new = pattern(2, 3 * BLOCK_BYTES);
    let mut seen_old = 0;
    for synced in [false, true] {
        for seed in 0..40 {
            let inner = Arc::new(SimulatedStorage::new());
            let storage = sealed(&inner, paired);
            let file = storage.open("catalog", true).unwrap();
            file.write_at(0, &pattern(9, 3 * BLOCK_BYTES)).unwrap();
            file.write_at(0, &old).unwrap();
            file.sync_data().unwrap();
            inner.sync_directory("").unwrap();
            file.write_at(0, &new).unwrap();
            if synced {
                file.sync_data().unwrap();
            }
            let after = Arc::new(inner.crash(CrashMode::Torn { seed }));
            let reopened = sealed(&after, paired);
            let image = read_all(&reopened, "catalog").unwrap();
            assert_eq!(image.len(), old.len());
            for (index, block) in image.chunks(BLOCK_BYTES).enumerate() {
                let range = index * BLOCK_BYTES..(index + 1) * BLOCK_BYTES;
                let is_old = block == &old[range.clone()];
                let is_new = block == &new[range];
                assert!(is_old || is_new, "seed {seed} block {index}");
                assert!(
                    is_new || !synced,
                    "seed {seed} block {index}: synced content lost"
                );
                seen_old += usize::from(is_old);
            }
        }
    }
    assert!(seen_old > 0, "torn crashes were simulated");
}

/// Goal: in the paged layout, block 0 is written atomically across a crash (old or new
/// content, never an error) and every other block reads as its old or new content or fails
/// authentication, never as anything else; the file's length is whole blocks and survives.
/// Method: a synced version, an unsynced rewrite of three blocks, torn crashes over many seeds.
#[test]
fn paged_files_keep_block_zero_atomic() {
    let old = pattern(1, 3 * BLOCK_BYTES);
    let new = pattern(2, 3 * BLOCK_BYTES);
    let (mut errors, mut seen_old) = (0, 0);
    for seed in 0..40 {
        let inner = Arc::new(SimulatedStorage::new());
        let storage = sealed(&inner, paged);
        let file = storage.open("catalog", true).unwrap();
        file.write_at(0, &old).unwrap();
        file.sync_data().unwrap();
        inner.sync_directory("").unwrap();
        file.write_at(0, &new).unwrap();
        let after = Arc::new(inner.crash(CrashMode::Torn { seed }));
        let reopened = sealed(&after, paged);
        let file = reopened.open("catalog", false).unwrap();
        assert_eq!(file.len().unwrap(), old.len() as u64);
        for index in 0..3 {
            let range = index * BLOCK_BYTES..(index + 1) * BLOCK_BYTES;
            let mut block = vec![0u8; BLOCK_BYTES];
            match file.read_at(range.start as u64, &mut block) {
                Ok(()) => {
                    let is_old = block == old[range.clone()];
                    assert!(is_old || block == new[range], "seed {seed} block {index}");
                    seen_old += usize::from(is_old);
                }
                Err(error) => {
                    assert!(index > 0, "seed {seed}: block 0 is paired: {error}");
                    assert!(error.is_corrupt(), "{error}");
                    errors += 1;
                }
            }
        }
    }
    assert!(seen_old > 0 && errors > 0, "torn crashes were simulated");
}

/// Goal: files sealed with another key, slots moved to another block and plain files are
/// refused with a message saying why. Method: each case on its own file.
#[test]
fn foreign_files_and_moved_slots_are_refused() {
    let inner = Arc::new(SimulatedStorage::new());
    let storage = sealed(&inner, single);
    let file = storage.open("f", true).unwrap();
    file.write_at(0, &pattern(4, 2 * BLOCK_BYTES)).unwrap();
    let other = SealedStorage::new(Arc::clone(&inner) as Arc<dyn Storage>, key(8), single);
    let error = other.open("f", false).unwrap_err();
    assert!(error.to_string().contains("another repository"), "{error}");

    let raw = inner.open("f", false).unwrap();
    let mut slot = vec![0u8; SLOT_BYTES];
    raw.read_at(HEADER_BYTES as u64, &mut slot).unwrap();
    raw.write_at((HEADER_BYTES + SLOT_BYTES) as u64, &slot)
        .unwrap();
    let mut buffer = vec![0u8; BLOCK_BYTES];
    let error = file.read_at(BLOCK_BYTES as u64, &mut buffer).unwrap_err();
    assert!(error.to_string().contains("block 1"), "{error}");

    let plain = inner.open("plain", true).unwrap();
    plain.write_at(0, &[0u8; 100]).unwrap();
    let error = storage.open("plain", false).unwrap_err();
    assert!(error.to_string().contains("without encryption"), "{error}");
}

/// Goal: `verify_file` finds unreadable blocks, and damaged older copies in the paired
/// layout that reads alone would not notice. Method: damage one slot of each kind.
#[test]
fn verify_reports_damaged_slots() {
    let inner = Arc::new(SimulatedStorage::new());
    let storage = sealed(&inner, paired);
    let file = storage.open("c", true).unwrap();
    file.write_at(0, &pattern(5, 3 * BLOCK_BYTES)).unwrap();
    file.sync_data().unwrap();
    // Rewritten but not synced: both slots hold content.
    file.write_at(0, &pattern(6, 3 * BLOCK_BYTES)).unwrap();
    assert_eq!(
        storage.verify_file("c").unwrap(),
        SealedFileReport {
            blocks: 3,
            ..SealedFileReport::default()
        }
    );
    let raw = inner.open("c", false).unwrap();
    let stride = 2 * SLOT_BYTES as u64;
    // Block 0: damage one slot; block 2: damage both.
    for position in [
        HEADER_BYTES as u64 + 100,
        HEADER_BYTES as u64 + 2 * stride + 100,
        HEADER_BYTES as u64 + 2 * stride + SLOT_BYTES as u64 + 100,
    ] {
        let mut byte = [0u8; 1];
        raw.read_at(position, &mut byte).unwrap();
        raw.write_at(position, &[!byte[0]]).unwrap();
    }
    let report = storage.verify_file("c").unwrap();
    assert_eq!(report.damaged_copies, vec![0]);
    assert_eq!(report.unreadable_blocks, vec![2]);
}

/// Goal: a file removed (or replaced by a rename) while a handle to it stays open, then made
/// again under the same name, is a new file: its content reads back through new handles.
/// Method: keep a handle to the old file, remove it, write a new one, reopen and read; the
/// same with a rename over the name.
#[test]
fn files_made_again_under_a_name_are_new_files() {
    let inner = Arc::new(SimulatedStorage::new());
    let storage = sealed(&inner, single);
    let old = storage.open("index", true).unwrap();
    old.write_at(0, &pattern(1, 3 * BLOCK_BYTES)).unwrap();
    storage.remove("index").unwrap();
    let new = storage.open("index", true).unwrap();
    let content = pattern(2, BLOCK_BYTES + 10);
    new.write_at(0, &content).unwrap();
    drop(new);
    assert_eq!(read_all(&storage, "index").unwrap(), content);

    let temporary = storage.open("index.tmp", true).unwrap();
    let replacement = pattern(3, 100);
    temporary.write_at(0, &replacement).unwrap();
    drop(temporary);
    let kept = storage.open("index", false).unwrap();
    storage.rename("index.tmp", "index").unwrap();
    assert_eq!(read_all(&storage, "index").unwrap(), replacement);
    drop((old, kept));
}
