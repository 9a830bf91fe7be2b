//! Hostile and broken clients: garbage, truncated handshakes, huge lengths and out-of-range
//! requests must get an error or a closed connection — never a panic — while other clients
//! keep being served. A proptest drives whole connections with random byte streams.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use onecopy_nbd::protocol as p;
use onecopy_nbd::{serve_connection, Export, ExportMap, MemoryExport, ServerConfig};
use proptest::prelude::*;

/// Sends `bytes`, closes the sending side, and returns whatever the server sent back until
/// it closed the connection.
fn send_and_drain(mut stream: UnixStream, bytes: &[u8]) -> Vec<u8> {
    let mut sender = stream.try_clone().unwrap();
    let bytes = bytes.to_vec();
    // The server may stop reading and close; a failed write is then expected.
    let sending = std::thread::spawn(move || {
        let _ = sender.write_all(&bytes);
        let _ = sender.shutdown(std::net::Shutdown::Write);
    });
    let mut received = Vec::new();
    let _ = stream.read_to_end(&mut received);
    sending.join().unwrap();
    received
}

fn option(option: u32, data: &[u8]) -> Vec<u8> {
    let mut bytes = p::OPTION_MAGIC.to_be_bytes().to_vec();
    bytes.extend_from_slice(&option.to_be_bytes());
    bytes.extend_from_slice(&(data.len() as u32).to_be_bytes());
    bytes.extend_from_slice(data);
    bytes
}

fn request(flags: u16, command: u16, offset: u64, length: u32) -> Vec<u8> {
    onecopy_nbd::codec::RequestHeader {
        flags,
        command,
        cookie: 0xc0ffee,
        offset,
        length,
    }
    .encode()
    .to_vec()
}

/// Client flags plus options that enter transmission on "disk" with structured replies and
/// block status.
fn transmission_prefix() -> Vec<u8> {
    let mut bytes = (p::FLAG_C_FIXED_NEWSTYLE | p::FLAG_C_NO_ZEROES)
        .to_be_bytes()
        .to_vec();
    bytes.extend(option(p::OPT_STRUCTURED_REPLY, &[]));
    bytes.extend(option(
        p::OPT_SET_META_CONTEXT,
        &meta_data("disk", &["base:allocation"]),
    ));
    bytes.extend(option(p::OPT_GO, &go_data("disk", &[])));
    bytes
}

// Goal: every kind of malformed input ends in an error reply or a closed connection, and a
// well-behaved client is served after each; method: raw sockets against one server.
#[test]
fn malformed_clients_do_not_disturb_others() {
    let (mut server, _) = TestServer::memory("disk", 1 << 20);
    let mut handshake = (p::FLAG_C_FIXED_NEWSTYLE).to_be_bytes().to_vec();
    handshake.extend(option(p::OPT_EXPORT_NAME, b"disk"));
    let transmission = transmission_prefix();
    let with = |prefix: &[u8], tail: Vec<u8>| [prefix.to_vec(), tail].concat();

    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("garbage", pattern(5000, 9)),
        ("truncated client flags", vec![0, 0]),
        (
            "unknown client flags",
            0xffff_ffffu32.to_be_bytes().to_vec(),
        ),
        ("bad option magic", with(&[0, 0, 0, 1], vec![0x55; 16])),
        (
            "truncated option header",
            with(&[0, 0, 0, 1], option(p::OPT_GO, &[])[..10].to_vec()),
        ),
        (
            "truncated option data",
            with(&[0, 0, 0, 1], option(p::OPT_GO, &[0; 64])[..40].to_vec()),
        ),
        (
            "option length over the discard limit",
            with(
                &[0, 0, 0, 1],
                option(p::OPT_INFO, &[])[..12]
                    .iter()
                    .copied()
                    .chain(0x7fff_ffffu32.to_be_bytes())
                    .collect(),
            ),
        ),
        (
            "export name not UTF-8",
            with(&[0, 0, 0, 1], option(p::OPT_EXPORT_NAME, &[0xff, 0xfe])),
        ),
        (
            "too many options",
            with(
                &[0, 0, 0, 1],
                (0..300).flat_map(|_| option(77, &[])).collect(),
            ),
        ),
        ("bad request magic", with(&handshake, vec![0x42; 28])),
        (
            "huge write",
            with(&handshake, request(0, p::CMD_WRITE, 0, 0x8000_0000)),
        ),
        (
            "truncated request",
            with(&handshake, request(0, p::CMD_READ, 0, 512)[..20].to_vec()),
        ),
        (
            "truncated write payload",
            with(
                &handshake,
                [request(0, p::CMD_WRITE, 0, 1 << 20), vec![7; 1000]].concat(),
            ),
        ),
        (
            "out of range requests",
            with(
                &transmission,
                [
                    request(0, p::CMD_READ, u64::MAX, 512),
                    request(0, p::CMD_READ, u64::MAX - 100, 0xffff_ffff),
                    request(0, p::CMD_WRITE, u64::MAX - 3, 4),
                    vec![1, 2, 3, 4],
                    request(0, p::CMD_TRIM, 1 << 20, 0xffff_ffff),
                    request(0, p::CMD_WRITE_ZEROES, 0, 0xffff_ffff),
                    request(0, p::CMD_BLOCK_STATUS, (1 << 20) - 1, 2),
                    request(0, p::CMD_CACHE, 1 << 62, 1 << 30),
                    request(0xffff, p::CMD_READ, 0, 512),
                    request(0, 0xffff, 0, 0),
                ]
                .concat(),
            ),
        ),
    ];
    for (name, bytes) in cases {
        let received = send_and_drain(server.connect(), &bytes);
        // The server answered at most the greeting and error replies; then it closed.
        assert!(
            received.len() < 1 << 20,
            "{name}: unexpected amount of output"
        );
        let mut client = Client::open(&server, "disk", true, true);
        let data = pattern(4096, 1);
        assert_eq!(client.write(8192, &data, 0), 0, "after {name}");
        assert_eq!(client.read(8192, 4096).unwrap(), data, "after {name}");
        client.disconnect();
    }
    let statistics = server.shutdown();
    assert!(statistics.connections_failed >= 8, "{statistics:?}");
}

