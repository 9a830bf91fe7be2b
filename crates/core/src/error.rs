//! The one error type of the core crate.
//!
//! Operating errors (I/O failures, corrupt bytes, bad arguments) are values of [`Error`];
//! programmer errors are assertions. Every variant carries enough context (which file, which
//! container, which page) for a user to act on it.

use std::io;

/// Errors returned by the engine core.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An I/O operation failed: on the repository, or on what a face reads or writes for the
    /// user (a backup's source, a restore's target). `context` says what was being done, on
    /// which file.
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
    /// The embedded catalog (redb) reported an error, or refused an operation (`source` is
    /// then `None`): a write on a catalog opened read-only, a schema newer than this build.
    #[error("catalog: {}", catalog_message(.context, .source.as_deref()))]
    Catalog {
        /// What was being done; empty when redb's message says it all.
        context: String,
        /// Boxed: redb's error is large, and every result of the engine carries this type.
        #[source]
        source: Option<Box<redb::Error>>,
    },
    /// No key of an encrypted repository opens with the password given.
    #[error(
        "wrong password: no key in {keys} opens with it (check ONECOPY_PASSWORD or \
         --password-file)"
    )]
    WrongPassword {
        /// The keys directory.
        keys: String,
    },
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

    /// Wraps an error of the catalog's database with what was being done (may be empty).
    pub fn catalog(context: impl Into<String>, source: impl Into<redb::Error>) -> Self {
        Error::Catalog {
            context: context.into(),
            source: Some(Box::new(source.into())),
        }
    }

    /// The catalog refused an operation; `detail` says why and what to do.
    pub fn catalog_refused(detail: impl Into<String>) -> Self {
        Error::Catalog {
            context: detail.into(),
            source: None,
        }
    }

    /// The I/O error under this one: an I/O error of the engine, or one redb met.
    pub fn io_source(&self) -> Option<&io::Error> {
        match self {
            Error::Io { source, .. } => Some(source),
            Error::Catalog {
                source: Some(source),
                ..
            } => match source.as_ref() {
                redb::Error::Io(source) => Some(source),
                _ => None,
            },
            _ => None,
        }
    }

    /// True when the error is a checksum or format failure of stored data.
    pub fn is_corrupt(&self) -> bool {
        matches!(self, Error::Corrupt { .. })
    }
}

/// The text of a catalog error: its context, then redb's message.
fn catalog_message(context: &str, source: Option<&redb::Error>) -> String {
    match (context.is_empty(), source) {
        (_, None) => context.to_string(),
        (true, Some(source)) => source.to_string(),
        (false, Some(source)) => format!("{context}: {source}"),
    }
}

/// Adds context to I/O results: `file.read(..).context_io(|| format!("reading {name}"))`.
/// The one way every crate of the workspace wraps an I/O error: the backup store's and the
/// lab's errors convert from [`Error`] and keep it (with its source) whole.
pub trait IoContext<T> {
    /// Maps the error to [`Error::Io`] with `context()`: what was being done, on which file.
    fn context_io<C: Into<String>, F: FnOnce() -> C>(self, context: F) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn context_io<C: Into<String>, F: FnOnce() -> C>(self, context: F) -> Result<T> {
        self.map_err(|source| Error::io(context(), source))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a full disk is recognisable under an engine I/O error and under a catalog error
    /// (redb's own I/O), and nothing else claims an I/O source. Method: one error of each.
    #[test]
    fn io_source_reaches_under_catalog_errors() {
        let full = || io::Error::from_raw_os_error(libc::ENOSPC);
        let engine = Error::io("writing a container", full());
        assert_eq!(
            engine.io_source().unwrap().raw_os_error(),
            Some(libc::ENOSPC)
        );
        let catalog = Error::catalog("", redb::Error::Io(full()));
        assert_eq!(
            catalog.io_source().unwrap().raw_os_error(),
            Some(libc::ENOSPC)
        );
        assert!(Error::catalog_refused("no").io_source().is_none());
        assert!(Error::catalog("", redb::Error::DatabaseAlreadyOpen)
            .io_source()
            .is_none());
        assert!(Error::corrupt("x", "y").io_source().is_none());
    }
}
