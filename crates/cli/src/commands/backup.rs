//! `onecopy backup ...`: the backup store (RevDedup, paper 2).
//!
//! Every subcommand takes the backup face's exclusive lock (read-only ones too: the catalog
//! is not safe to open from two processes while one writes), so a second command fails at
//! once with a message naming the holder.

use std::io::IsTerminal;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use onecopy_backup::create::describe_file_type;
use onecopy_backup::tree::capture::WalkOptions;
use onecopy_backup::tree::compare::{changes, ChangeKind, EntryType, TreeChange};
use onecopy_backup::tree::exclude::Excludes;
use onecopy_backup::tree::select::is_beneath;
use onecopy_backup::tree::{EntryKind, Tree};
use onecopy_backup::{
    BackupRecord, BackupSource, BackupState, BackupStore, CheckOptions, CreateOptions, DedupMode,
    DeleteMethod, OpenOptions, RestoreOptions, RestoreTarget, RetentionPolicy, RuntimeOptions,
    SeriesOptions, SourceKind, StoreOptions, WalkedPaths,
};
use onecopy_core::repository::LockWait;
use std::sync::Arc;

use onecopy_core::catalog::CompactTrigger;

use crate::backup_face::{self, Access, BackupFace, Published};
use onecopy_core::units::{format_rate, format_size, parse_size};
use serde::Serialize;

use crate::output::{byte_progress, print_json};

mod mount;
mod print;
use crate::Cli;
use print::{
    dedup_mode_name, format_time, print_create, print_delete, print_delete_plan, print_expire_plan,
    print_face_report,
};

#[derive(Args, Debug)]
pub struct BackupArgs {
    #[command(flatten)]
    pub repository: crate::RepositoryArgs,
    #[command(flatten)]
    pub password: crate::keys::PasswordArgs,
    #[command(subcommand)]
    pub command: BackupCommand,
}

/// Options fixed when the backup store is first used (later uses must agree or omit them).
#[derive(Args, Debug, Default)]
pub struct StoreArgs {
    /// Deduplication: revdedup (segments inline, chunks in reverse) or conventional
    /// (chunks inline, the paper's baseline).
    #[arg(long, value_name = "MODE")]
    pub mode: Option<DedupMode>,
    /// Average segment size [default: 4MiB].
    #[arg(long, value_name = "SIZE")]
    pub segment_size: Option<String>,
    /// Average chunk size [default: 4KiB].
    #[arg(long, value_name = "SIZE")]
    pub chunk_size: Option<String>,
    /// Rolling hash of the chunker: gear (fast) or rabin (paper 2's) [default: gear].
    #[arg(long, value_name = "HASH")]
    pub rolling_hash: Option<String>,
    /// Container size [default: 32MiB].
    #[arg(long, value_name = "SIZE")]
    pub container_size: Option<String>,
    /// zstd level of stored chunks (1 to 19), or `none` [default: 1, on frames of up to 256 KiB].
    #[arg(long, value_name = "LEVEL|none")]
    pub compression: Option<String>,
    /// zstd level at which each backup compresses again the frames earlier backups wrote
    /// (above --compression, up to 19), or `none` [default: 7].
    #[arg(long, value_name = "LEVEL|none")]
    pub recompression: Option<String>,
    /// Default deletion method: timestamp or mark-and-sweep [default: timestamp for revdedup,
    /// mark-and-sweep for conventional].
    #[arg(long, value_name = "METHOD")]
    pub delete_method: Option<DeleteMethod>,
}

