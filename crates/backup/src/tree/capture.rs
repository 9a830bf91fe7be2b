//! Capturing a directory: the walk that records metadata, and the reader that streams the
//! contents followed by the encoded tree.
//!
//! The walk stats every name once (`lstat`: links are not followed), records hard links by
//! device and inode and reads extended attributes. It never opens anything: FIFOs, sockets
//! and devices are recorded, not read.
//!
//! The reader then reads each regular file in walk order, through a descriptor opened beneath
//! the backed-up directory without following links and without blocking
//! (`O_NOFOLLOW | O_NONBLOCK`, [`super::beneath`]):
//!
//! 1. `fstat` the descriptor (size, modification and change times, inode) and find the data
//!    extents (`SEEK_DATA`/`SEEK_HOLE`, only for a file that occupies fewer blocks than its
//!    size);
//! 2. read the extents into the stream;
//! 3. `fstat` again. If the size or either time changed, or the file ended early, the reading
//!    is not one version of the file: read it again, appending to the stream, up to
//!    [`FILE_READINGS_MAX`] readings. The tree points at the last reading; the earlier ones
//!    stay in the stream as bytes of no file (the stream only grows, and they mostly
//!    deduplicate against the last one).
//! 4. The file's entry records what was read: the size and extents of that reading (cut where
//!    the file ended early), and the mode, owner, times and stamp (ctime, inode, device) from
//!    its first `fstat`, so that contents and metadata belong together. The stamp is
//!    *settled* (trusted by the next backup's files cache) only when the reading found the
//!    file unchanged and its mtime and ctime are older than the backup's start by the file
//!    system's racy window ([`RACY_LOCAL_NANOSECONDS`] or [`RACY_NANOSECONDS`]).
//!
//! With a previous backup ([`ReaderSettings::previous`]), the reader hands the stream out in
//! parts ([`PartedSource`]): each file read is a part, and runs of unchanged files are
//! segments of the previous backup, not read ([`crate::files_cache`]); their entries take
//! the previous extents at their new stream offsets.
//!
//! So a restored file is always a version the file really had, or, after
//! [`FILE_READINGS_MAX`] changing readings, exactly the bytes read, with a [`FileWarning`]
//! either way; never zeros standing in for bytes that were not read. A name that no longer
//! leads to a regular file when its turn comes (a FIFO or a link took its place) is stored as
//! an empty file with a warning, without blocking on it. The tree is encoded only after the
//! last file, so it describes what the stream holds.

use std::collections::{HashMap, VecDeque};
use std::ffi::{CString, OsStr};
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::Serialize;

use super::beneath::{is_regular, stat_fd, Beneath};
use super::exclude::Excludes;
use super::{EntryKind, Extent, FileStamp, Tree, TreeEntry};
use crate::error::{BackupError, Result};
use crate::files_cache::{
    kept_kind, local_times, plan, FilesReport, Layout, PreviousBackup, Step,
    RACY_LOCAL_NANOSECONDS, RACY_NANOSECONDS,
};
use crate::inline::{PartedSource, StreamPart};
use crate::series::TreeRange;
use onecopy_core::error::IoContext;

/// Largest buffer for the names of a file's extended attributes.
const XATTR_BYTES_MAX: usize = 1 << 20;
/// Files the reader opens ahead of the one it reads, asking the kernel to start reading them
/// (`posix_fadvise(WILLNEED)`): read one after the other, a tree of small files waits for
/// the disk once per file; read ahead, the disk serves many at once.
const READ_AHEAD_FILES: usize = 32;
/// Bytes of file data the reader asks for ahead of the file it reads, at most.
const READ_AHEAD_BYTES: u64 = 32 << 20;
/// Readings of a file that changes while it is read, at most; the last one is kept whatever
/// it holds.
pub const FILE_READINGS_MAX: u32 = 3;

/// The path of the walked entry `relative` under `root` (for the walk's own paths, made of
/// names it listed; stored paths are never joined: see [`super::beneath`]).
fn entry_path(root: &Path, relative: &[u8]) -> PathBuf {
    if relative.is_empty() {
        root.to_path_buf()
    } else {
        root.join(OsStr::from_bytes(relative))
    }
}

/// What a walk leaves out.
#[derive(Clone, Debug, Default)]
pub struct WalkOptions {
    /// Names whose absolute path matches one of these are not recorded (nor, for a
    /// directory, what it holds).
    pub excludes: Excludes,
    /// Directories on another file system than their parent are recorded without what they
    /// hold (the paths given to [`walk_paths`] are walked wherever they are).
    pub one_file_system: bool,
}

/// Walks `root` (a directory) and returns its tree. Regular files have their size from the
/// walk and no extents yet: [`TreeReader`] records what it reads.
pub fn walk(root: &Path) -> Result<Tree> {
    let selection = Selection {
        root: root.to_path_buf(),
        selected: vec![Vec::new()],
        given: vec![root.to_path_buf()],
    };
    walk_selection(&selection, &WalkOptions::default())
}

/// Which paths of the file system a backup of several paths holds, and the directory its
/// tree is rooted at.
///
/// The root is the deepest directory holding every given path (the path itself when one
/// directory is given), so a backup of one directory is that directory's tree as before,
/// and each of several paths keeps its place below their common directory:
/// `/home/me/docs /home/me/music` gives the entries `docs/...` and `music/...`, and
/// `/etc /home/me` gives `etc/...`, `home` and `home/me/...`. The directories between the
/// root and a given path are recorded with their metadata but without their other entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selection {
    pub root: PathBuf,
    /// The given paths relative to the root (empty: the root itself), sorted, none beneath
    /// another.
    pub selected: Vec<Vec<u8>>,
    /// The given paths, absolute and without `.` or `..`.
    pub given: Vec<PathBuf>,
}

