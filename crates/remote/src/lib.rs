//! onecopy on S3-compatible object storage.
//!
//! A repository URL `s3:http://HOST:PORT/BUCKET/PREFIX` names a repository whose every file
//! that matters lives in the object store, so that a new client given only the URL and the
//! password lists and restores everything:
//!
//! ```text
//! PREFIX/config.json                  the repository's configuration (as in a directory)
//! PREFIX/keys/<id>                    the master key wrapped per password
//! PREFIX/backup/containers/xx/<id>    the backup store's containers, sealed, written once
//! PREFIX/backup/catalog/<generation>  the sealed catalog: snapshots and deltas (module catalog)
//! PREFIX/locks/<random>               lease locks of the clients at work
//! ```
//!
//! A client works through a local cache (module [`session`]): the newest catalog generation is
//! the catalog a command opens, and the command's one commit point is the create-only PUT of
//! the next generation, a delta of what the command changed or a snapshot ([`catalog`]). docs/DESIGN.md, "Object storage", states the protocol and what a client
//! killed at each step leaves behind.

pub mod catalog;
pub mod client;
mod error;
pub mod lease;
pub mod session;
mod storage;
pub mod url;

pub use client::{ObjectClient, RequestCount};
pub use error::{RemoteError, Result};
pub use lease::LockKind;
pub use session::{Commit, RemoteRepository, Removal, Session};
pub use storage::RemoteStorage;
pub use url::ObjectUrl;
