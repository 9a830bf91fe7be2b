//! Other backup tools run side by side with onecopy on the same input: restic, borg, rustic
//! and bupstash, each driven through its command line as a user would, and onecopy's own
//! command line for the same operations.
//!
//! Every command runs under `/usr/bin/time -f "%e %U %S %M"`, which gives its wall time,
//! user and system CPU time and peak resident set size (of the largest process of the
//! command's tree). Before the command is reaped, the lab reads `/proc/PID/io` of
//! `/usr/bin/time`, which by then holds the reads of the whole tree under it (a process adds
//! the I/O of every child it waits for): `rchar`, bytes returned by read system calls of any
//! file, pipe or socket, and `read_bytes`, bytes the tree made the kernel fetch from storage.
//! Each tool keeps all its state in one *home* directory: the repository (`repo/`) and its
//! caches (restic's and rustic's `--cache-dir`, borg's `BORG_BASE_DIR`, bupstash's send log,
//! onecopy's `ONECOPY_CACHE_DIR`), so a home can be copied to try a deletion without
//! disturbing the original. The settings, stated once here and in docs/BENCHMARKS.md:
//!
//! - **restic** (0.14): repository format 2, compression `auto` (zstd at its default level),
//!   its content-defined chunks of 512 KiB to 8 MiB (1 MiB average), SHA-256, AES + Poly1305
//!   (restic cannot store unencrypted; the password comes from `RESTIC_PASSWORD`); it uses as
//!   many threads as cores (`GOMAXPROCS`).
//! - **borg** (1.2): `--compression zstd,3`, its default buzhash chunks (2 MiB average);
//!   `--encryption=repokey` (AES-CTR + HMAC-SHA256, passphrase from `BORG_PASSPHRASE`) or
//!   `none` ([`Encryption`]); borg 1.2 is single-threaded.
//! - **rustic**: restic's repository format written by rustic, its defaults (compression
//!   zstd level 3, restic's chunker), always encrypted, its cache in the home.
//! - **bupstash**: a key made by `bupstash new-key`, always encrypted, its defaults (zstd),
//!   and a send log in the home (`--send-log`, which its manual recommends for incremental
//!   backups); a local repository is written by a `bupstash serve` child process.
//! - **onecopy**: the backup store's defaults (RevDedup, 4 MiB segments, 4 KiB chunks, 32 MiB
//!   containers, zstd level 1 in 256 KiB frames compressed again at level 7 by later backups,
//!   all cores), encrypted with a password (`ONECOPY_PASSWORD`) or
//!   `init --insecure-no-encryption` ([`Encryption`]); `create` reverse-deduplicates the
//!   previous backup and recompresses before it returns (its report separates the phases).
//!
//! Deleting the oldest backup is `restic forget --keep-last N --prune`, `rustic forget
//! --keep-last N --prune`, `borg prune --keep-last N` followed by `borg compact`, `bupstash rm`
//! followed by `bupstash gc`, and `onecopy backup expire --keep-last N` followed by `onecopy
//! backup compact`.

use std::fmt;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use onecopy_core::error::IoContext;
use serde::{Deserialize, Serialize};

use crate::error::{LabError, Result};

/// The program that measures each command.
pub const TIME_PROGRAM: &str = "/usr/bin/time";
/// Password (or passphrase) of every encrypted repository.
const PASSWORD: &str = "onecopy-lab";
/// Host name recorded in restic and rustic snapshots, so that `forget` groups every backup
/// together.
const SNAPSHOT_HOST: &str = "onecopy-lab";
/// The onecopy series the peer comparison backs up.
const ONECOPY_SERIES: &str = "series";

/// A backup tool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tool {
    Onecopy,
    Restic,
    Borg,
    Rustic,
    Bupstash,
}

