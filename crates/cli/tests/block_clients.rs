//! End-to-end tests of the `onecopy` binary's block device with real NBD clients: qemu-io,
//! qemu-img (an ext4 image in and out), nbdcopy and fio's nbd engine, each over the unix
//! socket of `onecopy serve`, with a server restart in between where persistence matters.
//! The tools come from scripts/setup.sh; a missing tool fails the test with that hint.

mod block_support;

use block_support::{make_tree, pattern, run, stdout_text, TestRepository, KIB, MIB};

fn qemu_io(uri: &str, commands: &[&str]) {
    let mut arguments = vec!["-f", "raw", uri];
    for command in commands {
        arguments.extend(["-c", command]);
    }
    let output = run("qemu-io", &arguments);
    let text = stdout_text(&output);
    // Older qemu-io versions exit 0 when a pattern check fails; the message is the verdict.
    assert!(!text.contains("Pattern verification failed"), "{text}");
    assert!(!text.contains("failed"), "{text}");
}

// Goal: qemu-io pattern writes (aligned, unaligned, repeated), zero writes and discards read
// back right, also after a restart, and the engine stores repeated blocks once; method: qemu-io
// sessions, a server restart, then `volume stats`.
#[test]
fn qemu_io_patterns_survive_restart() {
    let repository = TestRepository::new();
    repository.create_volume("disk", "64MiB");
    let server = repository.serve(&[]);
    let uri = server.uri("disk");
    qemu_io(
        &uri,
        &[
            "write -P 0xab 0 1M",
            "write -P 0xab 8M 1M",
            "write -P 0x5c 3M 2M",
            "write -z 3M 512K",
            "discard 4M 1M",
            // Unaligned writes at 16 MiB + 513 inside two blocks force read-modify-write.
            "write -P 0x11 16777729 1000",
            "write -P 0x22 16778729 3000",
            "flush",
        ],
    );
    let reads = [
        "read -P 0xab 0 1M",
        "read -P 0xab 8M 1M",
        "read -P 0 1M 2M",
        "read -P 0 3M 512K",
        "read -P 0x5c 3584K 512K",
        "read -P 0 4M 1M",
        "read -P 0 16777216 513",
        "read -P 0x11 16777729 1000",
        "read -P 0x22 16778729 3000",
        "read -P 0 16781729 3679",
    ];
    qemu_io(&uri, &reads);
    // A wrong pattern must be reported, or the reads above prove nothing.
    let output = std::process::Command::new("qemu-io")
        .args(["-f", "raw", &uri, "-c", "read -P 0xcd 0 4096"])
        .output()
        .expect("running qemu-io");
    assert!(
        stdout_text(&output).contains("Pattern verification failed"),
        "{}",
        stdout_text(&output)
    );
    server.stop();

    let server = repository.serve(&[]);
    qemu_io(&server.uri("disk"), &reads);
    server.stop();

    let stats = repository.stats("disk");
    // 0xab: 2 MiB; 0x5c: 3.5..4 MiB; the unaligned writes: two blocks at 16 MiB.
    assert_eq!(
        stats["mapped_bytes"].as_u64(),
        Some(2 * MIB + 512 * KIB + 2 * 4 * KIB),
        "{stats}"
    );
    // One chunk each for 0xab, 0x5c and the two mixed blocks.
    assert_eq!(stats["distinct_chunks"].as_u64(), Some(4), "{stats}");
    repository.check_clean();
}

// Goal: an ext4 image converted into a volume and back out is unchanged, qemu-img compare
// agrees, the copy passes e2fsck, and the engine recognises the file system; method: mke2fs -d
// from a generated tree, qemu-img convert both ways with a restart in between.
#[test]
fn qemu_img_ext4_image_round_trip() {
    let repository = TestRepository::new();
    let directory = repository.directory();
    let tree = directory.join("tree");
    make_tree(&tree, 11, 24 * MIB);
    let image = directory.join("ext4.img");
    run(
        "mke2fs",
        &[
            "-q",
            "-F",
            "-t",
            "ext4",
            "-b",
            "4096",
            "-d",
            tree.to_str().unwrap(),
            image.to_str().unwrap(),
            "64M",
        ],
    );
    let image = image.to_str().unwrap();
    repository.create_volume("ext4", "64MiB");

    let server = repository.serve(&[]);
    let uri = server.uri("ext4");
    run(
        "qemu-img",
        &["convert", "-n", "-f", "raw", "-O", "raw", image, &uri],
    );
    run(
        "qemu-img",
        &["compare", "-f", "raw", "-F", "raw", image, &uri],
    );
    server.stop();

    let server = repository.serve(&[]);
    let uri = server.uri("ext4");
    run(
        "qemu-img",
        &["compare", "-f", "raw", "-F", "raw", image, &uri],
    );
    let copy = directory.join("copy.img");
    run(
        "qemu-img",
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            "raw",
            &uri,
            copy.to_str().unwrap(),
        ],
    );
    server.stop();
    assert!(
        std::fs::read(&copy).unwrap() == std::fs::read(image).unwrap(),
        "the image changed on its way through the volume"
    );
    run("e2fsck", &["-fn", copy.to_str().unwrap()]);

    let stats = repository.stats("ext4");
    let file_system = stats["file_system"].as_str().unwrap_or_default();
    assert!(file_system.to_lowercase().contains("ext4"), "{stats}");
    repository.check_clean();
}

