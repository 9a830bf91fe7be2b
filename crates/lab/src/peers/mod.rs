//! The backup store against restic, borg, rustic and bupstash on real series, in one run
//! (`onecopy lab peers`): the harness that judges issue 21's goals.
//!
//! # Datasets
//!
//! - **typescript** ([`crate::paper2::typescript`]): successive nightly builds of the npm
//!   package, unpacked, as paper 2's experiment uses them (the same cache).
//! - **debian** ([`debian`]): /usr of a Debian root made by debootstrap, after real dpkg
//!   changes in a chroot (packages installed, upgraded, removed).
//!
//! Each dataset is made once into the cache directory and reused by later runs.
//!
//! # Method, per dataset
//!
//! Every tool runs on the same data in the same machine state: the page cache warm for all
//! (the staged tree and the tool's home are read just before each timed command) and no
//! dirty page left from the command before (`sync`), each
//! tool's own caches kept between its commands as the tool documents them (restic's and
//! rustic's caches and parent snapshots, borg's files and chunks caches, bupstash's send log,
//! onecopy's files cache), encryption on for every tool ([`Encryption::On`]).
//!
//! 1. Each snapshot in turn is staged into one directory (`<work>/stage/<name>`) with `rsync
//!    -aH --delete --checksum`: files whose content did not change keep their inode, size,
//!    times and ctime, as on a real system between two backups, so the tools' files caches
//!    work as they would there; changed files are new inodes.
//! 2. Every tool backs the stage up, in an order rotated at every snapshot so that no tool
//!    always runs first; the repository's bytes are read after each backup. After the first
//!    snapshot, [`PeersOptions::rounds`] less one more rounds of backing it up into a new,
//!    empty repository each, so that the first backup has rounds like the commands below.
//! 3. Then [`PeersOptions::rounds`] rounds: every tool backs up the unchanged stage once per
//!    round (the time and the reads of its process tree, [`crate::paper2::peers`]).
//! 4. Then as many rounds of restoring the newest backup into an empty directory; the first
//!    restore of each tool is compared with the stage file by file.
//! 5. Finally every tool deletes its oldest backup with what reclaims its space (restic and
//!    rustic `forget --prune`, borg `prune` + `compact`, bupstash `rm` + `gc`, onecopy
//!    `backup expire` + `backup compact`); the repository's bytes before and after.
//!
//! Every command runs under `/usr/bin/time`, which gives wall and CPU time and peak memory.
//! [`report`] turns the measures into CSV tables, a markdown summary with the goals
//! and a figure.

pub mod debian;
pub mod report;

use std::fmt;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use onecopy_core::error::IoContext;
use serde::{Deserialize, Serialize};

use crate::error::{LabError, Result};
use crate::paper2::files::compare_trees;
use crate::paper2::peers::{run_plain, Encryption, PeerRepository, Tool, ToolRun, Which};
use crate::paper2::typescript;
use crate::results::{remove_directory_if_present, HostSnapshot};

/// A dataset of the comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PeerDataset {
    Typescript,
    Debian,
}

impl PeerDataset {
    pub const ALL: [PeerDataset; 2] = [PeerDataset::Typescript, PeerDataset::Debian];

    pub fn name(self) -> &'static str {
        match self {
            PeerDataset::Typescript => "typescript",
            PeerDataset::Debian => "debian",
        }
    }

    /// Name of the staged directory every tool backs up.
    fn stage_name(self) -> &'static str {
        match self {
            PeerDataset::Typescript => "typescript",
            PeerDataset::Debian => "usr",
        }
    }
}

impl fmt::Display for PeerDataset {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.name())
    }
}

impl std::str::FromStr for PeerDataset {
    type Err = LabError;
    fn from_str(text: &str) -> Result<Self> {
        PeerDataset::ALL
            .into_iter()
            .find(|dataset| dataset.name() == text.to_ascii_lowercase())
            .ok_or_else(|| {
                LabError::InvalidOption(format!("dataset {text:?}: use typescript or debian"))
            })
    }
}

