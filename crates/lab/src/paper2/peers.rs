//! Other backup tools run side by side with onecopy on the same input: restic and borg,
//! each driven through its command line as a user would, and onecopy's own command line for
//! the same operations.
//!
//! Every command runs under `/usr/bin/time -f "%e %U %S %M"`, which gives its wall time,
//! user and system CPU time and peak resident set size. Each tool keeps all its state in one
//! *home* directory: the repository (`repo/`) and its caches (restic's `--cache-dir`, borg's
//! `BORG_BASE_DIR`), so a home can be copied to try a deletion without disturbing the
//! original. The settings, stated once here and in docs/BENCHMARKS.md:
//!
//! - **restic** (0.14): repository format 2, compression `auto` (zstd at its default level),
//!   its content-defined chunks of 512 KiB to 8 MiB (1 MiB average), SHA-256, AES + Poly1305
//!   (restic cannot store unencrypted; the password comes from `RESTIC_PASSWORD`); it uses as
//!   many threads as cores (`GOMAXPROCS`).
//! - **borg** (1.2): `--encryption=none`, `--compression zstd,3`, its default buzhash chunks
//!   (2 MiB average); borg 1.2 is single-threaded.
//! - **onecopy**: the backup store's defaults (RevDedup, 4 MiB segments, 4 KiB chunks, 32 MiB
//!   containers, zstd level 3, all cores), unencrypted (`init --insecure-no-encryption`) like
//!   borg here (docs/BENCHMARKS.md measures what encryption adds); `create`
//!   reverse-deduplicates the previous backup before it returns (its report separates the two
//!   phases).
//!
//! Deleting the oldest backup is `restic forget --keep-last N --prune`, `borg prune
//! --keep-last N` followed by `borg compact`, and `onecopy backup expire --keep N`.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use onecopy_core::error::IoContext;
use serde::{Deserialize, Serialize};

use crate::error::{LabError, Result};

/// The program that measures each command.
pub const TIME_PROGRAM: &str = "/usr/bin/time";
/// Password of the restic repositories (restic 0.14 cannot create an unencrypted one).
const RESTIC_PASSWORD: &str = "onecopy-lab";
/// Host name recorded in restic snapshots, so that `forget` groups every backup together.
const RESTIC_HOST: &str = "onecopy-lab";
/// The onecopy series the peer comparison backs up.
const ONECOPY_SERIES: &str = "series";

/// A backup tool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tool {
    Onecopy,
    Restic,
    Borg,
}

impl Tool {
    pub const ALL: [Tool; 3] = [Tool::Onecopy, Tool::Restic, Tool::Borg];

    pub fn name(self) -> &'static str {
        match self {
            Tool::Onecopy => "onecopy",
            Tool::Restic => "restic",
            Tool::Borg => "borg",
        }
    }

    /// How the tool is configured in the comparison (for tables).
    pub fn settings(self) -> &'static str {
        match self {
            Tool::Onecopy => {
                "RevDedup, 4 MiB segments / 4 KiB chunks (gear hash), zstd 3, 2 threads"
            }
            Tool::Restic => "repository v2, compression auto (zstd), AES, GOMAXPROCS=cores",
            Tool::Borg => "encryption none, compression zstd,3, single-threaded",
        }
    }
}

impl fmt::Display for Tool {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.name())
    }
}

/// What `/usr/bin/time` measured of one command.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolRun {
    pub seconds: f64,
    pub user_seconds: f64,
    pub system_seconds: f64,
    /// Peak resident set size.
    pub max_rss_bytes: u64,
    /// One-minute load average when the command started.
    pub load_average: f64,
}

impl ToolRun {
    /// User + system CPU time.
    pub fn cpu_seconds(&self) -> f64 {
        self.user_seconds + self.system_seconds
    }

    /// The sum of consecutive steps (peak memory is the larger peak).
    pub fn then(self, next: ToolRun) -> ToolRun {
        ToolRun {
            seconds: self.seconds + next.seconds,
            user_seconds: self.user_seconds + next.user_seconds,
            system_seconds: self.system_seconds + next.system_seconds,
            max_rss_bytes: self.max_rss_bytes.max(next.max_rss_bytes),
            load_average: self.load_average,
        }
    }
}

