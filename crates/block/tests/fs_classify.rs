//! The content classifier on real metadata blocks (extent-tree nodes, directory blocks, htree
//! index blocks, extended-attribute blocks) taken from images built by mke2fs -d and indexed
//! by e2fsck -D, and on real data blocks (executables, libraries, documentation, random and
//! zero blocks), which must never be classified as metadata.

mod fs_support;

use fs_support::*;
use onecopy_block::hints::fs::{classify_block, MetadataKind, MetadataMap};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const MIB: u64 = 1 << 20;
const DIRECTORY_FILES: usize = 3000;
const FRAGMENTS: u64 = 600;

/// A source tree with a directory of many long-named files and a file of `FRAGMENTS`
/// one-KiB pieces separated by holes (so its extent tree needs index and leaf blocks).
fn build_source(root: &Path) {
    let many = root.join("many");
    std::fs::create_dir_all(&many).unwrap();
    for index in 0..DIRECTORY_FILES {
        let name = format!("a_rather_long_file_name_to_fill_directory_blocks_{index}");
        std::fs::write(many.join(name), []).unwrap();
    }
    let fragmented = std::fs::File::create(root.join("fragmented")).unwrap();
    use std::os::unix::fs::FileExt;
    for index in 0..FRAGMENTS {
        fragmented
            .write_all_at(&[(index % 251) as u8 + 1; 1024], index * 8192)
            .unwrap();
    }
}

/// Data block numbers of a path in logical order: `debugfs -R 'blocks PATH'` lists them, and
/// mapping blocks (indirect or extent-tree blocks, which `blocks` includes) are removed using
/// debugfs's `stat` listing.
fn debugfs_blocks(image: &Path, path: &str) -> Vec<u64> {
    let mapping = debugfs_inode_blocks(image, path, MetadataKind::Directory);
    run(
        "debugfs",
        &["-R", &format!("blocks {path}"), image.to_str().unwrap()],
    )
    .split_whitespace()
    .map(|word| word.parse().unwrap())
    .filter(|block| mapping.get(block) == Some(&MetadataKind::Directory))
    .collect()
}

fn read_block(image: &Path, map: &MetadataMap, block: u64) -> Vec<u8> {
    let block_bytes = u64::from(map.block_bytes());
    read_image(image, block * block_bytes, block_bytes as usize)
}

/// Classifies `block` with and without file-system bounds and checks both agree.
fn classify_both(map: &MetadataMap, block: &[u8]) -> Option<MetadataKind> {
    let with_bounds = map.classify_block(block);
    assert_eq!(with_bounds, classify_block(block));
    with_bounds
}

fn build_image(dir: &Path, options: &[&str]) -> PathBuf {
    let source = dir.join("source");
    build_source(&source);
    let image = sparse_image(dir, "volume.img", 256 * MIB);
    let mut args = options.to_vec();
    args.extend_from_slice(&["-d", source.to_str().unwrap()]);
    mke2fs(&image, &args);
    image
}

/// Checks every extent-tree block of the fragmented file and every block of the linear
/// directory; returns (extent nodes, directory blocks) checked.
fn check_extent_and_linear_directory(image: &Path) -> (usize, usize) {
    let map = derive_from_image(image);
    let fragmented = debugfs_inode_blocks(image, "/fragmented", MetadataKind::Journal);
    let extent_nodes: Vec<u64> = fragmented
        .iter()
        .filter(|(_, kind)| **kind == MetadataKind::ExtentNode)
        .map(|(block, _)| *block)
        .collect();
    for &block in &extent_nodes {
        let bytes = read_block(image, &map, block);
        assert_eq!(
            classify_both(&map, &bytes),
            Some(MetadataKind::ExtentNode),
            "block {block}"
        );
    }
    let directory = debugfs_blocks(image, "/many");
    assert!(directory.len() > 1);
    for &block in &directory {
        let bytes = read_block(image, &map, block);
        assert_eq!(
            classify_both(&map, &bytes),
            Some(MetadataKind::Directory),
            "block {block}"
        );
    }
    (extent_nodes.len(), directory.len())
}

// Goal: extent index and leaf nodes (depth 2 with 1 KiB blocks) and directory blocks with the
// metadata_csum tail are recognised; method: blocks located by debugfs in an ext4 image.
#[test]
fn ext4_extent_nodes_and_directory_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let image = build_image(dir.path(), &["-t", "ext4", "-b", "1024"]);
    let (extent_nodes, directory_blocks) = check_extent_and_linear_directory(&image);
    let stat = run(
        "debugfs",
        &["-R", "stat /fragmented", image.to_str().unwrap()],
    );
    assert!(stat.contains("(ETB1)"), "expected a depth-2 extent tree");
    assert!(extent_nodes >= 3);
    assert!(directory_blocks > 10);
}

// Goal: the same with 4 KiB blocks, and for ext3 directory blocks without a checksum tail.
#[test]
fn ext4_4k_and_ext3_directory_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let image = build_image(dir.path(), &["-t", "ext4", "-b", "4096"]);
    check_extent_and_linear_directory(&image);
    let dir = tempfile::tempdir().unwrap();
    let image = build_image(dir.path(), &["-t", "ext3", "-b", "2048"]);
    let map = derive_from_image(&image);
    for block in debugfs_blocks(&image, "/many") {
        let bytes = read_block(&image, &map, block);
        assert_eq!(
            classify_both(&map, &bytes),
            Some(MetadataKind::Directory),
            "block {block}"
        );
    }
}

