//! The remote backend's error type.

use thiserror::Error;

/// An error of the remote backend. Every variant names the repository URL or the object.
#[derive(Debug, Error)]
pub enum RemoteError {
    /// The URL given with `--repo` is not an object-storage URL onecopy understands.
    #[error("repository URL {url:?}: {detail}")]
    Url { url: String, detail: String },

    /// A request failed after its retries.
    #[error("{action} {object} on {url}: {source}")]
    Request {
        action: &'static str,
        object: String,
        url: String,
        #[source]
        source: Box<object_store::Error>,
    },

    /// An object that must exist does not.
    #[error("{what} does not exist on {url}")]
    Missing { what: String, url: String },

    /// Another client holds the repository's lock longer than the command waits.
    #[error(
        "the repository {url} is locked by {holder}; the lock lapses {lapses_in} s after its \
         holder stops renewing it (give --wait to wait longer)"
    )]
    Locked {
        url: String,
        holder: String,
        lapses_in: u64,
    },

    /// The commit point was taken by another client, or the lease lapsed before the commit.
    #[error("nothing was committed to {url}: {detail}")]
    CommitRefused { url: String, detail: String },

    /// The local cache (a directory on this machine) failed.
    #[error(transparent)]
    Core(#[from] onecopy_core::Error),
}

/// Results of the remote backend.
pub type Result<T, E = RemoteError> = std::result::Result<T, E>;

impl From<RemoteError> for onecopy_core::Error {
    /// Errors crossing the [`onecopy_core::storage::Storage`] boundary: a missing object is
    /// [`onecopy_core::Error::NotFound`], everything else an I/O error that keeps the message.
    fn from(error: RemoteError) -> onecopy_core::Error {
        match error {
            RemoteError::Core(inner) => inner,
            RemoteError::Missing { what, url } => {
                onecopy_core::Error::NotFound(format!("{what} on {url}"))
            }
            other => onecopy_core::Error::io(
                other.to_string(),
                std::io::Error::other("object storage request failed"),
            ),
        }
    }
}
