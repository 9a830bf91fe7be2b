//! Names and attributes: lookup, create, link, unlink, rename, setattr, xattrs, and the
//! file systems themselves (create, delete, configure).

use crate::changes::{FileSystemRecord, FsChange, FsId};
use crate::error::{FsError, Result};
use crate::node::{Attributes, Ino, Inode, Kind, ROOT};
use crate::options::{FsOptions, OptionChanges};

use super::{now_ns, update_inode, FsEngine, State};

/// Longest name of a directory entry.
pub const NAME_BYTES_MAX: usize = 255;
/// Longest symbolic link target.
pub const TARGET_BYTES_MAX: usize = 4096;
/// Largest xattr value.
pub const XATTR_VALUE_BYTES_MAX: usize = 64 << 10;
/// Most xattrs on one inode.
pub const XATTRS_PER_INODE_MAX: usize = 1024;
/// Most hard links to one inode.
pub const LINKS_MAX: u32 = 65_000;

/// An inode's number and attributes, as a reply needs them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeInfo {
    pub ino: Ino,
    pub attributes: Attributes,
    /// 512-byte blocks of mapped data (holes excluded).
    pub blocks: u64,
}

impl NodeInfo {
    pub(crate) fn of(ino: Ino, inode: &Inode) -> NodeInfo {
        NodeInfo {
            ino,
            attributes: inode.attributes,
            blocks: inode.mapped_bytes().div_ceil(4096) * 8,
        }
    }
}

/// Who asks: the requesting process's ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
}

/// What a new inode is.
#[derive(Clone, Debug)]
pub struct NewNode {
    pub kind: Kind,
    /// Permission bits (umask applied).
    pub mode: u32,
    pub rdev: u32,
    /// The target of a symbolic link.
    pub target: Vec<u8>,
}

/// Timestamps a setattr sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeChange {
    Now,
    At(i64),
}

/// What a setattr changes.
#[derive(Clone, Copy, Debug, Default)]
pub struct AttributeChanges {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeChange>,
    pub mtime: Option<TimeChange>,
    /// The change time the kernel keeps itself with the writeback cache (otherwise it is the
    /// time of the change).
    pub ctime: Option<i64>,
}

fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > NAME_BYTES_MAX {
        return Err(FsError::posix(libc::ENAMETOOLONG, "name"));
    }
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
        return Err(FsError::posix(libc::EINVAL, "name"));
    }
    Ok(())
}

/// Removes an inode without links: its extents (releasing their chunks), then the inode.
pub(crate) fn drop_inode(state: &mut State, fs: FsId, ino: Ino) -> Result<()> {
    let extents: Vec<(u64, crate::node::Extent)> = state
        .system(fs)?
        .inode(ino)?
        .extents
        .iter()
        .map(|(offset, extent)| (*offset, *extent))
        .collect();
    for (offset, extent) in extents {
        // The inode has no links (or its file system is being deleted): a crash between
        // records leaves an orphan that opening removes.
        state.log_if_large()?;
        state.push(FsChange::Extent {
            fs,
            ino,
            offset,
            extent: None,
        })?;
        state.release_chunk(extent.chunk)?;
    }
    state.push(FsChange::InodeRemoved { fs, ino })
}

fn directory(state: &State, fs: FsId, ino: Ino) -> Result<&Inode> {
    let inode = state.system(fs)?.inode(ino)?;
    if inode.attributes.kind != Kind::Directory {
        return Err(FsError::posix(libc::ENOTDIR, format!("inode {ino}")));
    }
    Ok(inode)
}

fn touch_directory(state: &mut State, fs: FsId, parent: Ino, links: i64) -> Result<()> {
    let now = now_ns();
    update_inode(state, fs, parent, |inode| {
        inode.attributes.mtime_ns = now;
        inode.attributes.ctime_ns = now;
        inode.attributes.nlink = (inode.attributes.nlink as i64 + links) as u32;
    })
}

