//! Comparing two trees: what `backup diff` lists and what `backup create` sums up.
//!
//! Both trees are in walk order, so one merge pass pairs entries by path. An entry is
//!
//! - **added** or **removed** when only the newer or the older tree has its path;
//! - **modified** when its contents differ: another kind of entry, or a regular file of
//!   another size or modification time, or (where both backups recorded them) another inode
//!   or device, or another change time that no change of mode, owner or attributes explains
//!   (as restic and borg decide without reading the files), a symbolic link to another
//!   target, a device of another number, a hard link to another path;
//! - **metadata** changed when only its mode, owner or extended attributes differ (access
//!   times are ignored: reading a file changes them).
//!
//! The summary after a backup counts a file as changed by the files cache's stricter rule:
//! any other ctime, inode or device (so its changed files are the files read again).
//!
//! Paths are relative to each backup's root, so two backups rooted at different directories
//! (taken of different paths) compare by those relative paths.

use std::cmp::Ordering;

use serde::Serialize;

use super::{walk_order, EntryKind, Tree, TreeEntry};

/// How an entry differs between two trees.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ChangeKind {
    Added,
    Removed,
    Modified,
    Metadata,
}

impl ChangeKind {
    /// restic's one-letter mark: `+`, `-`, `M`, `U`.
    pub fn mark(self) -> char {
        match self {
            ChangeKind::Added => '+',
            ChangeKind::Removed => '-',
            ChangeKind::Modified => 'M',
            ChangeKind::Metadata => 'U',
        }
    }
}

/// What an entry is, for listings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EntryType {
    Directory,
    File,
    Symlink,
    HardLink,
    Fifo,
    CharDevice,
    BlockDevice,
}

impl EntryType {
    pub fn of(kind: &EntryKind) -> EntryType {
        match kind {
            EntryKind::Directory => EntryType::Directory,
            EntryKind::File { .. } => EntryType::File,
            EntryKind::Symlink { .. } => EntryType::Symlink,
            EntryKind::HardLink { .. } => EntryType::HardLink,
            EntryKind::Fifo => EntryType::Fifo,
            EntryKind::CharDevice { .. } => EntryType::CharDevice,
            EntryKind::BlockDevice { .. } => EntryType::BlockDevice,
        }
    }
}

/// One entry that differs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TreeChange {
    /// The path relative to the backups' roots (`.` for the root; bytes that are not UTF-8
    /// shown as U+FFFD).
    pub path: String,
    pub change: ChangeKind,
    /// What the entry is in the newer tree (the older one for a removal).
    pub entry_type: EntryType,
    /// File sizes (of the linked file for a hard link), where the tree has a file.
    pub old_size: Option<u64>,
    pub new_size: Option<u64>,
}

/// Counts of what changed from one backup to the next (regular files only; a hard link is
/// another name of a file already counted).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ChangeSummary {
    /// The version compared with; `None` when the series had no earlier directory backup
    /// (every file is then new).
    pub previous_version: Option<u32>,
    pub files_new: u64,
    pub files_changed: u64,
    pub files_unchanged: u64,
    pub files_removed: u64,
    pub bytes_new: u64,
    pub bytes_changed: u64,
    pub bytes_unchanged: u64,
    pub directories_new: u64,
    pub directories_removed: u64,
}

/// A tree with its hard links' file sizes at hand.
struct Side<'a> {
    tree: &'a Tree,
}

impl Side<'_> {
    /// The size of the file an entry is or links to.
    fn size(&self, entry: &TreeEntry) -> Option<u64> {
        match &entry.kind {
            EntryKind::File { size, .. } => Some(*size),
            EntryKind::HardLink { target } => match self.tree.entries.get(*target as usize) {
                Some(TreeEntry {
                    kind: EntryKind::File { size, .. },
                    ..
                }) => Some(*size),
                _ => None,
            },
            _ => None,
        }
    }

    fn link_target(&self, entry: &TreeEntry) -> Option<&[u8]> {
        match entry.kind {
            EntryKind::HardLink { target } => self
                .tree
                .entries
                .get(target as usize)
                .map(|linked| linked.path.as_slice()),
            _ => None,
        }
    }
}

