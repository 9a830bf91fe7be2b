//! Pure encoding and decoding of NBD messages, separated from all I/O so that every decoder
//! can be unit-tested and fuzzed on arbitrary bytes.
//!
//! Decoders never panic: they return [`ProtocolViolation`] when the bytes break a rule that
//! leaves the server no way to continue (the connection is closed), or [`InvalidOption`]
//! when an option's data is malformed but the stream stays in sync (the server answers
//! `NBD_REP_ERR_INVALID`). Encoders write fixed layouts and assert their own arguments.

use crate::protocol;

/// A violation after which the byte stream cannot be trusted; the server closes the
/// connection.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolViolation {
    #[error("client flags {flags:#x} contain bits this server did not offer")]
    UnknownClientFlags { flags: u32 },
    #[error("option header starts with {magic:#018x} instead of IHAVEOPT")]
    BadOptionMagic { magic: u64 },
    #[error("option {option} carries {length} bytes, more than the limit of {limit}")]
    OptionTooLong {
        option: u32,
        length: u32,
        limit: u32,
    },
    #[error("request header starts with {magic:#010x} instead of the request magic")]
    BadRequestMagic { magic: u32 },
    #[error("write of {length} bytes exceeds the payload limit of {limit} bytes")]
    WritePayloadTooLarge { length: u32, limit: u32 },
    #[error("export name is not valid UTF-8 or is longer than 4096 bytes")]
    BadExportName,
    #[error("the handshake used more than {limit} options")]
    TooManyOptions { limit: usize },
    #[error("the export named {name:?} does not exist")]
    UnknownExport { name: String },
    #[error("the client asked for an export without TLS, which this server requires")]
    TlsRequired,
}

/// Option data that is malformed; the reason is sent to the client with
/// `NBD_REP_ERR_INVALID`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid option data: {reason}")]
pub struct InvalidOption {
    pub reason: &'static str,
}

fn invalid(reason: &'static str) -> InvalidOption {
    InvalidOption { reason }
}

/// Flags a client sends right after the server's greeting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClientFlags {
    /// `C_FIXED_NEWSTYLE`: the client understands option replies.
    pub fixed_newstyle: bool,
    /// `C_NO_ZEROES`: omit the 124 zero bytes after `OPT_EXPORT_NAME`.
    pub no_zeroes: bool,
}

impl ClientFlags {
    /// Decodes the 32-bit client flags. Any bit besides `C_FIXED_NEWSTYLE` and `C_NO_ZEROES`
    /// (the only two this server offers) is a violation.
    pub fn decode(flags: u32) -> Result<ClientFlags, ProtocolViolation> {
        let known = protocol::FLAG_C_FIXED_NEWSTYLE | protocol::FLAG_C_NO_ZEROES;
        if flags & !known != 0 {
            return Err(ProtocolViolation::UnknownClientFlags { flags });
        }
        Ok(ClientFlags {
            fixed_newstyle: flags & protocol::FLAG_C_FIXED_NEWSTYLE != 0,
            no_zeroes: flags & protocol::FLAG_C_NO_ZEROES != 0,
        })
    }

    /// The 32-bit field a client sends (used by tests and fuzzing to build input).
    pub fn encode(&self) -> u32 {
        let mut flags = 0;
        if self.fixed_newstyle {
            flags |= protocol::FLAG_C_FIXED_NEWSTYLE;
        }
        if self.no_zeroes {
            flags |= protocol::FLAG_C_NO_ZEROES;
        }
        flags
    }
}

/// The fixed part of a client option: which option, and how many data bytes follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionHeader {
    /// The option type (`protocol::OPT_*`).
    pub option: u32,
    /// Bytes of option data that follow.
    pub length: u32,
}

