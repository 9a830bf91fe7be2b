//! TLS for NBD connections: credentials, the policy a server applies, and the encrypted
//! stream a connection switches to after `NBD_OPT_STARTTLS`.
//!
//! Terms (the specification's "TLS support" section):
//! - *NOTLS*: the server has no credentials; `STARTTLS` is answered `NBD_REP_ERR_UNSUP`.
//! - *SELECTIVETLS* with no TLS-only export ([`TlsPolicy::Offered`]): a client may upgrade
//!   with `STARTTLS` at any point of the handshake, and plain clients are served too.
//! - *FORCEDTLS* ([`TlsPolicy::Required`]): until the client upgrades, every option but
//!   `STARTTLS` and `ABORT` is answered `NBD_REP_ERR_TLS_REQD`, and `OPT_EXPORT_NAME` (which
//!   cannot be answered with an error) ends the connection.
//!
//! Credentials follow the convention of qemu-nbd (`--object tls-creds-x509,dir=DIR`) and
//! nbdkit (`--tls-certificates DIR`): a directory holding `server-cert.pem` (the server's
//! certificate chain, leaf first), `server-key.pem` (its private key) and, to verify client
//! certificates, `ca-cert.pem`.
//!
//! How the stream works: one rustls connection is shared by every handle of a connection
//! (the reader and the workers that send replies). The reader reads ciphertext from the
//! socket without holding any lock, then decrypts under the connection lock; a sender
//! encrypts under the connection lock and writes the records to the socket under a separate
//! send lock, taken first, so records leave in the order they were made and a client that
//! stops reading blocks only the senders, never the reader. TLS 1.2 and 1.3 are offered
//! (the specification requires 1.2); session tickets are not sent, so every connection runs
//! a full handshake.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::NbdError;
use crate::transport::Transport;

/// File of the server's certificate chain in a credentials directory.
pub const SERVER_CERTIFICATE_FILE: &str = "server-cert.pem";
/// File of the server's private key in a credentials directory.
pub const SERVER_KEY_FILE: &str = "server-key.pem";
/// File of the certificate authority that signs client certificates.
pub const CA_CERTIFICATE_FILE: &str = "ca-cert.pem";

/// Ciphertext read from the socket at once: one maximal TLS record and its overhead.
const RECEIVE_BYTES: usize = 16 * 1024 + 2048;

/// A server certificate, its key, and optionally the authority whose client certificates
/// are accepted, ready to serve TLS connections.
#[derive(Clone)]
pub struct TlsCredentials {
    config: Arc<rustls::ServerConfig>,
    directory: PathBuf,
    verifies_clients: bool,
}

impl std::fmt::Debug for TlsCredentials {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("TlsCredentials")
            .field("directory", &self.directory)
            .field("verifies_clients", &self.verifies_clients)
            .finish()
    }
}

impl TlsCredentials {
    /// Loads `server-cert.pem` and `server-key.pem` from `directory`. With
    /// `verify_clients`, clients must present a certificate signed by the authority in
    /// `ca-cert.pem` of the same directory; otherwise no client certificate is asked for.
    pub fn from_directory(
        directory: &Path,
        verify_clients: bool,
    ) -> Result<TlsCredentials, NbdError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certificate_path = directory.join(SERVER_CERTIFICATE_FILE);
        let key_path = directory.join(SERVER_KEY_FILE);
        let certificates = CertificateDer::pem_file_iter(&certificate_path)
            .and_then(|certificates| certificates.collect::<Result<Vec<_>, _>>())
            .map_err(|error| pem_error(&certificate_path, error))?;
        if certificates.is_empty() {
            return Err(NbdError::Tls(format!(
                "{} holds no certificate",
                certificate_path.display()
            )));
        }
        let key =
            PrivateKeyDer::from_pem_file(&key_path).map_err(|error| pem_error(&key_path, error))?;
        let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|error| NbdError::Tls(format!("choosing TLS versions: {error}")))?;
        let builder = if verify_clients {
            let authority_path = directory.join(CA_CERTIFICATE_FILE);
            let mut roots = rustls::RootCertStore::empty();
            let authorities = CertificateDer::pem_file_iter(&authority_path)
                .and_then(|certificates| certificates.collect::<Result<Vec<_>, _>>())
                .map_err(|error| pem_error(&authority_path, error))?;
            for authority in authorities {
                roots.add(authority).map_err(|error| {
                    NbdError::Tls(format!("{}: {error}", authority_path.display()))
                })?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .map_err(|error| {
                NbdError::Tls(format!(
                    "verifying clients with {}: {error}",
                    authority_path.display()
                ))
            })?;
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let mut config = builder
            .with_single_cert(certificates, key)
            .map_err(|error| {
                NbdError::Tls(format!(
                    "{} and {} do not form a usable certificate and key: {error}",
                    certificate_path.display(),
                    key_path.display()
                ))
            })?;
        config.send_tls13_tickets = 0;
        Ok(TlsCredentials {
            config: Arc::new(config),
            directory: directory.to_path_buf(),
            verifies_clients: verify_clients,
        })
    }

    /// The directory the credentials were loaded from.
    pub fn directory(&self) -> &Path {
        &self.directory
    }

    /// True when clients must present a certificate signed by `ca-cert.pem`.
    pub fn verifies_clients(&self) -> bool {
        self.verifies_clients
    }
}