/// Which backup to restore.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    Oldest,
    Newest,
}

/// One tool's repository and caches in a home directory.
#[derive(Clone, Debug)]
pub struct PeerRepository {
    pub tool: Tool,
    home: PathBuf,
    /// The onecopy executable (used for [`Tool::Onecopy`]).
    onecopy: PathBuf,
}

impl PeerRepository {
    /// Creates the repository of `tool` in `home` (which must not exist).
    pub fn create(tool: Tool, home: &Path, onecopy: &Path) -> Result<(Self, ToolRun)> {
        if home.exists() {
            return Err(LabError::InvalidOption(format!(
                "{} exists; a peer repository starts empty",
                home.display()
            )));
        }
        fs::create_dir_all(home).context_io(|| format!("creating {}", home.display()))?;
        let repository = PeerRepository {
            tool,
            home: home.to_path_buf(),
            onecopy: onecopy.to_path_buf(),
        };
        let repo = repository.repository_path();
        let mut command = repository.command();
        match tool {
            Tool::Onecopy => command.args(["init", "--insecure-no-encryption"]),
            Tool::Restic => command.args(["init", "--repository-version", "2"]),
            Tool::Borg => command.args(["init", "--encryption=none"]).arg(&repo),
        };
        let (run, _) = run_timed(&mut command, &format!("{tool} init"))?;
        Ok((repository, run))
    }

