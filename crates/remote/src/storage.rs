//! [`RemoteStorage`]: a face's [`Storage`] whose containers live on object storage and whose
//! other files (the catalog, the derived segment index, the reserve) live in the local cache.
//!
//! Containers already use storage the way object storage works: written once from start to
//! end, synced, then only read or removed. A container being written is a local file (its
//! copy); its sync uploads the copy as one object (in parts when large), and a write after that
//! makes the next sync upload it again. A container opened for reading is downloaded whole
//! into its copy once per session, so a restore costs one request per container, not one per
//! chunk. The names of the remote containers are listed once per session and kept up to date
//! by this client's own changes: the session's lock keeps other writers out.
//!
//! The catalog itself is local here; [`crate::Session::commit`] publishes it. A sync hands
//! its object to uploader threads ([`uploads`]) and the commit waits for them.

mod uploads;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use onecopy_core::storage::{parent_directory, LocalStorage, Storage, StorageFile};
use onecopy_core::{Error, Result};
use parking_lot::Mutex;

use crate::catalog::Changes;
use crate::client::ObjectClient;
use uploads::Uploads;

/// Bytes of object copies kept on the local disk: beyond it the oldest copies are removed, and
/// the handles open on them let go of their files (a later read downloads the object again),
/// so that a restore of a large backup does not copy the whole repository to the cache, nor
/// keep removed copies alive through the store's cache of open handles.
pub const COPIES_BUDGET: u64 = 1 << 30;

/// A face's storage split between object storage (the directories in `remote_directories`)
/// and a local directory (everything else).
#[derive(Debug)]
pub struct RemoteStorage {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    client: Arc<ObjectClient>,
    /// The face's directory in the repository (`backup`): object names are `face/name`.
    face: String,
    /// The face's local files.
    local: LocalStorage,
    /// Local copies of remote objects: written before upload, or downloaded for reading.
    copies: LocalStorage,
    remote_directories: Vec<String>,
    /// Remote objects under the remote directories and their sizes, listed at first use.
    listing: Mutex<Option<BTreeMap<String, u64>>>,
    /// Objects created through this storage and not uploaded yet.
    pending: Mutex<HashSet<String>>,
    /// Objects whose local copy is complete.
    copied: Mutex<HashSet<String>>,
    /// One lock per object being downloaded.
    fetching: Mutex<HashMap<String, Arc<Mutex<()>>>>,
    /// Complete copies, oldest first, with their sizes, for [`Inner::copies_budget`].
    copy_order: Mutex<VecDeque<(String, u64)>>,
    /// Bytes of copies kept at most ([`COPIES_BUDGET`]; tests set less).
    copies_budget: AtomicU64,
    /// The handles of open objects on their copies, by object: a removed copy's handles are
    /// dropped, so its disk space is freed at once.
    copy_handles: Mutex<HashMap<String, Vec<Weak<CopyHandle>>>>,
    /// Objects uploaded by this command.
    uploaded: Mutex<BTreeSet<String>>,
    /// Objects downloaded by this command: kept for this command only, since a listed object
    /// no committed catalog names (a leftover) could be replaced later.
    downloaded: Mutex<BTreeSet<String>>,
    /// Objects removed through this storage: gone for the command at once, deleted from the
    /// store only after the commit ([`RemoteStorage::take_removed`]), because the published
    /// catalog may still name them until then.
    removed: Mutex<BTreeSet<String>>,
    /// Synced objects on their way to the store.
    uploads: Uploads,
    /// The local files a commit publishes, and what this command did to each
    /// ([`crate::catalog`]).
    published: BTreeMap<String, Arc<Mutex<Changes>>>,
}