/// Options of a run.
#[derive(Clone, Debug)]
pub struct PeersOptions {
    pub output_directory: PathBuf,
    /// Where repositories and the stage are made (removed at the end).
    pub work_directory: PathBuf,
    /// Where restores are made (a tmpfs by default): on a disk's file system a restore's
    /// time is the file system's more than the tool's, since it allocates thousands of
    /// inodes moments after the previous restore freed as many (docs/BENCHMARKS.md).
    pub restore_directory: PathBuf,
    /// Where the datasets are kept between runs.
    pub cache_directory: PathBuf,
    pub datasets: Vec<PeerDataset>,
    pub tools: Vec<Tool>,
    /// The onecopy executable (the running one).
    pub onecopy_executable: PathBuf,
    /// Typescript releases and the prefix of their versions.
    pub releases: usize,
    pub release_prefix: String,
    /// Debian suite and mirror of the system tree.
    pub debian_suite: String,
    pub debian_mirror: String,
    /// First backups, unchanged backups and restores of every tool.
    pub rounds: u32,
    /// Run `cargo install` for rustic and bupstash when they are missing.
    pub install_missing: bool,
}

/// One tool's version and settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolInfo {
    pub tool: Tool,
    pub version: String,
    pub settings: String,
}

/// One snapshot of a dataset.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SnapshotInfo {
    pub name: String,
    pub logical_bytes: u64,
    pub files: u64,
    /// What changed since the snapshot before, where the dataset records it (Debian: the
    /// packages added, removed and upgraded).
    #[serde(default)]
    pub changes: String,
}

/// What a backup backed up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackupKind {
    /// A snapshot of the series (the first one or a changed one).
    Series,
    /// The first snapshot again, into an empty repository of its own: the rounds of the
    /// first backup after the series' own.
    First,
    /// The last snapshot again, untouched since the previous backup.
    Unchanged,
}

/// One backup by one tool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BackupRun {
    pub tool: Tool,
    pub kind: BackupKind,
    /// Snapshot (1-based) for series backups, round (1-based) for the others (the series'
    /// first backup is round 1 of the first backups).
    pub number: u32,
    pub run: ToolRun,
    /// onecopy only: seconds of `create` spent reverse-deduplicating the previous backup.
    pub reverse_seconds: f64,
    pub repository_bytes: u64,
    pub cache_bytes: u64,
}

/// One restore of the newest backup.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RestoreRun {
    pub tool: Tool,
    pub round: u32,
    pub run: ToolRun,
}

/// The deletion of the oldest backup.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeletionRun {
    pub tool: Tool,
    pub backups_before: u32,
    pub steps: Vec<(String, ToolRun)>,
    pub total: ToolRun,
    pub repository_bytes_before: u64,
    pub repository_bytes_after: u64,
}

impl DeletionRun {
    pub fn reclaimed_bytes(&self) -> i64 {
        self.repository_bytes_before as i64 - self.repository_bytes_after as i64
    }
}

/// Everything measured on one dataset.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DatasetResults {
    pub dataset: PeerDataset,
    pub snapshots: Vec<SnapshotInfo>,
    pub backups: Vec<BackupRun>,
    pub restores: Vec<RestoreRun>,
    pub deletions: Vec<DeletionRun>,
}

/// Everything a run measured (`results.json`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PeersResults {
    pub tools: Vec<ToolInfo>,
    pub encryption: Encryption,
    pub rounds: u32,
    pub host_before: HostSnapshot,
    pub host_after: HostSnapshot,
    pub datasets: Vec<DatasetResults>,
    pub seconds: f64,
    /// Where the restores were made.
    pub restore_directory: PathBuf,
}

/// How rustic and bupstash are installed when missing (neither is packaged by Debian).
pub fn install_command(tool: Tool) -> Option<&'static str> {
    match tool {
        Tool::Rustic => Some("rustic-rs"),
        Tool::Bupstash => Some("bupstash"),
        _ => None,
    }
}

