//! One client connection from greeting to close: the handshake, then the transmission phase.
//! [`serve_connection`] works on any [`Transport`], so a connection can be served over a
//! socket the caller accepted itself (or a socket pair in tests and fuzzing).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use crate::error::NbdError;
use crate::export::ExportCatalog;
use crate::handshake::{self, Outcome};
use crate::server::ServerConfig;
use crate::transmission;

/// A connected byte stream the server can duplicate (one handle for reading, one for
/// writing) and shut down from another thread.
pub trait Transport: Read + Write + Send + Sync + Sized + 'static {
    /// Another handle to the same stream.
    fn try_clone(&self) -> std::io::Result<Self>;
    /// Shuts down one or both directions; a thread blocked reading then sees end of stream.
    fn shutdown(&self, how: Shutdown) -> std::io::Result<()>;
    /// Bounds how long a read may block (`None`: forever).
    fn set_read_timeout(&self, timeout: Option<Duration>) -> std::io::Result<()>;
}

impl Transport for UnixStream {
    fn try_clone(&self) -> std::io::Result<Self> {
        UnixStream::try_clone(self)
    }

    fn shutdown(&self, how: Shutdown) -> std::io::Result<()> {
        UnixStream::shutdown(self, how)
    }

    fn set_read_timeout(&self, timeout: Option<Duration>) -> std::io::Result<()> {
        UnixStream::set_read_timeout(self, timeout)
    }
}

impl Transport for TcpStream {
    fn try_clone(&self) -> std::io::Result<Self> {
        TcpStream::try_clone(self)
    }

    fn shutdown(&self, how: Shutdown) -> std::io::Result<()> {
        TcpStream::shutdown(self, how)
    }

    fn set_read_timeout(&self, timeout: Option<Duration>) -> std::io::Result<()> {
        TcpStream::set_read_timeout(self, timeout)
    }
}

/// Serves one client on `stream` until it disconnects: runs the handshake (bounded by
/// `config.handshake_timeout` per read and `config.handshake`), then the transmission phase
/// with `config`'s workers and in-flight limits.
///
/// Returns `Ok` when the client ends the session properly (`OPT_ABORT`, `CMD_DISC`, or
/// closing between messages) and an error for protocol violations and socket failures. Never
/// panics on client input.
pub fn serve_connection<T: Transport>(
    mut stream: T,
    catalog: &dyn ExportCatalog,
    config: &ServerConfig,
) -> Result<(), NbdError> {
    config.validate()?;
    stream
        .set_read_timeout(Some(config.handshake_timeout))
        .map_err(|error| NbdError::io("setting the handshake timeout", error))?;
    let session = match handshake::negotiate(&mut stream, catalog, &config.handshake)? {
        Outcome::Ended => return Ok(()),
        Outcome::Transmission(session) => session,
    };
    // Clients may stay idle between requests for as long as they like.
    stream
        .set_read_timeout(None)
        .map_err(|error| NbdError::io("clearing the handshake timeout", error))?;
    transmission::transmit(stream, &session, config)
}
