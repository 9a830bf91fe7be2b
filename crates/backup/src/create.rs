//! `backup create`: the inline phase, its commit, then the reverse deduplication and
//! retention it triggers.
//!
//! Commit order (the write-ordering contract): the inline phase seals, and so syncs, every new
//! container (**data**); then the segment index is checkpointed with the serial the catalog
//! will have (**index**); then one catalog transaction adds the segment records, counts,
//! container records, the recipe, the backup and the series version (**recipe**). A crash
//! before the last step loses only the unfinished backup: its containers are unreferenced and
//! its index entries name segments the catalog does not confirm, and recovery removes both.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::PathBuf;
use std::time::Instant;

use onecopy_core::catalog::CatalogView;
use onecopy_core::chunking::ChunkerSpec;
use serde::Serialize;

use crate::compact::CompactReport;
use crate::config::{DedupMode, DeleteMethod, SeriesOptions};
use crate::delete::DeleteReport;
use crate::error::{BackupError, Result};
use crate::files_cache::{FilesReport, PreviousBackup};
use crate::inline::{self, InlineReport, PartedSource, Progress, WholeStream};
use crate::recipe::Recipe;
use crate::reverse::ReverseReport;
use crate::segment::{put_segment_record, SegmentHead, SegmentState, CONTAINERS, SEGMENT_HEADS};
use crate::series::{
    encode_backup, load_backup, validate_series_name, BackupRecord, BackupState, SeriesRecord,
    SourceKind, BACKUPS, SERIES,
};
use crate::store::{load_head, now_unix_ns, BackupStore, RecoveryReport};
use crate::tree::capture::{
    walk_selection, FileWarning, ReadObserver, ReaderSettings, Selection, TreeReader, WalkOptions,
};
use crate::tree::compare::{summarize, ChangeSummary};
use crate::tree::Tree;
use onecopy_core::error::IoContext;

/// What to back up.
pub enum BackupSource {
    /// A directory tree, with its metadata.
    Directory(PathBuf),
    /// Several paths (directories, files, links...) in one tree rooted at their deepest
    /// common directory ([`Selection`]); one directory is the same as
    /// [`BackupSource::Directory`].
    Paths(Vec<PathBuf>),
    /// A regular file or disk image (or a block device), read as a byte stream. Anything
    /// else (a FIFO, socket or character device, whose reading may never end) is refused.
    File(PathBuf),
    /// Any byte stream, such as standard input; `name` is shown in listings.
    Reader {
        reader: Box<dyn Read + Send>,
        name: String,
    },
    /// Paths walked before the backup began ([`WalkedPaths::walk`]).
    Walked(WalkedPaths),
}

/// Paths walked ahead of a backup: a caller walks them while it opens the store, whose key
/// derivation keeps the cores busy for a few hundredths of a second, and hands them over as
/// [`BackupSource::Walked`]. The tree is what the paths held when walked; the backup reads
/// the files' contents, and each file's entry takes the size and metadata of that reading
/// ([`crate::tree::capture`]), so a file changed in between is stored as it was read.
pub struct WalkedPaths {
    selection: Selection,
    tree: Tree,
    /// When the walk began: files modified within their file system's racy window before
    /// this get no stamp, since a change in the same timestamp tick would not show in their
    /// times.
    started_ns: i128,
    seconds: f64,
}

impl WalkedPaths {
    /// Walks `paths` (one tree rooted at their deepest common directory, see [`Selection`])
    /// without what `options` leaves out.
    pub fn walk(paths: &[PathBuf], options: &WalkOptions) -> Result<WalkedPaths> {
        if paths.is_empty() {
            return Err(BackupError::InvalidArgument(
                "a backup needs at least one path".to_string(),
            ));
        }
        let started = Instant::now();
        let started_ns = now_unix_ns() as i128;
        let selection = Selection::of(paths)?;
        let tree = walk_selection(&selection, options)?;
        Ok(WalkedPaths {
            selection,
            tree,
            started_ns,
            seconds: started.elapsed().as_secs_f64(),
        })
    }
}

