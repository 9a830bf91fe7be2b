//! Restore: rebuilding a backup's stream, multi-threaded and with prefetching (paper 2 §3.3).
//!
//! 1. Resolve the recipe to one [`ChunkSource`] per chunk ([`crate::resolve`]).
//! 2. Cut the stream into *windows* of about [`RuntimeOptions::restore_window_bytes`]; for
//!    each, look up where its chunks are (segment records) and coalesce chunks that lie close
//!    together in one container into one read.
//! 3. A prefetch thread asks the kernel to read the next window's spans ahead
//!    (`posix_fadvise(WILLNEED)` on each coalesced read, not on whole containers: a window
//!    often needs a small part of a large container, and reading the rest ahead only takes
//!    bandwidth from the reads that matter) while the current window is read.
//! 4. The reads of a window run on [`RuntimeOptions::read_threads`] threads; each checks the
//!    CRC of every chunk and decompresses it. Null chunks are not read: the window starts
//!    zero-filled.
//! 5. A writer thread hands finished windows to the sink: an image file (all-zero blocks are
//!    skipped, so the file comes out sparse), a byte stream, a directory tree
//!    ([`crate::tree::apply`]) or a tar archive of it ([`crate::tree::archive`]).
//!
//! A restore replaces nothing unless asked to ([`RestoreOptions::overwrite`]): a directory
//! target must be new or empty, a file target new; the refusal names what would be replaced
//! and happens before anything is written. A directory restore never creates or changes
//! anything outside its target (see [`crate::tree::apply`] for how, and for what overwriting
//! means). Not guaranteed: a failed restore leaves a partial target.
//!
//! Chunks a repair recorded as lost ([`crate::losses`]) are found before anything is
//! written: an image or stream restore then fails naming the lost byte ranges, and a
//! directory restore (or a tar archive of it) leaves out the files whose contents are lost,
//! restores the rest, and fails naming them.
//!
//! [`RuntimeOptions::restore_window_bytes`]: crate::config::RuntimeOptions::restore_window_bytes
//! [`RuntimeOptions::read_threads`]: crate::config::RuntimeOptions::read_threads

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::Instant;

use crossbeam_channel::bounded;
use onecopy_core::catalog::CatalogView;
use onecopy_core::container::{
    codec, is_zero, ChunkLocation, ContainerId, ContainerStore, CHUNK_HEADER_BYTES,
};
use rayon::prelude::*;
use serde::Serialize;

use crate::error::escape_path;
use crate::error::{BackupError, Result};
use crate::losses;
use crate::recipe::Recipe;
use crate::resolve::{locate, resolve, ChunkBytes, ChunkSource, ResolveReport, SegmentCache};
use crate::series::{find_backup, BackupState, SourceKind};
use crate::series::{load_series, BackupRecord};
use crate::store::BackupStore;
use crate::tree::apply::{ApplyOptions, ApplyReport, TreeApplier};
use crate::tree::archive::ArchiveWriter;
use crate::tree::select::{is_beneath, select};
use crate::tree::Tree;
use onecopy_core::error::IoContext;

/// Two chunks of one container are read together when at most this many bytes lie between.
const READ_GAP_BYTES_MAX: u64 = 64 << 10;
/// Largest single read.
const READ_BYTES_MAX: u64 = 16 << 20;
/// Output blocks checked for zeros when writing an image (skipped ones stay holes).
const SPARSE_BLOCK_BYTES: usize = 64 << 10;
/// Read spans queued for the prefetch thread (hints beyond are dropped).
const PREFETCH_QUEUE_SPANS: usize = 1024;
/// Windows queued for the writer thread.
const WRITE_QUEUE_WINDOWS: usize = 2;

