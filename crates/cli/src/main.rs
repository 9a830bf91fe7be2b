//! The `onecopy` command: argument parsing and output only; the work is done by the crates
//! under `crates/`.

mod block_face;
mod commands;
mod output;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// onecopy: store each piece of data once.
#[derive(Parser, Debug)]
#[command(name = "onecopy", version, about, long_about = None)]
pub struct Cli {
    /// Repository directory [default: the user's data directory, e.g. ~/.local/share/onecopy/repository].
    #[arg(long, global = true, env = "ONECOPY_REPO", value_name = "DIR")]
    pub repo: Option<PathBuf>,

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
}

impl Cli {
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
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("onecopy: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
