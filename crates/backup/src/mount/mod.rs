//! A read-only view of a series for `onecopy backup mount`: one directory per version, as
//! `restic mount` and `borg mount` show snapshots.
//!
//! Terms:
//!
//! - The **view** ([`SeriesView`]) is the namespace: a root directory holding one directory
//!   per version (`1`, `2`, ...) and a `latest` symbolic link to the newest. A directory
//!   backup's version directory is its tree's root; an image or stream backup's holds one
//!   file named after the series.
//! - **Inode numbers** are computed, not stored: version `v`'s entry `i` (in tree order) is
//!   `v << 32 | (i + 1)`, the root is 1 and `latest` 2. A hard link takes the number of the
//!   file it names, so both names are one inode, as they were when backed up.
//! - The **stream map** of a version ([`reader::StreamMap`]) is its resolved recipe with each
//!   chunk's stream offset; a read of a file maps the file's byte range through its extents
//!   to stream ranges and reads only the chunks they overlap ([`reader::ChunkReader`]).
//!
//! The path of a request:
//!
//! 1. The first lookup of a version loads it: the backup's recipe is resolved once, the tree
//!    is read from the end of its stream, decoded and validated ([`crate::tree::Tree::validate`]),
//!    and its directories are indexed by name. Loaded versions stay in memory until unmount.
//! 2. Attributes, directory listings, link targets and extended attributes come from the
//!    tree; nothing else is read.
//! 3. A read maps to stream ranges; each chunk is found through its segment record, read
//!    from its container, checked against its CRC and decompressed. A small cache keeps the
//!    chunks read last, so the kernel's consecutive small reads of one chunk read it once.
//!
//! Not guaranteed: the view is the store as it was when mounted. The command line holds the
//! backup face's lock while mounted (the catalog must not be opened by two processes while
//! one writes), so no backup of the repository changes underneath, and every other backup
//! command waits or fails until the view is unmounted.
//!
//! Damage never shows as wrong bytes: a chunk that fails its check, is recorded as lost or
//! whose container is gone fails the read with [`BackupError`] (EIO to the reader, with the
//! message in the mount's log); a version whose tree does not read or validate fails its
//! lookup the same way, and the other versions stay readable.

pub mod fuse;
pub mod reader;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::{BackupError, Result};
use crate::series::{load_backup, load_series, BackupRecord, SourceKind};
use crate::store::BackupStore;
use crate::tree::{EntryKind, Tree, TreeEntry};
use reader::{ChunkReader, StreamMap};

/// Inode number of the root directory (FUSE's root).
pub const ROOT_INODE: u64 = 1;
/// Inode number of the `latest` symbolic link.
pub const LATEST_INODE: u64 = 2;
/// Name of the symbolic link to the newest version.
pub const LATEST_NAME: &str = "latest";
/// Bits of an inode number that number an entry within its version.
const ENTRY_BITS: u32 = 32;

const _: () = assert!(crate::tree::TREE_ENTRIES_MAX < (1 << ENTRY_BITS) - 1);

/// The inode of entry `index` of `version`.
pub fn inode(version: u32, index: u32) -> u64 {
    assert!(version > 0, "versions start at 1");
    ((version as u64) << ENTRY_BITS) | (index as u64 + 1)
}

/// The version and entry index an inode number names (`None` for the root and `latest`).
pub fn split_inode(ino: u64) -> Option<(u32, u32)> {
    let version = (ino >> ENTRY_BITS) as u32;
    let entry = (ino & ((1 << ENTRY_BITS) - 1)) as u32;
    (version > 0 && entry > 0).then(|| (version, entry - 1))
}

/// What a node of the view is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeKind {
    Directory,
    File,
    Symlink,
    Fifo,
    CharDevice,
    BlockDevice,
}

/// The attributes of one node, as the kernel sees them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeAttributes {
    pub ino: u64,
    pub kind: NodeKind,
    /// Permission bits with set-user-id, set-group-id and sticky.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    /// 512-byte blocks the node's data takes in the stream (holes of sparse files excluded).
    pub blocks: u64,
    pub nlink: u32,
    pub rdev: u32,
    /// (seconds, nanoseconds) since the epoch.
    pub atime: (i64, u32),
    pub mtime: (i64, u32),
}

