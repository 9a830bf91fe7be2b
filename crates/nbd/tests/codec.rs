//! Unit tests of the pure codec and request validation: round trips and every malformed case.

use onecopy_nbd::codec::{
    self, ClientFlags, ExportRequest, InvalidOption, MetaContextRequest, OptionHeader,
    ProtocolViolation, RequestHeader,
};
use onecopy_nbd::protocol as p;
use onecopy_nbd::request::{validate, Command, Decision, Limits};
use onecopy_nbd::{AllocationExtent, BlockSize};
use proptest::prelude::*;

proptest! {
    // Goal: request headers survive encode/decode unchanged, for any field values.
    #[test]
    fn request_header_round_trip(flags: u16, command: u16, cookie: u64, offset: u64, length: u32) {
        let header = RequestHeader { flags, command, cookie, offset, length };
        prop_assert_eq!(RequestHeader::decode(&header.encode()), Ok(header));
    }

    // Goal: option headers survive encode/decode unchanged.
    #[test]
    fn option_header_round_trip(option: u32, length: u32) {
        let header = OptionHeader { option, length };
        prop_assert_eq!(OptionHeader::decode(&header.encode()), Ok(header));
    }

    // Goal: OPT_GO/OPT_INFO data round-trips for valid names and request lists.
    #[test]
    fn export_request_round_trip(name in "[a-zA-Z0-9/_.-]{0,64}", requests in proptest::collection::vec(any::<u16>(), 0..20)) {
        let request = ExportRequest { name, information_requests: requests };
        prop_assert_eq!(ExportRequest::decode(&request.encode()), Ok(request));
    }

    // Goal: meta-context data round-trips for valid names and queries.
    #[test]
    fn meta_context_round_trip(name in "[a-z]{0,16}", queries in proptest::collection::vec("[a-z:]{0,32}", 0..10)) {
        let request = MetaContextRequest { export_name: name, queries };
        prop_assert_eq!(MetaContextRequest::decode(&request.encode()), Ok(request));
    }

    // Goal: no input makes the option decoders panic.
    #[test]
    fn option_decoders_never_panic(data in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = ExportRequest::decode(&data);
        let _ = MetaContextRequest::decode(&data);
        let _ = codec::decode_string(&data);
    }

    // Goal: every command validation accepts is inside the export and aligned, and no header
    // makes validation panic.
    #[test]
    fn validation_only_accepts_safe_commands(
        flags: u16, command in 0u16..10, offset: u64, length: u32,
        size in 0u64..(1 << 40), minimum_shift in 0u32..13, structured: bool, read_only: bool,
    ) {
        let limits = Limits {
            size_bytes: size,
            minimum_block_bytes: 1 << minimum_shift,
            payload_bytes_max: p::PAYLOAD_BYTES_MAX,
            read_only,
            structured_replies: structured,
            block_status: structured,
        };
        let header = RequestHeader { flags, command, cookie: 7, offset, length };
        if let Decision::Execute(command) = validate(&header, &limits) {
            let (offset, length) = command.range();
            prop_assert!(offset.checked_add(u64::from(length)).is_some_and(|end| end <= size));
            prop_assert_eq!(offset % u64::from(limits.minimum_block_bytes), 0);
            if read_only {
                let writes = matches!(command, Command::Write { .. } | Command::Trim { .. } | Command::WriteZeroes { .. });
                prop_assert!(!writes);
            }
        }
    }
}

// Goal: client flags accept exactly the two offered bits and reject any other.
#[test]
fn client_flags() {
    assert_eq!(ClientFlags::decode(0), Ok(ClientFlags::default()));
    let both = ClientFlags::decode(3).unwrap();
    assert!(both.fixed_newstyle && both.no_zeroes);
    assert_eq!(both.encode(), 3);
    for bit in 2..32 {
        assert_eq!(
            ClientFlags::decode(1 << bit),
            Err(ProtocolViolation::UnknownClientFlags { flags: 1 << bit })
        );
    }
}

// Goal: wrong magic numbers are protocol violations, not panics.
#[test]
fn bad_magic() {
    let mut option = OptionHeader {
        option: 1,
        length: 0,
    }
    .encode();
    option[0] ^= 1;
    assert!(matches!(
        OptionHeader::decode(&option),
        Err(ProtocolViolation::BadOptionMagic { .. })
    ));
    let mut request = RequestHeader {
        flags: 0,
        command: 0,
        cookie: 1,
        offset: 0,
        length: 1,
    }
    .encode();
    request[3] ^= 0x80;
    assert!(matches!(
        RequestHeader::decode(&request),
        Err(ProtocolViolation::BadRequestMagic { .. })
    ));
}

