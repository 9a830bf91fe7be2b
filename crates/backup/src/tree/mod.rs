//! Directory backups: a tree's metadata and contents as one byte stream.
//!
//! A directory backup's stream is the contents of its regular files, concatenated in walk
//! order (only the data extents of sparse files), followed by the encoded [`Tree`]: one
//! [`TreeEntry`] per file, directory, symbolic link, hard link, FIFO or device, with its mode,
//! owner, times and extended attributes (and, for a regular file, the [`FileStamp`] the next
//! backup's files cache compares). Both parts are chunked and deduplicated like any stream,
//! each file and the tree starting a new chunk, so an unchanged tree costs almost nothing in
//! the next backup, and unchanged files are not even read ([`crate::files_cache`]). The backup record
//! keeps where the tree starts ([`crate::series::TreeRange`]).
//!
//! - [`capture`] walks a directory ([`capture::walk`]) and reads it as that stream
//!   ([`capture::TreeReader`]); the tree is encoded once every file has been read, so it
//!   records what was read (see there for files that change while they are read).
//! - [`apply`] recreates a tree in a target directory from the entries and the contents, with
//!   every operation confined beneath the target ([`beneath`]).
//! - [`archive`] writes a tree and its contents as a POSIX pax tar archive instead.
//! - [`exclude`] matches the exclude patterns of a backup; [`capture::Selection`] roots a
//!   backup of several paths at their deepest common directory.
//! - [`select`] chooses part of a tree for a restore (`--include`), [`compare`] tells what
//!   differs between two trees (`diff`, the summary after each backup).
//!
//! Names are stored as raw bytes (`OsStr` bytes), so names that are not UTF-8 survive. Paths
//! are relative to the backed-up directory, `/`-separated; the empty path is the directory
//! itself, whose metadata a restore applies to the target. Entries are in depth-first order
//! with each directory's children sorted by name bytes, so a parent always precedes its
//! children. Regular files' stream ranges follow the same order and never overlap; bytes
//! between them belong to no file (a file read again because it changed while it was read
//! leaves its earlier reading there).
//!
//! A stored tree is data from the repository, not a trusted program: before a restore creates
//! anything, [`Tree::validate`] rejects every entry that could lead outside the target or that
//! the walk cannot have produced.
//!
//! Format (little-endian, ends with a CRC-32C):
//!
//! ```text
//! "TRE2" | entry count u32 | entry*
//! entry: path blob | kind u8 | mode u32 | uid u32 | gid u32 | atime s i64 | atime ns u32 |
//!        mtime s i64 | mtime ns u32 | xattr count u32 | (name blob | value blob)* | details
//! details: directory, fifo: nothing;  file: size u64 | stream offset u64 | extent count u32 |
//!          (offset u64 | length u64)* | stamp u8 (0 none; 1 settled, 2 not: then ctime s i64 |
//!          ctime ns u32 | inode u64 | device u64);  symlink: target blob;  hard link: entry index u32;
//!          character or block device: rdev u64
//! ```

pub mod apply;
pub mod archive;
mod beneath;
pub mod capture;
pub mod compare;
pub mod exclude;
pub mod select;

use std::cmp::Ordering;

use crate::codec::{Decoder, Encoder};
use crate::error::Result;

/// Magic of an encoded tree.
const TREE_MAGIC: &[u8; 4] = b"TRE2";
/// Entries a tree may hold (a bound on memory while decoding a corrupt count).
pub const TREE_ENTRIES_MAX: usize = 1 << 28;

/// A run of bytes of a file that holds data (sparse files have holes between extents).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub offset: u64,
    pub length: u64,
}

/// What an entry is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryKind {
    Directory,
    /// A regular file whose extents lie in the stream from `stream_offset`, back to back.
    File {
        size: u64,
        stream_offset: u64,
        extents: Vec<Extent>,
    },
    Symlink {
        target: Vec<u8>,
    },
    /// Another name of the regular file at entry `target`.
    HardLink {
        target: u32,
    },
    Fifo,
    CharDevice {
        rdev: u64,
    },
    BlockDevice {
        rdev: u64,
    },
}

/// One name in the tree and its metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeEntry {
    /// Relative path bytes; empty for the backed-up directory itself.
    pub path: Vec<u8>,
    pub kind: EntryKind,
    /// Permission bits, with set-user-id, set-group-id and sticky (`st_mode & 0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub atime: (i64, u32),
    pub mtime: (i64, u32),
    /// Extended attributes (name, value), sorted by name.
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// For a regular file: what identifies the version its contents in the stream are, for
    /// the next backup's files cache ([`FileStamp`]); `None` for other kinds, and for a file
    /// whose contents may not be that version (see [`capture`]).
    pub stamp: Option<FileStamp>,
}