/// Drops one link of `ino` (its entry is already gone): removes the inode when it has no
/// links left and no open handles.
fn unlink_inode(state: &mut State, fs: FsId, ino: Ino) -> Result<()> {
    let now = now_ns();
    let kind = state.system(fs)?.inode(ino)?.attributes.kind;
    update_inode(state, fs, ino, |inode| {
        inode.attributes.nlink = if kind == Kind::Directory {
            0
        } else {
            inode.attributes.nlink.saturating_sub(1)
        };
        inode.attributes.ctime_ns = now;
    })?;
    let system = state.system(fs)?;
    let open = system.open_handles.get(&ino).copied().unwrap_or(0);
    if system.inode(ino)?.attributes.nlink == 0 && (open == 0 || kind == Kind::Directory) {
        drop_inode(state, fs, ino)?;
    }
    Ok(())
}

impl FsEngine {
    /// Creates file system `name` with an empty root directory owned by `owner`.
    pub fn create_file_system(
        &self,
        name: &str,
        options: FsOptions,
        owner: Caller,
    ) -> Result<FsId> {
        options.validate()?;
        if name.is_empty() || name.len() > 128 || name.contains('/') || name.starts_with('.') {
            return Err(FsError::InvalidArgument(format!(
                "file system name {name:?}: use 1 to 128 characters, no '/', not starting with '.'"
            )));
        }
        self.mutate(|state| {
            if state
                .systems
                .values()
                .any(|system| system.record.name == name)
            {
                return Err(FsError::Core(onecopy_core::Error::AlreadyExists(format!(
                    "file system {name:?}"
                ))));
            }
            let id = state.next_fs_id;
            state.next_fs_id += 1;
            state.push(FsChange::FileSystemSet(Box::new(FileSystemRecord {
                id,
                name: name.to_string(),
                options,
                created: onecopy_core::chunk_store::unix_seconds(),
                deleting: false,
            })))?;
            let now = now_ns();
            let root = Inode::new(
                Attributes {
                    kind: Kind::Directory,
                    mode: 0o755,
                    uid: owner.uid,
                    gid: owner.gid,
                    nlink: 2,
                    size: 0,
                    rdev: 0,
                    atime_ns: now,
                    mtime_ns: now,
                    ctime_ns: now,
                    birth_ns: now,
                },
                ROOT,
            );
            state.push(FsChange::InodeSet {
                fs: id,
                ino: ROOT,
                inode: Box::new(root),
            })?;
            Ok(id)
        })
    }

    /// Deletes file system `fs` and every file in it (their chunks are released). The file
    /// system is first marked as being deleted (it disappears from names at once); a
    /// deletion a crash interrupted is finished by the next open.
    pub fn delete_file_system(&self, fs: FsId) -> Result<()> {
        self.mutate(|state| {
            let mut record = state.system(fs)?.record.clone();
            record.deleting = true;
            state.push(FsChange::FileSystemSet(Box::new(record)))?;
            state.log_changes()?;
            let inos: Vec<Ino> = state.system(fs)?.inodes.keys().copied().collect();
            for ino in inos {
                state.log_if_large()?;
                drop_inode(state, fs, ino)?;
            }
            state.push(FsChange::FileSystemRemoved(fs))
        })
    }

    /// Changes the options of file system `fs`; returns the new ones.
    pub fn configure(&self, fs: FsId, changes: &OptionChanges) -> Result<FsOptions> {
        self.mutate(|state| {
            let mut record = state.system(fs)?.record.clone();
            record.options = changes.applied_to(&record.options)?;
            let options = record.options.clone();
            state.push(FsChange::FileSystemSet(Box::new(record)))?;
            Ok(options)
        })
    }

    /// The attributes of `ino`.
    pub fn getattr(&self, fs: FsId, ino: Ino) -> Result<NodeInfo> {
        let state = self.state.lock();
        Ok(NodeInfo::of(ino, state.system(fs)?.inode(ino)?))
    }

    /// The inode `name` names in directory `parent`.
    pub fn lookup(&self, fs: FsId, parent: Ino, name: &[u8]) -> Result<NodeInfo> {
        let state = self.state.lock();
        let directory = directory(&state, fs, parent)?;
        let ino = match name {
            b"." => parent,
            b".." => directory.parent,
            _ => *directory
                .entries
                .get(name)
                .ok_or_else(|| FsError::posix(libc::ENOENT, "lookup"))?,
        };
        Ok(NodeInfo::of(ino, state.system(fs)?.inode(ino)?))
    }

