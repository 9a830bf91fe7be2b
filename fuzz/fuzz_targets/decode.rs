//! Fuzzes the pure codec and request validation: every decoder on arbitrary bytes, and
//! validation of arbitrary headers against arbitrary limits, checking that accepted commands
//! are inside the export and aligned.

#![no_main]

use libfuzzer_sys::fuzz_target;
use onecopy_nbd::codec::{self, ExportRequest, MetaContextRequest, OptionHeader, RequestHeader};
use onecopy_nbd::request::{validate, Decision, Limits};
use onecopy_nbd::{protocol, Extent};

fuzz_target!(|data: &[u8]| {
    let _ = ExportRequest::decode(data);
    let _ = MetaContextRequest::decode(data);
    let _ = codec::decode_string(data);
    if data.len() >= 16 {
        let _ = OptionHeader::decode(data[..16].try_into().unwrap());
    }
    if data.len() < 28 + 11 {
        return;
    }
    let mut header_bytes: [u8; 28] = data[..28].try_into().unwrap();
    // Half of the inputs get a valid magic so validation is reached.
    if data[28] & 1 == 1 {
        header_bytes[..4].copy_from_slice(&protocol::REQUEST_MAGIC.to_be_bytes());
    }
    let Ok(header) = RequestHeader::decode(&header_bytes) else {
        return;
    };
    assert_eq!(RequestHeader::decode(&header.encode()), Ok(header));
    let size_bytes = u64::from_be_bytes(data[29..37].try_into().unwrap()) >> (data[37] % 64);
    let limits = Limits {
        size_bytes,
        minimum_block_bytes: 1 << (data[38] % 17),
        payload_bytes_max: (u32::from(data[38]) << 17).min(protocol::PAYLOAD_BYTES_MAX),
        read_only: data[28] & 2 != 0,
        structured_replies: data[28] & 4 != 0,
        block_status: data[28] & 12 == 12,
    };
    if let Decision::Execute(command) = validate(&header, &limits) {
        let (offset, length) = command.range();
        let end = offset.checked_add(u64::from(length)).expect("no overflow");
        assert!(end <= size_bytes);
        assert_eq!(offset % u64::from(limits.minimum_block_bytes), 0);
        if let onecopy_nbd::request::Command::BlockStatus { length, single_extent, .. } = command {
            let extents: Vec<Extent> = data[39..]
                .iter()
                .map(|&byte| Extent {
                    length: u64::from(byte >> 2) * 512,
                    hole: byte & 1 != 0,
                    zero: byte & 2 != 0,
                })
                .collect();
            let mut out = Vec::new();
            if let Ok(count) =
                codec::put_block_status_chunk(&mut out, 1, 1, length, single_extent, &extents)
            {
                assert!(count >= 1);
                assert_eq!(out.len(), 20 + 4 + 8 * count);
                let total: u64 = out[24..]
                    .chunks(8)
                    .map(|d| u64::from(u32::from_be_bytes(d[..4].try_into().unwrap())))
                    .sum();
                assert!(total <= u64::from(length));
            }
        }
    }
});