/// The change time, inode and device of a regular file when it was backed up. When
/// `settled`, the stored contents are exactly the version the file had with them (and the
/// entry's size and mtime), and the next backup of the series reads the file again only when
/// one of the five differs ([`crate::files_cache`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStamp {
    pub ctime: (i64, u32),
    pub inode: u64,
    pub device: u64,
    /// The contents are one version, read long enough after its last change that a later
    /// change shows in these times.
    pub settled: bool,
}

impl FileStamp {
    /// The same ctime, inode and device: to the files cache, the same version of a file
    /// (with the same size and mtime).
    pub fn same_version(&self, other: &FileStamp) -> bool {
        (self.ctime, self.inode, self.device) == (other.ctime, other.inode, other.device)
    }
}

impl TreeEntry {
    /// Stream bytes of a regular file (the sum of its extents); 0 for other kinds.
    pub fn stream_bytes(&self) -> u64 {
        match &self.kind {
            EntryKind::File { extents, .. } => extents.iter().map(|extent| extent.length).sum(),
            _ => 0,
        }
    }
}

/// The metadata of a directory backup.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tree {
    pub entries: Vec<TreeEntry>,
}

impl Tree {
    /// Encodes the tree.
    pub fn encode(&self) -> Vec<u8> {
        let mut encoder = Encoder::with_capacity(64 + self.entries.len() * 96);
        encoder.raw(TREE_MAGIC);
        encoder.u32(self.entries.len() as u32);
        for entry in &self.entries {
            encoder.blob(&entry.path);
            encoder.u8(match entry.kind {
                EntryKind::Directory => 1,
                EntryKind::File { .. } => 2,
                EntryKind::Symlink { .. } => 3,
                EntryKind::HardLink { .. } => 4,
                EntryKind::Fifo => 5,
                EntryKind::CharDevice { .. } => 6,
                EntryKind::BlockDevice { .. } => 7,
            });
            encoder.u32(entry.mode);
            encoder.u32(entry.uid);
            encoder.u32(entry.gid);
            encoder.i64(entry.atime.0);
            encoder.u32(entry.atime.1);
            encoder.i64(entry.mtime.0);
            encoder.u32(entry.mtime.1);
            encoder.u32(entry.xattrs.len() as u32);
            for (name, value) in &entry.xattrs {
                encoder.blob(name);
                encoder.blob(value);
            }
            match &entry.kind {
                EntryKind::Directory | EntryKind::Fifo => {}
                EntryKind::File {
                    size,
                    stream_offset,
                    extents,
                } => {
                    encoder.u64(*size);
                    encoder.u64(*stream_offset);
                    encoder.u32(extents.len() as u32);
                    for extent in extents {
                        encoder.u64(extent.offset);
                        encoder.u64(extent.length);
                    }
                    match &entry.stamp {
                        None => encoder.u8(0),
                        Some(stamp) => {
                            encoder.u8(if stamp.settled { 1 } else { 2 });
                            encoder.i64(stamp.ctime.0);
                            encoder.u32(stamp.ctime.1);
                            encoder.u64(stamp.inode);
                            encoder.u64(stamp.device);
                        }
                    }
                }
                EntryKind::Symlink { target } => encoder.blob(target),
                EntryKind::HardLink { target } => encoder.u32(*target),
                EntryKind::CharDevice { rdev } | EntryKind::BlockDevice { rdev } => {
                    encoder.u64(*rdev)
                }
            }
        }
        encoder.finish()
    }