/// Where a restore goes.
pub enum RestoreTarget {
    /// A directory backup: its contents go inside this directory (created if missing; it
    /// must be empty unless overwriting).
    Directory(PathBuf),
    /// The backup's stream goes to this file (created; an existing one only when
    /// overwriting). In a regular file zero blocks stay holes; a block device is written
    /// whole.
    File(PathBuf),
    /// The backup's stream goes to this writer (for example standard output). For a
    /// directory backup that is its raw stream (contents, then the encoded tree): see
    /// [`RestoreTarget::Archive`] for a form other tools read.
    Writer(Box<dyn Write + Send>),
    /// A directory backup as a POSIX pax tar archive ([`crate::tree::archive`]) written to
    /// this writer.
    Archive(Box<dyn Write + Send>),
}

/// How to restore.
#[derive(Clone, Debug, Default)]
pub struct RestoreOptions {
    /// Replace what the target holds: the entries of a directory target that the backup
    /// has (others stay), or an existing file's contents. Without it such a target is
    /// refused.
    pub overwrite: bool,
    /// Restore only these paths of a directory backup (relative to its root, see
    /// [`crate::BackupRecord::tree_path`]), with what they hold and the directories leading
    /// to them ([`crate::tree::select`]); empty for the whole tree. Only the stream bytes of
    /// the chosen files are read.
    pub include: Vec<Vec<u8>>,
}

/// Counters and timings of a restore.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RestoreReport {
    pub series: String,
    pub version: u32,
    pub logical_bytes: u64,
    pub zero_bytes: u64,
    /// Bytes read from containers (stored form, headers and gaps included).
    pub read_bytes: u64,
    pub reads: u64,
    pub containers_read: u64,
    pub resolve: ResolveReport,
    pub tree: Option<ApplyReport>,
    pub resolve_seconds: f64,
    pub seconds: f64,
}

/// One read of a window: a span of a container and the chunks in it.
struct SpanRead {
    container: ContainerId,
    start: u64,
    end: u64,
    /// The frames read, each with the pieces of it the window takes.
    frames: Vec<(ChunkLocation, Vec<Piece>)>,
}

/// Bytes of a decoded frame that go into a window.
#[derive(Clone, Copy, Debug)]
struct Piece {
    /// Where they start in the frame's raw bytes.
    within: usize,
    length: usize,
    /// Where they go in the window.
    window_offset: usize,
}

/// A planned window of the stream.
struct Window {
    start: u64,
    /// The range of the copy it serves: the bytes of the window delivered.
    range: (u64, u64),
    bytes: usize,
    reads: Vec<SpanRead>,
    zero_bytes: u64,
}

impl BackupStore {
    /// Restores `series@version` (the newest when `version` is `None`) to `target`, which
    /// must not hold anything yet (see [`BackupStore::restore_with`]).
    pub fn restore(
        &self,
        series: &str,
        version: Option<u32>,
        target: RestoreTarget,
    ) -> Result<RestoreReport> {
        self.restore_with(series, version, target, RestoreOptions::default())
    }