    /// Creates `name` in `parent`.
    pub fn create_node(
        &self,
        fs: FsId,
        parent: Ino,
        name: &[u8],
        node: NewNode,
        caller: Caller,
    ) -> Result<NodeInfo> {
        check_name(name)?;
        if node.target.len() > TARGET_BYTES_MAX {
            return Err(FsError::posix(libc::ENAMETOOLONG, "symbolic link target"));
        }
        self.mutate(|state| {
            self.admit(state, node.target.len() as u64)?;
            let parent_inode = directory(state, fs, parent)?;
            if parent_inode.attributes.nlink == 0 {
                return Err(FsError::posix(libc::ENOENT, "directory was removed"));
            }
            if parent_inode.entries.contains_key(name) {
                return Err(FsError::posix(libc::EEXIST, "create"));
            }
            // BSD group semantics under a set-group-id directory, which directories inherit.
            let inherit_group = parent_inode.attributes.mode & libc::S_ISGID != 0;
            let gid = if inherit_group {
                parent_inode.attributes.gid
            } else {
                caller.gid
            };
            let mut mode = node.mode & 0o7777;
            if inherit_group && node.kind == Kind::Directory {
                mode |= libc::S_ISGID;
            }
            if node.kind == Kind::Symlink {
                mode = 0o777;
            }
            let now = now_ns();
            let system = state.system_mut(fs)?;
            let ino = system.next_ino;
            system.next_ino += 1;
            let mut inode = Inode::new(
                Attributes {
                    kind: node.kind,
                    mode,
                    uid: caller.uid,
                    gid,
                    nlink: if node.kind == Kind::Directory { 2 } else { 1 },
                    size: if node.kind == Kind::Symlink {
                        node.target.len() as u64
                    } else {
                        0
                    },
                    rdev: node.rdev,
                    atime_ns: now,
                    mtime_ns: now,
                    ctime_ns: now,
                    birth_ns: now,
                },
                parent,
            );
            inode.target = node.target;
            inode.monitor.stamp = state.next_stamp();
            let info = NodeInfo::of(ino, &inode);
            state.push(FsChange::InodeSet {
                fs,
                ino,
                inode: Box::new(inode),
            })?;
            state.push(FsChange::Entry {
                fs,
                parent,
                name: name.to_vec(),
                child: Some(ino),
            })?;
            let links = if node.kind == Kind::Directory { 1 } else { 0 };
            touch_directory(state, fs, parent, links)?;
            Ok(info)
        })
    }

    /// Adds the name `name` in `parent` for `ino`.
    pub fn link(&self, fs: FsId, ino: Ino, parent: Ino, name: &[u8]) -> Result<NodeInfo> {
        check_name(name)?;
        self.mutate(|state| {
            self.admit(state, 0)?;
            let parent_inode = directory(state, fs, parent)?;
            if parent_inode.entries.contains_key(name) {
                return Err(FsError::posix(libc::EEXIST, "link"));
            }
            let inode = state.system(fs)?.inode(ino)?;
            if inode.attributes.kind == Kind::Directory {
                return Err(FsError::posix(libc::EPERM, "hard link to a directory"));
            }
            if inode.attributes.nlink >= LINKS_MAX {
                return Err(FsError::posix(libc::EMLINK, "link"));
            }
            let now = now_ns();
            update_inode(state, fs, ino, |inode| {
                inode.attributes.nlink += 1;
                inode.attributes.ctime_ns = now;
            })?;
            state.push(FsChange::Entry {
                fs,
                parent,
                name: name.to_vec(),
                child: Some(ino),
            })?;
            touch_directory(state, fs, parent, 0)?;
            Ok(NodeInfo::of(ino, state.system(fs)?.inode(ino)?))
        })
    }