    /// Decodes a tree, checking its checksum, hard link targets and file extents.
    pub fn decode(bytes: &[u8]) -> Result<Tree> {
        let mut decoder = Decoder::new_checked(bytes, "directory tree")?;
        if [decoder.u8()?, decoder.u8()?, decoder.u8()?, decoder.u8()?] != *TREE_MAGIC {
            return decoder.invalid("bad magic");
        }
        let count = decoder.u32()? as usize;
        if count > TREE_ENTRIES_MAX {
            return decoder.invalid(format!("{count} entries exceed the limit"));
        }
        let mut entries = Vec::with_capacity(count);
        for _ in 0..count {
            let path = decoder.blob()?.to_vec();
            let kind_code = decoder.u8()?;
            let mode = decoder.u32()?;
            let uid = decoder.u32()?;
            let gid = decoder.u32()?;
            let atime = (decoder.i64()?, decoder.u32()?);
            let mtime = (decoder.i64()?, decoder.u32()?);
            let xattr_count = decoder.u32()? as usize;
            let mut xattrs = Vec::with_capacity(xattr_count.min(1024));
            for _ in 0..xattr_count {
                xattrs.push((decoder.blob()?.to_vec(), decoder.blob()?.to_vec()));
            }
            let mut stamp = None;
            let kind = match kind_code {
                1 => EntryKind::Directory,
                2 => {
                    let size = decoder.u64()?;
                    let stream_offset = decoder.u64()?;
                    let extent_count = decoder.u32()? as usize;
                    let mut extents = Vec::with_capacity(extent_count.min(1 << 16));
                    for _ in 0..extent_count {
                        let extent = Extent {
                            offset: decoder.u64()?,
                            length: decoder.u64()?,
                        };
                        if extent
                            .offset
                            .checked_add(extent.length)
                            .is_none_or(|end| end > size)
                        {
                            return decoder.invalid("a file extent lies past the file's end");
                        }
                        extents.push(extent);
                    }
                    stamp = match decoder.u8()? {
                        0 => None,
                        flag @ (1 | 2) => Some(FileStamp {
                            ctime: (decoder.i64()?, decoder.u32()?),
                            inode: decoder.u64()?,
                            device: decoder.u64()?,
                            settled: flag == 1,
                        }),
                        other => return decoder.invalid(format!("unknown stamp flag {other}")),
                    };
                    EntryKind::File {
                        size,
                        stream_offset,
                        extents,
                    }
                }
                3 => EntryKind::Symlink {
                    target: decoder.blob()?.to_vec(),
                },
                4 => {
                    let target = decoder.u32()?;
                    let valid = entries
                        .get(target as usize)
                        .is_some_and(|entry: &TreeEntry| {
                            matches!(entry.kind, EntryKind::File { .. })
                        });
                    if !valid {
                        return decoder
                            .invalid(format!("hard link to entry {target}, not an earlier file"));
                    }
                    EntryKind::HardLink { target }
                }
                5 => EntryKind::Fifo,
                6 => EntryKind::CharDevice {
                    rdev: decoder.u64()?,
                },
                7 => EntryKind::BlockDevice {
                    rdev: decoder.u64()?,
                },
                other => return decoder.invalid(format!("unknown entry kind {other}")),
            };
            entries.push(TreeEntry {
                path,
                kind,
                mode,
                uid,
                gid,
                atime,
                mtime,
                xattrs,
                stamp,
            });
        }
        decoder.finish()?;
        Ok(Tree { entries })
    }
}

/// An entry of a tree that a restore must not create, found by [`Tree::validate`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeProblem {
    pub path: Vec<u8>,
    pub detail: String,
}

/// Why `path` cannot be a stored path (relative, `/`-separated, no empty, `.` or `..`
/// component, no NUL byte), or `None` when it can.
fn path_problem(path: &[u8]) -> Option<&'static str> {
    if path.first() == Some(&b'/') {
        return Some("an absolute path");
    }
    if path.contains(&0) {
        return Some("a NUL byte in the path");
    }
    for component in path.split(|&byte| byte == b'/') {
        match component {
            b"" => return Some("an empty path component"),
            b"." => return Some("a `.` path component"),
            b".." => return Some("a `..` path component"),
            _ => {}
        }
    }
    None
}

/// Orders paths as the walk emits them: component by component, each by its bytes (so a
/// directory's whole subtree comes before its next sibling).
fn walk_order(a: &[u8], b: &[u8]) -> Ordering {
    a.split(|&byte| byte == b'/')
        .cmp(b.split(|&byte| byte == b'/'))
}

/// The parent of a non-empty stored path (empty for a child of the root).
pub(crate) fn parent_path(path: &[u8]) -> &[u8] {
    match path.iter().rposition(|&byte| byte == b'/') {
        Some(slash) => &path[..slash],
        None => &[],
    }
}

