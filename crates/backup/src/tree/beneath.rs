//! File operations confined beneath one directory.
//!
//! A restore must never create, write or change anything outside its target, whatever the
//! target already holds (a symbolic link where the backup has a directory) and whatever the
//! stored tree says. Paths are therefore never handed to the kernel whole: the target is
//! opened once as a directory descriptor, and every entry is reached from it one component at
//! a time with `O_NOFOLLOW | O_DIRECTORY`, so a symbolic link on the way fails the operation
//! instead of leading elsewhere. The last component is then created, opened, linked or
//! changed relative to its parent's descriptor, again without following a link (`O_NOFOLLOW`,
//! `AT_SYMLINK_NOFOLLOW`, `O_EXCL` on creation). The walk to a directory is cached, so a tree
//! in walk order opens each directory about once. The backup's reader uses the same walk to
//! open the files it reads, so that a directory swapped for a link during the backup does not
//! make it read a file from elsewhere.
//!
//! Attributes of symbolic links, FIFOs and devices, which cannot be opened for writing, are
//! set through `/proc/self/fd/N/NAME` (`N` the parent's descriptor) with the `l` calls, which
//! resolve the parent through its descriptor and do not follow the last component.
//!
//! Components must be valid stored path components ([`super::Tree::validate`]); a `..` or an
//! empty component here is a bug of the caller and an assertion.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::Path;

use std::os::unix::ffi::OsStrExt;

/// A directory opened once, and the directories beneath it opened last.
pub(crate) struct Beneath {
    root: OwnedFd,
    /// The directories from the root's child down to the last parent opened: (name, fd).
    chain: Vec<(Vec<u8>, OwnedFd)>,
}

/// Splits a non-empty relative path into its parent's components and its last component.
fn split(relative: &[u8]) -> (Vec<&[u8]>, &[u8]) {
    let mut components: Vec<&[u8]> = relative.split(|&byte| byte == b'/').collect();
    let last = components
        .pop()
        .expect("split yields at least one component");
    for component in components.iter().chain([&last]) {
        assert!(
            !component.is_empty() && *component != b"." && *component != b"..",
            "paths are validated before they reach the file system"
        );
    }
    (components, last)
}

/// A component as a C string (components hold no NUL byte: they are validated).
fn c_name(name: &[u8]) -> CString {
    CString::new(name).expect("validated components hold no NUL byte")
}