/// `path` made absolute (against the working directory) with `.` and `..` resolved by name
/// and symbolic links resolved in its directories, not in its last component (a given link
/// is backed up as a link).
fn normalized(path: &Path) -> Result<PathBuf> {
    use std::path::Component;
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .context_io(|| "reading the working directory".to_string())?
            .join(path)
    };
    let mut clean = PathBuf::from("/");
    for component in absolute.components() {
        match component {
            Component::Normal(name) => clean.push(name),
            Component::ParentDir => {
                clean.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    match (clean.parent(), clean.file_name()) {
        (Some(parent), Some(name)) => {
            let parent =
                fs::canonicalize(parent).context_io(|| format!("reading {}", parent.display()))?;
            Ok(parent.join(name))
        }
        _ => Ok(clean),
    }
}

impl Selection {
    /// The selection of `paths` (at least one); see [`Selection`].
    pub fn of(paths: &[PathBuf]) -> Result<Selection> {
        assert!(!paths.is_empty(), "a backup has at least one path");
        let given = paths
            .iter()
            .map(|path| normalized(path))
            .collect::<Result<Vec<_>>>()?;
        let mut root: PathBuf = given[0].clone();
        for path in &given[1..] {
            root = root
                .components()
                .zip(path.components())
                .take_while(|(a, b)| a == b)
                .map(|(a, _)| a)
                .collect();
        }
        let metadata =
            fs::symlink_metadata(&root).context_io(|| format!("reading {}", root.display()))?;
        if !metadata.is_dir() {
            return Err(BackupError::InvalidArgument(format!(
                "{} is not a directory",
                root.display()
            )));
        }
        let mut selected: Vec<Vec<u8>> = given
            .iter()
            .map(|path| {
                path.strip_prefix(&root)
                    .expect("the root is a prefix of every path")
                    .as_os_str()
                    .as_bytes()
                    .to_vec()
            })
            .collect();
        selected.sort_by(|a, b| super::walk_order(a, b));
        selected.dedup();
        // A path beneath another given path is walked with it.
        let mut kept: Vec<Vec<u8>> = Vec::new();
        for path in selected {
            let beneath = kept.iter().any(|ancestor| {
                ancestor.is_empty()
                    || (path.starts_with(ancestor) && path.get(ancestor.len()) == Some(&b'/'))
            });
            if !beneath {
                kept.push(path);
            }
        }
        Ok(Selection {
            root,
            selected: kept,
            given,
        })
    }

    fn is_selected(&self, relative: &[u8]) -> bool {
        self.selected.iter().any(|path| path == relative)
    }

    /// The names of the next components of the selected paths beneath `relative`, sorted.
    fn names_beneath(&self, relative: &[u8]) -> Vec<Vec<u8>> {
        let mut names: Vec<Vec<u8>> = self
            .selected
            .iter()
            .filter_map(|path| {
                let rest = if relative.is_empty() {
                    path.as_slice()
                } else if path.starts_with(relative) && path.get(relative.len()) == Some(&b'/') {
                    &path[relative.len() + 1..]
                } else {
                    return None;
                };
                rest.split(|&byte| byte == b'/')
                    .next()
                    .filter(|name| !name.is_empty())
                    .map(<[u8]>::to_vec)
            })
            .collect();
        names.sort();
        names.dedup();
        names
    }
}

/// Walks the paths of `selection` (see [`Selection`]) and returns the tree rooted at its
/// root, without what `options` leaves out.
pub fn walk_selection(selection: &Selection, options: &WalkOptions) -> Result<Tree> {
    let root = selection.root.as_path();
    let metadata =
        fs::symlink_metadata(root).context_io(|| format!("reading {}", root.display()))?;
    if !metadata.is_dir() {
        return Err(BackupError::InvalidArgument(format!(
            "{} is not a directory",
            root.display()
        )));
    }
    let mut walker = Walker {
        root: root.to_path_buf(),
        tree: Tree::default(),
        inodes: HashMap::new(),
        selection,
        options,
    };
    walker.visit(Vec::new(), &metadata, selection.is_selected(b""), None)?;
    Ok(walker.tree)
}

struct Walker<'a> {
    root: PathBuf,
    tree: Tree,
    /// (device, inode) of regular files with several links, to their entry index.
    inodes: HashMap<(u64, u64), u32>,
    selection: &'a Selection,
    options: &'a WalkOptions,
}

impl Walker<'_> {
    /// The absolute path of `relative`, as bytes, for exclude patterns.
    fn absolute(&self, relative: &[u8]) -> Vec<u8> {
        let mut path = self.root.as_os_str().as_bytes().to_vec();
        if !relative.is_empty() {
            if path.last() != Some(&b'/') {
                path.push(b'/');
            }
            path.extend_from_slice(relative);
        }
        path
    }

    /// Records `relative` and, for a directory, what it holds: everything when `whole` (it
    /// is a given path or beneath one), else only the way to the given paths beneath it.
    /// `parent_device` is the device of a parent walked whole (for `one_file_system`).
    fn visit(
        &mut self,
        relative: Vec<u8>,
        metadata: &fs::Metadata,
        whole: bool,
        parent_device: Option<u64>,
    ) -> Result<()> {
        let path = entry_path(&self.root, &relative);
        let file_type = metadata.file_type();
        let kind = if file_type.is_dir() {
            EntryKind::Directory
        } else if file_type.is_file() {
            let key = (metadata.dev(), metadata.ino());
            match self.inodes.get(&key) {
                Some(&target) if metadata.nlink() > 1 => EntryKind::HardLink { target },
                _ => {
                    if metadata.nlink() > 1 {
                        self.inodes.insert(key, self.tree.entries.len() as u32);
                    }
                    EntryKind::File {
                        size: metadata.len(),
                        stream_offset: 0,
                        extents: Vec::new(),
                    }
                }
            }
        } else if file_type.is_symlink() {
            let target =
                fs::read_link(&path).context_io(|| format!("reading link {}", path.display()))?;
            EntryKind::Symlink {
                target: target.as_os_str().as_bytes().to_vec(),
            }
        } else if file_type.is_fifo() {
            EntryKind::Fifo
        } else if file_type.is_char_device() {
            EntryKind::CharDevice {
                rdev: metadata.rdev(),
            }
        } else if file_type.is_block_device() {
            EntryKind::BlockDevice {
                rdev: metadata.rdev(),
            }
        } else {
            // Sockets cannot be recreated meaningfully; like tar, skip them.
            return Ok(());
        };
        let is_directory = matches!(kind, EntryKind::Directory);
        let stamp = matches!(kind, EntryKind::File { .. }).then(|| FileStamp {
            ctime: (metadata.ctime(), metadata.ctime_nsec() as u32),
            inode: metadata.ino(),
            device: metadata.dev(),
            // Until the reader reads it: a file taken from the previous backup keeps the
            // version the previous stamp settled.
            settled: true,
        });
        self.tree.entries.push(TreeEntry {
            path: relative.clone(),
            kind,
            mode: metadata.mode() & 0o7777,
            uid: metadata.uid(),
            gid: metadata.gid(),
            atime: (metadata.atime(), metadata.atime_nsec() as u32),
            mtime: (metadata.mtime(), metadata.mtime_nsec() as u32),
            xattrs: read_xattrs(&path)?,
            stamp,
        });
        if !is_directory {
            return Ok(());
        }
        let other_file_system = parent_device.is_some_and(|device| device != metadata.dev());
        if whole && self.options.one_file_system && other_file_system {
            return Ok(()); // A mount point: recorded, not entered.
        }
        let children: Vec<Vec<u8>> = if whole {
            let mut children = Vec::new();
            for child in fs::read_dir(&path).context_io(|| format!("listing {}", path.display()))? {
                let child = child.context_io(|| format!("listing {}", path.display()))?;
                children.push(child.file_name().as_bytes().to_vec());
            }
            children.sort();
            children
        } else {
            self.selection.names_beneath(&relative)
        };
        for name in children {
            let mut child_relative = relative.clone();
            if !child_relative.is_empty() {
                child_relative.push(b'/');
            }
            child_relative.extend_from_slice(&name);
            let child_whole = whole || self.selection.is_selected(&child_relative);
            if child_whole
                && self
                    .options
                    .excludes
                    .excludes(&self.absolute(&child_relative))
            {
                continue;
            }
            let child_path = entry_path(&self.root, &child_relative);
            let child_metadata = match fs::symlink_metadata(&child_path) {
                Ok(metadata) => metadata,
                // Removed since the listing: nothing to back up.
                Err(error) if whole && error.kind() == io::ErrorKind::NotFound => continue,
                Err(error) => {
                    return Err(BackupError::io(
                        format!("reading {}", child_path.display()),
                        error,
                    ))
                }
            };
            // A given path is walked wherever it is; what it holds stays on its file system.
            let device = whole.then_some(metadata.dev());
            self.visit(child_relative, &child_metadata, child_whole, device)?;
        }
        Ok(())
    }
}

