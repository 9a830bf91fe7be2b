//! A real kernel file system on a onecopy volume: nbdfuse exposes the volume as a file, a loop
//! device turns the file into a block device, and ext4 is created and mounted on it. Needs
//! root (loop devices and mounts); every step is undone by a guard even when the test fails.

mod block_support;

use block_support::{
    make_tree, require_root, run, LoopDevice, Mounted, NbdFuse, TestRepository, MIB,
};

/// Bytes of the generated tree; large next to ext4's metadata so the dedup ratio shows.
const TREE_BYTES: u64 = 48 * MIB;
/// `stored_bytes` must stay under this fraction of twice the tree (two copies were written):
/// the second copy must be found as duplicates, leaving only file-system metadata on top.
const STORED_FRACTION_OF_TWO_COPIES_MAX: f64 = 0.65;

// Goal: ext4 on a volume holds two copies of a directory tree intact, e2fsck finds nothing,
// and the second copy costs almost nothing; method: nbdfuse + losetup + mkfs.ext4 + mount,
// cp -a twice, unmount, e2fsck -fn, remount read-only and diff, then `volume stats`.
#[test]
fn ext4_on_a_volume_deduplicates_a_copied_tree() {
    require_root();
    let repository = TestRepository::new();
    let directory = repository.directory().to_path_buf();
    let tree = directory.join("tree");
    let tree_bytes = make_tree(&tree, 23, TREE_BYTES);
    repository.create_volume("fs", "512MiB");
    let server = repository.serve(&[]);

    let fuse = NbdFuse::mount(&directory.join("fuse"), &server.uri("fs"));
    let device = LoopDevice::attach(&fuse.file());
    run("mkfs.ext4", &["-q", "-b", "4096", device.device()]);
    let mount_point = directory.join("mount");
    let mounted = Mounted::mount(device.device(), &mount_point, "rw");
    let tree_text = tree.to_str().unwrap();
    for copy in ["copy1", "copy2"] {
        let target = mounted.path().join(copy);
        run("cp", &["-a", tree_text, target.to_str().unwrap()]);
        run("sync", &[]);
    }
    mounted.unmount();
    run("e2fsck", &["-fn", device.device()]);

    let mounted = Mounted::mount(device.device(), &mount_point, "ro");
    for copy in ["copy1", "copy2"] {
        let target = mounted.path().join(copy);
        run(
            "diff",
            &[
                "-r",
                "--no-dereference",
                tree_text,
                target.to_str().unwrap(),
            ],
        );
    }
    mounted.unmount();
    device.detach();
    fuse.unmount();
    server.stop();

    let stats = repository.stats("fs");
    let stored_bytes = stats["stored_bytes"].as_u64().expect("stored_bytes");
    let mapped_bytes = stats["mapped_bytes"].as_u64().expect("mapped_bytes");
    eprintln!(
        "tree {tree_bytes} bytes, written twice; volume mapped {mapped_bytes}, stored {stored_bytes}"
    );
    assert!(mapped_bytes >= 2 * tree_bytes, "{stats}");
    assert!(
        (stored_bytes as f64) < STORED_FRACTION_OF_TWO_COPIES_MAX * (2 * tree_bytes) as f64,
        "stored {stored_bytes} for two copies of {tree_bytes}: {stats}"
    );
    repository.check_clean();
}