    /// Restores `series@version` (the newest when `version` is `None`) to `target`.
    pub fn restore_with(
        &self,
        series: &str,
        version: Option<u32>,
        target: RestoreTarget,
        options: RestoreOptions,
    ) -> Result<RestoreReport> {
        let started = Instant::now();
        self.catalog.read_ahead();
        let read = self.catalog.read()?;
        let (series_record, backup) = find_backup(&read, series, version)?;
        let (sources, resolve_report) = resolve(&read, &series_record, &backup)?;
        let mut report = RestoreReport {
            series: series.to_string(),
            version: backup.version,
            resolve: resolve_report,
            resolve_seconds: started.elapsed().as_secs_f64(),
            ..RestoreReport::default()
        };
        let mut cache = SegmentCache::new();
        let lost =
            losses::stream_losses(&read, &sources, &self.state.damaged_segments, &mut cache)?;
        let label = format!("backup {series}@{}", backup.version);
        let mut reader = StreamReader {
            store: self,
            view: &read,
            sources: &sources,
            marks: stream_marks(&read, &backup)?,
            cache,
            skip_lost: false,
        };
        let name = format!("{series}@{}", backup.version);
        let whole_tree = matches!(
            target,
            RestoreTarget::Directory(_) | RestoreTarget::Archive(_)
        );
        if !options.include.is_empty() && (backup.source != SourceKind::Directory || !whole_tree) {
            return Err(BackupError::InvalidArgument(format!(
                "--include chooses files of a directory backup restored into a directory or \
                 as a tar archive; {name} is restored whole here"
            )));
        }
        match (backup.source, target) {
            (
                SourceKind::Directory,
                target @ (RestoreTarget::Directory(_) | RestoreTarget::Archive(_)),
            ) => {
                let tree_range = backup
                    .tree
                    .ok_or_else(|| BackupError::corrupt(format!("backup {name}"), "no tree"))?;
                let tree_end = tree_range.offset + tree_range.bytes;
                if lost
                    .iter()
                    .any(|range| range.end > tree_range.offset && range.start < tree_end)
                {
                    return Err(BackupError::Lost {
                        what: label,
                        detail: "its directory tree is lost, so no file can be restored"
                            .to_string(),
                    });
                }
                let mut tree_bytes = Vec::with_capacity(tree_range.bytes as usize);
                reader.copy(
                    tree_range.offset,
                    backup.logical_bytes,
                    &mut report,
                    |_, data| {
                        tree_bytes.extend_from_slice(data);
                        Ok(())
                    },
                )?;
                let tree = Tree::decode(&tree_bytes)?;
                let mut left_out = losses::exclude_lost_files(tree, &lost);
                reader.skip_lost = !lost.is_empty();
                // Stream ranges to read: every file's, or those of the chosen ones.
                let mut ranges = vec![(0, tree_range.offset)];
                if !options.include.is_empty() {
                    let chosen = select(left_out.tree, &options.include).map_err(|missing| {
                        BackupError::InvalidArgument(format!(
                            "{} is not in backup {name} (see `onecopy backup ls {name}`); \
                             nothing was restored",
                            escape_path(&missing)
                        ))
                    })?;
                    left_out.tree = chosen.tree;
                    ranges = chosen.ranges;
                    // Lost files outside the chosen paths are no loss to this restore.
                    left_out.paths.retain(|path| {
                        options
                            .include
                            .iter()
                            .any(|include| is_beneath(path.as_bytes(), include))
                    });
                }
                match target {
                    RestoreTarget::Directory(root) => {
                        let apply_options = ApplyOptions {
                            backup: name,
                            overwrite: options.overwrite,
                        };
                        let mut applier = TreeApplier::prepare(
                            &root,
                            left_out.tree,
                            tree_range.offset,
                            &apply_options,
                        )?;
                        reader.copy_ranges(&ranges, &mut report, |offset, data| {
                            losses::write_outside(
                                &left_out.excluded,
                                offset,
                                data,
                                |offset, data| applier.write(offset, data),
                            )
                        })?;
                        report.tree = Some(applier.finish()?);
                    }
                    RestoreTarget::Archive(writer) => {
                        left_out
                            .tree
                            .validate(tree_range.offset)
                            .map_err(|problem| {
                                BackupError::corrupt_tree(&name, &problem.path, problem.detail)
                            })?;
                        let what = || "writing the tar archive".to_string();
                        let mut archive = ArchiveWriter::new(writer, left_out.tree);
                        reader.copy_ranges(&ranges, &mut report, |offset, data| {
                            losses::write_outside(
                                &left_out.excluded,
                                offset,
                                data,
                                |offset, data| Ok(archive.write(offset, data).context_io(what)?),
                            )
                        })?;
                        archive.finish().context_io(what)?;
                    }
                    _ => unreachable!("matched above"),
                }
                if !left_out.paths.is_empty() {
                    return Err(losses::lost_files_error(&label, &left_out.paths));
                }
            }
            (_, RestoreTarget::Directory(root)) => {
                return Err(BackupError::InvalidArgument(format!(
                    "backup {name} is an image or stream, not a directory: restore it to a \
                     file (--to-file {}) or to standard output (-)",
                    root.display()
                )))
            }
            (_, RestoreTarget::Archive(_)) => {
                return Err(BackupError::InvalidArgument(format!(
                    "backup {name} is an image or stream, not a directory: only a directory \
                     backup is restored as a tar archive"
                )))
            }
            (_, RestoreTarget::File(_) | RestoreTarget::Writer(_)) if !lost.is_empty() => {
                return Err(BackupError::Lost {
                    what: label,
                    detail: format!(
                        "{} are lost; nothing was written",
                        losses::describe_ranges(&losses::merged(&lost))
                    ),
                });
            }
            (_, RestoreTarget::File(path)) => {
                let (file, regular) = open_target_file(&path, options.overwrite)?;
                reader.copy(0, backup.logical_bytes, &mut report, |offset, data| {
                    let written = if regular {
                        write_sparse(&file, offset, data)
                    } else {
                        file.write_all_at(data, offset)
                    };
                    Ok(written.context_io(|| format!("writing {}", path.display()))?)
                })?;
                if regular {
                    file.set_len(backup.logical_bytes)
                        .context_io(|| format!("sizing {}", path.display()))?;
                }
                file.sync_all()
                    .context_io(|| format!("syncing {}", path.display()))?;
            }
            (_, RestoreTarget::Writer(mut writer)) => {
                reader.copy(0, backup.logical_bytes, &mut report, |_, data| {
                    Ok(writer
                        .write_all(data)
                        .context_io(|| "writing the restored stream".to_string())?)
                })?;
                writer
                    .flush()
                    .context_io(|| "writing the restored stream".to_string())?;
            }
        }
        report.seconds = started.elapsed().as_secs_f64();
        Ok(report)
    }
}

