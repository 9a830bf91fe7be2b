//! The derived xfs map against xfs_db: the internal log's byte range (log start converted
//! from an AG-packed fsblock by xfs_db itself) and the allocation-group headers (checked by
//! the magic numbers in the image).

mod fs_support;

use fs_support::*;
use onecopy_block::hints::fs::{
    detect_superblock, FileSystemKind, JournalPlacement, MetadataKind, SUPERBLOCK_PROBE_BYTES,
};
use std::path::Path;

const MIB: u64 = 1 << 20;

/// Reads superblock fields with `xfs_db -r -c 'sb 0' -c 'print <field>'`.
fn xfs_db_field(image: &Path, field: &str) -> u64 {
    let output = run(
        "xfs_db",
        &[
            "-r",
            "-c",
            "sb 0",
            "-c",
            &format!("print {field}"),
            image.to_str().unwrap(),
        ],
    );
    let value = output.split('=').nth(1).unwrap().trim();
    value
        .parse()
        .unwrap_or_else(|_| panic!("field {field} = {value:?}"))
}

/// The byte offset xfs_db gives for fsblock `block` (`convert fsblock N byte`).
fn xfs_db_fsblock_byte(image: &Path, block: u64) -> u64 {
    let output = run(
        "xfs_db",
        &[
            "-r",
            "-c",
            &format!("convert fsblock {block} byte"),
            image.to_str().unwrap(),
        ],
    );
    // Output looks like "0xf006000 (251682816)".
    let decimal = output
        .split('(')
        .nth(1)
        .unwrap()
        .trim_end()
        .trim_end_matches(')');
    decimal.parse().unwrap()
}

/// Formats an image with mkfs.xfs `options`, derives its map and checks the log range and
/// every AG header against xfs_db and the image's bytes. Returns the map.
fn check_xfs(image_bytes: u64, options: &[&str]) -> onecopy_block::hints::fs::MetadataMap {
    let dir = tempfile::tempdir().unwrap();
    let image = sparse_image(dir.path(), "volume.img", image_bytes);
    let mut args = vec!["-q", "-f"];
    args.extend_from_slice(options);
    args.push(image.to_str().unwrap());
    run("mkfs.xfs", &args);
    let map = derive_from_image(&image);
    assert_map_invariants(&map);
    assert_eq!(map.file_system(), FileSystemKind::Xfs);
    let block_bytes = xfs_db_field(&image, "blocksize");
    assert_eq!(u64::from(map.block_bytes()), block_bytes);
    let log_start = xfs_db_field(&image, "logstart");
    let log_blocks = xfs_db_field(&image, "logblocks");
    let logs: Vec<_> = map
        .ranges()
        .iter()
        .filter(|r| r.kind == MetadataKind::XfsLog)
        .collect();
    assert_eq!(logs.len(), 1);
    let log_byte = xfs_db_fsblock_byte(&image, log_start);
    assert_eq!(
        (logs[0].start, logs[0].end),
        (log_byte, log_byte + log_blocks * block_bytes)
    );
    assert_eq!(
        map.journal(),
        JournalPlacement::Internal {
            journal_bytes: log_blocks * block_bytes
        }
    );

    let ag_count = xfs_db_field(&image, "agcount");
    let ag_blocks = xfs_db_field(&image, "agblocks");
    let sector_bytes = xfs_db_field(&image, "sectsize");
    let headers: Vec<_> = map
        .ranges()
        .iter()
        .filter(|r| r.kind == MetadataKind::XfsAllocationGroupHeaders)
        .collect();
    assert_eq!(headers.len() as u64, ag_count);
    for (ag, header) in (0u64..).zip(&headers) {
        let start = ag * ag_blocks * block_bytes;
        assert_eq!(header.start, start);
        assert_eq!(
            header.end,
            start + (4 * sector_bytes).div_ceil(block_bytes) * block_bytes
        );
        let bytes = read_image(&image, start, 4 * sector_bytes as usize);
        let magic = |sector: u64| &bytes[(sector * sector_bytes) as usize..][..4];
        assert_eq!(magic(0), b"XFSB", "AG {ag}");
        assert_eq!(magic(1), b"XAGF", "AG {ag}");
        assert_eq!(magic(2), b"XAGI", "AG {ag}");
    }
    let head = read_image(&image, 0, SUPERBLOCK_PROBE_BYTES);
    let detected = detect_superblock(0, &head).unwrap();
    assert_eq!(detected.file_system, FileSystemKind::Xfs);
    assert_eq!(&detected.layout, map.layout());
    map
}

// Goal: with five AGs (AG size not a power of two) the log sits in a middle AG, so the
// agno/agblock split of the log start must be right.
#[test]
fn xfs_log_in_middle_ag() {
    let map = check_xfs(600 * MIB, &["-d", "agcount=5"]);
    let log = map
        .ranges()
        .iter()
        .find(|r| r.kind == MetadataKind::XfsLog)
        .unwrap();
    assert!(log.start > 0);
}

// Goal: 1 KiB blocks with seven AGs.
#[test]
fn xfs_1k_blocks() {
    check_xfs(512 * MIB, &["-b", "size=1024", "-d", "agcount=7"]);
}

// Goal: 4 KiB sectors, so the four AG header sectors span four blocks.
#[test]
fn xfs_4k_sectors() {
    let map = check_xfs(512 * MIB, &["-s", "size=4096"]);
    let header = map.ranges()[0];
    assert_eq!(header.end - header.start, 4 * 4096);
}

// Goal: 64 KiB blocks.
#[test]
fn xfs_64k_blocks() {
    check_xfs(1024 * MIB, &["-b", "size=65536"]);
}

// Goal: the log placed in AG 0 by request.
#[test]
fn xfs_log_in_first_ag() {
    check_xfs(512 * MIB, &["-l", "agnum=0", "-d", "agcount=4"]);
}

// Goal: an external log yields JournalPlacement::External and no log range.
#[test]
fn xfs_external_log() {
    let dir = tempfile::tempdir().unwrap();
    let image = sparse_image(dir.path(), "volume.img", 512 * MIB);
    let log = sparse_image(dir.path(), "log.img", 80 * MIB);
    let log_option = format!("logdev={},size=64m", log.to_str().unwrap());
    run(
        "mkfs.xfs",
        &["-q", "-f", "-l", &log_option, image.to_str().unwrap()],
    );
    let map = derive_from_image(&image);
    assert_eq!(map.journal(), JournalPlacement::External);
    assert!(map
        .ranges()
        .iter()
        .all(|r| r.kind == MetadataKind::XfsAllocationGroupHeaders));
}