fn pem_error(path: &Path, error: rustls::pki_types::pem::Error) -> NbdError {
    NbdError::Tls(format!("reading {}: {error}", path.display()))
}

/// Whether a server offers or requires TLS; see the module documentation.
#[derive(Clone, Debug, Default)]
pub enum TlsPolicy {
    /// No TLS: `STARTTLS` is refused as unsupported.
    #[default]
    Off,
    /// Clients may upgrade with `STARTTLS`; plain clients are served as well.
    Offered(TlsCredentials),
    /// Clients must upgrade with `STARTTLS` before anything else.
    Required(TlsCredentials),
}

impl TlsPolicy {
    /// The credentials, unless TLS is off.
    pub fn credentials(&self) -> Option<&TlsCredentials> {
        match self {
            TlsPolicy::Off => None,
            TlsPolicy::Offered(credentials) | TlsPolicy::Required(credentials) => Some(credentials),
        }
    }

    /// True when plain clients are refused.
    pub fn is_required(&self) -> bool {
        matches!(self, TlsPolicy::Required(_))
    }
}

/// A connection's stream: plain until the client upgrades with `STARTTLS`.
pub(crate) enum Channel<T: Transport> {
    Plain(T),
    Tls(TlsStream<T>),
}

impl<T: Transport> Channel<T> {
    /// Bounds every read of this handle, however many socket reads it takes, by `deadline`
    /// (`None`: no bound beyond the socket's timeout). Other handles are not affected.
    pub(crate) fn set_read_deadline(&mut self, deadline: Option<Instant>) {
        if let Channel::Tls(stream) = self {
            stream.read_deadline = deadline;
        }
    }

    /// Runs the server side of a TLS handshake on the plain stream, which must not hold
    /// unread plaintext (the handshake reads the socket directly), and switches to TLS.
    /// Fails (the connection must then end) if the handshake fails or outlasts `deadline`.
    pub(crate) fn start_tls(
        &mut self,
        credentials: &TlsCredentials,
        deadline: Instant,
    ) -> Result<(), NbdError> {
        let Channel::Plain(socket) = self else {
            panic!("TLS is started once, on a plain stream");
        };
        let socket = socket
            .try_clone()
            .map_err(|error| NbdError::io("duplicating the connection socket", error))?;
        let stream = TlsStream::accept(socket, credentials, deadline)?;
        *self = Channel::Tls(stream);
        Ok(())
    }
}

impl<T: Transport> Read for Channel<T> {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        match self {
            Channel::Plain(stream) => stream.read(buffer),
            Channel::Tls(stream) => stream.read(buffer),
        }
    }
}

impl<T: Transport> Write for Channel<T> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        match self {
            Channel::Plain(stream) => stream.write(data),
            Channel::Tls(stream) => stream.write(data),
        }
    }

    fn write_vectored(&mut self, parts: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Channel::Plain(stream) => stream.write_vectored(parts),
            Channel::Tls(stream) => stream.write_vectored(parts),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Channel::Plain(stream) => stream.flush(),
            Channel::Tls(stream) => stream.flush(),
        }
    }
}

impl<T: Transport> AsRawFd for Channel<T> {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Channel::Plain(stream) => stream.as_raw_fd(),
            Channel::Tls(stream) => stream.socket.as_raw_fd(),
        }
    }
}

impl<T: Transport> Transport for Channel<T> {
    fn try_clone(&self) -> io::Result<Self> {
        Ok(match self {
            Channel::Plain(stream) => Channel::Plain(stream.try_clone()?),
            Channel::Tls(stream) => Channel::Tls(stream.try_clone()?),
        })
    }

    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Channel::Plain(stream) => stream.shutdown(how),
            Channel::Tls(stream) => stream.socket.shutdown(how),
        }
    }

    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Channel::Plain(stream) => stream.set_read_timeout(timeout),
            Channel::Tls(stream) => stream.socket.set_read_timeout(timeout),
        }
    }

    fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Channel::Plain(stream) => stream.set_write_timeout(timeout),
            Channel::Tls(stream) => stream.socket.set_write_timeout(timeout),
        }
    }

    fn close_session(&self) -> io::Result<()> {
        match self {
            Channel::Plain(stream) => stream.close_session(),
            Channel::Tls(stream) => stream.close_session(),
        }
    }
}

/// One handle on a TLS connection; see the module documentation for the locking.
pub(crate) struct TlsStream<T: Transport> {
    shared: Arc<TlsShared<T>>,
    /// This handle's socket, for reading (only one handle reads) and for timeouts and
    /// shutdown.
    socket: T,
    /// When set, every socket read must end by then (the handshake's deadline): one
    /// plaintext read may need many socket reads, which a client could otherwise spread out.
    read_deadline: Option<Instant>,
}

