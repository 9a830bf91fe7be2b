//! A repository: one directory holding everything onecopy stores.
//!
//! ```text
//! <repository>/
//!   config.json         format version and defaults (written once by `onecopy init`)
//!   block/              the block device: lock, meta/ (pages, journal), containers/, catalog
//!   backup/             the backup store: lock, meta/, containers/, catalog
//!   keys/               the master key wrapped once per password (crate::keys)
//! ```
//!
//! The backup store's files are sealed ([`crate::storage::SealedStorage`]) unless the
//! repository was created without encryption ([`Encryption::None`]).
//!
//! Each face keeps its own metadata and containers (same formats, same code) so that faces
//! never contend for one writer lock; a face takes its exclusive [`FaceLock`] while it has the
//! repository open for writing, and a second process gets a message naming the holder.
//!
//! Privacy: a repository holds copies of files only their owners could read, so every
//! directory in it is created with mode 0700 and every file with mode 0600, whatever the umask
//! ([`crate::storage::LocalStorage`]); [`check_privacy`] finds (and with repair, tightens)
//! anything more open, for instance in a repository made by an older onecopy.

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Seek, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::check::{Finding, FindingKind};
use crate::error::IoContext;
use crate::storage::{
    create_private_directories, LocalStorage, Storage, DIRECTORY_MODE, FILE_MODE,
};
use crate::{Error, Result};

/// Repository format this version writes and reads.
pub const REPOSITORY_FORMAT: u32 = 1;
const CONFIG_FILE: &str = "config.json";

/// The repository's configuration file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepositoryConfig {
    /// Format version ([`REPOSITORY_FORMAT`]).
    pub format: u32,
    /// Random identifier, for messages and to tell repositories apart.
    pub id: String,
    /// When `onecopy init` ran (unix seconds).
    pub created: u64,
    /// How the backup store's files are protected.
    pub encryption: Encryption,
}

/// How a repository protects the backup store's files at rest.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Encryption {
    /// Sealed with AES-256-GCM under a key derived from the master key (`keys/`).
    #[default]
    Aes256Gcm,
    /// Stored as plain files (`onecopy init --insecure-no-encryption`).
    None,
}

/// An opened repository directory.
#[derive(Clone, Debug)]
pub struct Repository {
    path: PathBuf,
    config: RepositoryConfig,
}

impl Repository {
    /// Creates a repository at `path` (the directory may exist but must not hold a
    /// repository). The directory is made private to its owner (mode 0700), also when it
    /// existed.
    pub fn init(path: &Path) -> Result<Repository> {
        Repository::init_with(path, Encryption::default())
    }

    /// [`init`](Self::init) with the backup store's protection chosen.
    pub fn init_with(path: &Path, encryption: Encryption) -> Result<Repository> {
        let config_path = path.join(CONFIG_FILE);
        if config_path.exists() {
            return Err(Error::AlreadyExists(format!(
                "a repository at {}",
                path.display()
            )));
        }
        create_private_directories(path)?;
        fs::set_permissions(path, fs::Permissions::from_mode(DIRECTORY_MODE))
            .context_io(|| format!("making {} private", path.display()))?;
        let config = RepositoryConfig {
            format: REPOSITORY_FORMAT,
            id: random_id(),
            created: crate::chunk_store::unix_seconds(),
            encryption,
        };
        let storage = LocalStorage::open(path)?;
        let bytes = serde_json::to_vec_pretty(&config).expect("config serialises");
        crate::storage::write_atomically(&storage, CONFIG_FILE, &bytes)?;
        Ok(Repository {
            path: path.to_path_buf(),
            config,
        })
    }

    /// Opens the repository at `path`; a missing repository is an error that says to run
    /// `onecopy init`.
    pub fn open(path: &Path) -> Result<Repository> {
        let config_path = path.join(CONFIG_FILE);
        let bytes = match fs::read(&config_path) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == ErrorKind::NotFound => {
                return Err(Error::NoRepository {
                    path: path.display().to_string(),
                })
            }
            Err(error) => {
                return Err(Error::io(
                    format!("reading {}", config_path.display()),
                    error,
                ))
            }
        };
        let config: RepositoryConfig = serde_json::from_slice(&bytes).map_err(|error| {
            Error::corrupt(format!("{}", config_path.display()), error.to_string())
        })?;
        if config.format != REPOSITORY_FORMAT {
            return Err(Error::InvalidArgument(format!(
                "repository {} has format {}, this onecopy reads format {REPOSITORY_FORMAT}",
                path.display(),
                config.format
            )));
        }
        Ok(Repository {
            path: path.to_path_buf(),
            config,
        })
    }

    /// The repository directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The configuration written at `init`.
    pub fn config(&self) -> &RepositoryConfig {
        &self.config
    }

    /// Storage rooted at the directory of one face (`block`, `backup`), created if needed.
    pub fn face_storage(&self, face: &str) -> Result<Arc<dyn Storage>> {
        Ok(Arc::new(LocalStorage::create(self.path.join(face))?))
    }

    /// Takes the exclusive lock of a face for `command` (a description shown to anyone who
    /// finds the lock taken). A lock held by another process is [`Error::Locked`].
    pub fn lock_face(&self, face: &str, command: &str) -> Result<FaceLock> {
        FaceLock::acquire(&self.path.join(face), command, LockWait::No)
    }

    /// [`lock_face`](Self::lock_face), waiting as `wait` says while another process holds
    /// the lock; [`Error::Locked`] if it still does when the wait ends.
    pub fn lock_face_waiting(&self, face: &str, command: &str, wait: LockWait) -> Result<FaceLock> {
        FaceLock::acquire(&self.path.join(face), command, wait)
    }
}

