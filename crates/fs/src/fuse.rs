//! The FUSE adapter: kernel requests to [`FsEngine`] calls and back.
//!
//! Permission checks are the kernel's (`default_permissions`); attributes and entries are
//! cached by the kernel for [`ATTRIBUTE_TTL`]. Requests run on several threads (fuser's
//! event loops, [`crate::mount::MountOptions::threads`]); the engine serialises metadata
//! changes under its lock and reads chunk data outside it.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, BsdFileFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use parking_lot::Mutex;

use crate::changes::FsId;
use crate::engine::{
    AttributeChanges, Caller, FsEngine, NewNode, NodeInfo, SeekWhence, TimeChange,
};
use crate::error::FsError;
use crate::node::Kind;
use crate::options::CHUNK_BYTES_MAX;

/// How long the kernel may cache attributes and entries.
pub const ATTRIBUTE_TTL: Duration = Duration::from_secs(1);
/// Largest read or write request.
pub const REQUEST_BYTES_MAX: u32 = CHUNK_BYTES_MAX as u32;

/// One mounted file system.
pub struct FuseFileSystem {
    engine: Arc<FsEngine>,
    fs: FsId,
    /// The face's directory, for `statfs` of the disk under it.
    face_directory: PathBuf,
    next_handle: AtomicU64,
    /// Flags of every opened file; see [`crate::mount::MountOptions::keep_cache`].
    open_flags: FopenFlags,
    /// Whether reads are noted by the I/O monitor; see
    /// [`crate::mount::MountOptions::no_monitor`].
    monitor: bool,
    /// The kernel's writeback cache is on (asked for, and granted at INIT); see
    /// [`crate::mount::MountOptions::writeback_cache`].
    writeback_cache: bool,
    /// The entries of each open directory handle, as they were at `opendir`: positions then
    /// never shift under a reader that removes entries as it goes (POSIX leaves it open
    /// whether entries added or removed after `opendir` are returned).
    directories: Mutex<HashMap<u64, Arc<Vec<DirectoryEntry>>>>,
}

/// One entry of a directory snapshot: position of the next entry, name, inode, kind.
type DirectoryEntry = (u64, Vec<u8>, u64, FileType);

impl FuseFileSystem {
    pub fn new(
        engine: Arc<FsEngine>,
        fs: FsId,
        face_directory: &Path,
        keep_cache: bool,
        monitor: bool,
    ) -> FuseFileSystem {
        FuseFileSystem {
            engine,
            fs,
            face_directory: face_directory.to_path_buf(),
            next_handle: AtomicU64::new(1),
            monitor,
            open_flags: if keep_cache {
                FopenFlags::FOPEN_KEEP_CACHE
            } else {
                FopenFlags::empty()
            },
            directories: Mutex::new(HashMap::new()),
            writeback_cache: false,
        }
    }

    /// Asks the kernel for its writeback cache at INIT.
    pub fn with_writeback_cache(mut self, writeback_cache: bool) -> FuseFileSystem {
        self.writeback_cache = writeback_cache;
        self
    }

    fn handle(&self) -> FileHandle {
        FileHandle(self.next_handle.fetch_add(1, Ordering::Relaxed))
    }

    /// True when `error` says that inode `ino` is gone, and it is because it was removed:
    /// only the writeback cache sends requests for such an inode, after its last handle.
    fn removed(&self, error: &FsError, ino: INodeNo) -> bool {
        self.writeback_cache
            && matches!(error, FsError::Posix { errno, .. } if *errno == libc::ENOENT)
            && self.engine.was_removed(self.fs, ino.0)
    }
}

fn errno(error: &FsError) -> Errno {
    let code = error.errno();
    if code == libc::EIO {
        eprintln!("onecopy fs: {error}");
    }
    Errno::from_i32(code)
}

fn time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

fn ns_of(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => after.as_nanos() as i64,
        Err(before) => -(before.duration().as_nanos() as i64),
    }
}

fn file_type(kind: Kind) -> FileType {
    match kind {
        Kind::File => FileType::RegularFile,
        Kind::Directory => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::NamedPipe,
        Kind::Socket => FileType::Socket,
        Kind::CharDevice => FileType::CharDevice,
        Kind::BlockDevice => FileType::BlockDevice,
    }
}

