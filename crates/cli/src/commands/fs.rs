//! `onecopy fs ...` (create, list, delete, config, stats, ranks, dedup), `onecopy mount` and
//! `onecopy umount`: the file system face.
//!
//! Every `fs` subcommand works while a file system is mounted: the mounting process holds
//! the face, so the command is sent to it through its control socket and it answers from its
//! live state. Otherwise the command opens the face itself.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use serde_json::Value;

use onecopy_core::check::{CheckOptions, FaceReport, Finding, FindingKind};
use onecopy_core::repository::{LockWait, Repository};
use onecopy_core::units::{format_size, parse_size};
use onecopy_fs::control::{self, Request};
use onecopy_fs::mount::{self, MountOptions};
use onecopy_fs::{FsEngine, FsOptions, OpenMode, OptionChanges, RuntimeOptions, SmallChunking};

use crate::output::print_json;
use crate::Cli;

/// The face's directory name in a repository.
const FACE: &str = "fs";

#[derive(Args, Debug)]
pub struct FsArgs {
    #[command(flatten)]
    pub repository: crate::RepositoryArgs,
    #[command(subcommand)]
    pub command: FsCommand,
}

/// The ranker's and deduplicator's settings (paper 3, Table 2; the defaults are the paper's).
#[derive(Args, Debug, Clone, Default)]
pub struct RankerArgs {
    /// MIN_EVALUATION_INT: a file modified more recently stays rank 0 (SECONDS, or with a
    /// unit: 30s, 10m, 2h, 2d) [default: 2d].
    #[arg(long, value_name = "SECONDS")]
    pub min_evaluation_interval: Option<String>,
    /// MAX_HOT_INT: a file not accessed for longer is cold, rank 3 [default: 14d].
    #[arg(long, value_name = "SECONDS")]
    pub max_hot_interval: Option<String>,
    /// MIN_EVALUATION_CNT: reads a hot file needs before it is ranked 1 or 2 [default: 100].
    #[arg(long, value_name = "N")]
    pub min_evaluation_count: Option<u64>,
    /// Idle time after which ranking and deduplication run by themselves; 0: only on
    /// `onecopy fs dedup` [default: 60s].
    #[arg(long, value_name = "SECONDS")]
    pub idle: Option<String>,
    /// Chunk size of rank-1 (sequentially read) files [default: 256KiB].
    #[arg(long, value_name = "SIZE")]
    pub big_chunk: Option<String>,
    /// Chunk size of rank-2 and rank-3 files [default: 4KiB].
    #[arg(long, value_name = "SIZE")]
    pub small_chunk: Option<String>,
    /// How small chunks are cut: fixed or cdc (content-defined) [default: fixed].
    #[arg(long, value_name = "fixed|cdc")]
    pub small_chunking: Option<String>,
    /// Share of its time a deduplication run started by idleness works, 1 to 100 percent
    /// [default: 50].
    #[arg(long, value_name = "PERCENT")]
    pub dedup_share: Option<u64>,
}

/// Seconds from `30`, `30s`, `10m`, `2h` or `2d`.
fn parse_seconds(text: &str) -> anyhow::Result<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .with_context(|| format!("{text:?} is not a number of seconds"))?;
    let factor = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => bail!("{text:?}: the unit must be s, m, h or d"),
    };
    Ok(number * factor)
}

impl RankerArgs {
    fn changes(&self) -> anyhow::Result<OptionChanges> {
        let seconds = |value: &Option<String>| value.as_deref().map(parse_seconds).transpose();
        let size = |value: &Option<String>| {
            value
                .as_deref()
                .map(|text| parse_size(text).map_err(anyhow::Error::from))
                .transpose()
        };
        Ok(OptionChanges {
            min_evaluation_interval_seconds: seconds(&self.min_evaluation_interval)?,
            max_hot_interval_seconds: seconds(&self.max_hot_interval)?,
            min_evaluation_count: self.min_evaluation_count,
            idle_seconds: seconds(&self.idle)?,
            big_chunk_bytes: size(&self.big_chunk)?,
            small_chunk_bytes: size(&self.small_chunk)?,
            dedup_share_percent: self.dedup_share,
            small_chunking: match self.small_chunking.as_deref() {
                None => None,
                Some("fixed") => Some(SmallChunking::Fixed),
                Some("cdc") => Some(SmallChunking::ContentDefined),
                Some(other) => bail!("--small-chunking {other}: use fixed or cdc"),
            },
        })
    }
}