impl Tool {
    pub const ALL: [Tool; 5] = [
        Tool::Onecopy,
        Tool::Restic,
        Tool::Borg,
        Tool::Rustic,
        Tool::Bupstash,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Tool::Onecopy => "onecopy",
            Tool::Restic => "restic",
            Tool::Borg => "borg",
            Tool::Rustic => "rustic",
            Tool::Bupstash => "bupstash",
        }
    }

    /// The program that runs the tool (onecopy's is given to [`PeerRepository::create`]).
    pub fn program(self) -> &'static str {
        self.name()
    }

    /// How the tool is configured in the comparison (for tables).
    pub fn settings(self, encryption: Encryption) -> String {
        let encrypted = encryption == Encryption::On;
        match self {
            Tool::Onecopy => format!(
                "RevDedup, 4 MiB segments / 4 KiB chunks (gear hash), zstd 1 in 256 KiB frames \
                 (level 7 once a later backup runs), all cores, {}",
                if encrypted {
                    "encrypted (AES-256-GCM)"
                } else {
                    "unencrypted"
                }
            ),
            Tool::Restic => {
                "repository v2, compression auto (zstd), AES, GOMAXPROCS=cores".to_string()
            }
            Tool::Borg => format!(
                "encryption {}, compression zstd,3, single-threaded",
                if encrypted { "repokey" } else { "none" }
            ),
            Tool::Rustic => "defaults (zstd 3), encrypted, cache in the home".to_string(),
            Tool::Bupstash => "defaults (zstd), a key, send log in the home".to_string(),
        }
    }
}

impl fmt::Display for Tool {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.name())
    }
}

impl std::str::FromStr for Tool {
    type Err = LabError;
    fn from_str(text: &str) -> Result<Self> {
        Tool::ALL
            .into_iter()
            .find(|tool| tool.name() == text.to_ascii_lowercase())
            .ok_or_else(|| {
                LabError::InvalidOption(format!(
                    "tool {text:?}: use onecopy, restic, borg, rustic or bupstash"
                ))
            })
    }
}

/// Whether the repositories are encrypted where the tool lets one choose (onecopy and borg;
/// restic, rustic and bupstash always encrypt).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Encryption {
    On,
    Off,
}

/// What `/usr/bin/time` and `/proc/PID/io` measured of one command.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolRun {
    pub seconds: f64,
    pub user_seconds: f64,
    pub system_seconds: f64,
    /// Peak resident set size.
    pub max_rss_bytes: u64,
    /// One-minute load average when the command started.
    pub load_average: f64,
    /// Bytes the command's process tree got from read system calls (`rchar`): files, pipes
    /// and sockets alike.
    #[serde(default)]
    pub read_call_bytes: u64,
    /// Bytes the command's process tree made the kernel read from storage (`read_bytes`).
    #[serde(default)]
    pub storage_read_bytes: u64,
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
            read_call_bytes: self.read_call_bytes + next.read_call_bytes,
            storage_read_bytes: self.storage_read_bytes + next.storage_read_bytes,
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
    pub encryption: Encryption,
    home: PathBuf,
    /// The onecopy executable (used for [`Tool::Onecopy`]).
    onecopy: PathBuf,
}

