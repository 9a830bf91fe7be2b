//! The FUSE adapter of the mounted view: kernel requests to [`SeriesView`] calls and back,
//! and the mount itself.
//!
//! The mount is read-only twice over: mounted `ro` (the kernel answers EROFS to every
//! change before it reaches us) and every changing request answered EROFS here too.
//! `nosuid` and `nodev` keep set-user-id files and device nodes of a backup from acting.
//! Permission checks are the kernel's (`default_permissions`) against the backed-up modes
//! and owners. Contents never change while mounted, so attributes and entries are cached
//! long and each file keeps its page cache across opens.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyXattr, Request, Session, SessionACL,
    SessionUnmounter,
};
use parking_lot::Mutex;

use super::{NodeAttributes, NodeKind, SeriesView};
use crate::error::{BackupError, Result};

/// How long the kernel may cache attributes and entries: the view never changes.
pub const ATTRIBUTE_TTL: Duration = Duration::from_secs(3600);
/// Largest read request the kernel sends.
pub const REQUEST_BYTES_MAX: u32 = 1 << 20;
/// Request threads.
pub const THREADS: usize = 4;

/// The mounted view of one series.
pub struct ViewFileSystem {
    view: SeriesView,
}

fn errno(error: &BackupError) -> Errno {
    // The reader sees only EIO; the log keeps what was wrong and where.
    eprintln!("onecopy backup mount: {error}");
    Errno::EIO
}

fn file_type(kind: NodeKind) -> FileType {
    match kind {
        NodeKind::Directory => FileType::Directory,
        NodeKind::File => FileType::RegularFile,
        NodeKind::Symlink => FileType::Symlink,
        NodeKind::Fifo => FileType::NamedPipe,
        NodeKind::CharDevice => FileType::CharDevice,
        NodeKind::BlockDevice => FileType::BlockDevice,
    }
}

fn time((seconds, nanoseconds): (i64, u32)) -> std::time::SystemTime {
    let whole = Duration::from_secs(seconds.unsigned_abs());
    if seconds >= 0 {
        UNIX_EPOCH + whole + Duration::from_nanos(nanoseconds as u64)
    } else {
        UNIX_EPOCH - whole + Duration::from_nanos(nanoseconds as u64)
    }
}

fn attr(node: &NodeAttributes) -> FileAttr {
    FileAttr {
        ino: INodeNo(node.ino),
        size: node.size,
        blocks: node.blocks,
        atime: time(node.atime),
        mtime: time(node.mtime),
        // The tree records no change time: the modification time stands in.
        ctime: time(node.mtime),
        crtime: time(node.mtime),
        kind: file_type(node.kind),
        perm: (node.mode & 0o7777) as u16,
        nlink: node.nlink,
        uid: node.uid,
        gid: node.gid,
        rdev: node.rdev,
        blksize: 4096,
        flags: 0,
    }
}

impl ViewFileSystem {
    pub fn new(view: SeriesView) -> ViewFileSystem {
        ViewFileSystem { view }
    }

    fn reply_entry(&self, found: Result<Option<NodeAttributes>>, reply: ReplyEntry) {
        match found {
            Ok(Some(node)) => reply.entry(&ATTRIBUTE_TTL, &attr(&node), Generation(0)),
            Ok(None) => reply.error(Errno::ENOENT),
            Err(error) => reply.error(errno(&error)),
        }
    }
}

impl Filesystem for ViewFileSystem {
    fn init(&mut self, _request: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_readahead(REQUEST_BYTES_MAX);
        Ok(())
    }

    fn lookup(&self, _request: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.reply_entry(self.view.lookup(parent.0, name.as_bytes()), reply);
    }