impl BackupStore {
    /// The record and directory tree of `series@version` (the newest when `version` is
    /// `None`): what `backup ls` lists and `backup diff` compares. Reads only the tree's part
    /// of the backup's stream.
    pub fn tree(&self, series: &str, version: Option<u32>) -> Result<(BackupRecord, Tree)> {
        self.catalog.read_ahead();
        let read = self.catalog.read()?;
        let (series_record, backup) = find_backup(&read, series, version)?;
        let tree = self.read_tree_in(&read, &series_record, &backup)?;
        Ok((backup, tree))
    }

    /// The directory tree of `backup`.
    pub(crate) fn read_tree(&self, backup: &BackupRecord) -> Result<Tree> {
        let read = self.catalog.read()?;
        let series_record = load_series(&read, &backup.series)?;
        self.read_tree_in(&read, &series_record, backup)
    }

    fn read_tree_in(
        &self,
        read: &impl CatalogView,
        series_record: &crate::series::SeriesRecord,
        backup: &BackupRecord,
    ) -> Result<Tree> {
        let name = format!("{}@{}", backup.series, backup.version);
        if backup.source != SourceKind::Directory {
            return Err(BackupError::InvalidArgument(format!(
                "backup {name} is an image or stream, not a directory: it holds no files"
            )));
        }
        let range = backup
            .tree
            .ok_or_else(|| BackupError::corrupt(format!("backup {name}"), "no tree"))?;
        let (sources, _) = resolve(read, series_record, backup)?;
        let mut reader = StreamReader {
            store: self,
            view: read,
            sources: &sources,
            marks: stream_marks(read, backup)?,
            cache: SegmentCache::new(),
            skip_lost: false,
        };
        let mut bytes = Vec::with_capacity(range.bytes as usize);
        let mut report = RestoreReport::default();
        reader.copy(
            range.offset,
            range.offset + range.bytes,
            &mut report,
            |_, data| {
                bytes.extend_from_slice(data);
                Ok(())
            },
        )?;
        Tree::decode(&bytes)
    }
}

