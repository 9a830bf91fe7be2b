//! The listening server: accepts connections on a unix socket or a TCP address, serves each
//! on its own thread (see [`serve_connection`]), and shuts down cleanly on request.
//!
//! Threads: one accept thread; per connection, one thread that runs the handshake and then
//! reads requests, plus `workers_per_connection` workers during transmission. No thread is
//! started per request.
//!
//! Slots: at most `connections_max` connections are served. When all are taken, a new client
//! gets the slot of the connection that has been idle longest (no request in flight), if it
//! has been idle for at least `idle_timeout`; that connection is closed. Otherwise the new
//! client is disconnected right after accept. Idle connections are not closed while slots are
//! free: a mounted but quiet device (the kernel's NBD client sends nothing while its file
//! system is idle) keeps its connection.
//!
//! Shutdown ([`Server::shutdown`], or dropping the [`Server`]): stop accepting, shut down the
//! reading side of every connection so its reader sees end of stream, let in-flight requests
//! finish and be answered, and return once every connection thread has ended. Connections
//! still open after [`ServerConfig::shutdown_grace`] (for instance a client that stopped
//! reading replies) are shut down in both directions.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::config::ServerConfig;
use crate::connection::serve_connection_with;
use crate::error::{Event, NbdError};
use crate::export::ExportCatalog;
use crate::transport::{Activity, Transport};
use crate::unix_socket::{bind_unix_listener, SocketPermissions};

/// The IANA port for NBD.
pub const DEFAULT_PORT: u16 = 10809;

/// Where a server listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddress {
    /// A unix stream socket at this path.
    Unix(PathBuf),
    /// A TCP address; port 0 picks a free port (see [`Server::address`]).
    Tcp(SocketAddr),
}

impl ListenAddress {
    /// Loopback on the NBD port: `127.0.0.1:10809`.
    pub fn default_tcp() -> ListenAddress {
        ListenAddress::Tcp(SocketAddr::from(([127, 0, 0, 1], DEFAULT_PORT)))
    }

    /// Parses `HOST:PORT` (a host name is resolved; the first address is used).
    pub fn tcp(host_and_port: &str) -> Result<ListenAddress, NbdError> {
        let mut addresses = host_and_port
            .to_socket_addrs()
            .map_err(|error| NbdError::io(format!("resolving {host_and_port:?}"), error))?;
        addresses
            .next()
            .map(ListenAddress::Tcp)
            .ok_or_else(|| NbdError::Config(format!("{host_and_port:?} resolves to no address")))
    }
}

impl std::fmt::Display for ListenAddress {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenAddress::Unix(path) => write!(formatter, "unix:{}", path.display()),
            ListenAddress::Tcp(address) => write!(formatter, "tcp:{address}"),
        }
    }
}

/// Connection counters since the server started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerStatistics {
    /// Connections accepted and served.
    pub connections_accepted: u64,
    /// Connections closed at once because `connections_max` were being served.
    pub connections_refused: u64,
    /// Idle connections closed to give their slot to a new client.
    pub connections_evicted: u64,
    /// Connections that ended with an error (protocol violation, socket failure).
    pub connections_failed: u64,
    /// Connections being served now.
    pub connections_active: u64,
}

/// A running server. Dropping it shuts it down like [`Server::shutdown`].
pub struct Server {
    shared: Arc<Shared>,
    address: ListenAddress,
    accept_thread: Option<JoinHandle<()>>,
    wake_writer: OwnedFd,
}

struct Shared {
    catalog: Arc<dyn ExportCatalog>,
    config: ServerConfig,
    stopping: AtomicBool,
    registry: Mutex<Registry>,
    all_closed: Condvar,
    accepted: AtomicU64,
    refused: AtomicU64,
    evicted: AtomicU64,
    failed: AtomicU64,
}

/// Live connections.
#[derive(Default)]
struct Registry {
    next_id: u64,
    connections: HashMap<u64, Registered>,
}

/// A live connection: a handle that can shut its socket down, and its use.
struct Registered {
    shutdown: Box<dyn Fn(Shutdown) + Send>,
    activity: Arc<Activity>,
    peer: String,
    /// Shut down to give its slot to a new client, and closing; no longer counts against
    /// `connections_max`.
    evicted: bool,
}