fn check(result: libc::c_int) -> io::Result<()> {
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `openat` relative to `directory`, never following a symbolic link at `name`.
pub(crate) fn open_at(
    directory: BorrowedFd<'_>,
    name: &[u8],
    flags: libc::c_int,
    mode: libc::mode_t,
) -> io::Result<OwnedFd> {
    let name = c_name(name);
    // SAFETY: the name is NUL-terminated; the descriptor is open for the call.
    let fd = unsafe {
        libc::openat(
            directory.as_raw_fd(),
            name.as_ptr(),
            flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            libc::c_uint::from(mode),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn open_directory_at(directory: BorrowedFd<'_>, name: &[u8]) -> io::Result<OwnedFd> {
    open_at(directory, name, libc::O_RDONLY | libc::O_DIRECTORY, 0)
}

/// The status of `name` in `directory`, not following a link; `None` if it does not exist.
pub(crate) fn stat_at(directory: BorrowedFd<'_>, name: &[u8]) -> io::Result<Option<libc::stat>> {
    let name = c_name(name);
    // SAFETY: an all-zero `stat` is a valid value to be overwritten.
    let mut status: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid descriptor, NUL-terminated name and a `stat` to fill.
    let result = unsafe {
        libc::fstatat(
            directory.as_raw_fd(),
            name.as_ptr(),
            &mut status,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if result == 0 {
        return Ok(Some(status));
    }
    let error = io::Error::last_os_error();
    if error.raw_os_error() == Some(libc::ENOENT) {
        Ok(None)
    } else {
        Err(error)
    }
}

/// The status of an open descriptor.
pub(crate) fn stat_fd(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    // SAFETY: as in `stat_at`.
    let mut status: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid descriptor and a `stat` to fill.
    check(unsafe { libc::fstat(fd.as_raw_fd(), &mut status) })?;
    Ok(status)
}

pub(crate) fn is_directory(status: &libc::stat) -> bool {
    status.st_mode & libc::S_IFMT == libc::S_IFDIR
}

pub(crate) fn is_regular(status: &libc::stat) -> bool {
    status.st_mode & libc::S_IFMT == libc::S_IFREG
}

pub(crate) fn mkdir_at(
    directory: BorrowedFd<'_>,
    name: &[u8],
    mode: libc::mode_t,
) -> io::Result<()> {
    let name = c_name(name);
    // SAFETY: valid descriptor and NUL-terminated name.
    check(unsafe { libc::mkdirat(directory.as_raw_fd(), name.as_ptr(), mode) })
}

/// Removes the non-directory `name` (a link is removed, never followed).
pub(crate) fn unlink_at(directory: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    let name = c_name(name);
    // SAFETY: valid descriptor and NUL-terminated name.
    check(unsafe { libc::unlinkat(directory.as_raw_fd(), name.as_ptr(), 0) })
}

pub(crate) fn symlink_at(target: &[u8], directory: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    let target = CString::new(target).expect("validated link targets hold no NUL byte");
    let name = c_name(name);
    // SAFETY: valid descriptor and NUL-terminated strings.
    check(unsafe { libc::symlinkat(target.as_ptr(), directory.as_raw_fd(), name.as_ptr()) })
}

pub(crate) fn mknod_at(
    directory: BorrowedFd<'_>,
    name: &[u8],
    mode: libc::mode_t,
    rdev: u64,
) -> io::Result<()> {
    let name = c_name(name);
    // SAFETY: valid descriptor and NUL-terminated name; mknodat reads only its arguments.
    check(unsafe {
        libc::mknodat(
            directory.as_raw_fd(),
            name.as_ptr(),
            mode,
            rdev as libc::dev_t,
        )
    })
}

/// A hard link `new_name` in `new_directory` to `old_name` in `old_directory` (a link at
/// `old_name` is linked itself, never followed).
pub(crate) fn link_at(
    old_directory: BorrowedFd<'_>,
    old_name: &[u8],
    new_directory: BorrowedFd<'_>,
    new_name: &[u8],
) -> io::Result<()> {
    let old_name = c_name(old_name);
    let new_name = c_name(new_name);
    // SAFETY: valid descriptors and NUL-terminated names.
    check(unsafe {
        libc::linkat(
            old_directory.as_raw_fd(),
            old_name.as_ptr(),
            new_directory.as_raw_fd(),
            new_name.as_ptr(),
            0,
        )
    })
}

/// Changes the owner of `name`, not following a link.
pub(crate) fn chown_at(
    directory: BorrowedFd<'_>,
    name: &[u8],
    uid: u32,
    gid: u32,
) -> io::Result<()> {
    let name = c_name(name);
    // SAFETY: valid descriptor and NUL-terminated name.
    check(unsafe {
        libc::fchownat(
            directory.as_raw_fd(),
            name.as_ptr(),
            uid,
            gid,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
}

/// Changes the mode of `name`, not following a link (the C library refuses a link with
/// `EOPNOTSUPP` rather than following it).
pub(crate) fn chmod_at(directory: BorrowedFd<'_>, name: &[u8], mode: u32) -> io::Result<()> {
    let name = c_name(name);
    // SAFETY: valid descriptor and NUL-terminated name.
    check(unsafe {
        libc::fchmodat(
            directory.as_raw_fd(),
            name.as_ptr(),
            mode as libc::mode_t,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
}

/// Sets access and modification times of `name`, not following a link.
pub(crate) fn set_times_at(
    directory: BorrowedFd<'_>,
    name: &[u8],
    times: &[libc::timespec; 2],
) -> io::Result<()> {
    let name = c_name(name);
    // SAFETY: valid descriptor, NUL-terminated name and two timespecs.
    check(unsafe {
        libc::utimensat(
            directory.as_raw_fd(),
            name.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
}

/// Sets an extended attribute of `name` without following a link at it, through the
/// parent's descriptor (see the module documentation).
pub(crate) fn set_xattr_at(
    directory: BorrowedFd<'_>,
    name: &[u8],
    attribute: &[u8],
    value: &[u8],
) -> io::Result<()> {
    let mut path = format!("/proc/self/fd/{}/", directory.as_raw_fd()).into_bytes();
    path.extend_from_slice(name);
    let path = c_name(&path);
    let attribute = CString::new(attribute).expect("validated attribute names hold no NUL");
    // SAFETY: NUL-terminated strings and a value buffer valid for its length.
    check(unsafe {
        libc::lsetxattr(
            path.as_ptr(),
            attribute.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    })
}

pub(crate) fn fchown(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: valid descriptor.
    check(unsafe { libc::fchown(fd.as_raw_fd(), uid, gid) })
}

pub(crate) fn fchmod(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    // SAFETY: valid descriptor.
    check(unsafe { libc::fchmod(fd.as_raw_fd(), mode as libc::mode_t) })
}

pub(crate) fn fset_xattr(fd: BorrowedFd<'_>, attribute: &[u8], value: &[u8]) -> io::Result<()> {
    let attribute = CString::new(attribute).expect("validated attribute names hold no NUL");
    // SAFETY: valid descriptor, NUL-terminated name, value buffer valid for its length.
    check(unsafe {
        libc::fsetxattr(
            fd.as_raw_fd(),
            attribute.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    })
}

pub(crate) fn fset_times(fd: BorrowedFd<'_>, times: &[libc::timespec; 2]) -> io::Result<()> {
    // SAFETY: valid descriptor and two timespecs.
    check(unsafe { libc::futimens(fd.as_raw_fd(), times.as_ptr()) })
}

impl Beneath {
    /// Opens the directory `path` (the caller's own path: links in it are followed, as for any
    /// path a user names).
    pub(crate) fn open(path: &Path) -> io::Result<Beneath> {
        let c_path = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the path"))?;
        // SAFETY: NUL-terminated path.
        let fd = unsafe {
            libc::open(
                c_path.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Beneath {
            // SAFETY: a new descriptor that nothing else owns.
            root: unsafe { OwnedFd::from_raw_fd(fd) },
            chain: Vec::new(),
        })
    }

    /// The root directory's descriptor.
    pub(crate) fn root(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    /// The directory that holds the non-empty path `relative`, and its last component. Every
    /// directory on the way is opened without following links: a link or a file where a
    /// directory should be fails with `ELOOP` or `ENOTDIR`.
    pub(crate) fn parent<'p>(
        &mut self,
        relative: &'p [u8],
    ) -> io::Result<(BorrowedFd<'_>, &'p [u8])> {
        let (directories, last) = split(relative);
        let kept = self
            .chain
            .iter()
            .zip(&directories)
            .take_while(|((name, _), component)| name.as_slice() == **component)
            .count();
        self.chain.truncate(kept);
        for component in &directories[kept..] {
            let parent = self
                .chain
                .last()
                .map_or(self.root.as_fd(), |(_, fd)| fd.as_fd());
            let fd = open_directory_at(parent, component)?;
            self.chain.push((component.to_vec(), fd));
        }
        let parent = self
            .chain
            .last()
            .map_or(self.root.as_fd(), |(_, fd)| fd.as_fd());
        Ok((parent, last))
    }

    /// Like [`Beneath::parent`], but a descriptor of its own (for a second directory held at
    /// the same time, such as the other end of a hard link).
    pub(crate) fn open_parent<'p>(&self, relative: &'p [u8]) -> io::Result<(OwnedFd, &'p [u8])> {
        let (directories, last) = split(relative);
        let mut current = self.root.try_clone()?;
        for component in directories {
            current = open_directory_at(current.as_fd(), component)?;
        }
        Ok((current, last))
    }

    /// The status of `relative` (the root for an empty path), or `None` if it or a directory
    /// on the way does not exist or is not a directory.
    pub(crate) fn lookup(&mut self, relative: &[u8]) -> io::Result<Option<libc::stat>> {
        if relative.is_empty() {
            return stat_fd(self.root.as_fd()).map(Some);
        }
        match self.parent(relative) {
            Ok((parent, name)) => stat_at(parent, name),
            Err(error)
                if matches!(
                    error.raw_os_error(),
                    Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP)
                ) =>
            {
                Ok(None)
            }
            Err(error) => Err(error),
        }
    }

    /// Opens the regular file `relative` for reading without blocking on a FIFO or a device
    /// that took its place, and without following a link at any component.
    pub(crate) fn open_file(&mut self, relative: &[u8]) -> io::Result<File> {
        let (parent, name) = self.parent(relative)?;
        let fd = open_at(parent, name, libc::O_RDONLY | libc::O_NONBLOCK, 0)?;
        Ok(File::from(fd))
    }
}