/// Opens the file target of a stream restore: a new file, or with `overwrite` an existing
/// file or device (a regular file is emptied first). Returns the file and whether it is a
/// regular file (where zero blocks can stay holes); a device is written whole.
fn open_target_file(path: &std::path::Path, overwrite: bool) -> Result<(std::fs::File, bool)> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let mut open = std::fs::OpenOptions::new();
    open.write(true);
    if overwrite {
        open.create(true);
    } else {
        open.create_new(true);
    }
    let file = match open.open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
            let what = match std::fs::symlink_metadata(path) {
                Ok(metadata) if metadata.is_file() => {
                    format!("a regular file of {} bytes", metadata.size())
                }
                Ok(metadata) if metadata.file_type().is_block_device() => {
                    "a block device".to_string()
                }
                Ok(metadata) if metadata.is_symlink() => "a symbolic link".to_string(),
                Ok(metadata) if metadata.is_dir() => "a directory".to_string(),
                _ => "something".to_string(),
            };
            return Err(BackupError::TargetNotEmpty {
                target: path.display().to_string(),
                detail: format!(
                    "exists ({what}). Nothing was written: restore to a new file, or pass \
                     --overwrite to replace its contents"
                ),
            });
        }
        Err(error) => {
            return Err(BackupError::io(
                format!("creating {}", path.display()),
                error,
            ))
        }
    };
    let metadata = file
        .metadata()
        .context_io(|| format!("reading {}", path.display()))?;
    let regular = metadata.is_file();
    if regular {
        file.set_len(0)
            .context_io(|| format!("emptying {}", path.display()))?;
    }
    Ok((file, regular))
}

/// Writes `data` at `offset`, skipping all-zero blocks (the file was truncated, so they read
/// as zeros).
fn write_sparse(file: &std::fs::File, offset: u64, data: &[u8]) -> std::io::Result<()> {
    let mut position = 0;
    while position < data.len() {
        let end = (position + SPARSE_BLOCK_BYTES).min(data.len());
        if !is_zero(&data[position..end]) {
            file.write_all_at(&data[position..end], offset + position as u64)?;
        }
        position = end;
    }
    Ok(())
}

/// Reads ranges of a resolved stream.
struct StreamReader<'a, V: CatalogView> {
    store: &'a BackupStore,
    view: &'a V,
    sources: &'a [ChunkSource],
    /// Where whole segments of a live recipe start, as (chunk position, stream offset), so
    /// that reading part of the stream (the tree, chosen files) skips what comes before it
    /// without reading the segment records of every chunk there ([`stream_marks`]).
    marks: Vec<(usize, u64)>,
    cache: SegmentCache,
    /// Lost chunks read as zeros instead of failing: only when the sink drops their bytes.
    skip_lost: bool,
}