impl RemoteStorage {
    /// Storage of face `face`: `remote_directories` (face-relative, such as `containers`) on
    /// `client`'s repository, the rest in `local`, copies of objects in `copies`. The changes
    /// to the local files named in `published` are recorded for the commit
    /// ([`RemoteStorage::changes`]).
    pub fn new(
        client: Arc<ObjectClient>,
        face: &str,
        local: LocalStorage,
        copies: LocalStorage,
        remote_directories: &[&str],
        published: &[&str],
    ) -> RemoteStorage {
        RemoteStorage {
            inner: Arc::new(Inner {
                client,
                face: face.to_string(),
                local,
                copies,
                remote_directories: remote_directories.iter().map(|d| d.to_string()).collect(),
                listing: Mutex::new(None),
                pending: Mutex::new(HashSet::new()),
                copied: Mutex::new(HashSet::new()),
                fetching: Mutex::new(HashMap::new()),
                copy_order: Mutex::new(VecDeque::new()),
                copies_budget: AtomicU64::new(COPIES_BUDGET),
                copy_handles: Mutex::new(HashMap::new()),
                uploaded: Mutex::new(BTreeSet::new()),
                downloaded: Mutex::new(BTreeSet::new()),
                removed: Mutex::new(BTreeSet::new()),
                uploads: Uploads::default(),
                published: published
                    .iter()
                    .map(|name| (name.to_string(), Arc::default()))
                    .collect(),
            }),
        }
    }

    /// What this command did to the published local file `name` so far.
    pub fn changes(&self, name: &str) -> Changes {
        self.inner.published[name].lock().clone()
    }

    /// Objects under the remote directories, with their sizes.
    pub fn remote_objects(&self) -> Result<BTreeMap<String, u64>> {
        self.inner.with_listing(|listing| listing.clone())
    }

    /// Adopts copies a committed command left in the copies' directory: `kept` names them
    /// with their sizes, oldest first. A copy is adopted only while an object of that name
    /// and size is listed; every other file of the directory is removed.
    pub fn adopt_copies(&self, kept: &[(String, u64)]) -> Result<()> {
        let inner = &self.inner;
        let listing = inner.with_listing(|listing| listing.clone())?;
        let mut adopted = HashSet::new();
        for (name, length) in kept {
            let present =
                inner.copies.exists(name)? && inner.copies.open(name, false)?.len()? == *length;
            if present && listing.get(name) == Some(length) {
                inner.copied.lock().insert(name.clone());
                inner.copy_order.lock().push_back((name.clone(), *length));
                adopted.insert(name.clone());
            }
        }
        for directory in &inner.remote_directories {
            remove_files_except(&inner.copies, directory, &adopted)?;
        }
        Ok(())
    }

    /// The copies to keep for later commands once this command's commit is published: the
    /// adopted ones and the objects this command uploaded, oldest first, still present.
    /// Containers are never written again under a committed name (their numbers only grow),
    /// so such a copy stays equal to its object for as long as the object exists.
    pub fn copies_to_keep(&self) -> Vec<(String, u64)> {
        let inner = &self.inner;
        let order: Vec<(String, u64)> = inner.copy_order.lock().iter().cloned().collect();
        order
            .into_iter()
            .filter(|(name, _)| inner.copied.lock().contains(name))
            .filter(|(name, _)| inner.uploaded.lock().contains(name) || !inner.downloaded(name))
            .collect()
    }

    /// Waits until every synced object is on the store; fails when an upload failed.
    pub fn wait_for_uploads(&self) -> Result<()> {
        self.inner.uploads.wait()
    }

    /// Hides the objects `names` (repository-relative, as [`RemoteStorage::take_removed`]
    /// gives them) from this command: an earlier command left them unreferenced, and they are
    /// being deleted beside it.
    pub fn forget_objects(&self, names: &[String]) -> Result<()> {
        let prefix = format!("{}/", self.inner.face);
        self.inner.with_listing(|listing| {
            for name in names {
                if let Some(name) = name.strip_prefix(&prefix) {
                    listing.remove(name);
                }
            }
        })
    }