    /// Removes the entry `name` of `parent`: a non-directory (`directory` false) or an empty
    /// directory.
    pub fn remove(&self, fs: FsId, parent: Ino, name: &[u8], is_directory: bool) -> Result<()> {
        self.mutate(|state| {
            let parent_inode = directory(state, fs, parent)?;
            let ino = *parent_inode
                .entries
                .get(name)
                .ok_or_else(|| FsError::posix(libc::ENOENT, "remove"))?;
            let inode = state.system(fs)?.inode(ino)?;
            let is_dir = inode.attributes.kind == Kind::Directory;
            if is_directory && !is_dir {
                return Err(FsError::posix(libc::ENOTDIR, "rmdir"));
            }
            if !is_directory && is_dir {
                return Err(FsError::posix(libc::EISDIR, "unlink"));
            }
            if is_dir && !inode.entries.is_empty() {
                return Err(FsError::posix(libc::ENOTEMPTY, "rmdir"));
            }
            state.push(FsChange::Entry {
                fs,
                parent,
                name: name.to_vec(),
                child: None,
            })?;
            touch_directory(state, fs, parent, if is_dir { -1 } else { 0 })?;
            unlink_inode(state, fs, ino)
        })
    }

    /// Renames `parent/name` to `new_parent/new_name`; `no_replace` fails if the target
    /// exists, `exchange` swaps the two.
    #[allow(clippy::too_many_arguments)]
    pub fn rename(
        &self,
        fs: FsId,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        no_replace: bool,
        exchange: bool,
    ) -> Result<()> {
        check_name(new_name)?;
        self.mutate(|state| {
            let source = *directory(state, fs, parent)?
                .entries
                .get(name)
                .ok_or_else(|| FsError::posix(libc::ENOENT, "rename source"))?;
            let target = directory(state, fs, new_parent)?
                .entries
                .get(new_name)
                .copied();
            let system = state.system(fs)?;
            let source_is_dir = system.inode(source)?.attributes.kind == Kind::Directory;
            // A directory may not move below itself.
            let mut ancestor = new_parent;
            loop {
                if ancestor == source {
                    return Err(FsError::posix(libc::EINVAL, "rename into itself"));
                }
                if ancestor == ROOT {
                    break;
                }
                ancestor = system.inode(ancestor)?.parent;
            }
            if exchange {
                let target = target.ok_or_else(|| FsError::posix(libc::ENOENT, "exchange"))?;
                let target_is_dir = system.inode(target)?.attributes.kind == Kind::Directory;
                if target_is_dir {
                    let mut ancestor = parent;
                    loop {
                        if ancestor == target {
                            return Err(FsError::posix(libc::EINVAL, "exchange into itself"));
                        }
                        if ancestor == ROOT {
                            break;
                        }
                        ancestor = system.inode(ancestor)?.parent;
                    }
                }
                state.push(FsChange::Entry {
                    fs,
                    parent,
                    name: name.to_vec(),
                    child: Some(target),
                })?;
                state.push(FsChange::Entry {
                    fs,
                    parent: new_parent,
                    name: new_name.to_vec(),
                    child: Some(source),
                })?;
                let now = now_ns();
                for (ino, new_home, is_dir) in [
                    (source, new_parent, source_is_dir),
                    (target, parent, target_is_dir),
                ] {
                    update_inode(state, fs, ino, |inode| {
                        inode.attributes.ctime_ns = now;
                        if is_dir {
                            inode.parent = new_home;
                        }
                    })?;
                }
                // Each parent loses the directory it gave and gains the one it got.
                let moved = source_is_dir as i64 - target_is_dir as i64;
                if new_parent == parent {
                    touch_directory(state, fs, parent, 0)?;
                } else {
                    touch_directory(state, fs, parent, -moved)?;
                    touch_directory(state, fs, new_parent, moved)?;
                }
                return Ok(());
            }
            if let Some(target) = target {
                if no_replace {
                    return Err(FsError::posix(libc::EEXIST, "rename target"));
                }
                if target == source {
                    return Ok(());
                }
                let target_inode = system.inode(target)?;
                let target_is_dir = target_inode.attributes.kind == Kind::Directory;
                if source_is_dir && !target_is_dir {
                    return Err(FsError::posix(libc::ENOTDIR, "rename target"));
                }
                if !source_is_dir && target_is_dir {
                    return Err(FsError::posix(libc::EISDIR, "rename target"));
                }
                if target_is_dir && !target_inode.entries.is_empty() {
                    return Err(FsError::posix(libc::ENOTEMPTY, "rename target"));
                }
            }
            state.push(FsChange::Entry {
                fs,
                parent,
                name: name.to_vec(),
                child: None,
            })?;
            state.push(FsChange::Entry {
                fs,
                parent: new_parent,
                name: new_name.to_vec(),
                child: Some(source),
            })?;
            let now = now_ns();
            update_inode(state, fs, source, |inode| {
                inode.attributes.ctime_ns = now;
                if source_is_dir {
                    inode.parent = new_parent;
                }
            })?;
            let replaced_dir = match target {
                Some(target) => {
                    let is_dir =
                        state.system(fs)?.inode(target)?.attributes.kind == Kind::Directory;
                    unlink_inode(state, fs, target)?;
                    is_dir
                }
                None => false,
            };
            let moved = source_is_dir as i64;
            touch_directory(state, fs, parent, -moved)?;
            touch_directory(state, fs, new_parent, moved - replaced_dir as i64)?;
            Ok(())
        })
    }

