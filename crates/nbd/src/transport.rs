//! The byte stream a connection runs on ([`Transport`]) and what the server tracks of a
//! connection's use ([`Activity`]). A leaf module: the handshake, TLS, transmission and the
//! server all use these, and it uses none of them.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A connected byte stream the server can duplicate (one handle for reading, one for
/// writing) and shut down from another thread.
pub trait Transport: Read + Write + AsRawFd + Send + Sync + Sized + 'static {
    /// Another handle to the same stream.
    fn try_clone(&self) -> io::Result<Self>;
    /// Shuts down one or both directions; a thread blocked reading then sees end of stream.
    fn shutdown(&self, how: Shutdown) -> io::Result<()>;
    /// Bounds how long a read may block (`None`: forever).
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()>;
    /// Bounds how long a write may make no progress (`None`: forever).
    fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()>;
    /// Ends a session layered on the stream (TLS sends its close_notify) before the
    /// connection closes. Plain sockets have none.
    fn close_session(&self) -> io::Result<()> {
        Ok(())
    }
}

impl Transport for UnixStream {
    fn try_clone(&self) -> io::Result<Self> {
        UnixStream::try_clone(self)
    }

    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        UnixStream::shutdown(self, how)
    }

    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        UnixStream::set_read_timeout(self, timeout)
    }

    fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        UnixStream::set_write_timeout(self, timeout)
    }
}

impl Transport for TcpStream {
    fn try_clone(&self) -> io::Result<Self> {
        TcpStream::try_clone(self)
    }

    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        TcpStream::shutdown(self, how)
    }

    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        TcpStream::set_read_timeout(self, timeout)
    }

    fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        TcpStream::set_write_timeout(self, timeout)
    }
}

/// True when the peer has closed the connection in both directions (or it was reset), as
/// opposed to only ending what it sends (a half-close, after which it may still read
/// replies). Asks the kernel without blocking.
pub(crate) fn peer_hung_up(descriptor: RawFd) -> bool {
    let mut poll = libc::pollfd {
        fd: descriptor,
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: polls one valid descriptor described by a live struct, without waiting.
    let ready = unsafe { libc::poll(&mut poll, 1, 0) };
    ready > 0 && poll.revents & (libc::POLLHUP | libc::POLLERR) != 0
}

/// What the server knows of a connection's use, for choosing which idle connection gives
/// its slot to a new client. The count of requests in flight is the connection's admission
/// count itself (see `crate::dispatch`); the clock is read only when it changes between zero
/// and nonzero.
#[derive(Debug)]
pub(crate) struct Activity {
    epoch: Instant,
    requests_in_flight: AtomicUsize,
    /// Milliseconds after `epoch` of the last change of `requests_in_flight` between zero and
    /// nonzero, or [`Activity::HANDSHAKE`] before the transmission phase.
    changed_ms: AtomicU64,
}

impl Activity {
    const HANDSHAKE: u64 = u64::MAX;

    /// A connection in its handshake (never idle).
    pub(crate) fn new() -> Activity {
        Activity {
            epoch: Instant::now(),
            requests_in_flight: AtomicUsize::new(0),
            changed_ms: AtomicU64::new(Activity::HANDSHAKE),
        }
    }

    fn touch(&self) {
        let now = self.epoch.elapsed().as_millis() as u64;
        self.changed_ms.store(now, Ordering::SeqCst);
    }

    /// The transmission phase starts, with no request in flight.
    pub(crate) fn transmission_started(&self) {
        self.touch();
    }

    /// Requests admitted and not yet answered.
    pub(crate) fn requests_in_flight(&self) -> usize {
        self.requests_in_flight.load(Ordering::SeqCst)
    }

    /// One more request is in flight.
    pub(crate) fn request_started(&self) {
        if self.requests_in_flight.fetch_add(1, Ordering::SeqCst) == 0 {
            self.touch();
        }
    }

    /// One request was answered (or dropped); returns the count before.
    pub(crate) fn request_ended(&self) -> usize {
        let previous = self.requests_in_flight.fetch_sub(1, Ordering::SeqCst);
        if previous == 1 {
            self.touch();
        }
        previous
    }

    /// How long the connection has had no request in flight; `None` while it has some, or
    /// is in its handshake.
    pub(crate) fn idle_for(&self) -> Option<Duration> {
        let changed = self.changed_ms.load(Ordering::SeqCst);
        if changed == Activity::HANDSHAKE || self.requests_in_flight() > 0 {
            return None;
        }
        let now = self.epoch.elapsed().as_millis() as u64;
        Some(Duration::from_millis(now.saturating_sub(changed)))
    }
}
