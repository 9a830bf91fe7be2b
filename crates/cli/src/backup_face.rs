//! Opening the backup face of a repository, in a directory or on object storage.
//!
//! A directory's face is held with its local lock. A repository at an `s3:` URL is used
//! through a cache on this machine (`ONECOPY_CACHE_DIR`, default the user's cache directory):
//! a command takes a lease lock on the object store (shared to read, exclusive to change),
//! and a command that changed the store publishes its catalog when it is done
//! ([`BackupFace::finish`]); one that fails before publishes nothing.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use onecopy_core::keys::{KeyRing, MasterKey};
use onecopy_core::repository::{Encryption, FaceLock, LockWait, Repository};
use onecopy_core::storage::{SealedStorage, Storage};
use onecopy_core::units::format_size;
use onecopy_remote::{Commit, LockKind, ObjectUrl, RemoteRepository, Removal, Session};
use serde::Serialize;

use crate::keys::FirstKey;
use crate::Cli;

/// How long a command waits for the lock of a repository on object storage when `--wait` is
/// not given. Clients on other hosts take turns through it, so giving up at once (as with a
/// local repository another process uses) would make concurrent backups fail.
pub const REMOTE_WAIT_DEFAULT: Duration = Duration::from_secs(600);

/// The variable naming the cache directory of repositories on object storage.
pub const CACHE_VARIABLE: &str = "ONECOPY_CACHE_DIR";

/// What a command does with the backup store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    /// Changes it, and on object storage deletes what it made unreferenced before it returns
    /// (deletion, expiry, compaction, repair: their point is the space).
    Write,
    /// Adds a backup: on object storage what it made unreferenced is deleted by the next
    /// changing command, beside that command's work ([`Removal::Later`]).
    Add,
}

/// The backup face of the repository a command uses, held until dropped or finished.
pub struct BackupFace {
    /// The face's storage, sealed unless the repository is unencrypted.
    pub storage: Arc<dyn Storage>,
    /// The same storage as sealed storage, when it is sealed (for `check`).
    pub sealed: Option<Arc<SealedStorage>>,
    holder: Holder,
}

