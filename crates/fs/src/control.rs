//! Commands on the face (`onecopy fs ...`), run in this process or sent to the process that
//! has the face mounted, through its control socket.
//!
//! The socket is `<repository>/fs/control.sock`, inside the face's directory (mode 0700), so
//! only the repository's owner reaches it; it is also made mode 0600. Protocol: one JSON
//! [`Request`] per connection, one line; one JSON [`Response`] back, one line.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::changes::FsId;
use crate::dedup::{self, Yield};
use crate::engine::{Caller, FsEngine};
use crate::error::{FsError, Result};
use crate::options::{FsOptions, OptionChanges};

/// The control socket's file name in the face's directory.
pub const SOCKET_FILE: &str = "control.sock";
/// Longest request line a mounting process accepts.
pub const REQUEST_BYTES_MAX: u64 = 1 << 20;
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

/// A mounted file system, as the control socket lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountInfo {
    pub fs: FsId,
    pub mount_point: PathBuf,
    pub read_only: bool,
}

/// The answer to a [`Request`]: its JSON result, or the error's message.
pub type Response = std::result::Result<serde_json::Value, String>;

/// Runs `request` on `engine`; `mounts` are the file systems this process has mounted (for
/// `list`, and for the refusal to delete one). Mount requests need the mounting process
/// (`crate::mount::MountServer`) and are refused here.
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

/// Serialises a result (plain data, so this cannot fail).
fn json<T: Serialize>(value: &T) -> serde_json::Value {
    serde_json::to_value(value).expect("results serialise")
}

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
