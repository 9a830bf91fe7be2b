//! Conformance of the server to the NBD specification, checked byte by byte with a raw client
//! over a unix socket: handshake options and transmission commands with their replies and
//! errors.

mod common;

use std::io::{Read, Write};
use std::sync::Arc;

use common::*;
use onecopy_nbd::protocol as p;
use onecopy_nbd::{BlockSize, Export, ExportMap, MemoryExport, ServerConfig};

// Goal: OPT_EXPORT_NAME enters transmission with size, flags and the 124 zero bytes unless
// NO_ZEROES was chosen; method: read the exact bytes, then check a request works.
#[test]
fn export_name_with_and_without_zeroes() {
    let (server, _) = TestServer::memory("disk", 1 << 20);
    for no_zeroes in [false, true] {
        let mut stream = server.connect();
        let flags = p::FLAG_C_FIXED_NEWSTYLE | if no_zeroes { p::FLAG_C_NO_ZEROES } else { 0 };
        greet(&mut stream, flags);
        send_option(&mut stream, p::OPT_EXPORT_NAME, b"disk");
        let reply = read_exact(&mut stream, 10);
        assert_eq!(be64(&reply), 1 << 20);
        let transmission = be16(&reply[8..]);
        assert_ne!(transmission & p::FLAG_HAS_FLAGS, 0);
        assert_eq!(
            transmission & p::FLAG_SEND_DF,
            0,
            "no DF without structured replies"
        );
        if !no_zeroes {
            assert_eq!(read_exact(&mut stream, 124), vec![0; 124]);
        }
        let mut client = Client::from_stream(stream, 1 << 20, transmission, false);
        assert_eq!(client.read(0, 512).unwrap(), vec![0; 512]);
        client.disconnect();
    }
}

// Goal: OPT_EXPORT_NAME for an unknown export ends the session (it cannot report errors).
#[test]
fn export_name_unknown_closes() {
    let (server, _) = TestServer::memory("disk", 1 << 20);
    let mut stream = server.connect();
    greet(&mut stream, p::FLAG_C_FIXED_NEWSTYLE);
    send_option(&mut stream, p::OPT_EXPORT_NAME, b"nope");
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
}

// Goal: unknown options, STARTTLS and malformed known options get the specified errors and
// the session continues; method: send each, then a successful OPT_GO on the same session.
#[test]
fn option_errors_keep_the_session() {
    let (server, _) = TestServer::memory("disk", 1 << 20);
    let mut stream = server.connect();
    greet(&mut stream, p::FLAG_C_FIXED_NEWSTYLE);
    let cases: Vec<(u32, Vec<u8>, u32)> = vec![
        (99, b"whatever".to_vec(), p::REP_ERR_UNSUP),
        (p::OPT_STARTTLS, vec![], p::REP_ERR_UNSUP),
        (p::OPT_STARTTLS, vec![1], p::REP_ERR_INVALID),
        (p::OPT_LIST, vec![1], p::REP_ERR_INVALID),
        (p::OPT_STRUCTURED_REPLY, vec![1], p::REP_ERR_INVALID),
        (p::OPT_GO, vec![0, 0, 0, 9], p::REP_ERR_INVALID),
        (p::OPT_INFO, go_data("nope", &[]), p::REP_ERR_UNKNOWN),
        (p::OPT_GO, go_data("nope", &[]), p::REP_ERR_UNKNOWN),
        (
            p::OPT_SET_META_CONTEXT,
            meta_data("disk", &["base:allocation"]),
            p::REP_ERR_INVALID,
        ),
        (
            p::OPT_LIST_META_CONTEXT,
            meta_data("nope", &[]),
            p::REP_ERR_UNKNOWN,
        ),
        (
            p::OPT_LIST_META_CONTEXT,
            vec![0, 0, 0, 0, 0, 0, 0, 5],
            p::REP_ERR_INVALID,
        ),
    ];
    for (option, data, expected) in cases {
        send_option(&mut stream, option, &data);
        let replies = read_option_replies(&mut stream);
        assert_eq!(replies.len(), 1, "option {option}: {replies:?}");
        assert_eq!(replies[0].0, option);
        assert_eq!(replies[0].1, expected, "option {option}");
    }
    // Option data over the interpretation limit is skipped and refused as too big.
    send_option(&mut stream, p::OPT_INFO, &vec![0; 100 << 10]);
    assert_eq!(read_option_reply(&mut stream).1, p::REP_ERR_TOO_BIG);
    send_option(&mut stream, p::OPT_GO, &go_data("disk", &[]));
    assert_eq!(
        read_option_replies(&mut stream).last().unwrap().1,
        p::REP_ACK
    );
}