impl Registry {
    /// Connections that count against `connections_max`.
    fn holding_slots(&self) -> usize {
        self.connections
            .values()
            .filter(|connection| !connection.evicted)
            .count()
    }

    /// Closes the connection idle longest, if it has been idle for at least
    /// `idle_timeout`; returns its peer and how long it was idle.
    fn evict_idle(&mut self, idle_timeout: Duration) -> Option<(String, Duration)> {
        let (idle, connection) = self
            .connections
            .values_mut()
            .filter(|connection| !connection.evicted)
            .filter_map(|connection| {
                let idle = connection.activity.idle_for()?;
                (idle >= idle_timeout).then_some((idle, connection))
            })
            .max_by_key(|(idle, _)| *idle)?;
        connection.evicted = true;
        (connection.shutdown)(Shutdown::Both);
        Some((connection.peer.clone(), idle))
    }
}

enum Listener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

impl Server {
    /// Binds `address` and starts serving `catalog`'s exports on a background thread.
    ///
    /// A unix socket path that exists is replaced only if it is a socket nobody listens on
    /// (left over from a crashed server); the socket file is removed again on shutdown.
    pub fn start(
        address: &ListenAddress,
        catalog: Arc<dyn ExportCatalog>,
        config: ServerConfig,
    ) -> Result<Server, NbdError> {
        config.validate()?;
        let (listener, address) = bind(address, &config.unix_socket)?;
        let (wake_reader, wake_writer) = pipe()?;
        let shared = Arc::new(Shared {
            catalog,
            config,
            stopping: AtomicBool::new(false),
            registry: Mutex::new(Registry::default()),
            all_closed: Condvar::new(),
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        });
        let accept_shared = Arc::clone(&shared);
        let accept_thread = thread::Builder::new()
            .name("nbd-accept".into())
            .spawn(move || accept_loop(&accept_shared, &listener, &wake_reader))
            .map_err(|error| NbdError::io("starting the accept thread", error))?;
        Ok(Server {
            shared,
            address,
            accept_thread: Some(accept_thread),
            wake_writer,
        })
    }

    /// The address actually bound (with the real port if port 0 was asked for).
    pub fn address(&self) -> &ListenAddress {
        &self.address
    }

    /// Connection counters so far.
    pub fn statistics(&self) -> ServerStatistics {
        ServerStatistics {
            connections_accepted: self.shared.accepted.load(Ordering::Relaxed),
            connections_refused: self.shared.refused.load(Ordering::Relaxed),
            connections_evicted: self.shared.evicted.load(Ordering::Relaxed),
            connections_failed: self.shared.failed.load(Ordering::Relaxed),
            connections_active: self.shared.registry.lock().connections.len() as u64,
        }
    }

    /// Stops accepting, lets in-flight requests finish, closes every connection and returns
    /// when all connection threads have ended.
    pub fn shutdown(mut self) -> ServerStatistics {
        self.stop();
        self.statistics()
    }