struct TlsShared<T: Transport> {
    connection: Mutex<rustls::ServerConnection>,
    /// The socket handle that sends; its lock orders the records on the wire. Taken before
    /// `connection` when both are needed.
    send: Mutex<T>,
    /// Ciphertext received and not yet handed to rustls, and where it starts. Only the
    /// reading handle uses it; it is shared so that bytes received during the handshake
    /// (a client may send its first requests right behind `OPT_GO`) reach the reader's
    /// handle in the transmission phase.
    received: Mutex<(Vec<u8>, usize)>,
}

fn tls_error(error: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, error)
}

impl<T: Transport> TlsStream<T> {
    /// Runs the handshake on `socket` until it completes, fails or passes `deadline`.
    fn accept(
        socket: T,
        credentials: &TlsCredentials,
        deadline: Instant,
    ) -> Result<Self, NbdError> {
        let connection = rustls::ServerConnection::new(Arc::clone(&credentials.config))
            .map_err(|error| NbdError::Tls(format!("starting a TLS session: {error}")))?;
        let send = socket
            .try_clone()
            .map_err(|error| NbdError::io("duplicating the connection socket", error))?;
        let mut stream = TlsStream {
            shared: Arc::new(TlsShared {
                connection: Mutex::new(connection),
                send: Mutex::new(send),
                received: Mutex::new((Vec::with_capacity(RECEIVE_BYTES), 0)),
            }),
            socket,
            read_deadline: Some(deadline),
        };
        let handshake = |stream: &mut TlsStream<T>| -> io::Result<()> {
            loop {
                stream.send_pending()?;
                if !stream.shared.connection.lock().is_handshaking() {
                    return Ok(());
                }
                if !stream.receive()? {
                    return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
                }
            }
        };
        match handshake(&mut stream) {
            Ok(()) => Ok(stream),
            Err(error) => {
                // Tell the client why, if rustls has an alert for it; best effort.
                let _ = stream.send_pending();
                Err(NbdError::Tls(format!("TLS handshake failed: {error}")))
            }
        }
    }

    /// A handle on the same connection, without a read deadline.
    fn try_clone(&self) -> io::Result<Self> {
        Ok(TlsStream {
            shared: Arc::clone(&self.shared),
            socket: self.socket.try_clone()?,
            read_deadline: None,
        })
    }

    /// Sends every record rustls has ready (handshake messages, alerts, data).
    fn send_pending(&self) -> io::Result<()> {
        let mut socket = self.shared.send.lock();
        let mut records = Vec::new();
        {
            let mut connection = self.shared.connection.lock();
            while connection.wants_write() {
                connection.write_tls(&mut records)?;
            }
        }
        socket.write_all(&records)?;
        socket.flush()
    }

    /// Hands received ciphertext to rustls, reading the socket first if none is left.
    /// Returns false at the end of the socket's stream.
    fn receive(&mut self) -> io::Result<bool> {
        let mut received = self.shared.received.lock();
        let (buffer, start) = &mut *received;
        let mut end_of_stream = false;
        if *start == buffer.len() {
            if let Some(deadline) = self.read_deadline {
                let remaining = deadline.saturating_duration_since(Instant::now());
                if remaining.is_zero() {
                    return Err(io::Error::from(io::ErrorKind::TimedOut));
                }
                self.socket.set_read_timeout(Some(remaining))?;
            }
            buffer.resize(RECEIVE_BYTES, 0);
            let count = match self.socket.read(buffer) {
                Ok(count) => count,
                Err(error) => {
                    buffer.clear();
                    *start = 0;
                    return Err(error);
                }
            };
            buffer.truncate(count);
            *start = 0;
            end_of_stream = count == 0;
        }
        let mut connection = self.shared.connection.lock();
        let mut unread = &buffer[*start..];
        let consumed = connection.read_tls(&mut unread)?;
        *start += consumed;
        let processed = connection.process_new_packets();
        let wants_write = connection.wants_write();
        drop(connection);
        drop(received);
        if wants_write {
            self.send_pending()?;
        }
        processed.map_err(tls_error)?;
        Ok(!end_of_stream)
    }

    fn close_session(&self) -> io::Result<()> {
        self.shared.connection.lock().send_close_notify();
        self.send_pending()
    }
}

impl<T: Transport> Read for TlsStream<T> {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        if buffer.is_empty() {
            return Ok(0);
        }
        loop {
            // Ok(0) is a close_notify; an end of stream without one is UnexpectedEof.
            match self.shared.connection.lock().reader().read(buffer) {
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                result => return result,
            }
            self.receive()?;
        }
    }
}

impl<T: Transport> Write for TlsStream<T> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let mut socket = self.shared.send.lock();
        let mut records = Vec::new();
        let written = {
            let mut connection = self.shared.connection.lock();
            let written = connection.writer().write(data)?;
            while connection.wants_write() {
                connection.write_tls(&mut records)?;
            }
            written
        };
        socket.write_all(&records)?;
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        // Records go to the socket as they are made; the socket itself has no buffer.
        self.shared.send.lock().flush()
    }
}
