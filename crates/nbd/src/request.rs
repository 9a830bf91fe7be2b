//! Validation of transmission requests: a pure function from a decoded request header and
//! the negotiated [`Limits`] to a [`Decision`] — execute a well-formed [`Command`], answer
//! with an NBD error, or close the connection.
//!
//! The error values follow the specification: `EINVAL` for unknown commands or flags,
//! misaligned requests and reads, trims, caches and block status queries past the end;
//! `ENOSPC` for writes and write-zeroes past the end; `EPERM` for writes, trims and
//! write-zeroes on a read-only export; `EOVERFLOW` for a structured read longer than the
//! maximum payload. A write longer than the protocol's absolute payload limit (32 MiB) closes
//! the connection, since its payload cannot be skipped at reasonable cost.
//!
//! A command that passes validation has a range inside the export, aligned to the minimum
//! block size (or ending exactly at the export size), so the export never sees bad arguments.

use crate::codec::{ProtocolViolation, RequestHeader};
use crate::protocol;

/// What the connection negotiated and what the export allows; fixed for the whole
/// transmission phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Export size in bytes, as sent to the client.
    pub size_bytes: u64,
    /// Alignment of offsets and lengths (a power of two).
    pub minimum_block_bytes: u32,
    /// Largest read or write payload, at most [`protocol::PAYLOAD_BYTES_MAX`].
    pub payload_bytes_max: u32,
    /// Writes, trims and write-zeroes are refused.
    pub read_only: bool,
    /// Structured replies were negotiated (so `CMD_FLAG_DF` is allowed).
    pub structured_replies: bool,
    /// `base:allocation` was selected for this export (so block status is allowed).
    pub block_status: bool,
}

/// A validated command; every range lies inside the export and is aligned. Fields mirror
/// the request; `fua` is `CMD_FLAG_FUA`, `may_punch_hole` is the absence of `NO_HOLE`,
/// `fast_only` is `FAST_ZERO`, `single_extent` is `REQ_ONE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Read {
        offset: u64,
        length: u32,
    },
    Write {
        offset: u64,
        length: u32,
        fua: bool,
    },
    Flush,
    Trim {
        offset: u64,
        length: u32,
        fua: bool,
    },
    Cache {
        offset: u64,
        length: u32,
    },
    WriteZeroes {
        offset: u64,
        length: u32,
        fua: bool,
        may_punch_hole: bool,
        fast_only: bool,
    },
    BlockStatus {
        offset: u64,
        length: u32,
        single_extent: bool,
    },
}

impl Command {
    /// A write with a payload, which a worker may execute in a batch with others.
    pub fn is_batchable_write(&self) -> bool {
        matches!(*self, Command::Write { length, .. } if length > 0)
    }

    /// Bytes of memory the command needs while in flight (its payload in either direction).
    pub fn buffer_bytes(&self) -> usize {
        match *self {
            Command::Read { length, .. } | Command::Write { length, .. } => length as usize,
            _ => 0,
        }
    }

    /// Name for messages and logs.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Read { .. } => "read",
            Command::Write { .. } => "write",
            Command::Flush => "flush",
            Command::Trim { .. } => "trim",
            Command::Cache { .. } => "cache",
            Command::WriteZeroes { .. } => "write-zeroes",
            Command::BlockStatus { .. } => "block-status",
        }
    }

    /// Offset and length the command covers (zero for flush).
    pub fn range(&self) -> (u64, u32) {
        match *self {
            Command::Read { offset, length }
            | Command::Write { offset, length, .. }
            | Command::Trim { offset, length, .. }
            | Command::Cache { offset, length }
            | Command::WriteZeroes { offset, length, .. }
            | Command::BlockStatus { offset, length, .. } => (offset, length),
            Command::Flush => (0, 0),
        }
    }
}

/// The outcome of validating one request header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Execute the command. For a write, `length` payload bytes follow the header.
    Execute(Command),
    /// Reply with `error`; first read and discard `payload_bytes` bytes that follow the
    /// header (a rejected write's data).
    Reject {
        error: u32,
        message: &'static str,
        payload_bytes: u32,
    },
    /// `CMD_DISC`: finish in-flight requests and close, without a reply.
    Disconnect,
    /// The stream cannot be trusted any more: close without a reply.
    Close(ProtocolViolation),
}

fn reject(error: u32, message: &'static str) -> Decision {
    Decision::Reject {
        error,
        message,
        payload_bytes: 0,
    }
}