    /// The tool's version line.
    pub fn version(tool: Tool, onecopy: &Path) -> String {
        let program = match tool {
            Tool::Onecopy => onecopy.as_os_str().to_owned(),
            Tool::Restic => "restic".into(),
            Tool::Borg => "borg".into(),
        };
        let argument = if tool == Tool::Restic {
            "version"
        } else {
            "--version"
        };
        Command::new(program)
            .arg(argument)
            .stdin(Stdio::null())
            .output()
            .ok()
            .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_string())
            .unwrap_or_else(|| "not installed".to_string())
    }

    pub fn repository_path(&self) -> PathBuf {
        self.home.join("repo")
    }

    /// A command of the tool with its environment set.
    fn command(&self) -> Command {
        let repo = self.repository_path();
        match self.tool {
            Tool::Onecopy => {
                let mut command = Command::new(&self.onecopy);
                command.arg("--repo").arg(&repo);
                command
            }
            Tool::Restic => {
                let mut command = Command::new("restic");
                command
                    .env("RESTIC_PASSWORD", RESTIC_PASSWORD)
                    .env("RESTIC_REPOSITORY", &repo)
                    .env("RESTIC_CACHE_DIR", self.home.join("cache"));
                command
            }
            Tool::Borg => {
                let mut command = Command::new("borg");
                command
                    .env("BORG_BASE_DIR", self.home.join("base"))
                    .env("BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK", "yes")
                    .env("BORG_RELOCATED_REPO_ACCESS_IS_OK", "yes");
                command
            }
        }
    }

    /// Backs up the directory `parent/name` (every tool sees the same path) as backup
    /// `label`; for onecopy, also returns the seconds its `create` spent in reverse
    /// deduplication of the previous backup.
    pub fn backup(&self, parent: &Path, name: &str, label: &str) -> Result<(ToolRun, f64)> {
        let source = parent.join(name);
        let mut command = self.command();
        match self.tool {
            Tool::Onecopy => command
                .args(["backup", "create", ONECOPY_SERIES])
                .arg(&source)
                .arg("--json"),
            Tool::Restic => command
                .args(["backup", "--quiet", "--host", RESTIC_HOST])
                .arg(&source),
            Tool::Borg => command
                .current_dir(parent)
                .args(["create", "--compression", "zstd,3"])
                .arg(format!("{}::{label}", self.repository_path().display()))
                .arg(name),
        };
        let (run, stdout) = run_timed(&mut command, &format!("{} backup {label}", self.tool))?;
        let reverse_seconds = match self.tool {
            Tool::Onecopy => {
                let report: serde_json::Value = parse_json(&stdout, "onecopy backup create")?;
                report["reverse"].as_array().map_or(0.0, |reports| {
                    reports
                        .iter()
                        .filter_map(|report| report["seconds"].as_f64())
                        .sum()
                })
            }
            _ => 0.0,
        };
        Ok((run, reverse_seconds))
    }

    /// Restores the oldest or newest backup into `target` (created, must be empty) and returns
    /// the directory that holds the restored tree.
    pub fn restore(
        &self,
        which: Which,
        source: &Path,
        target: &Path,
    ) -> Result<(ToolRun, PathBuf)> {
        fs::create_dir_all(target).context_io(|| format!("creating {}", target.display()))?;
        let mut command = self.command();
        let root = match self.tool {
            Tool::Onecopy => {
                let backup = match which {
                    Which::Newest => ONECOPY_SERIES.to_string(),
                    Which::Oldest => format!("{ONECOPY_SERIES}@{}", self.onecopy_oldest()?),
                };
                command.args(["backup", "restore"]).arg(backup).arg(target);
                target.to_path_buf()
            }
            Tool::Restic => {
                let snapshot = match which {
                    Which::Newest => "latest".to_string(),
                    Which::Oldest => self.restic_snapshots()?.remove(0),
                };
                command
                    .args(["restore", "--quiet", &snapshot, "--target"])
                    .arg(target);
                let relative = source.strip_prefix("/").unwrap_or(source);
                target.join(relative)
            }
            Tool::Borg => {
                let archives = self.borg_archives()?;
                let archive = match which {
                    Which::Newest => archives.last(),
                    Which::Oldest => archives.first(),
                }
                .ok_or_else(|| LabError::InvalidOption("borg: no archive to restore".into()))?;
                command
                    .current_dir(target)
                    .arg("extract")
                    .arg(format!("{}::{archive}", self.repository_path().display()));
                let name = source.file_name().ok_or_else(|| {
                    LabError::InvalidOption(format!("{} has no name", source.display()))
                })?;
                target.join(name)
            }
        };
        let (run, _) = run_timed(&mut command, &format!("{} restore", self.tool))?;
        Ok((run, root))
    }

    /// Deletes the oldest backup, reclaiming its space; the steps and their measures.
    pub fn delete_oldest(&self) -> Result<Vec<(String, ToolRun)>> {
        let count = self.backup_count()?;
        if count < 2 {
            return Err(LabError::InvalidOption(format!(
                "{}: deleting the oldest of {count} backups would leave none",
                self.tool
            )));
        }
        let keep = (count - 1).to_string();
        let repo = self.repository_path();
        let mut steps = Vec::new();
        match self.tool {
            Tool::Onecopy => {
                let mut command = self.command();
                command.args([
                    "backup",
                    "expire",
                    ONECOPY_SERIES,
                    "--keep",
                    &keep,
                    "--json",
                ]);
                steps.push((
                    "expire".to_string(),
                    run_timed(&mut command, "onecopy expire")?.0,
                ));
            }
            Tool::Restic => {
                let mut command = self.command();
                command.args(["forget", "--quiet", "--keep-last", &keep, "--prune"]);
                steps.push((
                    "forget --prune".to_string(),
                    run_timed(&mut command, "restic forget --prune")?.0,
                ));
            }
            Tool::Borg => {
                let mut prune = self.command();
                prune.args(["prune", "--keep-last", &keep]).arg(&repo);
                steps.push(("prune".to_string(), run_timed(&mut prune, "borg prune")?.0));
                let mut compact = self.command();
                compact.arg("compact").arg(&repo);
                steps.push((
                    "compact".to_string(),
                    run_timed(&mut compact, "borg compact")?.0,
                ));
            }
        }
        let after = self.backup_count()?;
        if after != count - 1 {
            return Err(LabError::Command {
                command: format!("{} delete oldest", self.tool),
                detail: format!("{count} backups before, {after} after"),
            });
        }
        Ok(steps)
    }

    /// Backups in the repository.
    pub fn backup_count(&self) -> Result<usize> {
        Ok(match self.tool {
            Tool::Onecopy => self.onecopy_versions()?.len(),
            Tool::Restic => self.restic_snapshots()?.len(),
            Tool::Borg => self.borg_archives()?.len(),
        })
    }

    /// Bytes of every file of the repository (caches and onecopy's space reserve excluded).
    pub fn repository_bytes(&self) -> Result<u64> {
        super::files::repository_bytes(&self.repository_path())
    }

    /// Copies the whole home (repository and caches) to `home`.
    pub fn copy_to(&self, home: &Path) -> Result<PeerRepository> {
        super::files::copy_tree(&self.home, home)?;
        Ok(PeerRepository {
            tool: self.tool,
            home: home.to_path_buf(),
            onecopy: self.onecopy.clone(),
        })
    }

    /// Removes the home.
    pub fn destroy(self) -> Result<()> {
        Ok(fs::remove_dir_all(&self.home)
            .context_io(|| format!("removing {}", self.home.display()))?)
    }

    fn onecopy_versions(&self) -> Result<Vec<u64>> {
        let mut command = self.command();
        command.args(["backup", "list", ONECOPY_SERIES, "--json"]);
        let stdout = run_plain(&mut command, "onecopy backup list")?;
        let listing: serde_json::Value = parse_json(&stdout, "onecopy backup list")?;
        let backups = listing
            .as_array()
            .or_else(|| listing["backups"].as_array())
            .ok_or_else(|| LabError::Command {
                command: "onecopy backup list --json".into(),
                detail: "no list of backups in the output".into(),
            })?;
        Ok(backups
            .iter()
            .filter_map(|backup| backup["version"].as_u64())
            .collect())
    }

    fn onecopy_oldest(&self) -> Result<u64> {
        self.onecopy_versions()?
            .into_iter()
            .min()
            .ok_or_else(|| LabError::InvalidOption("onecopy: no backup to restore".into()))
    }

    /// Snapshot ids, oldest first.
    fn restic_snapshots(&self) -> Result<Vec<String>> {
        let mut command = self.command();
        command.args(["snapshots", "--json"]);
        let stdout = run_plain(&mut command, "restic snapshots")?;
        let listing: serde_json::Value = parse_json(&stdout, "restic snapshots --json")?;
        let mut snapshots: Vec<(String, String)> = listing
            .as_array()
            .map(|snapshots| {
                snapshots
                    .iter()
                    .filter_map(|snapshot| {
                        Some((
                            snapshot["time"].as_str()?.to_string(),
                            snapshot["id"].as_str()?.to_string(),
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default();
        snapshots.sort();
        Ok(snapshots.into_iter().map(|(_, id)| id).collect())
    }

    /// Archive names, oldest first.
    fn borg_archives(&self) -> Result<Vec<String>> {
        let mut command = self.command();
        command
            .args(["list", "--short"])
            .arg(self.repository_path());
        let stdout = run_plain(&mut command, "borg list")?;
        Ok(stdout.lines().map(str::to_string).collect())
    }
}

fn parse_json(text: &str, what: &str) -> Result<serde_json::Value> {
    serde_json::from_str(text).map_err(|error| LabError::Command {
        command: what.to_string(),
        detail: format!(
            "unexpected output ({error}): {}",
            text.chars().take(200).collect::<String>()
        ),
    })
}

/// Runs `command` without measuring it; returns its standard output, or an error naming
/// `what` with the exit status and standard error. Every command the lab runs goes through
/// here or [`run_timed`].
pub(crate) fn run_plain(command: &mut Command, what: &str) -> Result<String> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|error| LabError::Command {
            command: what.to_string(),
            detail: format!("{error} (is it installed? see scripts/setup.sh)"),
        })?;
    if !output.status.success() {
        return Err(LabError::Command {
            command: what.to_string(),
            detail: format!(
                "{}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Runs `command` under `/usr/bin/time`; returns its measures and standard output.
pub fn run_timed(command: &mut Command, what: &str) -> Result<(ToolRun, String)> {
    let measures =
        tempfile::NamedTempFile::new().context_io(|| "creating a file for /usr/bin/time")?;
    let mut timed = Command::new(TIME_PROGRAM);
    timed
        .arg("-f")
        .arg("%e %U %S %M")
        .arg("-o")
        .arg(measures.path())
        .arg(command.get_program())
        .args(command.get_args());
    for (key, value) in command.get_envs() {
        match value {
            Some(value) => timed.env(key, value),
            None => timed.env_remove(key),
        };
    }
    if let Some(directory) = command.get_current_dir() {
        timed.current_dir(directory);
    }
    let load_average = crate::results::load_average();
    let started = std::time::Instant::now();
    let stdout = run_plain(&mut timed, what)?;
    // /usr/bin/time reports wall time in hundredths of a second; ours has microseconds.
    let seconds = started.elapsed().as_secs_f64();
    let text =
        fs::read_to_string(measures.path()).context_io(|| "reading /usr/bin/time's output")?;
    let mut run = parse_time_output(&text).ok_or_else(|| LabError::Command {
        command: what.to_string(),
        detail: format!("unexpected /usr/bin/time output {text:?}"),
    })?;
    run.load_average = load_average;
    run.seconds = seconds;
    Ok((run, stdout))
}

/// Parses the last line of `/usr/bin/time -f "%e %U %S %M"` (kilobytes for %M).
pub fn parse_time_output(text: &str) -> Option<ToolRun> {
    let line = text.lines().rev().find(|line| !line.trim().is_empty())?;
    let mut fields = line.split_whitespace();
    let seconds = fields.next()?.parse().ok()?;
    let user_seconds = fields.next()?.parse().ok()?;
    let system_seconds = fields.next()?.parse().ok()?;
    let max_rss_kilobytes: u64 = fields.next()?.parse().ok()?;
    Some(ToolRun {
        seconds,
        user_seconds,
        system_seconds,
        max_rss_bytes: max_rss_kilobytes * 1024,
        load_average: 0.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paper2::files::compare_trees;

    /// Goal: /usr/bin/time's output is parsed, failures included; method: a normal line and
    /// one preceded by the exit-status line time prints for failed commands.
    #[test]
    fn time_output_parses() {
        let run = parse_time_output("1.50 0.75 0.25 2048\n").expect("parses");
        assert_eq!(run.seconds, 1.5);
        assert_eq!(run.cpu_seconds(), 1.0);
        assert_eq!(run.max_rss_bytes, 2048 * 1024);
        let failed =
            parse_time_output("Command exited with non-zero status 1\n0.01 0.00 0.00 900\n")
                .expect("parses");
        assert_eq!(failed.max_rss_bytes, 900 * 1024);
        assert!(parse_time_output("garbage").is_none());
    }

    /// Goal: restic and borg each back up, restore byte-exact and delete their oldest backup;
    /// method: two small versions of a tree through restic and borg (fails, naming what to
    /// install, when one is missing).
    #[test]
    fn peers_round_trip() {
        let directory = tempfile::tempdir().expect("temporary directory");
        let parent = directory.path().join("stage");
        let source = parent.join("tree");
        fs::create_dir_all(&source).expect("directory");
        for tool in [Tool::Restic, Tool::Borg] {
            assert_ne!(
                PeerRepository::version(tool, Path::new("onecopy")),
                "not installed",
                "{tool} is not installed: run scripts/setup.sh, which installs restic and borg"
            );
            let home = directory.path().join(tool.name());
            let (repository, _) =
                PeerRepository::create(tool, &home, Path::new("onecopy")).expect("init");
            fs::write(source.join("file"), b"first version").expect("file");
            repository.backup(&parent, "tree", "v1").expect("backup");
            fs::write(source.join("file"), b"second version").expect("file");
            repository.backup(&parent, "tree", "v2").expect("backup");
            assert_eq!(repository.backup_count().expect("count"), 2);
            let target = directory.path().join(format!("{tool}-restore"));
            let (run, root) = repository
                .restore(Which::Newest, &source, &target)
                .expect("restore");
            assert!(run.max_rss_bytes > 0);
            assert_eq!(compare_trees(&source, &root).expect("compare"), None);
            let steps = repository.delete_oldest().expect("delete");
            assert!(!steps.is_empty());
            assert_eq!(repository.backup_count().expect("count"), 1);
        }
    }
}