/// How `new` differs from `old` (the same path), or `None` when it does not.
fn difference(
    old_side: &Side,
    old: &TreeEntry,
    new_side: &Side,
    new: &TreeEntry,
) -> Option<ChangeKind> {
    let contents_differ = match (&old.kind, &new.kind) {
        (EntryKind::Directory, EntryKind::Directory) | (EntryKind::Fifo, EntryKind::Fifo) => false,
        (EntryKind::File { size: a, .. }, EntryKind::File { size: b, .. }) => {
            a != b || !same_file_contents(old, new)
        }
        (EntryKind::Symlink { target: a }, EntryKind::Symlink { target: b }) => a != b,
        (EntryKind::CharDevice { rdev: a }, EntryKind::CharDevice { rdev: b })
        | (EntryKind::BlockDevice { rdev: a }, EntryKind::BlockDevice { rdev: b }) => a != b,
        (EntryKind::HardLink { .. }, EntryKind::HardLink { .. }) => {
            old_side.link_target(old) != new_side.link_target(new)
        }
        _ => true,
    };
    if contents_differ {
        return Some(ChangeKind::Modified);
    }
    let metadata_differs = old.mode != new.mode
        || old.uid != new.uid
        || old.gid != new.gid
        || old.xattrs != new.xattrs
        || (old.kind != EntryKind::Directory && old.mtime != new.mtime);
    metadata_differs.then_some(ChangeKind::Metadata)
}

fn display(path: &[u8]) -> String {
    if path.is_empty() {
        ".".to_string()
    } else {
        String::from_utf8_lossy(path).into_owned()
    }
}

/// Calls `visit(old, new)` for every path of either tree, in walk order: `(Some, None)` for
/// a removed path, `(None, Some)` for an added one, `(Some, Some)` for one in both.
fn merge<'a>(
    old: &'a Tree,
    new: &'a Tree,
    mut visit: impl FnMut(Option<&'a TreeEntry>, Option<&'a TreeEntry>),
) {
    let (mut a, mut b) = (old.entries.iter().peekable(), new.entries.iter().peekable());
    loop {
        let order = match (a.peek(), b.peek()) {
            (None, None) => return,
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some(x), Some(y)) => walk_order(&x.path, &y.path),
        };
        match order {
            Ordering::Less => visit(a.next(), None),
            Ordering::Greater => visit(None, b.next()),
            Ordering::Equal => visit(a.next(), b.next()),
        }
    }
}

/// The entries that differ from `old` to `new`, in walk order.
pub fn changes(old: &Tree, new: &Tree) -> Vec<TreeChange> {
    let (old_side, new_side) = (Side { tree: old }, Side { tree: new });
    let mut found = Vec::new();
    merge(old, new, |before, after| {
        let change = match (before, after) {
            (Some(entry), None) => TreeChange {
                path: display(&entry.path),
                change: ChangeKind::Removed,
                entry_type: EntryType::of(&entry.kind),
                old_size: old_side.size(entry),
                new_size: None,
            },
            (None, Some(entry)) => TreeChange {
                path: display(&entry.path),
                change: ChangeKind::Added,
                entry_type: EntryType::of(&entry.kind),
                old_size: None,
                new_size: new_side.size(entry),
            },
            (Some(before), Some(after)) => {
                let Some(change) = difference(&old_side, before, &new_side, after) else {
                    return;
                };
                TreeChange {
                    path: display(&after.path),
                    change,
                    entry_type: EntryType::of(&after.kind),
                    old_size: old_side.size(before),
                    new_size: new_side.size(after),
                }
            }
            (None, None) => unreachable!("merge visits an entry of at least one tree"),
        };
        found.push(change);
    });
    found
}

/// Two regular files of the same size are the same version when their mtimes agree and,
/// where both backups recorded them, their ctimes, inodes and devices: what the files cache
/// decides on ([`crate::files_cache`]), so a summary's changed files are the files it read
/// again (a file whose mode changed is counted changed: its ctime changed).
fn same_file_version(before: &TreeEntry, after: &TreeEntry) -> bool {
    before.mtime == after.mtime
        && match (&before.stamp, &after.stamp) {
            (Some(before), Some(after)) => before.same_version(after),
            _ => true,
        }
}

/// Two regular files of the same size have the same contents, as far as metadata tells, when
/// their mtimes agree and, where both backups recorded them, their inodes and devices, and
/// their ctimes unless a change of mode, owner or attributes explains the new ctime.
fn same_file_contents(before: &TreeEntry, after: &TreeEntry) -> bool {
    let metadata_changed = before.mode != after.mode
        || before.uid != after.uid
        || before.gid != after.gid
        || before.xattrs != after.xattrs;
    before.mtime == after.mtime
        && match (&before.stamp, &after.stamp) {
            (Some(old), Some(new)) => {
                (old.inode, old.device) == (new.inode, new.device)
                    && (metadata_changed || old.ctime == new.ctime)
            }
            _ => true,
        }
}