/// How long to wait for a face lock another process holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockWait {
    /// Fail at once.
    No,
    /// Wait until the holder releases it.
    Forever,
    /// Wait at most this long.
    For(Duration),
}

/// How often a waiting process tries the lock again. Polling (rather than a blocking
/// `flock`) keeps a bounded wait simple; the cost is at most this delay after the release.
const LOCK_RETRY_INTERVAL: Duration = Duration::from_millis(50);

/// An exclusive advisory lock (flock) on a face of a repository, held until dropped. The
/// lock file records the holder's pid and command for the message others get.
#[derive(Debug)]
pub struct FaceLock {
    _file: File,
}

impl FaceLock {
    fn acquire(directory: &Path, command: &str, wait: LockWait) -> Result<FaceLock> {
        create_private_directories(directory)?;
        let path = directory.join("lock");
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(FILE_MODE)
            .open(&path)
            .context_io(|| format!("opening {}", path.display()))?;
        let deadline = match wait {
            LockWait::For(duration) => Some(Instant::now() + duration),
            LockWait::No | LockWait::Forever => None,
        };
        loop {
            // SAFETY: flock only takes the descriptor, which `file` keeps open.
            let result = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if result == 0 {
                break;
            }
            let error = std::io::Error::last_os_error();
            if error.kind() != ErrorKind::WouldBlock {
                return Err(Error::io(format!("locking {}", path.display()), error));
            }
            let expired = match wait {
                LockWait::No => true,
                LockWait::Forever => false,
                LockWait::For(_) => deadline.is_some_and(|deadline| Instant::now() >= deadline),
            };
            if expired {
                return Err(Error::Locked {
                    face: directory.display().to_string(),
                    holder: lock_holder(&path),
                });
            }
            std::thread::sleep(LOCK_RETRY_INTERVAL);
        }
        file.set_len(0)
            .context_io(|| format!("writing {}", path.display()))?;
        file.rewind()
            .context_io(|| format!("writing {}", path.display()))?;
        write!(file, "pid {}: {command}", std::process::id())
            .context_io(|| format!("writing {}", path.display()))?;
        Ok(FaceLock { _file: file })
    }
}

/// Lists the directories and files under the repository at `path` (itself included) that
/// other users may access: directories whose mode is more open than 0700 and files more open
/// than 0600. Each is a [`FindingKind::Derived`] finding (nothing is damaged, and a repair
/// fixes it without loss); with `repair`, group and other permissions are removed and the
/// finding says so. Sockets (whose modes `serve` sets on purpose) and symbolic links are not
/// looked at, and symbolic links are not followed.
pub fn check_privacy(path: &Path, repair: bool) -> Result<Vec<Finding>> {
    let mut findings = Vec::new();
    let mut pending = vec![path.to_path_buf()];
    while let Some(current) = pending.pop() {
        let metadata = fs::symlink_metadata(&current)
            .context_io(|| format!("reading the mode of {}", current.display()))?;
        let file_type = metadata.file_type();
        let expected = if file_type.is_dir() {
            DIRECTORY_MODE
        } else if file_type.is_file() {
            FILE_MODE
        } else {
            continue;
        };
        if file_type.is_dir() {
            let entries =
                fs::read_dir(&current).context_io(|| format!("listing {}", current.display()))?;
            for entry in entries {
                let entry = entry.context_io(|| format!("listing {}", current.display()))?;
                pending.push(entry.path());
            }
        }
        let mode = metadata.permissions().mode() & 0o7777;
        let shared = mode & 0o077;
        if shared == 0 {
            continue;
        }
        let access = if shared & 0o044 != 0 {
            "readable"
        } else {
            "writable or searchable"
        };
        let mut finding = Finding::new(
            FindingKind::Derived,
            current.display().to_string(),
            format!("{access} by other users: mode {mode:04o}, expected {expected:04o}"),
        );
        if repair {
            let tightened = mode & !0o077;
            fs::set_permissions(&current, fs::Permissions::from_mode(tightened))
                .context_io(|| format!("changing the mode of {}", current.display()))?;
            finding = finding.repaired(format!("mode changed to {tightened:04o}"));
        }
        findings.push(finding);
    }
    findings.sort_by(|a, b| a.object.cmp(&b.object));
    Ok(findings)
}