impl PeerRepository {
    /// Creates the repository of `tool` in `home` (which must not exist).
    pub fn create(
        tool: Tool,
        encryption: Encryption,
        home: &Path,
        onecopy: &Path,
    ) -> Result<(Self, ToolRun)> {
        if home.exists() {
            return Err(LabError::InvalidOption(format!(
                "{} exists; a peer repository starts empty",
                home.display()
            )));
        }
        fs::create_dir_all(home.join("cache"))
            .context_io(|| format!("creating {}", home.display()))?;
        let repository = PeerRepository {
            tool,
            encryption,
            home: home.to_path_buf(),
            onecopy: onecopy.to_path_buf(),
        };
        let repo = repository.repository_path();
        let mut run = ToolRun::default();
        if tool == Tool::Bupstash {
            let mut key = repository.command();
            key.args(["new-key", "-o"]).arg(repository.bupstash_key());
            run = run_timed(&mut key, "bupstash new-key")?.0;
        }
        let mut command = repository.command();
        match (tool, encryption) {
            (Tool::Onecopy, Encryption::On) => command.arg("init"),
            (Tool::Onecopy, Encryption::Off) => command.args(["init", "--insecure-no-encryption"]),
            (Tool::Restic, _) => command.args(["init", "--repository-version", "2"]),
            (Tool::Borg, Encryption::On) => {
                command.args(["init", "--encryption=repokey"]).arg(&repo)
            }
            (Tool::Borg, Encryption::Off) => command.args(["init", "--encryption=none"]).arg(&repo),
            (Tool::Rustic, _) => command.arg("init"),
            (Tool::Bupstash, _) => command.arg("init"),
        };
        let (init, _) = run_timed(&mut command, &format!("{tool} init"))?;
        Ok((repository, run.then(init)))
    }

