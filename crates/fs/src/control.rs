//! Commands on the face (`onecopy fs ...`), run in this process or sent to the process that
//! has the face mounted, through its control socket.
//!
//! The socket is `<repository>/fs/control.sock`, inside the face's directory (mode 0700), so
//! only the repository's owner reaches it; it is also made mode 0600. Protocol: one JSON
//! [`Request`] per connection, one line; one JSON [`Response`] back, one line.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::dedup::{self, Yield};
use crate::engine::{Caller, FsEngine};
use crate::error::{FsError, Result};
use crate::mount::{MountInfo, MountOptions, MountServer};
use crate::options::{FsOptions, OptionChanges};

/// The control socket's file name in the face's directory.
pub const SOCKET_FILE: &str = "control.sock";
/// Longest request line accepted.
const REQUEST_BYTES_MAX: u64 = 1 << 20;
/// Requests answered at once; more are refused (a deduplication run holds one).
const REQUESTS_IN_FLIGHT_MAX: usize = 16;
/// How long a client waits for an answer (a deduplication run can take long).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// A command on the face.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum Request {
    List,
    Create {
        name: String,
        options: FsOptions,
        uid: u32,
        gid: u32,
    },
    Delete {
        name: String,
    },
    Config {
        name: String,
        changes: OptionChanges,
    },
    Stats {
        name: String,
    },
    Ranks {
        name: String,
    },
    Dedup {
        name: String,
        dry_run: bool,
    },
    /// Compaction of the face's containers (every file system's).
    Compact {
        dry_run: bool,
    },
    /// `onecopy check` of the face (a repair sets reference counts right, live).
    Check {
        repair: bool,
        read_data: bool,
    },
    /// Mount file system `name` at `mount_point` (canonical) in the serving process too, with
    /// `options` as `onecopy mount -o` takes them. Answered once the mount is in place.
    Mount {
        name: String,
        mount_point: PathBuf,
        options: String,
    },
    /// Answered once nothing is mounted at `mount_point` any more and what it wrote is
    /// durable: `{"was_mounted": bool, "last": bool}`, `last` when the serving process has
    /// no mounts left and is ending (its checkpoint is done when it releases the face).
    AwaitUnmount {
        mount_point: PathBuf,
    },
}

/// The answer to a [`Request`]: its JSON result, or the error's message.
pub type Response = std::result::Result<serde_json::Value, String>;

/// Runs `request` on `engine`; `mounts` are the file systems this process has mounted (for
/// `list`, and for the refusal to delete one). Mount requests need a [`MountServer`] and are
/// refused here.
pub fn execute(
    engine: &FsEngine,
    request: &Request,
    mounts: &[MountInfo],
) -> Result<serde_json::Value> {
    Ok(match request {
        Request::List => {
            let records = engine.list();
            let listed: Vec<serde_json::Value> = records
                .iter()
                .map(|record| {
                    let mut value = serde_json::to_value(record).expect("records serialise");
                    let mount_point = mounts
                        .iter()
                        .find(|mount| mount.fs == record.id)
                        .map(|mount| mount.mount_point.display().to_string());
                    value["mount_point"] = serde_json::json!(mount_point);
                    value
                })
                .collect();
            serde_json::json!(listed)
        }
        Request::Create {
            name,
            options,
            uid,
            gid,
        } => {
            let id = engine.create_file_system(
                name,
                options.clone(),
                Caller {
                    uid: *uid,
                    gid: *gid,
                },
            )?;
            json(&engine.record(id)?)
        }
        Request::Delete { name } => {
            let fs = engine.find(name)?;
            if let Some(mount) = mounts.iter().find(|mount| mount.fs == fs) {
                return Err(FsError::posix(
                    libc::EBUSY,
                    format!(
                        "file system {name:?} is mounted at {}; unmount it first",
                        mount.mount_point.display()
                    ),
                ));
            }
            engine.delete_file_system(fs)?;
            serde_json::json!({ "deleted": name })
        }
        Request::Config { name, changes } => {
            let fs = engine.find(name)?;
            json(&engine.configure(fs, changes)?)
        }
        Request::Stats { name } => json(&engine.stats(engine.find(name)?)?),
        Request::Ranks { name } => json(&engine.ranks(engine.find(name)?)?),
        Request::Dedup { name, dry_run } => {
            let fs = engine.find(name)?;
            let plan = dedup::plan(engine, fs)?;
            let report = if *dry_run {
                None
            } else {
                let report = dedup::execute(engine, fs, &plan, Yield::Never)?;
                engine.flush()?;
                Some(report)
            };
            serde_json::json!({ "plan": plan, "report": report })
        }
        Request::Compact { dry_run } => {
            let (plan, report) = engine.compact(*dry_run)?;
            serde_json::json!({ "plan": plan, "report": report })
        }
        Request::Check { repair, read_data } => {
            json(&engine.check(onecopy_core::check::CheckOptions {
                repair: *repair,
                read_data: *read_data,
            })?)
        }
        Request::Mount { .. } | Request::AwaitUnmount { .. } => {
            return Err(FsError::InvalidArgument(
                "mount requests go to a mounting process".to_string(),
            ))
        }
    })
}

/// Runs `request` in the process that serves the mounts of `server`.
pub fn execute_served(server: &Arc<MountServer>, request: &Request) -> Result<serde_json::Value> {
    match request {
        Request::Mount {
            name,
            mount_point,
            options,
        } => {
            let options = MountOptions::parse(options)?;
            server.mount(name, mount_point, &options)?;
            Ok(serde_json::json!({ "mounted": name, "pid": std::process::id() }))
        }
        Request::AwaitUnmount { mount_point } => {
            let was_mounted = server
                .mounts()
                .iter()
                .any(|mount| mount.mount_point == *mount_point);
            let last = server.await_unmount(mount_point);
            Ok(serde_json::json!({ "was_mounted": was_mounted, "last": last }))
        }
        _ => execute(server.engine(), request, &server.mounts()),
    }
}

