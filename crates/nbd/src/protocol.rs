//! Numeric constants of the NBD protocol as specified in the NetworkBlockDevice project's
//! `doc/proto.md`: magic numbers, handshake and transmission flags, option and reply types,
//! command types and flags, and error values.
//!
//! All values travel in big-endian byte order. Names follow the specification without the
//! `NBD_` prefix so that `protocol::OPT_GO` reads like `NBD_OPT_GO`.

// --- Magic numbers -------------------------------------------------------------------------

/// `NBDMAGIC`: first eight bytes the server sends.
pub const INIT_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: second eight bytes the server sends, and the start of every client option.
pub const OPTION_MAGIC: u64 = 0x4948_4156_454f_5054;
/// Start of every option reply in fixed newstyle negotiation.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Start of every transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Start of every simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Start of every structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// --- Handshake flags (server, 16 bits) and client flags (32 bits) ----------------------------

/// Server handshake flag: the server speaks fixed newstyle negotiation.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
/// Server handshake flag: the server can omit the 124 zero bytes after `OPT_EXPORT_NAME`.
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
/// Client flag: the client speaks fixed newstyle negotiation.
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
/// Client flag: the client does not want the 124 zero bytes after `OPT_EXPORT_NAME`.
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

// --- Transmission flags (16 bits) -------------------------------------------------------------

/// Always set: the flags field is meaningful.
pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
/// The export refuses writes.
pub const FLAG_READ_ONLY: u16 = 1 << 1;
/// The server understands `CMD_FLUSH`.
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
/// The server understands `CMD_FLAG_FUA`.
pub const FLAG_SEND_FUA: u16 = 1 << 3;
/// The export behaves like a rotational medium (never set by this server).
pub const FLAG_ROTATIONAL: u16 = 1 << 4;
/// The server understands `CMD_TRIM`.
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
/// The server understands `CMD_WRITE_ZEROES` and `CMD_FLAG_NO_HOLE`.
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
/// The server honours `CMD_FLAG_DF` on reads (only with structured replies).
pub const FLAG_SEND_DF: u16 = 1 << 7;
/// Flush and FUA effects are visible across all connections to the export.
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
/// The server understands `CMD_CACHE`.
pub const FLAG_SEND_CACHE: u16 = 1 << 10;
/// The server understands `CMD_FLAG_FAST_ZERO`.
pub const FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

// --- Options ----------------------------------------------------------------------------------

pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;

// --- Option replies ---------------------------------------------------------------------------

pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
/// Bit 31 marks every error reply.
pub const REP_FLAG_ERROR: u32 = 1 << 31;
pub const REP_ERR_UNSUP: u32 = REP_FLAG_ERROR | 1;
pub const REP_ERR_POLICY: u32 = REP_FLAG_ERROR | 2;
pub const REP_ERR_INVALID: u32 = REP_FLAG_ERROR | 3;
pub const REP_ERR_PLATFORM: u32 = REP_FLAG_ERROR | 4;
pub const REP_ERR_TLS_REQD: u32 = REP_FLAG_ERROR | 5;
pub const REP_ERR_UNKNOWN: u32 = REP_FLAG_ERROR | 6;
pub const REP_ERR_SHUTDOWN: u32 = REP_FLAG_ERROR | 7;
pub const REP_ERR_BLOCK_SIZE_REQD: u32 = REP_FLAG_ERROR | 8;
pub const REP_ERR_TOO_BIG: u32 = REP_FLAG_ERROR | 9;

// --- Information types for OPT_INFO / OPT_GO ---------------------------------------------------

pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// --- Commands and command flags ---------------------------------------------------------------

pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

// --- Structured reply flags and chunk types ---------------------------------------------------

pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) | 1;
pub const REPLY_TYPE_ERROR_OFFSET: u16 = (1 << 15) | 2;

// --- base:allocation --------------------------------------------------------------------------

/// The only metadata context this server offers.
pub const CONTEXT_BASE_ALLOCATION: &str = "base:allocation";
/// Extent flag in `base:allocation`: the extent is not allocated.
pub const STATE_HOLE: u32 = 1 << 0;
/// Extent flag in `base:allocation`: the extent reads as zeroes.
pub const STATE_ZERO: u32 = 1 << 1;

// --- Error values (the error field of replies) ------------------------------------------------

pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

// --- Sizes fixed by the specification ---------------------------------------------------------

/// Bytes of a transmission request header (magic, flags, type, cookie, offset, length).
pub const REQUEST_HEADER_BYTES: usize = 28;
/// Bytes of a client option header (magic, option, length).
pub const OPTION_HEADER_BYTES: usize = 16;
/// Bytes of a simple reply header (magic, error, cookie).
pub const SIMPLE_REPLY_HEADER_BYTES: usize = 16;
/// Bytes of a structured reply chunk header (magic, flags, type, cookie, length).
pub const STRUCTURED_REPLY_HEADER_BYTES: usize = 20;
/// Bytes of an option reply header (magic, option, type, length).
pub const OPTION_REPLY_HEADER_BYTES: usize = 20;
/// Zero bytes sent after the `OPT_EXPORT_NAME` reply unless the client chose `NO_ZEROES`.
pub const EXPORT_NAME_PADDING_BYTES: usize = 124;
/// Longest string (export name, description, error message) the protocol allows.
pub const STRING_BYTES_MAX: usize = 4096;
/// Largest payload any client may expect a server to accept (2^25), and the payload limit of
/// this server.
pub const PAYLOAD_BYTES_MAX: u32 = 1 << 25;
/// Largest minimum block size the protocol allows.
pub const MINIMUM_BLOCK_BYTES_MAX: u32 = 1 << 16;
/// Largest number of extents a block status chunk should carry.
pub const BLOCK_STATUS_EXTENTS_MAX: usize = 1 << 20;

/// Name of a command for messages and logs.
pub fn command_name(command: u16) -> &'static str {
    match command {
        CMD_READ => "read",
        CMD_WRITE => "write",
        CMD_DISC => "disconnect",
        CMD_FLUSH => "flush",
        CMD_TRIM => "trim",
        CMD_CACHE => "cache",
        CMD_WRITE_ZEROES => "write-zeroes",
        CMD_BLOCK_STATUS => "block-status",
        _ => "unknown",
    }
}

/// Name of an option for messages and logs.
pub fn option_name(option: u32) -> &'static str {
    match option {
        OPT_EXPORT_NAME => "export-name",
        OPT_ABORT => "abort",
        OPT_LIST => "list",
        OPT_STARTTLS => "starttls",
        OPT_INFO => "info",
        OPT_GO => "go",
        OPT_STRUCTURED_REPLY => "structured-reply",
        OPT_LIST_META_CONTEXT => "list-meta-context",
        OPT_SET_META_CONTEXT => "set-meta-context",
        _ => "unknown",
    }
}