/// The data extents of the open regular file `file` of `size` bytes occupying `blocks`
/// 512-byte blocks: all of it, unless it occupies fewer blocks than its size (then it is
/// sparse and the holes are found with `SEEK_DATA`/`SEEK_HOLE`).
fn file_extents(file: &File, size: u64, blocks: u64) -> io::Result<Vec<Extent>> {
    if size == 0 {
        return Ok(Vec::new());
    }
    if blocks * 512 >= size {
        return Ok(vec![Extent {
            offset: 0,
            length: size,
        }]);
    }
    let descriptor = file.as_raw_fd();
    let mut extents = Vec::new();
    let mut position: i64 = 0;
    while (position as u64) < size {
        // SAFETY: lseek only reads its integer arguments; the descriptor stays open.
        let data = unsafe { libc::lseek(descriptor, position, libc::SEEK_DATA) };
        if data < 0 {
            let error = io::Error::last_os_error();
            if error.raw_os_error() == Some(libc::ENXIO) {
                break; // No data after `position`: the rest is a hole.
            }
            if error.raw_os_error() == Some(libc::EINVAL) {
                // The file system does not report holes: treat the file as dense.
                return Ok(vec![Extent {
                    offset: 0,
                    length: size,
                }]);
            }
            return Err(error);
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(descriptor, data, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(io::Error::last_os_error());
        }
        let end = (hole as u64).min(size);
        if end > data as u64 {
            extents.push(Extent {
                offset: data as u64,
                length: end - data as u64,
            });
        }
        position = hole;
    }
    Ok(extents)
}

fn c_path(path: &Path) -> Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        BackupError::InvalidArgument(format!("{} contains a NUL byte", path.display()))
    })
}