/// Validates a request header against the connection's limits.
pub fn validate(header: &RequestHeader, limits: &Limits) -> Decision {
    assert!(limits.minimum_block_bytes.is_power_of_two());
    assert!(limits.payload_bytes_max <= protocol::PAYLOAD_BYTES_MAX);

    let command = header.command;
    let flags = header.flags;
    let offset = header.offset;
    let length = header.length;

    if command == protocol::CMD_WRITE {
        if length > protocol::PAYLOAD_BYTES_MAX {
            return Decision::Close(ProtocolViolation::WritePayloadTooLarge {
                length,
                limit: protocol::PAYLOAD_BYTES_MAX,
            });
        }
        // From here on every rejection of a write must skip its payload to stay in sync.
        return match validate_write(flags, offset, length, limits) {
            Ok(command) => Decision::Execute(command),
            Err((error, message)) => Decision::Reject {
                error,
                message,
                payload_bytes: length,
            },
        };
    }

    let allowed_flags = match command {
        protocol::CMD_READ if limits.structured_replies => {
            protocol::CMD_FLAG_FUA | protocol::CMD_FLAG_DF
        }
        protocol::CMD_WRITE_ZEROES => {
            protocol::CMD_FLAG_FUA | protocol::CMD_FLAG_NO_HOLE | protocol::CMD_FLAG_FAST_ZERO
        }
        protocol::CMD_BLOCK_STATUS => protocol::CMD_FLAG_FUA | protocol::CMD_FLAG_REQ_ONE,
        protocol::CMD_DISC => return Decision::Disconnect,
        protocol::CMD_READ | protocol::CMD_FLUSH | protocol::CMD_TRIM | protocol::CMD_CACHE => {
            protocol::CMD_FLAG_FUA
        }
        _ => return reject(protocol::EINVAL, "unknown command"),
    };
    if flags & !allowed_flags != 0 {
        return reject(protocol::EINVAL, "command flag not valid for this command");
    }
    let fua = flags & protocol::CMD_FLAG_FUA != 0;

    if command == protocol::CMD_FLUSH {
        if offset != 0 || length != 0 {
            return reject(protocol::EINVAL, "flush must have zero offset and length");
        }
        return Decision::Execute(Command::Flush);
    }

    let writes = matches!(command, protocol::CMD_TRIM | protocol::CMD_WRITE_ZEROES);
    if writes && limits.read_only {
        return reject(protocol::EPERM, "the export is read-only");
    }
    if command == protocol::CMD_BLOCK_STATUS && !limits.block_status {
        return reject(
            protocol::EINVAL,
            "block status needs the base:allocation metadata context",
        );
    }
    if !in_range(offset, length, limits.size_bytes) {
        let error = if command == protocol::CMD_WRITE_ZEROES {
            protocol::ENOSPC
        } else {
            protocol::EINVAL
        };
        return reject(error, "request extends past the end of the export");
    }
    if !aligned(offset, length, limits) {
        return reject(
            protocol::EINVAL,
            "request is not aligned to the minimum block size",
        );
    }

    match command {
        protocol::CMD_READ => {
            if length > limits.payload_bytes_max {
                // With structured replies EOVERFLOW tells the client to retry smaller reads.
                let error = if limits.structured_replies {
                    protocol::EOVERFLOW
                } else {
                    protocol::EINVAL
                };
                return reject(error, "read longer than the maximum payload");
            }
            Decision::Execute(Command::Read { offset, length })
        }
        protocol::CMD_TRIM => Decision::Execute(Command::Trim {
            offset,
            length,
            fua,
        }),
        protocol::CMD_CACHE => Decision::Execute(Command::Cache { offset, length }),
        protocol::CMD_WRITE_ZEROES => Decision::Execute(Command::WriteZeroes {
            offset,
            length,
            fua,
            may_punch_hole: flags & protocol::CMD_FLAG_NO_HOLE == 0,
            fast_only: flags & protocol::CMD_FLAG_FAST_ZERO != 0,
        }),
        protocol::CMD_BLOCK_STATUS => {
            if length == 0 {
                return reject(protocol::EINVAL, "block status of an empty range");
            }
            Decision::Execute(Command::BlockStatus {
                offset,
                length,
                single_extent: flags & protocol::CMD_FLAG_REQ_ONE != 0,
            })
        }
        _ => unreachable!("every other command returned above"),
    }
}

fn validate_write(
    flags: u16,
    offset: u64,
    length: u32,
    limits: &Limits,
) -> Result<Command, (u32, &'static str)> {
    if flags & !protocol::CMD_FLAG_FUA != 0 {
        return Err((protocol::EINVAL, "command flag not valid for write"));
    }
    if limits.read_only {
        return Err((protocol::EPERM, "the export is read-only"));
    }
    if length > limits.payload_bytes_max {
        return Err((protocol::EINVAL, "write longer than the maximum payload"));
    }
    if !in_range(offset, length, limits.size_bytes) {
        return Err((protocol::ENOSPC, "write extends past the end of the export"));
    }
    if !aligned(offset, length, limits) {
        return Err((
            protocol::EINVAL,
            "write is not aligned to the minimum block size",
        ));
    }
    Ok(Command::Write {
        offset,
        length,
        fua: flags & protocol::CMD_FLAG_FUA != 0,
    })
}

fn in_range(offset: u64, length: u32, size_bytes: u64) -> bool {
    offset
        .checked_add(u64::from(length))
        .is_some_and(|end| end <= size_bytes)
}

/// Offset and length must be multiples of the minimum block size, except that a request may
/// end exactly at the export size when that size is not a multiple of it.
fn aligned(offset: u64, length: u32, limits: &Limits) -> bool {
    let mask = u64::from(limits.minimum_block_bytes) - 1;
    let end = offset + u64::from(length);
    offset & mask == 0 && (u64::from(length) & mask == 0 || end == limits.size_bytes)
}
