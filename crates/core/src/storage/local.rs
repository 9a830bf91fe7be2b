//! [`LocalStorage`]: a directory on a local file system.

use std::fs::{self, File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{check_name, Storage, StorageFile};
use crate::error::IoContext;
use crate::{Error, Result};

/// Files under a root directory. Durability uses `fdatasync` on files and `fsync` on
/// directories, which is what the [`Storage`] contracts ask for on Linux file systems.
#[derive(Debug, Clone)]
pub struct LocalStorage {
    root: PathBuf,
}

impl LocalStorage {
    /// Storage rooted at `root`, which must exist.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self> {
        let root = root.into();
        if !root.is_dir() {
            return Err(Error::NotFound(format!("directory {}", root.display())));
        }
        Ok(LocalStorage { root })
    }

    /// Storage rooted at `root`, creating the directory if needed.
    pub fn create(root: impl Into<PathBuf>) -> Result<Self> {
        let root = root.into();
        fs::create_dir_all(&root).context_io(|| format!("creating {}", root.display()))?;
        Ok(LocalStorage { root })
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, name: &str) -> Result<PathBuf> {
        if name.is_empty() {
            return Ok(self.root.clone());
        }
        check_name(name)?;
        Ok(self.root.join(name))
    }
}

impl Storage for LocalStorage {
    fn open(&self, name: &str, create: bool) -> Result<Arc<dyn StorageFile>> {
        let path = self.path(name)?;
        if create {
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent)
                    .context_io(|| format!("creating {}", parent.display()))?;
            }
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
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
        if let Some(parent) = to_path.parent() {
            fs::create_dir_all(parent).context_io(|| format!("creating {}", parent.display()))?;
        }
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
        // durable only once every ancestor up to the root is synced too.
        let mut current = directory;
        loop {
            let path = self.path(current)?;
            match File::open(&path) {
                Ok(handle) => handle
                    .sync_all()
                    .context_io(|| format!("syncing directory {}", path.display()))?,
                // A directory that was never created holds nothing to make durable.
                Err(source) if source.kind() == ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(Error::io(format!("opening {}", path.display()), source))
                }
            }
            if current.is_empty() {
                return Ok(());
            }
            current = super::parent_directory(current);
        }
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

    fn name(&self) -> &str {
        &self.name
    }
}