/// Extended attributes of `path` (not following links), sorted by name; empty where the file
/// system has none.
pub fn read_xattrs(path: &Path) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let c_path = c_path(path)?;
    // SAFETY: a null buffer with size 0 asks for the needed size; the path is NUL-terminated.
    let needed = unsafe { libc::llistxattr(c_path.as_ptr(), std::ptr::null_mut(), 0) };
    if needed < 0 {
        let error = io::Error::last_os_error();
        return match error.raw_os_error() {
            Some(libc::ENOTSUP) => Ok(Vec::new()),
            _ => Err(BackupError::io(
                format!("listing attributes of {}", path.display()),
                error,
            )),
        };
    }
    if needed == 0 {
        return Ok(Vec::new());
    }
    let mut names = vec![0u8; (needed as usize).min(XATTR_BYTES_MAX)];
    // SAFETY: the buffer is valid for `names.len()` bytes.
    let length =
        unsafe { libc::llistxattr(c_path.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    if length < 0 {
        let error = io::Error::last_os_error();
        return Err(BackupError::io(
            format!("listing attributes of {}", path.display()),
            error,
        ));
    }
    names.truncate(length as usize);
    let mut attributes = Vec::new();
    for name in names
        .split(|&byte| byte == 0)
        .filter(|name| !name.is_empty())
    {
        let c_name = CString::new(name).expect("split at NUL");
        // SAFETY: as above, a size query.
        let size =
            unsafe { libc::lgetxattr(c_path.as_ptr(), c_name.as_ptr(), std::ptr::null_mut(), 0) };
        if size < 0 {
            let error = io::Error::last_os_error();
            if error.raw_os_error() == Some(libc::ENODATA) {
                continue; // Removed between the listing and now.
            }
            return Err(BackupError::io(
                format!("reading attributes of {}", path.display()),
                error,
            ));
        }
        let mut value = vec![0u8; size as usize];
        // SAFETY: the buffer is valid for `value.len()` bytes.
        let read = unsafe {
            libc::lgetxattr(
                c_path.as_ptr(),
                c_name.as_ptr(),
                value.as_mut_ptr().cast(),
                value.len(),
            )
        };
        if read < 0 {
            let error = io::Error::last_os_error();
            return Err(BackupError::io(
                format!("reading attributes of {}", path.display()),
                error,
            ));
        }
        value.truncate(read as usize);
        attributes.push((name.to_vec(), value));
    }
    attributes.sort();
    Ok(attributes)
}

/// Why a file's backup is not simply the file as it was when its turn came.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FileProblem {
    /// The file changed while it was read; a later reading found it unchanged and the backup
    /// holds that reading (a version the file had).
    ReadAgain,
    /// The file changed during each of [`FILE_READINGS_MAX`] readings; the backup holds the
    /// bytes of the last reading, which may mix versions.
    ChangedWhileRead,
    /// The name no longer led to a regular file when its turn came (a FIFO, socket, device,
    /// directory or link took its place); the backup holds an empty file.
    NotARegularFile,
}

/// A file whose backup deserves a word to the user; see [`FileProblem`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FileWarning {
    /// The file, relative to the backed-up directory (bytes that are not UTF-8 shown as
    /// U+FFFD).
    pub path: String,
    pub problem: FileProblem,
    /// What happened and what the backup holds, in a sentence.
    pub message: String,
}

/// What the reader found, shared with the caller that hands the reader to the inline phase.
#[derive(Clone, Debug, Default)]
pub struct CaptureOutcome {
    /// Files read and files taken from the previous backup.
    pub files: FilesReport,
    /// Where the encoded tree lies in the stream; set when the reader reaches it.
    pub tree: Option<TreeRange>,
    pub warnings: Vec<FileWarning>,
    /// The tree as encoded at the stream's end; set with `tree`.
    pub entries: Option<Tree>,
}

/// Called by the reader after each read from a file, with the file's path relative to the
/// backed-up directory, the reading (1 for the first) and the bytes of the file delivered in
/// this reading so far. Tests use it to change a file at a chosen point of its reading.
pub type ReadObserver<'a> = &'a (dyn Fn(&[u8], u32, u64) + Sync);

/// What identifies one version of a file, from `fstat` of its descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Version {
    size: i64,
    modified: (i64, i64),
    changed: (i64, i64),
    inode: u64,
}

impl Version {
    fn of(status: &libc::stat) -> Version {
        Version {
            size: status.st_size,
            modified: (status.st_mtime, status.st_mtime_nsec),
            changed: (status.st_ctime, status.st_ctime_nsec),
            inode: status.st_ino,
        }
    }
}

/// One reading of the current file.
struct Reading {
    file: File,
    /// 1 for the first reading.
    number: u32,
    /// `fstat` before the reading.
    before: libc::stat,
    extents: Vec<Extent>,
    extent_index: usize,
    /// Bytes of the current extent read.
    extent_position: u64,
    /// Where the reading starts in the stream.
    stream_offset: u64,
    /// Bytes delivered by this reading.
    delivered: u64,
    /// The file offset where the file ended before its size (it shrank).
    ended_at: Option<u64>,
}

/// Reads a captured tree as a backup stream: every regular file's data extents in walk
/// order, then the encoded tree; see the module documentation.
pub struct TreeReader<'a> {
    root: PathBuf,
    source: Beneath,
    tree: Tree,
    /// Entry indices of the regular files (not hard links), in stream order.
    files: Vec<usize>,
    /// Position in `files` of the file being read.
    file_index: usize,
    current: Option<Reading>,
    /// Files from the current one on, opened and announced to the kernel, with their
    /// position in `files` (a file that failed to open ahead is opened again when its turn
    /// comes, so the error is reported there). The first ones are opened by
    /// [`TreeReader::new`].
    ahead: VecDeque<(usize, File)>,
    /// Position in `files` of the next file to open ahead.
    ahead_next: usize,
    /// Stream bytes delivered so far.
    stream_position: u64,
    /// The encoded tree, once the last file is read.
    tail: Option<Vec<u8>>,
    tail_position: usize,
    outcome: Arc<Mutex<CaptureOutcome>>,
    observer: Option<ReadObserver<'a>>,
    /// What to do with each file, or run of files, in order ([`crate::files_cache`]).
    steps: VecDeque<Step>,
    /// Per position in `files`: whether a step reads the file.
    to_read: Vec<bool>,
    /// The previous backup's tree, whose entries the steps name.
    previous: Tree,
    /// The backup's start (unix ns): files modified within their file system's racy window
    /// before it, or after it, get no stamp.
    started_ns: i128,
    /// Per device: whether its file system has local nanosecond times ([`local_times`]).
    local_times: HashMap<u64, bool>,
    /// Files of at least this walked size are parts of their own.
    alone_bytes: u64,
    /// The part under way in the [`Read`] view of the stream.
    in_part: bool,
}

