//! The files cache: a directory backup does not read the files that have not changed since
//! the series' previous backup; it places that backup's segments holding them in its stream.
//!
//! # Terms
//!
//! - A regular file is **unchanged** when the previous backup's tree has a regular file at
//!   the same path with the same size, mtime and [`FileStamp`](crate::tree::FileStamp)
//!   (ctime, inode, device) as the walk's `lstat` finds now, and the previous stamp is *settled*: the stream holds exactly
//!   the version it names, read long enough after its last change (see
//!   [`crate::tree::capture`]). The tree is the cache: nothing else is persisted.
//! - Segments respect file boundaries: every file starts a new chunk and its last chunk ends
//!   where the file ends; a file of at least the minimum segment size starts a new segment
//!   and ends one, and smaller files share a segment, which ends at the end of the first file
//!   that brings it to the minimum ([`crate::inline::StreamPart`]).
//! - A **run** of the previous backup is a sequence of its live recipe's segments whose bytes
//!   are exactly the contents of a sequence of files, back to back (a group of small files,
//!   or the segments of one large file). Runs are found from the recipe and the tree alone,
//!   so a backup cut another way only has fewer of them.
//!
//! # The path
//!
//! 1. Before the stream starts, the previous backup's tree is read (its range of the stream)
//!    and its runs found ([`Layout::of`]), unless the backup is forced to read everything,
//!    the series has no previous directory backup, or that backup is no longer live (its
//!    recipe then names chunks, not segments).
//! 2. The new tree is walked in order ([`plan`]): where an unchanged file starts a run, and
//!    the run's next files are the next files of the new tree, all unchanged (unchanged empty
//!    files may sit between them), the run's segments are placed in the stream
//!    ([`crate::inline::StreamPart::Segments`]) and its files take their old extents at their
//!    new stream offsets. An unchanged file without stream bytes is taken as it is. Every
//!    other file is read.
//! 3. The inline phase adds one live reference per placed segment, as for a duplicate
//!    segment; nothing else changes: reverse deduplication, deletion, check and repair see a
//!    live recipe like any other.
//!
//! Reads therefore scale with the change: a changed or new file is read, and so are the
//! unchanged files of a run it breaks (at most a segment's worth, the other small files of
//! its group).
//!
//! Not guaranteed: a file changed without any of the five changing (a write that restores
//! the mtime within the same ctime tick, which a file system with coarse timestamps allows)
//! is not read again. To narrow that window, a stamp is settled only when the file's mtime
//! and ctime are older than the backup's start by [`RACY_LOCAL_NANOSECONDS`] on a local file
//! system with nanosecond times, [`RACY_NANOSECONDS`] on any other. Segments with lost chunks
//! are never placed: their files are read again, which heals the loss in the new backup.

use std::collections::{BTreeSet, HashMap};

use serde::Serialize;

use crate::recipe::SegmentReference;
use crate::segment::SegmentId;
use crate::tree::{EntryKind, Tree, TreeEntry};

/// A file modified less than this before the backup started gets no stamp (it is read again
/// next time): a later change within the same timestamp tick would not show in its times.
/// Two seconds covers the coarsest common file systems (FAT) and some clock skew between a
/// network file system's server and this host.
pub const RACY_NANOSECONDS: i128 = 2_000_000_000;

/// The same window on the local file systems whose file times the kernel sets from its own
/// clock at nanosecond resolution ([`local_times`]): their tick is the kernel's coarse clock,
/// one jiffy (at most 10 ms), so five jiffies cover it.
pub const RACY_LOCAL_NANOSECONDS: i128 = 50_000_000;
const _: () = assert!(RACY_LOCAL_NANOSECONDS < RACY_NANOSECONDS);

/// Whether `f_type` (from `fstatfs`) names a file system whose file times the local kernel
/// sets at nanosecond resolution: ext2/3/4, XFS, Btrfs, tmpfs, F2FS, and overlayfs (its
/// times are its upper layer's). Any other, network and FUSE file systems included, takes
/// the coarse window.
pub fn local_times(f_type: i64) -> bool {
    const EXT4: i64 = 0xEF53;
    const XFS: i64 = 0x5846_5342;
    const BTRFS: i64 = 0x9123_683E;
    const TMPFS: i64 = 0x0102_1994;
    const F2FS: i64 = 0xF2F5_2010;
    const OVERLAYFS: i64 = 0x794C_7630;
    matches!(f_type, EXT4 | XFS | BTRFS | TMPFS | F2FS | OVERLAYFS)
}

