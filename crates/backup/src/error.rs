//! The one error type of the backup store.
//!
//! Operating errors (I/O failures, corrupt records, unknown series, bad arguments) are values
//! of [`BackupError`], each with the context a user needs to act; broken invariants of the
//! store's own bookkeeping are assertions.

use std::io;

/// Errors returned by the backup store.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// An error of the engine core (storage, containers, catalog, index), and every I/O
    /// error, on the repository or on a backup source or restore target
    /// ([`onecopy_core::Error::Io`], whose context names the file).
    #[error(transparent)]
    Core(#[from] onecopy_core::Error),
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
    /// A backup's directory tree holds an entry a restore must not create: a path with `..`,
    /// `.`, a leading `/`, an empty component or a NUL byte, an entry whose parent is not a
    /// directory of the tree, a duplicate, or contents outside the stream. Found before the
    /// target is touched.
    #[error(
        "corrupt tree in backup {backup}: entry {path}: {detail}; nothing was restored \
         (run `onecopy backup check`)"
    )]
    CorruptTree {
        backup: String,
        /// The entry's stored path, escaped (`\xNN` for bytes that are not printable ASCII).
        path: String,
        detail: String,
    },
    /// A restore would replace what its target already holds, and replacing was not asked
    /// for. Nothing was written.
    #[error("{target} {detail}")]
    TargetNotEmpty {
        target: String,
        /// What the target holds, what the restore would replace, and how to proceed.
        detail: String,
    },
    /// A restore with overwriting would have to replace a directory of the target, with
    /// everything in it, by an entry that is not a directory. Nothing was written.
    #[error(
        "{target}: {detail}: a restore replaces entries, never a directory with its contents; \
         move those directories away first"
    )]
    TargetConflict { target: String, detail: String },
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
    /// Wraps an I/O error with what was being done (an [`onecopy_core::Error::Io`]).
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        BackupError::Core(onecopy_core::Error::io(context, source))
    }

    /// Reports a tree entry that a restore must not create.
    pub fn corrupt_tree(backup: &str, path: &[u8], detail: impl Into<String>) -> Self {
        BackupError::CorruptTree {
            backup: backup.to_string(),
            path: escape_path(path),
            detail: detail.into(),
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

/// A stored path as it can be shown whatever its bytes: quoted, with `\xNN` escapes for
/// bytes that are not printable ASCII.
pub fn escape_path(path: &[u8]) -> String {
    format!("\"{}\"", path.escape_ascii())
}