/// How a [`TreeReader`] reads for a backup.
pub(crate) struct ReaderSettings {
    /// The series' previous backup, whose unchanged files are not read.
    pub previous: Option<PreviousBackup>,
    /// The backup's start (unix ns): files whose mtime or ctime is later, or within their
    /// file system's racy window before it, get no stamp.
    pub started_ns: i128,
    /// Files of at least this size start and end their own segments (the minimum segment
    /// size).
    pub alone_bytes: u64,
}

impl<'a> TreeReader<'a> {
    /// A reader of the files of `tree` (walked from `root`), followed by the tree as read;
    /// it reads every file and stamps those not modified within their file system's racy
    /// window.
    pub fn new(root: &Path, tree: Tree, observer: Option<ReadObserver<'a>>) -> Result<Self> {
        let settings = ReaderSettings {
            previous: None,
            started_ns: crate::store::now_unix_ns() as i128,
            alone_bytes: 0,
        };
        Self::with_settings(root, tree, observer, settings)
    }

    /// A reader for a backup: see [`ReaderSettings`].
    pub(crate) fn with_settings(
        root: &Path,
        tree: Tree,
        observer: Option<ReadObserver<'a>>,
        settings: ReaderSettings,
    ) -> Result<Self> {
        let source = Beneath::open(root).context_io(|| format!("opening {}", root.display()))?;
        let files: Vec<usize> = tree
            .entries
            .iter()
            .enumerate()
            .filter(|(_, entry)| matches!(entry.kind, EntryKind::File { .. }))
            .map(|(index, _)| index)
            .collect();
        let (previous, steps) = match settings.previous {
            Some(previous) => {
                let layout = Layout::of(&previous.tree, &previous.recipe, &previous.damaged);
                let steps = plan(&tree, &files, &layout);
                drop(layout);
                (previous.tree, steps)
            }
            None => (Tree::default(), (0..files.len()).map(Step::Read).collect()),
        };
        let mut to_read = vec![false; files.len()];
        for step in &steps {
            if let Step::Read(position) = step {
                to_read[*position] = true;
            }
        }
        let mut reader = TreeReader {
            root: root.to_path_buf(),
            source,
            tree,
            files,
            file_index: 0,
            current: None,
            ahead: VecDeque::new(),
            ahead_next: 0,
            stream_position: 0,
            tail: None,
            tail_position: 0,
            outcome: Arc::new(Mutex::new(CaptureOutcome::default())),
            observer,
            steps: steps.into(),
            to_read,
            previous,
            started_ns: settings.started_ns,
            local_times: HashMap::new(),
            alone_bytes: settings.alone_bytes,
            in_part: false,
        };
        // The disk starts on the first files while the caller prepares the rest of the
        // backup (the pipeline).
        reader.read_ahead();
        Ok(reader)
    }

    /// What the reader found; complete once it has delivered the whole stream.
    pub fn outcome(&self) -> Arc<Mutex<CaptureOutcome>> {
        Arc::clone(&self.outcome)
    }

    fn path_of(&self, position: usize) -> &[u8] {
        &self.tree.entries[self.files[position]].path
    }

    fn display(&self, relative: &[u8]) -> PathBuf {
        entry_path(&self.root, relative)
    }

    /// The walk's size of the file at `position`: an estimate for reading ahead.
    fn walked_bytes(&self, position: usize) -> u64 {
        match self.tree.entries[self.files[position]].kind {
            EntryKind::File { size, .. } => size,
            _ => 0,
        }
    }

