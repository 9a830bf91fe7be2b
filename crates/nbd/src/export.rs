//! What the server serves: the [`Export`] trait (a byte range with read, write, flush, trim,
//! write-zeroes, block status and cache), the [`ExportCatalog`] that resolves export names
//! during the handshake, and the value types they exchange.
//!
//! Terms:
//! - *export*: a named, fixed-size range of bytes a client can attach to.
//! - *extent*: a run of bytes sharing one allocation status (hole or allocated, known zero or
//!   not), as reported by block status.
//! - *block size*: the three size constraints of the specification's "Size constraints"
//!   section: minimum (alignment of every request), preferred (efficient granularity) and
//!   maximum (largest payload per request).
//!
//! The server validates every request before it reaches an export: offsets and lengths are
//! inside the size returned by [`Export::size`] at handshake time, aligned to the minimum block
//! size (except a final partial block ending exactly at the export size), payloads are at most
//! the maximum block size, lengths are nonzero, and writes never reach a read-only export. An
//! export therefore only has to handle operating errors, which it reports as [`ExportError`].

use std::fmt;
use std::io;
use std::sync::Arc;

use crate::protocol;

/// One write of a [`Export::write_batch`]: nonempty, in range and aligned, like a single
/// [`write`](Export::write).
#[derive(Clone, Copy, Debug)]
pub struct WriteRequest<'a> {
    pub offset: u64,
    pub data: &'a [u8],
    /// Force unit access: durable when the batch returns.
    pub fua: bool,
}

/// A block device the server exposes to NBD clients.
///
/// All methods may be called concurrently from several worker threads and several
/// connections; in particular reads run concurrently with each other and with writes. The
/// protocol gives no ordering between requests that are in flight at the same time, so an
/// export needs no ordering beyond what each method states.
pub trait Export: Send + Sync {
    /// Size of the export in bytes. Read once per connection, when the handshake completes;
    /// the connection uses that value for its whole life.
    fn size(&self) -> u64;

    /// Size constraints the server advertises and enforces for this export.
    fn block_size(&self) -> BlockSize;

    /// True if every write must fail. The server then rejects write, trim and write-zeroes
    /// requests with `EPERM` and never calls the corresponding methods.
    fn read_only(&self) -> bool;

    /// True if a completed [`flush`](Export::flush) (or a write with `fua`) is visible and
    /// durable for every connection to this export, not only the one that sent it. The server
    /// then advertises `CAN_MULTI_CONN`, letting clients spread requests over connections.
    fn flush_is_global(&self) -> bool;

    /// Fills `buffer` with the bytes at `offset .. offset + buffer.len()`.
    ///
    /// Called with a nonempty, in-range, aligned range. On error the buffer contents are
    /// ignored.
    fn read(&self, offset: u64, buffer: &mut [u8]) -> Result<(), ExportError>;

    /// Stores `data` at `offset`. When `fua` is set, the data must be durable when this
    /// returns; otherwise durability may wait for the next [`flush`](Export::flush).
    ///
    /// Called with a nonempty, in-range, aligned range, never on a read-only export.
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError>;

    /// Stores several writes that were in flight together, with the meaning of calling
    /// [`write`](Export::write) for each in turn (the protocol orders none of them against
    /// the others), and pushes one result per write into `results` (empty on entry). The
    /// server hands queued writes over in batches so that an export can amortise its fixed
    /// costs (locks, hashing set-up); the default calls `write` for each.
    fn write_batch(&self, writes: &[WriteRequest<'_>], results: &mut Vec<Result<(), ExportError>>) {
        for write in writes {
            results.push(self.write(write.offset, write.data, write.fua));
        }
    }

    /// Makes every write that completed before this call durable.
    fn flush(&self) -> Result<(), ExportError>;

    /// Hint that `offset .. offset + length` is no longer needed. The export may discard all,
    /// part or none of it; afterwards the contents of the range are unspecified until
    /// rewritten. When `fua` is set, whatever was discarded must be durable on return.
    ///
    /// Called with a nonempty, in-range, aligned range, never on a read-only export.
    fn trim(&self, offset: u64, length: u64, fua: bool) -> Result<(), ExportError>;

    /// Makes `offset .. offset + length` read as zeroes.
    ///
    /// `options.may_punch_hole` allows deallocating the range (the client did not send
    /// `NO_HOLE`). With `options.fast_only`, the export must either zero the range faster than
    /// an equivalent write would, or return [`ExportError::FastZeroUnsupported`] quickly
    /// without changing the contents.
    ///
    /// Called with a nonempty, in-range, aligned range, never on a read-only export.
    fn write_zeroes(
        &self,
        offset: u64,
        length: u64,
        options: ZeroOptions,
    ) -> Result<(), ExportError>;

    /// Appends to `extents` the allocation status of consecutive extents starting at `offset`.
    ///
    /// The extents must cover at least one byte; they may stop before `offset + length`
    /// (the client asks again for the rest) or reach past it. The server rejects a reply with
    /// an empty first extent as an export failure. Reporting an extent as neither hole nor
    /// zero is always correct.
    fn block_status(
        &self,
        offset: u64,
        length: u64,
        extents: &mut Vec<AllocationExtent>,
    ) -> Result<(), ExportError>;

    /// Hint that the client will soon access `offset .. offset + length`; the export may
    /// prefetch it. Has no effect on contents.
    fn cache(&self, offset: u64, length: u64) -> Result<(), ExportError>;
}

/// Resolves export names during the handshake and lists exports for `OPT_LIST`.
pub trait ExportCatalog: Send + Sync {
    /// Every export a client may attach to, in the order `OPT_LIST` reports them.
    fn list(&self) -> Vec<ExportInfo>;

