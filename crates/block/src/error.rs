//! The one error type of the block crate.
//!
//! Operating errors (I/O failures, damaged metadata, lost blocks, bad requests, a full disk)
//! are values of [`BlockError`]; programmer errors are assertions. An error that concerns
//! one block says which ([`BlockError::Block`]); the errors of the engine core keep their
//! type inside [`BlockError::Core`], so that a full disk stays recognisable
//! ([`BlockError::is_full`]) and becomes ENOSPC for NBD clients.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use onecopy_core::Error;

/// Errors returned by the block device.
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    /// An error of the engine core: storage, containers, metadata pages, journal, index, or a
    /// bad argument.
    #[error(transparent)]
    Core(#[from] Error),
    /// A block of a volume could not be read or changed: its map page or its stored bytes
    /// are damaged or unreadable, or a repair recorded its data lost.
    #[error("block {block} of volume {volume}: {source}")]
    Block {
        /// The volume's name.
        volume: String,
        /// The block (logical block address, in the volume's blocks).
        block: u64,
        #[source]
        source: Error,
    },
    /// An earlier operation failed half way, with changes in memory that its journal record
    /// does not hold; the engine refuses all work until it is opened again (which recovers
    /// from the journal). Every later request gets a clone of this error.
    #[error(
        "the block device stopped after an earlier operation failed ({reason}); restart \
         onecopy to recover"
    )]
    EngineFailed {
        /// What the failed operation reported.
        reason: Arc<str>,
    },
    /// A volume id ([`crate::volume::VolumeId`]) that no volume has (any more).
    #[error("volume {0} not found (it was deleted)")]
    VolumeIdNotFound(u32),
    /// The server on the control socket answered with something that is not a control
    /// response (another program listens there, or a onecopy of another version).
    #[error(
        "the server at {} gave an answer that is not a control response: {source}",
        path.display()
    )]
    ControlAnswer {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// The control socket of a running server could not be opened.
    #[error("opening the control socket {}: {source}", path.display())]
    ControlSocket {
        path: PathBuf,
        #[source]
        source: onecopy_nbd::NbdError,
    },
}

/// Result with the block crate's [`BlockError`].
pub type Result<T, E = BlockError> = std::result::Result<T, E>;

impl BlockError {
    /// The error of the engine core this error is or wraps, if any.
    pub fn core(&self) -> Option<&Error> {
        match self {
            BlockError::Core(error) | BlockError::Block { source: error, .. } => Some(error),
            _ => None,
        }
    }

    /// True when the disk (or a quota) is full: NBD clients get ENOSPC.
    pub fn is_full(&self) -> bool {
        self.core().is_some_and(onecopy_core::storage::is_full)
    }

    /// True when stored bytes failed a checksum or format check.
    pub fn is_corrupt(&self) -> bool {
        self.core().is_some_and(Error::is_corrupt)
    }

    /// A copy of this error, for each request of a batch that failed together. Errors are not
    /// `Clone` (I/O errors are not); the copy keeps the variant, the messages and an I/O
    /// error's kind and OS error code, which is what callers and NBD clients act on.
    pub fn duplicate(&self) -> BlockError {
        match self {
            BlockError::Core(error) => BlockError::Core(duplicate_core(error)),
            BlockError::Block {
                volume,
                block,
                source,
            } => BlockError::Block {
                volume: volume.clone(),
                block: *block,
                source: duplicate_core(source),
            },
            BlockError::EngineFailed { reason } => BlockError::EngineFailed {
                reason: Arc::clone(reason),
            },
            BlockError::VolumeIdNotFound(id) => BlockError::VolumeIdNotFound(*id),
            BlockError::ControlAnswer { path, source } => BlockError::ControlAnswer {
                path: path.clone(),
                source: serde::de::Error::custom(source),
            },
            BlockError::ControlSocket { path, source } => BlockError::ControlSocket {
                path: path.clone(),
                source: onecopy_nbd::NbdError::Config(source.to_string()),
            },
        }
    }
}

/// A copy of a core error (see [`BlockError::duplicate`]).
fn duplicate_core(error: &Error) -> Error {
    match error {
        Error::Io { context, source } => Error::io(context.clone(), duplicate_io(source)),
        Error::Corrupt { what, detail } => Error::corrupt(what.clone(), detail.clone()),
        Error::InvalidArgument(text) => Error::InvalidArgument(text.clone()),
        Error::NoRepository { path } => Error::NoRepository { path: path.clone() },
        Error::NotFound(text) => Error::NotFound(text.clone()),
        Error::AlreadyExists(text) => Error::AlreadyExists(text.clone()),
        Error::Limit(text) => Error::Limit(text.clone()),
        // redb's error is not clonable: the copy keeps its message.
        Error::Catalog { context, source } => Error::Catalog {
            context: match source {
                Some(source) if context.is_empty() => source.to_string(),
                Some(source) => format!("{context}: {source}"),
                None => context.clone(),
            },
            source: None,
        },
        Error::Locked { face, holder } => Error::Locked {
            face: face.clone(),
            holder: holder.clone(),
        },
        Error::WrongPassword { keys } => Error::WrongPassword { keys: keys.clone() },
    }
}

/// A copy of an I/O error with its OS error code, or its kind and message.
fn duplicate_io(error: &io::Error) -> io::Error {
    match error.raw_os_error() {
        Some(code) => io::Error::from_raw_os_error(code),
        None => io::Error::new(error.kind(), error.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a duplicated error keeps what callers act on: a full disk stays full, a corrupt
    /// block stays corrupt and names its block, a failed engine keeps its reason. Method:
    /// duplicate one of each and compare kinds and messages.
    #[test]
    fn duplicates_keep_kind_and_message() {
        let full = BlockError::from(Error::io(
            "appending",
            io::Error::from_raw_os_error(libc::ENOSPC),
        ));
        assert!(full.duplicate().is_full());
        assert_eq!(full.duplicate().to_string(), full.to_string());
        let lost = BlockError::Block {
            volume: "disk".into(),
            block: 7,
            source: Error::corrupt("block 7", "lost"),
        };
        assert!(lost.duplicate().is_corrupt());
        assert_eq!(lost.duplicate().to_string(), lost.to_string());
        let failed = BlockError::EngineFailed {
            reason: "a write failed".into(),
        };
        assert_eq!(failed.duplicate().to_string(), failed.to_string());
    }
}