// Goal: OPT_LIST reports every export with its description, then ACK.
#[test]
fn list_exports() {
    let mut catalog = ExportMap::new();
    catalog.insert("first", "the first disk", Arc::new(MemoryExport::new(4096)));
    catalog.insert("second", "", Arc::new(MemoryExport::new(8192)));
    let server = TestServer::start_with(Arc::new(catalog), ServerConfig::default());
    let mut stream = server.connect();
    greet(&mut stream, p::FLAG_C_FIXED_NEWSTYLE);
    send_option(&mut stream, p::OPT_LIST, &[]);
    let replies = read_option_replies(&mut stream);
    assert_eq!(replies.len(), 3);
    let entries: Vec<(String, String)> = replies[..2]
        .iter()
        .map(|(_, kind, data)| {
            assert_eq!(*kind, p::REP_SERVER);
            let length = be32(data) as usize;
            (
                String::from_utf8(data[4..4 + length].to_vec()).unwrap(),
                String::from_utf8(data[4 + length..].to_vec()).unwrap(),
            )
        })
        .collect();
    assert_eq!(
        entries,
        vec![
            ("first".into(), "the first disk".into()),
            ("second".into(), "".into())
        ]
    );
    // With two exports there is no default export.
    send_option(&mut stream, p::OPT_INFO, &go_data("", &[]));
    assert_eq!(read_option_replies(&mut stream)[0].1, p::REP_ERR_UNKNOWN);
    send_option(&mut stream, p::OPT_ABORT, &[]);
    assert_eq!(read_option_reply(&mut stream).1, p::REP_ACK);
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "server closes after abort");
}

// Goal: OPT_INFO answers size, flags, block size, canonical name and description; the empty
// name reaches the only export.
#[test]
fn info_reports_export_details() {
    let export =
        MemoryExport::new(1 << 24).with_block_size(BlockSize::new(512, 4096, 1 << 20).unwrap());
    let mut catalog = ExportMap::new();
    catalog.insert("vol", "a volume", Arc::new(export));
    let server = TestServer::start_with(Arc::new(catalog), ServerConfig::default());
    let mut stream = server.connect();
    greet(&mut stream, p::FLAG_C_FIXED_NEWSTYLE);
    send_option(
        &mut stream,
        p::OPT_INFO,
        &go_data("", &[p::INFO_NAME, p::INFO_DESCRIPTION, p::INFO_BLOCK_SIZE]),
    );
    let replies = read_option_replies(&mut stream);
    assert_eq!(replies.last().unwrap().1, p::REP_ACK);
    let info = |kind: u16| {
        replies
            .iter()
            .find(|(_, reply, data)| *reply == p::REP_INFO && be16(data) == kind)
            .map(|(_, _, data)| data[2..].to_vec())
            .unwrap_or_else(|| panic!("info {kind} missing"))
    };
    let export = info(p::INFO_EXPORT);
    assert_eq!(be64(&export), 1 << 24);
    let flags = be16(&export[8..]);
    for flag in [
        p::FLAG_HAS_FLAGS,
        p::FLAG_SEND_FLUSH,
        p::FLAG_SEND_FUA,
        p::FLAG_SEND_TRIM,
        p::FLAG_SEND_WRITE_ZEROES,
        p::FLAG_SEND_FAST_ZERO,
        p::FLAG_SEND_CACHE,
        p::FLAG_CAN_MULTI_CONN,
    ] {
        assert_ne!(flags & flag, 0, "flag {flag:#x}");
    }
    assert_eq!(flags & p::FLAG_READ_ONLY, 0);
    assert_eq!(info(p::INFO_NAME), b"vol");
    assert_eq!(info(p::INFO_DESCRIPTION), b"a volume");
    let sizes = info(p::INFO_BLOCK_SIZE);
    assert_eq!(
        (be32(&sizes), be32(&sizes[4..]), be32(&sizes[8..])),
        (512, 4096, 1 << 20)
    );
}