    /// Changes attributes (truncating when the size changes).
    pub fn setattr(&self, fs: FsId, ino: Ino, changes: AttributeChanges) -> Result<NodeInfo> {
        self.mutate(|state| {
            let now = now_ns();
            if let Some(size) = changes.size {
                let kind = state.system(fs)?.inode(ino)?.attributes.kind;
                match kind {
                    Kind::File => super::data::truncate_locked(state, fs, ino, size, now)?,
                    Kind::Directory => return Err(FsError::posix(libc::EISDIR, "truncate")),
                    _ => return Err(FsError::posix(libc::EINVAL, "truncate")),
                }
            }
            update_inode(state, fs, ino, |inode| {
                let attributes = &mut inode.attributes;
                if let Some(mode) = changes.mode {
                    attributes.mode = mode & 0o7777;
                }
                if let Some(uid) = changes.uid {
                    attributes.uid = uid;
                }
                if let Some(gid) = changes.gid {
                    attributes.gid = gid;
                }
                let resolve = |change: TimeChange| match change {
                    TimeChange::Now => now,
                    TimeChange::At(ns) => ns,
                };
                if let Some(atime) = changes.atime {
                    attributes.atime_ns = resolve(atime);
                }
                if let Some(mtime) = changes.mtime {
                    attributes.mtime_ns = resolve(mtime);
                }
                attributes.ctime_ns = changes.ctime.unwrap_or(now);
            })?;
            Ok(NodeInfo::of(ino, state.system(fs)?.inode(ino)?))
        })
    }

    /// The target of symbolic link `ino`.
    pub fn readlink(&self, fs: FsId, ino: Ino) -> Result<Vec<u8>> {
        let state = self.state.lock();
        let inode = state.system(fs)?.inode(ino)?;
        if inode.attributes.kind != Kind::Symlink {
            return Err(FsError::posix(libc::EINVAL, "readlink"));
        }
        Ok(inode.target.clone())
    }

    /// The entries of directory `ino` from position `offset` on (positions count from 1;
    /// `.` and `..` are the first two), at most `limit`.
    pub fn read_directory(
        &self,
        fs: FsId,
        ino: Ino,
        offset: u64,
        limit: usize,
    ) -> Result<Vec<(u64, Vec<u8>, NodeInfo)>> {
        let state = self.state.lock();
        let system = state.system(fs)?;
        let directory = directory(&state, fs, ino)?;
        let dots = [(b".".to_vec(), ino), (b"..".to_vec(), directory.parent)];
        let mut out = Vec::new();
        let all = dots.into_iter().chain(
            directory
                .entries
                .iter()
                .map(|(name, child)| (name.clone(), *child)),
        );
        for (position, (name, child)) in all.enumerate().skip(offset as usize) {
            if out.len() >= limit {
                break;
            }
            let Ok(inode) = system.inode(child) else {
                continue;
            };
            out.push((position as u64 + 1, name, NodeInfo::of(child, inode)));
        }
        Ok(out)
    }