/// How to create a backup.
#[derive(Default)]
pub struct CreateOptions<'a> {
    /// Sets the series' windows (kept for later backups); `None` keeps them (new series:
    /// the defaults).
    pub series_options: Option<SeriesOptions>,
    /// Leave reverse deduplication to a later `reverse` call.
    pub defer_reverse: bool,
    /// Method for the deletions of the series' retention window.
    pub delete_method: Option<DeleteMethod>,
    /// Called with the stream bytes processed so far.
    pub progress: Option<Progress<'a>>,
    /// Called by a directory backup's reader after each read from a file (tests use it to
    /// change a file while it is read).
    pub read_observer: Option<ReadObserver<'a>>,
    /// What a directory backup leaves out.
    pub walk: WalkOptions,
    /// Labels kept in the backup record (`backup create --tag`).
    pub tags: Vec<String>,
    /// The machine the backup is of, kept in the backup record.
    pub host: Option<String>,
    /// Read every file of a directory backup, even those the files cache finds unchanged
    /// since the series' previous backup (`backup create --force`).
    pub force: bool,
}

/// What creating a backup did, phase by phase.
#[derive(Clone, Debug, Serialize)]
pub struct CreateReport {
    pub series: String,
    pub version: u32,
    pub created_unix_ns: u64,
    pub source: SourceKind,
    pub recovery: RecoveryReport,
    /// Directory walk (metadata capture) before the inline phase.
    pub walk_seconds: f64,
    pub inline: InlineReport,
    /// Index checkpoint and catalog commit.
    pub commit_seconds: f64,
    /// Files of a directory backup that changed while they were read, or were no longer
    /// regular files when their turn came, and what the backup holds for each.
    pub warnings: Vec<FileWarning>,
    /// A directory backup's new, changed and unchanged files compared with the series'
    /// previous backup.
    pub summary: Option<ChangeSummary>,
    /// Why there is no summary for a directory backup (the previous backup's tree could not
    /// be read); the backup itself is committed.
    pub summary_error: Option<String>,
    /// A directory backup's files read and files taken unchanged from the previous backup
    /// ([`crate::files_cache`]).
    pub files: Option<FilesReport>,
    /// Why a directory backup read every file although the series has a previous directory
    /// backup (its tree could not be read); the backup itself is complete.
    pub files_cache_error: Option<String>,
    pub reverse: Vec<ReverseReport>,
    /// Why reverse deduplication was left for later although it was due (the file system
    /// filled up while repackaging); the backup itself is committed.
    pub reverse_deferred: Option<String>,
    pub expire: Vec<DeleteReport>,
    /// The earlier backups' frames compressed again ([`crate::recompress`]).
    pub recompression: Option<CompactReport>,
    /// Why that recompression stopped (a full file system, a damaged frame): the backup
    /// itself is committed, and the next backup takes the recompression up again.
    pub recompression_error: Option<String>,
    pub seconds: f64,
}

/// Checks a tag or host name: 1 to 200 printable characters without a comma (which separates
/// tags on the command line).
fn validate_label(what: &str, label: &str) -> Result<()> {
    let valid = !label.is_empty()
        && label.len() <= 200
        && !label.contains(',')
        && !label.chars().any(char::is_control);
    if valid {
        Ok(())
    } else {
        Err(BackupError::InvalidArgument(format!(
            "{what} {label:?} must be 1 to 200 printable characters without ','"
        )))
    }
}

/// Opens a file source: a regular file or a block device. The open does not block (a FIFO
/// would wait for a writer), and anything else is refused, since reading it may never end.
fn open_file_source(path: &std::path::Path) -> Result<File> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .context_io(|| format!("opening {}", path.display()))?;
    let file_type = file
        .metadata()
        .context_io(|| format!("reading {}", path.display()))?
        .file_type();
    if !file_type.is_file() && !file_type.is_block_device() {
        return Err(BackupError::InvalidArgument(format!(
            "{} is {}: a backup reads a directory, a regular file or disk image, or a block \
             device; to back up what a program writes, pipe it to `onecopy backup create \
             SERIES -`",
            path.display(),
            describe_file_type(&file_type)
        )));
    }
    // Reads of regular files and block devices do not block anyway; clear the flag so the
    // descriptor behaves as an ordinary one.
    // SAFETY: fcntl on an open descriptor with integer arguments.
    unsafe {
        let flags = libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(&file), libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(
                std::os::fd::AsRawFd::as_raw_fd(&file),
                libc::F_SETFL,
                flags & !libc::O_NONBLOCK,
            );
        }
    }
    Ok(file)
}

