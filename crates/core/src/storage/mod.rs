//! Storage backends: where a repository's files live.
//!
//! The engine needs very little from its media, and [`Storage`] states exactly that little
//! (the same spirit as redb's `StorageBackend`): named files with positional reads and writes,
//! an explicit `sync_data` that makes earlier writes durable, and directory operations that
//! become durable after `sync_directory`. Everything above this trait — containers, the page
//! store, the journal — is written against these contracts and nothing more, so that
//! [`SimulatedStorage`] can replay any crash the contracts allow.
//!
//! Containers use the trait in an object-store-friendly way: written sequentially once, synced,
//! then only read or deleted. The object-store backend (crates/remote) serves them from that
//! subset; metadata (pages, journal, catalog) stays on a local file system.

mod local;
pub mod sealed;
mod simulated;
pub mod space;

#[cfg(test)]
mod conformance;

use std::fmt::Debug;
use std::sync::Arc;

pub use local::{create_private_directories, LocalStorage, DIRECTORY_MODE, FILE_MODE};
pub use sealed::{Layout, SealedStorage, SealingKey};
pub use simulated::{CrashMode, SimulatedStorage};

use crate::{Error, Result};

/// How many consecutive names of a run of newly created files (containers, numbered in order)
/// may be missing after a crash below one that exists. A directory makes each name durable
/// before the next file is created (none missing); object storage uploads synced containers
/// in parallel and in any order (crates/remote keeps at most half this many queued or in
/// flight; the other half covers containers still open, not yet synced). Recovery of
/// uncommitted containers probes this far past a missing number.
pub const UNORDERED_CREATIONS_MAX: u64 = 16;

/// A directory of named files. Names are relative, use `/` between components, and never
/// contain empty, `.` or `..` components ([`check_name`]).
pub trait Storage: Send + Sync + Debug {
    /// Opens `name` for reading and writing. When `create` is true a missing file is created
    /// empty (with its parent directories); the new name is durable only after
    /// [`sync_directory`](Storage::sync_directory) of its parent.
    /// A missing file with `create == false` is [`Error::NotFound`].
    fn open(&self, name: &str, create: bool) -> Result<Arc<dyn StorageFile>>;

    /// True when `name` exists.
    fn exists(&self, name: &str) -> Result<bool>;

    /// Removes `name`; removing a missing file is not an error. Durable after
    /// `sync_directory` of the parent.
    fn remove(&self, name: &str) -> Result<()>;

    /// Atomically renames `from` to `to`, replacing `to`. Durable after `sync_directory` of
    /// both parents.
    fn rename(&self, from: &str, to: &str) -> Result<()>;

    /// Names (full, relative to the storage root) of the files directly inside `directory`
    /// (`""` is the root), sorted. Subdirectories are not listed. A missing directory is empty.
    fn list(&self, directory: &str) -> Result<Vec<String>>;

    /// Makes earlier creates, removes and renames of entries in `directory` durable.
    fn sync_directory(&self, directory: &str) -> Result<()>;

    /// Where this storage lives, for messages.
    fn describe(&self) -> String;

    /// Bytes that can still be written before the media is full, if the storage knows
    /// (`statvfs` for a local file system). A hint for admission control: a write can still
    /// fail with a full disk (`ErrorKind::StorageFull`), which callers handle.
    fn available_bytes(&self) -> Result<Option<u64>> {
        Ok(None)
    }

    /// True when every read either returns exactly the bytes last written there (durably or
    /// by this process) or fails: damage is an error, never a wrong value
    /// ([`SealedStorage`]). Readers that otherwise verify a whole file before trusting any of
    /// it (the backup store's catalog) can then read it page by page.
    fn authenticates_reads(&self) -> bool {
        false
    }

    /// The key of the keyed fingerprints of what this storage holds, for a storage that seals
    /// its files ([`SealedStorage`] derives it from its sealing key), so that the fingerprints
    /// a store records there say nothing about content to anyone without the key. None for a
    /// storage that keeps files as they are written.
    fn fingerprint_key(&self) -> Option<zeroize::Zeroizing<[u8; 32]>> {
        None
    }
}

/// True when `error` says the media is full (ENOSPC, a quota, a file too large).
pub fn is_full(error: &Error) -> bool {
    match error {
        Error::Io { source, .. } => {
            matches!(
                source.kind(),
                std::io::ErrorKind::StorageFull
                    | std::io::ErrorKind::QuotaExceeded
                    | std::io::ErrorKind::FileTooLarge
            ) || matches!(
                source.raw_os_error(),
                Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::EFBIG)
            )
        }
        _ => false,
    }
}

/// A full-disk error (ENOSPC): the faces pass it on as ENOSPC (FUSE, NBD).
pub fn no_space(context: String) -> Error {
    Error::io(context, std::io::Error::from_raw_os_error(libc::ENOSPC))
}

