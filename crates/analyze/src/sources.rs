//! Finding what to read: the regular files and block devices under the paths given.
//!
//! Rules (the contract of `onecopy analyze`):
//! - A directory is walked recursively, entries in name order.
//! - Symbolic links inside directories are not followed (they are counted as skipped). A path
//!   given explicitly is followed if it is a link, as `find -H` does, so that
//!   `/dev/disk/by-id/...` names work.
//! - Regular files and block devices are read; other special files (FIFOs, sockets, character
//!   devices) are skipped and counted.

use std::fs::{self, File};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use crate::AnalyzeError;

/// What a source is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceKind {
    File,
    BlockDevice,
}

/// One file or block device to read.
#[derive(Clone, Debug)]
pub struct Source {
    pub path: PathBuf,
    pub kind: SourceKind,
    /// Size when the walk saw it (used for progress only: the file is read to its end).
    pub bytes: u64,
}

/// The sources found under the given paths, and what was skipped.
#[derive(Clone, Debug, Default)]
pub struct SourceList {
    pub sources: Vec<Source>,
    /// Symbolic links found inside directories (not followed).
    pub skipped_symlinks: u64,
    /// FIFOs, sockets and character devices.
    pub skipped_special: u64,
}

impl SourceList {
    /// Bytes of all sources, as seen by the walk.
    pub fn total_bytes(&self) -> u64 {
        self.sources.iter().map(|source| source.bytes).sum()
    }

    /// Walks `paths` (see the module documentation for the rules).
    pub fn walk(paths: &[PathBuf]) -> Result<SourceList, AnalyzeError> {
        let mut list = SourceList::default();
        for path in paths {
            let metadata = fs::metadata(path)
                .map_err(|source| AnalyzeError::io("cannot access", path, source))?;
            list.add(path, metadata.file_type(), metadata.len())?;
        }
        Ok(list)
    }

    fn add(
        &mut self,
        path: &Path,
        file_type: fs::FileType,
        bytes: u64,
    ) -> Result<(), AnalyzeError> {
        if file_type.is_dir() {
            self.walk_directory(path)
        } else if file_type.is_file() {
            self.sources.push(Source {
                path: path.to_path_buf(),
                kind: SourceKind::File,
                bytes,
            });
            Ok(())
        } else if file_type.is_block_device() {
            let bytes = block_device_bytes(path)?;
            self.sources.push(Source {
                path: path.to_path_buf(),
                kind: SourceKind::BlockDevice,
                bytes,
            });
            Ok(())
        } else if file_type.is_symlink() {
            self.skipped_symlinks += 1;
            Ok(())
        } else {
            self.skipped_special += 1;
            Ok(())
        }
    }

    fn walk_directory(&mut self, directory: &Path) -> Result<(), AnalyzeError> {
        let entries = fs::read_dir(directory)
            .map_err(|source| AnalyzeError::io("cannot list directory", directory, source))?;
        let mut children = Vec::new();
        for entry in entries {
            let entry = entry
                .map_err(|source| AnalyzeError::io("cannot list directory", directory, source))?;
            children.push(entry.path());
        }
        children.sort();
        for child in children {
            // symlink_metadata does not follow links: links are recognised and skipped.
            let metadata = fs::symlink_metadata(&child)
                .map_err(|source| AnalyzeError::io("cannot access", &child, source))?;
            self.add(&child, metadata.file_type(), metadata.len())?;
        }
        Ok(())
    }
}

/// The size of a block device: its metadata says 0, so seek to its end.
fn block_device_bytes(path: &Path) -> Result<u64, AnalyzeError> {
    let mut device =
        File::open(path).map_err(|source| AnalyzeError::io("cannot open", path, source))?;
    device
        .seek(SeekFrom::End(0))
        .map_err(|source| AnalyzeError::io("cannot find the size of", path, source))
}