    /// The tool's version line.
    pub fn version(tool: Tool, onecopy: &Path) -> String {
        let program = match tool {
            Tool::Onecopy => onecopy.as_os_str().to_owned(),
            other => other.program().into(),
        };
        let argument = match tool {
            Tool::Restic | Tool::Bupstash => "version",
            _ => "--version",
        };
        Command::new(program)
            .arg(argument)
            .stdin(Stdio::null())
            .output()
            .ok()
            .filter(|output| output.status.success())
            .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_string())
            .unwrap_or_else(|| "not installed".to_string())
    }

    pub fn repository_path(&self) -> PathBuf {
        self.home.join("repo")
    }

    fn cache_path(&self) -> PathBuf {
        self.home.join("cache")
    }

    fn bupstash_key(&self) -> PathBuf {
        self.home.join("bupstash.key")
    }

    /// A command of the tool with its environment set.
    fn command(&self) -> Command {
        let repo = self.repository_path();
        match self.tool {
            Tool::Onecopy => {
                let mut command = Command::new(&self.onecopy);
                command
                    .arg("--repo")
                    .arg(&repo)
                    .env("ONECOPY_CACHE_DIR", self.cache_path());
                if self.encryption == Encryption::On {
                    command.env("ONECOPY_PASSWORD", PASSWORD);
                }
                command
            }
            Tool::Restic => {
                let mut command = Command::new("restic");
                command
                    .env("RESTIC_PASSWORD", PASSWORD)
                    .env("RESTIC_REPOSITORY", &repo)
                    .env("RESTIC_CACHE_DIR", self.cache_path());
                command
            }
            Tool::Borg => {
                let mut command = Command::new("borg");
                command
                    .env("BORG_BASE_DIR", self.cache_path())
                    .env("BORG_PASSPHRASE", PASSWORD)
                    .env("BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK", "yes")
                    .env("BORG_RELOCATED_REPO_ACCESS_IS_OK", "yes");
                command
            }
            Tool::Rustic => {
                let mut command = Command::new("rustic");
                // The home stands in for the user's: no profile of this machine's user is
                // read, and the cache is the home's.
                command
                    .env("HOME", &self.home)
                    .env("XDG_CONFIG_HOME", self.home.join("config"))
                    .arg("--no-progress")
                    .arg("--repository")
                    .arg(&repo)
                    .arg("--password")
                    .arg(PASSWORD)
                    .arg("--cache-dir")
                    .arg(self.cache_path());
                command
            }
            Tool::Bupstash => {
                let mut command = Command::new("bupstash");
                command
                    .env("HOME", &self.home)
                    .env("XDG_CACHE_HOME", self.cache_path())
                    .env("BUPSTASH_REPOSITORY", &repo)
                    .env("BUPSTASH_KEY", self.bupstash_key());
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
                .args(["backup", "--quiet", "--host", SNAPSHOT_HOST])
                .arg(&source),
            Tool::Borg => command
                .current_dir(parent)
                .args(["create", "--compression", "zstd,3"])
                .arg(format!("{}::{label}", self.repository_path().display()))
                .arg(name),
            Tool::Rustic => command
                .args(["backup", "--host", SNAPSHOT_HOST])
                .arg(&source),
            Tool::Bupstash => command
                .args(["put", "--quiet", "--send-log"])
                .arg(self.cache_path().join("bupstash.sendlog"))
                .arg(format!("name={label}"))
                .arg(&source),
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
        let relative = source.strip_prefix("/").unwrap_or(source);
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
            Tool::Rustic => {
                let snapshot = match which {
                    Which::Newest => "latest".to_string(),
                    Which::Oldest => self.rustic_snapshots()?.remove(0),
                };
                // The snapshot's tree below the backed-up path: the same root as onecopy's.
                command
                    .arg("restore")
                    .arg(format!("{snapshot}:{}", source.display()))
                    .arg(target);
                target.to_path_buf()
            }
            Tool::Bupstash => {
                let items = self.bupstash_items()?;
                let item = match which {
                    Which::Newest => items.last(),
                    Which::Oldest => items.first(),
                }
                .ok_or_else(|| LabError::InvalidOption("bupstash: no item to restore".into()))?;
                command
                    .args(["restore", "--into"])
                    .arg(target)
                    .arg(format!("id={item}"));
                target.to_path_buf()
            }
        };
        let (run, _) = run_timed(&mut command, &format!("{} restore", self.tool))?;
        Ok((run, root))
    }

    /// Deletes the oldest backup, reclaiming its space (onecopy: `backup compact` after the
    /// deletion when `compact` is set, to give back what stays in shared containers); the
    /// steps and their measures.
    pub fn delete_oldest(&self, compact: bool) -> Result<Vec<(String, ToolRun)>> {
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
        let mut step = |name: &str, command: &mut Command| -> Result<()> {
            let what = format!("{} {name}", self.tool);
            steps.push((name.to_string(), run_timed(command, &what)?.0));
            Ok(())
        };
        match self.tool {
            Tool::Onecopy => {
                step(
                    "expire",
                    self.command().args([
                        "backup",
                        "expire",
                        ONECOPY_SERIES,
                        "--keep-last",
                        &keep,
                        "--json",
                    ]),
                )?;
                if compact {
                    step(
                        "compact",
                        self.command().args(["backup", "compact", "--json"]),
                    )?;
                }
            }
            Tool::Restic => step(
                "forget --prune",
                self.command()
                    .args(["forget", "--quiet", "--keep-last", &keep, "--prune"]),
            )?,
            Tool::Rustic => step(
                "forget --prune",
                self.command()
                    .args(["forget", "--keep-last", &keep, "--prune"]),
            )?,
            Tool::Borg => {
                step(
                    "prune",
                    self.command()
                        .args(["prune", "--keep-last", &keep])
                        .arg(&repo),
                )?;
                step("compact", self.command().arg("compact").arg(&repo))?;
            }
            Tool::Bupstash => {
                let oldest = self.bupstash_items()?.remove(0);
                step("rm", self.command().arg("rm").arg(format!("id={oldest}")))?;
                step("gc", self.command().arg("gc"))?;
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
            Tool::Rustic => self.rustic_snapshots()?.len(),
            Tool::Bupstash => self.bupstash_items()?.len(),
        })
    }

    /// Bytes of every file of the repository (caches and onecopy's space reserve excluded).
    pub fn repository_bytes(&self) -> Result<u64> {
        super::files::repository_bytes(&self.repository_path())
    }

    /// Bytes of the tool's caches on this machine (kept between commands, not part of the
    /// repository).
    pub fn cache_bytes(&self) -> Result<u64> {
        super::files::directory_bytes(&self.cache_path())
    }

    /// Copies the whole home (repository and caches) to `home`.
    pub fn copy_to(&self, home: &Path) -> Result<PeerRepository> {
        super::files::copy_tree(&self.home, home)?;
        Ok(PeerRepository {
            tool: self.tool,
            encryption: self.encryption,
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
        Ok(snapshot_ids(listing.as_array().into_iter().flatten()))
    }

    /// Snapshot ids, oldest first. rustic groups its snapshots (by host and paths): each
    /// group is `[group, [snapshot...]]` or `{"group_key": ..., "snapshots": [...]}`.
    fn rustic_snapshots(&self) -> Result<Vec<String>> {
        let mut command = self.command();
        command.args(["snapshots", "--json"]);
        let stdout = run_plain(&mut command, "rustic snapshots")?;
        let listing: serde_json::Value = parse_json(&stdout, "rustic snapshots --json")?;
        Ok(snapshot_ids(rustic_snapshot_list(&listing)))
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

    /// Item ids, oldest first.
    fn bupstash_items(&self) -> Result<Vec<String>> {
        let mut command = self.command();
        command.args(["list", "--format=jsonl1"]);
        let stdout = run_plain(&mut command, "bupstash list")?;
        bupstash_item_ids(&stdout)
    }
}

/// The snapshots of `rustic snapshots --json`, whichever of its two group shapes it prints.
fn rustic_snapshot_list(listing: &serde_json::Value) -> Vec<&serde_json::Value> {
    let mut snapshots = Vec::new();
    for group in listing.as_array().into_iter().flatten() {
        let members = match group {
            serde_json::Value::Array(pair) => pair.get(1),
            serde_json::Value::Object(fields) => fields.get("snapshots"),
            _ => None,
        };
        snapshots.extend(
            members
                .and_then(|members| members.as_array())
                .into_iter()
                .flatten(),
        );
    }
    snapshots
}

/// Ids of restic-format snapshots, oldest first (by their `time`).
fn snapshot_ids<'a>(snapshots: impl IntoIterator<Item = &'a serde_json::Value>) -> Vec<String> {
    let mut listed: Vec<(String, String)> = snapshots
        .into_iter()
        .filter_map(|snapshot| {
            Some((
                snapshot["time"].as_str()?.to_string(),
                snapshot["id"].as_str()?.to_string(),
            ))
        })
        .collect();
    listed.sort();
    listed.into_iter().map(|(_, id)| id).collect()
}

/// Ids of `bupstash list --format=jsonl1` (one JSON object per line), oldest first (by their
/// `unix_timestamp_millis`).
fn bupstash_item_ids(text: &str) -> Result<Vec<String>> {
    let mut items = Vec::new();
    for line in text.lines().filter(|line| !line.trim().is_empty()) {
        let item = parse_json(line, "bupstash list --format=jsonl1")?;
        let id = item["id"].as_str().ok_or_else(|| LabError::Command {
            command: "bupstash list --format=jsonl1".into(),
            detail: format!("an item without an id: {line}"),
        })?;
        let time = item["unix_timestamp_millis"].as_u64().unwrap_or(0);
        items.push((time, id.to_string()));
    }
    items.sort();
    Ok(items.into_iter().map(|(_, id)| id).collect())
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

/// Runs `command` under `/usr/bin/time`; returns its measures and standard output. The
/// reads of the command's process tree come from `/proc/PID/io` of `/usr/bin/time` after it
/// exited and before it is reaped (module documentation).
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
    timed
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let load_average = crate::results::load_average();
    let started = std::time::Instant::now();
    let mut child = timed.spawn().map_err(|error| LabError::Command {
        command: what.to_string(),
        detail: format!("{error} (is {TIME_PROGRAM} installed? see scripts/setup.sh)"),
    })?;
    let mut stderr_pipe = child.stderr.take().expect("standard error is piped");
    let stderr_reader = std::thread::spawn(move || {
        let mut text = Vec::new();
        let _ = stderr_pipe.read_to_end(&mut text);
        text
    });
    let mut stdout = Vec::new();
    child
        .stdout
        .take()
        .expect("standard output is piped")
        .read_to_end(&mut stdout)
        .context_io(|| format!("reading the output of {what}"))?;
    let io = exited_process_io(child.id())
        .context_io(|| format!("reading /proc/{}/io of {what}", child.id()))?;
    let status = child.wait().context_io(|| format!("waiting for {what}"))?;
    // /usr/bin/time reports wall time in hundredths of a second; ours has microseconds.
    let seconds = started.elapsed().as_secs_f64();
    let stderr = stderr_reader.join().unwrap_or_default();
    if !status.success() {
        return Err(LabError::Command {
            command: what.to_string(),
            detail: format!("{status}: {}", String::from_utf8_lossy(&stderr).trim()),
        });
    }
    let text =
        fs::read_to_string(measures.path()).context_io(|| "reading /usr/bin/time's output")?;
    let mut run = parse_time_output(&text).ok_or_else(|| LabError::Command {
        command: what.to_string(),
        detail: format!("unexpected /usr/bin/time output {text:?}"),
    })?;
    run.load_average = load_average;
    run.seconds = seconds;
    run.read_call_bytes = io.read_call_bytes;
    run.storage_read_bytes = io.storage_read_bytes;
    Ok((run, String::from_utf8_lossy(&stdout).into_owned()))
}

/// The read counters of a process tree.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessReads {
    pub read_call_bytes: u64,
    pub storage_read_bytes: u64,
}

/// Waits until the child `pid` has exited without reaping it, then reads its
/// `/proc/PID/io`: a zombie keeps its counters, which include those of every child it
/// reaped, until its parent reaps it.
fn exited_process_io(pid: u32) -> std::io::Result<ProcessReads> {
    loop {
        // SAFETY: siginfo_t is plain data that waitid fills; the pid is our own child,
        // which WNOWAIT leaves unreaped for Child::wait.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let status = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if status == 0 {
            break;
        }
        let error = std::io::Error::last_os_error();
        if error.kind() != std::io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
    let text = fs::read_to_string(format!("/proc/{pid}/io"))?;
    parse_process_io(&text).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("unexpected /proc/PID/io content {text:?}"),
        )
    })
}

