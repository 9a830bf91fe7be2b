//! onecopy-nbd: the NBD protocol (fixed newstyle handshake, simple and structured replies,
//! `base:allocation` block status) and a multi-threaded server that serves any [`Export`].
//!
//! The crate knows nothing about deduplication: the engine implements [`Export`] for its
//! volumes and an [`ExportCatalog`] that resolves export names, and this crate does the rest.
//! [`MemoryExport`] is a sparse in-memory export for tests and for measuring the protocol's
//! own cost.
//!
//! Layers, from bytes to threads:
//! - [`protocol`]: the specification's constants.
//! - [`codec`]: pure encoding and decoding of messages (fuzzable, never panics on input).
//! - [`request`]: pure validation of a request against the negotiated limits.
//! - handshake and transmission (private): the per-connection state machines.
//! - TLS ([`TlsPolicy`], [`TlsCredentials`]): `NBD_OPT_STARTTLS` with X.509 certificates,
//!   offered or required.
//! - [`serve_connection`]: one connection on any [`Transport`].
//! - [`Server`]: listening (unix sockets bound with their final permissions, see
//!   [`bind_unix_listener`]), accepting, limits, clean shutdown.
//! - [`conformance`]: a suite any [`Export`] implementation can run against itself.
//!
//! # Limits
//!
//! Every resource a client can make the server spend is bounded:
//! - payload of one read or write: the export's [`BlockSize::maximum_bytes`], at most
//!   [`protocol::PAYLOAD_BYTES_MAX`] (32 MiB); a longer write closes the connection, a longer
//!   read is refused;
//! - option data: [`HandshakeLimits::option_bytes_max`] (64 KiB) is interpreted, up to
//!   [`OPTION_DISCARD_BYTES_MAX`] (16 MiB) is skipped with `NBD_REP_ERR_TOO_BIG`, more closes
//!   the connection; at most [`HandshakeLimits::options_max`] options per handshake, and
//!   [`ServerConfig::handshake_timeout`] for the whole handshake, TLS included;
//! - per connection: [`ServerConfig::requests_in_flight_max`] requests and
//!   [`ServerConfig::in_flight_payload_bytes_max`] payload bytes between admission and reply,
//!   served by [`ServerConfig::workers_per_connection`] threads; requests queued by a client
//!   that has left are dropped, not executed; a reply that makes no progress for
//!   [`ServerConfig::idle_timeout`] ends the connection;
//! - per server: [`ServerConfig::connections_max`] connections; when all are taken, a
//!   connection idle for [`ServerConfig::idle_timeout`] gives its slot to a new client;
//! - block status: at most [`protocol::BLOCK_STATUS_EXTENTS_MAX`] extents per reply.
//!
//! # Default export
//!
//! A client asking for the empty name gets the export the catalog returns for `""` if any,
//! otherwise the only export if the catalog lists exactly one, otherwise
//! `NBD_REP_ERR_UNKNOWN`.
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use onecopy_nbd::{ExportMap, ListenAddress, MemoryExport, Server, ServerConfig};
//!
//! let directory = tempfile::tempdir().unwrap();
//! let socket = directory.path().join("nbd.sock");
//! let catalog = ExportMap::single("disk", Arc::new(MemoryExport::new(64 << 20)));
//! let server = Server::start(
//!     &ListenAddress::Unix(socket.clone()),
//!     Arc::new(catalog),
//!     ServerConfig::default(),
//! )
//! .unwrap();
//! // Clients connect to nbd+unix:///disk?socket=<socket> ...
//! let statistics = server.shutdown();
//! assert_eq!(statistics.connections_active, 0);
//! ```

pub mod codec;
mod config;
pub mod conformance;
mod connection;
mod dispatch;
mod error;
mod export;
mod handshake;
mod memory;
pub mod protocol;
pub mod request;
mod server;
mod tls;
mod transmission;
mod transport;
mod unix_socket;

pub use config::{HandshakeLimits, ServerConfig};
pub use connection::serve_connection;
pub use error::{silent_event_sink, stderr_event_sink, Event, EventSink, NbdError};
pub use export::{
    AllocationExtent, BlockSize, Export, ExportCatalog, ExportError, ExportInfo, ExportMap,
    InvalidBlockSize, WriteRequest, ZeroOptions,
};
pub use handshake::{BASE_ALLOCATION_CONTEXT_ID, OPTION_DISCARD_BYTES_MAX};
pub use memory::MemoryExport;
pub use server::{ListenAddress, Server, ServerStatistics, DEFAULT_PORT};
pub use tls::{
    TlsCredentials, TlsPolicy, CA_CERTIFICATE_FILE, SERVER_CERTIFICATE_FILE, SERVER_KEY_FILE,
};
pub use transport::Transport;
pub use unix_socket::{bind_unix_listener, SocketPermissions};
