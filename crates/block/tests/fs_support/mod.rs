//! Shared helpers for the file-system hint tests: building images with the real tools
//! (e2fsprogs, xfsprogs) and reading their ground truth (dumpe2fs, debugfs, xfs_db).

#![allow(dead_code)]

use onecopy_block::hints::fs::{derive_metadata_map, MetadataKind, MetadataMap};
use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs a tool and returns its standard output; panics with the tool's error output when it
/// fails or is missing (install it with scripts/setup.sh).
pub fn run(program: &str, args: &[&str]) -> String {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|error| panic!("{program} not runnable ({error}); run scripts/setup.sh"));
    assert!(
        output.status.success(),
        "{program} {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A sparse image file of `bytes` bytes in `dir`.
pub fn sparse_image(dir: &Path, name: &str, bytes: u64) -> PathBuf {
    let path = dir.join(name);
    File::create(&path).unwrap().set_len(bytes).unwrap();
    path
}

/// Formats `image` with mke2fs and the given options (quiet, forced).
pub fn mke2fs(image: &Path, options: &[&str]) {
    let mut args = vec!["-q", "-F"];
    args.extend_from_slice(options);
    args.push(image.to_str().unwrap());
    run("mke2fs", &args);
}

/// Derives the metadata map of an image file through the public API.
pub fn derive_from_image(image: &Path) -> MetadataMap {
    let file = File::open(image).unwrap();
    let volume_bytes = file.metadata().unwrap().len();
    let mut read = |offset: u64, buffer: &mut [u8]| file.read_exact_at(buffer, offset);
    derive_metadata_map(volume_bytes, &mut read)
        .unwrap_or_else(|error| panic!("deriving the map of {image:?} failed: {error}"))
}

/// Reads `bytes` bytes at `offset` of an image.
pub fn read_image(image: &Path, offset: u64, bytes: usize) -> Vec<u8> {
    let mut buffer = vec![0u8; bytes];
    File::open(image)
        .unwrap()
        .read_exact_at(&mut buffer, offset)
        .unwrap();
    buffer
}

/// Parses "N" or "A-B" into an inclusive block range.
fn parse_block_span(text: &str) -> (u64, u64) {
    let text = text.trim();
    match text.split_once('-') {
        Some((first, last)) => (first.parse().unwrap(), last.parse().unwrap()),
        None => {
            let block = text.parse().unwrap();
            (block, block)
        }
    }
}

fn insert_span(truth: &mut BTreeMap<u64, MetadataKind>, span: (u64, u64), kind: MetadataKind) {
    for block in span.0..=span.1 {
        let previous = truth.insert(block, kind);
        assert!(
            previous.is_none() || previous == Some(kind),
            "ground truth lists block {block} as {previous:?} and {kind:?}"
        );
    }
}

/// Every block dumpe2fs lists as a superblock, descriptor, reserved descriptor, bitmap or
/// inode table block (all groups), plus the MMP block, with its kind.
pub fn dumpe2fs_metadata(image: &Path) -> BTreeMap<u64, MetadataKind> {
    let output = run("dumpe2fs", &[image.to_str().unwrap()]);
    let mut truth = BTreeMap::new();
    let prefixes = [
        ("Primary superblock at ", MetadataKind::Superblock),
        ("Backup superblock at ", MetadataKind::Superblock),
        ("Group descriptors at ", MetadataKind::GroupDescriptors),
        ("Group descriptor at ", MetadataKind::GroupDescriptors),
        (
            "Reserved GDT blocks at ",
            MetadataKind::ReservedGroupDescriptors,
        ),
        ("Block bitmap at ", MetadataKind::BlockBitmap),
        ("Inode bitmap at ", MetadataKind::InodeBitmap),
        ("Inode table at ", MetadataKind::InodeTable),
    ];
    for line in output.lines() {
        if let Some(value) = line.strip_prefix("MMP block number:") {
            let block = value.trim().parse().unwrap();
            insert_span(
                &mut truth,
                (block, block),
                MetadataKind::MultiMountProtection,
            );
            continue;
        }
        for clause in line.trim().split(", ") {
            for (prefix, kind) in prefixes {
                if let Some(rest) = clause.strip_prefix(prefix) {
                    // "Inode table at 35-98 (+34)": the span ends at the first space.
                    let span = rest.split(' ').next().unwrap();
                    insert_span(&mut truth, parse_block_span(span), kind);
                }
            }
        }
    }
    truth
}

/// The blocks of inode `inode` as `debugfs -R 'stat <inode>'` lists them: data blocks as
/// `data_kind`, extent-tree blocks (ETBn) as ExtentNode, IND/DIND/TIND as IndirectBlock.
pub fn debugfs_inode_blocks(
    image: &Path,
    inode: &str,
    data_kind: MetadataKind,
) -> BTreeMap<u64, MetadataKind> {
    let output = run(
        "debugfs",
        &["-R", &format!("stat {inode}"), image.to_str().unwrap()],
    );
    let mut truth = BTreeMap::new();
    let mut in_list = false;
    for line in output.lines() {
        if line.starts_with("EXTENTS:") || line.starts_with("BLOCKS:") {
            in_list = true;
            continue;
        }
        if !in_list || line.starts_with("TOTAL") || line.trim().is_empty() {
            continue;
        }
        for token in line.split(", ") {
            let label = token.trim().trim_start_matches('(');
            let label = &label[..label.find(')').unwrap()];
            let span = parse_block_span(&token[token.rfind(':').unwrap() + 1..]);
            let kind = if label.starts_with("ETB") {
                MetadataKind::ExtentNode
            } else if label.ends_with("IND") {
                MetadataKind::IndirectBlock
            } else {
                data_kind
            };
            insert_span(&mut truth, span, kind);
        }
    }
    truth
}

/// The map's ranges as a block-number to kind table; panics if a range is not block-aligned.
pub fn map_blocks(map: &MetadataMap) -> BTreeMap<u64, MetadataKind> {
    let block_bytes = u64::from(map.block_bytes());
    let mut blocks = BTreeMap::new();
    for range in map.ranges() {
        assert_eq!(range.start % block_bytes, 0, "unaligned range {range:?}");
        assert_eq!(range.end % block_bytes, 0, "unaligned range {range:?}");
        for block in range.start / block_bytes..range.end / block_bytes {
            blocks.insert(block, range.kind);
        }
    }
    blocks
}

/// Asserts two block tables are equal, listing the first differences when they are not.
pub fn assert_same_blocks(
    label: &str,
    derived: &BTreeMap<u64, MetadataKind>,
    truth: &BTreeMap<u64, MetadataKind>,
) {
    let extra: Vec<_> = derived
        .iter()
        .filter(|(block, kind)| truth.get(block) != Some(kind))
        .take(10)
        .collect();
    let missing: Vec<_> = truth
        .iter()
        .filter(|(block, kind)| derived.get(block) != Some(kind))
        .take(10)
        .collect();
    assert!(
        extra.is_empty() && missing.is_empty(),
        "{label}: derived but not (or differently) in ground truth: {extra:?}; \
         in ground truth but not derived: {missing:?}"
    );
}

/// Asserts the structural guarantees of a map: sorted, disjoint, non-empty, inside the file
/// system, touching neighbours of different kinds.
pub fn assert_map_invariants(map: &MetadataMap) {
    for range in map.ranges() {
        assert!(range.start < range.end);
        assert!(range.end <= map.file_system_bytes());
    }
    for pair in map.ranges().windows(2) {
        assert!(pair[0].end <= pair[1].start);
        assert!(pair[0].end < pair[1].start || pair[0].kind != pair[1].kind);
    }
}