    /// The objects removed during the command, to delete once its commit is published.
    pub fn take_removed(&self) -> Vec<String> {
        std::mem::take(&mut *self.inner.removed.lock())
            .into_iter()
            .map(|name| self.inner.object(&name))
            .collect()
    }
}

impl Inner {
    /// Records that the local file `name`, if published, is replaced as a whole.
    fn replace(&self, name: &str) {
        if let Some(changes) = self.published.get(name) {
            changes.lock().replaced = true;
        }
    }

    fn is_remote(&self, name: &str) -> bool {
        self.remote_directories.iter().any(|directory| {
            name.strip_prefix(directory.as_str())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
        })
    }

    fn object(&self, name: &str) -> String {
        format!("{}/{name}", self.face)
    }

    fn with_listing<T>(&self, f: impl FnOnce(&mut BTreeMap<String, u64>) -> T) -> Result<T> {
        let mut guard = self.listing.lock();
        if guard.is_none() {
            let mut listing = BTreeMap::new();
            for directory in &self.remote_directories {
                for object in self.client.list(&self.object(directory))? {
                    let name = object
                        .name
                        .strip_prefix(&format!("{}/", self.face))
                        .map(str::to_string);
                    if let Some(name) = name {
                        listing.insert(name, object.size);
                    }
                }
            }
            *guard = Some(listing);
        }
        Ok(f(guard.as_mut().expect("listed above")))
    }

    fn exists_remote(&self, name: &str) -> Result<bool> {
        if self.pending.lock().contains(name) {
            return Ok(true);
        }
        self.with_listing(|listing| listing.contains_key(name))
    }

    /// Downloads object `name` into its copy, unless the copy is complete already. Readers
    /// of one object wait for its one download; different objects download in parallel.
    fn fetch(&self, name: &str) -> Result<()> {
        let gate = Arc::clone(self.fetching.lock().entry(name.to_string()).or_default());
        let _downloading = gate.lock();
        if self.copied.lock().contains(name) || self.pending.lock().contains(name) {
            return Ok(());
        }
        let data = self.client.get(&self.object(name))?.ok_or_else(|| {
            Error::NotFound(format!(
                "object {} on {}",
                self.object(name),
                self.client.url()
            ))
        })?;
        let partial = format!("{name}.download");
        let file = self.copies.open(&partial, true)?;
        file.set_len(0)?;
        file.write_at(0, &data)?;
        drop(file);
        self.copies.rename(&partial, name)?;
        self.copied.lock().insert(name.to_string());
        self.downloaded.lock().insert(name.to_string());
        self.keep_copy(name, data.len() as u64)
    }

    /// Uploads the copy of object `name`: durable once the object store has acknowledged it.
    fn upload(&self, name: &str) -> Result<()> {
        let path = self.copies.root().join(name);
        let length = self.client.upload(&self.object(name), &path)?;
        self.with_listing(|listing| listing.insert(name.to_string(), length))?;
        self.pending.lock().remove(name);
        self.uploaded.lock().insert(name.to_string());
        self.downloaded.lock().remove(name);
        self.keep_copy(name, length)
    }

    fn downloaded(&self, name: &str) -> bool {
        self.downloaded.lock().contains(name)
    }

    /// Records a complete copy and removes the oldest ones beyond [`COPIES_BUDGET`].
    fn keep_copy(&self, name: &str, length: u64) -> Result<()> {
        let mut order = self.copy_order.lock();
        order.retain(|(listed, _)| listed != name);
        order.push_back((name.to_string(), length));
        let mut total: u64 = order.iter().map(|(_, length)| length).sum();
        let budget = self.copies_budget.load(Ordering::Relaxed);
        while total > budget && order.len() > 1 {
            let (oldest, length) = order.pop_front().expect("more than one copy");
            total -= length;
            if self.pending.lock().contains(&oldest) || !self.copied.lock().remove(&oldest) {
                continue;
            }
            self.copies.remove(&oldest)?;
            let handles = self.copy_handles.lock().remove(&oldest);
            for handle in handles.into_iter().flatten() {
                if let Some(handle) = handle.upgrade() {
                    *handle.file.lock() = None;
                }
            }
        }
        Ok(())
    }

