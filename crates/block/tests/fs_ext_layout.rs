//! The derived ext2/3/4 metadata map against ground truth from dumpe2fs (group structures)
//! and debugfs (the journal inode's blocks), on images built by mke2fs with many option sets.

mod fs_support;

use fs_support::*;
use onecopy_block::hints::fs::{
    detect_superblock, FileSystemKind, JournalPlacement, MetadataKind, SUPERBLOCK_PROBE_BYTES,
};
use std::path::Path;

/// Formats an image of `image_bytes` with `options`, derives its map and compares it block by
/// block with dumpe2fs and, when the file system has an internal journal, debugfs's listing of
/// inode 8. Returns the number of metadata blocks compared.
fn check_against_ground_truth(
    image_bytes: u64,
    options: &[&str],
    expected: FileSystemKind,
    expect_journal: bool,
) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let image = sparse_image(dir.path(), "volume.img", image_bytes);
    mke2fs(&image, options);
    compare_image(&image, expected, expect_journal)
}

fn compare_image(image: &Path, expected: FileSystemKind, expect_journal: bool) -> usize {
    let map = derive_from_image(image);
    assert_map_invariants(&map);
    assert_eq!(map.file_system(), expected);
    let mut truth = dumpe2fs_metadata(image);
    if expect_journal {
        let journal = debugfs_inode_blocks(image, "<8>", MetadataKind::Journal);
        assert!(journal.values().any(|kind| *kind == MetadataKind::Journal));
        truth.extend(journal);
        assert!(matches!(map.journal(), JournalPlacement::Internal { .. }));
    } else {
        assert_eq!(map.journal(), JournalPlacement::None);
    }
    let derived = map_blocks(&map);
    assert_same_blocks(&format!("{image:?}"), &derived, &truth);
    let head = read_image(image, 0, SUPERBLOCK_PROBE_BYTES);
    let detected = detect_superblock(0, &head).expect("superblock detected");
    assert_eq!(detected.file_system, expected);
    assert_eq!(&detected.layout, map.layout());
    truth.len()
}

const MIB: u64 = 1 << 20;

// Goal: default ext4 (4 KiB blocks, flex_bg, 64bit, metadata_csum, uninit groups) matches.
#[test]
fn ext4_default_4k() {
    check_against_ground_truth(1024 * MIB, &["-t", "ext4"], FileSystemKind::Ext4, true);
}

// Goal: 1 KiB blocks (first data block 1, superblock in block 1) match.
#[test]
fn ext4_1k_blocks() {
    check_against_ground_truth(
        64 * MIB,
        &["-t", "ext4", "-b", "1024"],
        FileSystemKind::Ext4,
        true,
    );
}

// Goal: 2 KiB blocks match.
#[test]
fn ext4_2k_blocks() {
    check_against_ground_truth(
        256 * MIB,
        &["-t", "ext4", "-b", "2048"],
        FileSystemKind::Ext4,
        true,
    );
}

// Goal: without flex_bg, bitmaps and inode tables sit in their own groups, and the journal
// spans several groups so its extent tree needs an index node (depth 1).
#[test]
fn ext4_without_flex_bg_and_deep_journal_tree() {
    let dir = tempfile::tempdir().unwrap();
    let image = sparse_image(dir.path(), "volume.img", 256 * MIB);
    mke2fs(
        &image,
        &[
            "-t", "ext4", "-b", "1024", "-O", "^flex_bg", "-J", "size=32",
        ],
    );
    let journal = debugfs_inode_blocks(&image, "<8>", MetadataKind::Journal);
    assert!(
        journal
            .values()
            .any(|kind| *kind == MetadataKind::ExtentNode),
        "the journal should have an extent index node"
    );
    compare_image(&image, FileSystemKind::Ext4, true);
}

// Goal: 32-bit group descriptors (no 64bit feature) match.
#[test]
fn ext4_32bit_descriptors() {
    check_against_ground_truth(
        512 * MIB,
        &["-t", "ext4", "-O", "^64bit"],
        FileSystemKind::Ext4,
        true,
    );
}

// Goal: 64-bit descriptors with 1 KiB blocks (16 descriptors a block) over many groups match.
#[test]
fn ext4_64bit_many_groups() {
    check_against_ground_truth(
        128 * MIB,
        &["-t", "ext4", "-b", "1024", "-O", "64bit", "-g", "1024"],
        FileSystemKind::Ext4,
        true,
    );
}

// Goal: meta_bg descriptor placement (first, second and last group of each meta group).
#[test]
fn ext4_meta_bg() {
    check_against_ground_truth(
        64 * MIB,
        &[
            "-t",
            "ext4",
            "-b",
            "1024",
            "-g",
            "1024",
            "-O",
            "meta_bg,^resize_inode",
        ],
        FileSystemKind::Ext4,
        true,
    );
}