enum Holder {
    Local(#[allow(dead_code)] FaceLock),
    Remote {
        remote: Box<RemoteRepository>,
        session: Box<Session>,
        access: Access,
    },
}

/// What a command published to object storage, for its report.
#[derive(Debug, Serialize)]
pub struct Published {
    pub url: String,
    /// Whether the server enforced the create-only PUT of the commit.
    pub conditional_writes: bool,
    #[serde(flatten)]
    pub commit: Commit,
}

impl Published {
    /// One line for the text output.
    pub fn describe(&self) -> String {
        let requests = &self.commit.requests;
        format!(
            "published catalog generation {} ({} of {}) to {}: {} requests, {} sent, {} \
             received",
            self.commit.generation,
            if self.commit.snapshot {
                "a snapshot"
            } else {
                "a delta"
            },
            format_size(self.commit.catalog_bytes),
            self.url,
            requests.requests(),
            format_size(requests.bytes_sent),
            format_size(requests.bytes_received)
        )
    }
}

/// The repository at `--repo` when it is an object-storage URL.
pub fn object_url(cli: &Cli) -> anyhow::Result<Option<ObjectUrl>> {
    let path = cli.repository_path();
    let Some(text) = path.to_str() else {
        return Ok(None);
    };
    if !ObjectUrl::is_object_url(text) {
        return Ok(None);
    }
    Ok(Some(ObjectUrl::parse(text)?))
}

/// The cache directory of repositories on object storage.
pub fn cache_root() -> PathBuf {
    match std::env::var_os(CACHE_VARIABLE) {
        Some(directory) if !directory.is_empty() => PathBuf::from(directory),
        _ => dirs::cache_dir()
            .unwrap_or_else(|| PathBuf::from("."))
            .join("onecopy"),
    }
}

/// Connects to the repository at `url` and brings its configuration and keys into the cache.
pub fn connect(url: &ObjectUrl) -> anyhow::Result<RemoteRepository> {
    let remote = RemoteRepository::connect(url, &cache_root())?;
    remote.pull_root()?;
    Ok(remote)
}

/// The wait for the lock of a repository on object storage.
fn remote_wait(cli: &Cli) -> anyhow::Result<Duration> {
    Ok(match cli.lock_wait()? {
        LockWait::No => REMOTE_WAIT_DEFAULT,
        LockWait::Forever => Duration::from_secs(u64::MAX / 4),
        LockWait::For(duration) => duration,
    })
}

/// Opens the backup face for `command`.
pub fn open(
    cli: &Cli,
    command: &str,
    access: Access,
    first_key: FirstKey,
) -> anyhow::Result<BackupFace> {
    open_with(cli, command, access, first_key, false)
}

/// Opens the backup face for a check: on object storage every object is read from the
/// store, never from copies kept on this machine.
pub fn open_for_check(cli: &Cli, command: &str, access: Access) -> anyhow::Result<BackupFace> {
    open_with(cli, command, access, FirstKey::Refuse, true)
}

fn open_with(
    cli: &Cli,
    command: &str,
    access: Access,
    first_key: FirstKey,
    verify_remote: bool,
) -> anyhow::Result<BackupFace> {
    let Some(url) = object_url(cli)? else {
        let repository = Repository::open(&cli.repository_path())?;
        let lock = repository.lock_face_waiting("backup", command, cli.lock_wait()?)?;
        let plain = repository.face_storage("backup")?;
        let sealed = crate::keys::sealing(cli, &repository, &plain, first_key)?;
        return Ok(BackupFace {
            storage: sealed.clone().map_or(plain, |s| s as Arc<dyn Storage>),
            sealed,
            holder: Holder::Local(lock),
        });
    };
    let remote = RemoteRepository::connect(&url, &cache_root())?;
    if verify_remote {
        remote.verify_remote();
    }
    let kind = match access {
        Access::Read => LockKind::Shared,
        Access::Write | Access::Add => LockKind::Exclusive,
    };
    // The master key is unwrapped (Argon2id: a tenth of a second of one core) from the key
    // files an earlier command cached while the keys are fetched, the lock taken and the
    // catalog listed, which wait on the network; fetched keys that differ from the cached
    // ones are unwrapped again.
    let early = unwrap_in_background(cli, &remote.mirror())?;
    let (keys_changed, session) =
        remote.pull_root_then_session("backup", kind, command, remote_wait(cli)?)?;
    let repository = Repository::open(&remote.mirror())
        .with_context(|| format!("the cached configuration of {url}"))?;
    let sealed = if repository.config().encryption == Encryption::None {
        None
    } else {
        // `init` makes the first key of a repository on object storage: two clients making
        // one each at once would seal with two master keys.
        if KeyRing::open(repository.path())?.list()?.is_empty() {
            bail!(
                "the repository at {url} has no key yet: run `onecopy init --repo {url}` with \
                 a password (ONECOPY_PASSWORD, --password-file or a terminal) to make it"
            );
        }
        let master = match early {
            Some((unwrapping, _)) if !keys_changed => unwrapping
                .join()
                .expect("unwrapping the key does not panic")?,
            early => {
                let password = match early {
                    Some((_, password)) => password,
                    None => crate::keys::password(cli)?,
                };
                KeyRing::open(repository.path())?.unlock(&password)?.0
            }
        };
        Some(crate::keys::seal(&session.storage(), &master))
    };
    let plain = session.storage();
    Ok(BackupFace {
        storage: sealed.clone().map_or(plain, |s| s as Arc<dyn Storage>),
        sealed,
        holder: Holder::Remote {
            remote: Box::new(remote),
            session: Box::new(session),
            access,
        },
    })
}

/// A master key being unwrapped on another thread, and the password it was given.
type Unwrapping = (
    std::thread::JoinHandle<onecopy_core::Result<MasterKey>>,
    String,
);

/// Unwraps the master key from the key files cached in `mirror` on another thread, when the
/// cached configuration says the backup store is encrypted and keys are cached.
fn unwrap_in_background(cli: &Cli, mirror: &std::path::Path) -> anyhow::Result<Option<Unwrapping>> {
    let Ok(repository) = Repository::open(mirror) else {
        return Ok(None);
    };
    if repository.config().encryption == Encryption::None {
        return Ok(None);
    }
    let ring = KeyRing::open(repository.path())?;
    if ring.list()?.is_empty() {
        return Ok(None);
    }
    let password = crate::keys::password(cli)?;
    let given = password.clone();
    let unwrapping = std::thread::spawn(move || ring.unlock(&given).map(|(master, _)| master));
    Ok(Some((unwrapping, password)))
}

impl BackupFace {
    /// Ends the command's use of the face: on object storage, a command that changed the
    /// store publishes its catalog (the commit point), and what it published is returned.
    /// Call it after the store is closed.
    pub fn finish(self) -> anyhow::Result<Option<Published>> {
        let BackupFace {
            storage,
            sealed,
            holder,
        } = self;
        drop(sealed);
        drop(storage);
        let Holder::Remote {
            remote,
            session,
            access,
        } = holder
        else {
            return Ok(None);
        };
        let removal = match access {
            Access::Read => return Ok(None),
            Access::Write => Removal::Now,
            Access::Add => Removal::Later,
        };
        let url = remote.client().url().to_string();
        let conditional_writes = remote.client().conditional();
        let commit = session
            .commit(removal)
            .with_context(|| format!("publishing the catalog to {url}"))?;
        Ok(commit.map(|commit| Published {
            url,
            conditional_writes,
            commit,
        }))
    }

    /// True when the repository is on object storage.
    pub fn is_remote(&self) -> bool {
        matches!(self.holder, Holder::Remote { .. })
    }
}