fn attr(info: &NodeInfo) -> FileAttr {
    let a = &info.attributes;
    FileAttr {
        ino: INodeNo(info.ino),
        size: a.size,
        blocks: info.blocks,
        atime: time(a.atime_ns),
        mtime: time(a.mtime_ns),
        ctime: time(a.ctime_ns),
        crtime: time(a.birth_ns),
        kind: file_type(a.kind),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: 4096,
        flags: 0,
    }
}

/// The attributes answered for a removed inode: an empty file without links.
fn removed_attributes() -> crate::node::Attributes {
    crate::node::Attributes {
        kind: Kind::File,
        mode: 0,
        uid: 0,
        gid: 0,
        nlink: 0,
        size: 0,
        rdev: 0,
        atime_ns: 0,
        mtime_ns: 0,
        ctime_ns: 0,
        birth_ns: 0,
    }
}

fn caller(request: &Request) -> Caller {
    Caller {
        uid: request.uid(),
        gid: request.gid(),
    }
}

fn time_change(change: TimeOrNow) -> TimeChange {
    match change {
        TimeOrNow::Now => TimeChange::Now,
        TimeOrNow::SpecificTime(at) => TimeChange::At(ns_of(at)),
    }
}

impl FuseFileSystem {
    fn reply_entry(&self, result: Result<NodeInfo, FsError>, reply: ReplyEntry) {
        match result {
            Ok(info) => reply.entry(&ATTRIBUTE_TTL, &attr(&info), Generation(0)),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn reply_empty(&self, result: Result<(), FsError>, reply: ReplyEmpty) {
        match result {
            Ok(()) => reply.ok(),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn create_node(
        &self,
        request: &Request,
        parent: INodeNo,
        name: &OsStr,
        node: NewNode,
    ) -> Result<NodeInfo, FsError> {
        self.engine.note_request();
        self.engine
            .create_node(self.fs, parent.0, name.as_bytes(), node, caller(request))
    }
}

impl Filesystem for FuseFileSystem {
    fn init(&mut self, _request: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // 1 MiB requests: fewer round trips for big sequential transfers, and a write of
        // that size is one plain chunk.
        let _ = config.set_max_write(REQUEST_BYTES_MAX);
        let _ = config.set_max_readahead(REQUEST_BYTES_MAX);
        if self.writeback_cache
            && config
                .add_capabilities(InitFlags::FUSE_WRITEBACK_CACHE)
                .is_err()
        {
            eprintln!("onecopy fs: the kernel offers no writeback cache; mounted without it");
            self.writeback_cache = false;
        }
        Ok(())
    }

    fn lookup(&self, _request: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.engine.note_request();
        self.reply_entry(
            self.engine.lookup(self.fs, parent.0, name.as_bytes()),
            reply,
        );
    }

    fn getattr(&self, _request: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.engine.note_request();
        match self.engine.getattr(self.fs, ino.0) {
            Ok(info) => reply.attr(&ATTRIBUTE_TTL, &attr(&info)),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn setattr(
        &self,
        _request: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.engine.note_request();
        let changes = AttributeChanges {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(time_change),
            mtime: mtime.map(time_change),
            ctime: ctime.map(ns_of),
        };
        match self.engine.setattr(self.fs, ino.0, changes) {
            Ok(info) => reply.attr(&ATTRIBUTE_TTL, &attr(&info)),
            // The writeback cache flushes the times of a file whose last link and handle are
            // gone: nothing is left to change.
            Err(error) if self.removed(&error, ino) => reply.attr(
                &Duration::ZERO,
                &attr(&NodeInfo {
                    ino: ino.0,
                    attributes: removed_attributes(),
                    blocks: 0,
                }),
            ),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn readlink(&self, _request: &Request, ino: INodeNo, reply: ReplyData) {
        self.engine.note_request();
        match self.engine.readlink(self.fs, ino.0) {
            Ok(target) => reply.data(&target),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn mknod(
        &self,
        request: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let Some(kind) = Kind::from_mode(mode) else {
            reply.error(Errno::EINVAL);
            return;
        };
        if kind == Kind::Directory || kind == Kind::Symlink {
            reply.error(Errno::EINVAL);
            return;
        }
        let node = NewNode {
            kind,
            mode: mode & !umask & 0o7777,
            rdev,
            target: Vec::new(),
        };
        self.reply_entry(self.create_node(request, parent, name, node), reply);
    }

    fn mkdir(
        &self,
        request: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let node = NewNode {
            kind: Kind::Directory,
            mode: mode & !umask & 0o7777,
            rdev: 0,
            target: Vec::new(),
        };
        self.reply_entry(self.create_node(request, parent, name, node), reply);
    }

    fn unlink(&self, _request: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.engine.note_request();
        self.reply_empty(
            self.engine
                .remove(self.fs, parent.0, name.as_bytes(), false),
            reply,
        );
    }

    fn rmdir(&self, _request: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.engine.note_request();
        self.reply_empty(
            self.engine.remove(self.fs, parent.0, name.as_bytes(), true),
            reply,
        );
    }

    fn symlink(
        &self,
        request: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let node = NewNode {
            kind: Kind::Symlink,
            mode: 0o777,
            rdev: 0,
            target: target.as_os_str().as_bytes().to_vec(),
        };
        self.reply_entry(self.create_node(request, parent, link_name, node), reply);
    }

    fn rename(
        &self,
        _request: &Request,
        parent: INodeNo,
        name: &OsStr,
        new_parent: INodeNo,
        new_name: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.engine.note_request();
        if flags.contains(RenameFlags::RENAME_WHITEOUT) {
            reply.error(Errno::EINVAL);
            return;
        }
        let result = self.engine.rename(
            self.fs,
            parent.0,
            name.as_bytes(),
            new_parent.0,
            new_name.as_bytes(),
            flags.contains(RenameFlags::RENAME_NOREPLACE),
            flags.contains(RenameFlags::RENAME_EXCHANGE),
        );
        self.reply_empty(result, reply);
    }

    fn link(
        &self,
        _request: &Request,
        ino: INodeNo,
        new_parent: INodeNo,
        new_name: &OsStr,
        reply: ReplyEntry,
    ) {
        self.engine.note_request();
        let result = self
            .engine
            .link(self.fs, ino.0, new_parent.0, new_name.as_bytes());
        self.reply_entry(result, reply);
    }

    fn open(&self, _request: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.engine.note_request();
        match self.engine.open_handle(self.fs, ino.0) {
            Ok(()) => reply.opened(self.handle(), self.open_flags),
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
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.engine.note_request();
        // With the writeback cache the kernel reads through handles opened for writing only
        // (to fill the pages a write covers in part): those reads are not the program's, and
        // the monitor leaves them out.
        let program_read = flags.0 & libc::O_ACCMODE != libc::O_WRONLY;
        let read = if self.monitor && program_read {
            self.engine.read(self.fs, ino.0, offset, size)
        } else {
            self.engine.read_unmonitored(self.fs, ino.0, offset, size)
        };
        match read {
            Ok(data) => reply.data(&data),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn write(
        &self,
        _request: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.engine.note_request();
        let set_times = !self.writeback_cache;
        match self
            .engine
            .write_with_times(self.fs, ino.0, offset, data, set_times)
        {
            Ok(written) => reply.written(written as u32),
            // Pages of a removed file that the writeback cache flushes late: dropped.
            Err(error) if self.removed(&error, ino) => reply.written(data.len() as u32),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn flush(
        &self,
        _request: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _request: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.reply_empty(self.engine.release_handle(self.fs, ino.0), reply);
    }

    fn fsync(
        &self,
        _request: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // One journal orders every change: syncing it makes this file's data and metadata
        // durable, with everything completed before it.
        self.engine.note_request();
        self.reply_empty(self.engine.flush(), reply);
    }

    fn opendir(&self, _request: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.engine.note_request();
        match self.engine.read_directory(self.fs, ino.0, 0, usize::MAX) {
            Ok(entries) => {
                let snapshot: Vec<DirectoryEntry> = entries
                    .into_iter()
                    .map(|(next, name, info)| {
                        (next, name, info.ino, file_type(info.attributes.kind))
                    })
                    .collect();
                let handle = self.handle();
                self.directories.lock().insert(handle.0, Arc::new(snapshot));
                reply.opened(handle, FopenFlags::empty())
            }
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn readdir(
        &self,
        _request: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.engine.note_request();
        let Some(snapshot) = self.directories.lock().get(&fh.0).cloned() else {
            reply.error(Errno::EBADF);
            return;
        };
        for (next, name, ino, kind) in snapshot.iter().skip(offset as usize) {
            if reply.add(INodeNo(*ino), *next, *kind, OsStr::from_bytes(name)) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _request: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.directories.lock().remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _request: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.engine.note_request();
        self.reply_empty(self.engine.flush(), reply);
    }

    fn statfs(&self, _request: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // The disk under the repository: its size and free space are what can still be
        // stored (deduplication only makes more fit).
        let path = std::ffi::CString::new(self.face_directory.as_os_str().as_bytes())
            .expect("paths have no NUL");
        let mut disk: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: statvfs writes into `disk`, which outlives the call; `path` is NUL-terminated.
        let result = unsafe { libc::statvfs(path.as_ptr(), &mut disk) };
        if result != 0 {
            reply.error(Errno::from(std::io::Error::last_os_error()));
            return;
        }
        let files = self.engine.stats_inodes(self.fs).unwrap_or(0);
        let fragment = disk.f_frsize.max(1);
        reply.statfs(
            disk.f_blocks,
            disk.f_bfree,
            disk.f_bavail,
            files + disk.f_ffree,
            disk.f_ffree,
            4096,
            crate::engine::NAME_BYTES_MAX as u32,
            fragment as u32,
        );
    }

    fn setxattr(
        &self,
        _request: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        self.engine.note_request();
        let result = self.engine.set_xattr(
            self.fs,
            ino.0,
            name.as_bytes(),
            value,
            flags & libc::XATTR_CREATE != 0,
            flags & libc::XATTR_REPLACE != 0,
        );
        self.reply_empty(result, reply);
    }

    fn getxattr(
        &self,
        _request: &Request,
        ino: INodeNo,
        name: &OsStr,
        size: u32,
        reply: ReplyXattr,
    ) {
        self.engine.note_request();
        match self.engine.get_xattr(self.fs, ino.0, name.as_bytes()) {
            Ok(value) if size == 0 => reply.size(value.len() as u32),
            Ok(value) if value.len() > size as usize => reply.error(Errno::ERANGE),
            Ok(value) => reply.data(&value),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn listxattr(&self, _request: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.engine.note_request();
        match self.engine.list_xattrs(self.fs, ino.0) {
            Ok(names) => {
                let mut list = Vec::new();
                for name in names {
                    list.extend_from_slice(&name);
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
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn removexattr(&self, _request: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.engine.note_request();
        self.reply_empty(
            self.engine.remove_xattr(self.fs, ino.0, name.as_bytes()),
            reply,
        );
    }

    fn access(&self, _request: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // The kernel checks permissions (default_permissions).
        reply.ok();
    }

    fn create(
        &self,
        request: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let node = NewNode {
            kind: Kind::File,
            mode: mode & !umask & 0o7777,
            rdev: 0,
            target: Vec::new(),
        };
        let created = self
            .create_node(request, parent, name, node)
            .and_then(|info| {
                self.engine.open_handle(self.fs, info.ino)?;
                Ok(info)
            });
        match created {
            Ok(info) => reply.created(
                &ATTRIBUTE_TTL,
                &attr(&info),
                Generation(0),
                self.handle(),
                self.open_flags,
            ),
            Err(error) => reply.error(errno(&error)),
        }
    }

    fn fallocate(
        &self,
        _request: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.engine.note_request();
        let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        let result = if mode == 0 {
            self.engine.allocate(self.fs, ino.0, offset, length, false)
        } else if mode == punch {
            self.engine.allocate(self.fs, ino.0, offset, length, true)
        } else if mode == libc::FALLOC_FL_KEEP_SIZE {
            Ok(())
        } else {
            Err(FsError::posix(libc::EOPNOTSUPP, "fallocate mode"))
        };
        self.reply_empty(result, reply);
    }

    fn lseek(
        &self,
        _request: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        self.engine.note_request();
        let whence = match whence {
            libc::SEEK_DATA => SeekWhence::Data,
            libc::SEEK_HOLE => SeekWhence::Hole,
            _ => {
                reply.error(Errno::EINVAL);
                return;
            }
        };
        if offset < 0 {
            reply.error(Errno::ENXIO);
            return;
        }
        match self.engine.seek(self.fs, ino.0, offset as u64, whence) {
            Ok(position) => reply.offset(position as i64),
            Err(error) => reply.error(errno(&error)),
        }
    }
}
