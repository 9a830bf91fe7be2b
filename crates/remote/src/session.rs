//! [`RemoteRepository`] and [`Session`]: a repository on object storage, used through a local
//! cache, changed under a lease and published by one create-only PUT.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use onecopy_core::storage::{
    create_private_directories, read_all, write_atomically, LocalStorage, Storage, FILE_MODE,
};
use onecopy_core::Error as CoreError;
use serde::{Deserialize, Serialize};

use crate::catalog::{self, Changes, Published};
use crate::client::{Created, ObjectClient, RequestCount};
use crate::error::{RemoteError, Result};
use crate::lease::{Lease, LockKind};
use crate::storage::RemoteStorage;
use crate::url::ObjectUrl;

/// The repository's configuration object (the same file as a local repository's).
pub const CONFIG_OBJECT: &str = "config.json";
/// The directory of the wrapped keys.
pub const KEYS: &str = "keys";
/// The variable that, set to `off`, treats the server as one without conditional writes.
pub const CONDITIONAL_VARIABLE: &str = "ONECOPY_S3_CONDITIONAL";

/// Directories of a face that live on object storage.
const REMOTE_DIRECTORIES: [&str; 1] = ["containers"];
/// The face's files published at each commit: its catalog.
const CATALOG_FILE: &str = "catalog.redb";

/// The directory of a face's catalog snapshots (`backup/catalog`).
pub fn catalog_directory(face: &str) -> String {
    format!("{face}/catalog")
}

/// The object of catalog generation `generation`: zero-padded so that names sort by
/// generation.
pub fn catalog_object(face: &str, generation: u64) -> String {
    format!("{}/{generation:020}", catalog_directory(face))
}

/// What the local cache holds of a face, in `<cache>/<face>.state.json`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct CacheState {
    /// The catalog generation the cached catalog equals, if any.
    generation: Option<u64>,
    /// The snapshot that generation's chain starts from ([`crate::catalog`]).
    snapshot: Option<u64>,
    /// False while a writable session may have changed the cached catalog without publishing
    /// it: such a catalog is thrown away at the next session.
    clean: bool,
    /// Objects that `generation`, committed from this cache, made unreferenced and left for
    /// the next changing command ([`Removal::Later`]); void once another generation exists.
    unreferenced: Vec<String>,
}

/// When a commit deletes the objects it made unreferenced (the containers the command
/// removed, the catalog generations a snapshot superseded).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Removal {
    /// Before the commit returns: commands whose point is to free space (deletion, expiry,
    /// compaction, repair).
    Now,
    /// By the next changing command from the same cache, beside its work, while the
    /// generation it starts from is still this commit's (else that command's recovery finds
    /// them): a backup returns one DeleteObjects sooner. The lock is let go at once.
    Later,
}

/// The deletion, beside a changing command, of what the commit before it left unreferenced.
struct Cleanup {
    names: Vec<String>,
    deleting: Option<std::thread::JoinHandle<Vec<Result<()>>>>,
}

impl Cleanup {
    fn none() -> Cleanup {
        Cleanup {
            names: Vec::new(),
            deleting: None,
        }
    }

    /// Starts deleting `names` on another thread.
    fn start(client: &Arc<ObjectClient>, names: Vec<String>) -> Cleanup {
        let deleting = (!names.is_empty()).then(|| {
            let client = Arc::clone(client);
            let names = names.clone();
            std::thread::spawn(move || client.delete_all(&names))
        });
        Cleanup { names, deleting }
    }