/// The series' previous backup, as the files cache needs it.
pub(crate) struct PreviousBackup {
    pub tree: Tree,
    /// Its live recipe.
    pub recipe: Vec<SegmentReference>,
    /// Segments with lost chunks (the store state's `damaged_segments`).
    pub damaged: BTreeSet<SegmentId>,
}

/// What a directory backup read and what it took from the previous backup.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FilesReport {
    /// The version whose unchanged files were taken; `None` when every file was read (the
    /// first backup of the series, `--force`, or a previous backup that is not a live
    /// directory backup).
    pub previous_version: Option<u32>,
    /// Regular files read, and their bytes (every reading of a file that changed while it
    /// was read).
    pub files_read: u64,
    pub bytes_read: u64,
    /// Unchanged files not read: their contents are the previous backup's.
    pub files_kept: u64,
    pub bytes_kept: u64,
}

/// A run of the previous backup: segments holding exactly the contents of some files.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Run {
    segments: Vec<SegmentReference>,
    /// Stream offset of the run's first byte in the previous backup.
    stream_start: u64,
    /// Entry indices (in the previous tree) of its files, in stream order.
    files: Vec<usize>,
}

/// The previous backup as the files cache sees it.
pub(crate) struct Layout<'a> {
    tree: &'a Tree,
    runs: Vec<Run>,
    /// Run by the path of its first file.
    run_by_first_path: HashMap<&'a [u8], usize>,
    /// Regular files by path.
    file_by_path: HashMap<&'a [u8], usize>,
}

impl<'a> Layout<'a> {
    /// The runs of a previous backup with `tree` and live `recipe`; segments in `damaged`
    /// (with lost chunks) are never part of one.
    pub(crate) fn of(
        tree: &'a Tree,
        recipe: &[SegmentReference],
        damaged: &BTreeSet<SegmentId>,
    ) -> Layout<'a> {
        // Files with stream bytes, in stream order (tree order is stream order).
        let files: Vec<(usize, u64, u64)> = tree
            .entries
            .iter()
            .enumerate()
            .filter_map(|(index, entry)| match entry.kind {
                EntryKind::File { stream_offset, .. } if entry.stream_bytes() > 0 => {
                    Some((index, stream_offset, stream_offset + entry.stream_bytes()))
                }
                _ => None,
            })
            .collect();
        let mut starts = Vec::with_capacity(recipe.len());
        let mut offset = 0u64;
        for reference in recipe {
            starts.push(offset);
            offset += reference.raw_bytes;
        }
        let mut runs = Vec::new();
        let (mut segment, mut file) = (0usize, 0usize);
        while segment < recipe.len() {
            let start = starts[segment];
            while file < files.len() && files[file].1 < start {
                file += 1;
            }
            if file == files.len() {
                break;
            }
            if files[file].1 != start {
                segment += 1;
                continue;
            }
            // Extend over whole segments while the files go on back to back.
            let (mut last, mut next_file, mut covered) = (segment, file, start);
            let complete = loop {
                if damaged.contains(&recipe[last].segment) {
                    break false;
                }
                let end = starts[last] + recipe[last].raw_bytes;
                while next_file < files.len()
                    && files[next_file].1 == covered
                    && files[next_file].2 <= end
                {
                    covered = files[next_file].2;
                    next_file += 1;
                }
                if covered == end {
                    break true;
                }
                let spans_on = next_file < files.len()
                    && files[next_file].1 == covered
                    && last + 1 < recipe.len();
                if !spans_on {
                    break false;
                }
                last += 1;
            };
            if complete {
                runs.push(Run {
                    segments: recipe[segment..=last].to_vec(),
                    stream_start: start,
                    files: files[file..next_file]
                        .iter()
                        .map(|&(index, _, _)| index)
                        .collect(),
                });
                file = next_file;
            }
            segment = last + 1;
        }
        let run_by_first_path = runs
            .iter()
            .enumerate()
            .map(|(number, run)| (tree.entries[run.files[0]].path.as_slice(), number))
            .collect();
        let file_by_path = tree
            .entries
            .iter()
            .enumerate()
            .filter(|(_, entry)| matches!(entry.kind, EntryKind::File { .. }))
            .map(|(index, entry)| (entry.path.as_slice(), index))
            .collect();
        Layout {
            tree,
            runs,
            run_by_first_path,
            file_by_path,
        }
    }

    /// The previous entry of an unchanged file (see the module documentation).
    fn unchanged(&self, entry: &TreeEntry) -> Option<usize> {
        let EntryKind::File { size, .. } = entry.kind else {
            return None;
        };
        let stamp = entry.stamp?;
        let &index = self.file_by_path.get(entry.path.as_slice())?;
        let old = &self.tree.entries[index];
        let same = matches!(old.kind, EntryKind::File { size: old_size, .. } if old_size == size)
            && old.mtime == entry.mtime
            && old
                .stamp
                .is_some_and(|old| old.settled && old.same_version(&stamp));
        same.then_some(index)
    }
}

