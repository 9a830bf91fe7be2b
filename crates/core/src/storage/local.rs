//! [`LocalStorage`]: a directory on a local file system.
//!
//! Files are created with mode 0600 and directories with mode 0700, whatever the umask (the
//! umask can only take permissions away): a repository holds copies of every file backed up,
//! including files only their owner could read, so nothing in it is readable by other users.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::{check_name, Storage, StorageFile};
use crate::error::IoContext;
use crate::{Error, Result};

/// Mode of every file a repository creates: its owner only.
pub const FILE_MODE: u32 = 0o600;
/// Mode of every directory a repository creates: its owner only.
pub const DIRECTORY_MODE: u32 = 0o700;

/// Creates `path` and its missing parents with [`DIRECTORY_MODE`].
pub fn create_private_directories(path: &Path) -> Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(DIRECTORY_MODE)
        .create(path)
        .context_io(|| format!("creating {}", path.display()))
}

/// Files under a root directory. Durability uses `fdatasync` on files and `fsync` on
/// directories, which is what the [`Storage`] contracts ask for on Linux file systems. Files
/// and directories are created private to their owner (see the module documentation).
#[derive(Debug, Clone)]
pub struct LocalStorage {
    root: PathBuf,
    /// Directories whose own entry in their parent is known durable: this handle synced the
    /// parent while the directory existed, and did not create the directory again since.
    /// `sync_directory` stops walking up at such a directory, because every flush costs a
    /// disk cache flush and most syncs are in shard
    /// directories whose ancestors were made durable long ago.
    anchored: Arc<Mutex<HashSet<String>>>,
    /// Directory `fsync` calls made through this handle and its clones.
    directory_syncs: Arc<AtomicU64>,
}

impl LocalStorage {
    /// Storage rooted at `root`, which must exist.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self> {
        let root = root.into();
        if !root.is_dir() {
            return Err(Error::NotFound(format!("directory {}", root.display())));
        }
        Ok(LocalStorage::at(root))
    }

    fn at(root: PathBuf) -> Self {
        LocalStorage {
            root,
            anchored: Arc::default(),
            directory_syncs: Arc::default(),
        }
    }

    /// Storage rooted at `root`, creating the directory if needed.
    pub fn create(root: impl Into<PathBuf>) -> Result<Self> {
        let root = root.into();
        create_private_directories(&root)?;
        Ok(LocalStorage::at(root))
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Directory `fsync` calls made so far through this handle and its clones.
    pub fn directory_syncs(&self) -> u64 {
        self.directory_syncs.load(Ordering::Relaxed)
    }

    fn path(&self, name: &str) -> Result<PathBuf> {
        if name.is_empty() {
            return Ok(self.root.clone());
        }
        check_name(name)?;
        Ok(self.root.join(name))
    }

    /// Creates the parent directories of `name` if needed. A directory created now is new in
    /// its parent, so it and its ancestors lose their anchors until synced again.
    fn create_parents(&self, name: &str, path: &Path) -> Result<()> {
        let Some(parent) = path.parent() else {
            return Ok(());
        };
        if parent.is_dir() {
            return Ok(());
        }
        // The directories about to be created: the missing end of the chain. Existing
        // ancestors only gain an entry, which the sync of the directory itself covers.
        let mut created = Vec::new();
        let mut directory = super::parent_directory(name);
        while !directory.is_empty() && !self.path(directory)?.is_dir() {
            created.push(directory.to_string());
            directory = super::parent_directory(directory);
        }
        create_private_directories(parent)?;
        let mut anchored = self.anchored.lock();
        for directory in &created {
            anchored.remove(directory);
        }
        Ok(())
    }

    /// `fsync` of one directory; a directory that does not exist holds nothing to sync.
    fn sync_one_directory(&self, directory: &str) -> Result<()> {
        let path = self.path(directory)?;
        match File::open(&path) {
            Ok(handle) => {
                self.directory_syncs.fetch_add(1, Ordering::Relaxed);
                handle
                    .sync_all()
                    .context_io(|| format!("syncing directory {}", path.display()))
            }
            Err(source) if source.kind() == ErrorKind::NotFound => Ok(()),
            Err(source) => Err(Error::io(format!("opening {}", path.display()), source)),
        }
    }
}

