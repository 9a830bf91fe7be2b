//! The control socket of a running block device: how other onecopy processes read the live
//! state of a device that `onecopy serve` holds open (as `vdostats` and `dmsetup status` do
//! for their devices), while the face lock keeps them from opening it themselves.
//!
//! Protocol: a client connects to [`CONTROL_SOCKET_FILE`] in the block face's directory,
//! sends one [`ControlRequest`] as a line of JSON, and reads one response line, `{"ok": VALUE}`
//! or `{"error": "MESSAGE"}`; then the server closes the connection. VALUE has the shape the
//! same command prints when it opens the device itself (`volume list --json`, `volume stats
//! --json`), so clients print either the same way. No request changes the device.
//!
//! The socket is private to the repository's owner (mode 0600, inside the 0700 face
//! directory), bound with that mode from the start, replaces a stale socket left by a killed
//! server, and is removed when the [`ControlServer`] is dropped.
//!
//! Limits: a request line of at most [`REQUEST_BYTES_MAX`], sent within
//! [`CLIENT_TIMEOUT`]; at most [`CONNECTIONS_MAX`] requests answered at once (others get an
//! error at once). Stopping the server waits for the requests being answered.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use crate::error::{BlockError, Result};
use onecopy_core::Error;
use onecopy_nbd::{bind_unix_listener, SocketPermissions};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::engine::Engine;

/// Name of the control socket in the block face's directory.
pub const CONTROL_SOCKET_FILE: &str = "control.sock";
/// Longest request line a client may send.
pub const REQUEST_BYTES_MAX: u64 = 64 << 10;
/// How long a client may take to send its request, and to take its response.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);
/// Requests answered at once.
pub const CONNECTIONS_MAX: usize = 8;

