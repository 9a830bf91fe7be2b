//! Recreating a directory tree from its entries and contents, confined beneath the target.
//!
//! 1. [`TreeApplier::prepare`] checks before it changes anything: the tree must pass
//!    [`Tree::validate`] (an entry that could lead outside the target is corruption); a
//!    missing target is created; a target that holds entries is refused unless
//!    [`ApplyOptions::overwrite`] is set, with a message naming what would be replaced; with
//!    overwriting, a directory of the target where the backup has something else is refused
//!    too, since replacing it would delete what it holds. Then it creates directories,
//!    empty regular files of their final size (holes stay holes), symbolic links, FIFOs and
//!    devices. New directories are mode 0700 until step 3, so nobody else can add entries
//!    beneath them meanwhile.
//! 2. [`TreeApplier::write`] receives the content stream in order and writes each file's
//!    extents; bytes that belong to no file are skipped.
//! 3. [`TreeApplier::finish`] creates hard links, then sets owner, mode, extended attributes
//!    and times: files first, then directories deepest first (writing into a directory
//!    changes its modification time). Owner comes before mode because `chown` clears the
//!    set-user-id bits.
//!
//! Every operation goes through [`Beneath`]: relative to directory descriptors, without
//! following links, so that nothing outside the target is created, written or changed
//! whatever the target holds. A file is written and its metadata set only through a
//! descriptor of the file this restore created (checked by inode), so a name swapped for a
//! link or for a hard link to a file elsewhere is never written through.
//!
//! Overwriting means: an entry of the backup replaces the target's non-directory of the same
//! name (removed, then created anew; never opened for writing, as it may be a hard link to a
//! file elsewhere); a directory of the target where the backup has a directory is kept and
//! receives the backup's metadata; entries of the target that the backup does not have stay
//! as they are. So a restore never deletes what the backup does not replace, as `tar x` and
//! restic's restore (without `--delete`) behave; to get exactly the backup, restore into a
//! new directory.
//!
//! Changing the owner needs privileges: when it is refused (`EPERM`) the restore goes on and
//! counts it in [`ApplyReport::owners_not_set`]; likewise for attributes the target file
//! system does not support. Not guaranteed: a failed restore leaves a partial target.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::beneath::{
    chmod_at, chown_at, fchmod, fchown, fset_times, fset_xattr, is_directory, is_regular, link_at,
    mkdir_at, mknod_at, open_at, set_times_at, set_xattr_at, stat_at, stat_fd, symlink_at,
    unlink_at, Beneath,
};
use super::{EntryKind, Tree, TreeEntry};
use crate::error::{escape_path, BackupError, Result};
use onecopy_core::error::IoContext;

/// Names shown in a message about a target, at most.
const NAMES_SHOWN: usize = 5;

/// What applying a tree did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ApplyReport {
    pub entries: u64,
    pub files: u64,
    pub hard_links: u64,
    pub bytes_written: u64,
    /// Entries of the target that the backup's entries replaced (with overwriting; a
    /// directory kept with the backup's metadata counts too).
    pub replaced: u64,
    /// Entries whose owner could not be set (not running as root).
    pub owners_not_set: u64,
    /// Extended attributes the target file system refused.
    pub xattrs_not_set: u64,
}

/// How to apply a tree.
#[derive(Clone, Debug, Default)]
pub struct ApplyOptions {
    /// The backup, as `SERIES@VERSION`, for messages.
    pub backup: String,
    /// Replace the target's entries that the backup has (see the module documentation);
    /// without it a target that holds anything is refused.
    pub overwrite: bool,
}

/// Restores one tree into a target directory; see the module documentation.
pub struct TreeApplier {
    /// The target as the caller named it, for messages.
    root: PathBuf,
    target: Beneath,
    tree: Tree,
    overwrite: bool,
    /// (stream offset, entry index) of files with stream bytes, in stream order.
    files: Vec<(u64, usize)>,
    /// (device, inode) of the regular files this restore created, by entry index.
    created: HashMap<usize, (u64, u64)>,
    current: Option<(usize, File)>,
    report: ApplyReport,
}

/// `relative` under the target `root`, for messages.
fn display(root: &Path, relative: &[u8]) -> PathBuf {
    if relative.is_empty() {
        root.to_path_buf()
    } else {
        root.join(OsStr::from_bytes(relative))
    }
}