impl OptionHeader {
    /// Decodes an option header; the magic must be `IHAVEOPT`.
    pub fn decode(
        bytes: &[u8; protocol::OPTION_HEADER_BYTES],
    ) -> Result<OptionHeader, ProtocolViolation> {
        let magic = read_u64(bytes, 0);
        if magic != protocol::OPTION_MAGIC {
            return Err(ProtocolViolation::BadOptionMagic { magic });
        }
        Ok(OptionHeader {
            option: read_u32(bytes, 8),
            length: read_u32(bytes, 12),
        })
    }

    /// The 16 bytes a client sends, magic included.
    pub fn encode(&self) -> [u8; protocol::OPTION_HEADER_BYTES] {
        let mut bytes = [0; protocol::OPTION_HEADER_BYTES];
        bytes[0..8].copy_from_slice(&protocol::OPTION_MAGIC.to_be_bytes());
        bytes[8..12].copy_from_slice(&self.option.to_be_bytes());
        bytes[12..16].copy_from_slice(&self.length.to_be_bytes());
        bytes
    }
}

/// The data of `OPT_INFO` and `OPT_GO`: an export name and the information types requested.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportRequest {
    /// Export name; empty for the default export.
    pub name: String,
    /// Information types asked for (`protocol::INFO_*`), possibly unknown ones.
    pub information_requests: Vec<u16>,
}

impl ExportRequest {
    /// Decodes `OPT_INFO`/`OPT_GO` data: 32-bit name length, name, 16-bit count, then that
    /// many 16-bit information types, with nothing left over.
    pub fn decode(data: &[u8]) -> Result<ExportRequest, InvalidOption> {
        let mut cursor = Cursor::new(data);
        let name = cursor.string_u32()?;
        let count = cursor
            .u16()
            .ok_or(invalid("missing number of information requests"))?;
        let mut information_requests = Vec::with_capacity(usize::from(count).min(cursor.left()));
        for _ in 0..count {
            let request = cursor
                .u16()
                .ok_or(invalid("fewer information requests than announced"))?;
            information_requests.push(request);
        }
        if cursor.left() != 0 {
            return Err(invalid("trailing bytes after the information requests"));
        }
        Ok(ExportRequest {
            name,
            information_requests,
        })
    }

    /// The option data a client sends. Panics on more than 65535 information requests.
    pub fn encode(&self) -> Vec<u8> {
        let mut data = Vec::new();
        put_string_u32(&mut data, &self.name);
        let count = u16::try_from(self.information_requests.len()).expect("at most 65535");
        data.extend_from_slice(&count.to_be_bytes());
        for request in &self.information_requests {
            data.extend_from_slice(&request.to_be_bytes());
        }
        data
    }
}

/// The data of `OPT_LIST_META_CONTEXT` and `OPT_SET_META_CONTEXT`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaContextRequest {
    /// Export the contexts are for.
    pub export_name: String,
    /// Context queries such as `base:allocation` or `base:`.
    pub queries: Vec<String>,
}

impl MetaContextRequest {
    /// Largest number of queries accepted in one option; more gets `NBD_REP_ERR_TOO_BIG`.
    pub const QUERIES_MAX: u32 = 128;

    /// Decodes: 32-bit name length, name, 32-bit query count, then each query as a 32-bit
    /// length and a string, with nothing left over.
    pub fn decode(data: &[u8]) -> Result<MetaContextRequest, InvalidOption> {
        let mut cursor = Cursor::new(data);
        let export_name = cursor.string_u32()?;
        let count = cursor.u32().ok_or(invalid("missing number of queries"))?;
        // Each query needs at least four bytes, so a count beyond that is a lie; checking it
        // first keeps a hostile count from reserving memory.
        if count as usize > cursor.left() / 4 {
            return Err(invalid("more queries announced than bytes present"));
        }
        if count > Self::QUERIES_MAX {
            return Err(invalid("too many queries"));
        }
        let mut queries = Vec::with_capacity(count as usize);
        for _ in 0..count {
            queries.push(cursor.string_u32()?);
        }
        if cursor.left() != 0 {
            return Err(invalid("trailing bytes after the queries"));
        }
        Ok(MetaContextRequest {
            export_name,
            queries,
        })
    }