/// The name of a face's *reserve* in its storage: allocated bytes the face removes when the
/// disk fills, so that the commits that make data durable and free space still have room.
pub const RESERVE_FILE: &str = "reserve";

/// Creates [`RESERVE_FILE`] in `storage` with `bytes` of written (allocated) zeros, synced;
/// on failure removes what it wrote.
pub fn create_reserve(storage: &dyn Storage, bytes: u64) -> Result<()> {
    let file = storage.open(RESERVE_FILE, true)?;
    let zeros = vec![0u8; 1 << 20];
    let result = (0..bytes.div_ceil(zeros.len() as u64))
        .try_for_each(|index| file.write_at(index * zeros.len() as u64, &zeros))
        .and_then(|()| file.sync_data());
    if result.is_err() {
        drop(file);
        storage.remove(RESERVE_FILE)?;
    }
    result
}

/// Removes [`RESERVE_FILE`] from `storage`, durably; true when it existed.
pub fn remove_reserve(storage: &dyn Storage) -> Result<bool> {
    if !storage.exists(RESERVE_FILE)? {
        return Ok(false);
    }
    storage.remove(RESERVE_FILE)?;
    storage.sync_directory("")?;
    Ok(true)
}

/// Whether `storage` holds a face's [`RESERVE_FILE`].
pub fn reserve_exists(storage: &dyn Storage) -> Result<bool> {
    storage.exists(RESERVE_FILE)
}

/// An open file of a [`Storage`].
// No `is_empty`: callers ask for lengths to compute offsets, never for emptiness.
#[allow(clippy::len_without_is_empty)]
pub trait StorageFile: Send + Sync + Debug {
    /// Current length in bytes.
    fn len(&self) -> Result<u64>;

    /// Fills `buffer` from `offset`. Reading past the end is an error, never a short read.
    fn read_at(&self, offset: u64, buffer: &mut [u8]) -> Result<()>;

    /// Writes `data` at `offset`, growing the file if needed. Not durable until
    /// [`sync_data`](StorageFile::sync_data); after a crash any sector-aligned part of an
    /// unsynced write may or may not have reached the media.
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()>;

    /// Truncates or extends (with zeros) the file.
    fn set_len(&self, length: u64) -> Result<()>;

    /// Makes every earlier write and length change of this file durable.
    fn sync_data(&self) -> Result<()>;

    /// Tells the media that `length` bytes from `offset` will be read soon (posix_fadvise
    /// WILLNEED). A hint only.
    fn advise_will_need(&self, _offset: u64, _length: u64) -> Result<()> {
        Ok(())
    }

    /// Asks the media to start writing `length` bytes from `offset` without waiting for them
    /// (`sync_file_range(SYNC_FILE_RANGE_WRITE)`), so that a later `sync_data` waits for
    /// less. A hint only: it makes nothing durable.
    fn start_writeback(&self, _offset: u64, _length: u64) -> Result<()> {
        Ok(())
    }

    /// The file's name within its storage.
    fn name(&self) -> &str;
}

/// Checks that `name` is a relative, normalised file name.
pub fn check_name(name: &str) -> Result<()> {
    let valid = !name.is_empty()
        && !name.starts_with('/')
        && name
            .split('/')
            .all(|component| !component.is_empty() && component != "." && component != "..");
    if valid {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "storage file name {name:?} must be relative, without empty, '.' or '..' parts"
        )))
    }
}

/// The directory part of a name (`"a/b/c"` -> `"a/b"`, `"c"` -> `""`).
pub fn parent_directory(name: &str) -> &str {
    name.rfind('/').map_or("", |index| &name[..index])
}

/// Joins a directory and a file name.
pub fn join(directory: &str, name: &str) -> String {
    if directory.is_empty() {
        name.to_string()
    } else {
        format!("{directory}/{name}")
    }
}

/// Writes `data` as the whole content of `name` so that after a crash the file holds either its
/// old content or `data`, never a mix: write a temporary file, sync it, rename it over `name`,
/// sync the directory.
pub fn write_atomically(storage: &dyn Storage, name: &str, data: &[u8]) -> Result<()> {
    let temporary = format!("{name}.tmp");
    storage.remove(&temporary)?;
    let file = storage.open(&temporary, true)?;
    file.set_len(0)?;
    file.write_at(0, data)?;
    file.sync_data()?;
    drop(file);
    storage.rename(&temporary, name)?;
    storage.sync_directory(parent_directory(name))
}

/// Reads the whole content of `name`.
pub fn read_all(storage: &dyn Storage, name: &str) -> Result<Vec<u8>> {
    let file = storage.open(name, false)?;
    let length = file.len()?;
    let length = usize::try_from(length)
        .map_err(|_| Error::Limit(format!("{name} is too large to read at once")))?;
    let mut data = vec![0u8; length];
    file.read_at(0, &mut data)?;
    Ok(data)
}