/// One loaded version.
pub struct VersionView {
    pub record: BackupRecord,
    content: VersionContent,
    stream: Arc<StreamMap>,
}

enum VersionContent {
    /// A directory backup: its tree, each directory's children (name, entry index) sorted by
    /// name, and each regular file's link count.
    Tree {
        tree: Tree,
        children: HashMap<u32, Vec<(Vec<u8>, u32)>>,
        links: HashMap<u32, u32>,
    },
    /// An image or stream: entry 0 is the version directory, entry 1 the file.
    Stream,
}

impl VersionView {
    /// Indexes `tree` (already validated) by directory.
    fn of_tree(record: BackupRecord, tree: Tree, stream: Arc<StreamMap>) -> VersionView {
        let mut directories: HashMap<&[u8], u32> = HashMap::new();
        let mut children: HashMap<u32, Vec<(Vec<u8>, u32)>> = HashMap::new();
        let mut links: HashMap<u32, u32> = HashMap::new();
        for (index, entry) in tree.entries.iter().enumerate() {
            let index = index as u32;
            if entry.kind == EntryKind::Directory {
                directories.insert(&entry.path, index);
                children.entry(index).or_default();
            }
            if index == 0 {
                continue;
            }
            let parent = directories[crate::tree::parent_path(&entry.path)];
            let name = match entry.path.iter().rposition(|&byte| byte == b'/') {
                Some(slash) => entry.path[slash + 1..].to_vec(),
                None => entry.path.clone(),
            };
            // Walk order sorts each directory's children by name, so pushing keeps them
            // sorted for the binary search of `lookup`.
            children.entry(parent).or_default().push((name, index));
            match entry.kind {
                EntryKind::File { .. } => *links.entry(index).or_insert(0) += 1,
                EntryKind::HardLink { target } => *links.entry(target).or_insert(0) += 1,
                _ => {}
            }
        }
        VersionView {
            record,
            content: VersionContent::Tree {
                tree,
                children,
                links,
            },
            stream,
        }
    }

    /// The entry an index names, following a hard link to its file.
    fn entry(&self, index: u32) -> Option<(u32, &TreeEntry)> {
        let VersionContent::Tree { tree, .. } = &self.content else {
            return None;
        };
        let entry = tree.entries.get(index as usize)?;
        match entry.kind {
            EntryKind::HardLink { target } => Some((target, &tree.entries[target as usize])),
            _ => Some((index, entry)),
        }
    }

    fn attributes(&self, index: u32, view: &SeriesView) -> Option<NodeAttributes> {
        let version = self.record.version;
        let created = unix_time(self.record.created_unix_ns);
        if let VersionContent::Stream = self.content {
            let (kind, mode, size, nlink) = match index {
                0 => (NodeKind::Directory, 0o555, 0, 2),
                1 => (NodeKind::File, 0o444, self.record.logical_bytes, 1),
                _ => return None,
            };
            return Some(NodeAttributes {
                ino: inode(version, index),
                kind,
                mode,
                uid: view.owner.0,
                gid: view.owner.1,
                size,
                blocks: size.div_ceil(512),
                nlink,
                rdev: 0,
                atime: created,
                mtime: created,
            });
        }
        let VersionContent::Tree {
            children, links, ..
        } = &self.content
        else {
            unreachable!("matched above")
        };
        let (index, entry) = self.entry(index)?;
        let (kind, size, nlink, rdev) = match &entry.kind {
            EntryKind::Directory => {
                let subdirectories = children[&index]
                    .iter()
                    .filter(|(_, child)| {
                        self.entry(*child)
                            .is_some_and(|(_, entry)| entry.kind == EntryKind::Directory)
                    })
                    .count() as u32;
                (NodeKind::Directory, 0, 2 + subdirectories, 0)
            }
            EntryKind::File { size, .. } => (
                NodeKind::File,
                *size,
                links.get(&index).copied().unwrap_or(1),
                0,
            ),
            EntryKind::Symlink { target } => (NodeKind::Symlink, target.len() as u64, 1, 0),
            EntryKind::Fifo => (NodeKind::Fifo, 0, 1, 0),
            EntryKind::CharDevice { rdev } => (NodeKind::CharDevice, 0, 1, *rdev as u32),
            EntryKind::BlockDevice { rdev } => (NodeKind::BlockDevice, 0, 1, *rdev as u32),
            EntryKind::HardLink { .. } => unreachable!("entry() follows hard links"),
        };
        Some(NodeAttributes {
            ino: inode(version, index),
            kind,
            mode: entry.mode & 0o7777,
            uid: entry.uid,
            gid: entry.gid,
            size,
            blocks: entry.stream_bytes().div_ceil(512),
            nlink,
            rdev,
            atime: entry.atime,
            mtime: entry.mtime,
        })
    }
}