/// Parses `rchar` and `read_bytes` of a `/proc/PID/io` text.
pub fn parse_process_io(text: &str) -> Option<ProcessReads> {
    let field = |name: &str| -> Option<u64> {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))?
            .trim()
            .parse()
            .ok()
    };
    Some(ProcessReads {
        read_call_bytes: field("rchar")?,
        storage_read_bytes: field("read_bytes")?,
    })
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
        ..ToolRun::default()
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

    /// Goal: restic and borg each back up, restore byte-exact and delete their oldest backup,
    /// and report their reads; method: two small versions of a tree through restic and borg,
    /// encrypted and not (fails, naming what to install, when one is missing).
    #[test]
    fn peers_round_trip() {
        let directory = tempfile::tempdir().expect("temporary directory");
        let parent = directory.path().join("stage");
        let source = parent.join("tree");
        fs::create_dir_all(&source).expect("directory");
        for (tool, encryption) in [
            (Tool::Restic, Encryption::On),
            (Tool::Borg, Encryption::On),
            (Tool::Borg, Encryption::Off),
        ] {
            assert_ne!(
                PeerRepository::version(tool, Path::new("onecopy")),
                "not installed",
                "{tool} is not installed: run scripts/setup.sh, which installs restic and borg"
            );
            let home = directory.path().join(format!("{tool}-{encryption:?}"));
            let (repository, _) =
                PeerRepository::create(tool, encryption, &home, Path::new("onecopy"))
                    .expect("init");
            fs::write(source.join("file"), b"first version").expect("file");
            let (first, _) = repository.backup(&parent, "tree", "v1").expect("backup");
            assert!(first.read_call_bytes > 0, "{tool} read its tree");
            fs::write(source.join("file"), b"second version").expect("file");
            repository.backup(&parent, "tree", "v2").expect("backup");
            assert_eq!(repository.backup_count().expect("count"), 2);
            let target = directory
                .path()
                .join(format!("{tool}-{encryption:?}-restore"));
            let (run, root) = repository
                .restore(Which::Newest, &source, &target)
                .expect("restore");
            assert!(run.max_rss_bytes > 0);
            assert_eq!(compare_trees(&source, &root).expect("compare"), None);
            let steps = repository.delete_oldest(true).expect("delete");
            assert!(!steps.is_empty());
            assert_eq!(repository.backup_count().expect("count"), 1);
        }
    }

    /// Goal: the read counters of a process come from /proc/PID/io, and a command's tree is
    /// measured after it exits; method: a known text, then `cat` of a file of known size
    /// twice under /usr/bin/time.
    #[test]
    fn process_reads_are_measured() {
        let text = "rchar: 37681608\nwchar: 1\nsyscr: 326\nsyscw: 292\nread_bytes: \
                    1581056\nwrite_bytes: 8192\ncancelled_write_bytes: 0\n";
        assert_eq!(
            parse_process_io(text),
            Some(ProcessReads {
                read_call_bytes: 37681608,
                storage_read_bytes: 1581056
            })
        );
        assert_eq!(parse_process_io("rchar: 1\n"), None);
        let directory = tempfile::tempdir().expect("temporary directory");
        let file = directory.path().join("data");
        fs::write(&file, vec![7u8; 1 << 20]).expect("file");
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(format!("cat {0} >/dev/null; cat {0}", file.display()));
        let (run, stdout) = run_timed(&mut command, "cat twice").expect("runs");
        assert_eq!(stdout.len(), 1 << 20);
        // Both cats' reads, counted in the tree, and a little for loading the programs.
        assert!(run.read_call_bytes >= 2 << 20, "{run:?}");
        assert!(run.read_call_bytes < (2 << 20) + (1 << 20), "{run:?}");
        let mut failing = Command::new("sh");
        failing.args(["-c", "echo broken >&2; exit 3"]);
        let error = run_timed(&mut failing, "failing").expect_err("fails");
        assert!(error.to_string().contains("broken"), "{error}");
    }

    /// Goal: the listings of rustic and bupstash give their backups oldest first; method:
    /// both of rustic's group shapes and bupstash lines out of order.
    #[test]
    fn listings_parse_oldest_first() {
        let snapshot = |time: &str, id: &str| serde_json::json!({"time": time, "id": id});
        let pairs = serde_json::json!([[
            {"hostname": "h"},
            [snapshot("2026-01-02T00:00:00Z", "b"), snapshot("2026-01-01T00:00:00Z", "a")]
        ]]);
        assert_eq!(snapshot_ids(rustic_snapshot_list(&pairs)), ["a", "b"]);
        let objects = serde_json::json!([{
            "group_key": {"hostname": "h"},
            "snapshots": [snapshot("2026-01-03T00:00:00Z", "c"), snapshot("2026-01-01T00:00:00Z", "a")]
        }]);
        assert_eq!(snapshot_ids(rustic_snapshot_list(&objects)), ["a", "c"]);
        let lines = "{\"id\":\"y\",\"unix_timestamp_millis\":20}\n\
                     {\"id\":\"x\",\"unix_timestamp_millis\":10}\n";
        assert_eq!(bupstash_item_ids(lines).expect("parses"), ["x", "y"]);
        assert!(bupstash_item_ids("{\"name\":\"no id\"}").is_err());
        assert_eq!("Rustic".parse::<Tool>().expect("parses"), Tool::Rustic);
        assert!("bup".parse::<Tool>().is_err());
    }
}
