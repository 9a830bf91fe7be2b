//! Fuzz-style property tests: random bytes and mutated real superblocks, group descriptors,
//! journal inodes and journal mapping blocks never make detection, derivation or
//! classification panic, never make derivation read without bound, and any map derived from
//! mutated bytes still satisfies the map's guarantees.

mod fs_support;

use fs_support::*;
use onecopy_block::hints::fs::{
    classify_block, derive_metadata_map, detect_superblock, write_touches_superblock, MetadataKind,
    MetadataMap, GROUPS_MAX, JOURNAL_MAP_BLOCKS_MAX,
};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::OnceLock;

const MIB: u64 = 1 << 20;

/// A real image and the byte ranges worth mutating: the superblock, descriptors, inode table
/// start (which holds the journal inode) and the journal's mapping blocks.
struct Target {
    image: PathBuf,
    volume_bytes: u64,
    regions: Vec<(u64, u64)>,
}

fn targets() -> &'static (tempfile::TempDir, Vec<Target>) {
    static TARGETS: OnceLock<(tempfile::TempDir, Vec<Target>)> = OnceLock::new();
    TARGETS.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let option_sets: [(&str, u64, &[&str]); 4] = [
            (
                "ext4-1k.img",
                16 * MIB,
                &["-t", "ext4", "-b", "1024", "-g", "1024"],
            ),
            (
                "ext3-1k.img",
                16 * MIB,
                &["-t", "ext3", "-b", "1024", "-J", "size=1"],
            ),
            (
                "ext4-meta-bg.img",
                16 * MIB,
                &[
                    "-t",
                    "ext4",
                    "-b",
                    "1024",
                    "-g",
                    "256",
                    "-O",
                    "meta_bg,^resize_inode",
                ],
            ),
            (
                "ext4-deep-journal.img",
                256 * MIB,
                &[
                    "-t", "ext4", "-b", "1024", "-O", "^flex_bg", "-J", "size=32",
                ],
            ),
        ];
        let mut targets = Vec::new();
        for (name, bytes, options) in option_sets {
            let image = sparse_image(dir.path(), name, bytes);
            mke2fs(&image, options);
            let map = derive_from_image(&image);
            let mut regions = vec![(1024, 2048)];
            for range in map.ranges() {
                let interesting = matches!(
                    range.kind,
                    MetadataKind::GroupDescriptors
                        | MetadataKind::ExtentNode
                        | MetadataKind::IndirectBlock
                        | MetadataKind::InodeTable
                );
                if interesting && range.start > 2048 {
                    // The first 4 KiB of an inode table hold the journal inode (inode 8).
                    regions.push((range.start, range.end.min(range.start + 4096)));
                }
            }
            regions.truncate(64);
            targets.push(Target {
                image,
                volume_bytes: bytes,
                regions,
            });
        }
        (dir, targets)
    })
}

/// Derives a map from `target`'s image with `mutations` (volume offset to byte) applied,
/// counting reads; the read count must stay within what the limits allow.
fn derive_mutated(target: &Target, mutations: &BTreeMap<u64, u8>) -> Result<MetadataMap, String> {
    let file = File::open(&target.image).unwrap();
    let mut reads = 0u64;
    let reads_max = GROUPS_MAX + JOURNAL_MAP_BLOCKS_MAX + 16;
    let mut read = |offset: u64, buffer: &mut [u8]| {
        reads += 1;
        assert!(reads <= reads_max, "derivation read without bound");
        file.read_exact_at(buffer, offset)?;
        let end = offset + buffer.len() as u64;
        for (&at, &byte) in mutations.range(offset..end) {
            buffer[(at - offset) as usize] = byte;
        }
        Ok(())
    };
    derive_metadata_map(target.volume_bytes, &mut read).map_err(|error| error.to_string())
}