/// What the reader does with one file, or a run of files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Read the file at this position of the reader's file list.
    Read(usize),
    /// Place these segments; the files at these positions take their previous entries'
    /// extents, at the offsets they have relative to `stream_start` (files without stream
    /// bytes at the end of the file before them).
    Place {
        segments: Vec<SegmentReference>,
        stream_start: u64,
        files: Vec<(usize, usize)>,
    },
    /// Take the previous entry's contents (none: the file has no stream bytes).
    Keep { position: usize, previous: usize },
}

/// The steps for the files of `tree` at `files` (entry indices, in stream order), given the
/// previous backup's layout; see the module documentation.
pub(crate) fn plan(tree: &Tree, files: &[usize], layout: &Layout) -> Vec<Step> {
    let unchanged: Vec<Option<usize>> = files
        .iter()
        .map(|&index| layout.unchanged(&tree.entries[index]))
        .collect();
    let empty = |position: usize| {
        unchanged[position]
            .is_some_and(|previous| layout.tree.entries[previous].stream_bytes() == 0)
    };
    let mut steps = Vec::new();
    let mut position = 0;
    while position < files.len() {
        let Some(previous) = unchanged[position] else {
            steps.push(Step::Read(position));
            position += 1;
            continue;
        };
        if empty(position) {
            steps.push(Step::Keep { position, previous });
            position += 1;
            continue;
        }
        let run = layout
            .run_by_first_path
            .get(layout.tree.entries[previous].path.as_slice())
            .map(|&number| &layout.runs[number]);
        let matched = run.and_then(|run| {
            let mut taken = Vec::new();
            let mut next = position;
            for &wanted in &run.files {
                while next < files.len() && empty(next) {
                    taken.push((next, unchanged[next].expect("unchanged")));
                    next += 1;
                }
                if next == files.len() || unchanged[next] != Some(wanted) {
                    return None;
                }
                taken.push((next, wanted));
                next += 1;
            }
            Some((run, taken, next))
        });
        match matched {
            Some((run, taken, next)) => {
                steps.push(Step::Place {
                    segments: run.segments.clone(),
                    stream_start: run.stream_start,
                    files: taken,
                });
                position = next;
            }
            None => {
                steps.push(Step::Read(position));
                position += 1;
            }
        }
    }
    steps
}

