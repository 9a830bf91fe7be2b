//! The `onecopy` command: argument parsing and output only; the work is done by the crates
//! under `crates/`.

mod block_face;
mod commands;
mod output;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use onecopy_core::repository::LockWait;

/// onecopy: store each piece of data once.
#[derive(Parser, Debug)]
#[command(name = "onecopy", version, about, long_about = None)]
pub struct Cli {
    /// Repository directory [default: the user's data directory, e.g. ~/.local/share/onecopy/repository].
    #[arg(long, global = true, env = "ONECOPY_REPO", value_name = "DIR")]
    pub repo: Option<PathBuf>,

    /// When another onecopy process uses the repository (exit status 4 otherwise), wait until
    /// it is done; with =DURATION (for example --wait=30s), wait at most that long.
    #[arg(
        long,
        global = true,
        value_name = "DURATION",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "forever"
    )]
    pub wait: Option<String>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create a repository.
    Init(commands::init::InitArgs),
    /// Estimate how much deduplication would save on files, directories, images or devices.
    Analyze(commands::analyze::AnalyzeArgs),
    /// Manage the deduplicated volumes of the block device.
    Volume(commands::volume::VolumeArgs),
    /// Serve every volume over NBD until interrupted.
    Serve(commands::serve::ServeArgs),
    /// Verify a repository and repair what can be rebuilt.
    Check(commands::check::CheckArgs),
    /// Back up directories, images and streams with RevDedup; restore, delete, check.
    Backup(commands::backup::BackupArgs),
    /// Run the experiments that reproduce the papers (docs/LAB.md).
    Lab(commands::lab::LabArgs),
    /// Manage the file systems (FUSE, selective offline deduplication).
    Fs(commands::fs::FsArgs),
    /// Mount a file system.
    Mount(commands::fs::MountArgs),
    /// Unmount a file system.
    Umount(commands::fs::UmountArgs),
}

/// Exit status of a command that found the repository in use by another process (without
/// `--wait`, or when the wait ran out). `check` uses 0, 1 and 3; every other error is 1.
const EXIT_LOCKED: u8 = 4;

impl Cli {
    /// How long to wait for a repository face another process uses (`--wait`).
    pub fn lock_wait(&self) -> anyhow::Result<LockWait> {
        Ok(match self.wait.as_deref() {
            None => LockWait::No,
            Some("forever") => LockWait::Forever,
            Some(duration) => LockWait::For(Duration::from_nanos(
                onecopy_core::units::parse_duration_ns(duration)?,
            )),
        })
    }

    /// The repository directory the user chose, or the default under the data directory.
    pub fn repository_path(&self) -> PathBuf {
        match &self.repo {
            Some(path) => path.clone(),
            None => dirs::data_dir()
                .unwrap_or_else(|| PathBuf::from("."))
                .join("onecopy")
                .join("repository"),
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Init(args) => commands::init::run(&cli, args),
        Command::Analyze(args) => commands::analyze::run(&cli, args),
        Command::Volume(args) => commands::volume::run(&cli, args),
        Command::Check(args) => match commands::check::run(&cli, args) {
            Ok(code) => return ExitCode::from(code),
            Err(error) => Err(error),
        },
        Command::Serve(args) => commands::serve::run(&cli, args),
        Command::Backup(args) => commands::backup::run(&cli, args),
        Command::Lab(args) => commands::lab::run(&cli, args),
        Command::Fs(args) => commands::fs::run(&cli, args),
        Command::Mount(args) => commands::fs::mount(&cli, args),
        Command::Umount(args) => commands::fs::umount(&cli, args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("onecopy: error: {error:#}");
            ExitCode::from(exit_status(&error))
        }
    }
}

/// The exit status for an error: [`EXIT_LOCKED`] when the repository was in use by another
/// process, 1 otherwise.
fn exit_status(error: &anyhow::Error) -> u8 {
    let locked = error.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<onecopy_core::Error>(),
            Some(onecopy_core::Error::Locked { .. })
        )
    });
    if locked {
        EXIT_LOCKED
    } else {
        1
    }
}
