//! The one error type of the lab.

use std::io;
use std::path::PathBuf;

/// What can go wrong while running an experiment. Each variant names what was being done, so
/// that a failed run can be repeated by hand.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// A file or directory operation failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    /// An external tool (mkfs, losetup, mount, nbdfuse) failed or could not be started.
    #[error("`{command}` failed: {detail}")]
    Command { command: String, detail: String },
    /// The engine or the NBD server reported an error.
    #[error("{context}: {detail}")]
    Engine { context: String, detail: String },
    /// A trace line did not parse.
    #[error("{path}:{line}: {detail}")]
    Trace {
        path: PathBuf,
        line: usize,
        detail: String,
    },
    /// An option is outside its accepted range.
    #[error("invalid option: {0}")]
    InvalidOption(String),
    /// Something the lab needs is missing from this machine.
    #[error("{0}")]
    Missing(String),
}

/// Result with the lab's [`LabError`].
pub type Result<T, E = LabError> = std::result::Result<T, E>;

impl LabError {
    /// Wraps an I/O error with a description of what was being done.
    pub fn io(context: impl Into<String>, source: io::Error) -> LabError {
        LabError::Io {
            context: context.into(),
            source,
        }
    }

    /// Wraps an engine (core) error with a description of what was being done.
    pub fn engine(context: impl Into<String>, error: impl std::fmt::Display) -> LabError {
        LabError::Engine {
            context: context.into(),
            detail: error.to_string(),
        }
    }
}
