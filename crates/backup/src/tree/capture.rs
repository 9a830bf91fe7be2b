//! Capturing a directory: the walk that records metadata, and the reader that streams the
//! contents followed by the encoded tree.
//!
//! The walk stats every name once (`lstat`: links are not followed), records hard links by
//! device and inode, finds the data extents of sparse files (`SEEK_DATA`/`SEEK_HOLE`, only
//! for files that occupy fewer blocks than their size) and reads extended attributes. The
//! stream then reads each regular file's extents as recorded: a file that shrank since the
//! walk is padded with zeros and one that grew is cut at its recorded size, so the stream
//! always matches the tree (shrunk files are counted in [`TreeReader::changed_files`]).

use std::collections::{HashMap, VecDeque};
use std::ffi::{CString, OsStr};
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::{EntryKind, Extent, Tree, TreeEntry};
use crate::error::{BackupError, IoContext, Result};

/// Largest buffer for the names of a file's extended attributes.
const XATTR_BYTES_MAX: usize = 1 << 20;
/// Files the reader opens ahead of the one it reads, asking the kernel to start reading them
/// (`posix_fadvise(WILLNEED)`): read one after the other, a tree of small files waits for
/// the disk once per file; read ahead, the disk serves many at once.
const READ_AHEAD_FILES: usize = 32;
/// Bytes of file data the reader asks for ahead of the file it reads, at most.
const READ_AHEAD_BYTES: u64 = 32 << 20;

/// The path of entry `relative` under `root`.
pub fn entry_path(root: &Path, relative: &[u8]) -> PathBuf {
    if relative.is_empty() {
        root.to_path_buf()
    } else {
        root.join(OsStr::from_bytes(relative))
    }
}

/// Walks `root` (a directory) and returns its tree, with file stream offsets assigned in
/// walk order; also returns the total stream bytes of the contents.
pub fn walk(root: &Path) -> Result<(Tree, u64)> {
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
        stream_bytes: 0,
    };
    walker.visit(Vec::new(), &metadata)?;
    Ok((walker.tree, walker.stream_bytes))
}

struct Walker {
    root: PathBuf,
    tree: Tree,
    /// (device, inode) of regular files with several links, to their entry index.
    inodes: HashMap<(u64, u64), u32>,
    stream_bytes: u64,
}

