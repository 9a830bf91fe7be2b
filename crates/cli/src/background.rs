//! A mount served by a background process: `onecopy ... --foreground --report-ready` started in
//! its own process group, its messages appended to a private log, and the starting command
//! returning once the child reports the mount ready (or saying why it did not).

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::Stdio;

use anyhow::{bail, Context};

use crate::Cli;

/// Starts `onecopy --repo REPOSITORY ARGUMENTS... --foreground --report-ready` (with the
/// command line's `--wait`, and `environment` added to its environment), its standard error appended to `log_path` (0600), and waits for
/// its first line: `ready`, or the error it stopped on. `what` names the mount in the message
/// printed once it is ready.
pub fn serve_in_background(
    cli: &Cli,
    repository: &Path,
    arguments: &[OsString],
    environment: &[(&str, String)],
    log_path: &Path,
    what: &str,
) -> anyhow::Result<()> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(log_path)
        .with_context(|| format!("opening {}", log_path.display()))?;
    let mut command = std::process::Command::new(std::env::current_exe()?);
    command
        .arg("--repo")
        .arg(repository)
        .args(arguments)
        .args(["--foreground", "--report-ready"])
        .envs(environment.iter().map(|(name, value)| (name, value)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log);
    if let Some(wait) = &cli.wait {
        command.arg(format!("--wait={wait}"));
    }
    // Its own process group: a Ctrl-C in the terminal that started it does not unmount.
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut child = command.spawn().context("starting the mount process")?;
    let stdout = child.stdout.take().expect("piped");
    match BufReader::new(stdout).lines().next() {
        Some(Ok(line)) if line == "ready" => {
            println!(
                "mounted {what} (pid {}; log {})",
                child.id(),
                log_path.display()
            );
            Ok(())
        }
        Some(Ok(line)) => {
            let _ = child.wait();
            bail!("{}", line.strip_prefix("error: ").unwrap_or(&line))
        }
        _ => {
            let status = child.wait()?;
            bail!(
                "the mount process ended ({status}) before the mount was ready; see {}",
                log_path.display()
            )
        }
    }
}