/// Mutations: (target index, region index, offset fraction, byte or 32-bit value, width).
fn mutation_strategy() -> impl Strategy<Value = (usize, Vec<(usize, u32, u32, bool)>)> {
    (
        0usize..4,
        proptest::collection::vec(
            (
                0usize..64,
                any::<u32>(),
                prop_oneof![
                    Just(0u32),
                    Just(1),
                    Just(u32::MAX),
                    Just(0x8000_0000),
                    any::<u32>()
                ],
                any::<bool>(),
            ),
            1..12,
        ),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 384, failure_persistence: None, ..ProptestConfig::default() })]

    // Goal: mutated superblocks, descriptors, journal inodes and journal mapping blocks never
    // panic or read without bound; a map derived anyway keeps its guarantees.
    #[test]
    fn mutated_real_images((target_index, edits) in mutation_strategy()) {
        let (_, targets) = targets();
        let target = &targets[target_index];
        let mut mutations = BTreeMap::new();
        for (region_index, position, value, whole_word) in edits {
            // A quarter of the edits go to the superblock (region 0), the rest anywhere.
            let region_index = if region_index >= 48 { 0 } else { region_index % target.regions.len() };
            let (start, end) = target.regions[region_index];
            let at = start + u64::from(position) % (end - start);
            if whole_word {
                let at = at & !3;
                for (index, byte) in value.to_le_bytes().into_iter().enumerate() {
                    mutations.insert(at + index as u64, byte);
                }
            } else {
                mutations.insert(at, value as u8);
            }
        }
        if let Ok(map) = derive_mutated(target, &mutations) {
            assert_map_invariants(&map);
            prop_assert!(map.file_system_bytes() <= target.volume_bytes);
        }
    }

    // Goal: arbitrary bytes at arbitrary offsets never make detection or classification panic.
    #[test]
    fn random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..9000), offset in prop_oneof![Just(0u64), 0u64..4096, any::<u64>()]) {
        let _ = detect_superblock(offset, &data);
        let _ = write_touches_superblock(offset, data.len() as u64);
        for block_bytes in [1024usize, 2048, 4096, 8192] {
            if let Some(block) = data.get(..block_bytes) {
                let _ = classify_block(block);
            }
        }
        let _ = classify_block(&data);
    }

    // Goal: random volumes carrying the ext magic (so parsing goes past the first check) or the
    // xfs magic never panic derivation.
    #[test]
    fn random_volumes_with_magic_never_panic(mut head in proptest::collection::vec(any::<u8>(), 2048), xfs in any::<bool>(), volume_bytes in prop_oneof![Just(2048u64), 2048u64..(1 << 40)]) {
        if xfs {
            head[..4].copy_from_slice(b"XFSB");
        } else {
            head[1024 + 56] = 0x53;
            head[1024 + 57] = 0xEF;
        }
        let mut read = |offset: u64, buffer: &mut [u8]| {
            for (index, byte) in buffer.iter_mut().enumerate() {
                *byte = head.get(offset as usize + index).copied().unwrap_or((offset as u8).wrapping_add(index as u8));
            }
            Ok(())
        };
        if let Ok(map) = derive_metadata_map(volume_bytes, &mut read) {
            assert_map_invariants(&map);
        }
        let _ = detect_superblock(0, &head);
    }
}

// Goal: classifying mutated real metadata blocks never panics; method: take every extent
// node and descriptor block of the mutation targets and flip bytes at many positions.
#[test]
fn mutated_metadata_blocks_never_panic() {
    let (_, targets) = targets();
    let mut classified = 0usize;
    for target in targets {
        for &(start, end) in &target.regions {
            let block = read_image(&target.image, start, (end - start) as usize);
            for position in (0..block.len()).step_by(7) {
                for value in [0u8, 0xFF, 0x0A, 0xF3] {
                    let mut mutated = block.clone();
                    mutated[position] = value;
                    let _ = classify_block(&mutated);
                    classified += 1;
                }
            }
        }
    }
    assert!(classified > 1000);
}

// Goal: the mutation fuzzing reaches deep code: over many seeded mutation sets, some maps are
// still derived and the refusals come from several different checks (not just the magic).
#[test]
fn mutations_reach_many_checks() {
    let (_, targets) = targets();
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..1500 {
        let target = &targets[(next() % targets.len() as u64) as usize];
        let mut mutations = BTreeMap::new();
        for _ in 0..1 + next() % 3 {
            let region_index = if next() % 4 == 0 {
                0
            } else {
                next() % target.regions.len() as u64
            };
            let (start, end) = target.regions[region_index as usize];
            mutations.insert(start + next() % (end - start), next() as u8);
        }
        let outcome = match derive_mutated(target, &mutations) {
            Ok(map) => {
                assert_map_invariants(&map);
                "derived".to_string()
            }
            // Group errors by their message up to the first detail, numbers masked.
            Err(error) => error
                .split(':')
                .next()
                .unwrap()
                .chars()
                .map(|c| if c.is_ascii_digit() { '#' } else { c })
                .collect(),
        };
        *outcomes.entry(outcome).or_insert(0) += 1;
    }
    eprintln!("mutation outcomes: {outcomes:#?}");
    assert!(outcomes.get("derived").copied().unwrap_or(0) > 100);
    assert!(outcomes.len() >= 5, "{outcomes:?}");
}