    /// Waits for the deletion; returns the names it could not delete.
    fn finish(&mut self) -> Vec<String> {
        let Some(deleting) = self.deleting.take() else {
            return Vec::new();
        };
        let names = std::mem::take(&mut self.names);
        match deleting.join() {
            Ok(results) => names
                .into_iter()
                .zip(results)
                .filter(|(_, result)| result.is_err())
                .map(|(name, _)| name)
                .collect(),
            Err(_) => names,
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        self.finish();
    }
}

/// What a cache knows of its server, in `<cache>/server.json`.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
struct ServerState {
    conditional_writes: bool,
    probed_unix: u64,
}

/// The cache's record of its server ([`ServerState`]).
const SERVER_STATE: &str = "server.json";
/// The directory of the cache that mirrors the repository's directory.
const MIRROR: &str = "repository";

/// How long a probe of conditional writes is trusted.
const PROBE_INTERVAL_SECONDS: u64 = 24 * 3600;

/// A repository on object storage and this machine's cache of it.
pub struct RemoteRepository {
    client: Arc<ObjectClient>,
    cache: PathBuf,
    /// The cache's own files (`<face>.state.json`, `<face>.copies.json`, `server.json`).
    cache_files: LocalStorage,
    /// The mirror of the repository's directory ([`RemoteRepository::mirror`]).
    mirror_files: LocalStorage,
    /// How long a lock lives without renewal.
    lease: Duration,
    /// Sessions read every object from the store, ignoring kept copies ([`Self::verify_remote`]).
    verify_remote: std::sync::atomic::AtomicBool,
    /// `flock` on the cache: one onecopy process uses a cache at a time.
    _cache_lock: File,
}

impl std::fmt::Debug for RemoteRepository {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteRepository")
            .field("url", &self.client.url().to_string())
            .field("cache", &self.cache)
            .finish()
    }
}

impl RemoteRepository {
    /// Connects to the repository at `url`, with its cache in a directory of `cache_root`
    /// named after the URL. Waits while another onecopy process on this machine uses that
    /// cache.
    pub fn connect(url: &ObjectUrl, cache_root: &Path) -> Result<RemoteRepository> {
        let client = ObjectClient::connect(url)?;
        if std::env::var(CONDITIONAL_VARIABLE).is_ok_and(|value| value == "off") {
            client.disable_conditional();
        }
        RemoteRepository::with_client(client, cache_root, crate::lease::lease_duration())
    }

