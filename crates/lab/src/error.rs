//! The one error type of the lab.
//!
//! I/O results get their context with [`onecopy_core::error::IoContext`], the workspace's one
//! wrapper: `fs::read(&path).context_io(|| format!("reading {}", path.display()))?`.

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

    /// Wraps an engine (core, block, backup, NBD) error with a description of what was being
    /// done.
    pub fn engine(context: impl Into<String>, error: impl std::fmt::Display) -> LabError {
        LabError::Engine {
            context: context.into(),
            detail: error.to_string(),
        }
    }
}

/// An I/O error wrapped by [`onecopy_core::error::IoContext`] stays an I/O error with its
/// context and source; other core errors are engine errors.
impl From<onecopy_core::Error> for LabError {
    fn from(error: onecopy_core::Error) -> LabError {
        match error {
            onecopy_core::Error::Io { context, source } => LabError::Io { context, source },
            other => LabError::engine("the engine", other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use onecopy_core::error::IoContext;

    /// Goal: an I/O error wrapped with the core's `context_io` reaches the lab's callers as a
    /// lab I/O error with its context and source. Method: read a missing file through `?`.
    #[test]
    fn io_context_becomes_a_lab_io_error() {
        fn read_missing() -> Result<Vec<u8>> {
            let path = "/nonexistent/onecopy-lab-test";
            Ok(std::fs::read(path).context_io(|| format!("reading {path}"))?)
        }
        let error = read_missing().unwrap_err();
        let LabError::Io { context, source } = &error else {
            panic!("not an I/O error: {error:?}");
        };
        assert_eq!(context, "reading /nonexistent/onecopy-lab-test");
        assert_eq!(source.kind(), io::ErrorKind::NotFound);
    }
}