// Goal: meta_bg with `first_meta_bg` above zero (what an online resize leaves behind): the
// first meta group keeps classic descriptor copies after each superblock backup; method:
// mke2fs cannot create this, so debugfs sets first_meta_bg to 1 on a meta_bg file system,
// which leaves descriptor block 0 where it was and keeps the file system consistent, and
// dumpe2fs (e2fsprogs' own placement code) gives the ground truth.
#[test]
fn ext4_meta_bg_with_classic_first_meta_group() {
    let dir = tempfile::tempdir().unwrap();
    let image = sparse_image(dir.path(), "volume.img", 64 * MIB);
    mke2fs(
        &image,
        &[
            "-t",
            "ext4",
            "-b",
            "1024",
            "-g",
            "1024",
            "-O",
            "meta_bg,^resize_inode",
        ],
    );
    run(
        "debugfs",
        &["-w", "-R", "ssv first_meta_bg 1", image.to_str().unwrap()],
    );
    let header = run("dumpe2fs", &["-h", image.to_str().unwrap()]);
    assert!(header.contains("First meta block group:   1"), "{header}");
    compare_image(&image, FileSystemKind::Ext4, true);
}

// Goal: meta_bg with 32-byte descriptors and 4 KiB blocks.
#[test]
fn ext4_meta_bg_32bit_4k() {
    check_against_ground_truth(
        2048 * MIB,
        &[
            "-t",
            "ext4",
            "-g",
            "2048",
            "-O",
            "meta_bg,^resize_inode,^64bit",
        ],
        FileSystemKind::Ext4,
        true,
    );
}

// Goal: sparse_super2 keeps superblock backups only in the two listed groups.
#[test]
fn ext4_sparse_super2() {
    check_against_ground_truth(
        256 * MIB,
        &["-t", "ext4", "-b", "1024", "-O", "sparse_super2"],
        FileSystemKind::Ext4,
        true,
    );
}

// Goal: without sparse_super, every group holds superblock and descriptor backups.
#[test]
fn ext2_without_sparse_super() {
    check_against_ground_truth(
        64 * MIB,
        &[
            "-t",
            "ext2",
            "-b",
            "1024",
            "-O",
            "^sparse_super,^resize_inode",
        ],
        FileSystemKind::Ext2,
        false,
    );
}

// Goal: plain ext2 with 4 KiB blocks and the resize inode's reserved descriptor blocks.
#[test]
fn ext2_default() {
    check_against_ground_truth(512 * MIB, &["-t", "ext2"], FileSystemKind::Ext2, false);
}

// Goal: ext3's journal is an indirect block map (single and double indirect blocks).
#[test]
fn ext3_indirect_journal() {
    check_against_ground_truth(
        64 * MIB,
        &["-t", "ext3", "-b", "1024", "-J", "size=4"],
        FileSystemKind::Ext3,
        true,
    );
}

// Goal: an ext3 journal large enough to need a triple indirect block.
#[test]
fn ext3_triple_indirect_journal() {
    let dir = tempfile::tempdir().unwrap();
    let image = sparse_image(dir.path(), "volume.img", 512 * MIB);
    mke2fs(&image, &["-t", "ext3", "-b", "1024", "-J", "size=80"]);
    let output = run("debugfs", &["-R", "stat <8>", image.to_str().unwrap()]);
    assert!(
        output.contains("(TIND)"),
        "journal should use a triple indirect block"
    );
    compare_image(&image, FileSystemKind::Ext3, true);
}

// Goal: ext3 with 4 KiB blocks.
#[test]
fn ext3_4k() {
    check_against_ground_truth(256 * MIB, &["-t", "ext3"], FileSystemKind::Ext3, true);
}

// Goal: the multi-mount-protection block is in the map.
#[test]
fn ext4_mmp() {
    let blocks = check_against_ground_truth(
        128 * MIB,
        &["-t", "ext4", "-O", "mmp"],
        FileSystemKind::Ext4,
        true,
    );
    assert!(blocks > 0);
}

// Goal: bigalloc (16 KiB clusters of 4 KiB blocks) matches.
#[test]
fn ext4_bigalloc() {
    check_against_ground_truth(
        512 * MIB,
        &["-t", "ext4", "-O", "bigalloc", "-C", "16384"],
        FileSystemKind::Ext4,
        true,
    );
}

// Goal: a populated file system (mke2fs -d) has the same fixed metadata.
#[test]
fn ext4_populated() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("source");
    std::fs::create_dir_all(source.join("directory")).unwrap();
    for index in 0..200 {
        std::fs::write(
            source.join("directory").join(format!("file-{index}")),
            index.to_string(),
        )
        .unwrap();
    }
    let image = sparse_image(dir.path(), "volume.img", 128 * MIB);
    mke2fs(
        &image,
        &["-t", "ext4", "-b", "2048", "-d", source.to_str().unwrap()],
    );
    compare_image(&image, FileSystemKind::Ext4, true);
}