    /// Opens files from the current one on, up to the read-ahead limits, and asks the kernel
    /// to read them in the background.
    fn read_ahead(&mut self) {
        while let Some(&(front, _)) = self.ahead.front() {
            if front >= self.file_index {
                break;
            }
            self.ahead.pop_front();
        }
        self.ahead_next = self.ahead_next.max(self.file_index);
        let mut bytes: u64 = self
            .ahead
            .iter()
            .map(|(position, _)| self.walked_bytes(*position))
            .sum();
        while self.ahead.len() < READ_AHEAD_FILES
            && bytes < READ_AHEAD_BYTES
            && self.ahead_next < self.files.len()
        {
            let position = self.ahead_next;
            self.ahead_next += 1;
            let walked = self.walked_bytes(position);
            if walked == 0 || !self.to_read[position] {
                continue;
            }
            let path = self.tree.entries[self.files[position]].path.clone();
            let Ok(file) = self.source.open_file(&path) else {
                continue;
            };
            // SAFETY: posix_fadvise only reads its integer arguments; the descriptor is open.
            // The advice is best effort: failure changes nothing but speed.
            unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_WILLNEED) };
            bytes += walked;
            self.ahead.push_back((position, file));
        }
    }

    /// Opens the current file, taking it from the read-ahead queue when it is there.
    fn open_current(&mut self) -> io::Result<File> {
        self.read_ahead();
        if let Some(found) = self
            .ahead
            .iter()
            .position(|(position, _)| *position == self.file_index)
        {
            let (_, file) = self.ahead.remove(found).expect("found above");
            return Ok(file);
        }
        let path = self.path_of(self.file_index).to_vec();
        self.source.open_file(&path)
    }

    fn warn(&mut self, position: usize, problem: FileProblem, message: String) {
        let path = String::from_utf8_lossy(self.path_of(position)).into_owned();
        self.outcome
            .lock()
            .expect("the outcome's lock is never poisoned")
            .warnings
            .push(FileWarning {
                path,
                problem,
                message,
            });
    }

    /// Records the current file as an empty file (it is not a regular file any more).
    fn record_not_regular(&mut self, what: &str) {
        let index = self.files[self.file_index];
        self.tree.entries[index].kind = EntryKind::File {
            size: 0,
            stream_offset: self.stream_position,
            extents: Vec::new(),
        };
        self.tree.entries[index].stamp = None;
        self.warn(
            self.file_index,
            FileProblem::NotARegularFile,
            format!(
                "was replaced by {what} after the directory walk; the backup holds an empty \
                 file in its place"
            ),
        );
        self.file_index += 1;
    }

    /// Opens the next file and starts its first reading.
    fn start_file(&mut self) -> io::Result<()> {
        let file = match self.open_current() {
            Ok(file) => file,
            Err(error) if matches!(error.raw_os_error(), Some(libc::ELOOP | libc::ENXIO)) => {
                // A link (not followed) or a socket took the file's place.
                self.record_not_regular("a symbolic link or a socket");
                return Ok(());
            }
            Err(error) => {
                let path = self.display(self.path_of(self.file_index));
                return Err(io::Error::new(
                    error.kind(),
                    format!("opening {}: {error}", path.display()),
                ));
            }
        };
        let status = stat_fd(file.as_fd())?;
        if !is_regular(&status) {
            let what = match status.st_mode & libc::S_IFMT {
                libc::S_IFIFO => "a FIFO",
                libc::S_IFDIR => "a directory",
                libc::S_IFCHR | libc::S_IFBLK => "a device",
                _ => "something that is not a regular file",
            };
            self.record_not_regular(what);
            return Ok(());
        }
        self.begin_reading(file, 1)
    }

    /// Starts reading number `number` of the open current file.
    fn begin_reading(&mut self, file: File, number: u32) -> io::Result<()> {
        let before = stat_fd(file.as_fd())?;
        let extents = file_extents(&file, before.st_size as u64, before.st_blocks as u64).map_err(
            |error| {
                let path = self.display(self.path_of(self.file_index));
                io::Error::new(
                    error.kind(),
                    format!("finding data in {}: {error}", path.display()),
                )
            },
        )?;
        self.current = Some(Reading {
            file,
            number,
            before,
            extents,
            extent_index: 0,
            extent_position: 0,
            stream_offset: self.stream_position,
            delivered: 0,
            ended_at: None,
        });
        Ok(())
    }

    /// Whether the file system of `file` (on `device`) has local nanosecond times; asked once
    /// per device. A file system that does not answer takes the coarse window.
    fn has_local_times(&mut self, file: &File, device: u64) -> bool {
        *self.local_times.entry(device).or_insert_with(|| {
            // SAFETY: fstatfs writes a statfs into the zeroed buffer it is given.
            let mut info: libc::statfs = unsafe { std::mem::zeroed() };
            let answered = unsafe { libc::fstatfs(file.as_raw_fd(), &mut info) } == 0;
            answered && local_times(info.f_type as i64)
        })
    }

    /// Ends the current reading: records the file if it did not change (or if this was the
    /// last reading allowed), else starts the next reading.
    fn end_reading(&mut self) -> io::Result<()> {
        let reading = self.current.take().expect("a reading is under way");
        let after = stat_fd(reading.file.as_fd())?;
        let changed =
            reading.ended_at.is_some() || Version::of(&reading.before) != Version::of(&after);
        if changed && reading.number < FILE_READINGS_MAX {
            return self.begin_reading(reading.file, reading.number + 1);
        }
        let before = &reading.before;
        let mut size = before.st_size as u64;
        let mut extents = reading.extents;
        if let Some(end) = reading.ended_at {
            size = end;
            extents.retain(|extent| extent.offset < end);
            if let Some(last) = extents.last_mut() {
                last.length = last.length.min(end - last.offset);
            }
        }
        assert_eq!(
            extents.iter().map(|extent| extent.length).sum::<u64>(),
            reading.delivered,
            "the recorded extents are the bytes delivered"
        );
        let index = self.files[self.file_index];
        let racy_window = if self.has_local_times(&reading.file, before.st_dev) {
            RACY_LOCAL_NANOSECONDS
        } else {
            RACY_NANOSECONDS
        };
        let stamp_before_ns = self.started_ns - racy_window;
        let entry = &mut self.tree.entries[index];
        entry.kind = EntryKind::File {
            size,
            stream_offset: reading.stream_offset,
            extents,
        };
        // Only a reading that is one version of the file, old enough that a later change
        // shows in its times, may spare the next backup from reading it.
        let nanoseconds =
            |seconds: i64, nanoseconds: i64| seconds as i128 * 1_000_000_000 + nanoseconds as i128;
        let settled = nanoseconds(before.st_mtime, before.st_mtime_nsec) < stamp_before_ns
            && nanoseconds(before.st_ctime, before.st_ctime_nsec) < stamp_before_ns;
        entry.stamp = Some(FileStamp {
            ctime: (before.st_ctime, before.st_ctime_nsec as u32),
            inode: before.st_ino,
            device: before.st_dev,
            settled: !changed && settled,
        });
        {
            let mut outcome = self
                .outcome
                .lock()
                .expect("the outcome's lock is never poisoned");
            outcome.files.files_read += 1;
            outcome.files.bytes_read += reading.delivered;
        }
        let entry = &mut self.tree.entries[index];
        entry.mode = before.st_mode & 0o7777;
        entry.uid = before.st_uid;
        entry.gid = before.st_gid;
        entry.atime = (before.st_atime, before.st_atime_nsec as u32);
        entry.mtime = (before.st_mtime, before.st_mtime_nsec as u32);
        if changed {
            let cut = match reading.ended_at {
                Some(end) => format!(", cut where the file ended at byte {end}"),
                None => String::new(),
            };
            self.warn(
                self.file_index,
                FileProblem::ChangedWhileRead,
                format!(
                    "changed during each of {FILE_READINGS_MAX} readings; the backup holds the \
                     {} bytes of the last reading{cut}, which may mix versions of the file",
                    reading.delivered
                ),
            );
        } else if reading.number > 1 {
            self.warn(
                self.file_index,
                FileProblem::ReadAgain,
                format!(
                    "changed while it was read; read again ({} readings), the backup holds the \
                     version of the last reading",
                    reading.number
                ),
            );
        }
        self.file_index += 1;
        Ok(())
    }
}