impl Storage for LocalStorage {
    fn open(&self, name: &str, create: bool) -> Result<Arc<dyn StorageFile>> {
        let path = self.path(name)?;
        if create {
            self.create_parents(name, &path)?;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .mode(FILE_MODE)
            .open(&path)
            .map_err(|source| {
                if source.kind() == ErrorKind::NotFound {
                    Error::NotFound(format!("file {}", path.display()))
                } else {
                    Error::io(format!("opening {}", path.display()), source)
                }
            })?;
        Ok(Arc::new(LocalFile {
            file,
            name: name.to_string(),
            path,
        }))
    }

    fn exists(&self, name: &str) -> Result<bool> {
        Ok(self.path(name)?.exists())
    }

    fn remove(&self, name: &str) -> Result<()> {
        let path = self.path(name)?;
        match fs::remove_file(&path) {
            Err(source) if source.kind() != ErrorKind::NotFound => {
                Err(Error::io(format!("removing {}", path.display()), source))
            }
            _ => Ok(()),
        }
    }

    fn rename(&self, from: &str, to: &str) -> Result<()> {
        let (from_path, to_path) = (self.path(from)?, self.path(to)?);
        self.create_parents(to, &to_path)?;
        fs::rename(&from_path, &to_path)
            .context_io(|| format!("renaming {} to {}", from_path.display(), to_path.display()))
    }

    fn list(&self, directory: &str) -> Result<Vec<String>> {
        let path = self.path(directory)?;
        let entries = match fs::read_dir(&path) {
            Ok(entries) => entries,
            Err(source) if source.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => return Err(Error::io(format!("listing {}", path.display()), source)),
        };
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.context_io(|| format!("listing {}", path.display()))?;
            let is_file = entry
                .file_type()
                .context_io(|| format!("listing {}", path.display()))?
                .is_file();
            if let (true, Some(file_name)) = (is_file, entry.file_name().to_str()) {
                names.push(super::join(directory, file_name));
            }
        }
        names.sort();
        Ok(names)
    }

    fn sync_directory(&self, directory: &str) -> Result<()> {
        // `open(.., create)` may have created `directory` and its parents; their entries are
        // durable only once every ancestor is synced too, up to the root or to a directory
        // whose own entry is already known durable (anchored).
        self.sync_one_directory(directory)?;
        let mut current = directory;
        while !current.is_empty() && !self.anchored.lock().contains(current) {
            let parent = super::parent_directory(current);
            self.sync_one_directory(parent)?;
            self.anchored.lock().insert(current.to_string());
            current = parent;
        }
        Ok(())
    }

    fn available_bytes(&self) -> Result<Option<u64>> {
        let path = std::ffi::CString::new(self.root.as_os_str().as_encoded_bytes())
            .map_err(|_| Error::InvalidArgument(format!("{} holds a NUL", self.root.display())))?;
        let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: `path` is a valid C string and `stats` a writable statvfs for the call.
        let result = unsafe { libc::statvfs(path.as_ptr(), &mut stats) };
        if result != 0 {
            return Err(Error::io(
                format!("reading the free space of {}", self.root.display()),
                std::io::Error::last_os_error(),
            ));
        }
        Ok(Some(stats.f_bavail as u64 * stats.f_frsize as u64))
    }

    fn describe(&self) -> String {
        self.root.display().to_string()
    }
}

#[derive(Debug)]
struct LocalFile {
    file: File,
    name: String,
    path: PathBuf,
}

impl StorageFile for LocalFile {
    fn len(&self) -> Result<u64> {
        Ok(self
            .file
            .metadata()
            .context_io(|| format!("reading the size of {}", self.path.display()))?
            .len())
    }

    fn read_at(&self, offset: u64, buffer: &mut [u8]) -> Result<()> {
        self.file.read_exact_at(buffer, offset).map_err(|source| {
            if source.kind() == ErrorKind::UnexpectedEof {
                Error::corrupt(
                    format!("file {}", self.path.display()),
                    format!("{} bytes at offset {offset} lie past its end", buffer.len()),
                )
            } else {
                Error::io(
                    format!("reading {} at offset {offset}", self.path.display()),
                    source,
                )
            }
        })
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.file
            .write_all_at(data, offset)
            .context_io(|| format!("writing {} at offset {offset}", self.path.display()))
    }

    fn set_len(&self, length: u64) -> Result<()> {
        self.file
            .set_len(length)
            .context_io(|| format!("resizing {} to {length} bytes", self.path.display()))
    }

    fn sync_data(&self) -> Result<()> {
        self.file
            .sync_data()
            .context_io(|| format!("syncing {}", self.path.display()))
    }