    /// The export with exactly this name, or `None` if there is none.
    ///
    /// The empty name is the *default export*. The server applies this rule: if `open("")`
    /// returns an export, that is the default; otherwise, if [`list`](ExportCatalog::list)
    /// returns exactly one export, the default is that one; otherwise there is no default
    /// export and the client gets `NBD_REP_ERR_UNKNOWN`.
    fn open(&self, name: &str) -> Option<Arc<dyn Export>>;
}

/// Name and human-readable description of an export, as `OPT_LIST` and `OPT_INFO` report
/// them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportInfo {
    /// Name clients pass to `OPT_GO`; at most [`protocol::STRING_BYTES_MAX`] bytes of UTF-8.
    pub name: String,
    /// Free text shown to users; may be empty.
    pub description: String,
}

/// The size constraints of an export. Constructed through [`BlockSize::new`], which enforces
/// the specification's rules, so every value of this type can be advertised as is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSize {
    minimum_bytes: u32,
    preferred_bytes: u32,
    maximum_bytes: u32,
}

impl BlockSize {
    /// Minimum 1, preferred 4096, maximum 32 MiB: the specification's defaults for a server
    /// that imposes no constraints.
    pub const DEFAULT: BlockSize = BlockSize {
        minimum_bytes: 1,
        preferred_bytes: 4096,
        maximum_bytes: protocol::PAYLOAD_BYTES_MAX,
    };

    /// Validates a set of constraints.
    ///
    /// `minimum_bytes` must be a power of two no larger than 64 KiB; `preferred_bytes` a power
    /// of two at least `max(minimum_bytes, 512)`; `maximum_bytes` at least `preferred_bytes`
    /// and at most [`protocol::PAYLOAD_BYTES_MAX`] (this server's payload limit) and a multiple
    /// of `minimum_bytes`.
    pub fn new(
        minimum_bytes: u32,
        preferred_bytes: u32,
        maximum_bytes: u32,
    ) -> Result<BlockSize, InvalidBlockSize> {
        let invalid = |reason| {
            Err(InvalidBlockSize {
                minimum_bytes,
                preferred_bytes,
                maximum_bytes,
                reason,
            })
        };
        if !minimum_bytes.is_power_of_two() || minimum_bytes > protocol::MINIMUM_BLOCK_BYTES_MAX {
            return invalid("the minimum must be a power of two no larger than 65536");
        }
        if !preferred_bytes.is_power_of_two() || preferred_bytes < minimum_bytes.max(512) {
            return invalid("the preferred size must be a power of two at least max(minimum, 512)");
        }
        if maximum_bytes < preferred_bytes || maximum_bytes > protocol::PAYLOAD_BYTES_MAX {
            return invalid("the maximum must lie between the preferred size and 32 MiB");
        }
        if maximum_bytes % minimum_bytes != 0 {
            return invalid("the maximum must be a multiple of the minimum");
        }
        Ok(BlockSize {
            minimum_bytes,
            preferred_bytes,
            maximum_bytes,
        })
    }

    /// Alignment and granularity of every request.
    pub fn minimum_bytes(&self) -> u32 {
        self.minimum_bytes
    }

    /// Granularity at which requests are efficient.
    pub fn preferred_bytes(&self) -> u32 {
        self.preferred_bytes
    }

    /// Largest read or write payload the server accepts for this export.
    pub fn maximum_bytes(&self) -> u32 {
        self.maximum_bytes
    }
}

/// Block size constraints that break the specification's rules.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid block size (minimum {minimum_bytes}, preferred {preferred_bytes}, maximum \
     {maximum_bytes}): {reason}"
)]
pub struct InvalidBlockSize {
    pub minimum_bytes: u32,
    pub preferred_bytes: u32,
    pub maximum_bytes: u32,
    pub reason: &'static str,
}