/// Builds an image with `options`, indexes its big directory with e2fsck -D, and checks the
/// dx root, the interior dx nodes (debugfs's htree dump confirms two levels) and the leaves.
fn check_htree(options: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let image = build_image(dir.path(), options);
    let status = Command::new("e2fsck")
        .args(["-fyD", image.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        status.status.code().is_some_and(|code| code <= 1),
        "e2fsck -D failed"
    );
    let htree = run("debugfs", &["-R", "htree /many", image.to_str().unwrap()]);
    assert!(
        htree.contains("Indirect levels: 1"),
        "expected a two-level index: {htree:.300}"
    );
    let map = derive_from_image(&image);
    let blocks = debugfs_blocks(&image, "/many");
    let mut kinds = BTreeMap::new();
    for (logical, &block) in blocks.iter().enumerate() {
        let bytes = read_block(&image, &map, block);
        let kind = classify_both(&map, &bytes);
        if logical == 0 {
            assert_eq!(kind, Some(MetadataKind::DirectoryIndex), "dx root");
        }
        *kinds.entry(kind).or_insert(0usize) += 1;
    }
    assert_eq!(
        kinds.get(&None),
        None,
        "every block of the directory is recognised"
    );
    assert!(
        kinds[&Some(MetadataKind::DirectoryIndex)] >= 2,
        "root and dx nodes: {kinds:?}"
    );
    assert!(kinds[&Some(MetadataKind::Directory)] > 10);
}

// Goal: htree blocks with metadata_csum tails (ext4) are recognised: the dx root, interior dx
// nodes of a two-level index, and the leaves as directory blocks.
#[test]
fn htree_with_checksum_tails() {
    check_htree(&["-t", "ext4", "-b", "1024"]);
}

// Goal: the same for ext3 htree blocks, which have no checksum tails.
#[test]
fn htree_without_checksum_tails() {
    check_htree(&["-t", "ext3", "-b", "1024"]);
}

// Goal: an external extended-attribute block is recognised; method: debugfs stores a value
// too large for the inode, then stat names the block ("File ACL").
#[test]
fn extended_attribute_block() {
    let dir = tempfile::tempdir().unwrap();
    let image = sparse_image(dir.path(), "volume.img", 64 * MIB);
    mke2fs(&image, &["-t", "ext4"]);
    let value = dir.path().join("value");
    std::fs::write(&value, vec![b'v'; 600]).unwrap();
    run(
        "debugfs",
        &["-w", "-R", "write /dev/null file", image.to_str().unwrap()],
    );
    let set = format!("ea_set -f {} /file user.big", value.to_str().unwrap());
    run("debugfs", &["-w", "-R", &set, image.to_str().unwrap()]);
    let stat = run("debugfs", &["-R", "stat /file", image.to_str().unwrap()]);
    let block: u64 = stat
        .split("File ACL: ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|word| word.parse().ok())
        .expect("an external attribute block");
    assert_ne!(block, 0);
    let map = derive_from_image(&image);
    let bytes = read_block(&image, &map, block);
    assert_eq!(
        classify_both(&map, &bytes),
        Some(MetadataKind::ExtendedAttributes)
    );
}

/// Files under `root` (recursively, regular files only, no symlinks), sorted.
fn files_under(root: &Path, files: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    let mut entries: Vec<_> = entries.filter_map(Result::ok).collect();
    entries.sort_by_key(|entry| entry.path());
    for entry in entries {
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            files_under(&entry.path(), files);
        } else if kind.is_file() {
            files.push(entry.path());
        }
    }
}

/// A deterministic xorshift stream for random blocks.
fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

// Goal: real file contents are never classified as metadata (false-positive rate 0); method:
// classify every 1, 2 and 4 KiB block of up to 24 MiB of executables, libraries and
// documentation from /usr, plus random and zero blocks.
#[test]
fn data_blocks_are_not_metadata() {
    const BYTES_PER_TREE_MAX: usize = 8 << 20;
    let mut blocks_checked = [0usize; 3];
    let mut false_positives = Vec::new();
    for tree in ["/usr/bin", "/usr/lib/x86_64-linux-gnu", "/usr/share/doc"] {
        let mut files = Vec::new();
        files_under(Path::new(tree), &mut files);
        let mut bytes_read = 0usize;
        for file in files {
            if bytes_read >= BYTES_PER_TREE_MAX {
                break;
            }
            let Ok(contents) = std::fs::read(&file) else {
                continue;
            };
            bytes_read += contents.len();
            for (slot, block_bytes) in [1024usize, 2048, 4096].into_iter().enumerate() {
                for block in contents.chunks_exact(block_bytes) {
                    blocks_checked[slot] += 1;
                    if let Some(kind) = classify_block(block) {
                        false_positives.push((file.clone(), block_bytes, kind));
                    }
                }
            }
        }
    }
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..3000 {
        let block: Vec<u8> = (0..512)
            .flat_map(|_| xorshift(&mut state).to_le_bytes())
            .collect();
        blocks_checked[2] += 1;
        assert_eq!(classify_block(&block), None);
        assert_eq!(classify_block(&block[..1024]), None);
    }
    assert_eq!(classify_block(&[0u8; 4096]), None);
    eprintln!("data blocks classified (1 KiB, 2 KiB, 4 KiB): {blocks_checked:?}");
    eprintln!("false positives: {}", false_positives.len());
    assert!(
        blocks_checked[2] > 5000,
        "too few real data blocks found: {blocks_checked:?}"
    );
    assert!(
        false_positives.is_empty(),
        "false positives: {:?}",
        &false_positives[..false_positives.len().min(10)]
    );
}
