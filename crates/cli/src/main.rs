//! The `onecopy` command: argument parsing and output only; the work is done by the crates
//! under `crates/`.

mod background;
mod backup_face;
mod block_face;
mod commands;
mod keys;
mod output;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use onecopy_core::repository::LockWait;

/// onecopy: store each piece of data once.
#[derive(Parser, Debug)]
#[command(name = "onecopy", version, about, long_about = None)]
pub struct Cli {
    /// Repository directory, for the commands that use one, or for backups a URL
    /// s3:http://HOST:PORT/BUCKET/PREFIX on S3-compatible object storage [default: the user's
    /// data directory, e.g. ~/.local/share/onecopy/repository].
    #[arg(long, env = "ONECOPY_REPO", value_name = "DIR|URL")]
    pub repo: Option<PathBuf>,

    /// For the commands that use a repository: when another onecopy process uses it (exit
    /// status 4 otherwise), wait until it is done; with =DURATION (for example --wait=30s),
    /// wait at most that long.
    #[arg(
        long,
        value_name = "DURATION",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "forever"
    )]
    pub wait: Option<String>,

    #[command(subcommand)]
    pub command: Command,
}

/// `--repo` and `--wait`, offered by every command that uses a repository (and by its
/// subcommands), so that they may follow the command's name too: `onecopy volume list
/// --repo DIR`. Given there, they take precedence over the same options before the command's
/// name and over `ONECOPY_REPO`.
#[derive(Args, Debug, Default)]
pub struct RepositoryArgs {
    /// Repository directory, or for backups a URL s3:http://HOST:PORT/BUCKET/PREFIX
    /// [default: ONECOPY_REPO, or the user's data directory, e.g.
    /// ~/.local/share/onecopy/repository].
    // Ids of their own, so that they cannot collide with a command's argument of the same
    // field name (`backup create SERIES PATH`).
    #[arg(
        id = "repository_directory",
        long = "repo",
        global = true,
        value_name = "DIR|URL"
    )]
    pub path: Option<PathBuf>,

    /// When another onecopy process uses the repository (exit status 4 otherwise), wait until
    /// it is done; with =DURATION (for example --wait=30s), wait at most that long.
    #[arg(
        id = "repository_wait",
        long = "wait",
        global = true,
        value_name = "DURATION",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "forever"
    )]
    pub wait: Option<String>,
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
    /// Manage the passwords of an encrypted repository.
    Key(commands::key::KeyArgs),
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
    /// The repository options of the command, or `None` for the commands that use no
    /// repository (`analyze`, `lab`).
    fn repository_args(&self) -> Option<&RepositoryArgs> {
        match &self.command {
            Command::Init(args) => Some(&args.repository),
            Command::Volume(args) => Some(&args.repository),
            Command::Serve(args) => Some(&args.repository),
            Command::Check(args) => Some(&args.repository),
            Command::Backup(args) => Some(&args.repository),
            Command::Fs(args) => Some(&args.repository),
            Command::Mount(args) => Some(&args.repository),
            Command::Umount(args) => Some(&args.repository),
            Command::Key(args) => Some(&args.repository),
            Command::Analyze(_) | Command::Lab(_) => None,
        }
    }

    /// `--password-file` of the commands that open the backup store.
    pub fn password_file(&self) -> Option<&std::path::Path> {
        let args = match &self.command {
            Command::Init(args) => &args.password,
            Command::Check(args) => &args.password,
            Command::Backup(args) => &args.password,
            Command::Key(args) => &args.password,
            _ => return None,
        };
        args.file.as_deref()
    }

    /// How long to wait for a repository face another process uses (`--wait`).
    pub fn lock_wait(&self) -> anyhow::Result<LockWait> {
        let wait = self
            .repository_args()
            .and_then(|args| args.wait.as_deref())
            .or(self.wait.as_deref());
        Ok(match wait {
            None => LockWait::No,
            Some("forever") => LockWait::Forever,
            Some(duration) => LockWait::For(Duration::from_nanos(
                onecopy_core::units::parse_duration_ns(duration)?,
            )),
        })
    }

    /// The repository directory the user chose, or the default under the data directory.
    pub fn repository_path(&self) -> PathBuf {
        let chosen = self
            .repository_args()
            .and_then(|args| args.path.as_ref())
            .or(self.repo.as_ref());
        match chosen {
            Some(path) => path.clone(),
            None => dirs::data_dir()
                .unwrap_or_else(|| PathBuf::from("."))
                .join("onecopy")
                .join("repository"),
        }
    }
}

/// Parses the command line; `--repo` or `--wait` given before a command that uses no
/// repository would do nothing, so it is refused (`ONECOPY_REPO` in the environment is not).
fn parse() -> Cli {
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
    if cli.repository_args().is_none() {
        let repo_given = matches.value_source("repo") == Some(ValueSource::CommandLine);
        for (option, given) in [("--repo", repo_given), ("--wait", cli.wait.is_some())] {
            if given {
                let command = matches.subcommand_name().unwrap_or_default();
                Cli::command()
                    .error(
                        clap::error::ErrorKind::ArgumentConflict,
                        format!("`onecopy {command}` uses no repository; drop {option}"),
                    )
                    .exit();
            }
        }
    }
    cli
}