impl Walker {
    fn visit(&mut self, relative: Vec<u8>, metadata: &fs::Metadata) -> Result<()> {
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
                    let extents = file_extents(&path, metadata)?;
                    let stream_offset = self.stream_bytes;
                    self.stream_bytes += extents.iter().map(|extent| extent.length).sum::<u64>();
                    EntryKind::File {
                        size: metadata.len(),
                        stream_offset,
                        extents,
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
        self.tree.entries.push(TreeEntry {
            path: relative.clone(),
            kind,
            mode: metadata.mode() & 0o7777,
            uid: metadata.uid(),
            gid: metadata.gid(),
            atime: (metadata.atime(), metadata.atime_nsec() as u32),
            mtime: (metadata.mtime(), metadata.mtime_nsec() as u32),
            xattrs: read_xattrs(&path)?,
        });
        if is_directory {
            let mut children = Vec::new();
            for child in fs::read_dir(&path).context_io(|| format!("listing {}", path.display()))? {
                let child = child.context_io(|| format!("listing {}", path.display()))?;
                children.push(child.file_name());
            }
            children.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
            for name in children {
                let mut child_relative = relative.clone();
                if !child_relative.is_empty() {
                    child_relative.push(b'/');
                }
                child_relative.extend_from_slice(name.as_bytes());
                let child_path = entry_path(&self.root, &child_relative);
                let child_metadata = match fs::symlink_metadata(&child_path) {
                    Ok(metadata) => metadata,
                    // Removed since the listing: nothing to back up.
                    Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
                    Err(error) => {
                        return Err(BackupError::io(
                            format!("reading {}", child_path.display()),
                            error,
                        ))
                    }
                };
                self.visit(child_relative, &child_metadata)?;
            }
        }
        Ok(())
    }
}

/// The data extents of a regular file: all of it, unless it occupies fewer blocks than its
/// size (then it is sparse and the holes are found with `SEEK_DATA`/`SEEK_HOLE`).
fn file_extents(path: &Path, metadata: &fs::Metadata) -> Result<Vec<Extent>> {
    let size = metadata.len();
    if size == 0 {
        return Ok(Vec::new());
    }
    if metadata.blocks() * 512 >= size {
        return Ok(vec![Extent {
            offset: 0,
            length: size,
        }]);
    }
    let file = File::open(path).context_io(|| format!("opening {}", path.display()))?;
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
            return Err(BackupError::io(
                format!("finding data in {}", path.display()),
                error,
            ));
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(descriptor, data, libc::SEEK_HOLE) };
        if hole < 0 {
            let error = io::Error::last_os_error();
            return Err(BackupError::io(
                format!("finding holes in {}", path.display()),
                error,
            ));
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

/// Reads a captured tree as a backup stream: every file's extents in walk order, then the
/// encoded tree.
pub struct TreeReader {
    root: PathBuf,
    /// (entry path, extents) of the regular files, in stream order.
    files: Vec<(Vec<u8>, Vec<Extent>)>,
    file_index: usize,
    extent_index: usize,
    /// Bytes of the current extent already read.
    extent_position: u64,
    current: Option<File>,
    /// Files from the current one on, opened and announced to the kernel, with their index in
    /// `files` (a file that failed to open ahead is opened again when its turn comes, so the
    /// error is reported there). The first ones are opened by [`TreeReader::new`].
    ahead: VecDeque<(usize, File)>,
    /// Index of the next file to open ahead.
    ahead_next: usize,
    /// True once the current file ended before its recorded size.
    current_short: bool,
    tail: Vec<u8>,
    tail_position: usize,
    changed_files: Arc<AtomicU64>,
}

impl TreeReader {
    /// A reader of the contents of `tree` (walked from `root`), followed by `tree_bytes`.
    pub fn new(root: &Path, tree: &Tree, tree_bytes: Vec<u8>) -> Self {
        let files = tree
            .entries
            .iter()
            .filter_map(|entry| match &entry.kind {
                EntryKind::File { extents, .. } => Some((entry.path.clone(), extents.clone())),
                _ => None,
            })
            .collect();
        let mut reader = TreeReader {
            root: root.to_path_buf(),
            files,
            file_index: 0,
            extent_index: 0,
            extent_position: 0,
            current: None,
            ahead: VecDeque::new(),
            ahead_next: 0,
            current_short: false,
            tail: tree_bytes,
            tail_position: 0,
            changed_files: Arc::new(AtomicU64::new(0)),
        };
        // The disk starts on the first files while the caller prepares the rest of the
        // backup (the predecessor's chunk map, the pipeline).
        reader.read_ahead();
        reader
    }

    /// Files whose size changed between the walk and the read (padded or cut to the size
    /// recorded in the tree).
    pub fn changed_files(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.changed_files)
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
            .map(|(index, _)| file_bytes(&self.files[*index].1))
            .sum();
        while self.ahead.len() < READ_AHEAD_FILES
            && bytes < READ_AHEAD_BYTES
            && self.ahead_next < self.files.len()
        {
            let index = self.ahead_next;
            self.ahead_next += 1;
            let (path, extents) = &self.files[index];
            if extents.is_empty() {
                continue;
            }
            let Ok(file) = File::open(entry_path(&self.root, path)) else {
                continue;
            };
            // SAFETY: posix_fadvise only reads its integer arguments; the descriptor is open.
            // The advice is best effort: failure changes nothing but speed.
            unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_WILLNEED) };
            bytes += file_bytes(extents);
            self.ahead.push_back((index, file));
        }
    }

    /// Opens the current file, taking it from the read-ahead queue when it is there.
    fn open_current(&mut self) -> io::Result<File> {
        self.read_ahead();
        if let Some(position) = self
            .ahead
            .iter()
            .position(|(index, _)| *index == self.file_index)
        {
            let (_, file) = self.ahead.remove(position).expect("found above");
            return Ok(file);
        }
        let path = entry_path(&self.root, &self.files[self.file_index].0);
        File::open(&path).map_err(|error| {
            io::Error::new(error.kind(), format!("opening {}: {error}", path.display()))
        })
    }

    fn next_file(&mut self) {
        self.file_index += 1;
        self.extent_index = 0;
        self.extent_position = 0;
        self.current = None;
        self.current_short = false;
    }
}

/// Bytes of a file's data extents.
fn file_bytes(extents: &[Extent]) -> u64 {
    extents.iter().map(|extent| extent.length).sum()
}

impl Read for TreeReader {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        if buffer.is_empty() {
            return Ok(0);
        }
        while self.file_index < self.files.len() {
            let extents = &self.files[self.file_index].1;
            let Some(extent) = extents.get(self.extent_index).copied() else {
                self.next_file();
                continue;
            };
            if self.extent_position == extent.length {
                self.extent_index += 1;
                self.extent_position = 0;
                continue;
            }
            if self.current.is_none() {
                self.current = Some(self.open_current()?);
            }
            let wanted = ((extent.length - self.extent_position) as usize).min(buffer.len());
            let read = if self.current_short {
                0
            } else {
                let file = self.current.as_ref().expect("opened above");
                file.read_at(&mut buffer[..wanted], extent.offset + self.extent_position)?
            };
            if read == 0 {
                // The file shrank: pad with zeros so the stream matches the tree.
                if !self.current_short {
                    self.current_short = true;
                    self.changed_files.fetch_add(1, Ordering::Relaxed);
                }
                buffer[..wanted].fill(0);
                self.extent_position += wanted as u64;
                return Ok(wanted);
            }
            self.extent_position += read as u64;
            return Ok(read);
        }
        let rest = &self.tail[self.tail_position..];
        let count = rest.len().min(buffer.len());
        buffer[..count].copy_from_slice(&rest[..count]);
        self.tail_position += count;
        Ok(count)
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