/// What a file that is not a directory, regular file or block device is, for messages.
pub fn describe_file_type(file_type: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if file_type.is_fifo() {
        "a FIFO (named pipe)"
    } else if file_type.is_socket() {
        "a socket"
    } else if file_type.is_char_device() {
        "a character device"
    } else if file_type.is_symlink() {
        "a symbolic link"
    } else {
        "not a regular file"
    }
}

impl BackupStore {
    /// The previous directory backup's tree, and what the files cache needs of it when its
    /// recipe is still live (an archival recipe names chunks, not segments to place).
    fn files_cache_of(&self, previous: &BackupRecord) -> Result<Option<(Tree, PreviousBackup)>> {
        let tree = self.read_tree(previous)?;
        let read = self.catalog.read()?;
        let Recipe::Live(recipe) = Recipe::load(&read, previous.id, previous.recipe_parts)? else {
            return Ok(None);
        };
        let damaged = self.state.damaged_segments.clone();
        Ok(Some((
            tree.clone(),
            PreviousBackup {
                tree,
                recipe,
                damaged,
            },
        )))
    }

    /// Files of at least this size start and end their own segments: the minimum segment
    /// size (every file, when every chunk is a segment).
    fn alone_bytes(&self) -> Result<u64> {
        Ok(match self.state.options.chunker_spec()? {
            ChunkerSpec::Segment { segment, .. } => segment.bytes_min as u64,
            _ => 0,
        })
    }

    /// Backs `source` up as the next version of `series`; see the module documentation.
    ///
    /// On a full file system the backup fails with [`BackupError::Full`] before its commit
    /// and removes what it wrote; a reverse deduplication that finds no room after the
    /// commit is left for later ([`CreateReport::reverse_deferred`]).
    pub fn create_backup(
        &mut self,
        series: &str,
        source: BackupSource,
        options: CreateOptions,
    ) -> Result<CreateReport> {
        self.mutate("creating a backup", |store| {
            store.create_backup_unguarded(series, source, options)
        })
    }