    /// [`RemoteRepository::connect`] with a client made by the caller and the lease's duration.
    pub fn with_client(
        client: ObjectClient,
        cache_root: &Path,
        lease: Duration,
    ) -> Result<RemoteRepository> {
        let client = Arc::new(client);
        let url = client.url().clone();
        let digest = ring::digest::digest(&ring::digest::SHA256, url.to_string().as_bytes());
        let name: String = digest.as_ref()[..12]
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        let cache = cache_root.join(name);
        create_private_directories(&cache)?;
        let lock_path = cache.join("lock");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(FILE_MODE)
            .open(&lock_path)
            .map_err(|error| CoreError::io(format!("opening {}", lock_path.display()), error))?;
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(CoreError::io(
                format!("locking {}", lock_path.display()),
                std::io::Error::last_os_error(),
            )
            .into());
        }
        let cache_files = LocalStorage::create(&cache)?;
        // Names the cache for a person looking at the directory; private like the rest.
        let named = url.to_string().into_bytes();
        if read_all(&cache_files, "url").ok().as_ref() != Some(&named) {
            write_atomically(&cache_files, "url", &named)?;
        }
        let mirror_files = LocalStorage::create(cache.join(MIRROR))?;
        Ok(RemoteRepository {
            client,
            cache,
            cache_files,
            mirror_files,
            lease,
            verify_remote: std::sync::atomic::AtomicBool::new(false),
            _cache_lock: lock,
        })
    }

    /// Makes later sessions read every object from the store rather than from copies kept
    /// on this machine: what `check` must verify.
    pub fn verify_remote(&self) {
        self.verify_remote
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// The client, for its request counts.
    pub fn client(&self) -> &Arc<ObjectClient> {
        &self.client
    }

    /// The local mirror of the repository's directory: `config.json`, `keys/`, and each
    /// face's local files. A local [`onecopy_core::repository::Repository`] opens it.
    pub fn mirror(&self) -> PathBuf {
        self.cache.join(MIRROR)
    }

    /// True when the repository's configuration object exists.
    pub fn exists(&self) -> Result<bool> {
        Ok(self.client.size(CONFIG_OBJECT)?.is_some())
    }

    /// Publishes a repository made in the mirror (by `Repository::init_with`): its keys, then
    /// its configuration, created only if no repository is there.
    pub fn publish_new(&self) -> Result<()> {
        self.push_keys()?;
        let config = read_all(&self.mirror_files, CONFIG_OBJECT)?;
        match self.client.put_new(CONFIG_OBJECT, config)? {
            Created::Written => Ok(()),
            Created::Exists => Err(RemoteError::CommitRefused {
                url: self.client.url().to_string(),
                detail: "a repository exists there already".into(),
            }),
        }
    }

    /// Brings the configuration and the keys into the mirror. True when the mirror's keys
    /// changed (a key file written or removed).
    pub fn pull_root(&self) -> Result<bool> {
        // Independent requests go out together: each costs a round trip to the store. The
        // keys the mirror has are fetched beside the listing, since keys rarely change.
        let cached = self.local_keys()?;
        let (config, listed, fetched) = std::thread::scope(|scope| {
            let keys = scope.spawn(|| self.client.list(KEYS));
            let fetched = scope.spawn(|| in_parallel(&cached, |name| self.client.get(name)));
            let config = self.client.get(CONFIG_OBJECT);
            (
                config,
                keys.join().expect("listing the keys does not panic"),
                fetched.join().expect("fetching the keys does not panic"),
            )
        });
        let config = config?.ok_or_else(|| RemoteError::Missing {
            what: "a repository (its config.json)".into(),
            url: format!(
                "{}; create one with `onecopy init --repo {}`",
                self.client.url(),
                self.client.url()
            ),
        })?;
        self.mirror_if_changed(CONFIG_OBJECT, &config)?;
        let remote: Vec<String> = listed?.into_iter().map(|listed| listed.name).collect();
        let mut keys: Vec<(String, Vec<u8>)> = Vec::new();
        for (name, data) in cached.iter().zip(fetched) {
            if let Some(data) = data? {
                keys.push((name.clone(), data));
            }
        }
        let missing: Vec<String> = remote
            .iter()
            .filter(|name| !keys.iter().any(|(fetched, _)| fetched == *name))
            .cloned()
            .collect();
        let more = in_parallel(&missing, |name| {
            self.client.get(name)?.ok_or_else(|| RemoteError::Missing {
                what: format!("key {name}"),
                url: self.client.url().to_string(),
            })
        });
        for (name, data) in missing.into_iter().zip(more) {
            keys.push((name, data?));
        }
        let mut changed = false;
        for (name, data) in &keys {
            if remote.contains(name) {
                changed |= self.mirror_if_changed(name, data)?;
            }
        }
        for local in cached {
            if !remote.contains(&local) {
                self.mirror_files.remove(&local)?;
                changed = true;
            }
        }
        Ok(changed)
    }

    /// Writes `data` as the mirror's file `name` unless the file holds it already (a write
    /// costs two disk flushes; most commands find the configuration and keys unchanged).
    /// True when it wrote.
    fn mirror_if_changed(&self, name: &str, data: &[u8]) -> Result<bool> {
        if read_all(&self.mirror_files, name).ok().as_deref() == Some(data) {
            return Ok(false);
        }
        write_atomically(&self.mirror_files, name, data)?;
        Ok(true)
    }

    /// Makes the remote keys equal the mirror's: uploads new or changed key files, removes
    /// the ones the mirror no longer has.
    pub fn push_keys(&self) -> Result<()> {
        let local = self.local_keys()?;
        for name in &local {
            let data = read_all(&self.mirror_files, name)?;
            if self.client.get(name)?.as_deref() != Some(data.as_slice()) {
                self.client.put(name, data)?;
            }
        }
        for remote in self.client.list(KEYS)? {
            if !local.contains(&remote.name) {
                self.client.delete(&remote.name)?;
            }
        }
        Ok(())
    }

    /// The mirror's key files (`keys/<id>`), without temporary files of interrupted writes.
    fn local_keys(&self) -> Result<Vec<String>> {
        Ok(self
            .mirror_files
            .list(KEYS)?
            .into_iter()
            .filter(|name| !name.ends_with(".tmp"))
            .collect())
    }

    /// Opens face `face` (`backup`) for a command: takes the lock (`kind`), makes the cached
    /// catalog equal the newest published one, and returns the session whose storage the
    /// face opens.
    pub fn session(
        &self,
        face: &str,
        kind: LockKind,
        command: &str,
        wait: Duration,
    ) -> Result<Session> {
        let lease = Lease::acquire(Arc::clone(&self.client), kind, command, self.lease, wait)?;
        self.attach(face, kind, lease)
    }

    /// [`Self::pull_root`] and [`Self::session`] at once: the lock is taken while the
    /// configuration and keys are fetched, since neither waits for the other. Returns
    /// [`Self::pull_root`]'s answer with the session.
    pub fn pull_root_then_session(
        &self,
        face: &str,
        kind: LockKind,
        command: &str,
        wait: Duration,
    ) -> Result<(bool, Session)> {
        let (pulled, lease) = std::thread::scope(|scope| {
            let lease = scope.spawn(|| {
                Lease::acquire(Arc::clone(&self.client), kind, command, self.lease, wait)
            });
            let pulled = self.pull_root();
            (
                pulled,
                lease.join().expect("taking the lock does not panic"),
            )
        });
        // Without a repository the lock is dropped (and removed) with the error.
        let lease = lease?;
        let keys_changed = pulled?;
        Ok((keys_changed, self.attach(face, kind, lease)?))
    }

    /// The session of a command holding `lease`.
    fn attach(&self, face: &str, kind: LockKind, lease: Lease) -> Result<Session> {
        let writable = kind == LockKind::Exclusive;
        if writable && self.client.conditional() {
            self.learn_conditional()?;
        }
        let local = LocalStorage::create(self.mirror().join(face))?;
        let copies_root = self.cache.join("objects").join(face);
        let kept_name = format!("{face}.copies.json");
        let kept: Vec<(String, u64)> = read_all(&self.cache_files, &kept_name)
            .ok()
            .and_then(|data| serde_json::from_slice(&data).ok())
            .unwrap_or_default();
        let copies = LocalStorage::create(&copies_root)?;
        let storage = Arc::new(RemoteStorage::new(
            Arc::clone(&self.client),
            face,
            local.clone(),
            copies,
            &REMOTE_DIRECTORIES,
            &[CATALOG_FILE],
        ));
        // Every command lists the containers; that listing goes out beside the catalog's.
        let (generations, listed) = std::thread::scope(|scope| {
            let listing = scope.spawn(|| storage.remote_objects().map(drop));
            let generations = self.generations(face);
            (generations, listing.join().expect("listing does not panic"))
        });
        listed?;
        // A check reads what the store holds, not this machine's copies of it.
        let verify_remote = self
            .verify_remote
            .load(std::sync::atomic::Ordering::Relaxed);
        storage.adopt_copies(if verify_remote { &[] } else { &kept })?;
        let generations = generations?;
        let newest = generations.last().map(|&(generation, _)| generation);
        let state_name = format!("{face}.state.json");
        let state: CacheState = read_all(&self.cache_files, &state_name)
            .ok()
            .and_then(|data| serde_json::from_slice(&data).ok())
            .unwrap_or_default();
        // What the last commit from this cache left unreferenced is this writer's to delete,
        // beside its work, as long as no other generation came after it; the store must not
        // see those containers (its recovery would remove them again).
        let carried = if newest.is_some() && state.generation == newest {
            state.unreferenced.clone()
        } else {
            Vec::new()
        };
        let cleanup = if writable {
            storage.forget_objects(&carried)?;
            Cleanup::start(&self.client, carried.clone())
        } else {
            Cleanup::none()
        };
        let snapshot = if state.generation == newest && state.clean && !verify_remote {
            state.snapshot
        } else {
            // Until the cached catalog is whole again, nothing is cached.
            write_atomically(
                &self.cache_files,
                &state_name,
                &serde_json::to_vec(&CacheState::default()).expect("cache states serialise"),
            )?;
            // The segment index is derived from the catalog; it is rebuilt for the new one.
            for name in local.list("meta")? {
                local.remove(&name)?;
            }
            let cached = state.generation.filter(|_| state.clean && !verify_remote);
            self.bring_catalog(face, &local, cached.zip(state.snapshot), newest)?
        };
        write_atomically(
            &self.cache_files,
            &state_name,
            &serde_json::to_vec(&CacheState {
                generation: newest,
                snapshot,
                clean: !writable,
                // Kept until a writer's commit says what is left of them.
                unreferenced: carried,
            })
            .expect("cache states serialise"),
        )?;
        if writable && newest.is_none() {
            // Containers without any published catalog were uploaded by a first command that
            // never committed: nothing refers to them.
            for name in storage.remote_objects()?.into_keys() {
                storage.remove(&name)?;
            }
        }
        Ok(Session {
            client: Arc::clone(&self.client),
            face: face.to_string(),
            lease,
            storage,
            local,
            cache_files: self.cache_files.clone(),
            state_name,
            kept_name,
            generations,
            snapshot,
            writable,
            cleanup,
        })
    }

    /// Makes the local catalog of `face` equal generation `newest` (none: no catalog), from
    /// the cached generation and its snapshot when `cached` names them, else from the newest
    /// snapshot. Returns the snapshot the newest generation's chain starts from.
    fn bring_catalog(
        &self,
        face: &str,
        local: &LocalStorage,
        cached: Option<(u64, u64)>,
        newest: Option<u64>,
    ) -> Result<Option<u64>> {
        let Some(newest) = newest else {
            for name in local.list("")? {
                if name.starts_with(CATALOG_FILE) {
                    local.remove(&name)?;
                }
            }
            return Ok(None);
        };
        let fetch = |generation: u64| -> Result<Published> {
            let object = catalog_object(face, generation);
            let data = self
                .client
                .get(&object)?
                .ok_or_else(|| RemoteError::Missing {
                    what: format!("catalog {object}"),
                    url: self.client.url().to_string(),
                })?;
            let what = format!("catalog {object} on {}", self.client.url());
            let published = Published::decode(&what, &data)?;
            if published.generation() != generation {
                return Err(CoreError::Corrupt {
                    what,
                    detail: format!("it holds generation {}", published.generation()),
                }
                .into());
            }
            Ok(published)
        };
        let last = fetch(newest)?;
        let snapshot = last.snapshot();
        // The cached generation serves when it belongs to the newest chain, is behind it, and
        // its file is still there.
        let from = match cached {
            Some((generation, cached_snapshot))
                if cached_snapshot == snapshot
                    && generation < newest
                    && local.exists(CATALOG_FILE)? =>
            {
                generation + 1
            }
            _ => snapshot,
        };
        let between: Vec<u64> = (from..newest).collect();
        let mut chain = Vec::with_capacity(between.len() + 1);
        for published in in_parallel(&between, |&generation| fetch(generation)) {
            chain.push(published?);
        }
        chain.push(last);
        let mut file = None;
        for published in chain {
            match published {
                Published::Snapshot { bytes, .. } => {
                    drop(file.take());
                    write_atomically(local, CATALOG_FILE, &bytes)?;
                }
                Published::Delta {
                    generation,
                    snapshot: chain_start,
                    changes,
                } => {
                    if chain_start != snapshot {
                        return Err(CoreError::Corrupt {
                            what: format!(
                                "catalog {} on {}",
                                catalog_object(face, generation),
                                self.client.url()
                            ),
                            detail: format!(
                                "a delta of the chain from snapshot {snapshot} names snapshot \
                                 {chain_start}"
                            ),
                        }
                        .into());
                    }
                    if file.is_none() {
                        file = Some(local.open(CATALOG_FILE, false)?);
                    }
                    changes.apply(file.as_deref().expect("opened above"))?;
                }
            }
        }
        if let Some(file) = file {
            file.sync_data()?;
        }
        Ok(Some(snapshot))
    }

    /// Whether the server enforces create-only PUTs: probed once a day per cache (three
    /// requests), remembered in `<cache>/server.json` meanwhile.
    fn learn_conditional(&self) -> Result<()> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let known: Option<ServerState> = read_all(&self.cache_files, SERVER_STATE)
            .ok()
            .and_then(|data| serde_json::from_slice(&data).ok())
            .filter(|state: &ServerState| {
                now.saturating_sub(state.probed_unix) < PROBE_INTERVAL_SECONDS
            });
        let conditional_writes = match known {
            Some(state) => state.conditional_writes,
            None => {
                let conditional_writes = self
                    .client
                    .probe_conditional(&format!("locks/probe-{}", crate::lease::random_hex()))?;
                write_atomically(
                    &self.cache_files,
                    SERVER_STATE,
                    &serde_json::to_vec(&ServerState {
                        conditional_writes,
                        probed_unix: now,
                    })
                    .expect("server states serialise"),
                )?;
                conditional_writes
            }
        };
        if !conditional_writes {
            self.client.disable_conditional();
        }
        Ok(())
    }

    /// The face's published catalog generations with their objects' sizes, oldest first.
    fn generations(&self, face: &str) -> Result<Vec<(u64, u64)>> {
        let directory = catalog_directory(face);
        let mut generations: Vec<(u64, u64)> = self
            .client
            .list(&directory)?
            .into_iter()
            .filter_map(|listed| {
                let generation = listed
                    .name
                    .strip_prefix(&format!("{directory}/"))?
                    .parse()
                    .ok()?;
                Some((generation, listed.size))
            })
            .collect();
        generations.sort_unstable();
        Ok(generations)
    }
}

