//! [`FsError`]: the one error type of the file system face.

use std::io;

/// Result with [`FsError`].
pub type Result<T, E = FsError> = std::result::Result<T, E>;

/// What went wrong in the file system face. POSIX failures of a request (a missing name, a
/// directory that is not empty) carry the errno the kernel passes on to the program; every
/// other failure says which object and what the user can do.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// The engine (containers, chunk store, page store, journal) failed.
    #[error(transparent)]
    Core(#[from] onecopy_core::Error),
    /// A request the file system refuses with this errno (ENOENT, EEXIST, ENOTEMPTY, ...).
    #[error("{context}: {}", io::Error::from_raw_os_error(*errno))]
    Posix { errno: i32, context: String },
    /// No file system of this name exists.
    #[error("file system {name:?} not found; `onecopy fs list` shows the ones that exist")]
    NoFileSystem { name: String },
    /// A bad option or argument.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// An I/O error outside the engine (the control socket, the mount point).
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    /// The mounting process refused a command sent through its control socket; its message.
    #[error("{0}")]
    Remote(String),
    /// Bytes of a file that a repair recorded as lost (EIO): which, and what to do.
    #[error(
        "{0} were lost to damage (a repair recorded them lost; `onecopy check` lists them); \
         they read again once written, punched or truncated away"
    )]
    Lost(String),
    /// The engine stopped after a failure half way through a change; reopening recovers.
    #[error("the file system face stopped after an earlier failure ({0}); unmount and mount it again to recover")]
    Failed(String),
}

impl FsError {
    /// A POSIX refusal with its context.
    pub fn posix(errno: i32, context: impl Into<String>) -> FsError {
        FsError::Posix {
            errno,
            context: context.into(),
        }
    }

    /// Wraps an I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: io::Error) -> FsError {
        FsError::Io {
            context: context.into(),
            source,
        }
    }

    /// The errno a FUSE reply carries for this error: the POSIX one, ENOSPC for a full disk,
    /// EIO for everything else (the message goes to the log).
    pub fn errno(&self) -> i32 {
        match self {
            FsError::Posix { errno, .. } => *errno,
            FsError::Core(onecopy_core::Error::Io { source, .. }) | FsError::Io { source, .. }
                if source.raw_os_error() == Some(libc::ENOSPC) =>
            {
                libc::ENOSPC
            }
            FsError::InvalidArgument(_) => libc::EINVAL,
            _ => libc::EIO,
        }
    }
}