    fn getattr(&self, _request: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.view.attributes(ino.0) {
            Ok(Some(node)) => reply.attr(&ATTRIBUTE_TTL, &attr(&node)),
            Ok(None) => reply.error(Errno::ENOENT),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn readlink(&self, _request: &Request, ino: INodeNo, reply: ReplyData) {
        match self.view.read_link(ino.0) {
            Ok(Some(target)) => reply.data(&target),
            Ok(None) => reply.error(Errno::EINVAL),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn open(&self, _request: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.0 & libc::O_ACCMODE != libc::O_RDONLY || flags.0 & libc::O_TRUNC != 0 {
            reply.error(Errno::EROFS);
            return;
        }
        match self.view.attributes(ino.0) {
            Ok(Some(_)) => reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE),
            Ok(None) => reply.error(Errno::ENOENT),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn read(
        &self,
        _request: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.view.read(ino.0, offset, size.min(REQUEST_BYTES_MAX)) {
            Ok(Some(data)) => reply.data(&data),
            Ok(None) => reply.error(Errno::EISDIR),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn readdir(
        &self,
        _request: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        match self.view.read_directory(ino.0) {
            Ok(Some(entries)) => {
                for (position, (name, child, kind)) in
                    entries.iter().enumerate().skip(offset as usize)
                {
                    let next = position as u64 + 1;
                    if reply.add(
                        INodeNo(*child),
                        next,
                        file_type(*kind),
                        OsStr::from_bytes(name),
                    ) {
                        break;
                    }
                }
                reply.ok();
            }
            Ok(None) => reply.error(Errno::ENOTDIR),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn getxattr(
        &self,
        _request: &Request,
        ino: INodeNo,
        name: &OsStr,
        size: u32,
        reply: ReplyXattr,
    ) {
        let attributes = match self.view.xattrs(ino.0) {
            Ok(attributes) => attributes,
            Err(error) => return reply.error(errno(&error)),
        };
        match attributes
            .iter()
            .find(|(stored, _)| stored.as_slice() == name.as_bytes())
        {
            None => reply.error(Errno::ENODATA),
            Some((_, value)) if size == 0 => reply.size(value.len() as u32),
            Some((_, value)) if value.len() > size as usize => reply.error(Errno::ERANGE),
            Some((_, value)) => reply.data(value),
        }
    }

    fn listxattr(&self, _request: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let attributes = match self.view.xattrs(ino.0) {
            Ok(attributes) => attributes,
            Err(error) => return reply.error(errno(&error)),
        };
        let mut list = Vec::new();
        for (name, _) in &attributes {
            list.extend_from_slice(name);
            list.push(0);
        }
        if size == 0 {
            reply.size(list.len() as u32);
        } else if list.len() > size as usize {
            reply.error(Errno::ERANGE);
        } else {
            reply.data(&list);
        }
    }

    fn setxattr(
        &self,
        _request: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }

    fn removexattr(&self, _request: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn statfs(&self, _request: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // Nothing can be stored here: no free blocks, no free inodes.
        reply.statfs(0, 0, 0, self.view.loaded_nodes(), 0, 4096, 255, 4096);
    }
}

/// A mounted view whose requests run on background threads.
pub struct MountedView {
    unmounter: Arc<Mutex<SessionUnmounter>>,
    session: JoinHandle<std::io::Result<()>>,
    mount_point: PathBuf,
}

impl MountedView {
    /// Something that unmounts the view from another thread.
    pub fn unmounter(&self) -> Arc<Mutex<SessionUnmounter>> {
        Arc::clone(&self.unmounter)
    }

    /// Waits until the view is unmounted (by anyone).
    pub fn wait(self) -> Result<()> {
        let what = || format!("serving {}", self.mount_point.display());
        match self.session.join() {
            Ok(result) => result.map_err(|error| BackupError::io(what(), error)),
            Err(_) => Err(BackupError::io(
                what(),
                std::io::Error::other("a request thread panicked"),
            )),
        }
    }
}

/// Mounts `view` read-only at `mount_point`; returns once the kernel has the mount (the
/// session's INIT is answered on the session thread before any other request). The caller
/// checks first that FUSE works here.
pub fn mount(view: SeriesView, mount_point: &Path) -> Result<MountedView> {
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName(format!("onecopy-backup:{}", view.series())),
        MountOption::Subtype("onecopy".to_string()),
        MountOption::DefaultPermissions,
        MountOption::RO,
        MountOption::NoSuid,
        MountOption::NoDev,
    ];
    config.acl = SessionACL::Owner;
    config.n_threads = Some(THREADS);
    config.clone_fd = true;
    let mut session =
        Session::new(ViewFileSystem::new(view), mount_point, &config).map_err(|error| {
            BackupError::io(format!("mounting at {}", mount_point.display()), error)
        })?;
    let unmounter = Arc::new(Mutex::new(session.unmount_callable()));
    let session = std::thread::Builder::new()
        .name("backup-mount".to_string())
        .spawn(move || session.run())
        .map_err(|error| BackupError::io("starting the session thread", error))?;
    Ok(MountedView {
        unmounter,
        session,
        mount_point: mount_point.to_path_buf(),
    })
}
