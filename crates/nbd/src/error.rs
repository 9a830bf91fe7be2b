//! The crate's error type and the events the server reports while it runs.

use std::fmt;
use std::io;
use std::sync::Arc;

use crate::codec::ProtocolViolation;
use crate::export::ExportError;

/// Everything that can go wrong while setting up or running a server or a connection.
#[derive(Debug, thiserror::Error)]
pub enum NbdError {
    /// A socket or file operation failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    /// The client broke the protocol in a way that forces the connection to close.
    #[error("protocol violation: {0}")]
    Protocol(#[from] ProtocolViolation),
    /// A [`ServerConfig`](crate::ServerConfig) value is out of its documented range.
    #[error("invalid server configuration: {0}")]
    Config(String),
    /// TLS credentials could not be loaded, or a TLS handshake failed.
    #[error("TLS: {0}")]
    Tls(String),
}

impl NbdError {
    pub(crate) fn io(context: impl fmt::Display, source: io::Error) -> NbdError {
        NbdError::Io {
            context: context.to_string(),
            source,
        }
    }
}

/// Something worth logging that happened inside the server. Events are delivered to the
/// [`EventSink`] of the [`ServerConfig`](crate::ServerConfig); the default sink prints them
/// to standard error.
#[derive(Debug)]
pub enum Event<'a> {
    /// An export method failed; the client received the NBD error value shown.
    ExportFailed {
        export: &'a str,
        command: &'static str,
        offset: u64,
        length: u64,
        errno: u32,
        error: &'a ExportError,
    },
    /// An export returned block status extents that break [`Export::block_status`]'s
    /// contract; the client received `EIO`.
    ///
    /// [`Export::block_status`]: crate::Export::block_status
    ExportContractBroken {
        export: &'a str,
        reason: &'static str,
    },
    /// A connection ended because of an error (protocol violation or socket failure).
    ConnectionFailed { peer: &'a str, error: &'a NbdError },
    /// A connection was closed right after being accepted because the server already serves
    /// the maximum number of connections.
    ConnectionRefused {
        peer: &'a str,
        connections_max: usize,
    },
    /// An idle connection was closed to give its slot to a new client.
    ConnectionEvicted {
        peer: &'a str,
        idle: std::time::Duration,
        for_peer: &'a str,
    },
}

impl fmt::Display for Event<'_> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::ExportFailed {
                export,
                command,
                offset,
                length,
                errno,
                error,
            } => write!(
                formatter,
                "export {export:?}: {command} at offset {offset} length {length} failed \
                 (NBD error {errno}): {error}"
            ),
            Event::ExportContractBroken { export, reason } => {
                write!(formatter, "export {export:?} broke its contract: {reason}")
            }
            Event::ConnectionFailed { peer, error } => {
                write!(formatter, "connection from {peer}: {error}")
            }
            Event::ConnectionRefused {
                peer,
                connections_max,
            } => write!(
                formatter,
                "refused connection from {peer}: already serving {connections_max} connections"
            ),
            Event::ConnectionEvicted {
                peer,
                idle,
                for_peer,
            } => write!(
                formatter,
                "closed the connection from {peer}, idle for {} s, to serve {for_peer}: \
                 every connection slot was taken",
                idle.as_secs()
            ),
        }
    }
}

/// Receives server events; called from connection threads, so it must be cheap and must
/// not block for long.
pub type EventSink = Arc<dyn Fn(&Event<'_>) + Send + Sync>;

/// An [`EventSink`] that prints each event on standard error, prefixed with `onecopy-nbd:`.
pub fn stderr_event_sink() -> EventSink {
    Arc::new(|event: &Event<'_>| eprintln!("onecopy-nbd: {event}"))
}

/// An [`EventSink`] that drops every event.
pub fn silent_event_sink() -> EventSink {
    Arc::new(|_: &Event<'_>| {})
}