/// Allocation status of `length` consecutive bytes, in the terms of `base:allocation`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocationExtent {
    /// Number of bytes; must be nonzero.
    pub length: u64,
    /// The bytes are not allocated in the backing store.
    pub hole: bool,
    /// The bytes are known to read as zeroes.
    pub zero: bool,
}

impl AllocationExtent {
    /// The `base:allocation` status flags of this extent.
    pub fn status_flags(&self) -> u32 {
        let mut flags = 0;
        if self.hole {
            flags |= protocol::STATE_HOLE;
        }
        if self.zero {
            flags |= protocol::STATE_ZERO;
        }
        flags
    }
}

/// How [`Export::write_zeroes`] may zero a range.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ZeroOptions {
    /// The zeroes must be durable on return.
    pub fua: bool,
    /// The export may deallocate the range instead of writing zeroes (no `NO_HOLE` flag).
    pub may_punch_hole: bool,
    /// Fail with [`ExportError::FastZeroUnsupported`] unless zeroing is faster than writing.
    pub fast_only: bool,
}

/// An operating error of an export. The server turns it into an NBD error value for the
/// client (see [`ExportError::errno`]) and logs it.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The backing store failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    /// The backing store is full.
    #[error("no space left: {context}")]
    NoSpace { context: String },
    /// The export refuses the operation (for instance it became read-only).
    #[error("operation not permitted: {context}")]
    NotPermitted { context: String },
    /// A fast-only write-zeroes cannot be done faster than a write; nothing was changed.
    #[error("zeroing this range is not faster than writing it")]
    FastZeroUnsupported,
    /// Any other failure (corrupt metadata, internal inconsistency, ...).
    #[error("{context}")]
    Failed { context: String },
}

impl ExportError {
    /// An I/O failure with a description of what was being done.
    pub fn io(context: impl fmt::Display, source: io::Error) -> ExportError {
        ExportError::Io {
            context: context.to_string(),
            source,
        }
    }

    /// A failure without an underlying I/O error.
    pub fn failed(context: impl fmt::Display) -> ExportError {
        ExportError::Failed {
            context: context.to_string(),
        }
    }

    /// The NBD error value sent to the client: `ENOSPC` for a full store (including the
    /// `ENOSPC`, `EDQUOT` and `EFBIG` I/O errors, as the specification asks), `EPERM`,
    /// `ENOTSUP` for a refused fast zero, and `EIO` for everything else.
    pub fn errno(&self) -> u32 {
        match self {
            ExportError::Io { source, .. } => match source.raw_os_error() {
                Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::EFBIG) => protocol::ENOSPC,
                _ => protocol::EIO,
            },
            ExportError::NoSpace { .. } => protocol::ENOSPC,
            ExportError::NotPermitted { .. } => protocol::EPERM,
            ExportError::FastZeroUnsupported => protocol::ENOTSUP,
            ExportError::Failed { .. } => protocol::EIO,
        }
    }
}

/// An [`ExportCatalog`] over a fixed list of named exports.
#[derive(Clone, Default)]
pub struct ExportMap {
    exports: Vec<(ExportInfo, Arc<dyn Export>)>,
}

impl ExportMap {
    /// An empty catalog.
    pub fn new() -> ExportMap {
        ExportMap::default()
    }

    /// Adds an export. Panics if the name is already present or longer than the protocol's
    /// string limit: both are programming errors of the caller.
    pub fn insert(
        &mut self,
        name: impl Into<String>,
        description: impl Into<String>,
        export: Arc<dyn Export>,
    ) -> &mut ExportMap {
        let name = name.into();
        assert!(
            name.len() <= protocol::STRING_BYTES_MAX,
            "export name too long"
        );
        assert!(
            self.exports.iter().all(|(info, _)| info.name != name),
            "export {name:?} inserted twice"
        );
        self.exports.push((
            ExportInfo {
                name,
                description: description.into(),
            },
            export,
        ));
        self
    }

    /// A catalog holding a single export.
    pub fn single(name: impl Into<String>, export: Arc<dyn Export>) -> ExportMap {
        let mut map = ExportMap::new();
        map.insert(name, "", export);
        map
    }
}

impl ExportCatalog for ExportMap {
    fn list(&self) -> Vec<ExportInfo> {
        self.exports.iter().map(|(info, _)| info.clone()).collect()
    }

    fn open(&self, name: &str) -> Option<Arc<dyn Export>> {
        self.exports
            .iter()
            .find(|(info, _)| info.name == name)
            .map(|(_, export)| Arc::clone(export))
    }
}
