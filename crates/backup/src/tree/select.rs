//! Choosing part of a tree for a restore (`backup restore --include PATH`).
//!
//! The chosen tree holds the root, every entry at or beneath an included path, the
//! directories leading to them (with their own metadata, not their other entries), and the
//! file of every chosen hard link whose file lies elsewhere (a hard link is restored with
//! its file, so that the link can be made). It is a subset of a valid tree in the same
//! order, so it passes [`Tree::validate`] as the whole tree does; the restore reads only the
//! stream ranges of its files.

use std::collections::HashMap;

use super::{parent_path, EntryKind, Tree};

/// A chosen part of a tree and the stream ranges its files occupy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chosen {
    pub tree: Tree,
    /// The stream ranges of the chosen files, sorted, adjacent ones merged.
    pub ranges: Vec<(u64, u64)>,
}

/// True when the stored path `path` is `include` or lies beneath it (every path lies beneath
/// the empty path, the root).
pub fn is_beneath(path: &[u8], include: &[u8]) -> bool {
    include.is_empty()
        || path == include
        || (path.starts_with(include) && path.get(include.len()) == Some(&b'/'))
}

/// The part of `tree` at and beneath `includes` (stored paths); see the module
/// documentation. Fails with the first included path the tree does not hold.
pub fn select(tree: Tree, includes: &[Vec<u8>]) -> Result<Chosen, Vec<u8>> {
    let entries = &tree.entries;
    for include in includes {
        if !entries.iter().any(|entry| entry.path == *include) {
            return Err(include.clone());
        }
    }
    let mut keep = vec![false; entries.len()];
    for (index, entry) in entries.iter().enumerate() {
        keep[index] = index == 0
            || includes
                .iter()
                .any(|include| is_beneath(&entry.path, include));
    }
    for index in 0..entries.len() {
        if let (true, EntryKind::HardLink { target }) = (keep[index], &entries[index].kind) {
            keep[*target as usize] = true;
        }
    }
    let directories: HashMap<&[u8], usize> = entries
        .iter()
        .enumerate()
        .filter(|(_, entry)| entry.kind == EntryKind::Directory)
        .map(|(index, entry)| (entry.path.as_slice(), index))
        .collect();
    for index in 0..entries.len() {
        if !keep[index] || index == 0 {
            continue;
        }
        let mut parent = parent_path(&entries[index].path);
        while let Some(&directory) = directories.get(parent) {
            if keep[directory] {
                break;
            }
            keep[directory] = true;
            parent = parent_path(parent);
        }
    }
    let mut renumbered = vec![0u32; entries.len()];
    let mut chosen = Vec::new();
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for (index, mut entry) in tree.entries.into_iter().enumerate() {
        if !keep[index] {
            continue;
        }
        match &mut entry.kind {
            EntryKind::HardLink { target } => *target = renumbered[*target as usize],
            EntryKind::File { stream_offset, .. } => {
                let (start, end) = (*stream_offset, *stream_offset + entry.stream_bytes());
                match ranges.last_mut() {
                    Some(last) if last.1 == start => last.1 = end,
                    _ if start < end => ranges.push((start, end)),
                    _ => {}
                }
            }
            _ => {}
        }
        renumbered[index] = chosen.len() as u32;
        chosen.push(entry);
    }
    Ok(Chosen {
        tree: Tree { entries: chosen },
        ranges,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::{Extent, TreeEntry};

    fn entry(path: &str, kind: EntryKind) -> TreeEntry {
        TreeEntry {
            path: path.as_bytes().to_vec(),
            kind,
            mode: 0o755,
            uid: 0,
            gid: 0,
            atime: (0, 0),
            mtime: (0, 0),
            xattrs: Vec::new(),
            stamp: None,
        }
    }

    fn file(path: &str, stream_offset: u64, length: u64) -> TreeEntry {
        entry(
            path,
            EntryKind::File {
                size: length,
                stream_offset,
                extents: vec![Extent { offset: 0, length }],
            },
        )
    }

    /// Goal: the chosen tree holds the included subtrees, the directories leading to them
    /// and the files of chosen hard links, validates, and reads only the chosen files'
    /// ranges; an unknown path is named. Method: a small tree, two includes.
    #[test]
    fn chooses_subtrees_with_their_way_and_links() {
        let tree = Tree {
            entries: vec![
                entry("", EntryKind::Directory),
                entry("a", EntryKind::Directory),
                entry("a/b", EntryKind::Directory),
                file("a/b/one", 0, 10),
                file("a/b/two", 10, 5),
                file("a/other", 15, 20),
                entry("c", EntryKind::Directory),
                file("c/x", 35, 3),
                entry("c/link", EntryKind::HardLink { target: 5 }),
                entry("cc", EntryKind::Directory),
            ],
        };
        let chosen = select(tree.clone(), &[b"a/b".to_vec(), b"c/link".to_vec()]).unwrap();
        let paths: Vec<&str> = chosen
            .tree
            .entries
            .iter()
            .map(|entry| std::str::from_utf8(&entry.path).unwrap())
            .collect();
        assert_eq!(
            paths,
            ["", "a", "a/b", "a/b/one", "a/b/two", "a/other", "c", "c/link"]
        );
        assert_eq!(
            chosen.tree.entries[7].kind,
            EntryKind::HardLink { target: 5 }
        );
        assert_eq!(chosen.ranges, [(0, 35)]);
        chosen.tree.validate(38).unwrap();
        let only_x = select(tree.clone(), &[b"c/x".to_vec()]).unwrap();
        assert_eq!(only_x.ranges, [(35, 38)]);
        assert_eq!(only_x.tree.entries.len(), 3);
        assert_eq!(
            select(tree, &[b"c/nothing".to_vec()]),
            Err(b"c/nothing".to_vec())
        );
        assert!(!is_beneath(b"cc", b"c"));
        assert!(is_beneath(b"c/x", b"c"));
    }
}