impl<V: CatalogView> StreamReader<'_, V> {
    /// Delivers stream bytes `[start, end)` to `sink` in order, as (stream offset, bytes).
    fn copy(
        &mut self,
        start: u64,
        end: u64,
        report: &mut RestoreReport,
        sink: impl FnMut(u64, &[u8]) -> Result<()> + Send,
    ) -> Result<()> {
        self.copy_ranges(&[(start, end)], report, sink)
    }

    /// Delivers the stream bytes of `ranges` (sorted, disjoint `[start, end)`) to `sink` in
    /// order, as (stream offset, bytes), reading only the chunks they overlap.
    fn copy_ranges(
        &mut self,
        ranges: &[(u64, u64)],
        report: &mut RestoreReport,
        mut sink: impl FnMut(u64, &[u8]) -> Result<()> + Send,
    ) -> Result<()> {
        let ranges: Vec<(u64, u64)> = ranges
            .iter()
            .copied()
            .filter(|(start, end)| start < end)
            .collect();
        assert!(
            ranges.windows(2).all(|pair| pair[0].1 <= pair[1].0),
            "ranges are sorted and disjoint"
        );
        if ranges.is_empty() {
            return Ok(());
        }
        let window_bytes = self.store.runtime.restore_window_bytes.max(1);
        let threads = self.store.runtime.read_threads.max(1);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .map_err(|error| {
                BackupError::io("starting restore threads", std::io::Error::other(error))
            })?;
        let store: &BackupStore = self.store;
        let containers = &store.containers;
        let prefetch = store.runtime.prefetch;
        let mut windows = WindowPlanner {
            position: 0,
            offset: 0,
            ranges,
            range_index: 0,
            last_chunk: None,
            window_bytes,
        };
        std::thread::scope(|scope| -> Result<()> {
            let (prefetch_sender, prefetch_receiver) =
                bounded::<(ContainerId, u64, u64)>(PREFETCH_QUEUE_SPANS);
            scope.spawn(move || {
                for (id, span_start, span_end) in prefetch_receiver {
                    // A hint only: a failure to advise changes nothing but speed.
                    if let Ok(file) = containers.file(id) {
                        let _ = file.advise_will_need(span_start, span_end - span_start);
                    }
                }
            });
            let (window_sender, window_receiver) =
                bounded::<(u64, (u64, u64), Vec<u8>)>(WRITE_QUEUE_WINDOWS);
            let writer = scope.spawn(move || -> Result<()> {
                for (offset, (start, end), buffer) in window_receiver {
                    let clip_start = start.max(offset);
                    let clip_end = end.min(offset + buffer.len() as u64);
                    if clip_start < clip_end {
                        sink(
                            clip_start,
                            &buffer[(clip_start - offset) as usize..(clip_end - offset) as usize],
                        )?;
                    }
                }
                Ok(())
            });
            let mut next = windows.next(self)?;
            let result = (|| -> Result<()> {
                while let Some(window) = next.take() {
                    next = windows.next(self)?;
                    if let (true, Some(upcoming)) = (prefetch, &next) {
                        for read in &upcoming.reads {
                            // A full queue drops hints rather than delaying the restore.
                            let _ =
                                prefetch_sender.try_send((read.container, read.start, read.end));
                        }
                    }
                    let buffer = read_window(containers, &pool, &window, report)?;
                    if window_sender
                        .send((window.start, window.range, buffer))
                        .is_err()
                    {
                        break; // The writer failed; its error is reported below.
                    }
                }
                Ok(())
            })();
            drop(window_sender);
            drop(prefetch_sender);
            let written = writer.join().expect("the writer thread does not panic");
            result.and(written)
        })
    }
}

/// Cuts the ranges of the stream to copy into windows, one range after the other.
struct WindowPlanner {
    /// Next chunk to place.
    position: usize,
    /// Stream offset of that chunk.
    offset: u64,
    /// Sorted, disjoint, non-empty ranges.
    ranges: Vec<(u64, u64)>,
    /// The range being cut.
    range_index: usize,
    /// (position, offset) of the last chunk placed in a window: the next range may start
    /// inside it.
    last_chunk: Option<(usize, u64)>,
    window_bytes: usize,
}