impl Tree {
    /// Checks what a restore relies on, so that a damaged or crafted tree cannot make it
    /// create anything outside its target: the first entry is the root directory (empty
    /// path); every other path is relative without empty, `.` or `..` components or NUL
    /// bytes; entries are in walk order without duplicates; every entry's parent is a
    /// directory entry of the tree; a hard link names an earlier regular file; a file's
    /// extents are ordered, disjoint and within its size; files' stream ranges are in entry
    /// order, disjoint and within the first `content_bytes` of the stream; symbolic link
    /// targets and attribute names hold no NUL byte.
    pub fn validate(&self, content_bytes: u64) -> Result<(), TreeProblem> {
        let problem = |path: &[u8], detail: &str| TreeProblem {
            path: path.to_vec(),
            detail: detail.to_string(),
        };
        let Some(root) = self.entries.first() else {
            return Err(problem(b"", "the tree has no entries"));
        };
        if !root.path.is_empty() || root.kind != EntryKind::Directory {
            return Err(problem(
                &root.path,
                "the first entry is not the backed-up directory",
            ));
        }
        // Directories from the root down to the previous entry's parent, as a stack.
        let mut directories: Vec<&[u8]> = vec![b""];
        let mut stream_end = 0u64;
        for (index, entry) in self.entries.iter().enumerate() {
            let path = entry.path.as_slice();
            if index > 0 {
                if let Some(detail) = path_problem(path) {
                    return Err(problem(path, detail));
                }
                let previous = &self.entries[index - 1].path;
                if walk_order(previous, path) != Ordering::Less {
                    return Err(problem(path, "out of order or a duplicate"));
                }
                let parent = parent_path(path);
                while let Some(&top) = directories.last() {
                    let is_ancestor = top.is_empty()
                        || parent == top
                        || (parent.starts_with(top) && parent.get(top.len()) == Some(&b'/'));
                    if is_ancestor {
                        break;
                    }
                    directories.pop();
                }
                if directories.last() != Some(&parent) {
                    return Err(problem(path, "its parent is not a directory of the tree"));
                }
            }
            if entry.kind == EntryKind::Directory && index > 0 {
                directories.push(path);
            }
            if entry
                .xattrs
                .iter()
                .any(|(name, _)| name.is_empty() || name.contains(&0))
            {
                return Err(problem(
                    path,
                    "an attribute name is empty or holds a NUL byte",
                ));
            }
            match &entry.kind {
                EntryKind::File {
                    size,
                    stream_offset,
                    extents,
                } => {
                    let mut file_end = 0u64;
                    for extent in extents {
                        let end = extent.offset.checked_add(extent.length);
                        if extent.offset < file_end || end.is_none_or(|end| end > *size) {
                            return Err(problem(path, "extents overlap or pass the file's end"));
                        }
                        file_end = end.expect("checked above");
                    }
                    let end = stream_offset.checked_add(entry.stream_bytes());
                    if *stream_offset < stream_end || end.is_none_or(|end| end > content_bytes) {
                        return Err(problem(
                            path,
                            "its contents overlap another file's or lie outside the stream",
                        ));
                    }
                    stream_end = end.expect("checked above");
                }
                EntryKind::HardLink { target } => {
                    let valid = (*target as usize) < index
                        && matches!(self.entries[*target as usize].kind, EntryKind::File { .. });
                    if !valid {
                        return Err(problem(path, "a hard link to no earlier regular file"));
                    }
                }
                EntryKind::Symlink { target } => {
                    if target.is_empty() || target.contains(&0) {
                        return Err(problem(
                            path,
                            "a symbolic link target that is empty or holds a NUL byte",
                        ));
                    }
                }
                EntryKind::Directory
                | EntryKind::Fifo
                | EntryKind::CharDevice { .. }
                | EntryKind::BlockDevice { .. } => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: every entry kind round-trips, a file's stamp too; a hard link to a non-file is
    /// rejected. Method: encode and decode a tree of each kind.
    #[test]
    fn tree_round_trip() {
        let base = TreeEntry {
            path: b"d/\xffname".to_vec(),
            kind: EntryKind::Directory,
            mode: 0o4755,
            uid: 1000,
            gid: 100,
            atime: (-5, 7),
            mtime: (1_700_000_000, 999_999_999),
            xattrs: vec![(b"user.a".to_vec(), b"\x00\x01".to_vec())],
            stamp: None,
        };
        let kinds = [
            EntryKind::Directory,
            EntryKind::File {
                size: 100,
                stream_offset: 7,
                extents: vec![Extent {
                    offset: 10,
                    length: 20,
                }],
            },
            EntryKind::Symlink {
                target: b"../x".to_vec(),
            },
            EntryKind::HardLink { target: 1 },
            EntryKind::Fifo,
            EntryKind::CharDevice { rdev: 0x0501 },
            EntryKind::BlockDevice { rdev: 0x0801 },
        ];
        let tree = Tree {
            entries: kinds
                .into_iter()
                .map(|kind| TreeEntry {
                    kind,
                    ..base.clone()
                })
                .collect(),
        };
        assert_eq!(Tree::decode(&tree.encode()).unwrap(), tree);
        // A file's stamp, settled or not.
        let mut stamped = tree.clone();
        for settled in [false, true] {
            stamped.entries[1].stamp = Some(FileStamp {
                ctime: (-3, 999_999_999),
                inode: u64::MAX,
                device: 0x0803,
                settled,
            });
            assert_eq!(Tree::decode(&stamped.encode()).unwrap(), stamped);
        }
        let mut broken = tree.clone();
        broken.entries[3].kind = EntryKind::HardLink { target: 0 };
        assert!(Tree::decode(&broken.encode()).is_err());
    }
}