// Goal: nbdcopy copies an image with data, zeros and repeated regions into a volume (four
// connections) and back out unchanged after a restart, and the repeated half is stored once;
// method: nbdcopy both directions, byte comparison, `volume stats`.
#[test]
fn nbdcopy_in_and_out_across_restart() {
    let repository = TestRepository::new();
    let directory = repository.directory();
    let mut data = pattern(24 * MIB as usize, 5);
    data[4 * MIB as usize..6 * MIB as usize].fill(0);
    let repeated = data[..8 * MIB as usize].to_vec();
    data.extend_from_slice(&repeated);
    let input = directory.join("input.img");
    std::fs::write(&input, &data).unwrap();
    repository.create_volume("disk", "32MiB");

    let server = repository.serve(&[]);
    run(
        "nbdcopy",
        &[
            "--connections",
            "4",
            "--flush",
            input.to_str().unwrap(),
            &server.uri("disk"),
        ],
    );
    server.stop();

    let server = repository.serve(&[]);
    let output = directory.join("output.img");
    run(
        "nbdcopy",
        &[
            "--connections",
            "4",
            &server.uri("disk"),
            output.to_str().unwrap(),
        ],
    );
    server.stop();
    assert!(
        std::fs::read(&output).unwrap() == data,
        "nbdcopy round trip changed the data"
    );

    let stats = repository.stats("disk");
    // 32 MiB less the 2 MiB of zeros at 4 MiB and their repeat at 20 MiB.
    assert_eq!(stats["mapped_bytes"].as_u64(), Some(28 * MIB), "{stats}");
    // The first 8 MiB (6 MiB of data) repeat: 22 MiB distinct.
    assert_eq!(
        stats["distinct_chunks"].as_u64(),
        Some(22 * MIB / (4 * KIB)),
        "{stats}"
    );
    repository.check_clean();
}

fn fio(arguments: &[&str]) -> String {
    let text = stdout_text(&run("fio", arguments));
    assert!(text.contains("err= 0"), "{text}");
    assert!(!text.contains("verify: bad"), "{text}");
    text
}

// Goal: fio's nbd engine writes at queue depth 32 (4 KiB blocks, and 1.5 KiB blocks that are
// not block-aligned) with crc32c verification, and the data verifies again after a restart;
// method: fio with --verify=crc32c, a restart, then the same jobs with --verify_only.
#[test]
fn fio_verify_crc32c_survives_restart() {
    let repository = TestRepository::new();
    repository.create_volume("disk", "64MiB");
    let jobs = |uri: &str, verify_only: bool| {
        let uri = format!("--uri={uri}");
        let mut arguments = vec![
            "--ioengine=nbd",
            uri.as_str(),
            "--rw=randwrite",
            "--iodepth=32",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            "--randrepeat=1",
            // fio would leave its verify state files in the working directory.
            "--verify_state_save=0",
            "--name=aligned",
            "--bs=4k",
            "--offset=0",
            "--size=32M",
            "--name=unaligned",
            "--bs=1536",
            "--offset=32M",
            "--size=24M",
        ];
        if verify_only {
            arguments.insert(0, "--verify_only");
        }
        fio(&arguments)
    };
    let server = repository.serve(&[]);
    let written = jobs(&server.uri("disk"), false);
    assert!(written.contains("WRITE:"), "{written}");
    server.stop();

    let server = repository.serve(&[]);
    let verified = jobs(&server.uri("disk"), true);
    assert!(verified.contains("READ:"), "{verified}");
    server.stop();
    repository.check_clean();
}