impl TreeReader<'_> {
    /// Takes the contents of the previous entry `previous` for the file at `position`, at
    /// `stream_offset`; returns the end of its stream range.
    fn keep(&mut self, position: usize, previous: usize, stream_offset: u64) -> u64 {
        let old = &self.previous.entries[previous];
        let kind = kept_kind(old, stream_offset);
        let index = self.files[position];
        let entry = &mut self.tree.entries[index];
        assert_eq!(entry.path, old.path, "a kept file keeps its path");
        entry.kind = kind;
        let bytes = entry.stream_bytes();
        let mut outcome = self
            .outcome
            .lock()
            .expect("the outcome's lock is never poisoned");
        outcome.files.files_kept += 1;
        outcome.files.bytes_kept += bytes;
        stream_offset + bytes
    }

    /// Encodes the tree as the stream's last part.
    fn start_tail(&mut self) {
        let encoded = self.tree.encode();
        let mut outcome = self
            .outcome
            .lock()
            .expect("the outcome's lock is never poisoned");
        outcome.tree = Some(TreeRange {
            offset: self.stream_position,
            bytes: encoded.len() as u64,
        });
        // Every file is read: the reader needs the tree no more.
        outcome.entries = Some(std::mem::take(&mut self.tree));
        self.tail = Some(encoded);
    }
}

impl PartedSource for TreeReader<'_> {
    fn next_part(&mut self) -> io::Result<Option<StreamPart>> {
        assert!(
            self.current.is_none(),
            "the previous part was read to its end"
        );
        loop {
            match self.steps.pop_front() {
                Some(Step::Read(position)) => {
                    self.file_index = position;
                    let alone = self.walked_bytes(position) >= self.alone_bytes;
                    self.start_file()?;
                    return Ok(Some(StreamPart::Bytes { alone }));
                }
                Some(Step::Keep { position, previous }) => {
                    self.keep(position, previous, self.stream_position);
                }
                Some(Step::Place {
                    segments,
                    stream_start,
                    files,
                }) => {
                    let base = self.stream_position;
                    let bytes: u64 = segments.iter().map(|segment| segment.raw_bytes).sum();
                    let mut cursor = base;
                    for (position, previous) in files {
                        let old = &self.previous.entries[previous];
                        let offset = match old.kind {
                            EntryKind::File { stream_offset, .. } if old.stream_bytes() > 0 => {
                                base + (stream_offset - stream_start)
                            }
                            _ => cursor,
                        };
                        cursor = self.keep(position, previous, offset);
                    }
                    assert_eq!(cursor, base + bytes, "a run's files fill its segments");
                    self.stream_position = base + bytes;
                    return Ok(Some(StreamPart::Segments(segments)));
                }
                None if self.tail.is_none() => {
                    self.start_tail();
                    return Ok(Some(StreamPart::Bytes { alone: true }));
                }
                None => return Ok(None),
            }
        }
    }

    fn read_part(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        if buffer.is_empty() {
            return Ok(0);
        }
        if let Some(tail) = &self.tail {
            let rest = &tail[self.tail_position..];
            let count = rest.len().min(buffer.len());
            buffer[..count].copy_from_slice(&rest[..count]);
            self.tail_position += count;
            return Ok(count);
        }
        loop {
            let Some(reading) = self.current.as_mut() else {
                return Ok(0);
            };
            let Some(extent) = reading.extents.get(reading.extent_index).copied() else {
                self.end_reading()?;
                continue;
            };
            if reading.ended_at.is_some() {
                self.end_reading()?;
                continue;
            }
            if reading.extent_position == extent.length {
                reading.extent_index += 1;
                reading.extent_position = 0;
                continue;
            }
            let wanted = ((extent.length - reading.extent_position) as usize).min(buffer.len());
            let offset = extent.offset + reading.extent_position;
            let read = match reading.file.read_at(&mut buffer[..wanted], offset) {
                Ok(read) => read,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => {
                    let path = self.display(self.path_of(self.file_index));
                    return Err(io::Error::new(
                        error.kind(),
                        format!("reading {}: {error}", path.display()),
                    ));
                }
            };
            if read == 0 {
                // The file shrank: this reading ends here.
                reading.ended_at = Some(offset);
                continue;
            }
            reading.extent_position += read as u64;
            reading.delivered += read as u64;
            self.stream_position += read as u64;
            if let Some(observer) = self.observer {
                let (number, delivered) = (reading.number, reading.delivered);
                observer(self.path_of(self.file_index), number, delivered);
            }
            return Ok(read);
        }
    }
}