    fn stop(&mut self) {
        let Some(accept_thread) = self.accept_thread.take() else {
            return;
        };
        self.shared.stopping.store(true, Ordering::SeqCst);
        // A byte in the pipe wakes the accept loop's poll. If the write fails the pipe is
        // full, which wakes it just the same.
        let byte = 1u8;
        // SAFETY: writes one byte from a valid buffer to a pipe descriptor we own.
        let _ =
            unsafe { libc::write(self.wake_writer.as_raw_fd(), (&byte as *const u8).cast(), 1) };
        if accept_thread.join().is_err() {
            // The accept loop does not panic on any input; if it did, the connections below
            // are still closed and the failure is visible in the log.
            eprintln!("onecopy-nbd: the accept thread panicked");
        }

        let mut registry = self.shared.registry.lock();
        for connection in registry.connections.values() {
            (connection.shutdown)(Shutdown::Read);
        }
        let deadline = Instant::now() + self.shared.config.shutdown_grace;
        while !registry.connections.is_empty() {
            if self
                .shared
                .all_closed
                .wait_until(&mut registry, deadline)
                .timed_out()
            {
                for connection in registry.connections.values() {
                    (connection.shutdown)(Shutdown::Both);
                }
                while !registry.connections.is_empty() {
                    self.shared.all_closed.wait(&mut registry);
                }
            }
        }
        drop(registry);
        if let ListenAddress::Unix(path) = &self.address {
            // Best effort: the file may have been removed by someone else.
            let _ = fs::remove_file(path);
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

fn bind(
    address: &ListenAddress,
    permissions: &SocketPermissions,
) -> Result<(Listener, ListenAddress), NbdError> {
    match address {
        ListenAddress::Unix(path) => {
            let listener = bind_unix_listener(path, permissions)?;
            set_nonblocking(listener.set_nonblocking(true))?;
            Ok((Listener::Unix(listener), address.clone()))
        }
        ListenAddress::Tcp(socket_address) => {
            let listener = TcpListener::bind(socket_address)
                .map_err(|error| NbdError::io(format!("listening on {socket_address}"), error))?;
            set_nonblocking(listener.set_nonblocking(true))?;
            let bound = listener
                .local_addr()
                .map_err(|error| NbdError::io("reading the bound address", error))?;
            Ok((Listener::Tcp(listener), ListenAddress::Tcp(bound)))
        }
    }
}

fn set_nonblocking(result: io::Result<()>) -> Result<(), NbdError> {
    result.map_err(|error| NbdError::io("making the listener non-blocking", error))
}

fn pipe() -> Result<(OwnedFd, OwnedFd), NbdError> {
    let mut fds: [RawFd; 2] = [-1, -1];
    // SAFETY: pipe2 writes two descriptors into the array we pass.
    let result = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) };
    if result != 0 {
        return Err(NbdError::io(
            "creating the wake-up pipe",
            io::Error::last_os_error(),
        ));
    }
    // SAFETY: both descriptors were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Waits for connections (or the wake-up pipe) and hands each connection to a thread.
fn accept_loop(shared: &Arc<Shared>, listener: &Listener, wake_reader: &OwnedFd) {
    let listener_fd = match listener {
        Listener::Unix(listener) => listener.as_raw_fd(),
        Listener::Tcp(listener) => listener.as_raw_fd(),
    };
    while !shared.stopping.load(Ordering::SeqCst) {
        let mut fds = [
            libc::pollfd {
                fd: listener_fd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: wake_reader.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: polls two valid descriptors described by a live array.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if ready < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            let error = NbdError::io("waiting for connections", error);
            (shared.config.events)(&Event::ConnectionFailed {
                peer: "listener",
                error: &error,
            });
            // Avoid spinning on a persistent failure.
            thread::sleep(Duration::from_millis(100));
            continue;
        }
        if fds[1].revents != 0 {
            return;
        }
        // Drain every pending connection: the listener is non-blocking.
        loop {
            let accepted = match listener {
                Listener::Unix(listener) => {
                    listener.accept().map(|(stream, _)| Accepted::Unix(stream))
                }
                Listener::Tcp(listener) => listener
                    .accept()
                    .map(|(stream, peer)| Accepted::Tcp(stream, peer)),
            };
            match accepted {
                Ok(connection) => admit(shared, connection),
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => {
                    // Typically EMFILE or ECONNABORTED; the listener stays usable.
                    let error = NbdError::io("accepting a connection", error);
                    (shared.config.events)(&Event::ConnectionFailed {
                        peer: "listener",
                        error: &error,
                    });
                    break;
                }
            }
        }
    }
}

enum Accepted {
    Unix(UnixStream),
    Tcp(TcpStream, SocketAddr),
}

fn admit(shared: &Arc<Shared>, connection: Accepted) {
    // Linux does not pass the listener's non-blocking mode on to accepted sockets, but other
    // systems do; connections rely on blocking reads.
    match connection {
        Accepted::Unix(stream) => {
            let peer = "unix socket".to_owned();
            match stream.set_nonblocking(false) {
                Ok(()) => register(shared, stream, peer),
                Err(error) => refuse_broken(shared, &peer, error),
            }
        }
        Accepted::Tcp(stream, peer) => {
            let peer = peer.to_string();
            // The specification asks both sides to disable Nagle's algorithm.
            match stream
                .set_nonblocking(false)
                .and_then(|()| stream.set_nodelay(true))
            {
                Ok(()) => register(shared, stream, peer),
                Err(error) => refuse_broken(shared, &peer, error),
            }
        }
    }
}

fn refuse_broken(shared: &Shared, peer: &str, error: io::Error) {
    shared.failed.fetch_add(1, Ordering::Relaxed);
    let error = NbdError::io("configuring an accepted socket", error);
    (shared.config.events)(&Event::ConnectionFailed {
        peer,
        error: &error,
    });
}

fn register<T: Transport>(shared: &Arc<Shared>, stream: T, peer: String) {
    let events = &shared.config.events;
    let report = |error: NbdError| {
        shared.failed.fetch_add(1, Ordering::Relaxed);
        events(&Event::ConnectionFailed {
            peer: &peer,
            error: &error,
        });
    };
    let control = match stream.try_clone() {
        Ok(control) => control,
        Err(error) => return report(NbdError::io("duplicating the connection socket", error)),
    };
    let mut registry = shared.registry.lock();
    if registry.holding_slots() >= shared.config.connections_max {
        let evicted = shared
            .config
            .idle_timeout
            .and_then(|idle_timeout| registry.evict_idle(idle_timeout));
        match evicted {
            Some((evicted_peer, idle)) => {
                shared.evicted.fetch_add(1, Ordering::Relaxed);
                events(&Event::ConnectionEvicted {
                    peer: &evicted_peer,
                    idle,
                    for_peer: &peer,
                });
            }
            None => {
                drop(registry);
                shared.refused.fetch_add(1, Ordering::Relaxed);
                events(&Event::ConnectionRefused {
                    peer: &peer,
                    connections_max: shared.config.connections_max,
                });
                return;
            }
        }
    }
    let id = registry.next_id;
    registry.next_id += 1;
    let activity = Arc::new(Activity::new());
    registry.connections.insert(
        id,
        Registered {
            shutdown: Box::new(move |how| {
                // Best effort: the connection may be closing on its own.
                let _ = control.shutdown(how);
            }),
            activity: Arc::clone(&activity),
            peer: peer.clone(),
            evicted: false,
        },
    );
    drop(registry);

    let thread_shared = Arc::clone(shared);
    let thread_peer = peer.clone();
    let spawned = thread::Builder::new()
        .name("nbd-connection".into())
        .spawn(move || {
            // Deregisters even if serving panics, so shutdown never waits for a dead thread.
            let registration = Registration {
                shared: thread_shared,
                id,
            };
            let shared = &registration.shared;
            if shared.config.batch_scheduling {
                // Workers are started by this thread and inherit its policy.
                use_batch_scheduling();
            }
            let result =
                serve_connection_with(stream, shared.catalog.as_ref(), &shared.config, &activity);
            if let Err(error) = result {
                shared.failed.fetch_add(1, Ordering::Relaxed);
                (shared.config.events)(&Event::ConnectionFailed {
                    peer: &thread_peer,
                    error: &error,
                });
            }
        });
    match spawned {
        Ok(_) => {
            shared.accepted.fetch_add(1, Ordering::Relaxed);
        }
        Err(error) => {
            deregister(shared, id);
            report(NbdError::io("starting a connection thread", error));
        }
    }
}

/// Puts the calling thread under `SCHED_BATCH` (on Linux the policy is per thread). Best
/// effort: any thread may lower its own policy to batch, and where a sandbox forbids it the
/// connection is served under the normal policy, only with more preemption.
fn use_batch_scheduling() {
    let parameters = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 names the calling thread; the parameters outlive the call.
    let _ = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &parameters) };
}

/// A connection's entry in the registry, removed when this is dropped.
struct Registration {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        deregister(&self.shared, self.id);
    }
}

fn deregister(shared: &Shared, id: u64) {
    let mut registry = shared.registry.lock();
    registry.connections.remove(&id);
    if registry.connections.is_empty() {
        shared.all_closed.notify_all();
    }
}