// Goal: the out-of-range requests above each got an error reply rather than silence; method:
// count structured error chunks for eight invalid requests sent at once.
#[test]
fn out_of_range_requests_get_errors() {
    let (server, _) = TestServer::memory("disk", 1 << 20);
    let mut client = Client::open(&server, "disk", true, true);
    let invalid = [
        (p::CMD_READ, u64::MAX, 512),
        (p::CMD_READ, u64::MAX - 100, 0xffff_ffff),
        (p::CMD_TRIM, 1 << 20, 0xffff_ffff),
        (p::CMD_WRITE_ZEROES, 0, 0xffff_ffff),
        (p::CMD_BLOCK_STATUS, (1 << 20) - 1, 2),
        (p::CMD_CACHE, 1 << 62, 1 << 30),
        (0xffff, 0, 0),
        (p::CMD_FLUSH, 5, 5),
    ];
    for (command, offset, length) in invalid {
        let error = client.command(command, 0, offset, length);
        assert!(
            error == p::EINVAL || error == p::ENOSPC,
            "command {command}: error {error}"
        );
    }
    client.disconnect();
}

/// One piece of a generated client stream.
#[derive(Clone, Debug)]
enum Piece {
    Request {
        flags: u16,
        command: u16,
        offset: u64,
        length: u32,
        payload: usize,
    },
    Garbage(Vec<u8>),
}

fn piece() -> impl Strategy<Value = Piece> {
    let offset = prop_oneof![0u64..(1 << 20), any::<u64>(), Just((1u64 << 20) - 512)];
    let length = prop_oneof![0u32..8192, any::<u32>(), Just(1 << 20)];
    prop_oneof![
        8 => (any::<u16>(), 0u16..9, offset, length, 0usize..9000).prop_map(
            |(flags, command, offset, length, payload)| Piece::Request {
                flags: flags & 0x1f,
                command,
                offset,
                length,
                payload,
            }
        ),
        1 => proptest::collection::vec(any::<u8>(), 0..64).prop_map(Piece::Garbage),
    ]
}

fn render(pieces: &[Piece]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for piece in pieces {
        match piece {
            Piece::Request {
                flags,
                command,
                offset,
                length,
                payload,
            } => {
                bytes.extend(request(*flags, *command, *offset, *length));
                if *command == p::CMD_WRITE {
                    bytes.extend(std::iter::repeat_n(0xa5, (*length as usize).min(*payload)));
                }
            }
            Piece::Garbage(garbage) => bytes.extend(garbage),
        }
    }
    bytes
}

/// Serves one connection that receives `bytes`; returns what the server sent.
fn serve_bytes(bytes: Vec<u8>) -> Vec<u8> {
    let (client, server_end) = UnixStream::pair().unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let config = ServerConfig {
        workers_per_connection: 2,
        ..quiet_config()
    };
    let serving = std::thread::spawn(move || {
        let export = Arc::new(MemoryExport::new(1 << 20));
        let catalog = ExportMap::single("disk", export as Arc<dyn Export>);
        // Errors are expected; only a panic (a failed join) fails the test.
        let _ = serve_connection(server_end, &catalog, &config);
    });
    let received = send_and_drain(client, &bytes);
    serving.join().expect("serve_connection must not panic");
    received
}

/// Bytes the server sends for `transmission_prefix`: greeting, structured-reply ACK, one
/// meta context and ACK, INFO_EXPORT, INFO_BLOCK_SIZE and ACK.
const PREFIX_REPLY_BYTES: usize = 18 + 20 + (20 + 4 + 15) + 20 + (20 + 12) + (20 + 14) + 20;

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    // Goal: random byte streams in the handshake phase never panic the connection.
    #[test]
    fn random_handshake_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512), fixed in any::<bool>()) {
        let mut stream = if fixed { vec![0, 0, 0, 1] } else { Vec::new() };
        stream.extend(bytes);
        serve_bytes(stream);
    }

    // Goal: random option sequences (valid magic, random types and data) never panic.
    #[test]
    fn random_options(options in proptest::collection::vec((0u32..12, proptest::collection::vec(any::<u8>(), 0..40)), 0..12)) {
        let mut stream = vec![0, 0, 0, 3];
        for (kind, data) in options {
            stream.extend(option(kind, &data));
        }
        serve_bytes(stream);
    }

    // Goal: random request streams in the transmission phase never panic the connection.
    #[test]
    fn random_requests(pieces in proptest::collection::vec(piece(), 0..24)) {
        let mut stream = transmission_prefix();
        stream.extend(render(&pieces));
        let received = serve_bytes(stream);
        prop_assert!(received.len() >= PREFIX_REPLY_BYTES, "transmission phase reached");
    }
}