/// Serialises a result (plain data, so this cannot fail).
fn json<T: Serialize>(value: &T) -> serde_json::Value {
    serde_json::to_value(value).expect("results serialise")
}

/// The control socket of a mounting process.
pub struct ControlServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ControlServer {
    /// Listens on the face's socket in `face_directory` and answers requests for the mounts
    /// of `server` until stopped.
    pub fn start(server: Arc<MountServer>, face_directory: &Path) -> Result<ControlServer> {
        let path = face_directory.join(SOCKET_FILE);
        // A socket left by a process that died: the face lock (held by the caller) proves
        // nobody serves it.
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)
            .map_err(|error| FsError::io(format!("listening on {}", path.display()), error))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .map_err(|error| FsError::io(format!("making {} private", path.display()), error))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("fs-control".to_string())
            .spawn(move || {
                let in_flight = Arc::new(AtomicUsize::new(0));
                for stream in listener.incoming() {
                    if stopping.load(Ordering::Relaxed) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    if in_flight.fetch_add(1, Ordering::AcqRel) >= REQUESTS_IN_FLIGHT_MAX {
                        in_flight.fetch_sub(1, Ordering::AcqRel);
                        let busy: Response = Err(format!(
                            "the mounting process is answering {REQUESTS_IN_FLIGHT_MAX} \
                             requests already; try again"
                        ));
                        let mut out = serde_json::to_vec(&busy).expect("responses serialise");
                        out.push(b'\n');
                        let _ = (&stream).write_all(&out);
                        continue;
                    }
                    let server = Arc::clone(&server);
                    let done = Arc::clone(&in_flight);
                    // A long request (a deduplication run, waiting for an unmount) must not
                    // hold up `stats`.
                    let spawned = std::thread::Builder::new()
                        .name("fs-control-request".to_string())
                        .spawn(move || {
                            let _ = answer(&server, stream, &done);
                        });
                    if spawned.is_err() {
                        in_flight.fetch_sub(1, Ordering::AcqRel);
                    }
                }
            })
            .map_err(|error| FsError::io("starting the control thread", error))?;
        Ok(ControlServer {
            path,
            stop,
            thread: Some(thread),
        })
    }

    /// Stops listening and removes the socket.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accept loop.
        let _ = UnixStream::connect(&self.path);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Answers the request on `stream`, then takes it out of `in_flight` (a wait for an unmount
/// at once: it lasts as long as the mount and is no work).
fn answer(
    server: &Arc<MountServer>,
    stream: UnixStream,
    in_flight: &AtomicUsize,
) -> std::io::Result<()> {
    let mut counted = true;
    let release = |counted: &mut bool| {
        if std::mem::take(counted) {
            in_flight.fetch_sub(1, Ordering::AcqRel);
        }
    };
    let mut line = String::new();
    let read = BufReader::new((&stream).take_limited()).read_line(&mut line);
    if let Err(error) = read {
        release(&mut counted);
        return Err(error);
    }
    let request = serde_json::from_str::<Request>(&line);
    if matches!(request, Ok(Request::AwaitUnmount { .. })) {
        release(&mut counted);
    }
    let response: Response = match request {
        Ok(request) => execute_served(server, &request).map_err(|error| error.to_string()),
        Err(error) => Err(format!("malformed control request: {error}")),
    };
    release(&mut counted);
    let mut out = serde_json::to_vec(&response).expect("responses serialise");
    out.push(b'\n');
    (&stream).write_all(&out)
}

trait TakeLimited: std::io::Read + Sized {
    fn take_limited(self) -> std::io::Take<Self> {
        self.take(REQUEST_BYTES_MAX)
    }
}

impl<R: std::io::Read> TakeLimited for R {}

/// Sends `request` to the process serving the face in `face_directory`; `None` when no
/// process listens there.
pub fn send(face_directory: &Path, request: &Request) -> Result<Option<serde_json::Value>> {
    send_waiting(face_directory, request, ANSWER_TIMEOUT)
}

/// [`send`], waiting at most `timeout` for the answer (an I/O error of kind `WouldBlock` or
/// `TimedOut` after it).
pub fn send_waiting(
    face_directory: &Path,
    request: &Request,
    timeout: Duration,
) -> Result<Option<serde_json::Value>> {
    let path = face_directory.join(SOCKET_FILE);
    let stream = match UnixStream::connect(&path) {
        Ok(stream) => stream,
        Err(error)
            if matches!(
                error.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Ok(None)
        }
        Err(error) => {
            return Err(FsError::io(
                format!("connecting to {}", path.display()),
                error,
            ))
        }
    };
    let context = || format!("asking the mounting process through {}", path.display());
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|error| FsError::io(context(), error))?;
    let mut line = serde_json::to_vec(request).expect("requests serialise");
    line.push(b'\n');
    (&stream)
        .write_all(&line)
        .map_err(|error| FsError::io(context(), error))?;
    let mut answer = String::new();
    BufReader::new(&stream)
        .read_line(&mut answer)
        .map_err(|error| FsError::io(context(), error))?;
    let response: Response = serde_json::from_str(&answer).map_err(|error| {
        FsError::io(
            context(),
            std::io::Error::other(format!("malformed answer: {error}")),
        )
    })?;
    match response {
        Ok(value) => Ok(Some(value)),
        Err(message) => Err(FsError::Remote(message)),
    }
}