/// The counts of new, changed, unchanged and removed files from `old` (version
/// `previous_version`; `None` for no earlier backup) to `new`.
pub fn summarize(old: Option<(u32, &Tree)>, new: &Tree) -> ChangeSummary {
    let empty = Tree::default();
    let (previous_version, old) = match old {
        Some((version, tree)) => (Some(version), tree),
        None => (None, &empty),
    };
    let mut summary = ChangeSummary {
        previous_version,
        ..ChangeSummary::default()
    };
    merge(old, new, |before, after| {
        let file_size = |entry: Option<&TreeEntry>| match entry.map(|entry| &entry.kind) {
            Some(EntryKind::File { size, .. }) => Some(*size),
            _ => None,
        };
        let is_directory = |entry: Option<&TreeEntry>| {
            entry.is_some_and(|entry| entry.kind == EntryKind::Directory)
        };
        match (file_size(before), file_size(after)) {
            (Some(_), None) => summary.files_removed += 1,
            (None, Some(size)) => {
                summary.files_new += 1;
                summary.bytes_new += size;
            }
            (Some(old_size), Some(size)) => {
                let same = same_file_version(before.expect("a file"), after.expect("a file"))
                    && old_size == size;
                if same {
                    summary.files_unchanged += 1;
                    summary.bytes_unchanged += size;
                } else {
                    summary.files_changed += 1;
                    summary.bytes_changed += size;
                }
            }
            (None, None) => {}
        }
        match (is_directory(before), is_directory(after)) {
            (true, false) => summary.directories_removed += 1,
            (false, true) => summary.directories_new += 1,
            _ => {}
        }
    });
    summary
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::Extent;

    fn entry(path: &str, kind: EntryKind, mtime: i64) -> TreeEntry {
        TreeEntry {
            path: path.as_bytes().to_vec(),
            kind,
            mode: 0o644,
            uid: 0,
            gid: 0,
            atime: (0, 0),
            mtime: (mtime, 0),
            xattrs: Vec::new(),
            stamp: None,
        }
    }

    fn file(path: &str, size: u64, mtime: i64) -> TreeEntry {
        entry(
            path,
            EntryKind::File {
                size,
                stream_offset: 0,
                extents: vec![Extent {
                    offset: 0,
                    length: size,
                }],
            },
            mtime,
        )
    }

    fn directory(path: &str) -> TreeEntry {
        entry(path, EntryKind::Directory, 1)
    }

    /// Goal: additions, removals, content and metadata changes are told apart, in walk
    /// order, and the summary counts files and bytes by category. Method: two small trees.
    #[test]
    fn changes_and_summary() {
        let old = Tree {
            entries: vec![
                directory(""),
                directory("a"),
                file("a/gone", 7, 1),
                file("a/grown", 10, 1),
                file("a/same", 10, 1),
                file("touched", 5, 1),
                file("z", 3, 1),
            ],
        };
        let mut chmod = file("z", 3, 1);
        chmod.mode = 0o600;
        let new = Tree {
            entries: vec![
                directory(""),
                directory("a"),
                file("a/grown", 20, 1),
                file("a/new", 4, 2),
                file("a/same", 10, 1),
                directory("b"),
                file("touched", 5, 2),
                chmod,
            ],
        };
        let listed: Vec<(String, char, Option<u64>, Option<u64>)> = changes(&old, &new)
            .into_iter()
            .map(|change| {
                (
                    change.path,
                    change.change.mark(),
                    change.old_size,
                    change.new_size,
                )
            })
            .collect();
        assert_eq!(
            listed,
            [
                ("a/gone".to_string(), '-', Some(7), None),
                ("a/grown".to_string(), 'M', Some(10), Some(20)),
                ("a/new".to_string(), '+', None, Some(4)),
                ("b".to_string(), '+', None, None),
                ("touched".to_string(), 'M', Some(5), Some(5)),
                ("z".to_string(), 'U', Some(3), Some(3)),
            ]
        );
        let summary = summarize(Some((4, &old)), &new);
        assert_eq!(
            summary,
            ChangeSummary {
                previous_version: Some(4),
                files_new: 1,
                files_changed: 2,
                files_unchanged: 2,
                files_removed: 1,
                bytes_new: 4,
                bytes_changed: 25,
                bytes_unchanged: 13,
                directories_new: 1,
                directories_removed: 0,
            }
        );
        let first = summarize(None, &new);
        assert_eq!((first.files_new, first.bytes_new), (5, 42));
        assert_eq!(first.directories_new, 3);
    }
}