/// One command's use of a face: the lease, and the storage it opens.
pub struct Session {
    client: Arc<ObjectClient>,
    face: String,
    lease: Lease,
    storage: Arc<RemoteStorage>,
    /// The face's local files (its catalog).
    local: LocalStorage,
    cache_files: LocalStorage,
    /// `<face>.state.json` in the cache.
    state_name: String,
    /// The copies of objects kept for later commands (`<face>.copies.json` in the cache).
    kept_name: String,
    /// The published generations when the session began, with their objects' sizes.
    generations: Vec<(u64, u64)>,
    /// The snapshot the newest generation's chain starts from.
    snapshot: Option<u64>,
    writable: bool,
    /// The deletion of what the previous commit left unreferenced.
    cleanup: Cleanup,
}

/// What [`Session::commit`] published.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Commit {
    /// The new catalog generation.
    pub generation: u64,
    /// Whether the generation is a snapshot of the catalog (else a delta).
    pub snapshot: bool,
    /// Bytes of the published object.
    pub catalog_bytes: u64,
    /// With [`Removal::Now`], objects the commit made unreferenced that could not be deleted
    /// (the next changing command removes them).
    pub leftovers: u64,
    /// Requests of the whole session so far.
    pub requests: RequestCount,
}

impl Session {
    /// The face's storage.
    pub fn storage(&self) -> Arc<dyn Storage> {
        Arc::clone(&self.storage) as Arc<dyn Storage>
    }