impl WindowPlanner {
    fn next<V: CatalogView>(&mut self, reader: &mut StreamReader<'_, V>) -> Result<Option<Window>> {
        let sources = reader.sources;
        let (start, end) = loop {
            let Some(&(start, end)) = self.ranges.get(self.range_index) else {
                return Ok(None);
            };
            // Skip whole segments, then whole chunks, before `start`.
            let marks = &reader.marks;
            let before = marks.partition_point(|&(_, offset)| offset <= start);
            if let Some(&(position, offset)) = before.checked_sub(1).map(|at| &marks[at]) {
                if position > self.position {
                    (self.position, self.offset) = (position, offset);
                }
            }
            while self.position < sources.len() && self.offset < start {
                let bytes = chunk_bytes(reader, sources[self.position])? as u64;
                if self.offset + bytes > start {
                    break;
                }
                self.offset += bytes;
                self.position += 1;
            }
            if self.position >= sources.len() {
                return Ok(None);
            }
            if self.offset < end {
                break (start, end);
            }
            self.range_index += 1;
            // The last chunk of this range may hold the start of the next: place it again.
            if let (Some(&(next_start, _)), Some((position, offset))) =
                (self.ranges.get(self.range_index), self.last_chunk)
            {
                if self.offset > next_start {
                    assert!(offset <= next_start, "ranges are disjoint and sorted");
                    (self.position, self.offset) = (position, offset);
                }
            }
        };
        let mut window = Window {
            start: self.offset,
            range: (start, end),
            bytes: 0,
            reads: Vec::new(),
            zero_bytes: 0,
        };
        // The frames the window's chunks are in, by container and frame offset.
        let mut by_container: HashMap<ContainerId, BTreeMap<u32, (ChunkLocation, Vec<Piece>)>> =
            HashMap::new();
        while self.position < sources.len() && window.bytes < self.window_bytes && self.offset < end
        {
            self.last_chunk = Some((self.position, self.offset));
            let source = sources[self.position];
            let raw_bytes = match source {
                ChunkSource::Zero { raw_bytes } => {
                    window.zero_bytes += raw_bytes as u64;
                    raw_bytes
                }
                ChunkSource::Stored { segment, index } => {
                    let (bytes, raw_bytes) =
                        locate(reader.view, &mut reader.cache, segment, index)?;
                    match bytes {
                        ChunkBytes::Zero => window.zero_bytes += raw_bytes as u64,
                        ChunkBytes::Frame { frame, within } => by_container
                            .entry(frame.container)
                            .or_default()
                            .entry(frame.offset)
                            .or_insert_with(|| (frame, Vec::new()))
                            .1
                            .push(Piece {
                                within: within as usize,
                                length: raw_bytes as usize,
                                window_offset: window.bytes,
                            }),
                        ChunkBytes::Lost if reader.skip_lost => {
                            window.zero_bytes += raw_bytes as u64
                        }
                        ChunkBytes::Lost => {
                            return Err(BackupError::Lost {
                                what: format!("chunk {index} of segment {segment}"),
                                detail: "its bytes were damaged".to_string(),
                            })
                        }
                    }
                    raw_bytes
                }
            };
            window.bytes += raw_bytes as usize;
            self.offset += raw_bytes as u64;
            self.position += 1;
        }
        let mut containers: Vec<_> = by_container.into_iter().collect();
        containers.sort_unstable_by_key(|(id, _)| *id);
        for (container, frames) in containers {
            let mut current: Option<SpanRead> = None;
            for (_, (location, pieces)) in frames {
                let frame_start = location.header_offset();
                let frame_end = location.offset as u64 + location.stored_bytes as u64;
                if let Some(span) = current.as_mut() {
                    let joinable = frame_start <= span.end + READ_GAP_BYTES_MAX
                        && frame_end - span.start <= READ_BYTES_MAX;
                    if joinable {
                        span.end = span.end.max(frame_end);
                        span.frames.push((location, pieces));
                        continue;
                    }
                    window.reads.push(current.take().expect("present"));
                }
                current = Some(SpanRead {
                    container,
                    start: frame_start,
                    end: frame_end,
                    frames: vec![(location, pieces)],
                });
            }
            window.reads.extend(current);
        }
        Ok(Some(window))
    }
}

/// The start of every segment of `backup`'s recipe when it is live, as (chunk position,
/// stream offset) in stream order; nothing for an archival recipe, whose chunk sizes are in
/// the segment records only.
fn stream_marks(view: &impl CatalogView, backup: &BackupRecord) -> Result<Vec<(usize, u64)>> {
    if backup.state != BackupState::Live {
        return Ok(Vec::new());
    }
    let Recipe::Live(entries) = Recipe::load(view, backup.id, backup.recipe_parts)? else {
        return Ok(Vec::new());
    };
    let mut marks = Vec::with_capacity(entries.len());
    let (mut position, mut offset) = (0usize, 0u64);
    for entry in entries {
        marks.push((position, offset));
        position += entry.chunk_count as usize;
        offset += entry.raw_bytes;
    }
    Ok(marks)
}

fn chunk_bytes<V: CatalogView>(
    reader: &mut StreamReader<'_, V>,
    source: ChunkSource,
) -> Result<u32> {
    Ok(match source {
        ChunkSource::Zero { raw_bytes } => raw_bytes,
        ChunkSource::Stored { segment, index } => {
            let record = reader.cache.get(reader.view, segment)?;
            record
                .chunks
                .get(index as usize)
                .ok_or_else(|| {
                    BackupError::corrupt(format!("segment {segment}"), format!("no chunk {index}"))
                })?
                .raw_bytes
        }
    })
}

