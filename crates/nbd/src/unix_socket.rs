//! Binding a unix socket so that nobody but the intended users can ever connect to it.
//!
//! A socket file takes its mode from the umask when it is bound, and under umask 000 anyone
//! could connect (and read or write every export) until the mode is changed. So the socket is
//! bound inside a private directory (mode 0700) next to its path, given its mode and group
//! there, and only then linked at its path: it appears with its final permissions or not at
//! all.

use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::NbdError;

/// Who may connect to a unix socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SocketPermissions {
    /// Permission bits of the socket file (connecting needs write permission); at most 0o777.
    pub mode: u32,
    /// Group to give the socket file, for a mode that lets a group connect.
    pub group: Option<u32>,
}

impl Default for SocketPermissions {
    /// Only the owner (and root) may connect.
    fn default() -> SocketPermissions {
        SocketPermissions {
            mode: 0o600,
            group: None,
        }
    }
}

/// Names of private directories made by this process, so that concurrent binds differ.
static PRIVATE_DIRECTORIES: AtomicU64 = AtomicU64::new(0);

/// Binds a listening unix socket at `path` with `permissions`, never reachable with any
/// others (see the module documentation).
///
/// A file that exists at `path` is replaced only if it is a socket nobody listens on (left
/// by a crashed server); anything else is an `AddrInUse` error.
pub fn bind_unix_listener(
    path: &Path,
    permissions: &SocketPermissions,
) -> Result<UnixListener, NbdError> {
    assert!(
        permissions.mode <= 0o777,
        "socket mode {:o}",
        permissions.mode
    );
    let in_use = || {
        NbdError::io(
            format!("listening on {}", path.display()),
            io::Error::from(io::ErrorKind::AddrInUse),
        )
    };
    if let Ok(metadata) = fs::symlink_metadata(path) {
        let stale = metadata.file_type().is_socket() && UnixStream::connect(path).is_err();
        if !stale {
            return Err(in_use());
        }
        fs::remove_file(path).map_err(|error| {
            NbdError::io(format!("removing stale socket {}", path.display()), error)
        })?;
    }
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let private = create_private_directory(&parent)?;
    let result = bind_in(&private, path, permissions);
    // Best effort: what is left is an empty private directory.
    let _ = fs::remove_file(private.join("s"));
    let _ = fs::remove_dir(&private);
    result
}

fn create_private_directory(parent: &Path) -> Result<PathBuf, NbdError> {
    loop {
        let number = PRIVATE_DIRECTORIES.fetch_add(1, Ordering::Relaxed);
        let directory = parent.join(format!(".nbd-{}-{number}", std::process::id()));
        match fs::DirBuilder::new().mode(0o700).create(&directory) {
            Ok(()) => return Ok(directory),
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(error) => {
                return Err(NbdError::io(
                    format!("creating a private directory in {}", parent.display()),
                    error,
                ))
            }
        }
    }
}

fn bind_in(
    private: &Path,
    path: &Path,
    permissions: &SocketPermissions,
) -> Result<UnixListener, NbdError> {
    let temporary = private.join("s");
    let listener = UnixListener::bind(&temporary).map_err(|error| {
        NbdError::io(
            format!(
                "listening on {} (bound first at {})",
                path.display(),
                temporary.display()
            ),
            error,
        )
    })?;
    fs::set_permissions(&temporary, fs::Permissions::from_mode(permissions.mode)).map_err(
        |error| {
            NbdError::io(
                format!("setting the mode of {}", temporary.display()),
                error,
            )
        },
    )?;
    if let Some(group) = permissions.group {
        let name = std::ffi::CString::new(temporary.as_os_str().as_bytes())
            .expect("paths have no NUL bytes");
        // SAFETY: the name is a valid C string; uid -1 leaves the owner unchanged.
        let result = unsafe { libc::chown(name.as_ptr(), u32::MAX, group) };
        if result != 0 {
            return Err(NbdError::io(
                format!("giving {} to group {group}", path.display()),
                io::Error::last_os_error(),
            ));
        }
    }
    // A hard link fails if the path was taken meanwhile, instead of replacing it.
    fs::hard_link(&temporary, path)
        .map_err(|error| NbdError::io(format!("listening on {}", path.display()), error))?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the socket gets exactly the mode asked for whatever the umask, and nothing is
    /// left next to it. Method: bind under umask 000 with two modes, look at the directory.
    #[test]
    fn socket_mode_ignores_the_umask() {
        let directory = tempfile::tempdir().unwrap();
        // SAFETY: umask only changes the process's file creation mask.
        let previous = unsafe { libc::umask(0) };
        let results: Vec<u32> = [0o600, 0o660]
            .into_iter()
            .map(|mode| {
                let path = directory.path().join(format!("nbd-{mode:o}.sock"));
                let permissions = SocketPermissions { mode, group: None };
                let listener = bind_unix_listener(&path, &permissions).unwrap();
                UnixStream::connect(&path).expect("reachable at its path");
                drop(listener);
                fs::metadata(&path).unwrap().permissions().mode() & 0o7777
            })
            .collect();
        // SAFETY: as above.
        unsafe { libc::umask(previous) };
        assert_eq!(results, vec![0o600, 0o660]);
        let names: Vec<_> = fs::read_dir(directory.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "only the sockets remain: {names:?}");
    }
}