fn unix_time(unix_ns: u64) -> (i64, u32) {
    (
        (unix_ns / 1_000_000_000) as i64,
        (unix_ns % 1_000_000_000) as u32,
    )
}

/// One entry of a directory listing: name, inode, kind.
pub type DirectoryEntry = (Vec<u8>, u64, NodeKind);

/// The read-only namespace of one series (see the module documentation).
pub struct SeriesView {
    store: BackupStore,
    series: String,
    /// The series' backups by version, as they were when the view was made.
    backups: BTreeMap<u32, BackupRecord>,
    /// Versions loaded so far; a version that failed to load is tried again on its next
    /// lookup (the failure may have been a passing I/O error).
    versions: Mutex<HashMap<u32, Arc<VersionView>>>,
    chunks: ChunkReader,
    /// Owner of the nodes the view makes up (root, image and stream files): the mounting
    /// user.
    owner: (u32, u32),
}

impl SeriesView {
    /// The view of `series` in `store` (opened read-only by the caller, who holds the face's
    /// lock for as long as the view lives). Reads the series' backup records only; trees are
    /// read on first use.
    pub fn new(store: BackupStore, series: &str, owner: (u32, u32)) -> Result<SeriesView> {
        let read = store.catalog.read()?;
        let record = load_series(&read, series)?;
        let mut backups = BTreeMap::new();
        for &id in record.versions.values() {
            let backup = load_backup(&read, id)?;
            backups.insert(backup.version, backup);
        }
        drop(read);
        Ok(SeriesView {
            store,
            series: series.to_string(),
            backups,
            versions: Mutex::new(HashMap::new()),
            chunks: ChunkReader::new(),
            owner,
        })
    }

    /// The series shown.
    pub fn series(&self) -> &str {
        &self.series
    }