    fn create_backup_unguarded(
        &mut self,
        series: &str,
        source: BackupSource,
        options: CreateOptions,
    ) -> Result<CreateReport> {
        let started = Instant::now();
        validate_series_name(series)?;
        for tag in &options.tags {
            validate_label("tag", tag)?;
        }
        if let Some(host) = &options.host {
            validate_label("host name", host)?;
        }
        if let Some(series_options) = &options.series_options {
            series_options.validate()?;
        }
        let recovery = self.recover()?;
        // The inline phase's containers start here: the next backup recompresses them.
        let first_container = self.state.container_id_next;
        self.catalog.read_ahead();
        let read = self.catalog.read()?;
        let mut series_record: SeriesRecord = read
            .get_json(SERIES, series)?
            .unwrap_or_else(|| SeriesRecord::new(series, SeriesOptions::default()));
        if let Some(series_options) = options.series_options {
            series_record.options = series_options;
        }
        // Time stamps increase within a series even if the clock steps back.
        let mut created_unix_ns = now_unix_ns();
        let mut previous = None;
        if let Some(&newest) = series_record.versions.values().next_back() {
            let record = load_backup(&read, newest)?;
            created_unix_ns = created_unix_ns.max(record.created_unix_ns + 1);
            previous = Some(record);
        }
        drop(read);
        let source = match source {
            BackupSource::Directory(path) => {
                BackupSource::Walked(WalkedPaths::walk(&[path], &options.walk)?)
            }
            BackupSource::Paths(paths) => {
                BackupSource::Walked(WalkedPaths::walk(&paths, &options.walk)?)
            }
            other => other,
        };
        let walk_started = Instant::now();
        let mut capture = None;
        let mut files_cache_error = None;
        let mut previous_tree = None;
        let mut selection = None;
        let mut walk_seconds = 0.0;
        let (kind, name, mut reader): (SourceKind, String, Box<dyn PartedSource + '_>) =
            match source {
                BackupSource::Walked(walked) => {
                    let WalkedPaths {
                        selection: selected,
                        tree,
                        started_ns,
                        seconds,
                    } = walked;
                    walk_seconds = seconds;
                    let cached = match previous.as_ref() {
                        Some(previous) if previous.source == SourceKind::Directory => {
                            match self.files_cache_of(previous) {
                                Ok(cached) => cached,
                                Err(error) => {
                                    files_cache_error = Some(error.to_string());
                                    None
                                }
                            }
                        }
                        _ => None,
                    };
                    let settings = ReaderSettings {
                        previous: None,
                        started_ns,
                        alone_bytes: self.alone_bytes()?,
                    };
                    let settings = match cached {
                        Some((tree, previous_backup)) => {
                            previous_tree = Some(tree);
                            ReaderSettings {
                                previous: (!options.force).then_some(previous_backup),
                                ..settings
                            }
                        }
                        None => settings,
                    };
                    let files_cache_version = settings
                        .previous
                        .as_ref()
                        .and(previous.as_ref())
                        .map(|previous| previous.version);
                    let reader = TreeReader::with_settings(
                        &selected.root,
                        tree,
                        options.read_observer,
                        settings,
                    )?;
                    reader
                        .outcome()
                        .lock()
                        .expect("the outcome's lock is never poisoned")
                        .files
                        .previous_version = files_cache_version;
                    capture = Some(reader.outcome());
                    let name = selected
                        .given
                        .iter()
                        .map(|path| path.display().to_string())
                        .collect::<Vec<_>>()
                        .join(" ");
                    selection = Some(selected);
                    (SourceKind::Directory, name, Box::new(reader))
                }
                BackupSource::Directory(_) | BackupSource::Paths(_) => {
                    unreachable!("walked above")
                }
                BackupSource::File(path) => (
                    SourceKind::File,
                    path.display().to_string(),
                    Box::new(WholeStream::new(open_file_source(&path)?)),
                ),
                BackupSource::Reader { reader, name } => {
                    (SourceKind::Stream, name, Box::new(WholeStream::new(reader)))
                }
            };
        walk_seconds += walk_started.elapsed().as_secs_f64();
        let outcome = inline::run(self, reader.as_mut(), options.progress)?;
        drop(reader);
        let mut files = None;
        let (tree, warnings, entries) = match capture {
            Some(capture) => {
                let capture = std::mem::take(
                    &mut *capture
                        .lock()
                        .expect("the outcome's lock is never poisoned"),
                );
                let range = capture
                    .tree
                    .expect("the inline phase reads the stream to its end, tree included");
                assert_eq!(
                    outcome.report.logical_bytes,
                    range.offset + range.bytes,
                    "the stream ends with the tree"
                );
                files = Some(capture.files);
                (Some(range), capture.warnings, capture.entries)
            }
            None => (None, Vec::new(), None),
        };

        let commit_started = Instant::now();
        let mut state = outcome.state;
        let backup_id = state.backup_id_next;
        state.backup_id_next += 1;
        let previous_version = series_record.newest();
        let version = series_record.version_next;
        series_record.version_next += 1;
        series_record.versions.insert(version, backup_id);
        // Index before recipe: the index names the new segments before the catalog does.
        self.checkpoint_index(self.state.serial + 1);
        let mut write = self.catalog.write()?;
        let mut references: BTreeMap<_, _> = outcome.references.into_iter().collect();
        for (id, record) in &outcome.new_segments {
            let live_references = references.remove(id).expect("new segments are referenced");
            put_segment_record(&mut write, *id, record)?;
            let head = SegmentHead {
                fingerprint: record.fingerprint,
                state: SegmentState::Shared,
                live_references,
            };
            write.put_id(SEGMENT_HEADS, *id, &head.encode())?;
        }
        for (id, count) in references {
            let mut head = load_head(&write, id)?
                .ok_or_else(|| BackupError::corrupt(format!("segment {id}"), "head missing"))?;
            assert_eq!(
                head.state,
                SegmentState::Shared,
                "only shared segments are deduplicated against"
            );
            head.live_references += count;
            write.put_id(SEGMENT_HEADS, id, &head.encode())?;
        }
        for (id, record) in &outcome.containers {
            write.put_id(CONTAINERS, *id, &record.encode())?;
        }
        let recipe = Recipe::Live(outcome.segments);
        let recipe_parts = recipe.store(&mut write, backup_id, 0)?;
        let record = BackupRecord {
            id: backup_id,
            series: series.to_string(),
            version,
            created_unix_ns,
            source: kind,
            source_name: name,
            logical_bytes: outcome.report.logical_bytes,
            chunk_count: recipe.chunk_count(),
            recipe_parts,
            state: BackupState::Live,
            reverse_pending: self.state.options.mode == DedupMode::Revdedup,
            tree,
            added_bytes: outcome.report.new_stored_bytes,
            archival_bytes: 0,
            host: options.host,
            tags: options.tags,
            paths: selection.as_ref().map_or_else(Vec::new, |selection| {
                selection
                    .given
                    .iter()
                    .map(|path| path.display().to_string())
                    .collect()
            }),
            root: selection.map(|selection| selection.root.display().to_string()),
            excludes: options.walk.excludes.texts(),
        };
        assert_eq!(
            previous.as_ref().map(|previous| previous.version),
            previous_version,
            "the previous backup is the series' newest"
        );
        write.put_id(BACKUPS, backup_id, &encode_backup(&record))?;
        write.put_json(SERIES, series, &series_record)?;
        self.commit(write, state, &[])?;
        let commit_seconds = commit_started.elapsed().as_secs_f64();
        let newest_containers = first_container..self.state.container_id_next;
        let new_stored_bytes = outcome.report.new_stored_bytes;

        let (mut summary, mut summary_error) = (None, None);
        if let Some(entries) = &entries {
            match previous.filter(|previous| previous.source == SourceKind::Directory) {
                Some(previous) => {
                    let tree = match previous_tree {
                        Some(tree) => Ok(tree),
                        None => self.read_tree(&previous),
                    };
                    match tree {
                        Ok(tree) => {
                            summary = Some(summarize(Some((previous.version, &tree)), entries))
                        }
                        Err(error) => summary_error = Some(error.to_string()),
                    }
                }
                None => summary = Some(summarize(None, entries)),
            }
        }

        let mut reverse_deferred = None;
        let reverse = if options.defer_reverse || self.state.options.mode == DedupMode::Conventional
        {
            Vec::new()
        } else {
            match self.reverse_pending_backups(series) {
                Ok(reports) => reports,
                Err(error @ BackupError::Full { .. }) => {
                    reverse_deferred = Some(error.to_string());
                    Vec::new()
                }
                Err(error) => return Err(error),
            }
        };
        let expire = match series_record.options.retention {
            Some(keep) => self.expire(series, Some(keep), options.delete_method)?,
            None => Vec::new(),
        };
        let (recompression, recompression_error) =
            match self.recompress_aged(newest_containers, new_stored_bytes) {
                Ok(report) => (report, None),
                Err(error) => {
                    // The backup is committed: what the recompression wrote goes, and the next
                    // backup takes the range up again.
                    self.recover_again()?;
                    self.restore_reserve();
                    (None, Some(error.to_string()))
                }
            };
        Ok(CreateReport {
            series: series.to_string(),
            version,
            created_unix_ns,
            source: kind,
            recovery,
            walk_seconds,
            inline: outcome.report,
            commit_seconds,
            warnings,
            summary,
            summary_error,
            files,
            files_cache_error,
            reverse,
            reverse_deferred,
            expire,
            recompression,
            recompression_error,
            seconds: started.elapsed().as_secs_f64(),
        })
    }
}