// Goal: each malformed OPT_GO/OPT_INFO payload is rejected with a reason.
#[test]
fn malformed_export_requests() {
    let cases: Vec<Vec<u8>> = vec![
        vec![],                             // no name length
        vec![0, 0, 0],                      // short name length
        vec![0, 0, 0, 5, b'a'],             // name longer than data
        vec![0, 0, 0, 0],                   // no request count
        vec![0, 0, 0, 0, 0],                // short request count
        vec![0, 0, 0, 0, 0, 2, 0, 1],       // fewer requests than announced
        vec![0, 0, 0, 0, 0, 0, 9],          // trailing byte
        vec![0, 0, 0, 2, 0xff, 0xfe, 0, 0], // invalid UTF-8 name
        vec![0, 0, 0, 2, b'a', 0, 0, 0],    // NUL in name
    ];
    for data in cases {
        assert!(ExportRequest::decode(&data).is_err(), "accepted {data:?}");
    }
    let mut long = ((p::STRING_BYTES_MAX + 1) as u32).to_be_bytes().to_vec();
    long.extend(std::iter::repeat_n(b'a', p::STRING_BYTES_MAX + 1));
    long.extend([0, 0]);
    assert!(
        ExportRequest::decode(&long).is_err(),
        "name over 4096 bytes"
    );
}

// Goal: each malformed meta-context payload is rejected, including a hostile query count.
#[test]
fn malformed_meta_context_requests() {
    let cases: Vec<Vec<u8>> = vec![
        vec![0, 0, 0, 0],                               // no query count
        vec![0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff],       // count far beyond the data
        vec![0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 9, b'b'], // query longer than data
        vec![0, 0, 0, 0, 0, 0, 0, 0, 1],                // trailing byte
    ];
    for data in cases {
        assert!(
            MetaContextRequest::decode(&data).is_err(),
            "accepted {data:?}"
        );
    }
    let too_many = MetaContextRequest {
        export_name: String::new(),
        queries: vec!["x:".into(); MetaContextRequest::QUERIES_MAX as usize + 1],
    };
    assert_eq!(
        MetaContextRequest::decode(&too_many.encode()),
        Err(InvalidOption {
            reason: "too many queries"
        })
    );
}

// Goal: reply headers have the specified layouts.
#[test]
fn reply_layouts() {
    let simple = codec::encode_simple_reply(22, 0x0102_0304_0506_0708);
    assert_eq!(&simple[..4], &p::SIMPLE_REPLY_MAGIC.to_be_bytes());
    assert_eq!(&simple[4..8], &22u32.to_be_bytes());
    assert_eq!(&simple[8..], &[1, 2, 3, 4, 5, 6, 7, 8]);
    let chunk = codec::encode_structured_reply(1, 5, 9, 100);
    assert_eq!(&chunk[..4], &p::STRUCTURED_REPLY_MAGIC.to_be_bytes());
    assert_eq!(&chunk[4..8], &[0, 1, 0, 5]);
    assert_eq!(&chunk[16..], &100u32.to_be_bytes());
    let info = codec::encode_info_export(1 << 40, 0x1234);
    assert_eq!(&info[..2], &[0, 0]);
    assert_eq!(&info[2..10], &(1u64 << 40).to_be_bytes());
    assert_eq!(&info[10..], &[0x12, 0x34]);
}

// Goal: error chunks carry the error and a message cut at a character boundary to 4096 bytes.
#[test]
fn error_chunk_truncates_message() {
    let mut out = Vec::new();
    let message = "é".repeat(3000); // 6000 bytes
    codec::put_error_chunk(&mut out, 5, p::EIO, &message);
    let payload = &out[20..];
    assert_eq!(
        u32::from_be_bytes(out[16..20].try_into().unwrap()) as usize,
        payload.len()
    );
    assert_eq!(&payload[..4], &p::EIO.to_be_bytes());
    let message_bytes = u16::from_be_bytes([payload[4], payload[5]]) as usize;
    assert_eq!(message_bytes, 4096);
    assert!(std::str::from_utf8(&payload[6..]).is_ok());
}

fn descriptors(out: &[u8]) -> Vec<(u32, u32)> {
    out[24..]
        .chunks(8)
        .map(|d| {
            (
                u32::from_be_bytes(d[..4].try_into().unwrap()),
                u32::from_be_bytes(d[4..].try_into().unwrap()),
            )
        })
        .collect()
}