// Goal: meta-context listing and selection follow the base: namespace rules.
#[test]
fn meta_contexts() {
    let (server, _) = TestServer::memory("disk", 1 << 20);
    let mut stream = server.connect();
    greet(&mut stream, p::FLAG_C_FIXED_NEWSTYLE);
    let context_names = |replies: &[(u32, u32, Vec<u8>)]| -> Vec<String> {
        replies
            .iter()
            .filter(|(_, kind, _)| *kind == p::REP_META_CONTEXT)
            .map(|(_, _, data)| String::from_utf8(data[4..].to_vec()).unwrap())
            .collect()
    };
    for (queries, expected) in [
        (vec![], vec!["base:allocation"]),
        (vec!["base:"], vec!["base:allocation"]),
        (vec!["base:allocation", "base:"], vec!["base:allocation"]),
        (vec!["x-other:thing", "base:dirty"], vec![]),
    ] {
        send_option(
            &mut stream,
            p::OPT_LIST_META_CONTEXT,
            &meta_data("disk", &queries),
        );
        let replies = read_option_replies(&mut stream);
        assert_eq!(replies.last().unwrap().1, p::REP_ACK);
        assert_eq!(context_names(&replies), expected, "queries {queries:?}");
    }
    send_option(&mut stream, p::OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(read_option_reply(&mut stream).1, p::REP_ACK);
    // "base:" selects nothing when setting.
    send_option(
        &mut stream,
        p::OPT_SET_META_CONTEXT,
        &meta_data("disk", &["base:"]),
    );
    let replies = read_option_replies(&mut stream);
    assert!(context_names(&replies).is_empty());
    send_option(
        &mut stream,
        p::OPT_SET_META_CONTEXT,
        &meta_data("disk", &["base:allocation"]),
    );
    let replies = read_option_replies(&mut stream);
    assert_eq!(context_names(&replies), vec!["base:allocation"]);
    assert_eq!(be32(&replies[0].2), onecopy_nbd::BASE_ALLOCATION_CONTEXT_ID);
}

// Goal: block status after a context set for another name is refused with EINVAL.
#[test]
fn block_status_needs_context_for_same_export() {
    let mut catalog = ExportMap::new();
    catalog.insert("a", "", Arc::new(MemoryExport::new(1 << 20)));
    catalog.insert("b", "", Arc::new(MemoryExport::new(1 << 20)));
    let server = TestServer::start_with(Arc::new(catalog), ServerConfig::default());
    let mut stream = server.connect();
    greet(&mut stream, p::FLAG_C_FIXED_NEWSTYLE);
    send_option(&mut stream, p::OPT_STRUCTURED_REPLY, &[]);
    read_option_reply(&mut stream);
    send_option(
        &mut stream,
        p::OPT_SET_META_CONTEXT,
        &meta_data("a", &["base:allocation"]),
    );
    read_option_replies(&mut stream);
    send_option(&mut stream, p::OPT_GO, &go_data("b", &[]));
    let replies = read_option_replies(&mut stream);
    let export = &replies
        .iter()
        .find(|(_, kind, _)| *kind == p::REP_INFO)
        .unwrap()
        .2;
    let mut client = Client::from_stream(stream, 1 << 20, be16(&export[10..]), true);
    assert_eq!(client.block_status(0, 4096, 0), Err(p::EINVAL));
}

// Goal: every command works with simple replies, and invalid requests get their errno while
// the connection keeps working (a rejected write's payload is skipped).
#[test]
fn simple_replies_commands_and_errors() {
    let (server, export) = TestServer::memory("disk", 1 << 20);
    let mut client = Client::open(&server, "disk", false, false);
    let data = pattern(64 << 10, 1);
    assert_eq!(client.write(4096, &data, p::CMD_FLAG_FUA), 0);
    assert_eq!(client.read(4096, data.len() as u32).unwrap(), data);
    assert_eq!(client.command(p::CMD_FLUSH, 0, 0, 0), 0);
    assert_eq!(client.command(p::CMD_CACHE, 0, 0, 8192), 0);
    assert_eq!(client.command(p::CMD_TRIM, 0, 4096, 16384), 0);
    assert_eq!(
        client.command(p::CMD_WRITE_ZEROES, p::CMD_FLAG_NO_HOLE, 20480, 4096),
        0
    );
    assert_eq!(
        client.command(p::CMD_WRITE_ZEROES, p::CMD_FLAG_FAST_ZERO, 24576, 4096),
        0
    );
    let back = client.read(4096, data.len() as u32).unwrap();
    assert!(back[..24576].iter().all(|&byte| byte == 0));
    assert_eq!(&back[24576..], &data[24576..]);
    // 16 pages written; trim frees 4 and the hole-punching write-zeroes 1 more.
    assert_eq!(export.allocated_pages(), 11, "trimmed pages are freed");

    // Errors: each followed by a request proving the stream is still in sync.
    assert_eq!(client.write(1 << 20, &[1; 512], 0), p::ENOSPC);
    assert_eq!(client.write(0, &[1; 512], p::CMD_FLAG_DF), p::EINVAL);
    assert_eq!(client.read(1 << 20, 1).unwrap_err(), p::EINVAL);
    assert_eq!(
        client.command(p::CMD_TRIM, 0, (1 << 20) - 512, 1024),
        p::EINVAL
    );
    assert_eq!(
        client.command(p::CMD_WRITE_ZEROES, 0, 1 << 20, 1),
        p::ENOSPC
    );
    assert_eq!(client.command(p::CMD_FLUSH, 0, 1, 0), p::EINVAL);
    assert_eq!(client.command(42, 0, 0, 0), p::EINVAL);
    assert_eq!(client.command(p::CMD_BLOCK_STATUS, 0, 0, 512), p::EINVAL);
    assert_eq!(
        client.read(4096 + 24576, 512).unwrap(),
        &data[24576..24576 + 512]
    );
    // Zero-length requests succeed without reaching the export.
    assert_eq!(client.read(0, 0).unwrap(), Vec::<u8>::new());
    assert_eq!(client.write(0, &[], 0), 0);
    client.disconnect();
}

// Goal: with structured replies a read is one data chunk marked done, errors are error
// chunks with a message, oversized reads get EOVERFLOW and DF is accepted.
#[test]
fn structured_replies() {
    let (server, _) = TestServer::memory("disk", 1 << 26);
    let mut client = Client::open(&server, "disk", true, true);
    assert_ne!(client.flags & p::FLAG_SEND_DF, 0);
    client.write(0, &pattern(8192, 2), 0);
    let Reply::Structured { chunks } = client.call(p::CMD_FLAG_DF, p::CMD_READ, 0, 8192, &[])
    else {
        panic!("structured reply expected")
    };
    assert_eq!(chunks.len(), 1);
    let (flags, kind, payload) = &chunks[0];
    assert_eq!(
        (*flags, *kind),
        (p::REPLY_FLAG_DONE, p::REPLY_TYPE_OFFSET_DATA)
    );
    assert_eq!(be64(payload), 0);
    assert_eq!(&payload[8..], &pattern(8192, 2)[..]);

    let Reply::Structured { chunks } = client.call(0, p::CMD_READ, 1 << 26, 512, &[]) else {
        panic!("structured reply expected")
    };
    let (flags, kind, payload) = &chunks[0];
    assert_eq!((*flags, *kind), (p::REPLY_FLAG_DONE, p::REPLY_TYPE_ERROR));
    assert_eq!(be32(payload), p::EINVAL);
    let message_bytes = be16(&payload[4..]) as usize;
    assert!(message_bytes > 0 && payload.len() == 6 + message_bytes);

    assert_eq!(client.read(0, (1 << 25) + 512).unwrap_err(), p::EOVERFLOW);
    let Reply::Structured { chunks } = client.call(0, p::CMD_READ, 0, 0, &[]) else {
        panic!("structured reply expected")
    };
    assert_eq!(
        chunks,
        vec![(p::REPLY_FLAG_DONE, p::REPLY_TYPE_NONE, vec![])]
    );
    // Successful commands without payload may use simple replies.
    assert_eq!(client.command(p::CMD_FLUSH, 0, 0, 0), 0);
    client.disconnect();
}

// Goal: block status shows holes after trim and write-zeroes, honours REQ_ONE and refuses
// ranges past the end.
#[test]
fn block_status_reports_holes() {
    let (server, _) = TestServer::memory("disk", 1 << 20);
    let mut client = Client::open(&server, "disk", true, true);
    let whole = 1 << 20;
    let hole_zero = p::STATE_HOLE | p::STATE_ZERO;
    assert_eq!(
        client.block_status(0, whole, 0).unwrap(),
        vec![(whole, hole_zero)]
    );
    client.write(0, &pattern(64 << 10, 3), 0);
    assert_eq!(
        client.block_status(0, whole, 0).unwrap(),
        vec![(64 << 10, 0), (whole - (64 << 10), hole_zero)]
    );
    assert_eq!(client.command(p::CMD_TRIM, 0, 8192, 8192), 0);
    assert_eq!(client.command(p::CMD_WRITE_ZEROES, 0, 32768, 4096), 0);
    assert_eq!(
        client.block_status(0, 64 << 10, 0).unwrap(),
        vec![
            (8192, 0),
            (8192, hole_zero),
            (16384, 0),
            (4096, hole_zero),
            (28672, 0)
        ]
    );
    assert_eq!(
        client
            .block_status(0, 64 << 10, p::CMD_FLAG_REQ_ONE)
            .unwrap(),
        vec![(8192, 0)]
    );
    assert_eq!(
        client.block_status(4096, 100, p::CMD_FLAG_REQ_ONE).unwrap(),
        vec![(100, 0)]
    );
    assert_eq!(client.block_status(whole as u64, 1, 0), Err(p::EINVAL));
    client.disconnect();
}

// Goal: a read-only export advertises READ_ONLY, refuses writes with EPERM (skipping the
// payload) and still serves reads and flushes.
#[test]
fn read_only_export() {
    let export = Arc::new(MemoryExport::new(1 << 20).with_read_only(true));
    let catalog = ExportMap::single("ro", export as Arc<dyn Export>);
    let server = TestServer::start_with(Arc::new(catalog), ServerConfig::default());
    let mut client = Client::open(&server, "ro", false, false);
    assert_ne!(client.flags & p::FLAG_READ_ONLY, 0);
    assert_eq!(client.flags & p::FLAG_SEND_TRIM, 0);
    assert_eq!(client.write(0, &[1; 4096], 0), p::EPERM);
    assert_eq!(client.command(p::CMD_TRIM, 0, 0, 4096), p::EPERM);
    assert_eq!(client.command(p::CMD_WRITE_ZEROES, 0, 0, 4096), p::EPERM);
    assert_eq!(client.read(0, 4096).unwrap(), vec![0; 4096]);
    assert_eq!(client.command(p::CMD_FLUSH, 0, 0, 0), 0);
    client.disconnect();
}

// Goal: requests misaligned to the advertised minimum block size get EINVAL; a final
// partial block ending at the export size is allowed.
#[test]
fn minimum_block_size_is_enforced() {
    let export = MemoryExport::new((1 << 20) + 100)
        .with_block_size(BlockSize::new(4096, 4096, 1 << 20).unwrap());
    let catalog = ExportMap::single("aligned", Arc::new(export) as Arc<dyn Export>);
    let server = TestServer::start_with(Arc::new(catalog), ServerConfig::default());
    let mut client = Client::open(&server, "aligned", false, false);
    assert_eq!(client.write(512, &[1; 4096], 0), p::EINVAL);
    assert_eq!(client.write(0, &[1; 512], 0), p::EINVAL);
    assert_eq!(client.read(100, 4096).unwrap_err(), p::EINVAL);
    assert_eq!(client.command(p::CMD_TRIM, 0, 0, 100), p::EINVAL);
    assert_eq!(client.write(1 << 20, &[9; 100], 0), 0);
    assert_eq!(client.read(1 << 20, 100).unwrap(), vec![9; 100]);
    // A write over the advertised maximum payload is refused, its payload skipped.
    assert_eq!(client.write(0, &vec![1; (1 << 20) + 4096], 0), p::EINVAL);
    assert_eq!(client.write(0, &[2; 4096], 0), 0);
    client.disconnect();
}

// Goal: many pipelined requests are all answered with their own cookies; method: a thread
// sends 400 mixed requests (more than the in-flight limit) while replies are read.
#[test]
fn pipelined_requests() {
    let (server, _) = TestServer::memory("disk", 1 << 24);
    let mut client = Client::open(&server, "disk", true, false);
    let mut expected = std::collections::HashMap::new();
    let mut requests = Vec::new();
    for index in 0..200u64 {
        let offset = index * 65536;
        let (cookie, bytes) = client.encode(0, p::CMD_WRITE, offset, 4096, &pattern(4096, index));
        requests.extend(bytes);
        expected.insert(cookie, None);
        let (cookie, bytes) = client.encode(0, p::CMD_READ, offset, 4096, &[]);
        requests.extend(bytes);
        // A read may overtake the write before it; both contents are acceptable.
        expected.insert(cookie, Some(index));
    }
    let mut sender = client.stream.try_clone().unwrap();
    let sending = std::thread::spawn(move || sender.write_all(&requests).unwrap());
    for _ in 0..400 {
        let (cookie, reply) = client.receive();
        let read = expected
            .remove(&cookie)
            .expect("known cookie, answered once");
        assert_eq!(reply.error(), 0);
        if let (Some(index), Reply::Structured { chunks }) = (read, reply) {
            let data = &chunks[0].2[8..];
            assert!(data == pattern(4096, index) || data == vec![0; 4096]);
        }
    }
    assert!(expected.is_empty());
    sending.join().unwrap();
    for index in 0..200u64 {
        assert_eq!(
            client.read(index * 65536, 4096).unwrap(),
            pattern(4096, index)
        );
    }
    client.disconnect();
}

// Goal: with CAN_MULTI_CONN, a write and flush on one connection are visible on another.
#[test]
fn multiple_connections_share_the_export() {
    let (server, _) = TestServer::memory("disk", 1 << 20);
    let mut writer = Client::open(&server, "disk", false, false);
    let mut reader = Client::open(&server, "disk", true, false);
    assert_ne!(writer.flags & p::FLAG_CAN_MULTI_CONN, 0);
    for round in 0..20u64 {
        let data = pattern(8192, round);
        assert_eq!(writer.write(round * 8192, &data, 0), 0);
        assert_eq!(writer.command(p::CMD_FLUSH, 0, 0, 0), 0);
        assert_eq!(reader.read(round * 8192, 8192).unwrap(), data);
    }
    writer.disconnect();
    reader.disconnect();
}