    /// The option data a client sends.
    pub fn encode(&self) -> Vec<u8> {
        let mut data = Vec::new();
        put_string_u32(&mut data, &self.export_name);
        data.extend_from_slice(&(self.queries.len() as u32).to_be_bytes());
        for query in &self.queries {
            put_string_u32(&mut data, query);
        }
        data
    }
}

/// A transmission request header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestHeader {
    /// Command flags (`protocol::CMD_FLAG_*`).
    pub flags: u16,
    /// Command type (`protocol::CMD_*`).
    pub command: u16,
    /// Opaque value echoed in the reply.
    pub cookie: u64,
    /// Byte offset in the export.
    pub offset: u64,
    /// Bytes affected (and, for writes, payload bytes that follow).
    pub length: u32,
}

impl RequestHeader {
    /// Decodes a request header; the magic must be the request magic (a wrong magic means
    /// the stream is out of sync and the connection must close).
    pub fn decode(
        bytes: &[u8; protocol::REQUEST_HEADER_BYTES],
    ) -> Result<RequestHeader, ProtocolViolation> {
        let magic = read_u32(bytes, 0);
        if magic != protocol::REQUEST_MAGIC {
            return Err(ProtocolViolation::BadRequestMagic { magic });
        }
        Ok(RequestHeader {
            flags: read_u16(bytes, 4),
            command: read_u16(bytes, 6),
            cookie: read_u64(bytes, 8),
            offset: read_u64(bytes, 16),
            length: read_u32(bytes, 24),
        })
    }

    /// The 28 bytes a client sends, magic included.
    pub fn encode(&self) -> [u8; protocol::REQUEST_HEADER_BYTES] {
        let mut bytes = [0; protocol::REQUEST_HEADER_BYTES];
        bytes[0..4].copy_from_slice(&protocol::REQUEST_MAGIC.to_be_bytes());
        bytes[4..6].copy_from_slice(&self.flags.to_be_bytes());
        bytes[6..8].copy_from_slice(&self.command.to_be_bytes());
        bytes[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        bytes[16..24].copy_from_slice(&self.offset.to_be_bytes());
        bytes[24..28].copy_from_slice(&self.length.to_be_bytes());
        bytes
    }
}

/// The server's greeting: `NBDMAGIC`, `IHAVEOPT`, handshake flags.
pub fn encode_greeting(handshake_flags: u16) -> [u8; 18] {
    let mut bytes = [0; 18];
    bytes[0..8].copy_from_slice(&protocol::INIT_MAGIC.to_be_bytes());
    bytes[8..16].copy_from_slice(&protocol::OPTION_MAGIC.to_be_bytes());
    bytes[16..18].copy_from_slice(&handshake_flags.to_be_bytes());
    bytes
}

/// Appends an option reply (header and data) to `out`.
pub fn put_option_reply(out: &mut Vec<u8>, option: u32, reply_type: u32, data: &[u8]) {
    let length = u32::try_from(data.len()).expect("option reply data fits in 32 bits");
    out.extend_from_slice(&protocol::OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply_type.to_be_bytes());
    out.extend_from_slice(&length.to_be_bytes());
    out.extend_from_slice(data);
}

/// The `NBD_INFO_EXPORT` payload: type, size, transmission flags.
pub fn encode_info_export(size_bytes: u64, transmission_flags: u16) -> [u8; 12] {
    let mut bytes = [0; 12];
    bytes[0..2].copy_from_slice(&protocol::INFO_EXPORT.to_be_bytes());
    bytes[2..10].copy_from_slice(&size_bytes.to_be_bytes());
    bytes[10..12].copy_from_slice(&transmission_flags.to_be_bytes());
    bytes
}

/// The `NBD_INFO_BLOCK_SIZE` payload: type, minimum, preferred, maximum.
pub fn encode_info_block_size(minimum: u32, preferred: u32, maximum: u32) -> [u8; 14] {
    let mut bytes = [0; 14];
    bytes[0..2].copy_from_slice(&protocol::INFO_BLOCK_SIZE.to_be_bytes());
    bytes[2..6].copy_from_slice(&minimum.to_be_bytes());
    bytes[6..10].copy_from_slice(&preferred.to_be_bytes());
    bytes[10..14].copy_from_slice(&maximum.to_be_bytes());
    bytes
}

/// An `NBD_INFO_NAME` or `NBD_INFO_DESCRIPTION` payload: type and text.
pub fn encode_info_text(information_type: u16, text: &str) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(2 + text.len());
    bytes.extend_from_slice(&information_type.to_be_bytes());
    bytes.extend_from_slice(text.as_bytes());
    bytes
}

