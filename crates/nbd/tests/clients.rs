//! End-to-end tests with real NBD clients (qemu-io, qemu-img, nbdcopy, nbdinfo, fio) against
//! the in-memory export over a unix socket (and TCP once). The tools come from
//! scripts/setup.sh; a missing tool fails the test with that hint.

mod common;

use std::sync::Arc;

use common::*;
use onecopy_nbd::{Export, ExportMap, ListenAddress, MemoryExport, Server, ServerConfig};

const MIB: usize = 1 << 20;

/// An image with data, an all-zero region and a hole pattern: 32 MiB.
fn sample_image(directory: &std::path::Path) -> (std::path::PathBuf, Vec<u8>) {
    let mut data = pattern(32 * MIB, 77);
    data[4 * MIB..12 * MIB].fill(0);
    data[20 * MIB..20 * MIB + 4096].fill(0);
    let path = directory.join("input.img");
    write_file(&path, &data);
    (path, data)
}

fn stdout(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

// Goal: qemu-io pattern writes read back, zeroes and discards read as zero; method: one
// qemu-io session per step against the unix socket.
#[test]
fn qemu_io_patterns() {
    let (server, _) = TestServer::memory("disk", 64 * MIB as u64);
    let uri = server.uri("disk");
    run(
        "qemu-io",
        &[
            "-f",
            "raw",
            &uri,
            "-c",
            "write -P 0xab 0 1M",
            "-c",
            "read -P 0xab 0 1M",
        ],
    );
    run(
        "qemu-io",
        &[
            "-f",
            "raw",
            &uri,
            "-c",
            "write -P 0x5c 3M 2M",
            "-c",
            "write -z 3M 512K",
            "-c",
            "discard 4M 1M",
            "-c",
            "read -P 0 3M 512K",
            "-c",
            "read -P 0x5c 3584K 512K",
            "-c",
            "read -P 0 4M 1M",
            "-c",
            "read -P 0xab 0 1M",
            "-c",
            "flush",
        ],
    );
    // A failing pattern check must fail qemu-io, or the reads above prove nothing.
    let output = std::process::Command::new("qemu-io")
        .args(["-f", "raw", &uri, "-c", "read -P 0xcd 0 4096"])
        .output()
        .unwrap();
    assert!(
        stdout(&output).contains("Pattern verification failed"),
        "{}",
        stdout(&output)
    );
}

// Goal: qemu-img converts an image into the export and back out unchanged, and
// qemu-img compare agrees.
#[test]
fn qemu_img_convert_round_trip() {
    let (server, _) = TestServer::memory("disk", 32 * MIB as u64);
    let directory = tempfile::tempdir().unwrap();
    let (input, data) = sample_image(directory.path());
    let output = directory.path().join("output.img");
    let uri = server.uri("disk");
    let input = input.to_str().unwrap();
    run(
        "qemu-img",
        &["convert", "-n", "-f", "raw", "-O", "raw", input, &uri],
    );
    run(
        "qemu-img",
        &["compare", "-f", "raw", "-F", "raw", input, &uri],
    );
    run(
        "qemu-img",
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            "raw",
            &uri,
            output.to_str().unwrap(),
        ],
    );
    assert!(
        std::fs::read(&output).unwrap() == data,
        "round trip changed the image"
    );
    run("qemu-img", &["info", "-f", "raw", &uri]);
}

// Goal: nbdcopy copies into and out of the export, also with four connections at once.
#[test]
fn nbdcopy_both_directions() {
    let (server, export) = TestServer::memory("disk", 32 * MIB as u64);
    let directory = tempfile::tempdir().unwrap();
    let (input, data) = sample_image(directory.path());
    let uri = server.uri("disk");
    for connections in ["1", "4"] {
        let output = directory.path().join(format!("output-{connections}.img"));
        run(
            "nbdcopy",
            &[
                "--connections",
                connections,
                "--flush",
                input.to_str().unwrap(),
                &uri,
            ],
        );
        run(
            "nbdcopy",
            &["--connections", connections, &uri, output.to_str().unwrap()],
        );
        assert!(
            std::fs::read(&output).unwrap() == data,
            "{connections} connections"
        );
    }
    // nbdcopy skips zero regions, which stay holes in a fresh export.
    let mut buffer = vec![0; 4096];
    export.read(5 * MIB as u64, &mut buffer).unwrap();
    assert!(buffer.iter().all(|&byte| byte == 0));
}