    /// A handle on the copy of object `name`, registered so that the copy's removal drops it.
    fn copy_handle(&self, name: &str, file: Arc<dyn StorageFile>) -> Arc<CopyHandle> {
        let handle = Arc::new(CopyHandle {
            file: Mutex::new(Some(file)),
        });
        let mut handles = self.copy_handles.lock();
        let registered = handles.entry(name.to_string()).or_default();
        registered.retain(|handle| handle.strong_count() > 0);
        registered.push(Arc::downgrade(&handle));
        handle
    }
}

impl Storage for RemoteStorage {
    fn open(&self, name: &str, create: bool) -> Result<Arc<dyn StorageFile>> {
        let inner = &self.inner;
        if !inner.is_remote(name) {
            let Some(changes) = inner.published.get(name) else {
                return inner.local.open(name, create);
            };
            if create && !inner.local.exists(name)? {
                changes.lock().replaced = true;
            }
            return Ok(Arc::new(TrackedFile {
                file: inner.local.open(name, create)?,
                changes: Arc::clone(changes),
            }));
        }
        if create && !inner.exists_remote(name)? {
            // A name made again after its removal gets a new object: the upload replaces the
            // old one, which only a leftover can be (committed containers keep their numbers).
            inner.removed.lock().remove(name);
            inner.copies.remove(name)?;
            let copy = inner.copies.open(name, true)?;
            inner.pending.lock().insert(name.to_string());
            inner.copied.lock().insert(name.to_string());
            return Ok(Arc::new(ObjectFile {
                name: name.to_string(),
                inner: Arc::clone(inner),
                copy: inner.copy_handle(name, copy),
                dirty: AtomicBool::new(true),
            }));
        }
        if !inner.exists_remote(name)? {
            return Err(Error::NotFound(format!(
                "object {} on {}",
                inner.object(name),
                inner.client.url()
            )));
        }
        inner.fetch(name)?;
        let copy = inner.copies.open(name, false)?;
        Ok(Arc::new(ObjectFile {
            name: name.to_string(),
            inner: Arc::clone(inner),
            copy: inner.copy_handle(name, copy),
            dirty: AtomicBool::new(false),
        }))
    }

    fn exists(&self, name: &str) -> Result<bool> {
        if self.inner.is_remote(name) {
            self.inner.exists_remote(name)
        } else {
            self.inner.local.exists(name)
        }
    }

    fn remove(&self, name: &str) -> Result<()> {
        let inner = &self.inner;
        if !inner.is_remote(name) {
            inner.replace(name);
            return inner.local.remove(name);
        }
        // An upload under way would list the object after this removal.
        inner.uploads.forget(name);
        let listed = inner
            .with_listing(|listing| listing.remove(name))?
            .is_some();
        // A name made during this command and never uploaded has no object to delete.
        inner.pending.lock().remove(name);
        inner.copied.lock().remove(name);
        inner.uploaded.lock().remove(name);
        if listed {
            inner.removed.lock().insert(name.to_string());
        }
        inner.copies.remove(name)
    }

    fn rename(&self, from: &str, to: &str) -> Result<()> {
        let inner = &self.inner;
        if inner.is_remote(from) || inner.is_remote(to) {
            return Err(Error::InvalidArgument(format!(
                "objects cannot be renamed on object storage ({from} to {to})"
            )));
        }
        inner.replace(from);
        inner.replace(to);
        inner.local.rename(from, to)
    }