/// Reads every span of `window` on the pool and assembles the window's bytes.
fn read_window(
    containers: &ContainerStore,
    pool: &rayon::ThreadPool,
    window: &Window,
    report: &mut RestoreReport,
) -> Result<Vec<u8>> {
    let pieces: Vec<DecodedSpan> = pool.install(|| {
        window
            .reads
            .par_iter()
            .map(|span| read_span(containers, span))
            .collect::<Result<_>>()
    })?;
    let mut buffer = vec![0u8; window.bytes];
    for span in pieces {
        let mut from = 0;
        for (offset, length) in span.pieces {
            buffer[offset..offset + length].copy_from_slice(&span.raw[from..from + length]);
            from += length;
        }
    }
    let mut seen: Vec<ContainerId> = window.reads.iter().map(|span| span.container).collect();
    seen.dedup();
    report.containers_read += seen.len() as u64;
    report.reads += window.reads.len() as u64;
    report.read_bytes += window
        .reads
        .iter()
        .map(|span| span.end - span.start)
        .sum::<u64>();
    report.zero_bytes += window.zero_bytes;
    report.logical_bytes += window.bytes as u64;
    Ok(buffer)
}

/// The raw bytes of a span's pieces, one after the other, and where each goes in the window
/// (offset, length): one allocation per span rather than one per chunk.
struct DecodedSpan {
    pieces: Vec<(usize, usize)>,
    raw: Vec<u8>,
}

/// Reads one span and decodes its frames (CRC checked, decompressed), keeping the pieces the
/// window takes.
fn read_span(containers: &ContainerStore, span: &SpanRead) -> Result<DecodedSpan> {
    let file = containers.file(span.container)?;
    let mut bytes = vec![0u8; (span.end - span.start) as usize];
    file.read_at(span.start, &mut bytes)?;
    let raw_total: usize = span
        .frames
        .iter()
        .flat_map(|(_, pieces)| pieces.iter().map(|piece| piece.length))
        .sum();
    let mut decoded = DecodedSpan {
        pieces: Vec::new(),
        raw: vec![0u8; raw_total],
    };
    // Each frame's pieces take the next run of the buffer, so that the span's frames decode
    // on all threads (a window may be one span of a few large frames).
    let mut runs = Vec::with_capacity(span.frames.len());
    let mut rest = decoded.raw.as_mut_slice();
    for (_, pieces) in &span.frames {
        let length = pieces.iter().map(|piece| piece.length).sum();
        let (run, tail) = std::mem::take(&mut rest).split_at_mut(length);
        runs.push(run);
        rest = tail;
    }
    span.frames
        .par_iter()
        .zip(runs)
        .try_for_each(|((location, pieces), run)| {
            let from = (location.offset as u64 - span.start) as usize;
            let stored = &bytes[from..from + location.stored_bytes as usize];
            // A frame taken whole and in order decodes in place.
            let mut within = 0;
            let whole = run.len() == location.raw_bytes as usize
                && pieces.iter().all(|piece| {
                    let in_order = piece.within == within;
                    within += piece.length;
                    in_order
                });
            if whole {
                return codec::decode(location, stored, run);
            }
            FRAME_RAW.with(|frame_raw| {
                let mut frame_raw = frame_raw.borrow_mut();
                frame_raw.resize(location.raw_bytes as usize, 0);
                codec::decode(location, stored, &mut frame_raw)?;
                let mut at = 0;
                for piece in pieces {
                    run[at..at + piece.length]
                        .copy_from_slice(&frame_raw[piece.within..piece.within + piece.length]);
                    at += piece.length;
                }
                Ok(())
            })
        })?;
    decoded.pieces = span
        .frames
        .iter()
        .flat_map(|(_, pieces)| pieces.iter())
        .map(|piece| (piece.window_offset, piece.length))
        .collect();
    Ok(decoded)
}

thread_local! {
    /// A read thread's buffer for a frame of which a window takes only some chunks.
    static FRAME_RAW: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

const _: () = assert!(CHUNK_HEADER_BYTES as u64 <= READ_GAP_BYTES_MAX);