    /// The stream the reader must produce: file data in tree order, then the tree's bytes.
    fn expected_stream(root: &Path, tree: &Tree, tail: &[u8]) -> Vec<u8> {
        let mut expected = Vec::new();
        for entry in &tree.entries {
            if let EntryKind::File { .. } = entry.kind {
                expected.extend(fs::read(entry_path(root, &entry.path)).unwrap());
            }
        }
        expected.extend_from_slice(tail);
        expected
    }

    /// Goal: reading ahead changes nothing in the stream. Method: a tree of more files than
    /// the read-ahead window, read in small and large pieces, against the files themselves.
    #[test]
    fn read_ahead_keeps_the_stream() {
        let directory = tempfile::tempdir().unwrap();
        make_tree(directory.path());
        let (tree, _) = walk(directory.path()).unwrap();
        let tail = b"tree bytes".to_vec();
        let expected = expected_stream(directory.path(), &tree, &tail);
        for piece in [1usize, 4_096, 1 << 20] {
            let mut reader = TreeReader::new(directory.path(), &tree, tail.clone());
            let mut stream = Vec::new();
            let mut buffer = vec![0u8; piece];
            loop {
                let read = reader.read(&mut buffer).unwrap();
                if read == 0 {
                    break;
                }
                stream.extend_from_slice(&buffer[..read]);
            }
            assert!(stream == expected, "piece {piece}");
            assert!(reader.ahead.len() <= READ_AHEAD_FILES);
        }
    }

    /// Goal: a file opened ahead is read through that open file at its turn, not opened again.
    /// Method: after the first read, replace the third file by another of the same size
    /// (rename over it); the stream must still hold the replaced file's bytes.
    #[test]
    fn read_ahead_reads_the_files_it_opened() {
        let directory = tempfile::tempdir().unwrap();
        make_tree(directory.path());
        let (tree, _) = walk(directory.path()).unwrap();
        let expected = expected_stream(directory.path(), &tree, b"");
        let third = tree
            .entries
            .iter()
            .filter(|entry| matches!(entry.kind, EntryKind::File { size, .. } if size > 0))
            .nth(2)
            .map(|entry| entry_path(directory.path(), &entry.path))
            .unwrap();
        let mut reader = TreeReader::new(directory.path(), &tree, Vec::new());
        let mut stream = vec![0u8; 1];
        assert_eq!(reader.read(&mut stream).unwrap(), 1);
        let replacement = directory.path().join("replacement");
        fs::write(
            &replacement,
            vec![0xA5; fs::metadata(&third).unwrap().len() as usize],
        )
        .unwrap();
        fs::rename(&replacement, &third).unwrap();
        reader.read_to_end(&mut stream).unwrap();
        assert!(
            stream == expected,
            "the stream holds the file as opened ahead"
        );
        assert_eq!(reader.changed_files().load(Ordering::Relaxed), 0);
    }

    /// Goal: a file removed after the walk, beyond the read-ahead window, fails the read at
    /// its own turn, naming it, after every byte before it; a file cut short after it was
    /// opened ahead is padded and counted. Method: after the first read, remove the last file
    /// of the stream and truncate the third, then read to the error.
    #[test]
    fn read_ahead_reports_files_in_order() {
        let directory = tempfile::tempdir().unwrap();
        make_tree(directory.path());
        let (tree, _) = walk(directory.path()).unwrap();
        // Files with data, in stream order (the walk's order, not the names').
        let files: Vec<PathBuf> = tree
            .entries
            .iter()
            .filter(|entry| matches!(entry.kind, EntryKind::File { size, .. } if size > 0))
            .map(|entry| entry_path(directory.path(), &entry.path))
            .collect();
        assert!(files.len() > READ_AHEAD_FILES + 2);
        let (removed, shrunk) = (files.last().unwrap(), &files[2]);
        let mut reader = TreeReader::new(directory.path(), &tree, Vec::new());
        let mut buffer = vec![0u8; 1_000];
        // Start reading, so that the files after the first are opened ahead.
        assert!(reader.read(&mut buffer).unwrap() > 0);
        fs::remove_file(removed).unwrap();
        fs::write(shrunk, b"short").unwrap();
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
        // Every byte of the files before the removed one was delivered, and no more.
        let before_removed: u64 = tree
            .entries
            .iter()
            .take_while(|entry| entry_path(directory.path(), &entry.path) != *removed)
            .map(|entry| match entry.kind {
                EntryKind::File { size, .. } => size,
                _ => 0,
            })
            .sum();
        assert_eq!(delivered, before_removed);
        assert_eq!(reader.changed_files().load(Ordering::Relaxed), 1);
    }
}
