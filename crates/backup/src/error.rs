//! The one error type of the backup store.
//!
//! Operating errors (I/O failures, corrupt records, unknown series, bad arguments) are values
//! of [`BackupError`], each with the context a user needs to act; broken invariants of the
//! store's own bookkeeping are assertions.

use std::io;

/// Errors returned by the backup store.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// An error of the engine core (storage, containers, catalog, index).
    #[error(transparent)]
    Core(#[from] onecopy_core::Error),
    /// An I/O error on a backup source or restore target (not the repository).
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    /// A stored record failed its checksum or format check.
    #[error("corrupt {what}: {detail} (run `onecopy backup check`)")]
    Corrupt { what: String, detail: String },
    /// The named series does not exist.
    #[error("series {0:?} not found (see `onecopy backup list`)")]
    SeriesNotFound(String),
    /// The series exists but not this version.
    #[error("backup {series}@{version} not found (see `onecopy backup list {series}`)")]
    VersionNotFound { series: String, version: u32 },
    /// A caller passed a value outside the documented range, or asked for something the
    /// store's state does not allow.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The file system holding the repository is full. Nothing of the operation was
    /// committed, and the files it wrote were removed again.
    #[error(
        "{operation} failed: the file system holding the repository is full ({detail}); \
         nothing was committed and what was written is removed again. To make room: {hint}"
    )]
    Full {
        operation: String,
        detail: String,
        hint: String,
    },
    /// Data a repair recorded as lost was asked for ([`crate::losses`]).
    #[error(
        "{what}: {detail} (lost to damage that `onecopy check --repair` recorded; see \
         `onecopy check`)"
    )]
    Lost { what: String, detail: String },
}

/// Result with [`BackupError`].
pub type Result<T, E = BackupError> = std::result::Result<T, E>;

impl BackupError {
    /// Wraps an I/O error on a source or target with what was being done.
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        BackupError::Io {
            context: context.into(),
            source,
        }
    }

    /// Reports a corrupt record.
    pub fn corrupt(what: impl Into<String>, detail: impl Into<String>) -> Self {
        BackupError::Corrupt {
            what: what.into(),
            detail: detail.into(),
        }
    }
}

/// Adds context to I/O results on sources and targets.
pub(crate) trait IoContext<T> {
    fn context_io<F: FnOnce() -> String>(self, context: F) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn context_io<F: FnOnce() -> String>(self, context: F) -> Result<T> {
        self.map_err(|source| BackupError::io(context(), source))
    }
}