    /// Publishes the face's catalog as the next generation: the commit point of everything
    /// the command did. Call it after the face closed its catalog. It first waits for the
    /// uploads of the synced containers, which the catalog names.
    ///
    /// The PUT is create-only: when another client published that generation first (its
    /// lease outlived ours), nothing is committed and the uploaded containers become
    /// leftovers that the next writer removes. Without conditional writes the lease alone
    /// keeps writers apart ([`Lease::check_held`] just before the PUT).
    pub fn commit(mut self, removal: Removal) -> Result<Option<Commit>> {
        assert!(self.writable, "a shared session has nothing to commit");
        if !self.local.exists(CATALOG_FILE)? {
            return Ok(None);
        }
        self.storage.wait_for_uploads()?;
        let generation = self.generations.last().map_or(1, |&(newest, _)| newest + 1);
        let changes = self.storage.changes(CATALOG_FILE);
        let Publishable {
            published,
            data,
            superseded,
        } = self.publishable(generation, &changes)?;
        let snapshot = matches!(published, Published::Snapshot { .. });
        let catalog_bytes = data.len() as u64;
        self.lease.check_held()?;
        let object = catalog_object(&self.face, generation);
        if self.client.put_new(&object, data)? == Created::Exists {
            return Err(RemoteError::CommitRefused {
                url: self.client.url().to_string(),
                detail: format!(
                    "another client published catalog generation {generation} while this one \
                     worked (its lock had lapsed); run the command again"
                ),
            });
        }
        // What the previous commit left and this session's cleanup could not delete.
        let left_before = self.cleanup.finish();
        // Objects the command removed may go now that no published catalog names them, and
        // so may the generations a snapshot superseded: every reader holds a shared lock,
        // which this exclusive one excluded, so none is reading them.
        let unreferenced: Vec<String> = self
            .storage
            .take_removed()
            .into_iter()
            .chain(
                superseded
                    .into_iter()
                    .map(|old| catalog_object(&self.face, old)),
            )
            .chain(left_before)
            .collect();
        let (left, leftovers) = match removal {
            // The lock goes when the session does (its marker).
            Removal::Later => (unreferenced, 0),
            Removal::Now => {
                // The lock goes in the same request: the command is done. What fails to go
                // is left for the next writer (a lock left behind lapses by itself).
                let lock = self.lease.release_by_caller();
                let mut names = unreferenced;
                names.push(lock.clone());
                let results = self.client.delete_all(&names);
                let failed: Vec<String> = names
                    .into_iter()
                    .zip(results)
                    .filter(|(name, result)| result.is_err() && *name != lock)
                    .map(|(name, _)| name)
                    .collect();
                let leftovers = failed.len() as u64;
                (failed, leftovers)
            }
        };
        write_atomically(
            &self.cache_files,
            &self.state_name,
            &serde_json::to_vec(&CacheState {
                generation: Some(generation),
                snapshot: Some(published.snapshot()),
                clean: true,
                unreferenced: left,
            })
            .expect("cache states serialise"),
        )?;
        // The containers this command uploaded are now named by a published catalog: their
        // copies serve later commands (the next backup's reverse deduplication reads them).
        write_atomically(
            &self.cache_files,
            &self.kept_name,
            &serde_json::to_vec(&self.storage.copies_to_keep()).expect("names serialise"),
        )?;
        Ok(Some(Commit {
            generation,
            snapshot,
            catalog_bytes,
            leftovers,
            requests: self.client.count(),
        }))
    }
}