    fn list(&self, directory: &str) -> Result<Vec<String>> {
        let inner = &self.inner;
        if !inner.is_remote(directory) {
            return inner.local.list(directory);
        }
        let mut names: Vec<String> = inner.with_listing(|listing| {
            listing
                .keys()
                .filter(|name| parent_directory(name) == directory)
                .cloned()
                .collect()
        })?;
        names.extend(
            inner
                .pending
                .lock()
                .iter()
                .filter(|name| parent_directory(name) == directory)
                .cloned(),
        );
        names.sort();
        names.dedup();
        Ok(names)
    }

    fn sync_directory(&self, directory: &str) -> Result<()> {
        if self.inner.is_remote(directory) {
            // An object is listed from the moment its upload completes.
            return Ok(());
        }
        self.inner.local.sync_directory(directory)
    }

    fn describe(&self) -> String {
        format!("{}/{}", self.inner.client.url(), self.inner.face)
    }
}

/// An open object's handle on its local copy; `None` once the copy was removed to keep the
/// copies within their budget.
#[derive(Debug)]
struct CopyHandle {
    file: Mutex<Option<Arc<dyn StorageFile>>>,
}

/// A remote object through its local copy.
#[derive(Debug)]
struct ObjectFile {
    name: String,
    inner: Arc<Inner>,
    copy: Arc<CopyHandle>,
    /// Written since its last upload.
    dirty: AtomicBool,
}

impl ObjectFile {
    /// The copy's file, downloaded again when its copy was removed meanwhile. Objects being
    /// written are never removed (they are pending), so only read-only objects come back.
    fn file(&self) -> Result<Arc<dyn StorageFile>> {
        if let Some(file) = &*self.copy.file.lock() {
            return Ok(Arc::clone(file));
        }
        // Not under the handle's lock: the download may remove other copies, whose handles
        // another thread may hold while its own download removes this one.
        self.inner.fetch(&self.name)?;
        let opened = self.inner.copies.open(&self.name, false)?;
        self.inner
            .copy_handles
            .lock()
            .entry(self.name.clone())
            .or_default()
            .push(Arc::downgrade(&self.copy));
        Ok(Arc::clone(self.copy.file.lock().get_or_insert(opened)))
    }
}

impl StorageFile for ObjectFile {
    fn len(&self) -> Result<u64> {
        self.file()?.len()
    }

    fn read_at(&self, offset: u64, buffer: &mut [u8]) -> Result<()> {
        self.file()?.read_at(offset, buffer)
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.dirty.store(true, Ordering::Release);
        self.file()?.write_at(offset, data)
    }

    fn set_len(&self, length: u64) -> Result<()> {
        self.dirty.store(true, Ordering::Release);
        self.file()?.set_len(length)
    }

    /// Hands the copy to the uploaders ([`uploads`]): the commit waits for its upload.
    fn sync_data(&self) -> Result<()> {
        if !self.dirty.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        self.inner.uploads.queue(&self.inner, &self.name)
    }

    fn advise_will_need(&self, offset: u64, length: u64) -> Result<()> {
        self.file()?.advise_will_need(offset, length)
    }

    fn name(&self) -> &str {
        &self.name
    }
}

/// A published local file: its writes and length changes are recorded as they happen.
#[derive(Debug)]
struct TrackedFile {
    file: Arc<dyn StorageFile>,
    changes: Arc<Mutex<Changes>>,
}

impl StorageFile for TrackedFile {
    fn len(&self) -> Result<u64> {
        self.file.len()
    }

    fn read_at(&self, offset: u64, buffer: &mut [u8]) -> Result<()> {
        self.file.read_at(offset, buffer)
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        // Recorded first: a write that fails half way has still changed bytes.
        self.changes.lock().write(offset, data.len() as u64);
        self.file.write_at(offset, data)
    }

    fn set_len(&self, length: u64) -> Result<()> {
        self.changes.lock().set_len(length);
        self.file.set_len(length)
    }

    fn sync_data(&self) -> Result<()> {
        self.file.sync_data()
    }

