//! One client connection from greeting to close: the handshake, then the transmission phase.
//! [`serve_connection`] works on any [`Transport`], so a connection can be served over a
//! socket the caller accepted itself (or a socket pair in tests and fuzzing).

use std::time::Instant;

use crate::config::ServerConfig;
use crate::error::NbdError;
use crate::export::ExportCatalog;
use crate::handshake::{self, Outcome};
use crate::tls::Channel;
use crate::transmission;
use crate::transport::{Activity, Transport};

/// Serves one client on `stream` until it disconnects: runs the handshake (bounded as a
/// whole by `config.handshake_timeout`, and by `config.handshake`), upgrading to TLS when
/// the client asks and `config.tls` allows, then the transmission phase with `config`'s
/// workers and in-flight limits.
///
/// Returns `Ok` when the client ends the session properly (`OPT_ABORT`, `CMD_DISC`, or
/// closing between messages) and an error for protocol violations and socket failures. Never
/// panics on client input.
pub fn serve_connection<T: Transport>(
    stream: T,
    catalog: &dyn ExportCatalog,
    config: &ServerConfig,
) -> Result<(), NbdError> {
    serve_connection_with(stream, catalog, config, &Activity::new())
}

/// [`serve_connection`], reporting the connection's use to `activity`.
pub(crate) fn serve_connection_with<T: Transport>(
    stream: T,
    catalog: &dyn ExportCatalog,
    config: &ServerConfig,
    activity: &Activity,
) -> Result<(), NbdError> {
    config.validate()?;
    let deadline = Instant::now() + config.handshake_timeout;
    stream
        .set_write_timeout(Some(config.handshake_timeout))
        .map_err(|error| NbdError::io("setting the handshake timeout", error))?;
    let mut channel = Channel::Plain(stream);
    let session = match handshake::negotiate(&mut channel, catalog, config, deadline)? {
        Outcome::Ended => return Ok(()),
        Outcome::Transmission(session) => session,
    };
    // Clients may stay idle between requests for as long as they like (an idle connection
    // only gives up its slot when the server is full, see `ServerConfig::idle_timeout`); a
    // reply the client does not take for that long ends the connection.
    channel.set_read_deadline(None);
    channel
        .set_read_timeout(None)
        .and_then(|()| channel.set_write_timeout(config.idle_timeout))
        .map_err(|error| NbdError::io("setting the transmission timeouts", error))?;
    activity.transmission_started();
    transmission::transmit(channel, &session, config, activity)
}