/// Runs the comparison and writes its outputs; returns the files written. `log` receives
/// progress lines.
pub fn run_experiment(options: &PeersOptions, log: &mut dyn FnMut(&str)) -> Result<Vec<PathBuf>> {
    let started = std::time::Instant::now();
    if options.datasets.is_empty() || options.tools.is_empty() {
        return Err(LabError::InvalidOption(
            "give at least one dataset and one tool".into(),
        ));
    }
    if options.rounds == 0 {
        return Err(LabError::InvalidOption("--rounds: give 1 or more".into()));
    }
    for program in [crate::paper2::peers::TIME_PROGRAM, "rsync"] {
        if run_plain(Command::new(program).arg("--version"), program).is_err() {
            return Err(LabError::Missing(format!(
                "{program} is missing: install the `time` and `rsync` packages (scripts/setup.sh)"
            )));
        }
    }
    let mut tools = Vec::new();
    for &tool in &options.tools {
        let mut version = PeerRepository::version(tool, &options.onecopy_executable);
        if version == "not installed" {
            match install_command(tool) {
                Some(package) if options.install_missing => {
                    log(&format!(
                        "{tool} is missing: cargo install {package} --locked (tens of minutes \
                         on two cores)"
                    ));
                    run_plain(
                        Command::new("cargo").args(["install", package, "--locked"]),
                        &format!("cargo install {package} --locked"),
                    )?;
                    version = PeerRepository::version(tool, &options.onecopy_executable);
                }
                Some(package) => {
                    return Err(LabError::Missing(format!(
                        "{tool} is missing: `cargo install {package} --locked`, or leave it out \
                         with --tools"
                    )))
                }
                None => {
                    return Err(LabError::Missing(format!(
                        "{tool} is missing: scripts/setup.sh installs it"
                    )))
                }
            }
        }
        tools.push(ToolInfo {
            tool,
            version,
            settings: tool.settings(Encryption::On),
        });
    }
    let work = options
        .work_directory
        .join(format!("onecopy-peers-{}", std::process::id()));
    fs::create_dir_all(&work).context_io(|| format!("creating {}", work.display()))?;
    let host_before = HostSnapshot::take();
    let mut datasets = Vec::new();
    for &dataset in &options.datasets {
        let snapshots = prepare_dataset(dataset, options, log)?;
        log(&format!(
            "{dataset}: {} snapshots, tools {}",
            snapshots.len(),
            options
                .tools
                .iter()
                .map(|tool| tool.name())
                .collect::<Vec<_>>()
                .join(", ")
        ));
        datasets.push(run_dataset(
            dataset,
            &snapshots,
            options,
            &work.join(dataset.name()),
            log,
        )?);
    }
    remove_directory_if_present(&work)?;
    let results = PeersResults {
        tools,
        encryption: Encryption::On,
        rounds: options.rounds,
        host_before,
        host_after: HostSnapshot::take(),
        datasets,
        seconds: started.elapsed().as_secs_f64(),
        restore_directory: options.restore_directory.clone(),
    };
    report::write_outputs(&options.output_directory, &results)
}

/// One snapshot of a dataset on disk.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub name: String,
    pub tree: PathBuf,
    /// What changed since the snapshot before (empty when the dataset does not say).
    pub changes: String,
}

/// The snapshots of `dataset`, made in the cache when missing.
pub fn prepare_dataset(
    dataset: PeerDataset,
    options: &PeersOptions,
    log: &mut dyn FnMut(&str),
) -> Result<Vec<Snapshot>> {
    Ok(match dataset {
        PeerDataset::Typescript => typescript::prepare(
            &options.cache_directory,
            &options.release_prefix,
            options.releases,
            log,
        )?
        .into_iter()
        .map(|release| Snapshot {
            name: release.version,
            tree: release.tree,
            changes: String::new(),
        })
        .collect(),
        PeerDataset::Debian => debian::prepare(
            &options.cache_directory,
            &options.debian_suite,
            &options.debian_mirror,
            log,
        )?,
    })
}

/// `tools` rotated left by `offset`: the order of one step.
fn rotated(tools: &[Tool], offset: usize) -> Vec<Tool> {
    let mut order = tools.to_vec();
    if !order.is_empty() {
        let shift = offset % order.len();
        order.rotate_left(shift);
    }
    order
}