/// The contents of the previous entry `previous` for a file taken from the cache: its size
/// and extents, at `stream_offset` in the new stream.
pub(crate) fn kept_kind(previous: &TreeEntry, stream_offset: u64) -> EntryKind {
    match &previous.kind {
        EntryKind::File { size, extents, .. } => EntryKind::File {
            size: *size,
            stream_offset,
            extents: extents.clone(),
        },
        _ => unreachable!("the cache holds regular files only"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::{Extent, FileStamp};

    /// Goal: the short racy window only for file systems known to set nanosecond times from
    /// the local clock; network, FUSE and unknown ones take the 2 s window.
    #[test]
    fn local_times_names_local_file_systems_only() {
        for local in [
            0xEF53,
            0x5846_5342,
            0x9123_683E,
            0x0102_1994,
            0xF2F5_2010,
            0x794C_7630,
        ] {
            assert!(local_times(local), "{local:#x}");
        }
        // NFS, SMB2, FUSE, 9p, FAT (msdos), and nothing.
        for other in [0x6969, 0xFE53_4D42, 0x6573_5546, 0x0102_1997, 0x4d44, 0] {
            assert!(!local_times(other), "{other:#x}");
        }
    }

    fn file(path: &str, offset: u64, length: u64, inode: u64) -> TreeEntry {
        TreeEntry {
            path: path.as_bytes().to_vec(),
            kind: EntryKind::File {
                size: length,
                stream_offset: offset,
                extents: if length == 0 {
                    Vec::new()
                } else {
                    vec![Extent { offset: 0, length }]
                },
            },
            mode: 0o644,
            uid: 0,
            gid: 0,
            atime: (0, 0),
            mtime: (1, 0),
            xattrs: Vec::new(),
            stamp: Some(FileStamp {
                ctime: (1, 0),
                inode,
                device: 1,
                settled: true,
            }),
        }
    }

    fn root() -> TreeEntry {
        TreeEntry {
            path: Vec::new(),
            kind: EntryKind::Directory,
            mode: 0o755,
            uid: 0,
            gid: 0,
            atime: (0, 0),
            mtime: (0, 0),
            xattrs: Vec::new(),
            stamp: None,
        }
    }

    fn segment(id: SegmentId, raw_bytes: u64) -> SegmentReference {
        SegmentReference {
            segment: id,
            chunk_count: 1,
            raw_bytes,
        }
    }

    /// Goal: runs are exactly the segment sequences that hold whole files back to back.
    /// Method: a stream of a group of two files (segment 1), a large file over two segments
    /// (2, 3), a segment straddling two files (4 and the start of 5), then the tree.
    #[test]
    fn runs_follow_file_boundaries() {
        let tree = Tree {
            entries: vec![
                root(),
                file("a", 0, 10, 1),
                file("b", 10, 20, 2),
                file("big", 30, 100, 3),
                file("c", 130, 15, 4),
                file("d", 145, 15, 5),
            ],
        };
        let recipe = [
            segment(1, 30),
            segment(2, 60),
            segment(3, 40),
            segment(4, 20),
            segment(5, 30), // d's end and tree bytes
        ];
        let layout = Layout::of(&tree, &recipe, &BTreeSet::new());
        assert_eq!(
            layout.runs,
            vec![
                Run {
                    segments: recipe[0..1].to_vec(),
                    stream_start: 0,
                    files: vec![1, 2],
                },
                Run {
                    segments: recipe[1..3].to_vec(),
                    stream_start: 30,
                    files: vec![3],
                },
            ]
        );
        // A damaged segment ends no run and starts none.
        let layout = Layout::of(&tree, &recipe, &BTreeSet::from([3]));
        assert_eq!(layout.runs.len(), 1);
    }

    /// Goal: an unchanged run is placed, a run with a changed or inserted file is read, and
    /// unchanged empty files are kept wherever they are. Method: plans against a layout of
    /// two runs, for trees with one file changed, a file inserted, an empty file inside a
    /// run.
    #[test]
    fn plans_place_only_whole_unchanged_runs() {
        let old = Tree {
            entries: vec![
                root(),
                file("a", 0, 10, 1),
                file("b", 10, 20, 2),
                file("e", 30, 0, 9),
                file("x", 30, 5, 3),
            ],
        };
        let recipe = [segment(1, 30), segment(2, 5)];
        let layout = Layout::of(&old, &recipe, &BTreeSet::new());
        let files = |tree: &Tree| -> Vec<usize> { (1..tree.entries.len()).collect() };

        let same = old.clone();
        assert_eq!(
            plan(&same, &files(&same), &layout),
            vec![
                Step::Place {
                    segments: recipe[0..1].to_vec(),
                    stream_start: 0,
                    files: vec![(0, 1), (1, 2)],
                },
                Step::Keep {
                    position: 2,
                    previous: 3
                },
                Step::Place {
                    segments: recipe[1..2].to_vec(),
                    stream_start: 30,
                    files: vec![(3, 4)],
                },
            ]
        );

        let mut changed = old.clone();
        changed.entries[2].stamp.as_mut().unwrap().ctime.1 = 5;
        assert_eq!(
            plan(&changed, &files(&changed), &layout)[..2],
            [Step::Read(0), Step::Read(1)]
        );

        let mut inserted = old.clone();
        inserted.entries.insert(2, file("aa", 0, 3, 7));
        assert_eq!(
            plan(&inserted, &files(&inserted), &layout)[..3],
            [Step::Read(0), Step::Read(1), Step::Read(2)]
        );

        let mut with_empty = old.clone();
        with_empty.entries.insert(2, file("ab", 0, 0, 8));
        let mut previous = old.clone();
        previous.entries.insert(2, file("ab", 10, 0, 8));
        let layout = Layout::of(&previous, &recipe, &BTreeSet::new());
        assert_eq!(
            plan(&with_empty, &files(&with_empty), &layout)[0],
            Step::Place {
                segments: recipe[0..1].to_vec(),
                stream_start: 0,
                files: vec![(0, 1), (1, 2), (2, 3)],
            }
        );
    }
}