// Goal: block status chunks clip to the request, merge equal neighbours, honour REQ_ONE and
// refuse an empty answer.
#[test]
fn block_status_chunks() {
    let hole = |length| AllocationExtent {
        length,
        hole: true,
        zero: true,
    };
    let data = |length| AllocationExtent {
        length,
        hole: false,
        zero: false,
    };
    let mut out = Vec::new();
    let count = codec::put_block_status_chunk(
        &mut out,
        1,
        1,
        10_000,
        false,
        &[data(4096), data(4096), hole(1 << 40)],
    )
    .unwrap();
    assert_eq!(count, 2);
    assert_eq!(
        descriptors(&out),
        vec![(8192, 0), (10_000 - 8192, p::STATE_HOLE | p::STATE_ZERO)]
    );
    assert_eq!(u32::from_be_bytes(out[16..20].try_into().unwrap()), 4 + 16);

    out.clear();
    codec::put_block_status_chunk(&mut out, 1, 1, 100, true, &[hole(50), data(50)]).unwrap();
    assert_eq!(descriptors(&out), vec![(50, 3)]);

    out.clear();
    assert!(codec::put_block_status_chunk(&mut out, 1, 1, 100, false, &[]).is_err());
    assert!(
        codec::put_block_status_chunk(&mut out, 1, 1, 100, false, &[data(0), data(5)]).is_err()
    );
    assert!(out.is_empty(), "nothing appended on error");
}

// Goal: BlockSize enforces the specification's rules.
#[test]
fn block_size_rules() {
    assert!(BlockSize::new(512, 4096, 1 << 20).is_ok());
    assert!(BlockSize::new(1, 512, 512).is_ok());
    assert!(
        BlockSize::new(3, 4096, 1 << 20).is_err(),
        "minimum not a power of two"
    );
    assert!(
        BlockSize::new(1 << 17, 1 << 17, 1 << 20).is_err(),
        "minimum over 64 KiB"
    );
    assert!(BlockSize::new(1, 256, 4096).is_err(), "preferred under 512");
    assert!(
        BlockSize::new(4096, 2048, 1 << 20).is_err(),
        "preferred under minimum"
    );
    assert!(
        BlockSize::new(512, 4096, 2048).is_err(),
        "maximum under preferred"
    );
    assert!(
        BlockSize::new(512, 4096, (1 << 25) + 512).is_err(),
        "maximum over 32 MiB"
    );
    assert!(
        BlockSize::new(4096, 4096, (1 << 20) + 512).is_err(),
        "maximum not a multiple"
    );
}

fn limits() -> Limits {
    Limits {
        size_bytes: 1 << 20,
        minimum_block_bytes: 512,
        payload_bytes_max: 1 << 16,
        read_only: false,
        structured_replies: false,
        block_status: false,
    }
}

fn header(command: u16, flags: u16, offset: u64, length: u32) -> RequestHeader {
    RequestHeader {
        flags,
        command,
        cookie: 42,
        offset,
        length,
    }
}

fn rejected(decision: Decision) -> (u32, u32) {
    match decision {
        Decision::Reject {
            error,
            payload_bytes,
            ..
        } => (error, payload_bytes),
        other => panic!("expected a rejection, got {other:?}"),
    }
}