/// Runs every tool on the snapshots of one dataset in `work` (removed at the end).
fn run_dataset(
    dataset: PeerDataset,
    snapshots: &[Snapshot],
    options: &PeersOptions,
    work: &Path,
    log: &mut dyn FnMut(&str),
) -> Result<DatasetResults> {
    assert!(!snapshots.is_empty(), "a dataset has snapshots");
    remove_directory_if_present(work)?;
    let stage_parent = work.join("stage");
    let stage = stage_parent.join(dataset.stage_name());
    fs::create_dir_all(&stage_parent)
        .context_io(|| format!("creating {}", stage_parent.display()))?;
    let mut results = DatasetResults {
        dataset,
        snapshots: Vec::new(),
        backups: Vec::new(),
        restores: Vec::new(),
        deletions: Vec::new(),
    };
    let mut repositories = Vec::new();
    for &tool in &options.tools {
        let (repository, _) = PeerRepository::create(
            tool,
            Encryption::On,
            &work.join(format!("home-{tool}")),
            &options.onecopy_executable,
        )?;
        repositories.push(repository);
    }
    let repository = |tool: Tool| -> &PeerRepository {
        repositories
            .iter()
            .find(|repository| repository.tool == tool)
            .expect("every tool has a repository")
    };
    for (index, snapshot) in snapshots.iter().enumerate() {
        stage_snapshot(&snapshot.tree, &stage)?;
        let (logical_bytes, files) = tree_size(&stage)?;
        results.snapshots.push(SnapshotInfo {
            name: snapshot.name.clone(),
            logical_bytes,
            files,
            changes: snapshot.changes.clone(),
        });
        let mut line = Vec::new();
        for tool in rotated(&options.tools, index) {
            let repository = repository(tool);
            let measured = backup(
                repository,
                &stage,
                BackupKind::Series,
                index as u32 + 1,
                &format!("v{:03}", index + 1),
            )?;
            line.push(format!("{tool} {:.2}s", measured.run.seconds));
            results.backups.push(measured);
        }
        log(&format!(
            "{dataset} {} ({}/{}, {:.1} MiB): backups {}",
            snapshot.name,
            index + 1,
            snapshots.len(),
            logical_bytes as f64 / 1048576.0,
            line.join(", ")
        ));
        if index == 0 {
            first_backup_rounds(dataset, options, &stage, work, &mut results, log)?;
        }
    }
    for round in 1..=options.rounds {
        let mut line = Vec::new();
        for tool in rotated(&options.tools, round as usize) {
            let measured = backup(
                repository(tool),
                &stage,
                BackupKind::Unchanged,
                round,
                &format!("unchanged{round}"),
            )?;
            line.push(format!(
                "{tool} {:.2}s {:.1} MiB read",
                measured.run.seconds,
                measured.run.read_call_bytes as f64 / 1048576.0
            ));
            results.backups.push(measured);
        }
        log(&format!(
            "{dataset} unchanged ({round}/{}): {}",
            options.rounds,
            line.join(", ")
        ));
    }
    let target = options
        .restore_directory
        .join(format!("onecopy-peers-restore-{}", std::process::id()));
    for round in 1..=options.rounds {
        let mut line = Vec::new();
        for tool in rotated(&options.tools, round as usize) {
            let repository = repository(tool);
            remove_directory_if_present(&target)?;
            settle(&[&repository_home(repository)])?;
            let (run, root) = repository.restore(Which::Newest, &stage, &target)?;
            if round == 1 {
                if let Some(difference) = compare_trees(&stage, &root)? {
                    return Err(LabError::Command {
                        command: format!("{tool} restore"),
                        detail: format!("the restored tree differs from the stage: {difference}"),
                    });
                }
            }
            remove_directory_if_present(&target)?;
            line.push(format!("{tool} {:.2}s", run.seconds));
            results.restores.push(RestoreRun { tool, round, run });
        }
        log(&format!(
            "{dataset} restore of the newest ({round}/{}): {}",
            options.rounds,
            line.join(", ")
        ));
    }
    let mut line = Vec::new();
    for repository in &repositories {
        let backups_before = repository.backup_count()? as u32;
        let repository_bytes_before = repository.repository_bytes()?;
        settle(&[&repository_home(repository)])?;
        let steps = repository.delete_oldest(true)?;
        let total = steps
            .iter()
            .map(|(_, run)| *run)
            .reduce(ToolRun::then)
            .expect("a deletion has a step");
        let deletion = DeletionRun {
            tool: repository.tool,
            backups_before,
            steps,
            total,
            repository_bytes_before,
            repository_bytes_after: repository.repository_bytes()?,
        };
        line.push(format!(
            "{} {:.2}s {:.1} MiB",
            repository.tool,
            total.seconds,
            deletion.reclaimed_bytes() as f64 / 1048576.0
        ));
        results.deletions.push(deletion);
    }
    log(&format!(
        "{dataset} deletion of the oldest (time, reclaimed): {}",
        line.join(", ")
    ));
    for repository in repositories {
        repository.destroy()?;
    }
    remove_directory_if_present(work)?;
    Ok(results)
}