fn main() -> ExitCode {
    let cli = parse();
    if prints_for_pipes(&cli.command) {
        // A reader that stops early (`onecopy backup list | head`) ends the command quietly,
        // as it ends any Unix tool, instead of a failed write to standard output.
        // SAFETY: setting a signal's disposition before any thread starts.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let result = match &cli.command {
        _ if !object_storage_allowed(&cli) => Err(anyhow::anyhow!(
            "repositories on object storage (s3:) hold backups only: use `onecopy backup`, \
             `key`, `check` and `init` with them, and a directory for the block device and the \
             file system"
        )),
        Command::Init(args) => commands::init::run(&cli, args),
        Command::Analyze(args) => commands::analyze::run(&cli, args),
        Command::Volume(args) => commands::volume::run(&cli, args),
        Command::Check(args) => match commands::check::run(&cli, args) {
            Ok(code) => return ExitCode::from(code),
            Err(error) => Err(error),
        },
        Command::Serve(args) => commands::serve::run(&cli, args),
        Command::Backup(args) => {
            onecopy_core::memory::limit_heaps_to_cores();
            commands::backup::run(&cli, args)
        }
        Command::Lab(args) => commands::lab::run(&cli, args),
        Command::Key(args) => commands::key::run(&cli, args),
        Command::Fs(args) => commands::fs::run(&cli, args),
        Command::Mount(args) => commands::fs::mount(&cli, args),
        Command::Umount(args) => commands::fs::umount(&cli, args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("onecopy: error: {}", output::error_message(&error));
            ExitCode::from(exit_status(&error))
        }
    }
}

/// False when `--repo` is an object-storage URL and the command is not one of the backup
/// store's (`backup mount` included: it serves from a directory only).
fn object_storage_allowed(cli: &Cli) -> bool {
    let remote = cli
        .repository_args()
        .is_some()
        .then(|| cli.repository_path())
        .and_then(|path| path.to_str().map(onecopy_remote::ObjectUrl::is_object_url))
        .unwrap_or(false);
    !remote
        || match &cli.command {
            Command::Init(_) | Command::Check(_) | Command::Key(_) => true,
            Command::Backup(args) => {
                !matches!(args.command, commands::backup::BackupCommand::Mount { .. })
            }
            _ => false,
        }
}

/// Whether `command` only prints results: servers and mounts (and the lab, which runs them)
/// keep Rust's ignored SIGPIPE, so that a peer that goes away is an error on its socket, not
/// the end of the process.
fn prints_for_pipes(command: &Command) -> bool {
    match command {
        Command::Serve(_) | Command::Mount(_) | Command::Lab(_) => false,
        Command::Backup(args) => {
            !matches!(args.command, commands::backup::BackupCommand::Mount { .. })
        }
        _ => true,
    }
}

/// The exit status for an error: [`EXIT_LOCKED`] when the repository was in use by another
/// process, 1 otherwise.
fn exit_status(error: &anyhow::Error) -> u8 {
    let locked = matches!(
        output::core_error(error),
        Some(onecopy_core::Error::Locked { .. })
    ) || error.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<onecopy_remote::RemoteError>(),
            Some(onecopy_remote::RemoteError::Locked { .. })
        )
    });
    if locked {
        EXIT_LOCKED
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every argument of `command` and its subcommands, with the path of commands to it.
    fn arguments(command: &clap::Command, path: &str, found: &mut Vec<(String, clap::Arg)>) {
        for argument in command.get_arguments() {
            found.push((path.to_string(), argument.clone()));
        }
        for subcommand in command.get_subcommands() {
            let path = format!("{path} {}", subcommand.get_name());
            arguments(subcommand, &path, found);
        }
    }

    /// Goal: every positional argument and option says in `--help` what it is. Method: walk
    /// the built command tree and list the arguments without help text.
    #[test]
    fn every_argument_has_help() {
        let mut command = Cli::command();
        command.build();
        let mut found = Vec::new();
        arguments(&command, "onecopy", &mut found);
        let silent: Vec<String> = found
            .iter()
            .filter(|(_, argument)| !matches!(argument.get_id().as_str(), "help" | "version"))
            .filter(|(_, argument)| argument.get_help().is_none())
            .map(|(path, argument)| format!("{path}: {}", argument.get_id()))
            .collect();
        assert!(silent.is_empty(), "arguments without help: {silent:#?}");
    }

    /// Goal: `--repo` and `--wait` are offered exactly by the commands that use a
    /// repository. Method: walk the built command tree below `analyze` and `lab`, and below
    /// the others.
    #[test]
    fn repository_options_only_where_they_act() {
        let mut command = Cli::command();
        command.build();
        for subcommand in command.get_subcommands() {
            let mut found = Vec::new();
            arguments(subcommand, subcommand.get_name(), &mut found);
            let offered = |long: &str| -> Vec<&String> {
                found
                    .iter()
                    .filter(|(_, argument)| argument.get_long() == Some(long))
                    .map(|(path, _)| path)
                    .collect()
            };
            for long in ["repo", "wait"] {
                match subcommand.get_name() {
                    "analyze" | "lab" => {
                        assert!(offered(long).is_empty(), "--{long} in {:?}", offered(long))
                    }
                    "help" => {}
                    name => assert!(!offered(long).is_empty(), "{name} offers no --{long}"),
                }
            }
        }
    }
}