    /// Notes that a handle to `ino` was opened. The I/O monitor's read position of the file
    /// starts again at 0, as a new open file's position does (paper 3 §4.2.1 compares each
    /// read with the file position): reading a file whole again after opening it is
    /// sequential, not random. A reader still working through another handle then sees its
    /// next read counted random once.
    pub fn open_handle(&self, fs: FsId, ino: Ino) -> Result<()> {
        let mut state = self.state.lock();
        let system = state.system_mut(fs)?;
        system.inode(ino)?;
        *system.open_handles.entry(ino).or_default() += 1;
        system.read_positions.remove(&ino);
        Ok(())
    }

    /// Notes that a handle to `ino` was closed; an unlinked file goes with its last handle.
    pub fn release_handle(&self, fs: FsId, ino: Ino) -> Result<()> {
        let orphan = {
            let mut state = self.state.lock();
            let system = state.system_mut(fs)?;
            let count = system.open_handles.entry(ino).or_default();
            *count = count.saturating_sub(1);
            let last = *count == 0;
            if last {
                system.open_handles.remove(&ino);
            }
            last && system
                .inodes
                .get(&ino)
                .is_some_and(|inode| inode.attributes.nlink == 0)
        };
        if orphan {
            self.mutate(|state| drop_inode(state, fs, ino))?;
        }
        Ok(())
    }

    /// Sets xattr `name`; `create_only` fails if it exists, `replace_only` if it does not.
    pub fn set_xattr(
        &self,
        fs: FsId,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        create_only: bool,
        replace_only: bool,
    ) -> Result<()> {
        if name.is_empty() || name.len() > NAME_BYTES_MAX {
            return Err(FsError::posix(libc::ERANGE, "xattr name"));
        }
        if value.len() > XATTR_VALUE_BYTES_MAX {
            return Err(FsError::posix(libc::E2BIG, "xattr value"));
        }
        self.mutate(|state| {
            self.admit(state, value.len() as u64)?;
            let inode = state.system(fs)?.inode(ino)?;
            let exists = inode.xattrs.contains_key(name);
            if create_only && exists {
                return Err(FsError::posix(libc::EEXIST, "xattr"));
            }
            if replace_only && !exists {
                return Err(FsError::posix(libc::ENODATA, "xattr"));
            }
            if !exists && inode.xattrs.len() >= XATTRS_PER_INODE_MAX {
                return Err(FsError::posix(libc::ENOSPC, "xattrs of one inode"));
            }
            state.push(FsChange::Xattr {
                fs,
                ino,
                name: name.to_vec(),
                value: Some(value.to_vec()),
            })?;
            let now = now_ns();
            update_inode(state, fs, ino, |inode| inode.attributes.ctime_ns = now)
        })
    }

    /// The value of xattr `name`.
    pub fn get_xattr(&self, fs: FsId, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        let state = self.state.lock();
        state
            .system(fs)?
            .inode(ino)?
            .xattrs
            .get(name)
            .cloned()
            .ok_or_else(|| FsError::posix(libc::ENODATA, "xattr"))
    }

    /// The names of every xattr of `ino`.
    pub fn list_xattrs(&self, fs: FsId, ino: Ino) -> Result<Vec<Vec<u8>>> {
        let state = self.state.lock();
        Ok(state
            .system(fs)?
            .inode(ino)?
            .xattrs
            .keys()
            .cloned()
            .collect())
    }

    /// Removes xattr `name`.
    pub fn remove_xattr(&self, fs: FsId, ino: Ino, name: &[u8]) -> Result<()> {
        self.mutate(|state| {
            if !state.system(fs)?.inode(ino)?.xattrs.contains_key(name) {
                return Err(FsError::posix(libc::ENODATA, "xattr"));
            }
            state.push(FsChange::Xattr {
                fs,
                ino,
                name: name.to_vec(),
                value: None,
            })?;
            let now = now_ns();
            update_inode(state, fs, ino, |inode| inode.attributes.ctime_ns = now)
        })
    }
}