/// An I/O error on `relative` in the target `root`.
fn target_error(root: &Path, doing: &str, relative: &[u8], error: io::Error) -> BackupError {
    let detail = match error.raw_os_error() {
        Some(libc::ELOOP | libc::ENOTDIR) => io::Error::new(
            error.kind(),
            format!(
                "{error} (a symbolic link or file took the place of a directory during the \
                 restore; nothing is followed)"
            ),
        ),
        _ => error,
    };
    BackupError::io(
        format!("{doing} {}", display(root, relative).display()),
        detail,
    )
}

/// A list of names for a message: the first few, then how many more.
fn names(paths: &[Vec<u8>], total: usize) -> String {
    let mut shown: Vec<String> = paths
        .iter()
        .take(NAMES_SHOWN)
        .map(|path| escape_path(path))
        .collect();
    if total > shown.len() {
        shown.push(format!("and {} more", total - shown.len()));
    }
    shown.join(", ")
}

fn timespecs(entry: &TreeEntry) -> [libc::timespec; 2] {
    [
        libc::timespec {
            tv_sec: entry.atime.0 as libc::time_t,
            tv_nsec: entry.atime.1 as libc::c_long,
        },
        libc::timespec {
            tv_sec: entry.mtime.0 as libc::time_t,
            tv_nsec: entry.mtime.1 as libc::c_long,
        },
    ]
}

