//! The one error type of the core crate.
//!
//! Operating errors (I/O failures, corrupt bytes, bad arguments) are values of [`Error`];
//! programmer errors are assertions. Every variant carries enough context (which file, which
//! container, which page) for a user to act on it.

use std::io;

/// Errors returned by the engine core.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An I/O operation on the repository failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    /// Stored bytes failed a checksum or format check.
    #[error("corrupt {what}: {detail} (run `onecopy check` to verify and repair the repository)")]
    Corrupt { what: String, detail: String },
    /// A caller passed a value outside the documented range.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// There is no repository where one was expected.
    #[error(
        "no repository at {path}; create one with `onecopy init`, or point --repo or \
         ONECOPY_REPO at an existing one"
    )]
    NoRepository { path: String },
    /// A named object does not exist.
    #[error("{0} not found")]
    NotFound(String),
    /// A named object already exists.
    #[error("{0} already exists")]
    AlreadyExists(String),
    /// A configured limit was reached.
    #[error("limit reached: {0}")]
    Limit(String),
    /// The embedded catalog reported an error.
    #[error("catalog: {0}")]
    Catalog(String),
    /// Another process holds the lock of a face of the repository.
    #[error(
        "{face} is in use by another onecopy process ({holder}); wait for it to finish, stop \
         it, or pass --wait"
    )]
    Locked {
        /// The face's directory.
        face: String,
        /// Who holds the lock, as its lock file says (`pid 1234: serve`).
        holder: String,
    },
}

/// Result with the core [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Wraps an I/O error with a description of what was being done.
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// Reports corrupt stored bytes.
    pub fn corrupt(what: impl Into<String>, detail: impl Into<String>) -> Self {
        Error::Corrupt {
            what: what.into(),
            detail: detail.into(),
        }
    }

    /// True when the error is a checksum or format failure of stored data.
    pub fn is_corrupt(&self) -> bool {
        matches!(self, Error::Corrupt { .. })
    }
}

/// Adds context to I/O results: `file.read(..).context_io(|| format!("reading {name}"))`.
pub trait IoContext<T> {
    fn context_io<F: FnOnce() -> String>(self, context: F) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn context_io<F: FnOnce() -> String>(self, context: F) -> Result<T> {
        self.map_err(|source| Error::io(context(), source))
    }
}