/// Rounds 2 and on of the first backup (the series' own is round 1): each tool backs the
/// first snapshot up again into an empty repository made as its series' was, so that the
/// first backup is compared per round, like the other repeated commands, rather than on one
/// timing of each tool.
fn first_backup_rounds(
    dataset: PeerDataset,
    options: &PeersOptions,
    stage: &Path,
    work: &Path,
    results: &mut DatasetResults,
    log: &mut dyn FnMut(&str),
) -> Result<()> {
    for round in 2..=options.rounds {
        let mut line = Vec::new();
        for tool in rotated(&options.tools, round as usize) {
            let (repository, _) = PeerRepository::create(
                tool,
                Encryption::On,
                &work.join(format!("first-{tool}")),
                &options.onecopy_executable,
            )?;
            let measured = backup(&repository, stage, BackupKind::First, round, "v001")?;
            repository.destroy()?;
            line.push(format!("{tool} {:.2}s", measured.run.seconds));
            results.backups.push(measured);
        }
        log(&format!(
            "{dataset} first backup again ({round}/{}): {}",
            options.rounds,
            line.join(", ")
        ));
    }
    Ok(())
}

/// The home directory of a repository (its parent).
fn repository_home(repository: &PeerRepository) -> PathBuf {
    repository
        .repository_path()
        .parent()
        .expect("a repository lies in its home")
        .to_path_buf()
}

/// One timed backup of the stage, with the page cache warm for the stage and the tool's
/// home.
fn backup(
    repository: &PeerRepository,
    stage: &Path,
    kind: BackupKind,
    number: u32,
    label: &str,
) -> Result<BackupRun> {
    settle(&[stage, &repository_home(repository)])?;
    let parent = stage.parent().expect("the stage has a parent");
    let name = stage
        .file_name()
        .and_then(|name| name.to_str())
        .expect("the stage has a name");
    let (run, reverse_seconds) = repository.backup(parent, name, label)?;
    Ok(BackupRun {
        tool: repository.tool,
        kind,
        number,
        run,
        reverse_seconds,
        repository_bytes: repository.repository_bytes()?,
        cache_bytes: repository.cache_bytes()?,
    })
}

/// Makes `stage` hold exactly the tree `source`, rewriting only the files whose content
/// differs (module documentation, step 1).
pub fn stage_snapshot(source: &Path, stage: &Path) -> Result<()> {
    fs::create_dir_all(stage).context_io(|| format!("creating {}", stage.display()))?;
    let mut from = source.as_os_str().to_owned();
    from.push("/");
    let mut to = stage.as_os_str().to_owned();
    to.push("/");
    run_plain(
        Command::new("rsync")
            .args(["-aH", "--delete", "--checksum"])
            .arg(from)
            .arg(to),
        "rsync (staging a snapshot)",
    )?;
    Ok(())
}

/// Bytes and count of the regular files under `directory`.
pub fn tree_size(directory: &Path) -> Result<(u64, u64)> {
    let mut bytes = 0;
    let mut files = 0;
    walk_files(directory, &mut |_, metadata| {
        bytes += metadata.len();
        files += 1;
        Ok(())
    })?;
    Ok((bytes, files))
}

/// Puts the machine in the state every timed command starts from: the page cache holds
/// `directories` (each read once) and no dirty page is left for writeback, so that a
/// command does not pay for what the one before it wrote (a restore leaves hundreds of MiB).
fn settle(directories: &[&Path]) -> Result<()> {
    for directory in directories {
        warm_tree(directory)?;
    }
    // SAFETY: sync takes no argument and cannot fail.
    unsafe { libc::sync() };
    Ok(())
}