// One value per process, parsed from the command line: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum BackupCommand {
    /// Back up PATH (a directory, a file or disk image, or `-` for standard input) as the
    /// next version of SERIES. Several paths make one directory backup rooted at their
    /// deepest common directory, each path kept at its place beneath it.
    Create {
        /// The series the backup joins (created with its first backup): one name per thing
        /// backed up, for example the host or the disk.
        series: String,
        /// What to back up: directories, or one file or disk image, or `-` for standard
        /// input.
        #[arg(required = true, value_name = "PATH")]
        paths: Vec<PathBuf>,
        /// Leave out names whose absolute path matches GLOB (`*`, `?`, `[a-z]`, `**`; a
        /// pattern without a leading `/` matches a path's last components). Repeatable.
        #[arg(long = "exclude", value_name = "GLOB")]
        excludes: Vec<String>,
        /// Read exclude patterns from FILE, one a line (`#` starts a comment). Repeatable.
        #[arg(long = "exclude-file", value_name = "FILE")]
        exclude_files: Vec<PathBuf>,
        /// Do not enter directories on another file system than their parent (mount points
        /// are recorded empty); the given paths are backed up wherever they are.
        #[arg(long)]
        one_file_system: bool,
        /// Label the backup (repeatable, or comma-separated); shown by `backup list`.
        #[arg(long = "tag", value_name = "TAG")]
        tags: Vec<String>,
        /// The machine the backup is of [default: this machine's host name].
        #[arg(long, value_name = "NAME")]
        host: Option<String>,
        /// Leave reverse deduplication to `onecopy backup reverse`.
        #[arg(long)]
        defer_reverse: bool,
        /// Read every file, also those unchanged since the series' previous backup (same
        /// path, size, mtime, ctime, inode and device), which are otherwise not read.
        #[arg(long)]
        force: bool,
        /// Newest backups of the series kept segment-deduplicated (kept for the series).
        #[arg(long, value_name = "N")]
        live_window: Option<u32>,
        /// Backups of the series to keep; older ones are deleted after each backup (kept for
        /// the series).
        #[arg(long, value_name = "N")]
        keep: Option<u32>,
        #[command(flatten)]
        store: StoreArgs,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List backups with their time, logical size and stored size.
    List {
        /// Only the backups of this series [default: every series].
        series: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Restore SERIES[@VERSION] (the newest without a version): a directory backup into the
    /// directory TARGET (new or empty) or to standard output (`-`) as a pax tar archive, an
    /// image or stream into the new file TARGET or to standard output.
    Restore {
        /// The backup: SERIES@VERSION, or SERIES for its newest version.
        backup: String,
        /// Where to restore: a new or empty directory, a new file, or `-` for standard output.
        target: PathBuf,
        /// Restore only PATH of a directory backup, with what it holds (relative to the
        /// backup's root, or absolute as it was backed up; see `backup ls`). Repeatable.
        #[arg(long = "include", value_name = "PATH", num_args = 1..)]
        includes: Vec<String>,
        /// Replace what TARGET holds: the entries of a directory that the backup has (the
        /// others stay), or an existing file's contents.
        #[arg(long)]
        overwrite: bool,
        /// Write the backup's stream to the file TARGET even for a directory backup.
        #[arg(long)]
        to_file: bool,
        /// Threads reading containers [default: the number of cores].
        #[arg(long, value_name = "N")]
        threads: Option<usize>,
        /// Do not ask the kernel to read containers ahead.
        #[arg(long)]
        no_prefetch: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Delete the backup SERIES@VERSION.
    Delete {
        /// The backup: SERIES@VERSION.
        backup: String,
        /// timestamp or mark-and-sweep [default: the store's].
        #[arg(long, value_name = "METHOD")]
        method: Option<DeleteMethod>,
        /// Show what would be deleted and reclaimed without changing anything.
        #[arg(long)]
        dry_run: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List the entries of a directory backup SERIES[@VERSION] (the newest without a
    /// version) at and beneath PATH (the whole tree without one).
    Ls {
        /// The backup: SERIES@VERSION, or SERIES for its newest version.
        backup: String,
        /// A path in the backup, relative to its root or absolute as it was backed up.
        path: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List what was added (+), removed (-), modified (M) or changed only in its metadata
    /// (U) from the directory backup SERIES@A to SERIES@B.
    Diff {
        /// The older backup, SERIES@VERSION.
        from: String,
        /// The newer backup, SERIES@VERSION.
        to: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Delete the backups of SERIES that no --keep rule keeps. Calendar rules keep the
    /// newest backup of each of the N newest hours, days, ISO weeks, months or years (UTC)
    /// that have one; without rules, the series' retention window (`create --keep`) applies.
    Expire {
        /// The series whose oldest backups are deleted.
        series: String,
        /// Keep the newest N backups.
        #[arg(long, visible_alias = "keep", value_name = "N")]
        keep_last: Option<u32>,
        /// Keep the newest backup of each of the N newest hours that have one.
        #[arg(long, value_name = "N")]
        keep_hourly: Option<u32>,
        /// Keep the newest backup of each of the N newest days that have one.
        #[arg(long, value_name = "N")]
        keep_daily: Option<u32>,
        /// Keep the newest backup of each of the N newest ISO weeks that have one.
        #[arg(long, value_name = "N")]
        keep_weekly: Option<u32>,
        /// Keep the newest backup of each of the N newest months that have one.
        #[arg(long, value_name = "N")]
        keep_monthly: Option<u32>,
        /// Keep the newest backup of each of the N newest years that have one.
        #[arg(long, value_name = "N")]
        keep_yearly: Option<u32>,
        /// timestamp or mark-and-sweep [default: the store's].
        #[arg(long, value_name = "METHOD")]
        method: Option<DeleteMethod>,
        /// Show which versions would be deleted without changing anything.
        #[arg(long)]
        dry_run: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Run the reverse deduplication deferred by `create --defer-reverse` (all series, one
    /// series, or one backup SERIES@VERSION).
    Reverse {
        /// SERIES or SERIES@VERSION [default: every series].
        backup: Option<String>,
        /// Show the plan of the next reverse deduplication without changing anything.
        #[arg(long)]
        dry_run: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Mount SERIES read-only at MOUNTPOINT: one directory per version (`1`, `2`, ...) and
    /// `latest`; an image or stream backup is one file named after the series. The backup
    /// store stays locked while mounted; unmount with `onecopy umount MOUNTPOINT`.
    Mount {
        /// The series to show.
        series: String,
        /// The directory to mount it on.
        mount_point: PathBuf,
        /// Serve in this process until unmounted (otherwise return once the mount is ready
        /// and serve in the background, logging to `<repository>/backup/mount.log`).
        #[arg(long)]
        foreground: bool,
        /// Set by the background mount for its serving process: report readiness on stdout.
        #[arg(long, hide = true)]
        report_ready: bool,
    },
    /// Sizes, counts and settings of the backup store.
    Stats {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Check the backup store: records, reference counts, containers, the segment index.
    /// Exit status 0 when clean, 1 when something needs `--repair`, 3 when data is lost.
    Check {
        /// Also read every stored chunk: record headers, checksums and fingerprints.
        #[arg(long)]
        read_data: bool,
        /// Rebuild derived data, remove leftovers, rewrite damaged containers (taking damaged
        /// chunks from intact copies where the store has one) and record what is lost.
        #[arg(long)]
        repair: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Give back the space of removed chunks that deletions left in containers still in use
    /// (rewrites those containers without them).
    Compact {
        /// Show what would be rewritten and freed without changing anything.
        #[arg(long)]
        dry_run: bool,
        /// Print JSON instead of text.
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// An open store and the face that holds it.
struct Opened {
    store: BackupStore,
    face: BackupFace,
}

impl Opened {
    /// Closes the store and ends the command's use of the face: on object storage, a command
    /// that changed the store publishes it here, so it reports its work only after this.
    fn finish(self) -> anyhow::Result<Option<Published>> {
        let Opened { store, face } = self;
        drop(store);
        face.finish()
    }
}

/// The backup store's part of `onecopy check`, as a face report: opening is part of the
/// check, so damage that stops the store from opening is a finding, not an error.
pub fn check_face(
    cli: &Cli,
    options: onecopy_core::check::CheckOptions,
) -> anyhow::Result<onecopy_core::check::FaceReport> {
    let command = if options.repair {
        "onecopy check --repair"
    } else {
        "onecopy check"
    };
    let access = if options.repair {
        Access::Write
    } else {
        Access::Read
    };
    let face = backup_face::open_for_check(cli, command, access)?;
    // On object storage the segment index is a cache of this machine, made by the first
    // command that changes the store from here: a client that only read has none, and that
    // is no finding.
    let index_absent = face.is_remote() && face.storage.list("meta")?.is_empty();
    let mut report = BackupStore::check_at(Arc::clone(&face.storage), options)?;
    if index_absent && !options.repair {
        report
            .findings
            .retain(|finding| !finding.object.starts_with("segment index"));
    }
    if let Some(sealed) = &face.sealed {
        report
            .findings
            .extend(crate::keys::verify_sealed(sealed, options)?);
    }
    if let Some(published) = face.finish()? {
        eprintln!("onecopy: {}", published.describe());
    }
    Ok(report)
}

/// Compacts the catalog after a command that changed many records, when that pays
/// ([`BackupStore::compact_catalog`]). The command's work is committed already, so a failure
/// is a warning: the catalog stays as it was, only larger.
fn settle_catalog(opened: &mut Opened, trigger: CompactTrigger) {
    if let Err(error) = opened.store.compact_catalog(trigger) {
        eprintln!("onecopy: warning: the catalog was not compacted: {error}");
    }
}

fn open(
    cli: &Cli,
    command: &str,
    store: Option<StoreOptions>,
    runtime: RuntimeOptions,
) -> anyhow::Result<Opened> {
    open_with(cli, command, store, runtime, false)
}

/// Opens the store for a command that only reads it (no disk flushes at open or close).
fn open_read_only(cli: &Cli, command: &str, runtime: RuntimeOptions) -> anyhow::Result<Opened> {
    open_with(cli, command, None, runtime, true)
}

fn open_with(
    cli: &Cli,
    command: &str,
    store: Option<StoreOptions>,
    runtime: RuntimeOptions,
    read_only: bool,
) -> anyhow::Result<Opened> {
    let access = match (read_only, command) {
        (true, _) => Access::Read,
        // A backup's leftovers wait for the next changing command; the commands whose point
        // is the space free it before they return.
        (false, "create") => Access::Add,
        (false, _) => Access::Write,
    };
    let face = backup_face::open(
        cli,
        &format!("onecopy backup {command}"),
        access,
        crate::keys::FirstKey::Create,
    )?;
    // A face never used has no catalog yet: a first read creates the empty store.
    let read_only = read_only && face.storage.exists("catalog.redb")?;
    let mut store = BackupStore::open(
        Arc::clone(&face.storage),
        OpenOptions {
            store,
            runtime,
            read_only,
        },
    )?;
    for notice in store.take_notices() {
        eprintln!("onecopy: backup: {notice}");
    }
    Ok(Opened { store, face })
}

impl StoreArgs {
    fn options(&self) -> anyhow::Result<Option<StoreOptions>> {
        let given = self.mode.is_some()
            || self.segment_size.is_some()
            || self.chunk_size.is_some()
            || self.rolling_hash.is_some()
            || self.container_size.is_some()
            || self.compression.is_some()
            || self.recompression.is_some()
            || self.delete_method.is_some();
        if !given {
            return Ok(None);
        }
        let mut options = StoreOptions::for_mode(self.mode.unwrap_or_default());
        if let Some(size) = &self.segment_size {
            options.segment_bytes = parse_size(size)? as usize;
        }
        if let Some(size) = &self.chunk_size {
            options.chunk_bytes = parse_size(size)? as usize;
        }
        if let Some(hash) = &self.rolling_hash {
            options.rolling_hash = hash.parse()?;
        }
        if let Some(size) = &self.container_size {
            options.container_bytes = parse_size(size)?;
        }
        if let Some(level) = &self.compression {
            options.compression_level = parse_level(level, "compression")?;
        }
        match &self.recompression {
            Some(level) => options.recompression_level = parse_level(level, "recompression")?,
            // A write path at the default recompression level or above has nothing to gain.
            None if options.compression_level >= options.recompression_level => {
                options.recompression_level = None;
            }
            None => {}
        }
        if let Some(method) = self.delete_method {
            options.delete_method = method;
        }
        Ok(Some(options))
    }
}

/// Splits `SERIES@VERSION`; the version is optional unless `required`.
fn parse_backup(text: &str, required: bool) -> anyhow::Result<(String, Option<u32>)> {
    match text.rsplit_once('@') {
        Some((series, version)) => {
            let version = version
                .parse()
                .with_context(|| format!("{text:?}: the version after '@' must be a number"))?;
            Ok((series.to_string(), Some(version)))
        }
        None if required => bail!("{text:?}: give the backup as SERIES@VERSION"),
        None => Ok((text.to_string(), None)),
    }
}

pub fn run(cli: &Cli, args: &BackupArgs) -> anyhow::Result<()> {
    match &args.command {
        BackupCommand::Create {
            series,
            paths,
            excludes,
            exclude_files,
            one_file_system,
            tags,
            host,
            defer_reverse,
            force,
            live_window,
            keep,
            store,
            json,
        } => {
            let mut walk = WalkOptions {
                excludes: Excludes::new(excludes)?,
                one_file_system: *one_file_system,
            };
            for file in exclude_files {
                walk.excludes.add_file(file)?;
            }
            let labels = Labels {
                tags: tags
                    .iter()
                    .flat_map(|tag| tag.split(','))
                    .map(str::to_string)
                    .collect(),
                host: match host {
                    Some(host) => host.clone(),
                    None => machine_host_name()?,
                },
            };
            create(
                cli,
                series,
                paths,
                walk,
                labels,
                *defer_reverse,
                *force,
                *live_window,
                *keep,
                store,
                *json,
            )
        }
        BackupCommand::Mount {
            series,
            mount_point,
            foreground,
            report_ready,
        } => mount::run(cli, series, mount_point, *foreground, *report_ready),
        BackupCommand::Ls { backup, path, json } => {
            let opened = open_read_only(cli, "ls", RuntimeOptions::default())?;
            list_files(&opened.store, backup, path.as_deref(), *json)
        }
        BackupCommand::Diff { from, to, json } => {
            let opened = open_read_only(cli, "diff", RuntimeOptions::default())?;
            diff(&opened.store, from, to, *json)
        }
        BackupCommand::List { series, json } => {
            let opened = open_read_only(cli, "list", RuntimeOptions::default())?;
            list(&opened.store, series.as_deref(), *json)
        }
        BackupCommand::Restore {
            backup,
            target,
            includes,
            overwrite,
            to_file,
            threads,
            no_prefetch,
            json,
        } => {
            let mut runtime = RuntimeOptions::default();
            if let Some(threads) = threads {
                runtime.read_threads = (*threads).max(1);
            }
            runtime.prefetch = !no_prefetch;
            onecopy_core::memory::keep_freed_buffers();
            let opened = open_read_only(cli, "restore", runtime)?;
            restore(
                &opened.store,
                backup,
                target,
                includes,
                *to_file,
                *overwrite,
                *json,
            )
        }
        BackupCommand::Delete {
            backup,
            method,
            dry_run,
            json,
        } => {
            let (series, version) = parse_backup(backup, true)?;
            let version = version.expect("required");
            let mut opened = open(cli, "delete", None, RuntimeOptions::default())?;
            if *dry_run {
                let plan = opened.store.plan_delete(&series, version)?;
                return if *json {
                    print_json(&plan)
                } else {
                    print_delete_plan(&plan)
                };
            }
            let report = opened.store.delete(&series, version, *method)?;
            settle_catalog(&mut opened, CompactTrigger::AfterRemovals);
            opened.finish()?;
            if *json {
                print_json(&report)
            } else {
                print_delete(&report);
                Ok(())
            }
        }
        BackupCommand::Expire {
            series,
            keep_last,
            keep_hourly,
            keep_daily,
            keep_weekly,
            keep_monthly,
            keep_yearly,
            method,
            dry_run,
            json,
        } => {
            let mut opened = open(cli, "expire", None, RuntimeOptions::default())?;
            let rules = [
                keep_last,
                keep_hourly,
                keep_daily,
                keep_weekly,
                keep_monthly,
                keep_yearly,
            ];
            let plan = if rules.iter().all(|rule| rule.is_none()) {
                opened.store.plan_expire(series, None)?
            } else {
                let policy = RetentionPolicy {
                    keep_last: keep_last.unwrap_or(0),
                    keep_hourly: keep_hourly.unwrap_or(0),
                    keep_daily: keep_daily.unwrap_or(0),
                    keep_weekly: keep_weekly.unwrap_or(0),
                    keep_monthly: keep_monthly.unwrap_or(0),
                    keep_yearly: keep_yearly.unwrap_or(0),
                };
                opened.store.plan_expire_with(series, &policy)?
            };
            if *dry_run {
                return if *json {
                    print_json(&plan)
                } else {
                    print_expire_plan(&plan, true);
                    Ok(())
                };
            }
            if !*json {
                print_expire_plan(&plan, false);
            }
            let deleted = opened.store.execute_expire(plan.clone(), *method)?;
            settle_catalog(&mut opened, CompactTrigger::AfterRemovals);
            opened.finish()?;
            if *json {
                return print_json(&ExpireOutcome { plan, deleted });
            }
            deleted.iter().for_each(print_delete);
            Ok(())
        }
        BackupCommand::Reverse {
            backup,
            dry_run,
            json,
        } => {
            let mut opened = open(cli, "reverse", None, RuntimeOptions::default())?;
            reverse(&mut opened.store, backup.as_deref(), *dry_run, *json)?;
            opened.finish()?;
            Ok(())
        }
        BackupCommand::Stats { json } => {
            let opened = open_read_only(cli, "stats", RuntimeOptions::default())?;
            let stats = opened.store.stats()?;
            if *json {
                return print_json(&stats);
            }
            let options = &stats.options;
            let level = |level: Option<i32>| level.map_or("off".to_string(), |l| l.to_string());
            println!(
                "mode              {}, segments {}, chunks {} ({} hash), containers {}, zstd {} \
                 (recompressed at {})",
                dedup_mode_name(options.mode),
                format_size(options.segment_bytes as u64),
                format_size(options.chunk_bytes as u64),
                options.rolling_hash.name(),
                format_size(options.container_bytes),
                level(options.compression_level),
                level(options.recompression_level),
            );
            println!("series            {}", stats.series);
            println!(
                "backups           {} ({} live, {} archival)",
                stats.backups, stats.live_backups, stats.archival_backups
            );
            println!("logical           {}", format_size(stats.logical_bytes));
            println!(
                "containers        {} shared ({}), {} archival ({})",
                stats.containers_shared,
                format_size(stats.container_bytes_shared),
                stats.containers_archival,
                format_size(stats.container_bytes_archival)
            );
            println!(
                "segments          {} shared, {} archival; index {} entries",
                stats.segments_shared, stats.segments_archival, stats.index_entries
            );
            println!(
                "unreferenced      {} (container format and garbage; `backup compact` frees {})",
                format_size(stats.garbage_bytes),
                format_size(stats.compactable_bytes)
            );
            println!("space saving      {:.1}%", stats.space_saving * 100.0);
            Ok(())
        }
        BackupCommand::Check {
            read_data,
            repair,
            json,
        } => {
            let report = check_face(
                cli,
                CheckOptions {
                    repair: *repair,
                    read_data: *read_data,
                },
            )?;
            if *json {
                print_json(&report)?;
            } else {
                print_face_report(&report);
            }
            let code = report.status().code();
            if code != 0 {
                std::process::exit(code.into());
            }
            Ok(())
        }
        BackupCommand::Compact { dry_run, json } => {
            let mut opened = open(cli, "compact", None, RuntimeOptions::default())?;
            let plan = opened.store.plan_compact()?;
            if *dry_run {
                return if *json {
                    print_json(&plan)
                } else {
                    println!(
                        "would rewrite {} containers, writing {} and freeing {}",
                        plan.containers.len(),
                        format_size(plan.rewrite_bytes),
                        format_size(plan.reclaimable_bytes)
                    );
                    Ok(())
                };
            }
            let report = opened.store.compact(plan)?;
            settle_catalog(&mut opened, CompactTrigger::AfterRemovals);
            opened.finish()?;
            if *json {
                return print_json(&report);
            }
            println!(
                "compacted in {:.2} s: {} containers rewritten, {} removed, {} freed",
                report.seconds,
                report.containers_rewritten,
                report.containers_removed,
                format_size(report.reclaimed_bytes)
            );
            Ok(())
        }
    }
}

/// What `backup create` records about the backup besides its contents.
struct Labels {
    tags: Vec<String>,
    host: String,
}

/// This machine's host name (`gethostname`).
fn machine_host_name() -> anyhow::Result<String> {
    let mut buffer = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at most that much.
    let result = unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len()) };
    if result != 0 {
        return Err(std::io::Error::last_os_error())
            .context("reading this machine's host name (give --host NAME)");
    }
    let length = buffer
        .iter()
        .position(|&byte| byte == 0)
        .unwrap_or(buffer.len());
    Ok(String::from_utf8_lossy(&buffer[..length]).into_owned())
}

/// What `backup create` backs up, while the store opens.
enum Source {
    Ready(BackupSource),
    /// A tree being walked.
    Walking(std::thread::JoinHandle<onecopy_backup::Result<WalkedPaths>>),
}

/// Walks `paths` on a thread of its own.
fn walk_in_background(
    paths: Vec<PathBuf>,
    options: &WalkOptions,
) -> std::thread::JoinHandle<onecopy_backup::Result<WalkedPaths>> {
    let options = options.clone();
    std::thread::spawn(move || WalkedPaths::walk(&paths, &options))
}

#[allow(clippy::too_many_arguments)]
fn create(
    cli: &Cli,
    series: &str,
    paths: &[PathBuf],
    walk: WalkOptions,
    labels: Labels,
    defer_reverse: bool,
    force: bool,
    live_window: Option<u32>,
    keep: Option<u32>,
    store_args: &StoreArgs,
    json: bool,
) -> anyhow::Result<()> {
    // What PATH is, decided before the lock is taken: a FIFO or socket is refused at once
    // rather than blocking on its open with the lock held.
    let path = paths[0].as_path();
    let (source, total_bytes) = if paths.len() > 1 {
        if paths.iter().any(|path| path == Path::new("-")) {
            bail!("standard input (-) is backed up alone: give it as the only PATH");
        }
        (BackupSource::Paths(paths.to_vec()), 0)
    } else if path == Path::new("-") {
        let reader = Box::new(std::io::stdin());
        (
            BackupSource::Reader {
                reader,
                name: "-".to_string(),
            },
            0,
        )
    } else {
        let metadata =
            std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
        let file_type = metadata.file_type();
        if metadata.is_dir() {
            (BackupSource::Directory(path.to_path_buf()), 0)
        } else if metadata.is_file() || file_type.is_block_device() {
            (BackupSource::File(path.to_path_buf()), metadata.len())
        } else {
            bail!(
                "{} is {}: back up a directory, a regular file or disk image, or a block \
                 device; to back up what a program writes, pipe it to `onecopy backup create \
                 {series} -`",
                path.display(),
                describe_file_type(&file_type)
            );
        }
    };
    // A tree is walked while the store opens (the key's derivation keeps the cores busy and
    // the walk waits on the file system), unless the open may wait for another process:
    // then the walk would describe the tree as it was before the wait.
    let walk_early = matches!(cli.lock_wait()?, LockWait::No);
    let source = match source {
        BackupSource::Paths(paths) if walk_early => {
            Source::Walking(walk_in_background(paths, &walk))
        }
        BackupSource::Directory(path) if walk_early => {
            Source::Walking(walk_in_background(vec![path], &walk))
        }
        source => Source::Ready(source),
    };
    let mut opened = open(
        cli,
        "create",
        store_args.options()?,
        RuntimeOptions::default(),
    )?;
    let source = match source {
        Source::Ready(source) => source,
        Source::Walking(walking) => {
            BackupSource::Walked(walking.join().expect("the walk does not panic")?)
        }
    };
    let series_options = if live_window.is_some() || keep.is_some() {
        let current = opened
            .store
            .series()?
            .into_iter()
            .find(|record| record.name == series);
        let mut options = current.map_or_else(SeriesOptions::default, |record| record.options);
        if let Some(window) = live_window {
            options.live_window = window;
        }
        if keep.is_some() {
            options.retention = keep;
        }
        Some(options)
    } else {
        None
    };
    let bar = byte_progress(total_bytes, &format!("backup {series}"));
    if !std::io::stderr().is_terminal() {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let progress = |bytes: u64| bar.set_position(bytes);
    let report = opened.store.create_backup(
        series,
        source,
        CreateOptions {
            series_options,
            defer_reverse,
            delete_method: None,
            progress: Some(&progress),
            read_observer: None,
            walk,
            tags: labels.tags,
            host: Some(labels.host),
            force,
        },
    )?;
    bar.finish_and_clear();
    settle_catalog(&mut opened, CompactTrigger::AfterGrowth);
    let published = opened.finish()?;
    if json {
        let mut value = serde_json::to_value(&report)?;
        if let (Some(published), Some(object)) = (published, value.as_object_mut()) {
            object.insert("object_storage".into(), serde_json::to_value(published)?);
        }
        return print_json(&value);
    }
    print_create(&report);
    if let Some(published) = published {
        println!("  {}", published.describe());
    }
    Ok(())
}

/// One line of `backup list --json`.
#[derive(Serialize)]
struct ListedBackup<'a> {
    series: &'a str,
    version: u32,
    created: String,
    created_unix_ns: u64,
    source: SourceKind,
    source_name: &'a str,
    state: BackupState,
    reverse_pending: bool,
    logical_bytes: u64,
    /// Bytes added at creation (live) or kept in its archival containers (archival).
    stored_bytes: u64,
    host: Option<&'a str>,
    tags: &'a [String],
    paths: &'a [String],
}

fn listed(backup: &BackupRecord) -> ListedBackup<'_> {
    ListedBackup {
        series: &backup.series,
        version: backup.version,
        created: format_time(backup.created_unix_ns),
        created_unix_ns: backup.created_unix_ns,
        source: backup.source,
        source_name: &backup.source_name,
        state: backup.state,
        reverse_pending: backup.reverse_pending,
        logical_bytes: backup.logical_bytes,
        stored_bytes: match backup.state {
            BackupState::Live => backup.added_bytes,
            BackupState::Archival => backup.archival_bytes,
        },
        host: backup.host.as_deref(),
        tags: &backup.tags,
        paths: &backup.paths,
    }
}

fn list(store: &BackupStore, series: Option<&str>, json: bool) -> anyhow::Result<()> {
    let backups = store.list(series)?;
    let rows: Vec<ListedBackup> = backups.iter().map(listed).collect();
    if json {
        return print_json(&rows);
    }
    if rows.is_empty() {
        println!("no backups; create one with `onecopy backup create SERIES PATH`");
        return Ok(());
    }
    println!(
        "{:<20} {:>7}  {:<19}  {:<9} {:>11} {:>11}  {:<16} {:<16} SOURCE",
        "SERIES", "VERSION", "CREATED (UTC)", "STATE", "LOGICAL", "STORED", "HOST", "TAGS"
    );
    let reverse_pending = rows.iter().any(|row| row.reverse_pending);
    for row in rows {
        let state = match (row.state, row.reverse_pending) {
            (BackupState::Live, _) => "live",
            (BackupState::Archival, false) => "archival",
            (BackupState::Archival, true) => "archival*",
        };
        let tags = if row.tags.is_empty() {
            "-".to_string()
        } else {
            row.tags.join(",")
        };
        println!(
            "{:<20} {:>7}  {:<19}  {:<9} {:>11} {:>11}  {:<16} {:<16} {}",
            row.series,
            row.version,
            row.created,
            state,
            format_size(row.logical_bytes),
            format_size(row.stored_bytes),
            row.host.unwrap_or("-"),
            tags,
            row.source_name
        );
    }
    // The stored column is not the space a backup occupies (shared data would count many
    // times): say what it is, since an unchanged backup shows 0 B.
    println!();
    println!(
        "STORED: what each backup added to the store: for a live backup, the new data it \
         stored when created;\n        for an archival one, its own archival containers. Data \
         shared by several backups counts once,\n        with the backup that stored it first: \
         a backup identical to an earlier one shows 0 B."
    );
    if reverse_pending {
        println!("archival*: reverse deduplication still to run (`onecopy backup reverse`)");
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn restore(
    store: &BackupStore,
    backup: &str,
    target: &Path,
    includes: &[String],
    to_file: bool,
    overwrite: bool,
    json: bool,
) -> anyhow::Result<()> {
    let (series, version) = parse_backup(backup, false)?;
    let record = store
        .list(Some(&series))?
        .into_iter()
        .rfind(|record| version.is_none_or(|version| record.version == version))
        .with_context(|| {
            format!("backup {backup} not found (see `onecopy backup list {series}`)")
        })?;
    let to_stdout = target == Path::new("-");
    let stdout = || {
        Box::new(std::io::BufWriter::with_capacity(
            1 << 20,
            std::io::stdout(),
        ))
    };
    let restore_target = if to_stdout && record.source == SourceKind::Directory && !to_file {
        RestoreTarget::Archive(stdout())
    } else if to_stdout {
        RestoreTarget::Writer(stdout())
    } else if record.source == SourceKind::Directory && !to_file {
        RestoreTarget::Directory(target.to_path_buf())
    } else {
        RestoreTarget::File(target.to_path_buf())
    };
    let report = store.restore_with(
        &series,
        Some(record.version),
        restore_target,
        RestoreOptions {
            overwrite,
            include: includes
                .iter()
                .map(|include| record.tree_path(include))
                .collect(),
        },
    )?;
    if json && !to_stdout {
        return print_json(&report);
    }
    let mut message = format!(
        "restored {}@{} ({}) in {:.2} s ({}), {} indirect references",
        series,
        report.version,
        format_size(report.logical_bytes),
        report.seconds,
        format_rate(report.logical_bytes as f64 / report.seconds.max(1e-9)),
        report.resolve.indirect_references
    );
    if let Some(tree) = report.tree.filter(|tree| tree.replaced > 0) {
        message.push_str(&format!(
            ", replaced {} entries of the target",
            tree.replaced
        ));
    }
    if to_stdout {
        if json {
            eprintln!("{}", serde_json::to_string(&report)?);
        } else {
            eprintln!("{message}");
        }
    } else {
        println!("{message}");
    }
    Ok(())
}

/// What `backup expire --json` prints: the plan and the deletions that carried it out.
#[derive(Serialize)]
struct ExpireOutcome {
    plan: onecopy_backup::ExpirePlan,
    deleted: Vec<onecopy_backup::DeleteReport>,
}

/// One entry of `backup ls --json`.
#[derive(Serialize)]
struct ListedEntry {
    /// Relative to the backup's root (`.` for the root).
    path: String,
    entry_type: EntryType,
    /// Permission bits with set-user-id, set-group-id and sticky.
    mode: u32,
    uid: u32,
    gid: u32,
    /// Bytes of a regular file (of the linked file for a hard link), else 0.
    size: u64,
    mtime: String,
    mtime_unix_ns: i128,
    #[serde(skip_serializing_if = "Option::is_none")]
    link_target: Option<String>,
    /// The path a hard link shares its file with.
    #[serde(skip_serializing_if = "Option::is_none")]
    hard_link_to: Option<String>,
}

/// `ls -l`'s mode column: the type letter and the permission bits.
fn mode_string(entry_type: EntryType, mode: u32) -> String {
    let kind = match entry_type {
        EntryType::Directory => 'd',
        EntryType::File | EntryType::HardLink => '-',
        EntryType::Symlink => 'l',
        EntryType::Fifo => 'p',
        EntryType::CharDevice => 'c',
        EntryType::BlockDevice => 'b',
    };
    let mut text = String::from(kind);
    for (shift, special, special_letter) in [(6, 0o4000, 's'), (3, 0o2000, 's'), (0, 0o1000, 't')] {
        let bits = (mode >> shift) & 7;
        text.push(if bits & 4 != 0 { 'r' } else { '-' });
        text.push(if bits & 2 != 0 { 'w' } else { '-' });
        let execute = bits & 1 != 0;
        text.push(match (mode & special != 0, execute) {
            (true, true) => special_letter,
            (true, false) => special_letter.to_ascii_uppercase(),
            (false, true) => 'x',
            (false, false) => '-',
        });
    }
    text
}

fn entry_path(path: &[u8]) -> String {
    if path.is_empty() {
        ".".to_string()
    } else {
        String::from_utf8_lossy(path).into_owned()
    }
}

fn listed_entries(tree: &Tree, under: &[u8]) -> Vec<ListedEntry> {
    tree.entries
        .iter()
        .filter(|entry| is_beneath(&entry.path, under))
        .filter(|entry| !(under.is_empty() && entry.path.is_empty()))
        .map(|entry| {
            let (size, link_target, hard_link_to) = match &entry.kind {
                EntryKind::File { size, .. } => (*size, None, None),
                EntryKind::HardLink { target } => {
                    let linked = &tree.entries[*target as usize];
                    let size = match linked.kind {
                        EntryKind::File { size, .. } => size,
                        _ => 0,
                    };
                    (size, None, Some(entry_path(&linked.path)))
                }
                EntryKind::Symlink { target } => {
                    (0, Some(String::from_utf8_lossy(target).into_owned()), None)
                }
                _ => (0, None, None),
            };
            let mtime_unix_ns =
                i128::from(entry.mtime.0) * 1_000_000_000 + i128::from(entry.mtime.1);
            ListedEntry {
                path: entry_path(&entry.path),
                entry_type: EntryType::of(&entry.kind),
                mode: entry.mode,
                uid: entry.uid,
                gid: entry.gid,
                size,
                mtime: format_time(mtime_unix_ns.max(0) as u64),
                mtime_unix_ns,
                link_target,
                hard_link_to,
            }
        })
        .collect()
}

fn list_files(
    store: &BackupStore,
    backup: &str,
    path: Option<&str>,
    json: bool,
) -> anyhow::Result<()> {
    let (series, version) = parse_backup(backup, false)?;
    let (record, tree) = store.tree(&series, version)?;
    let under = path.map_or_else(Vec::new, |path| record.tree_path(path));
    if !tree.entries.iter().any(|entry| entry.path == under) {
        bail!(
            "{} is not in backup {series}@{} (see `onecopy backup ls {series}@{}`)",
            path.unwrap_or("."),
            record.version,
            record.version
        );
    }
    let rows = listed_entries(&tree, &under);
    if json {
        return print_json(&rows);
    }
    for row in rows {
        let mut name = row.path;
        if let Some(target) = &row.link_target {
            name.push_str(" -> ");
            name.push_str(target);
        }
        if let Some(file) = &row.hard_link_to {
            name.push_str(" link to ");
            name.push_str(file);
        }
        println!(
            "{} {:>6} {:>6} {:>12}  {}  {}",
            mode_string(row.entry_type, row.mode),
            row.uid,
            row.gid,
            row.size,
            row.mtime,
            name
        );
    }
    Ok(())
}

/// What `backup diff --json` prints.
#[derive(Serialize)]
struct DiffReport {
    from: String,
    to: String,
    changes: Vec<TreeChange>,
    added: u64,
    removed: u64,
    modified: u64,
    metadata: u64,
    /// File bytes of the added files, of the removed ones, and the size change of the
    /// modified ones (newer minus older).
    added_bytes: u64,
    removed_bytes: u64,
    modified_bytes_delta: i64,
}

fn diff(store: &BackupStore, from: &str, to: &str, json: bool) -> anyhow::Result<()> {
    let (from_series, from_version) = parse_backup(from, true)?;
    let (to_series, to_version) = parse_backup(to, true)?;
    let (from_record, old) = store.tree(&from_series, from_version)?;
    let (to_record, new) = store.tree(&to_series, to_version)?;
    let found = changes(&old, &new);
    let count =
        |kind: ChangeKind| found.iter().filter(|change| change.change == kind).count() as u64;
    let mut report = DiffReport {
        from: format!("{}@{}", from_record.series, from_record.version),
        to: format!("{}@{}", to_record.series, to_record.version),
        added: count(ChangeKind::Added),
        removed: count(ChangeKind::Removed),
        modified: count(ChangeKind::Modified),
        metadata: count(ChangeKind::Metadata),
        added_bytes: 0,
        removed_bytes: 0,
        modified_bytes_delta: 0,
        changes: Vec::new(),
    };
    for change in &found {
        match change.change {
            ChangeKind::Added => report.added_bytes += change.new_size.unwrap_or(0),
            ChangeKind::Removed => report.removed_bytes += change.old_size.unwrap_or(0),
            ChangeKind::Modified => {
                report.modified_bytes_delta +=
                    change.new_size.unwrap_or(0) as i64 - change.old_size.unwrap_or(0) as i64
            }
            ChangeKind::Metadata => {}
        }
    }
    report.changes = found;
    if json {
        return print_json(&report);
    }
    for change in &report.changes {
        let sizes = match (change.change, change.old_size, change.new_size) {
            (ChangeKind::Modified, Some(old), Some(new)) if old != new => {
                format!("  ({} -> {})", format_size(old), format_size(new))
            }
            (_, _, Some(size)) | (_, Some(size), None) => format!("  ({})", format_size(size)),
            _ => String::new(),
        };
        let slash = if change.entry_type == EntryType::Directory {
            "/"
        } else {
            ""
        };
        println!("{}    {}{slash}{sizes}", change.change.mark(), change.path);
    }
    println!(
        "{} -> {}: {} added ({}), {} removed ({}), {} modified, {} metadata only",
        report.from,
        report.to,
        report.added,
        format_size(report.added_bytes),
        report.removed,
        format_size(report.removed_bytes),
        report.modified,
        report.metadata
    );
    Ok(())
}

fn reverse(
    store: &mut BackupStore,
    backup: Option<&str>,
    dry_run: bool,
    json: bool,
) -> anyhow::Result<()> {
    let mut targets: Vec<(String, u32)> = Vec::new();
    match backup.map(|text| parse_backup(text, false)).transpose()? {
        Some((series, Some(version))) => targets.push((series, version)),
        Some((series, None)) => targets.extend(
            store
                .pending_reverse(&series)?
                .into_iter()
                .map(|version| (series.clone(), version)),
        ),
        None => {
            for record in store.series()? {
                let pending = store.pending_reverse(&record.name)?;
                targets.extend(
                    pending
                        .into_iter()
                        .map(|version| (record.name.clone(), version)),
                );
            }
        }
    }
    if dry_run {
        // Later plans depend on earlier ones having run, so only the first is exact.
        let Some((series, version)) = targets.first() else {
            println!("nothing to reverse-deduplicate");
            return Ok(());
        };
        let plan = store.plan_reverse(series, *version)?;
        if json {
            return print_json(&plan);
        }
        println!(
            "would reverse-deduplicate {}@{} against @{}: {} indirect, {} direct, {} null chunks; \
             remove {}, repackage {} archival and {} shared, drop {} containers ({} more backups pending)",
            plan.series,
            plan.version,
            plan.successor_version,
            plan.indirect_chunks,
            plan.direct_chunks,
            plan.zero_chunks,
            format_size(plan.settlement.removed_bytes),
            format_size(plan.settlement.copy_archival_bytes),
            format_size(plan.settlement.copy_shared_bytes),
            plan.settlement.dropped_containers.len(),
            targets.len() - 1
        );
        return Ok(());
    }
    let mut reports = Vec::new();
    for (series, version) in targets {
        reports.push(store.reverse(&series, version)?);
    }
    if json {
        return print_json(&reports);
    }
    if reports.is_empty() {
        println!("nothing to reverse-deduplicate");
    }
    for report in &reports {
        let plan = &report.plan;
        println!(
            "reverse-deduplicated {}@{} in {:.2} s ({}): {} indirect, {} direct chunks; removed {}, read {}, wrote {}",
            plan.series,
            plan.version,
            report.seconds,
            format_rate(plan.logical_bytes as f64 / report.seconds.max(1e-9)),
            plan.indirect_chunks,
            plan.direct_chunks,
            format_size(plan.settlement.removed_bytes),
            format_size(report.copy.read_bytes),
            format_size(report.copy.written_bytes)
        );
    }
    Ok(())
}

/// A zstd level argument of `--compression` or `--recompression` (`what`): 1 to 19, or
/// `none`.
fn parse_level(text: &str, what: &str) -> anyhow::Result<Option<i32>> {
    match text {
        "none" => Ok(None),
        text => Ok(Some(
            text.parse()
                .with_context(|| format!("{what} level {text:?}"))?,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: SERIES@VERSION parsing accepts what scripts pass and rejects the rest.
    #[test]
    fn parses_backup_names() {
        assert_eq!(
            parse_backup("home@3", true).unwrap(),
            ("home".to_string(), Some(3))
        );
        assert_eq!(
            parse_backup("home", false).unwrap(),
            ("home".to_string(), None)
        );
        assert!(parse_backup("home", true).is_err());
        assert!(parse_backup("home@x", false).is_err());
    }
}