// Goal: nbdinfo lists exports with descriptions and maps holes created by trim and
// hole-punching write-zeroes.
#[test]
fn nbdinfo_list_and_map() {
    let mut catalog = ExportMap::new();
    catalog.insert(
        "alpha",
        "first volume",
        Arc::new(MemoryExport::new(16 * MIB as u64)),
    );
    catalog.insert("beta", "", Arc::new(MemoryExport::new(MIB as u64)));
    let server = TestServer::start_with(Arc::new(catalog), ServerConfig::default());
    let listing = stdout(&run("nbdinfo", &["--list", &server.uri("")]));
    assert!(listing.contains("export=\"alpha\""), "{listing}");
    assert!(listing.contains("first volume"), "{listing}");
    assert!(listing.contains("export=\"beta\""), "{listing}");
    assert!(listing.contains("base:allocation"), "{listing}");

    let uri = server.uri("alpha");
    run(
        "qemu-io",
        &[
            "-f",
            "raw",
            &uri,
            "-c",
            "write -P 1 0 8M",
            "-c",
            "discard 1M 1M",
            "-c",
            "write -z -u 4M 2M",
        ],
    );
    let map = stdout(&run("nbdinfo", &["--map", &uri]));
    let extents: Vec<(u64, u64, String)> = map
        .lines()
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (
                fields[0].parse().unwrap(),
                fields[1].parse().unwrap(),
                fields[3].to_owned(),
            )
        })
        .collect();
    let m = MIB as u64;
    let expected = vec![
        (0, m, "data".to_owned()),
        (m, m, "hole,zero".to_owned()),
        (2 * m, 2 * m, "data".to_owned()),
        (4 * m, 2 * m, "hole,zero".to_owned()),
        (6 * m, 2 * m, "data".to_owned()),
        (8 * m, 8 * m, "hole,zero".to_owned()),
    ];
    assert_eq!(extents, expected, "{map}");
}

fn fio(arguments: &[&str]) -> String {
    let output = run("fio", arguments);
    let text = stdout(&output);
    assert!(text.contains("err= 0"), "{text}");
    assert!(!text.contains("verify: bad"), "{text}");
    text
}

// Goal: fio's nbd engine at queue depth 32 writes randomly and verifies every block (crc32c).
#[test]
fn fio_random_write_verify() {
    let (server, _) = TestServer::memory("disk", 64 * MIB as u64);
    let uri = format!("--uri={}", server.uri("disk"));
    fio(&[
        "--name=verify",
        "--ioengine=nbd",
        &uri,
        "--rw=randwrite",
        "--bs=4k",
        "--iodepth=32",
        "--size=32M",
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_fatal=1",
        "--verify_state_save=0",
    ]);
}

// Goal: several fio jobs (one connection each) write and verify disjoint regions at once.
#[test]
fn fio_multiple_connections() {
    let (server, _) = TestServer::memory("disk", 64 * MIB as u64);
    let uri = format!("--uri={}", server.uri("disk"));
    let text = fio(&[
        "--name=multi",
        "--ioengine=nbd",
        &uri,
        "--rw=randwrite",
        "--bs=16k",
        "--iodepth=16",
        "--numjobs=4",
        "--size=8M",
        "--offset_increment=8M",
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_fatal=1",
        "--verify_state_save=0",
        "--group_reporting",
    ]);
    assert!(text.contains("jobs=4"), "{text}");
    let statistics = server.server.as_ref().unwrap().statistics();
    assert!(statistics.connections_accepted >= 4, "{statistics:?}");
}

// Goal: qemu-io works over the TCP transport too.
#[test]
fn qemu_io_over_tcp() {
    let catalog = Arc::new(ExportMap::single(
        "disk",
        Arc::new(MemoryExport::new(8 * MIB as u64)) as Arc<dyn Export>,
    ));
    let address = ListenAddress::tcp("127.0.0.1:0").unwrap();
    let server = Server::start(&address, catalog, quiet_config()).unwrap();
    let ListenAddress::Tcp(bound) = server.address().clone() else {
        panic!("tcp address expected")
    };
    let uri = format!("nbd://127.0.0.1:{}/disk", bound.port());
    run(
        "qemu-io",
        &[
            "-f",
            "raw",
            &uri,
            "-c",
            "write -P 0x11 1M 1M",
            "-c",
            "read -P 0x11 1M 1M",
        ],
    );
    server.shutdown();
}

// Goal: the kernel path through nbdfuse works: file writes (with fsync) and reads of the FUSE
// file reach the export and read back.
#[test]
fn nbdfuse_file_io() {
    require_tool("nbdfuse");
    require_tool("fusermount3");
    let (server, export) = TestServer::memory("disk", 16 * MIB as u64);
    let directory = tempfile::tempdir().unwrap();
    let mountpoint = directory.path().join("mount");
    std::fs::create_dir(&mountpoint).unwrap();
    let file = mountpoint.join("disk");
    let mut child = std::process::Command::new("nbdfuse")
        .arg(&file)
        .arg(server.uri("disk"))
        .spawn()
        .expect("nbdfuse starts");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0) != 16 * MIB as u64 {
        assert!(
            std::time::Instant::now() < deadline,
            "nbdfuse did not mount"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let data = pattern(2 * MIB, 5);
    let result = std::panic::catch_unwind(|| {
        use std::io::{Read, Seek, SeekFrom, Write};
        let mut handle = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&file)
            .unwrap();
        handle.seek(SeekFrom::Start(MIB as u64)).unwrap();
        handle.write_all(&data).unwrap();
        handle.sync_all().unwrap();
        let mut back = vec![0; data.len()];
        handle.seek(SeekFrom::Start(MIB as u64)).unwrap();
        handle.read_exact(&mut back).unwrap();
        assert!(back == data, "read through FUSE differs");
    });
    run("fusermount3", &["-u", mountpoint.to_str().unwrap()]);
    child.wait().unwrap();
    result.expect("file I/O through nbdfuse");
    let mut direct = vec![0; data.len()];
    export.read(MIB as u64, &mut direct).unwrap();
    assert!(direct == data, "data reached the export");
}