impl TreeApplier {
    /// Checks `tree` and the target `root` (created if missing), then creates the entries;
    /// see the module documentation. `content_bytes` is where the tree starts in the
    /// backup's stream (file contents lie before it).
    pub fn prepare(
        root: &Path,
        tree: Tree,
        content_bytes: u64,
        options: &ApplyOptions,
    ) -> Result<Self> {
        tree.validate(content_bytes).map_err(|problem| {
            BackupError::corrupt_tree(&options.backup, &problem.path, problem.detail)
        })?;
        let existed = match fs::metadata(root) {
            Ok(metadata) if metadata.is_dir() => true,
            Ok(_) => {
                return Err(BackupError::InvalidArgument(format!(
                    "{} is not a directory: {} is a directory backup; restore it into a \
                     directory, or to standard output (-) as a tar archive",
                    root.display(),
                    options.backup
                )))
            }
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                fs::create_dir_all(root).context_io(|| format!("creating {}", root.display()))?;
                false
            }
            Err(error) => {
                return Err(BackupError::io(
                    format!("reading {}", root.display()),
                    error,
                ))
            }
        };
        let target = Beneath::open(root).context_io(|| format!("opening {}", root.display()))?;
        let mut applier = TreeApplier {
            root: root.to_path_buf(),
            target,
            tree,
            overwrite: options.overwrite,
            files: Vec::new(),
            created: HashMap::new(),
            current: None,
            report: ApplyReport::default(),
        };
        if existed {
            applier.check_target(root, options)?;
        }
        for index in 0..applier.tree.entries.len() {
            applier.create(index)?;
        }
        Ok(applier)
    }

    /// Refuses a target that holds entries unless overwriting, and with overwriting a target
    /// directory where the backup has something else; changes nothing.
    fn check_target(&mut self, root: &Path, options: &ApplyOptions) -> Result<()> {
        let mut present: Vec<Vec<u8>> = Vec::new();
        let mut present_count = 0usize;
        for child in fs::read_dir(root).context_io(|| format!("listing {}", root.display()))? {
            let child = child.context_io(|| format!("listing {}", root.display()))?;
            if present.len() < NAMES_SHOWN {
                present.push(child.file_name().as_bytes().to_vec());
            }
            present_count += 1;
        }
        if present_count == 0 {
            return Ok(());
        }
        present.sort();
        let mut replaced: Vec<Vec<u8>> = Vec::new();
        let mut replaced_count = 0usize;
        let mut conflicts: Vec<Vec<u8>> = Vec::new();
        let mut conflict_count = 0usize;
        for entry in self.tree.entries.iter().skip(1) {
            let status = self
                .target
                .lookup(&entry.path)
                .map_err(|error| target_error(&self.root, "reading", &entry.path, error))?;
            let Some(status) = status else { continue };
            replaced_count += 1;
            if replaced.len() < NAMES_SHOWN {
                replaced.push(entry.path.clone());
            }
            if is_directory(&status) && entry.kind != EntryKind::Directory {
                conflict_count += 1;
                if conflicts.len() < NAMES_SHOWN {
                    conflicts.push(entry.path.clone());
                }
            }
        }
        if !options.overwrite {
            let replacing = if replaced_count == 0 {
                "none of them but mix its entries with them".to_string()
            } else {
                format!(
                    "{replaced_count} entries ({})",
                    names(&replaced, replaced_count)
                )
            };
            return Err(BackupError::TargetNotEmpty {
                target: root.display().to_string(),
                detail: format!(
                    "is not empty ({present_count} entries: {}); restoring {} there would \
                     replace {replacing}. Nothing was written: restore into a new or empty \
                     directory, or pass --overwrite to replace what the backup has (entries \
                     it does not have stay)",
                    names(&present, present_count),
                    options.backup
                ),
            });
        }
        if conflict_count > 0 {
            return Err(BackupError::TargetConflict {
                target: root.display().to_string(),
                detail: format!(
                    "{conflict_count} directories of the target are not directories in {} ({})",
                    options.backup,
                    names(&conflicts, conflict_count)
                ),
            });
        }
        Ok(())
    }

    /// Makes room for entry `index` (with overwriting: removes a non-directory of that name)
    /// and creates it; a directory already there is kept.
    fn create(&mut self, index: usize) -> Result<()> {
        self.report.entries += 1;
        let entry = &self.tree.entries[index];
        if entry.path.is_empty() {
            return Ok(()); // The target itself: metadata only, in `finish`.
        }
        if let EntryKind::HardLink { .. } = entry.kind {
            return Ok(()); // Linked in `finish`, once its file is written.
        }
        let path = entry.path.as_slice();
        let root = self.root.as_path();
        let target = &mut self.target;
        let (parent, name) = target
            .parent(path)
            .map_err(|error| target_error(root, "reaching", path, error))?;
        let existing = stat_at(parent, name);
        let existing = match existing {
            Ok(existing) => existing,
            Err(error) => return Err(target_error(root, "reading", path, error)),
        };
        if let Some(status) = existing {
            let keep = is_directory(&status) && entry.kind == EntryKind::Directory;
            if !keep {
                make_room(root, parent, name, path, &status, self.overwrite)?;
            }
            self.report.replaced += 1;
            if keep {
                return Ok(());
            }
        }
        let created = match &entry.kind {
            EntryKind::Directory => mkdir_at(parent, name, 0o700),
            EntryKind::File {
                size,
                stream_offset,
                ..
            } => {
                let file = open_at(
                    parent,
                    name,
                    libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
                    0o600,
                )
                .map(File::from)
                .and_then(|file| {
                    file.set_len(*size)?;
                    stat_fd(file.as_fd())
                });
                match file {
                    Ok(status) => {
                        self.created.insert(index, (status.st_dev, status.st_ino));
                        self.report.files += 1;
                        if entry.stream_bytes() > 0 {
                            self.files.push((*stream_offset, index));
                        }
                        Ok(())
                    }
                    Err(error) => Err(error),
                }
            }
            EntryKind::Symlink { target } => symlink_at(target, parent, name),
            EntryKind::Fifo => mknod_at(parent, name, libc::S_IFIFO | 0o600, 0),
            EntryKind::CharDevice { rdev } => mknod_at(parent, name, libc::S_IFCHR | 0o600, *rdev),
            EntryKind::BlockDevice { rdev } => mknod_at(parent, name, libc::S_IFBLK | 0o600, *rdev),
            EntryKind::HardLink { .. } => unreachable!("returned above"),
        };
        created.map_err(|error| target_error(root, "creating", path, error))
    }

    /// Writes `data`, the content stream from `stream_offset`, into the files it belongs to.
    pub fn write(&mut self, mut stream_offset: u64, mut data: &[u8]) -> Result<()> {
        while !data.is_empty() {
            let next = self
                .files
                .partition_point(|&(start, _)| start <= stream_offset);
            let containing = next.checked_sub(1).filter(|&slot| {
                let (start, index) = self.files[slot];
                stream_offset < start + self.tree.entries[index].stream_bytes()
            });
            let Some(slot) = containing else {
                // Bytes of no file (an earlier reading of a file that changed): skip them.
                let skip = match self.files.get(next) {
                    Some(&(start, _)) => (start - stream_offset).min(data.len() as u64),
                    None => data.len() as u64,
                };
                stream_offset += skip;
                data = &data[skip as usize..];
                continue;
            };
            let (start, index) = self.files[slot];
            let EntryKind::File { extents, .. } = &self.tree.entries[index].kind else {
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
            let (file_offset, room) = target.expect("the offset lies in the file's stream range");
            let count = (room as usize).min(data.len());
            if self.current.as_ref().is_none_or(|(open, _)| *open != index) {
                self.current = None;
                let file = self.open_created(index, libc::O_WRONLY)?;
                self.current = Some((index, file));
            }
            let (_, file) = self.current.as_ref().expect("opened above");
            file.write_all_at(&data[..count], file_offset)
                .map_err(|error| {
                    target_error(&self.root, "writing", &self.tree.entries[index].path, error)
                })?;
            self.report.bytes_written += count as u64;
            stream_offset += count as u64;
            data = &data[count..];
        }
        Ok(())
    }

    /// Opens the regular file this restore created for entry `index`, checking that the name
    /// still leads to it.
    fn open_created(&mut self, index: usize, flags: libc::c_int) -> Result<File> {
        let path = self.tree.entries[index].path.as_slice();
        let expected = self.created[&index];
        let root = self.root.as_path();
        let target = &mut self.target;
        let opened = target.parent(path).and_then(|(parent, name)| {
            let file = File::from(open_at(parent, name, flags | libc::O_NONBLOCK, 0)?);
            let status = stat_fd(file.as_fd())?;
            if (status.st_dev, status.st_ino) != expected || !is_regular(&status) {
                return Err(io::Error::other(
                    "it is no longer the file this restore created (replaced during the restore)",
                ));
            }
            Ok(file)
        });
        opened.map_err(|error| target_error(root, "opening", path, error))
    }

    /// Creates hard links and sets metadata; see the module documentation.
    pub fn finish(mut self) -> Result<ApplyReport> {
        self.current = None;
        for index in 0..self.tree.entries.len() {
            if let EntryKind::HardLink { target } = self.tree.entries[index].kind {
                self.link(index, target as usize)?;
            }
        }
        for index in 0..self.tree.entries.len() {
            match self.tree.entries[index].kind {
                EntryKind::Directory | EntryKind::HardLink { .. } => {}
                _ => self.apply_metadata(index)?,
            }
        }
        for index in (0..self.tree.entries.len()).rev() {
            if self.tree.entries[index].kind == EntryKind::Directory {
                self.apply_metadata(index)?;
            }
        }
        Ok(self.report)
    }

    /// Links entry `index` to the file of entry `original`, which this restore created.
    fn link(&mut self, index: usize, original: usize) -> Result<()> {
        let path = self.tree.entries[index].path.as_slice();
        let original_path = self.tree.entries[original].path.as_slice();
        let expected = self.created[&original];
        let root = self.root.as_path();
        let target = &mut self.target;
        let (original_directory, original_name) = target
            .open_parent(original_path)
            .map_err(|error| target_error(root, "reaching", original_path, error))?;
        let status = stat_at(original_directory.as_fd(), original_name)
            .map_err(|error| target_error(root, "reading", original_path, error))?;
        if status.is_none_or(|status| (status.st_dev, status.st_ino) != expected) {
            return Err(target_error(
                root,
                "linking to",
                original_path,
                io::Error::other("it is no longer the file this restore created"),
            ));
        }
        let (parent, name) = target
            .parent(path)
            .map_err(|error| target_error(root, "reaching", path, error))?;
        let existing = match stat_at(parent, name) {
            Ok(existing) => existing,
            Err(error) => return Err(target_error(root, "reading", path, error)),
        };
        if let Some(status) = existing {
            make_room(root, parent, name, path, &status, self.overwrite)?;
            self.report.replaced += 1;
        }
        link_at(original_directory.as_fd(), original_name, parent, name)
            .map_err(|error| target_error(root, "linking", path, error))?;
        self.report.hard_links += 1;
        Ok(())
    }

    fn apply_metadata(&mut self, index: usize) -> Result<()> {
        let entry = &self.tree.entries[index];
        let path = entry.path.as_slice();
        let result = match &entry.kind {
            EntryKind::Directory if path.is_empty() => {
                set_on_descriptor(self.target.root(), entry, &mut self.report)
            }
            EntryKind::Directory => {
                let target = &mut self.target;
                let directory = target.parent(path).and_then(|(parent, name)| {
                    open_at(parent, name, libc::O_RDONLY | libc::O_DIRECTORY, 0)
                });
                match directory {
                    Ok(directory) => set_on_descriptor(directory.as_fd(), entry, &mut self.report),
                    Err(error) => Err(error),
                }
            }
            EntryKind::File { .. } => {
                let file = self.open_created(index, libc::O_RDONLY)?;
                let entry = &self.tree.entries[index];
                set_on_descriptor(file.as_fd(), entry, &mut self.report)
            }
            EntryKind::HardLink { .. } => unreachable!("a hard link shares its file's metadata"),
            EntryKind::Symlink { .. }
            | EntryKind::Fifo
            | EntryKind::CharDevice { .. }
            | EntryKind::BlockDevice { .. } => {
                let target = &mut self.target;
                match target.parent(path) {
                    Ok((parent, name)) => set_by_name(parent, name, entry, &mut self.report),
                    Err(error) => Err(error),
                }
            }
        };
        let entry = &self.tree.entries[index];
        result.map_err(|error| {
            target_error(&self.root, "setting the metadata of", &entry.path, error)
        })
    }
}

