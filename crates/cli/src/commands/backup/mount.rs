//! `onecopy backup mount`: a read-only FUSE view of a series
//! ([`onecopy_backup::mount`]), served in the background by default.
//!
//! The serving process holds the backup face's lock until unmounted: the catalog's database
//! must not be opened by another process while one writes, so backups, expiry and the other
//! backup commands wait (`--wait`) or fail naming the mount until it ends.

use std::path::Path;

use anyhow::{bail, Context};
use onecopy_backup::mount::{fuse, SeriesView};
use onecopy_backup::{BackupStore, OpenOptions, RuntimeOptions};
use onecopy_core::repository::Repository;
use onecopy_fs::mount::{block_signals, fuse_available, unmount};

use crate::Cli;

/// `onecopy backup mount SERIES MOUNTPOINT`.
pub fn run(
    cli: &Cli,
    series: &str,
    mount_point: &Path,
    foreground: bool,
    report_ready: bool,
) -> anyhow::Result<()> {
    fuse_available()?;
    if !foreground {
        return start_in_background(cli, series, mount_point);
    }
    let result = serve(cli, series, mount_point, report_ready);
    if report_ready {
        if let Err(error) = &result {
            // The waiting parent shows this line; the log keeps it too.
            println!("error: {error:#}");
        }
    }
    result
}

fn serve(cli: &Cli, series: &str, mount_point: &Path, report_ready: bool) -> anyhow::Result<()> {
    // Before any thread starts: every thread inherits the blocked set, one takes the signal.
    let signals = block_signals()?;
    let mount_point = mount_point
        .canonicalize()
        .with_context(|| format!("mount point {}", mount_point.display()))?;
    if !mount_point.is_dir() {
        bail!("mount point {} is not a directory", mount_point.display());
    }
    let repository = Repository::open(&cli.repository_path())?;
    let _lock = repository.lock_face_waiting(
        "backup",
        &format!("onecopy backup mount {series} at {}", mount_point.display()),
        cli.lock_wait()?,
    )?;
    let storage = crate::keys::backup_storage(cli, &repository, crate::keys::FirstKey::Refuse)?;
    let mut store = BackupStore::open(
        storage,
        OpenOptions {
            store: None,
            runtime: RuntimeOptions::default(),
            read_only: true,
        },
    )?;
    for notice in store.take_notices() {
        eprintln!("onecopy: backup: {notice}");
    }
    // SAFETY: getuid and getgid cannot fail.
    let owner = unsafe { (libc::getuid(), libc::getgid()) };
    let view = SeriesView::new(store, series, owner)?;
    let mounted = fuse::mount(view, &mount_point)?;
    let unmounter = mounted.unmounter();
    let signal_mount_point = mount_point.clone();
    std::thread::Builder::new()
        .name("backup-mount-signals".to_string())
        .spawn(move || {
            let mut signal = 0;
            // SAFETY: sigwait reads the set and writes the signal number.
            unsafe { libc::sigwait(&signals, &mut signal) };
            if unmounter.lock().unmount().is_err() {
                let _ = unmount(&signal_mount_point);
            }
        })
        .context("starting the signal thread")?;
    if report_ready {
        println!("ready");
    }
    mounted.wait()?;
    Ok(())
}

/// Starts `onecopy backup mount --foreground` as a background process and returns once it
/// reports the mount ready (or prints why it failed).
fn start_in_background(cli: &Cli, series: &str, mount_point: &Path) -> anyhow::Result<()> {
    let repository = Repository::open(&cli.repository_path())?;
    repository.face_storage("backup")?;
    // A store another process holds is refused here, naming the holder; a `--wait` is left
    // to the serving process.
    if cli.wait.is_none() {
        drop(repository.lock_face("backup", "onecopy backup mount (starting)")?);
    }
    let log_path = repository.path().join("backup").join("mount.log");
    let arguments: Vec<std::ffi::OsString> = vec![
        "backup".into(),
        "mount".into(),
        series.into(),
        mount_point.into(),
    ];
    let what = format!("{series} at {}", mount_point.display());
    // The serving process cannot ask on the terminal: it gets the password asked here.
    let mut environment = Vec::new();
    if repository.config().encryption != onecopy_core::repository::Encryption::None
        && cli.password_file().is_none()
        && std::env::var_os("ONECOPY_PASSWORD").is_none()
    {
        environment.push(("ONECOPY_PASSWORD", crate::keys::password(cli)?));
    }
    crate::background::serve_in_background(
        cli,
        repository.path(),
        &arguments,
        &environment,
        &log_path,
        &what,
    )
}