    fn advise_will_need(&self, offset: u64, length: u64) -> Result<()> {
        self.file.advise_will_need(offset, length)
    }

    fn start_writeback(&self, offset: u64, length: u64) -> Result<()> {
        self.file.start_writeback(offset, length)
    }

    fn name(&self) -> &str {
        self.file.name()
    }
}

/// Removes the files under `directory` of `storage` (every level) not named in `keep`.
fn remove_files_except(
    storage: &LocalStorage,
    directory: &str,
    keep: &HashSet<String>,
) -> Result<()> {
    let root = storage.root().join(directory);
    let mut stack = vec![root];
    while let Some(path) = stack.pop() {
        let entries = match std::fs::read_dir(&path) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
            Err(error) => return Err(Error::io(format!("listing {}", path.display()), error)),
        };
        for entry in entries {
            let entry =
                entry.map_err(|error| Error::io(format!("listing {}", path.display()), error))?;
            let entry_path = entry.path();
            if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                stack.push(entry_path);
                continue;
            }
            let name = entry_path
                .strip_prefix(storage.root())
                .ok()
                .and_then(|relative| relative.to_str())
                .unwrap_or_default()
                .to_string();
            if !keep.contains(&name) {
                std::fs::remove_file(&entry_path).map_err(|error| {
                    Error::io(format!("removing {}", entry_path.display()), error)
                })?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;

    /// The open descriptors of this process on removed files under `root`.
    fn removed_files_held_open(root: &std::path::Path) -> usize {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
            .filter(|target| {
                let text = target.to_string_lossy();
                target.starts_with(root) && text.ends_with(" (deleted)")
            })
            .count()
    }

    /// Goal: the copies of downloaded objects stay within their budget on disk even while
    /// handles on every object stay open (the container store caches hundreds), and a handle
    /// whose copy was removed still reads its object's bytes. Method: ten objects of 64 KiB
    /// and a budget of three; open and read each, keeping every handle; count the copies'
    /// files and the removed files held open; read the first object again through its old
    /// handle and count the downloads.
    #[test]
    fn copies_stay_within_their_budget_with_handles_open() {
        let store = Arc::new(InMemory::new());
        let url = crate::url::ObjectUrl::parse("s3:http://memory/bucket/repository").unwrap();
        let client = Arc::new(ObjectClient::over(Arc::clone(&store) as _, &url).unwrap());
        let content = |index: usize| vec![index as u8 + 1; 64 << 10];
        for index in 0..10 {
            client
                .put(&format!("backup/containers/00/{index}"), content(index))
                .unwrap();
        }
        let base = tempfile::tempdir().unwrap();
        let local = LocalStorage::create(base.path().join("local")).unwrap();
        let copies_root = base.path().join("copies");
        let copies = LocalStorage::create(&copies_root).unwrap();
        let storage = RemoteStorage::new(
            Arc::clone(&client),
            "backup",
            local,
            copies,
            &["containers"],
            &[],
        );
        storage
            .inner
            .copies_budget
            .store(3 * (64 << 10), Ordering::Relaxed);
        let mut handles = Vec::new();
        for index in 0..10 {
            let file = storage
                .open(&format!("containers/00/{index}"), false)
                .unwrap();
            let mut bytes = vec![0; 64 << 10];
            file.read_at(0, &mut bytes).unwrap();
            assert_eq!(bytes, content(index));
            handles.push(file);
        }
        let kept = std::fs::read_dir(copies_root.join("containers/00"))
            .unwrap()
            .count();
        assert!(kept <= 3, "{kept} copies kept");
        assert_eq!(removed_files_held_open(&copies_root), 0);
        let gets = client.count().gets;
        let mut bytes = vec![0; 64 << 10];
        handles[0].read_at(0, &mut bytes).unwrap();
        assert_eq!(bytes, content(0));
        assert_eq!(
            client.count().gets,
            gets + 1,
            "the removed copy is downloaded again"
        );
    }
}
