//! Lease locks on object storage: who may change the repository, and who reads it.
//!
//! A client holding a lock has an object `locks/<id>` that it rewrites every
//! [`Lease::renew_every`]; a lock whose object the server last wrote more than the lease
//! duration ago is lapsed and ignored (and removed by whoever sees it). Ages are measured on
//! the server's clock alone: a client writes its own lock, lists the locks, and compares the
//! others' modification times with its own, so clocks of clients never meet.
//!
//! A holder lets go by writing a marker `locks/<id>.released` beside its lock rather than by
//! removing the lock: servers answer a PUT of a new object at once where a DELETE may wait
//! (Garage: 2 ms against 43 ms), and letting go is the last step of every command. A lock with its marker is ignored; whoever takes a lock next removes the lock in
//! the background, and the one after removes the marker (a lock never loses its marker
//! first).
//!
//! Taking a lock needs no conditional write: write the own lock, list, and if a live lock
//! conflicts (any other lock for an exclusive one, an exclusive one for a shared one), remove
//! the own lock and try again after a random pause. Two clients racing both see each other and
//! both step back, so at most one holds an exclusive lock; the random pauses let one of them
//! win the next round. This relies on listings that show every completed write (read-after-
//! write consistency, which S3 and Garage give).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::{Condvar, Mutex};
use serde::{Deserialize, Serialize};

use crate::client::ObjectClient;
use crate::error::{RemoteError, Result};

/// The directory of the lock objects.
pub const LOCKS: &str = "locks";
/// How long a lock lives without renewal, unless `ONECOPY_S3_LEASE_SECONDS` says otherwise.
pub const LEASE_DEFAULT: Duration = Duration::from_secs(60);
/// The variable that sets the lease (tests shorten it to see lapsed locks quickly).
pub const LEASE_VARIABLE: &str = "ONECOPY_S3_LEASE_SECONDS";
/// What a lock's name ends with to mark it released (`locks/<id>.released`).
pub const RELEASED_SUFFIX: &str = ".released";

/// What a lock allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LockKind {
    /// Reading: many at once, none while an exclusive lock lives.
    Shared,
    /// Changing the repository: alone.
    Exclusive,
}

/// The content of a lock object, for messages naming the holder.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct LockRecord {
    kind: LockKind,
    host: String,
    pid: u32,
    command: String,
}

/// The lease's duration from the environment, or [`LEASE_DEFAULT`].
pub fn lease_duration() -> Duration {
    std::env::var(LEASE_VARIABLE)
        .ok()
        .and_then(|text| text.parse::<u64>().ok())
        .filter(|seconds| *seconds >= 2)
        .map(Duration::from_secs)
        .unwrap_or(LEASE_DEFAULT)
}

/// A held lock, renewed by a thread until dropped.
pub struct Lease {
    /// The lock object; `None` once handed to the caller ([`Lease::release_by_caller`]).
    name: Option<String>,
    client: Arc<ObjectClient>,
    duration: Duration,
    renewer: Option<JoinHandle<()>>,
    state: Arc<RenewState>,
    /// Removes the released locks the acquisition listed.
    cleaner: Option<JoinHandle<()>>,
}

struct RenewState {
    stop: Mutex<bool>,
    wake: Condvar,
    /// When the lock object was last written successfully (by this machine's clock).
    renewed: Mutex<Instant>,
    /// A renewal found its lock object gone: another client removed it as lapsed.
    lost: AtomicBool,
}

impl Lease {
    /// Takes a lock of `kind` that lapses `duration` after its last renewal, waiting up to
    /// `wait` for conflicting locks to go.
    pub fn acquire(
        client: Arc<ObjectClient>,
        kind: LockKind,
        command: &str,
        duration: Duration,
        wait: Duration,
    ) -> Result<Lease> {
        let record = LockRecord {
            kind,
            host: host_name(),
            pid: std::process::id(),
            command: command.to_string(),
        };
        let body = serde_json::to_vec(&record).expect("lock records serialise");
        let name = format!("{LOCKS}/{}", random_hex());
        let started = Instant::now();
        let mut pause = Duration::from_millis(50);
        loop {
            let written = Instant::now();
            client.put(&name, body.clone())?;
            let listed = client.list(LOCKS)?;
            let markers: Vec<&str> = listed
                .iter()
                .filter_map(|object| object.name.strip_suffix(RELEASED_SUFFIX))
                .collect();
            let locks: Vec<_> = listed
                .iter()
                .filter(|object| !object.name.ends_with(RELEASED_SUFFIX))
                .collect();
            let own = locks
                .iter()
                .find(|lock| lock.name == name)
                .map(|lock| lock.modified);
            // A listing without the own lock is a server without read-after-write listings:
            // nothing can be decided from it, so try again.
            let mut conflict = None;
            if let Some(now) = own {
                for lock in locks.iter().filter(|lock| lock.name != name) {
                    if markers.contains(&lock.name.as_str()) {
                        // Let go by its holder.
                        continue;
                    }
                    let age = now.duration_since(lock.modified).unwrap_or_default();
                    if age > duration {
                        // Lapsed: its holder stopped renewing (killed, or cut off).
                        client.delete(&lock.name)?;
                        continue;
                    }
                    let Some(other) = client
                        .get(&lock.name)?
                        .and_then(|data| serde_json::from_slice::<LockRecord>(&data).ok())
                    else {
                        continue;
                    };
                    if kind == LockKind::Exclusive || other.kind == LockKind::Exclusive {
                        conflict = Some((other, duration.saturating_sub(age)));
                        break;
                    }
                }
            }
            if own.is_some() && conflict.is_none() {
                let state = Arc::new(RenewState {
                    stop: Mutex::new(false),
                    wake: Condvar::new(),
                    renewed: Mutex::new(written),
                    lost: AtomicBool::new(false),
                });
                let renewer = {
                    let client = Arc::clone(&client);
                    let state = Arc::clone(&state);
                    let name = name.clone();
                    std::thread::Builder::new()
                        .name("onecopy-lease".into())
                        .spawn(move || renew(&client, &name, body, duration, &state))
                        .map_err(|error| {
                            onecopy_core::Error::io("starting the lease thread", error)
                        })?
                };
                // In one request: the released locks, and the markers whose lock is gone (a
                // lock and its own marker never go together, so no lock is ever left without
                // its marker; the marker goes with the next acquisition).
                let released: Vec<String> = markers
                    .iter()
                    .map(|lock| {
                        if locks.iter().any(|listed| listed.name == *lock) {
                            lock.to_string()
                        } else {
                            format!("{lock}{RELEASED_SUFFIX}")
                        }
                    })
                    .collect();
                let cleaner = (!released.is_empty()).then(|| {
                    let client = Arc::clone(&client);
                    // What fails to go is left for the next acquisition.
                    std::thread::spawn(move || drop(client.delete_all(&released)))
                });
                return Ok(Lease {
                    name: Some(name),
                    client,
                    duration,
                    renewer: Some(renewer),
                    state,
                    cleaner,
                });
            }
            client.delete(&name)?;
            if started.elapsed() >= wait {
                let (holder, lapses_in) = conflict
                    .map(|(other, left)| {
                        (
                            format!(
                                "`{}` (process {} on {}, {} lock)",
                                other.command,
                                other.pid,
                                other.host,
                                if other.kind == LockKind::Exclusive {
                                    "exclusive"
                                } else {
                                    "shared"
                                }
                            ),
                            left.as_secs(),
                        )
                    })
                    .unwrap_or_else(|| ("another client".into(), duration.as_secs()));
                return Err(RemoteError::Locked {
                    url: client.url().to_string(),
                    holder,
                    lapses_in,
                });
            }
            std::thread::sleep(pause + jitter(pause));
            pause = (pause * 2).min(Duration::from_secs(2));
        }
    }