// Goal: each invalid request gets the errno the specification names.
#[test]
fn validation_errors() {
    let l = limits();
    let ro = Limits {
        read_only: true,
        ..l
    };
    let sr = Limits {
        structured_replies: true,
        ..l
    };
    let mib = 1 << 20;
    // Reads.
    assert_eq!(
        rejected(validate(&header(p::CMD_READ, 0, mib, 512), &l)),
        (p::EINVAL, 0)
    );
    assert_eq!(
        rejected(validate(&header(p::CMD_READ, 0, u64::MAX - 10, 512), &l)),
        (p::EINVAL, 0)
    );
    assert_eq!(
        rejected(validate(&header(p::CMD_READ, 0, 100, 512), &l)),
        (p::EINVAL, 0)
    );
    assert_eq!(
        rejected(validate(&header(p::CMD_READ, 0, 0, 1 << 17), &l)),
        (p::EINVAL, 0)
    );
    assert_eq!(
        rejected(validate(&header(p::CMD_READ, 0, 0, 1 << 17), &sr)),
        (p::EOVERFLOW, 0)
    );
    assert_eq!(
        rejected(validate(&header(p::CMD_READ, p::CMD_FLAG_DF, 0, 512), &l)),
        (p::EINVAL, 0)
    );
    assert_eq!(
        validate(&header(p::CMD_READ, p::CMD_FLAG_DF, 0, 512), &sr),
        Decision::Execute(Command::Read {
            offset: 0,
            length: 512
        })
    );
    // Writes skip their payload when rejected.
    assert_eq!(
        rejected(validate(&header(p::CMD_WRITE, 0, mib - 512, 1024), &l)),
        (p::ENOSPC, 1024)
    );
    assert_eq!(
        rejected(validate(&header(p::CMD_WRITE, 0, 0, 512), &ro)),
        (p::EPERM, 512)
    );
    assert_eq!(
        rejected(validate(&header(p::CMD_WRITE, 0, 1, 512), &l)),
        (p::EINVAL, 512)
    );
    assert_eq!(
        rejected(validate(
            &header(p::CMD_WRITE, p::CMD_FLAG_NO_HOLE, 0, 512),
            &l
        )),
        (p::EINVAL, 512)
    );
    assert_eq!(
        rejected(validate(&header(p::CMD_WRITE, 0, 0, 1 << 17), &l)),
        (p::EINVAL, 1 << 17)
    );
    assert!(matches!(
        validate(&header(p::CMD_WRITE, 0, 0, (1 << 25) + 1), &l),
        Decision::Close(ProtocolViolation::WritePayloadTooLarge { .. })
    ));
    // Trim, write-zeroes, cache, flush.
    assert_eq!(
        rejected(validate(&header(p::CMD_TRIM, 0, 0, 512), &ro)),
        (p::EPERM, 0)
    );
    assert_eq!(
        rejected(validate(&header(p::CMD_TRIM, 0, mib, 512), &l)),
        (p::EINVAL, 0)
    );
    assert_eq!(
        rejected(validate(&header(p::CMD_WRITE_ZEROES, 0, mib, 512), &l)),
        (p::ENOSPC, 0)
    );
    assert_eq!(
        rejected(validate(&header(p::CMD_WRITE_ZEROES, 0, 0, 512), &ro)),
        (p::EPERM, 0)
    );
    assert_eq!(
        rejected(validate(
            &header(p::CMD_WRITE_ZEROES, p::CMD_FLAG_DF, 0, 512),
            &l
        )),
        (p::EINVAL, 0)
    );
    assert_eq!(
        rejected(validate(&header(p::CMD_CACHE, 0, mib, 512), &l)),
        (p::EINVAL, 0)
    );
    assert_eq!(
        rejected(validate(&header(p::CMD_FLUSH, 0, 1, 0), &l)),
        (p::EINVAL, 0)
    );
    assert_eq!(
        rejected(validate(
            &header(p::CMD_FLUSH, p::CMD_FLAG_NO_HOLE, 0, 0),
            &l
        )),
        (p::EINVAL, 0)
    );
    // Block status needs negotiation and a nonempty range.
    assert_eq!(
        rejected(validate(&header(p::CMD_BLOCK_STATUS, 0, 0, 512), &sr)),
        (p::EINVAL, 0)
    );
    let bs = Limits {
        block_status: true,
        ..sr
    };
    assert_eq!(
        rejected(validate(&header(p::CMD_BLOCK_STATUS, 0, 0, 0), &bs)),
        (p::EINVAL, 0)
    );
    assert_eq!(
        rejected(validate(&header(p::CMD_BLOCK_STATUS, 0, mib, 512), &bs)),
        (p::EINVAL, 0)
    );
    // Unknown commands and flags.
    assert_eq!(rejected(validate(&header(99, 0, 0, 0), &l)), (p::EINVAL, 0));
    assert_eq!(
        rejected(validate(&header(p::CMD_READ, 1 << 9, 0, 512), &l)),
        (p::EINVAL, 0)
    );
    // Disconnect.
    assert_eq!(
        validate(&header(p::CMD_DISC, 0, 0, 0), &l),
        Decision::Disconnect
    );
}

// Goal: valid requests become the expected commands, including flags and the final partial
// block of an unaligned export.
#[test]
fn validation_accepts() {
    let l = Limits {
        size_bytes: (1 << 20) + 100,
        ..limits()
    };
    assert_eq!(
        validate(&header(p::CMD_WRITE, p::CMD_FLAG_FUA, 512, 1024), &l),
        Decision::Execute(Command::Write {
            offset: 512,
            length: 1024,
            fua: true
        })
    );
    assert_eq!(
        validate(&header(p::CMD_READ, 0, 1 << 20, 100), &l),
        Decision::Execute(Command::Read {
            offset: 1 << 20,
            length: 100
        })
    );
    assert_eq!(
        validate(
            &header(
                p::CMD_WRITE_ZEROES,
                p::CMD_FLAG_NO_HOLE | p::CMD_FLAG_FAST_ZERO,
                0,
                1 << 20
            ),
            &l
        ),
        Decision::Execute(Command::WriteZeroes {
            offset: 0,
            length: 1 << 20,
            fua: false,
            may_punch_hole: false,
            fast_only: true
        })
    );
    // Payload-less commands may exceed the maximum payload.
    assert_eq!(
        validate(&header(p::CMD_TRIM, 0, 0, 1 << 20), &l),
        Decision::Execute(Command::Trim {
            offset: 0,
            length: 1 << 20,
            fua: false
        })
    );
    assert_eq!(
        validate(&header(p::CMD_FLUSH, p::CMD_FLAG_FUA, 0, 0), &l),
        Decision::Execute(Command::Flush)
    );
    assert_eq!(
        validate(&header(p::CMD_READ, 0, 0, 0), &l),
        Decision::Execute(Command::Read {
            offset: 0,
            length: 0
        })
    );
}