impl Session {
    /// What the commit of `generation` publishes, encoded, with the generations it
    /// supersedes: a delta of `changes` while the chain stays lighter than its snapshot
    /// ([`catalog::prefer_snapshot`]), else a snapshot of the whole catalog.
    fn publishable(&self, generation: u64, changes: &Changes) -> Result<Publishable> {
        let older = |bound: u64| -> Vec<u64> {
            self.generations
                .iter()
                .map(|&(old, _)| old)
                .filter(|&old| old < bound)
                .collect()
        };
        if let (Some(snapshot), false) = (self.snapshot, changes.replaced) {
            let file = self.local.open(CATALOG_FILE, false)?;
            let delta = Published::Delta {
                generation,
                snapshot,
                changes: changes.delta(file.as_ref())?,
            };
            let data = delta.encode()?;
            let size = |wanted: &dyn Fn(u64) -> bool| -> u64 {
                self.generations
                    .iter()
                    .filter(|&&(old, _)| wanted(old))
                    .map(|&(_, size)| size)
                    .sum()
            };
            let snapshot_bytes = size(&|old| old == snapshot);
            let chain_bytes = size(&|old| old > snapshot);
            if !catalog::prefer_snapshot(snapshot_bytes, chain_bytes, data.len() as u64) {
                // Generations before the chain's snapshot are leftovers of a failed removal.
                return Ok(Publishable {
                    published: delta,
                    data,
                    superseded: older(snapshot),
                });
            }
        }
        let published = Published::Snapshot {
            generation,
            bytes: read_all(&self.local, CATALOG_FILE)?,
        };
        let data = published.encode()?;
        Ok(Publishable {
            published,
            data,
            superseded: older(generation),
        })
    }
}