/// A simple reply header.
pub fn encode_simple_reply(error: u32, cookie: u64) -> [u8; protocol::SIMPLE_REPLY_HEADER_BYTES] {
    let mut bytes = [0; protocol::SIMPLE_REPLY_HEADER_BYTES];
    bytes[0..4].copy_from_slice(&protocol::SIMPLE_REPLY_MAGIC.to_be_bytes());
    bytes[4..8].copy_from_slice(&error.to_be_bytes());
    bytes[8..16].copy_from_slice(&cookie.to_be_bytes());
    bytes
}

/// A structured reply chunk header announcing `length` payload bytes.
pub fn encode_structured_reply(
    flags: u16,
    chunk_type: u16,
    cookie: u64,
    length: u32,
) -> [u8; protocol::STRUCTURED_REPLY_HEADER_BYTES] {
    let mut bytes = [0; protocol::STRUCTURED_REPLY_HEADER_BYTES];
    bytes[0..4].copy_from_slice(&protocol::STRUCTURED_REPLY_MAGIC.to_be_bytes());
    bytes[4..6].copy_from_slice(&flags.to_be_bytes());
    bytes[6..8].copy_from_slice(&chunk_type.to_be_bytes());
    bytes[8..16].copy_from_slice(&cookie.to_be_bytes());
    bytes[16..20].copy_from_slice(&length.to_be_bytes());
    bytes
}

/// Appends a final `NBD_REPLY_TYPE_ERROR` chunk (header and payload) to `out`. Messages are
/// cut at a character boundary to the protocol's string limit.
pub fn put_error_chunk(out: &mut Vec<u8>, cookie: u64, error: u32, message: &str) {
    assert!(error != 0, "an error chunk needs a nonzero error");
    let message = truncate_utf8(message, protocol::STRING_BYTES_MAX);
    let payload_bytes = 6 + message.len() as u32;
    out.extend_from_slice(&encode_structured_reply(
        protocol::REPLY_FLAG_DONE,
        protocol::REPLY_TYPE_ERROR,
        cookie,
        payload_bytes,
    ));
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&(message.len() as u16).to_be_bytes());
    out.extend_from_slice(message.as_bytes());
}

/// The longest prefix of `text` that is at most `bytes_max` bytes and ends on a character
/// boundary.
pub fn truncate_utf8(text: &str, bytes_max: usize) -> &str {
    if text.len() <= bytes_max {
        return text;
    }
    let mut end = bytes_max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn put_string_u32(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(&(text.len() as u32).to_be_bytes());
    out.extend_from_slice(text.as_bytes());
}

/// Decodes a protocol string: valid UTF-8, no NUL, at most 4096 bytes.
pub fn decode_string(bytes: &[u8]) -> Option<String> {
    if bytes.len() > protocol::STRING_BYTES_MAX || bytes.contains(&0) {
        return None;
    }
    std::str::from_utf8(bytes).ok().map(str::to_owned)
}

fn read_u16(bytes: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([bytes[at], bytes[at + 1]])
}

fn read_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(bytes[at..at + 4].try_into().expect("four bytes"))
}