    /// Fails when the lease may have lapsed: its last renewal is older than the lease less a
    /// margin for the time a commit takes, or another client removed the lock as lapsed.
    /// Checked just before the commit point, so that a client cut off longer than its lease
    /// never commits over the work of the one that took over.
    pub fn check_held(&self) -> Result<()> {
        let age = self.state.renewed.lock().elapsed();
        let margin = self.duration / 4;
        if self.state.lost.load(Ordering::Relaxed) || age + margin > self.duration {
            return Err(RemoteError::CommitRefused {
                url: self.client.url().to_string(),
                detail: format!(
                    "this client's lock was last renewed {} s ago and may have lapsed (lease {} \
                     s); run the command again",
                    age.as_secs(),
                    self.duration.as_secs()
                ),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
impl Lease {
    /// Stops renewing, as a client frozen or cut off from the store would.
    pub(crate) fn stop_renewing(&mut self) {
        self.stop();
    }
}

impl Lease {
    /// Stops renewing the lock and hands its object's name to the caller, who removes it: a
    /// commit removes it in the same request as the objects it made unreferenced.
    pub fn release_by_caller(mut self) -> String {
        self.stop();
        self.name.take().expect("a held lease has its lock")
    }

    fn stop(&mut self) {
        *self.state.stop.lock() = true;
        self.state.wake.notify_all();
        if let Some(renewer) = self.renewer.take() {
            let _ = renewer.join();
        }
        if let Some(cleaner) = self.cleaner.take() {
            let _ = cleaner.join();
        }
    }
}

impl Drop for Lease {
    /// Lets go of the lock: writes its marker (see the module documentation).
    fn drop(&mut self) {
        self.stop();
        let Some(name) = self.name.take() else {
            return;
        };
        if let Err(error) = self
            .client
            .put(&format!("{name}{RELEASED_SUFFIX}"), Vec::new())
        {
            eprintln!(
                "onecopy: warning: the lock {name} was not released ({error}); it lapses by \
                 itself"
            );
        }
    }
}

fn renew(client: &ObjectClient, name: &str, body: Vec<u8>, duration: Duration, state: &RenewState) {
    let every = duration / 3;
    loop {
        {
            let mut stop = state.stop.lock();
            if !*stop {
                state.wake.wait_for(&mut stop, every);
            }
            if *stop {
                return;
            }
        }
        match client.size(name) {
            Ok(None) => {
                // Someone removed it as lapsed: the lock is gone for good.
                state.lost.store(true, Ordering::Relaxed);
                return;
            }
            Ok(Some(_)) => {}
            Err(_) => continue,
        }
        let attempt = Instant::now();
        if client.put(name, body.clone()).is_ok() {
            *state.renewed.lock() = attempt;
        }
    }
}

fn host_name() -> String {
    let mut buffer = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it.
    let result = unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len()) };
    if result != 0 {
        return "unknown host".into();
    }
    let end = buffer
        .iter()
        .position(|byte| *byte == 0)
        .unwrap_or(buffer.len());
    String::from_utf8_lossy(&buffer[..end]).into_owned()
}

/// 16 random bytes in hex, for names no other client picks.
pub(crate) fn random_hex() -> String {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 16];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .expect("the system random generator works");
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// A random pause up to `pause`, so that racing clients do not retry in step.
fn jitter(pause: Duration) -> Duration {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos() as u64
        ^ u64::from(std::process::id()).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    Duration::from_nanos(nanos % (pause.as_nanos() as u64).max(1))
}