/// What the lock file at `path` says about its holder (`pid 1234: serve`).
fn lock_holder(path: &Path) -> String {
    let mut holder = String::new();
    if let Ok(mut file) = File::open(path) {
        let _ = file.read_to_string(&mut holder);
    }
    match holder.trim() {
        // The holder writes its name right after taking the lock.
        "" => "a process that is starting".to_string(),
        text => text.to_string(),
    }
}

fn random_id() -> String {
    let mut bytes = [0u8; 16];
    if let Ok(mut random) = File::open("/dev/urandom") {
        let _ = random.read_exact(&mut bytes);
    }
    let seed = crate::chunk_store::unix_seconds() ^ u64::from(std::process::id());
    bytes[..8]
        .iter_mut()
        .zip(seed.to_le_bytes())
        .for_each(|(byte, mix)| *byte ^= mix);
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: init creates, open reads back, a second init and a missing repository fail with
    /// messages that say what to do.
    #[test]
    fn init_open_and_messages() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("repo");
        let missing = Repository::open(&path).unwrap_err().to_string();
        assert!(missing.contains("onecopy init"), "{missing}");
        let created = Repository::init(&path).unwrap();
        let opened = Repository::open(&path).unwrap();
        assert_eq!(created.config(), opened.config());
        assert!(Repository::init(&path).is_err());
    }

    /// Goal: a face lock excludes a second holder with a typed error naming the first, a
    /// bounded wait gives up, an unbounded one gets the lock once it is released. Method: two
    /// locks in one process (flock locks of separate opens conflict).
    #[test]
    fn face_lock_is_exclusive() {
        let directory = tempfile::tempdir().unwrap();
        let repository = Repository::init(directory.path()).unwrap();
        let lock = repository.lock_face("block", "serve").unwrap();
        let error = repository.lock_face("block", "volume create").unwrap_err();
        assert!(
            matches!(&error, Error::Locked { holder, .. } if holder.ends_with(": serve")),
            "{error:?}"
        );
        assert!(!error.to_string().contains("invalid argument"), "{error}");
        assert!(
            error
                .to_string()
                .contains(&format!("pid {}: serve", std::process::id())),
            "{error}"
        );
        let started = Instant::now();
        let waited = repository.lock_face_waiting(
            "block",
            "volume stats",
            LockWait::For(Duration::from_millis(200)),
        );
        assert!(matches!(waited, Err(Error::Locked { .. })));
        assert!(started.elapsed() >= Duration::from_millis(200));
        std::thread::scope(|scope| {
            let waiting = scope.spawn(|| {
                repository.lock_face_waiting("block", "volume create", LockWait::Forever)
            });
            std::thread::sleep(Duration::from_millis(100));
            drop(lock);
            waiting
                .join()
                .unwrap()
                .expect("the lock is taken once released");
        });
    }

    /// Goal: a repository's directories are 0700 and files 0600 after init, face storage and
    /// a lock, also in a directory that existed with mode 0755; `check_privacy` finds what is
    /// more open and a repair tightens it. Method: init into an existing 0755 directory, open
    /// both faces, loosen some modes by hand, check, repair, check again.
    #[test]
    fn repository_is_private_and_check_privacy_repairs() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("repo");
        fs::create_dir(&path).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        let repository = Repository::init(&path).unwrap();
        let storage = repository.face_storage("block").unwrap();
        storage.open("meta/journal", true).unwrap();
        let _lock = repository.lock_face("backup", "backup create").unwrap();
        assert_eq!(check_privacy(&path, false).unwrap(), Vec::new());
        let mode = |relative: &str| {
            fs::metadata(path.join(relative))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode(""), 0o700);
        assert_eq!(mode("block/meta"), 0o700);
        assert_eq!(mode("config.json"), 0o600);
        assert_eq!(mode("backup/lock"), 0o600);

        fs::set_permissions(path.join("block/meta"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(path.join("config.json"), fs::Permissions::from_mode(0o644)).unwrap();
        fs::set_permissions(path.join("backup/lock"), fs::Permissions::from_mode(0o620)).unwrap();
        let findings = check_privacy(&path, false).unwrap();
        assert_eq!(findings.len(), 3, "{findings:?}");
        assert!(findings
            .iter()
            .all(|finding| finding.kind == FindingKind::Derived));
        assert!(findings.iter().all(Finding::needs_repair));
        assert!(findings[0].detail.contains("writable"), "{findings:?}");
        assert!(findings[1].detail.starts_with("readable by other users"));
        assert_eq!(
            mode("config.json"),
            0o644,
            "a check without repair changes nothing"
        );
        let repaired = check_privacy(&path, true).unwrap();
        assert!(repaired.iter().all(|finding| !finding.needs_repair()));
        assert_eq!(mode("block/meta"), 0o700);
        assert_eq!(mode("config.json"), 0o600);
        assert_eq!(mode("backup/lock"), 0o600);
        assert_eq!(check_privacy(&path, false).unwrap(), Vec::new());
    }
}
