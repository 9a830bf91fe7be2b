//! Recreating a directory tree from its entries and contents.
//!
//! Three steps, so that metadata set early is not disturbed later:
//!
//! 1. [`TreeApplier::prepare`] creates directories, empty regular files of their final size
//!    (holes stay holes), symbolic links, FIFOs and devices;
//! 2. [`TreeApplier::write`] receives the content stream in order and writes each file's
//!    extents;
//! 3. [`TreeApplier::finish`] creates hard links, then sets owner, mode, extended attributes
//!    and times: files first, then directories deepest first (writing into a directory
//!    changes its modification time). Owner comes before mode because `chown` clears the
//!    set-user-id bits.
//!
//! Changing the owner needs privileges: when it is refused (`EPERM`) the restore goes on and
//! counts it in [`ApplyReport::owners_not_set`]; likewise for attributes the target file
//! system does not support.

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, FileExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::capture::entry_path;
use super::{EntryKind, Tree};
use crate::error::{BackupError, IoContext, Result};

/// What applying a tree did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ApplyReport {
    pub entries: u64,
    pub files: u64,
    pub hard_links: u64,
    pub bytes_written: u64,
    /// Entries whose owner could not be set (not running as root).
    pub owners_not_set: u64,
    /// Extended attributes the target file system refused.
    pub xattrs_not_set: u64,
}

/// Restores one tree into a target directory; see the module documentation.
pub struct TreeApplier {
    root: PathBuf,
    tree: Tree,
    /// (stream offset, entry index) of files with stream bytes, by stream offset.
    files: Vec<(u64, usize)>,
    current: Option<(usize, File)>,
    report: ApplyReport,
}

impl TreeApplier {
    /// Creates the entries of `tree` under `root` (created if missing).
    pub fn prepare(root: &Path, tree: Tree) -> Result<Self> {
        fs::create_dir_all(root).context_io(|| format!("creating {}", root.display()))?;
        let mut files = Vec::new();
        let mut report = ApplyReport::default();
        for (index, entry) in tree.entries.iter().enumerate() {
            let path = entry_path(root, &entry.path);
            report.entries += 1;
            match &entry.kind {
                EntryKind::Directory => {
                    if !entry.path.is_empty() {
                        match fs::create_dir(&path) {
                            Err(error) if error.kind() != io::ErrorKind::AlreadyExists => {
                                return Err(BackupError::io(
                                    format!("creating {}", path.display()),
                                    error,
                                ))
                            }
                            _ => {}
                        }
                    }
                }
                EntryKind::File {
                    size,
                    stream_offset,
                    ..
                } => {
                    remove_if_not_directory(&path)?;
                    let file = OpenOptions::new()
                        .write(true)
                        .create(true)
                        .truncate(true)
                        .open(&path)
                        .context_io(|| format!("creating {}", path.display()))?;
                    file.set_len(*size)
                        .context_io(|| format!("sizing {}", path.display()))?;
                    report.files += 1;
                    if entry.stream_bytes() > 0 {
                        files.push((*stream_offset, index));
                    }
                }
                EntryKind::Symlink { target } => {
                    remove_if_not_directory(&path)?;
                    symlink(std::ffi::OsStr::from_bytes(target), &path)
                        .context_io(|| format!("creating link {}", path.display()))?;
                }
                EntryKind::HardLink { .. } => {}
                EntryKind::Fifo => make_node(&path, libc::S_IFIFO, 0)?,
                EntryKind::CharDevice { rdev } => make_node(&path, libc::S_IFCHR, *rdev)?,
                EntryKind::BlockDevice { rdev } => make_node(&path, libc::S_IFBLK, *rdev)?,
            }
        }
        files.sort_unstable();
        Ok(TreeApplier {
            root: root.to_path_buf(),
            tree,
            files,
            current: None,
            report,
        })
    }

    /// Writes `data`, the content stream from `stream_offset`, into the files it belongs to.
    pub fn write(&mut self, mut stream_offset: u64, mut data: &[u8]) -> Result<()> {
        while !data.is_empty() {
            let slot = self
                .files
                .partition_point(|&(start, _)| start <= stream_offset)
                .checked_sub(1)
                .ok_or_else(|| {
                    BackupError::corrupt("directory tree", "stream bytes before the first file")
                })?;
            let (start, index) = self.files[slot];
            let entry = &self.tree.entries[index];
            let EntryKind::File { extents, .. } = &entry.kind else {
                unreachable!("only files are listed");
            };
            let mut position = stream_offset - start;
            let mut target = None;
            for extent in extents {
                if position < extent.length {
                    target = Some((extent.offset + position, extent.length - position));
                    break;
                }
                position -= extent.length;
            }
            let (file_offset, room) = target.ok_or_else(|| {
                BackupError::corrupt(
                    "directory tree",
                    format!("stream offset {stream_offset} is in no file"),
                )
            })?;
            let count = (room as usize).min(data.len());
            if self.current.as_ref().is_none_or(|(open, _)| *open != index) {
                let path = entry_path(&self.root, &entry.path);
                let file = OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .context_io(|| format!("opening {}", path.display()))?;
                self.current = Some((index, file));
            }
            let (_, file) = self.current.as_ref().expect("opened above");
            file.write_all_at(&data[..count], file_offset)
                .context_io(|| {
                    format!("writing {}", entry_path(&self.root, &entry.path).display())
                })?;
            self.report.bytes_written += count as u64;
            stream_offset += count as u64;
            data = &data[count..];
        }
        Ok(())
    }