/// The whole stream as one reader, for a reader that reads every file (one without a
/// previous backup: it places no segments).
impl Read for TreeReader<'_> {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        if buffer.is_empty() {
            return Ok(0);
        }
        loop {
            if !self.in_part {
                match self.next_part()? {
                    None => return Ok(0),
                    Some(StreamPart::Bytes { .. }) => self.in_part = true,
                    Some(StreamPart::Segments(_)) => {
                        unreachable!("a reader without a previous backup places no segments")
                    }
                }
            }
            let read = self.read_part(buffer)?;
            if read > 0 {
                return Ok(read);
            }
            self.in_part = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Files of distinct sizes (some empty) with distinct contents, more of them than the
    /// reader opens ahead.
    fn make_tree(root: &Path) {
        for n in 0..READ_AHEAD_FILES * 2 + 5 {
            let length = if n % 7 == 3 { 0 } else { n * 1_013 };
            let data: Vec<u8> = (0..length).map(|i| (i * 31 + n) as u8).collect();
            fs::write(root.join(format!("f{n:03}")), data).unwrap();
        }
    }

    /// Reads `reader` to its end in pieces of `piece` bytes.
    fn read_all(reader: &mut TreeReader, piece: usize) -> Vec<u8> {
        let mut stream = Vec::new();
        let mut buffer = vec![0u8; piece];
        loop {
            let read = reader.read(&mut buffer).unwrap();
            if read == 0 {
                return stream;
            }
            stream.extend_from_slice(&buffer[..read]);
        }
    }

    /// The stream's contents part as `tree` (decoded from its end) describes it: each file's
    /// bytes from its stream range.
    fn files_in(stream: &[u8], reader: &TreeReader) -> Vec<(Vec<u8>, Vec<u8>)> {
        let range = reader.outcome().lock().unwrap().tree.unwrap();
        assert_eq!(range.offset + range.bytes, stream.len() as u64);
        let tree = Tree::decode(&stream[range.offset as usize..]).unwrap();
        tree.validate(range.offset).unwrap();
        tree.entries
            .iter()
            .filter_map(|entry| match &entry.kind {
                EntryKind::File {
                    size,
                    stream_offset,
                    extents,
                } => {
                    let mut data = vec![0u8; *size as usize];
                    let mut from = *stream_offset as usize;
                    for extent in extents {
                        let length = extent.length as usize;
                        data[extent.offset as usize..][..length]
                            .copy_from_slice(&stream[from..from + length]);
                        from += length;
                    }
                    Some((entry.path.clone(), data))
                }
                _ => None,
            })
            .collect()
    }

    fn files_on_disk(root: &Path, tree: &Tree) -> Vec<(Vec<u8>, Vec<u8>)> {
        tree.entries
            .iter()
            .filter(|entry| matches!(entry.kind, EntryKind::File { .. }))
            .map(|entry| {
                let data = fs::read(entry_path(root, &entry.path)).unwrap();
                (entry.path.clone(), data)
            })
            .collect()
    }

    /// Goal: reading ahead changes nothing in the stream, and the tree at its end describes
    /// the files read. Method: a tree of more files than the read-ahead window, read in small
    /// and large pieces, decoded and compared with the files.
    #[test]
    fn read_ahead_keeps_the_stream() {
        let directory = tempfile::tempdir().unwrap();
        make_tree(directory.path());
        for piece in [1usize, 4_096, 1 << 20] {
            let tree = walk(directory.path()).unwrap();
            let expected = files_on_disk(directory.path(), &tree);
            let mut reader = TreeReader::new(directory.path(), tree, None).unwrap();
            let stream = read_all(&mut reader, piece);
            assert!(files_in(&stream, &reader) == expected, "piece {piece}");
            assert!(reader.ahead.len() <= READ_AHEAD_FILES);
            assert!(reader.outcome().lock().unwrap().warnings.is_empty());
        }
    }

    /// Goal: a file opened ahead is read through that open file at its turn, not opened
    /// again. Method: after the first read, replace the third file by another of the same
    /// size (rename over it); the stream must still hold the replaced file's bytes.
    #[test]
    fn read_ahead_reads_the_files_it_opened() {
        let directory = tempfile::tempdir().unwrap();
        make_tree(directory.path());
        let tree = walk(directory.path()).unwrap();
        let expected = files_on_disk(directory.path(), &tree);
        let third = tree
            .entries
            .iter()
            .filter(|entry| matches!(entry.kind, EntryKind::File { size, .. } if size > 0))
            .nth(2)
            .map(|entry| entry_path(directory.path(), &entry.path))
            .unwrap();
        let mut reader = TreeReader::new(directory.path(), tree, None).unwrap();
        let mut first = vec![0u8; 1];
        assert_eq!(reader.read(&mut first).unwrap(), 1);
        let replacement = directory.path().join("replacement");
        fs::write(
            &replacement,
            vec![0xA5; fs::metadata(&third).unwrap().len() as usize],
        )
        .unwrap();
        fs::rename(&replacement, &third).unwrap();
        let mut stream = first;
        stream.extend(read_all(&mut reader, 1 << 16));
        assert!(
            files_in(&stream, &reader) == expected,
            "the stream holds the file as opened ahead"
        );
        assert!(reader.outcome().lock().unwrap().warnings.is_empty());
    }

    /// Goal: a file removed after the walk, beyond the read-ahead window, fails the read at
    /// its own turn, naming it, after every byte before it; a file cut short after it was
    /// opened ahead but before its turn is read as it is then, without padding or warning.
    /// Method: after the first read, remove the last file of the stream and truncate the
    /// third, then read to the error.
    #[test]
    fn read_ahead_reports_files_in_order() {
        let directory = tempfile::tempdir().unwrap();
        make_tree(directory.path());
        let tree = walk(directory.path()).unwrap();
        // Files with data, in stream order (the walk's order, not the names').
        let files: Vec<PathBuf> = tree
            .entries
            .iter()
            .filter(|entry| matches!(entry.kind, EntryKind::File { size, .. } if size > 0))
            .map(|entry| entry_path(directory.path(), &entry.path))
            .collect();
        assert!(files.len() > READ_AHEAD_FILES + 2);
        let (removed, shrunk) = (files.last().unwrap().clone(), files[2].clone());
        let mut reader = TreeReader::new(directory.path(), tree, None).unwrap();
        let mut buffer = vec![0u8; 1_000];
        // Start reading, so that the files after the first are opened ahead.
        assert!(reader.read(&mut buffer).unwrap() > 0);
        fs::remove_file(&removed).unwrap();
        fs::write(&shrunk, b"short").unwrap();
        let mut delivered = 1_000u64;
        let error = loop {
            match reader.read(&mut buffer) {
                Ok(0) => panic!("the removed file must fail the read"),
                Ok(read) => delivered += read as u64,
                Err(error) => break error,
            }
        };
        assert!(
            error.to_string().contains(&removed.display().to_string()),
            "{error}"
        );
        // Every byte of the files before the removed one was delivered, as they are now.
        let before_removed: u64 = files
            .iter()
            .take_while(|path| **path != removed)
            .map(|path| fs::metadata(path).unwrap().len())
            .sum();
        assert_eq!(delivered, before_removed);
        assert!(reader.outcome().lock().unwrap().warnings.is_empty());
    }
}