// Goal: a superblock that names an external journal yields JournalPlacement::External and no
// journal ranges; method: mke2fs cannot attach a file as journal device, so debugfs rewrites
// the superblock's journal fields the way `mke2fs -J device=` would have set them.
#[test]
fn ext4_external_journal() {
    let dir = tempfile::tempdir().unwrap();
    let image = sparse_image(dir.path(), "volume.img", 128 * MIB);
    mke2fs(&image, &["-t", "ext4", "-O", "^has_journal"]);
    run(
        "debugfs",
        &[
            "-w",
            "-R",
            "ssv feature_compat 0x3c",
            image.to_str().unwrap(),
        ],
    );
    run(
        "debugfs",
        &[
            "-w",
            "-R",
            "ssv journal_dev 0x0801",
            image.to_str().unwrap(),
        ],
    );
    let map = derive_from_image(&image);
    assert_eq!(map.journal(), JournalPlacement::External);
    assert!(map.ranges().iter().all(|range| !range.kind.is_journal()));
    assert_same_blocks(
        "external journal",
        &map_blocks(&map),
        &dumpe2fs_metadata(&image),
    );
}

// Goal: an external journal device (mke2fs -O journal_dev) is journal from end to end.
#[test]
fn ext_journal_device() {
    let dir = tempfile::tempdir().unwrap();
    let image = sparse_image(dir.path(), "journal.img", 16 * MIB);
    mke2fs(&image, &["-O", "journal_dev", "-b", "4096"]);
    let map = derive_from_image(&image);
    assert_eq!(map.file_system(), FileSystemKind::ExtJournalDevice);
    assert_eq!(map.ranges().len(), 1);
    assert_eq!(map.ranges()[0].kind, MetadataKind::Journal);
    assert_eq!((map.ranges()[0].start, map.ranges()[0].end), (0, 16 * MIB));
}

// Goal: the layout key ignores changes that do not move metadata (label, mount-count limit)
// and changes when the file system grows; the grown map matches dumpe2fs again.
#[test]
fn layout_key_tracks_layout_changes_only() {
    let dir = tempfile::tempdir().unwrap();
    let image = sparse_image(dir.path(), "volume.img", 64 * MIB);
    mke2fs(&image, &["-t", "ext4", "-b", "1024"]);
    let before = derive_from_image(&image);
    run(
        "tune2fs",
        &["-L", "renamed", "-c", "25", image.to_str().unwrap()],
    );
    let head = read_image(&image, 0, SUPERBLOCK_PROBE_BYTES);
    assert_eq!(
        &detect_superblock(0, &head).unwrap().layout,
        before.layout()
    );
    std::fs::OpenOptions::new()
        .write(true)
        .open(&image)
        .unwrap()
        .set_len(256 * MIB)
        .unwrap();
    run("resize2fs", &[image.to_str().unwrap()]);
    let head = read_image(&image, 0, SUPERBLOCK_PROBE_BYTES);
    assert_ne!(
        &detect_superblock(0, &head).unwrap().layout,
        before.layout()
    );
    compare_image(&image, FileSystemKind::Ext4, true);
}

// Goal: the journal walker follows an extent tree of depth 2 (index, index, leaves); method:
// mke2fs never builds such a journal, so the superblock's journal inode number is pointed at
// a file of 600 holes-separated fragments (1 KiB blocks), whose tree debugfs lists.
#[test]
fn journal_with_depth_two_extent_tree() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("source");
    std::fs::create_dir_all(&source).unwrap();
    let fragmented = std::fs::File::create(source.join("fragmented")).unwrap();
    use std::os::unix::fs::FileExt;
    for index in 0..600u64 {
        fragmented.write_all_at(&[1u8; 1024], index * 8192).unwrap();
    }
    let image = sparse_image(dir.path(), "volume.img", 64 * MIB);
    mke2fs(
        &image,
        &["-t", "ext4", "-b", "1024", "-d", source.to_str().unwrap()],
    );
    let stat = run(
        "debugfs",
        &["-R", "stat /fragmented", image.to_str().unwrap()],
    );
    assert!(stat.contains("(ETB1)"), "expected a depth-2 tree");
    let inode: u32 = stat
        .split("Inode: ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|word| word.parse().ok())
        .unwrap();
    // dumpe2fs refuses a journal inode without a journal superblock: read the groups first.
    let mut truth = dumpe2fs_metadata(&image);
    let set = format!("ssv journal_inum {inode}");
    run("debugfs", &["-w", "-R", &set, image.to_str().unwrap()]);
    let map = derive_from_image(&image);
    truth.extend(debugfs_inode_blocks(
        &image,
        &format!("<{inode}>"),
        MetadataKind::Journal,
    ));
    assert_same_blocks("depth-2 journal", &map_blocks(&map), &truth);
}