    /// Creates hard links and sets metadata; see the module documentation.
    pub fn finish(mut self) -> Result<ApplyReport> {
        self.current = None;
        for entry in &self.tree.entries {
            if let EntryKind::HardLink { target } = entry.kind {
                let path = entry_path(&self.root, &entry.path);
                let original = entry_path(&self.root, &self.tree.entries[target as usize].path);
                remove_if_not_directory(&path)?;
                fs::hard_link(&original, &path)
                    .context_io(|| format!("linking {}", path.display()))?;
                self.report.hard_links += 1;
            }
        }
        let directories: Vec<usize> = (0..self.tree.entries.len())
            .filter(|&index| matches!(self.tree.entries[index].kind, EntryKind::Directory))
            .collect();
        for index in 0..self.tree.entries.len() {
            match self.tree.entries[index].kind {
                EntryKind::Directory | EntryKind::HardLink { .. } => {}
                _ => self.apply_metadata(index)?,
            }
        }
        for &index in directories.iter().rev() {
            self.apply_metadata(index)?;
        }
        Ok(self.report)
    }

    fn apply_metadata(&mut self, index: usize) -> Result<()> {
        let entry = &self.tree.entries[index];
        let path = entry_path(&self.root, &entry.path);
        let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|_| {
            BackupError::InvalidArgument(format!("{} contains a NUL byte", path.display()))
        })?;
        // SAFETY: the path is NUL-terminated and outlives the call.
        if unsafe { libc::lchown(c_path.as_ptr(), entry.uid, entry.gid) } != 0 {
            let error = io::Error::last_os_error();
            if error.raw_os_error() != Some(libc::EPERM) {
                return Err(BackupError::io(
                    format!("changing the owner of {}", path.display()),
                    error,
                ));
            }
            self.report.owners_not_set += 1;
        }
        let is_link = matches!(entry.kind, EntryKind::Symlink { .. });
        if !is_link {
            fs::set_permissions(&path, fs::Permissions::from_mode(entry.mode))
                .context_io(|| format!("setting the mode of {}", path.display()))?;
        }
        for (name, value) in &entry.xattrs {
            let c_name = CString::new(name.as_slice()).map_err(|_| {
                BackupError::corrupt("directory tree", "attribute name with a NUL byte")
            })?;
            // SAFETY: pointers are valid for the given lengths during the call.
            let result = unsafe {
                libc::lsetxattr(
                    c_path.as_ptr(),
                    c_name.as_ptr(),
                    value.as_ptr().cast(),
                    value.len(),
                    0,
                )
            };
            if result != 0 {
                let error = io::Error::last_os_error();
                match error.raw_os_error() {
                    Some(libc::ENOTSUP) | Some(libc::EPERM) => self.report.xattrs_not_set += 1,
                    _ => {
                        return Err(BackupError::io(
                            format!("setting attributes of {}", path.display()),
                            error,
                        ))
                    }
                }
            }
        }
        let times = [
            libc::timespec {
                tv_sec: entry.atime.0 as libc::time_t,
                tv_nsec: entry.atime.1 as libc::c_long,
            },
            libc::timespec {
                tv_sec: entry.mtime.0 as libc::time_t,
                tv_nsec: entry.mtime.1 as libc::c_long,
            },
        ];
        // SAFETY: the path and the two timespecs are valid during the call.
        let result = unsafe {
            libc::utimensat(
                libc::AT_FDCWD,
                c_path.as_ptr(),
                times.as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if result != 0 {
            return Err(BackupError::io(
                format!("setting the times of {}", path.display()),
                io::Error::last_os_error(),
            ));
        }
        Ok(())
    }
}

/// Removes a file or link at `path` so it can be recreated (a directory there is an error).
fn remove_if_not_directory(path: &Path) -> Result<()> {
    match fs::symlink_metadata(path) {
        Ok(metadata) if metadata.is_dir() => Err(BackupError::InvalidArgument(format!(
            "{} is a directory in the target but not in the backup",
            path.display()
        ))),
        Ok(_) => fs::remove_file(path).context_io(|| format!("replacing {}", path.display())),
        Err(_) => Ok(()),
    }
}

fn make_node(path: &Path, kind: libc::mode_t, rdev: u64) -> Result<()> {
    remove_if_not_directory(path)?;
    let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        BackupError::InvalidArgument(format!("{} contains a NUL byte", path.display()))
    })?;
    // SAFETY: the path is NUL-terminated; mknod reads only its arguments.
    let result = unsafe { libc::mknod(c_path.as_ptr(), kind | 0o600, rdev as libc::dev_t) };
    if result != 0 {
        return Err(BackupError::io(
            format!("creating {}", path.display()),
            io::Error::last_os_error(),
        ));
    }
    Ok(())
}
