//! The server's tuning and limits ([`ServerConfig`], [`HandshakeLimits`]). A leaf module: the
//! connection, handshake, transmission and server read it, and it reads none of them.

use std::time::Duration;

use crate::error::{stderr_event_sink, EventSink, NbdError};
use crate::protocol;
use crate::tls::TlsPolicy;
use crate::unix_socket::SocketPermissions;

/// Tuning and limits of a server. Every limit applies per connection unless its name says
/// otherwise; [`ServerConfig::validate`] gives the accepted ranges.
#[derive(Clone)]
pub struct ServerConfig {
    /// Worker threads executing requests of one connection (1 ..= 256). Each extra worker
    /// costs thread wake-ups; on a two-core machine two workers served the memory export with
    /// the least CPU per request. Exports whose calls block on slow storage may want more.
    pub workers_per_connection: usize,
    /// Requests admitted but not yet answered (1 ..= 65536); beyond it the server stops
    /// reading from the client.
    pub requests_in_flight_max: usize,
    /// Payload bytes (write data received plus read data to send) of admitted requests;
    /// at least [`protocol::PAYLOAD_BYTES_MAX`] so that any valid request fits.
    pub in_flight_payload_bytes_max: usize,
    /// Connections served at once, server-wide (at least 1); further clients take the slot
    /// of an idle connection (see `idle_timeout`) or are disconnected right after accept.
    pub connections_max: usize,
    /// Longest time the whole handshake may take, TLS included; a slower client is dropped.
    pub handshake_timeout: Duration,
    /// A connection with no request in flight for at least this long gives its slot to a
    /// new client when all `connections_max` slots are taken; and a reply the client does not
    /// take for this long ends its connection. `None`: connections keep their slots and
    /// replies wait for as long as the client does.
    pub idle_timeout: Option<Duration>,
    /// Whether clients may or must upgrade to TLS.
    pub tls: TlsPolicy,
    /// Who may connect to a unix socket the server binds.
    pub unix_socket: SocketPermissions,
    /// Bounds on options during the handshake.
    pub handshake: HandshakeLimits,
    /// How long [`Server::shutdown`](crate::Server::shutdown) waits for connections to finish before forcing them
    /// closed.
    pub shutdown_grace: Duration,
    /// Run connection threads (the reader and its workers) under `SCHED_BATCH`. A reader
    /// wakes a worker for every request; under the normal policy each wake-up preempts the
    /// thread that is running, so with more runnable threads than cores (a client, a reader,
    /// workers) requests are served in slices cut by switches. Batch threads still get their
    /// fair share of CPU but do not preempt on wake-up; see docs/DESIGN.md for the measurement.
    pub batch_scheduling: bool,
    /// Where events (export failures, connection errors) are reported.
    pub events: EventSink,
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            workers_per_connection: 2,
            requests_in_flight_max: 128,
            in_flight_payload_bytes_max: 2 * protocol::PAYLOAD_BYTES_MAX as usize,
            connections_max: 64,
            handshake_timeout: Duration::from_secs(30),
            idle_timeout: Some(Duration::from_secs(300)),
            tls: TlsPolicy::Off,
            unix_socket: SocketPermissions::default(),
            handshake: HandshakeLimits::default(),
            shutdown_grace: Duration::from_secs(10),
            batch_scheduling: true,
            events: stderr_event_sink(),
        }
    }
}

impl ServerConfig {
    /// Checks every value against its documented range.
    pub fn validate(&self) -> Result<(), NbdError> {
        let check = |ok: bool, what: &str| {
            if ok {
                Ok(())
            } else {
                Err(NbdError::Config(what.to_owned()))
            }
        };
        check(
            (1..=256).contains(&self.workers_per_connection),
            "workers_per_connection must be between 1 and 256",
        )?;
        check(
            (1..=65536).contains(&self.requests_in_flight_max),
            "requests_in_flight_max must be between 1 and 65536",
        )?;
        check(
            self.in_flight_payload_bytes_max >= protocol::PAYLOAD_BYTES_MAX as usize,
            "in_flight_payload_bytes_max must be at least 32 MiB",
        )?;
        check(
            self.connections_max >= 1,
            "connections_max must be at least 1",
        )?;
        check(
            !self.handshake_timeout.is_zero(),
            "handshake_timeout must be positive",
        )?;
        check(
            self.idle_timeout.is_none_or(|timeout| !timeout.is_zero()),
            "idle_timeout must be positive (or None for no timeout)",
        )?;
        check(
            self.unix_socket.mode <= 0o777,
            "unix_socket.mode must be at most 0o777",
        )?;
        check(
            self.handshake.options_max >= 1,
            "handshake.options_max must be at least 1",
        )?;
        check(
            self.handshake.option_bytes_max as usize >= protocol::STRING_BYTES_MAX + 8,
            "handshake.option_bytes_max must hold a maximal export name",
        )
    }
}

/// Bounds on what a client may send during the handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandshakeLimits {
    /// Options a client may send before it must enter transmission.
    pub options_max: usize,
    /// Largest option data the server reads and interprets.
    pub option_bytes_max: u32,
}

impl Default for HandshakeLimits {
    fn default() -> HandshakeLimits {
        HandshakeLimits {
            options_max: 256,
            option_bytes_max: 64 << 10,
        }
    }
}