fn read_u64(bytes: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(bytes[at..at + 8].try_into().expect("eight bytes"))
}

/// Reads big-endian fields from option data, checking every length against what is left.
struct Cursor<'a> {
    data: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn new(data: &'a [u8]) -> Cursor<'a> {
        Cursor { data }
    }

    fn left(&self) -> usize {
        self.data.len()
    }

    fn take(&mut self, count: usize) -> Option<&'a [u8]> {
        if count > self.data.len() {
            return None;
        }
        let (head, tail) = self.data.split_at(count);
        self.data = tail;
        Some(head)
    }

    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|bytes| read_u16(bytes, 0))
    }

    fn u32(&mut self) -> Option<u32> {
        self.take(4).map(|bytes| read_u32(bytes, 0))
    }

    fn string_u32(&mut self) -> Result<String, InvalidOption> {
        let length = self.u32().ok_or(invalid("missing string length"))?;
        let bytes = self
            .take(length as usize)
            .ok_or(invalid("string longer than the option data"))?;
        decode_string(bytes).ok_or(invalid(
            "string is not UTF-8, contains NUL or exceeds 4096 bytes",
        ))
    }
}

/// Appends a final `NBD_REPLY_TYPE_BLOCK_STATUS` chunk describing the `length` bytes a client
/// asked about, from the export's `extents` (which start at the request offset).
///
/// Descriptors are clipped to the requested range, adjacent descriptors with equal flags are
/// merged, at most [`protocol::BLOCK_STATUS_EXTENTS_MAX`] are sent, and with `single_extent`
/// (`CMD_FLAG_REQ_ONE`) only the first. Extents after a zero-length extent are ignored.
/// Returns the number of descriptors, or an error (and appends nothing) if the first extent is
/// empty or there is none: the export broke its contract.
pub fn put_block_status_chunk(
    out: &mut Vec<u8>,
    cookie: u64,
    context_id: u32,
    length: u32,
    single_extent: bool,
    extents: &[crate::export::AllocationExtent],
) -> Result<usize, &'static str> {
    assert!(length > 0, "block status of an empty range");
    let descriptors_max = if single_extent {
        1
    } else {
        protocol::BLOCK_STATUS_EXTENTS_MAX
    };
    let start = out.len();
    out.extend_from_slice(&[0; protocol::STRUCTURED_REPLY_HEADER_BYTES]);
    out.extend_from_slice(&context_id.to_be_bytes());
    let mut left = u64::from(length);
    let mut descriptors = 0;
    // Flags of the last descriptor written, and where its length field sits.
    let mut last: Option<(u32, usize)> = None;
    for extent in extents {
        if extent.length == 0 || left == 0 {
            break;
        }
        let take = extent.length.min(left);
        left -= take;
        let flags = extent.status_flags();
        match last {
            Some((last_flags, at)) if last_flags == flags => {
                // The sum never exceeds the request length, which fits in 32 bits.
                let merged = read_u32(out, at) as u64 + take;
                out[at..at + 4].copy_from_slice(&(merged as u32).to_be_bytes());
            }
            _ => {
                if descriptors == descriptors_max {
                    break;
                }
                last = Some((flags, out.len()));
                out.extend_from_slice(&(take as u32).to_be_bytes());
                out.extend_from_slice(&flags.to_be_bytes());
                descriptors += 1;
            }
        }
    }
    if descriptors == 0 {
        out.truncate(start);
        return Err("block status returned no extent covering the first byte");
    }
    let payload_bytes = (out.len() - start - protocol::STRUCTURED_REPLY_HEADER_BYTES) as u32;
    let header = encode_structured_reply(
        protocol::REPLY_FLAG_DONE,
        protocol::REPLY_TYPE_BLOCK_STATUS,
        cookie,
        payload_bytes,
    );
    out[start..start + protocol::STRUCTURED_REPLY_HEADER_BYTES].copy_from_slice(&header);
    Ok(descriptors)
}