/// What a client asks a running server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "snake_case")]
pub enum ControlRequest {
    /// Who serves (pid and command) and the engine's live statistics ([`EngineStats`]).
    ///
    /// [`EngineStats`]: crate::EngineStats
    Status,
    /// Every volume's record, as `volume list --json` prints them.
    Volumes,
    /// One volume's live statistics ([`VolumeStats`](crate::VolumeStats)).
    VolumeStats { name: String },
    /// The engine's check, without repair, run inside the server; its report
    /// ([`FaceReport`](onecopy_core::check::FaceReport)).
    Check {
        /// Read and verify every stored byte too.
        #[serde(default)]
        read_data: bool,
    },
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Response {
    Ok(Value),
    Error(String),
}

/// The path of the control socket of the block face in `face_directory`.
pub fn control_socket_path(face_directory: &Path) -> PathBuf {
    face_directory.join(CONTROL_SOCKET_FILE)
}

/// A running control socket; dropping it stops answering and removes the socket.
pub struct ControlServer {
    path: PathBuf,
    /// The listening socket, shut down to wake the accept loop when stopping: connecting to
    /// the socket's path would not reach it once the path is gone, and the loop would wait
    /// forever.
    listener: std::os::fd::RawFd,
    stopping: Arc<AtomicBool>,
    accept_thread: Option<JoinHandle<()>>,
}

impl ControlServer {
    /// Binds the control socket of the face in `face_directory` and answers requests about
    /// `engine` on a background thread. `holder` describes this process (the face lock's
    /// text, `pid 1234: serve`) for [`ControlRequest::Status`].
    pub fn start(face_directory: &Path, engine: Arc<Engine>, holder: String) -> Result<Self> {
        let path = control_socket_path(face_directory);
        let listener =
            bind_unix_listener(&path, &SocketPermissions::default()).map_err(|source| {
                BlockError::ControlSocket {
                    path: path.clone(),
                    source,
                }
            })?;
        let stopping = Arc::new(AtomicBool::new(false));
        let thread_stopping = Arc::clone(&stopping);
        let listener_fd = std::os::fd::AsRawFd::as_raw_fd(&listener);
        let accept_thread = thread::Builder::new()
            .name("control-accept".into())
            .spawn(move || accept_loop(&listener, &engine, &holder, &thread_stopping))
            .map_err(|error| Error::io("starting the control socket's thread", error))?;
        Ok(ControlServer {
            path,
            listener: listener_fd,
            stopping,
            accept_thread: Some(accept_thread),
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        // Wakes the accept loop, which then sees the flag: an accept on a socket shut down
        // fails at once. The loop owns the socket and closes it only after it has seen the
        // flag, so the descriptor is still this socket's.
        // SAFETY: shutdown only reads the descriptor number.
        unsafe { libc::shutdown(self.listener, libc::SHUT_RDWR) };
        if let Some(thread) = self.accept_thread.take() {
            if thread.join().is_err() {
                eprintln!("onecopy: the control socket's thread panicked");
            }
        }
        // Best effort: someone may have removed it already.
        let _ = std::fs::remove_file(&self.path);
    }
}

fn accept_loop(listener: &UnixListener, engine: &Arc<Engine>, holder: &str, stopping: &AtomicBool) {
    let active = Arc::new(AtomicUsize::new(0));
    let mut handlers: Vec<JoinHandle<()>> = Vec::new();
    for stream in listener.incoming() {
        if stopping.load(Ordering::SeqCst) {
            break;
        }
        let stream = match stream {
            Ok(stream) => stream,
            Err(_) if stopping.load(Ordering::SeqCst) => break,
            Err(error) => {
                // Typically EMFILE; the listener stays usable. Avoid spinning.
                eprintln!("onecopy: control socket: accepting a connection: {error}");
                thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        handlers.retain(|handler| !handler.is_finished());
        if active.fetch_add(1, Ordering::SeqCst) >= CONNECTIONS_MAX {
            active.fetch_sub(1, Ordering::SeqCst);
            let busy = Response::Error(format!(
                "the server is answering {CONNECTIONS_MAX} control requests already; try again"
            ));
            let _ = send(&stream, &busy);
            continue;
        }
        let engine = Arc::clone(engine);
        let holder = holder.to_string();
        let thread_active = Arc::clone(&active);
        let spawned = thread::Builder::new()
            .name("control-request".into())
            .spawn(move || {
                answer(stream, &engine, &holder);
                thread_active.fetch_sub(1, Ordering::SeqCst);
            });
        match spawned {
            Ok(handler) => handlers.push(handler),
            Err(error) => {
                active.fetch_sub(1, Ordering::SeqCst);
                eprintln!("onecopy: control socket: starting a request thread: {error}");
            }
        }
    }
    for handler in handlers {
        let _ = handler.join();
    }
}

/// Reads one request from `stream`, answers it, and closes the connection.
fn answer(stream: UnixStream, engine: &Engine, holder: &str) {
    let configured = stream
        .set_read_timeout(Some(CLIENT_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(CLIENT_TIMEOUT)));
    if configured.is_err() {
        return;
    }
    let mut line = String::new();
    let read = BufReader::new((&stream).take(REQUEST_BYTES_MAX)).read_line(&mut line);
    let response = match read {
        Err(error) => Response::Error(format!("reading the request: {error}")),
        Ok(_) if !line.ends_with('\n') => Response::Error(format!(
            "a request is one line of JSON of at most {REQUEST_BYTES_MAX} bytes"
        )),
        Ok(_) => match serde_json::from_str::<ControlRequest>(&line) {
            Err(error) => Response::Error(format!("not a control request: {error}")),
            Ok(request) => match execute(&request, engine, holder) {
                Ok(value) => Response::Ok(value),
                Err(error) => Response::Error(error.to_string()),
            },
        },
    };
    // Best effort: the client may have gone.
    let _ = send(&stream, &response);
}

fn send(mut stream: &UnixStream, response: &Response) -> io::Result<()> {
    let mut bytes = serde_json::to_vec(response).expect("responses serialise");
    bytes.push(b'\n');
    stream.write_all(&bytes)
}

fn execute(request: &ControlRequest, engine: &Engine, holder: &str) -> Result<Value> {
    let value = match request {
        ControlRequest::Status => serde_json::json!({
            "pid": std::process::id(),
            "holder": holder,
            "engine": engine.stats(),
        }),
        ControlRequest::Volumes => to_value(&engine.volumes()),
        ControlRequest::VolumeStats { name } => to_value(&engine.volume_stats(name)?),
        ControlRequest::Check { read_data } => check(engine, *read_data)?,
    };
    Ok(value)
}

/// The engine's check without repair: the one place the control socket calls it.
fn check(engine: &Engine, read_data: bool) -> Result<Value> {
    let options = onecopy_core::check::CheckOptions {
        repair: false,
        read_data,
    };
    Ok(to_value(&engine.check(options)?))
}

fn to_value(value: &impl Serialize) -> Value {
    serde_json::to_value(value).expect("reports serialise")
}

/// Sends `request` to the server of the block face in `face_directory`. Returns `Ok(None)`
/// when no server listens there (no socket, or a stale one), and otherwise the server's
/// answer: the value, or the error message it gave.
pub fn request(
    face_directory: &Path,
    request: &ControlRequest,
) -> Result<Option<std::result::Result<Value, String>>> {
    let path = control_socket_path(face_directory);
    let mut stream = match UnixStream::connect(&path) {
        Ok(stream) => stream,
        Err(error)
            if matches!(
                error.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Ok(None)
        }
        Err(error) => {
            return Err(Error::io(
                format!("connecting to the control socket {}", path.display()),
                error,
            )
            .into())
        }
    };
    let context = || format!("asking the server at {}", path.display());
    let mut bytes = serde_json::to_vec(request).expect("requests serialise");
    bytes.push(b'\n');
    stream
        .set_write_timeout(Some(CLIENT_TIMEOUT))
        .and_then(|()| stream.write_all(&bytes))
        .map_err(|error| Error::io(context(), error))?;
    // No read timeout: a check takes as long as the data it reads.
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .map_err(|error| Error::io(context(), error))?;
    let response: Response =
        serde_json::from_str(answer.trim_end()).map_err(|source| BlockError::ControlAnswer {
            path: path.clone(),
            source,
        })?;
    Ok(Some(match response {
        Response::Ok(value) => Ok(value),
        Response::Error(message) => Err(message),
    }))
}