    /// The versions shown, oldest first.
    pub fn versions(&self) -> impl Iterator<Item = u32> + '_ {
        self.backups.keys().copied()
    }

    /// Version `version`, loaded on first use.
    pub fn version(&self, version: u32) -> Result<Option<Arc<VersionView>>> {
        if let Some(loaded) = self.versions.lock().get(&version) {
            return Ok(Some(Arc::clone(loaded)));
        }
        let Some(record) = self.backups.get(&version) else {
            return Ok(None);
        };
        let loaded = Arc::new(self.load(record)?);
        let mut versions = self.versions.lock();
        let loaded = versions.entry(version).or_insert(loaded);
        Ok(Some(Arc::clone(loaded)))
    }

    fn load(&self, record: &BackupRecord) -> Result<VersionView> {
        let name = format!("{}@{}", record.series, record.version);
        let stream = Arc::new(StreamMap::load(&self.store, record)?);
        if record.source != SourceKind::Directory {
            return Ok(VersionView {
                record: record.clone(),
                content: VersionContent::Stream,
                stream,
            });
        }
        let range = record
            .tree
            .ok_or_else(|| BackupError::corrupt(format!("backup {name}"), "no tree"))?;
        let bytes = self.chunks.read(
            &self.store,
            &stream,
            range.offset,
            range.offset + range.bytes,
        )?;
        let tree = Tree::decode(&bytes)?;
        tree.validate(range.offset)
            .map_err(|problem| BackupError::corrupt_tree(&name, &problem.path, problem.detail))?;
        Ok(VersionView::of_tree(record.clone(), tree, stream))
    }

    /// The attributes of `ino`.
    pub fn attributes(&self, ino: u64) -> Result<Option<NodeAttributes>> {
        let newest = self.backups.values().next_back();
        let time = unix_time(newest.map_or(0, |backup| backup.created_unix_ns));
        let made_up = |ino, kind, mode, size, nlink| NodeAttributes {
            ino,
            kind,
            mode,
            uid: self.owner.0,
            gid: self.owner.1,
            size,
            blocks: 0,
            nlink,
            rdev: 0,
            atime: time,
            mtime: time,
        };
        match ino {
            ROOT_INODE => Ok(Some(made_up(
                ROOT_INODE,
                NodeKind::Directory,
                0o555,
                0,
                2 + self.backups.len() as u32,
            ))),
            LATEST_INODE => Ok(self.latest_target().map(|target| {
                made_up(
                    LATEST_INODE,
                    NodeKind::Symlink,
                    0o777,
                    target.len() as u64,
                    1,
                )
            })),
            _ => {
                let Some((version, index)) = split_inode(ino) else {
                    return Ok(None);
                };
                Ok(self
                    .version(version)?
                    .and_then(|loaded| loaded.attributes(index, self)))
            }
        }
    }

    /// The target of `latest`: the newest version's number (`None` without backups).
    pub fn latest_target(&self) -> Option<Vec<u8>> {
        self.backups
            .keys()
            .next_back()
            .map(|version| version.to_string().into_bytes())
    }

    /// The node `name` in directory `parent`.
    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Option<NodeAttributes>> {
        if parent == ROOT_INODE {
            if name == LATEST_NAME.as_bytes() {
                return self.attributes(LATEST_INODE);
            }
            let Some(version) = std::str::from_utf8(name)
                .ok()
                .filter(|text| !text.starts_with('0') && !text.starts_with('+'))
                .and_then(|text| text.parse::<u32>().ok())
            else {
                return Ok(None);
            };
            if !self.backups.contains_key(&version) {
                return Ok(None);
            }
            return self.attributes(inode(version, 0));
        }
        let Some((version, index)) = split_inode(parent) else {
            return Ok(None);
        };
        let Some(loaded) = self.version(version)? else {
            return Ok(None);
        };
        let child = match &loaded.content {
            VersionContent::Stream => (index == 0 && name == self.series.as_bytes()).then_some(1),
            VersionContent::Tree { children, .. } => children.get(&index).and_then(|list| {
                list.binary_search_by(|(child, _)| child.as_slice().cmp(name))
                    .ok()
                    .map(|position| list[position].1)
            }),
        };
        Ok(child.and_then(|child| loaded.attributes(child, self)))
    }

    /// The entries of directory `ino`, `.` and `..` first; `None` when it is not a directory.
    pub fn read_directory(&self, ino: u64) -> Result<Option<Vec<DirectoryEntry>>> {
        if ino == ROOT_INODE {
            let mut entries = vec![
                (b".".to_vec(), ROOT_INODE, NodeKind::Directory),
                (b"..".to_vec(), ROOT_INODE, NodeKind::Directory),
            ];
            if self.latest_target().is_some() {
                entries.push((
                    LATEST_NAME.as_bytes().to_vec(),
                    LATEST_INODE,
                    NodeKind::Symlink,
                ));
            }
            for &version in self.backups.keys() {
                entries.push((
                    version.to_string().into_bytes(),
                    inode(version, 0),
                    NodeKind::Directory,
                ));
            }
            return Ok(Some(entries));
        }
        let Some((version, index)) = split_inode(ino) else {
            return Ok(None);
        };
        let Some(loaded) = self.version(version)? else {
            return Ok(None);
        };
        match &loaded.content {
            VersionContent::Stream if index == 0 => Ok(Some(vec![
                (b".".to_vec(), ino, NodeKind::Directory),
                (b"..".to_vec(), ROOT_INODE, NodeKind::Directory),
                (
                    self.series.as_bytes().to_vec(),
                    inode(version, 1),
                    NodeKind::File,
                ),
            ])),
            VersionContent::Stream => Ok(None),
            VersionContent::Tree { tree, children, .. } => {
                let Some(list) = children.get(&index) else {
                    return Ok(None);
                };
                let parent = if index == 0 {
                    ROOT_INODE
                } else {
                    let parent_path = crate::tree::parent_path(&tree.entries[index as usize].path);
                    let parent_index = tree
                        .entries
                        .iter()
                        .position(|entry| entry.path == parent_path)
                        .expect("a validated tree holds every parent")
                        as u32;
                    inode(version, parent_index)
                };
                let mut entries = vec![
                    (b".".to_vec(), ino, NodeKind::Directory),
                    (b"..".to_vec(), parent, NodeKind::Directory),
                ];
                for (name, child) in list {
                    if let Some(attributes) = loaded.attributes(*child, self) {
                        entries.push((name.clone(), attributes.ino, attributes.kind));
                    }
                }
                Ok(Some(entries))
            }
        }
    }

    /// The target of symbolic link `ino`.
    pub fn read_link(&self, ino: u64) -> Result<Option<Vec<u8>>> {
        if ino == LATEST_INODE {
            return Ok(self.latest_target());
        }
        let Some((version, index)) = split_inode(ino) else {
            return Ok(None);
        };
        let Some(loaded) = self.version(version)? else {
            return Ok(None);
        };
        Ok(match loaded.entry(index) {
            Some((
                _,
                TreeEntry {
                    kind: EntryKind::Symlink { target },
                    ..
                },
            )) => Some(target.clone()),
            _ => None,
        })
    }

    /// The extended attributes of `ino` (name, value), sorted by name.
    pub fn xattrs(&self, ino: u64) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let Some((version, index)) = split_inode(ino) else {
            return Ok(Vec::new());
        };
        let Some(loaded) = self.version(version)? else {
            return Ok(Vec::new());
        };
        Ok(loaded
            .entry(index)
            .map(|(_, entry)| entry.xattrs.clone())
            .unwrap_or_default())
    }

    /// Bytes `[offset, offset + length)` of regular file `ino` (fewer at its end); `None`
    /// when `ino` is not a regular file. Holes of sparse files read as zeros without reading
    /// the store.
    pub fn read(&self, ino: u64, offset: u64, length: u32) -> Result<Option<Vec<u8>>> {
        let Some((version, index)) = split_inode(ino) else {
            return Ok(None);
        };
        let Some(loaded) = self.version(version)? else {
            return Ok(None);
        };
        if let VersionContent::Stream = loaded.content {
            if index != 1 {
                return Ok(None);
            }
            let size = loaded.record.logical_bytes;
            let end = offset.saturating_add(length as u64).min(size);
            if offset >= end {
                return Ok(Some(Vec::new()));
            }
            return self
                .chunks
                .read(&self.store, &loaded.stream, offset, end)
                .map(Some);
        }
        let Some((
            _,
            TreeEntry {
                kind:
                    EntryKind::File {
                        size,
                        stream_offset,
                        extents,
                    },
                ..
            },
        )) = loaded.entry(index)
        else {
            return Ok(None);
        };
        let end = offset.saturating_add(length as u64).min(*size);
        if offset >= end {
            return Ok(Some(Vec::new()));
        }
        let mut data = vec![0u8; (end - offset) as usize];
        let mut stream_position = *stream_offset;
        for extent in extents {
            let extent_end = extent.offset + extent.length;
            let (start, stop) = (offset.max(extent.offset), end.min(extent_end));
            if start < stop {
                let from = stream_position + (start - extent.offset);
                let bytes =
                    self.chunks
                        .read(&self.store, &loaded.stream, from, from + (stop - start))?;
                data[(start - offset) as usize..(stop - offset) as usize].copy_from_slice(&bytes);
            }
            stream_position += extent.length;
        }
        Ok(Some(data))
    }

    /// Nodes of every loaded version (for `statfs`).
    pub fn loaded_nodes(&self) -> u64 {
        let versions = self.versions.lock();
        versions
            .values()
            .map(|loaded| match &loaded.content {
                VersionContent::Tree { tree, .. } => tree.entries.len() as u64,
                VersionContent::Stream => 2,
            })
            .sum::<u64>()
            + 2
    }
}