/// Reads every regular file under `directory` once, so that the command timed next finds
/// them in the page cache.
pub fn warm_tree(directory: &Path) -> Result<()> {
    let mut buffer = vec![0u8; 1 << 20];
    walk_files(directory, &mut |path, _| {
        let mut file = fs::File::open(path).context_io(|| format!("opening {}", path.display()))?;
        while file
            .read(&mut buffer)
            .context_io(|| format!("reading {}", path.display()))?
            > 0
        {}
        Ok(())
    })
}

/// Calls `visit` for every regular file under `directory` (symbolic links not followed).
fn walk_files(
    directory: &Path,
    visit: &mut dyn FnMut(&Path, &fs::Metadata) -> Result<()>,
) -> Result<()> {
    let entries =
        fs::read_dir(directory).context_io(|| format!("listing {}", directory.display()))?;
    for entry in entries {
        let entry = entry.context_io(|| format!("listing {}", directory.display()))?;
        let path = entry.path();
        let metadata =
            fs::symlink_metadata(&path).context_io(|| format!("inspecting {}", path.display()))?;
        if metadata.is_dir() {
            walk_files(&path, visit)?;
        } else if metadata.is_file() {
            visit(&path, &metadata)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: staging keeps the inode of a file whose content did not change and replaces
    /// the others, so the tools' files caches see what a real system shows them; method:
    /// stage one tree, then a second with one file changed to the same size and mtime, one
    /// removed and one added.
    #[test]
    fn staging_keeps_unchanged_files() {
        use std::os::unix::fs::MetadataExt;
        let directory = tempfile::tempdir().expect("temporary directory");
        let first = directory.path().join("first");
        let second = directory.path().join("second");
        for tree in [&first, &second] {
            fs::create_dir_all(tree.join("sub")).expect("directory");
            fs::write(tree.join("same"), b"unchanged").expect("file");
        }
        fs::write(first.join("sub/changed"), b"aaaa").expect("file");
        fs::write(second.join("sub/changed"), b"bbbb").expect("file");
        fs::write(first.join("gone"), b"x").expect("file");
        fs::write(second.join("new"), b"y").expect("file");
        // Same mtime on both sides, as npm tarballs give every file.
        for tree in [&first, &second] {
            run_plain(
                Command::new("touch")
                    .args(["-d", "1985-10-26 08:15"])
                    .arg(tree.join("same"))
                    .arg(tree.join("sub/changed")),
                "touch",
            )
            .expect("touch");
        }
        let stage = directory.path().join("stage/tree");
        stage_snapshot(&first, &stage).expect("stage");
        assert_eq!(compare_trees(&first, &stage).expect("compare"), None);
        let inode = |path: &Path| fs::metadata(path).expect("metadata").ino();
        let (same, changed) = (
            inode(&stage.join("same")),
            inode(&stage.join("sub/changed")),
        );
        stage_snapshot(&second, &stage).expect("stage");
        assert_eq!(compare_trees(&second, &stage).expect("compare"), None);
        assert_eq!(inode(&stage.join("same")), same);
        assert_ne!(inode(&stage.join("sub/changed")), changed);
        assert_eq!(tree_size(&stage).expect("size"), (9 + 4 + 1, 3));
        warm_tree(&stage).expect("warm");
    }

    /// Goal: every step runs the tools in a rotated order and names parse; method: three
    /// tools over four offsets, and the dataset names.
    #[test]
    fn orders_rotate_and_names_parse() {
        let tools = [Tool::Onecopy, Tool::Restic, Tool::Borg];
        assert_eq!(rotated(&tools, 0), tools);
        assert_eq!(
            rotated(&tools, 1),
            [Tool::Restic, Tool::Borg, Tool::Onecopy]
        );
        assert_eq!(rotated(&tools, 3), tools);
        for dataset in PeerDataset::ALL {
            assert_eq!(
                dataset.name().parse::<PeerDataset>().expect("parses"),
                dataset
            );
        }
        assert!("ubuntu".parse::<PeerDataset>().is_err());
    }
}