/// What a commit publishes ([`Session::publishable`]).
struct Publishable {
    published: Published,
    /// Its object's bytes.
    data: Vec<u8>,
    /// The generations it supersedes.
    superseded: Vec<u64>,
}

#[cfg(test)]
impl Session {
    /// Stops renewing the lease (a client frozen longer than its lease).
    pub(crate) fn stop_renewing(&mut self) {
        self.lease.stop_renewing();
    }

    /// Waits for the uploads of the synced containers, as the commit does first.
    pub(crate) fn wait_for_uploads(&self) -> Result<()> {
        Ok(self.storage.wait_for_uploads()?)
    }
}

#[cfg(test)]
mod tests;

/// Requests sent at once, at most.
const REQUESTS_IN_FLIGHT: usize = 8;

/// `request` for every item, [`REQUESTS_IN_FLIGHT`] at a time; results in the items' order.
fn in_parallel<T: Sync, R: Send>(
    items: &[T],
    request: impl Fn(&T) -> Result<R> + Sync,
) -> Vec<Result<R>> {
    if items.len() <= 1 {
        return items.iter().map(&request).collect();
    }
    let per_thread = items.len().div_ceil(REQUESTS_IN_FLIGHT);
    std::thread::scope(|scope| {
        let threads: Vec<_> = items
            .chunks(per_thread)
            .map(|part| scope.spawn(|| part.iter().map(&request).collect::<Vec<_>>()))
            .collect();
        threads
            .into_iter()
            .flat_map(|thread| thread.join().expect("a request thread does not panic"))
            .collect()
    })
}