/// Removes the target's entry at `name` so that the backup's can take its place: only with
/// overwriting, and never a directory (with its contents).
fn make_room(
    root: &Path,
    parent: BorrowedFd<'_>,
    name: &[u8],
    path: &[u8],
    status: &libc::stat,
    overwrite: bool,
) -> Result<()> {
    if is_directory(status) {
        return Err(BackupError::TargetConflict {
            target: root.display().to_string(),
            detail: format!(
                "{} is a directory in the target but not in the backup",
                escape_path(path)
            ),
        });
    }
    if !overwrite {
        return Err(target_error(
            root,
            "creating",
            path,
            io::Error::new(
                io::ErrorKind::AlreadyExists,
                "it appeared in the target during the restore",
            ),
        ));
    }
    unlink_at(parent, name).map_err(|error| target_error(root, "replacing", path, error))
}

/// Counts a refused owner or attribute instead of failing; other errors pass.
fn tolerate(result: io::Result<()>, tolerated: &[i32], count: &mut u64) -> io::Result<()> {
    match result {
        Err(error)
            if error
                .raw_os_error()
                .is_some_and(|code| tolerated.contains(&code)) =>
        {
            *count += 1;
            Ok(())
        }
        other => other,
    }
}

/// Owner, mode, attributes and times through a descriptor of the entry itself.
fn set_on_descriptor(
    fd: BorrowedFd<'_>,
    entry: &TreeEntry,
    report: &mut ApplyReport,
) -> io::Result<()> {
    tolerate(
        fchown(fd, entry.uid, entry.gid),
        &[libc::EPERM],
        &mut report.owners_not_set,
    )?;
    fchmod(fd, entry.mode)?;
    for (name, value) in &entry.xattrs {
        tolerate(
            fset_xattr(fd, name, value),
            &[libc::ENOTSUP, libc::EPERM],
            &mut report.xattrs_not_set,
        )?;
    }
    fset_times(fd, &timespecs(entry))
}

/// Owner, mode (not for links), attributes and times of an entry that cannot be opened for
/// writing, by name relative to its parent, never following a link.
fn set_by_name(
    parent: BorrowedFd<'_>,
    name: &[u8],
    entry: &TreeEntry,
    report: &mut ApplyReport,
) -> io::Result<()> {
    tolerate(
        chown_at(parent, name, entry.uid, entry.gid),
        &[libc::EPERM],
        &mut report.owners_not_set,
    )?;
    if !matches!(entry.kind, EntryKind::Symlink { .. }) {
        chmod_at(parent, name, entry.mode)?;
    }
    for (attribute, value) in &entry.xattrs {
        tolerate(
            set_xattr_at(parent, name, attribute, value),
            &[libc::ENOTSUP, libc::EPERM],
            &mut report.xattrs_not_set,
        )?;
    }
    set_times_at(parent, name, &timespecs(entry))
}
