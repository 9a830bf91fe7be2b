//! File-tree helpers the paper-2 experiments share: sizes of repositories and trees, copies
//! of a repository, and comparisons of a restored tree with its source. A leaf module: it
//! imports none of the experiment modules that use it.

use std::fs;
use std::path::{Path, PathBuf};

use onecopy_core::error::IoContext;

use crate::error::Result;

/// Bytes of the files of a repository or backup store under `directory`, without the backup
/// store's space reserve (`reserve` in the store's directory, or in `backup/` of a
/// repository): room kept for deletions on a full disk, not stored data, which would make
/// every measured repository 8 MiB larger.
pub fn repository_bytes(directory: &Path) -> Result<u64> {
    let mut total = directory_bytes(directory)?;
    for reserve in [
        directory.join("reserve"),
        directory.join("backup").join("reserve"),
    ] {
        if let Ok(metadata) = fs::symlink_metadata(&reserve) {
            total = total.saturating_sub(metadata.len());
        }
    }
    Ok(total)
}

/// Bytes of every regular file under `directory`.
pub fn directory_bytes(directory: &Path) -> Result<u64> {
    let mut total = 0;
    let entries =
        fs::read_dir(directory).context_io(|| format!("listing {}", directory.display()))?;
    for entry in entries {
        let entry = entry.context_io(|| format!("listing {}", directory.display()))?;
        let metadata = fs::symlink_metadata(entry.path())
            .context_io(|| format!("inspecting {:?}", entry.path()))?;
        if metadata.is_dir() {
            total += directory_bytes(&entry.path())?;
        } else if metadata.is_file() {
            total += metadata.len();
        }
    }
    Ok(total)
}

/// Copies a directory tree of regular files and directories.
pub fn copy_tree(source: &Path, target: &Path) -> Result<()> {
    fs::create_dir_all(target).context_io(|| format!("creating {}", target.display()))?;
    let entries = fs::read_dir(source).context_io(|| format!("listing {}", source.display()))?;
    for entry in entries {
        let entry = entry.context_io(|| format!("listing {}", source.display()))?;
        let destination = target.join(entry.file_name());
        let kind = entry
            .file_type()
            .context_io(|| format!("inspecting {:?}", entry.path()))?;
        if kind.is_dir() {
            copy_tree(&entry.path(), &destination)?;
        } else if kind.is_symlink() {
            let link =
                fs::read_link(entry.path()).context_io(|| format!("reading {:?}", entry.path()))?;
            std::os::unix::fs::symlink(&link, &destination)
                .context_io(|| format!("linking {}", destination.display()))?;
        } else {
            fs::copy(entry.path(), &destination)
                .context_io(|| format!("copying {:?}", entry.path()))?;
        }
    }
    Ok(())
}

/// Compares two directory trees: same names, kinds, file contents and link targets.
/// Returns the first difference found.
pub fn compare_trees(expected: &Path, actual: &Path) -> Result<Option<String>> {
    let mut expected_entries = list_sorted(expected)?;
    let mut actual_entries = list_sorted(actual)?;
    if expected_entries.len() != actual_entries.len() {
        return Ok(Some(format!(
            "{}: {} entries, expected {}",
            actual.display(),
            actual_entries.len(),
            expected_entries.len()
        )));
    }
    for (left, right) in expected_entries.drain(..).zip(actual_entries.drain(..)) {
        if left.file_name() != right.file_name() {
            return Ok(Some(format!("{:?} against {:?}", left, right)));
        }
        let left_metadata =
            fs::symlink_metadata(&left).context_io(|| format!("inspecting {}", left.display()))?;
        let right_metadata = fs::symlink_metadata(&right)
            .context_io(|| format!("inspecting {}", right.display()))?;
        if left_metadata.file_type() != right_metadata.file_type() {
            return Ok(Some(format!("{}: kind differs", right.display())));
        }
        if left_metadata.is_dir() {
            if let Some(difference) = compare_trees(&left, &right)? {
                return Ok(Some(difference));
            }
        } else if left_metadata.is_symlink() {
            if fs::read_link(&left).ok() != fs::read_link(&right).ok() {
                return Ok(Some(format!("{}: link target differs", right.display())));
            }
        } else {
            let left_bytes =
                fs::read(&left).context_io(|| format!("reading {}", left.display()))?;
            let right_bytes =
                fs::read(&right).context_io(|| format!("reading {}", right.display()))?;
            if left_bytes != right_bytes {
                return Ok(Some(format!("{}: content differs", right.display())));
            }
        }
    }
    Ok(None)
}

fn list_sorted(directory: &Path) -> Result<Vec<PathBuf>> {
    let mut entries: Vec<PathBuf> = fs::read_dir(directory)
        .context_io(|| format!("listing {}", directory.display()))?
        .map(|entry| entry.map(|entry| entry.path()))
        .collect::<std::io::Result<_>>()
        .context_io(|| format!("listing {}", directory.display()))?;
    entries.sort();
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: tree comparison finds content, name and kind differences; method: a tree, an
    /// identical copy, then one change of each kind.
    #[test]
    fn trees_compare() {
        let directory = tempfile::tempdir().expect("temporary directory");
        let left = directory.path().join("left");
        fs::create_dir_all(left.join("sub")).expect("directory");
        fs::write(left.join("sub/a"), b"alpha").expect("file");
        std::os::unix::fs::symlink("sub/a", left.join("link")).expect("link");
        let right = directory.path().join("right");
        copy_tree(&left, &right).expect("copy");
        assert_eq!(compare_trees(&left, &right).expect("compare"), None);
        fs::write(right.join("sub/a"), b"alphA").expect("file");
        assert!(compare_trees(&left, &right).expect("compare").is_some());
        fs::write(right.join("sub/a"), b"alpha").expect("file");
        fs::write(right.join("extra"), b"").expect("file");
        assert!(compare_trees(&left, &right).expect("compare").is_some());
    }
}