#[derive(Subcommand, Debug)]
pub enum FsCommand {
    /// Create a file system.
    Create {
        /// The file system.
        name: String,
        #[command(flatten)]
        ranker: RankerArgs,
    },
    /// List file systems (and where they are mounted).
    List {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Delete a file system and every file in it.
    Delete {
        /// The file system.
        name: String,
    },
    /// Change the ranker's and deduplicator's settings of a file system.
    Config {
        /// The file system.
        name: String,
        #[command(flatten)]
        ranker: RankerArgs,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Logical and stored bytes, bytes awaiting deduplication, files and bytes per rank.
    Stats {
        /// The file system.
        name: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Each file's rank, read counters and chunking.
    Ranks {
        /// The file system.
        name: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Rank and deduplicate now: shows the plan, then executes it.
    Dedup {
        /// The file system.
        name: String,
        /// Show the plan only.
        #[arg(long)]
        dry_run: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Reclaim the space of freed chunks (of every file system of the repository).
    Compact {
        /// Show the plan only.
        #[arg(long)]
        dry_run: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// `onecopy mount NAME MOUNTPOINT`.
#[derive(Args, Debug)]
pub struct MountArgs {
    #[command(flatten)]
    pub repository: crate::RepositoryArgs,
    /// The file system.
    pub name: String,
    /// The directory to mount it on.
    pub mount_point: PathBuf,
    /// Serve in this process until unmounted (otherwise return once the mount is ready and
    /// serve in the background).
    #[arg(long)]
    pub foreground: bool,
    /// Mount options, comma separated: allow_other, ro, keep_cache (the page cache across
    /// opens; the I/O monitor then sees cache misses only), no_monitor (reads are not
    /// counted: files never rank 1 or 2; for measuring the monitor's cost), writeback_cache
    /// (the kernel's writeback cache: small writes merged; a full disk then shows at fsync or
    /// close, not at write), threads=N. Another file system of the repository mounts into the
    /// process that serves the first.
    #[arg(short = 'o', value_name = "OPTIONS", default_value = "")]
    pub options: String,
    /// Set by the background mount for its serving process: report readiness on stdout.
    #[arg(long, hide = true)]
    pub report_ready: bool,
}

/// `onecopy umount MOUNTPOINT`.
#[derive(Args, Debug)]
pub struct UmountArgs {
    #[command(flatten)]
    pub repository: crate::RepositoryArgs,
    /// The directory the file system is mounted on.
    pub mount_point: PathBuf,
}

fn owner() -> (u32, u32) {
    // SAFETY: getuid and getgid cannot fail.
    unsafe { (libc::getuid(), libc::getgid()) }
}

/// Runs `request` here (when nobody else has the face) or in the mounting process.
fn run_request(cli: &Cli, request: &Request, command: &str) -> anyhow::Result<Value> {
    let repository = Repository::open(&cli.repository_path())?;
    let face_directory = repository.path().join(FACE);
    let lock = match repository.lock_face(FACE, command) {
        Ok(lock) => lock,
        Err(onecopy_core::Error::Locked { .. }) => {
            if let Some(value) = control::send(&face_directory, request)? {
                return Ok(value);
            }
            repository.lock_face_waiting(FACE, command, cli.lock_wait()?)?
        }
        Err(error) => return Err(error.into()),
    };
    let engine = FsEngine::open(
        repository.face_storage(FACE)?,
        RuntimeOptions::default(),
        OpenMode::ReadWrite,
    )?;
    let result = control::execute(&engine, request, &[]);
    engine.shutdown()?;
    drop(lock);
    Ok(result?)
}

pub fn run(cli: &Cli, args: &FsArgs) -> anyhow::Result<()> {
    match &args.command {
        FsCommand::Create { name, ranker } => {
            let options = ranker.changes()?.applied_to(&FsOptions::default())?;
            let (uid, gid) = owner();
            let request = Request::Create {
                name: name.clone(),
                options,
                uid,
                gid,
            };
            run_request(cli, &request, &format!("fs create {name}"))?;
            println!("created file system {name}");
        }
        FsCommand::List { json } => {
            let value = run_request(cli, &Request::List, "fs list")?;
            if *json {
                return print_json(&value);
            }
            for record in value.as_array().into_iter().flatten() {
                let mounted = match record["mount_point"].as_str() {
                    Some(path) => format!("mounted at {path}"),
                    None => "not mounted".to_string(),
                };
                println!("{}\t{mounted}", record["name"].as_str().unwrap_or("?"));
            }
        }
        FsCommand::Delete { name } => {
            let request = Request::Delete { name: name.clone() };
            run_request(cli, &request, &format!("fs delete {name}"))?;
            println!("deleted file system {name}");
        }
        FsCommand::Config { name, ranker, json } => {
            let request = Request::Config {
                name: name.clone(),
                changes: ranker.changes()?,
            };
            let value = run_request(cli, &request, &format!("fs config {name}"))?;
            if *json {
                return print_json(&value);
            }
            print_options(&value);
        }
        FsCommand::Stats { name, json } => {
            let value = run_request(cli, &Request::Stats { name: name.clone() }, "fs stats")?;
            if *json {
                return print_json(&value);
            }
            print_stats(&value);
        }
        FsCommand::Ranks { name, json } => {
            let value = run_request(cli, &Request::Ranks { name: name.clone() }, "fs ranks")?;
            if *json {
                return print_json(&value);
            }
            println!("rank\tchunking\tsequential\trandom\tbytes\tpending\tpath");
            for file in value.as_array().into_iter().flatten() {
                println!(
                    "{}\t{}\t{}\t{}\t{}\t{}\t{}",
                    file["rank"],
                    file["chunking"].as_str().unwrap_or("-"),
                    file["sequential_reads"],
                    file["random_reads"],
                    format_size(file["bytes"].as_u64().unwrap_or(0)),
                    format_size(file["pending_bytes"].as_u64().unwrap_or(0)),
                    file["path"].as_str().unwrap_or("?"),
                );
            }
        }
        FsCommand::Dedup {
            name,
            dry_run,
            json,
        } => {
            let request = Request::Dedup {
                name: name.clone(),
                dry_run: *dry_run,
            };
            let value = run_request(cli, &request, &format!("fs dedup {name}"))?;
            if *json {
                return print_json(&value);
            }
            print_dedup(&value);
        }
        FsCommand::Compact { dry_run, json } => {
            let request = Request::Compact { dry_run: *dry_run };
            let value = run_request(cli, &request, "fs compact")?;
            if *json {
                return print_json(&value);
            }
            let plan = &value["plan"];
            println!(
                "plan: {} containers, {} to copy, {} to reclaim",
                plan["containers"].as_array().map_or(0, Vec::len),
                format_size(plan["copy_bytes"].as_u64().unwrap_or(0)),
                format_size(plan["reclaim_bytes"].as_u64().unwrap_or(0))
            );
            if value["report"].is_null() {
                println!("dry run: nothing changed");
            } else {
                println!(
                    "moved {} chunks ({}), removed {} containers",
                    value["report"]["chunks_moved"],
                    format_size(value["report"]["bytes_moved"].as_u64().unwrap_or(0)),
                    value["report"]["containers_retired"]
                );
            }
        }
    }
    Ok(())
}

fn print_options(value: &Value) {
    for (key, field) in value.as_object().into_iter().flatten() {
        println!("{key}\t{field}");
    }
}

fn print_stats(value: &Value) {
    let size = |key: &str| format_size(value[key].as_u64().unwrap_or(0));
    println!("file system      {}", value["name"].as_str().unwrap_or("?"));
    println!("files            {}", value["files"]);
    println!("directories      {}", value["directories"]);
    println!("logical bytes    {}", size("logical_bytes"));
    println!("stored bytes     {}", size("stored_bytes"));
    println!("pending bytes    {}", size("pending_bytes"));
    println!(
        "dedup ratio      {:.2}",
        value["dedup_ratio"].as_f64().unwrap_or(1.0)
    );
    for (rank, figures) in value["ranks"].as_array().into_iter().flatten().enumerate() {
        println!(
            "rank {rank}           {} files, {}",
            figures["files"],
            format_size(figures["bytes"].as_u64().unwrap_or(0))
        );
    }
    let face = &value["face"];
    if face["space"]["writes_refused"] == true {
        println!(
            "disk full        writes are refused (ENOSPC) until there is room ({} free)",
            format_size(face["space"]["free_bytes_sampled"].as_u64().unwrap_or(0))
        );
    }
    let live = face["live_stored_bytes"].as_u64().unwrap_or(0);
    let containers = face["container_bytes"].as_u64().unwrap_or(0);
    println!(
        "repository       {} in chunks, {} in containers ({} awaiting compaction)",
        format_size(live),
        format_size(containers),
        format_size(containers.saturating_sub(live))
    );
}

fn print_dedup(value: &Value) {
    let plan = &value["plan"];
    let files = plan["files"].as_array().cloned().unwrap_or_default();
    println!(
        "plan: {} files to rank, {} to read; {} files stay rank 0",
        files.len(),
        format_size(plan["read_bytes"].as_u64().unwrap_or(0)),
        plan["files_left_rank_0"]
    );
    for file in &files {
        println!(
            "  rank {} -> {}  {:<6} {:>10}  {}",
            file["rank_before"],
            file["rank"],
            file["chunking"].as_str().unwrap_or("?"),
            format_size(file["bytes"].as_u64().unwrap_or(0)),
            file["path"].as_str().unwrap_or("?")
        );
    }
    let report = &value["report"];
    if report.is_null() {
        println!("dry run: nothing changed");
        return;
    }
    println!(
        "deduplicated {} files ({} skipped: written meanwhile); read {}; {} chunks found in \
         the index, {} small pieces inside stored chunks, {} chunks stored; stored bytes {} \
         -> {}",
        report["files_deduplicated"],
        report["files_skipped"],
        format_size(report["bytes_read"].as_u64().unwrap_or(0)),
        report["chunks_deduplicated"],
        report["pieces_deduplicated"],
        report["chunks_stored"],
        format_size(report["stored_bytes_before"].as_u64().unwrap_or(0)),
        format_size(report["stored_bytes_after"].as_u64().unwrap_or(0)),
    );
}

/// `onecopy check` of the file system face: in the mounting process when one has it (a
/// repair there sets reference counts right on the live state), otherwise here: read-only
/// without `--repair`; with it, opened for repair, which salvages damaged journals, marks
/// what they lost, repairs the namespace and rebuilds the derived tables. A face that does
/// not open is reported as damage.
pub fn check_face(
    cli: &Cli,
    repository: &Repository,
    options: CheckOptions,
) -> anyhow::Result<FaceReport> {
    let request = Request::Check {
        repair: options.repair,
        read_data: options.read_data,
    };
    let lock = match repository.lock_face(FACE, "onecopy check") {
        Ok(lock) => lock,
        Err(onecopy_core::Error::Locked { .. }) => {
            if let Some(value) = control::send(&repository.path().join(FACE), &request)? {
                return Ok(serde_json::from_value(value)?);
            }
            repository.lock_face_waiting(FACE, "onecopy check", cli.lock_wait()?)?
        }
        Err(error) => return Err(error.into()),
    };
    let mode = if options.repair {
        OpenMode::Repair
    } else {
        OpenMode::ReadOnly
    };
    let report = match FsEngine::open(
        repository.face_storage(FACE)?,
        RuntimeOptions::default(),
        mode,
    ) {
        Ok(engine) => {
            let report = engine.check(options)?;
            if options.repair {
                engine.shutdown()?;
            }
            report
        }
        Err(error) => {
            let mut report = FaceReport::new(onecopy_fs::engine::FACE_NAME);
            report.push(Finding::new(
                FindingKind::Damage,
                "fs",
                format!("the file systems cannot be opened: {error}"),
            ));
            report
        }
    };
    drop(lock);
    Ok(report)
}

/// `onecopy mount`.
pub fn mount(cli: &Cli, args: &MountArgs) -> anyhow::Result<()> {
    let options = MountOptions::parse(&args.options)?;
    if !args.foreground {
        return mount_in_background(cli, args);
    }
    let result = serve_mount(cli, args, &options);
    if args.report_ready {
        if let Err(error) = &result {
            // The waiting parent shows this line; the log keeps it too.
            println!("error: {error:#}");
        }
    }
    result
}

fn serve_mount(cli: &Cli, args: &MountArgs, options: &MountOptions) -> anyhow::Result<()> {
    mount::fuse_available()?;
    // Before any thread starts: the signals are taken by one thread, whichever way the
    // mount is served.
    let signals = mount::block_signals()?;
    let mount_point = canonical_mount_point(&args.mount_point)?;
    let repository = Repository::open(&cli.repository_path())?;
    let face_directory = repository.path().join(FACE);
    let holder = format!("mount {} at {}", args.name, mount_point.display());
    let lock = loop {
        match repository.lock_face(FACE, &holder) {
            Ok(lock) => break lock,
            Err(onecopy_core::Error::Locked { .. }) => {
                match ask_to_mount(&face_directory, args, &mount_point)? {
                    Delegated::Mounted(_) => {
                        return follow_delegated_mount(args, &face_directory, &mount_point, signals)
                    }
                    Delegated::Ending => std::thread::sleep(DELEGATION_RETRY),
                    Delegated::NoServer => {
                        break repository.lock_face_waiting(FACE, &holder, cli.lock_wait()?)?
                    }
                }
            }
            Err(error) => return Err(error.into()),
        }
    };
    let mode = if options.read_only {
        OpenMode::ReadOnly
    } else {
        OpenMode::ReadWrite
    };
    let engine = FsEngine::open(
        repository.face_storage(FACE)?,
        RuntimeOptions::default(),
        mode,
    )?;
    let fs = engine.find(&args.name)?;
    let report_ready = args.report_ready;
    mount::serve_with_signals(
        Arc::clone(&engine),
        fs,
        &mount_point,
        options,
        &face_directory,
        Some(signals),
        || {
            if report_ready {
                println!("ready");
            }
        },
    )?;
    drop(lock);
    Ok(())
}

/// How long a mount waits before asking again when the serving process is ending.
const DELEGATION_RETRY: std::time::Duration = std::time::Duration::from_millis(100);

/// The canonical path of an existing directory to mount on.
fn canonical_mount_point(path: &Path) -> anyhow::Result<PathBuf> {
    let mount_point = path
        .canonicalize()
        .with_context(|| format!("mount point {}", path.display()))?;
    if !mount_point.is_dir() {
        bail!("mount point {} is not a directory", mount_point.display());
    }
    Ok(mount_point)
}

/// What the process holding the face said to a mount request.
enum Delegated {
    /// It mounted the file system and serves it; its pid.
    Mounted(u64),
    /// It is ending (its last mount ended): ask again, or take the face once it is free.
    Ending,
    /// No mounting process listens: the face is held by another command.
    NoServer,
}

/// Asks the process that serves the repository's mounts to mount `args.name` too.
fn ask_to_mount(
    face_directory: &Path,
    args: &MountArgs,
    mount_point: &Path,
) -> anyhow::Result<Delegated> {
    let request = Request::Mount {
        name: args.name.clone(),
        mount_point: mount_point.to_path_buf(),
        options: args.options.clone(),
    };
    match control::send(face_directory, &request) {
        Ok(Some(answer)) => Ok(Delegated::Mounted(answer["pid"].as_u64().unwrap_or(0))),
        Ok(None) => Ok(Delegated::NoServer),
        Err(onecopy_fs::FsError::Remote(message)) if message.starts_with(mount::SERVER_ENDING) => {
            Ok(Delegated::Ending)
        }
        Err(error) => Err(error.into()),
    }
}

/// `mount --foreground` of a file system that another process serves (it holds the face):
/// reports it ready, then lives as long as the mount, unmounting it on SIGTERM, SIGINT or
/// SIGHUP, so that it can be supervised like a mount it serves itself.
fn follow_delegated_mount(
    args: &MountArgs,
    face_directory: &Path,
    mount_point: &Path,
    signals: libc::sigset_t,
) -> anyhow::Result<()> {
    if args.report_ready {
        println!("ready");
    } else {
        eprintln!(
            "mounted {} at {} (served by the process that serves this repository's other \
             mounts)",
            args.name,
            mount_point.display()
        );
    }
    let unmount_path = mount_point.to_path_buf();
    std::thread::Builder::new()
        .name("fs-signals".to_string())
        .spawn(move || loop {
            let mut signal = 0;
            // SAFETY: sigwait reads the set and writes the signal number.
            unsafe { libc::sigwait(&signals, &mut signal) };
            if let Err(error) = mount::unmount(&unmount_path) {
                eprintln!("onecopy mount: {error}");
            }
        })
        .context("starting the signal thread")?;
    let request = Request::AwaitUnmount {
        mount_point: mount_point.to_path_buf(),
    };
    loop {
        match control::send(face_directory, &request) {
            Ok(Some(_)) => return Ok(()),
            Ok(None) => bail!("the process serving {} ended", mount_point.display()),
            Err(onecopy_fs::FsError::Io { source, .. })
                if matches!(
                    source.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(error) => {
                return Err(anyhow::Error::from(error).context(format!(
                    "the process serving {} ended",
                    mount_point.display()
                )))
            }
        }
    }
}

/// Starts `onecopy mount --foreground` as a background process and returns once it reports
/// the mount ready (or prints why it failed). Its messages go to `<repository>/fs/mount.log`.
/// When a process serves the repository's mounts already, it is asked to mount this one too.
fn mount_in_background(cli: &Cli, args: &MountArgs) -> anyhow::Result<()> {
    mount::fuse_available()?;
    let mount_point = canonical_mount_point(&args.mount_point)?;
    let repository = Repository::open(&cli.repository_path())?;
    let face_directory = repository.path().join(FACE);
    let log_path = face_directory.join("mount.log");
    // Creates the face's directory private (0700), as every repository directory is.
    repository.face_storage(FACE)?;
    let what = format!("{} at {}", args.name, mount_point.display());
    loop {
        match repository.lock_face(FACE, "mount (starting)") {
            Ok(lock) => {
                drop(lock);
                break;
            }
            Err(error @ onecopy_core::Error::Locked { .. }) => {
                match ask_to_mount(&face_directory, args, &mount_point)? {
                    Delegated::Mounted(pid) => {
                        println!(
                            "mounted {what} (pid {pid}; served with the repository's other \
                             mounts; log {})",
                            log_path.display()
                        );
                        return Ok(());
                    }
                    Delegated::Ending => std::thread::sleep(DELEGATION_RETRY),
                    // A face another process holds is refused here, with the holder named
                    // and exit status 4 (the serving process would only report it as text).
                    // A `--wait` is left to it.
                    Delegated::NoServer if cli.wait.is_none() => return Err(error.into()),
                    Delegated::NoServer => break,
                }
            }
            Err(error) => return Err(error.into()),
        }
    }
    let arguments: Vec<std::ffi::OsString> = vec![
        "mount".into(),
        args.name.clone().into(),
        mount_point.clone().into(),
        "-o".into(),
        args.options.clone().into(),
    ];
    crate::background::serve_in_background(
        cli,
        repository.path(),
        &arguments,
        &[],
        &log_path,
        &what,
    )
}

/// `onecopy umount`: unmounts, then waits until the process that served the mount has made
/// what it wrote durable (and, when it was that process's last mount, until it has ended).
pub fn umount(cli: &Cli, args: &UmountArgs) -> anyhow::Result<()> {
    let mount_point = args
        .mount_point
        .canonicalize()
        .with_context(|| format!("mount point {}", args.mount_point.display()))?;
    mount::unmount(&mount_point)?;
    wait_for_server(&cli.repository_path(), &mount_point);
    Ok(())
}

/// How long `onecopy umount` waits for the serving process (a busy mount point is unmounted
/// lazily and ends only when its last user leaves).
const UMOUNT_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Waits (up to [`UMOUNT_WAIT`]) for the process serving `mount_point` from the repository
/// at `repository` to be done with it.
fn wait_for_server(repository: &Path, mount_point: &Path) {
    let Ok(repository) = Repository::open(repository) else {
        return;
    };
    let face_lock = |face: &str| {
        let _ = repository.lock_face_waiting(face, "umount", LockWait::For(UMOUNT_WAIT));
    };
    // The file system face's server answers for its mounts.
    let request = Request::AwaitUnmount {
        mount_point: mount_point.to_path_buf(),
    };
    match control::send_waiting(&repository.path().join(FACE), &request, UMOUNT_WAIT) {
        Ok(Some(answer)) => {
            // A server left with no mount is ending, whether its session of this mount point
            // ended before the request came or while it waited: wait until it has ended.
            if answer["last"] == true {
                face_lock(FACE);
            }
            return;
        }
        Ok(None) => {}
        // Still busy after the wait: the lazy unmount ends when its last user leaves.
        Err(onecopy_fs::FsError::Io { source, .. })
            if matches!(
                source.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            return
        }
        // The process ended while answering: its last mount; its checkpoint ends with it.
        Err(_) => {
            face_lock(FACE);
            return;
        }
    }
    // The backup face's mounts (`onecopy backup mount`) say where in their lock.
    let holder =
        std::fs::read_to_string(repository.path().join("backup").join("lock")).unwrap_or_default();
    if holder.ends_with(&format!(" at {}", mount_point.display())) {
        face_lock("backup");
    }
}