    fn advise_will_need(&self, offset: u64, length: u64) -> Result<()> {
        // SAFETY: posix_fadvise only reads its integer arguments; the descriptor is open for
        // the lifetime of `self.file`.
        let result = unsafe {
            libc::posix_fadvise(
                self.file.as_raw_fd(),
                offset as libc::off_t,
                length as libc::off_t,
                libc::POSIX_FADV_WILLNEED,
            )
        };
        if result == 0 {
            Ok(())
        } else {
            Err(Error::io(
                format!("advising {}", self.path.display()),
                std::io::Error::from_raw_os_error(result),
            ))
        }
    }

    fn start_writeback(&self, offset: u64, length: u64) -> Result<()> {
        // SAFETY: sync_file_range only reads its integer arguments; the descriptor is open for
        // the lifetime of `self.file`.
        let result = unsafe {
            libc::sync_file_range(
                self.file.as_raw_fd(),
                offset as libc::off64_t,
                length as libc::off64_t,
                libc::SYNC_FILE_RANGE_WRITE,
            )
        };
        if result == 0 {
            Ok(())
        } else {
            Err(Error::io(
                format!("starting the writeback of {}", self.path.display()),
                std::io::Error::last_os_error(),
            ))
        }
    }

    fn name(&self) -> &str {
        &self.name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a directory sync walks up only until a directory whose entry is already durable,
    /// and a directory created again loses that status. Method: count directory fsyncs.
    #[test]
    fn directory_syncs_stop_at_anchored_directories() {
        let root = tempfile::tempdir().expect("temporary directory");
        let storage = LocalStorage::open(root.path()).expect("open");
        storage.open("a/b/c/one", true).expect("create");
        storage.sync_directory("a/b/c").expect("sync");
        // c, then b, a and the root: the whole new chain.
        assert_eq!(storage.directory_syncs(), 4);
        storage.open("a/b/c/two", true).expect("create");
        storage.sync_directory("a/b/c").expect("sync");
        assert_eq!(storage.directory_syncs(), 5, "only c itself");
        // A new sibling directory needs its parent synced once, not the whole chain.
        storage.open("a/b/d/three", true).expect("create");
        storage.sync_directory("a/b/d").expect("sync");
        assert_eq!(storage.directory_syncs(), 7, "d and b");
        // A directory removed behind our back and created again loses its anchor: its parent
        // is synced again (the parent's own entry is still durable).
        fs::remove_dir_all(root.path().join("a/b/c")).expect("remove");
        storage.clone().open("a/b/c/four", true).expect("create");
        storage.sync_directory("a/b/c").expect("sync");
        assert_eq!(storage.directory_syncs(), 9, "c and b again");
    }

    /// Goal: the writeback hint is accepted by the kernel for written ranges, empty ones and
    /// ranges past the end, and changes nothing a reader sees. Method: write, hint, read back.
    #[test]
    fn start_writeback_is_accepted_and_changes_no_data() {
        let root = tempfile::tempdir().expect("temporary directory");
        let storage = LocalStorage::open(root.path()).expect("open");
        let file = storage.open("data", true).expect("create");
        let data: Vec<u8> = (0..(1u32 << 20))
            .map(|i| (i * 7 + i / 4096) as u8)
            .collect();
        file.write_at(0, &data).expect("write");
        file.start_writeback(0, data.len() as u64)
            .expect("whole range");
        file.start_writeback(4096, 0).expect("empty range");
        file.start_writeback(2 << 20, 1 << 20)
            .expect("past the end");
        file.sync_data().expect("sync");
        let mut back = vec![0u8; data.len()];
        file.read_at(0, &mut back).expect("read");
        assert!(back == data, "the data is unchanged");
    }

    /// Goal: files and directories a storage creates are private to their owner. Method:
    /// create nested files (and a file through a rename), look at the modes.
    #[test]
    fn created_files_and_directories_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().expect("temporary directory");
        let storage = LocalStorage::create(root.path().join("face")).expect("create");
        storage.open("meta/pages/one", true).expect("create");
        super::super::write_atomically(&storage, "sub/config.json", b"{}").expect("write");
        let mode = |relative: &str| {
            fs::metadata(root.path().join(relative))
                .expect("exists")
                .permissions()
                .mode()
                & 0o777
        };
        for directory in ["face", "face/meta", "face/meta/pages", "face/sub"] {
            assert_eq!(mode(directory), DIRECTORY_MODE, "{directory}");
        }
        for file in ["face/meta/pages/one", "face/sub/config.json"] {
            assert_eq!(mode(file), FILE_MODE, "{file}");
        }
    }
}
