//! Fig. 15: what the I/O monitor costs whole programs (the paper: tar, untar, grep and cp
//! of the Linux 2.6.24 sources, under 7% slower).
//!
//! The tree is a real source tree of this machine, `/usr/include` (C headers), or the first
//! files of it up to a byte budget. It is archived once outside the mount. Two file systems
//! of the face are mounted, one as usual and one with `no_monitor`; on each, in turn, a
//! round runs
//!
//! 1. **untar**: `tar xf` of the archive into the mount;
//! 2. **tar**: `tar cf` of that tree into an archive on the mount;
//! 3. **grep**: `grep -r` of a string that occurs nowhere (every byte is read);
//! 4. **cp**: `cp -r` of the tree to a new directory of the mount;
//!
//! each followed by `syncfs`, so that written data reached the engine. Each program runs on
//! both mounts back to back, the first alternating, so that drift of a shared machine hits
//! both; the median of the rounds is reported, in elapsed seconds and in CPU seconds of the
//! file system (its request threads run in this process).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use serde::Serialize;

use onecopy_fs::mount::MountOptions;
use onecopy_fs::FsOptions;

use super::bed::MountedFs;
use crate::error::{LabError, Result};
use crate::mount::{require_program, sync_file_system};

/// The tree the programs work on.
pub const SOURCE_TREE: &str = "/usr/include";
/// The programs, in the order of a round.
pub const PROGRAMS: [&str; 4] = ["untar", "tar", "grep", "cp"];

/// One program's seconds with and without the monitor.
#[derive(Clone, Debug, Serialize)]
pub struct ProgramCost {
    pub program: String,
    pub monitored_seconds: f64,
    pub unmonitored_seconds: f64,
    /// monitored / unmonitored - 1.
    pub overhead: f64,
    /// CPU seconds the file system spent serving the program, and their ratio - 1.
    pub monitored_cpu_seconds: f64,
    pub unmonitored_cpu_seconds: f64,
    pub cpu_overhead: f64,
}

/// Fig. 15's numbers.
#[derive(Clone, Debug, Serialize)]
pub struct ProgramsResult {
    pub tree: String,
    pub files: u64,
    pub bytes: u64,
    pub rounds: u64,
    pub programs: Vec<ProgramCost>,
}

/// Copies regular files of `source` (sorted walk) into `target` until `bytes_max`.
fn copy_tree(
    source: &Path,
    target: &Path,
    bytes_max: u64,
    files: &mut u64,
    bytes: &mut u64,
) -> Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(source)
        .map_err(|error| LabError::io(format!("listing {}", source.display()), error))?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .collect();
    entries.sort();
    for path in entries {
        if *bytes >= bytes_max {
            return Ok(());
        }
        let metadata = std::fs::symlink_metadata(&path)
            .map_err(|error| LabError::io(format!("reading {}", path.display()), error))?;
        let name = path.file_name().expect("an entry has a name");
        if metadata.is_dir() {
            let directory = target.join(name);
            std::fs::create_dir_all(&directory).map_err(|error| {
                LabError::io(format!("creating {}", directory.display()), error)
            })?;
            copy_tree(&path, &directory, bytes_max, files, bytes)?;
        } else if metadata.is_file() {
            let to = target.join(name);
            std::fs::copy(&path, &to)
                .map_err(|error| LabError::io(format!("copying {}", path.display()), error))?;
            *files += 1;
            *bytes += metadata.len();
        }
    }
    Ok(())
}

/// CPU seconds (user and system) this process used so far: the file systems' request
/// threads run in it, so the difference around a program is what serving it cost.
fn process_cpu_seconds() -> f64 {
    // SAFETY: getrusage writes the structure it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let seconds = |time: libc::timeval| time.tv_sec as f64 + time.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// Runs a program; returns its seconds (`syncfs` of `mount_point` included) and the CPU
/// seconds the file system spent serving it.
fn timed(
    program: &str,
    arguments: &[&str],
    mount_point: &Path,
    accepted: &[i32],
) -> Result<(f64, f64)> {
    let cpu_before = process_cpu_seconds();
    let started = Instant::now();
    let output = Command::new(program)
        .args(arguments)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|error| LabError::Command {
            command: format!("{program} {}", arguments.join(" ")),
            detail: error.to_string(),
        })?;
    if !output
        .status
        .code()
        .is_some_and(|code| accepted.contains(&code))
    {
        return Err(LabError::Command {
            command: format!("{program} {}", arguments.join(" ")),
            detail: format!(
                "{}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ),
        });
    }
    sync_file_system(mount_point)?;
    Ok((
        started.elapsed().as_secs_f64(),
        process_cpu_seconds() - cpu_before,
    ))
}

/// Program `program` (an index of [`PROGRAMS`]) of round `index` on `bed`.
fn step(bed: &MountedFs, archive: &Path, program: usize, index: u64) -> Result<(f64, f64)> {
    let root = bed.mount_point();
    let tree = root.join(format!("tree-{index}")).display().to_string();
    match PROGRAMS[program] {
        "untar" => {
            std::fs::create_dir(&tree)
                .map_err(|error| LabError::io(format!("creating {tree}"), error))?;
            let archive = archive.display().to_string();
            timed("tar", &["xf", &archive, "-C", &tree], root, &[0])
        }
        "tar" => {
            let copy_archive = root.join(format!("tree-{index}.tar")).display().to_string();
            timed("tar", &["cf", &copy_archive, "-C", &tree, "."], root, &[0])
        }
        // grep exits with 1 when nothing matched, which is what it is asked.
        "grep" => timed(
            "grep",
            &["-r", "-l", "onecopy-lab-no-such-string", &tree],
            root,
            &[1],
        ),
        "cp" => {
            let copy = root.join(format!("copy-{index}"));
            let copy_text = copy.display().to_string();
            let measured = timed("cp", &["-r", &tree, &copy_text], root, &[0])?;
            // The round's last program: its files go, so that the file system's size stays
            // that of one round whatever the number of rounds.
            let copy_archive = root.join(format!("tree-{index}.tar"));
            for directory in [Path::new(&tree), copy.as_path()] {
                std::fs::remove_dir_all(directory).map_err(|error| {
                    LabError::io(format!("removing {}", directory.display()), error)
                })?;
            }
            std::fs::remove_file(&copy_archive).map_err(|error| {
                LabError::io(format!("removing {}", copy_archive.display()), error)
            })?;
            Ok(measured)
        }
        other => unreachable!("unknown program {other}"),
    }
}

/// Measures Fig. 15 on the first `bytes_max` bytes of [`SOURCE_TREE`], over `rounds` rounds.
pub fn run(work: &Path, bytes_max: u64, rounds: u64) -> Result<ProgramsResult> {
    assert!(rounds >= 1, "at least one round");
    for program in ["tar", "grep", "cp"] {
        require_program(program)?;
    }
    let staging = tempfile::Builder::new()
        .prefix("onecopy-lab-tree-")
        .tempdir_in(work)
        .map_err(|error| {
            LabError::io(format!("making a directory in {}", work.display()), error)
        })?;
    let tree = staging.path().join("tree");
    std::fs::create_dir(&tree)
        .map_err(|error| LabError::io(format!("creating {}", tree.display()), error))?;
    let (mut files, mut bytes) = (0, 0);
    copy_tree(
        Path::new(SOURCE_TREE),
        &tree,
        bytes_max,
        &mut files,
        &mut bytes,
    )?;
    if files == 0 {
        return Err(LabError::Missing(format!(
            "{SOURCE_TREE} holds no files: install a package with C headers (libc6-dev)"
        )));
    }
    let archive = staging.path().join("tree.tar");
    crate::mount::run(
        "tar",
        &[
            "cf",
            &archive.display().to_string(),
            "-C",
            &tree.display().to_string(),
            ".",
        ],
    )?;
    let options = FsOptions {
        idle_seconds: 0,
        ..FsOptions::default()
    };
    let monitored = MountedFs::create(work, options.clone())?;
    let unmonitored = MountedFs::create_with(
        work,
        options,
        MountOptions {
            no_monitor: true,
            ..MountOptions::default()
        },
    )?;
    // samples[program][mount]: (seconds, CPU seconds) of each round.
    let mut samples = vec![[Vec::new(), Vec::new()]; PROGRAMS.len()];
    for index in 0..rounds {
        for (program, per_mount) in samples.iter_mut().enumerate() {
            // Each program runs on both mounts back to back, the first one alternating, so
            // that drift of a shared machine hits both alike.
            let monitored_first = (index as usize + program).is_multiple_of(2);
            let order = if monitored_first { [0, 1] } else { [1, 0] };
            for which in order {
                let bed = if which == 0 { &monitored } else { &unmonitored };
                let sample = step(bed, &archive, program, index)?;
                per_mount[which].push(sample);
            }
        }
    }
    monitored.teardown()?;
    unmonitored.teardown()?;
    let median = |values: Vec<f64>| {
        let mut values = values;
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let programs = PROGRAMS
        .iter()
        .enumerate()
        .map(|(index, program)| {
            let of = |which: usize, pick: fn(&(f64, f64)) -> f64| {
                median(samples[index][which].iter().map(pick).collect())
            };
            let monitored_seconds = of(0, |sample| sample.0);
            let unmonitored_seconds = of(1, |sample| sample.0);
            let monitored_cpu_seconds = of(0, |sample| sample.1);
            let unmonitored_cpu_seconds = of(1, |sample| sample.1);
            ProgramCost {
                program: program.to_string(),
                monitored_seconds,
                unmonitored_seconds,
                overhead: monitored_seconds / unmonitored_seconds.max(1e-9) - 1.0,
                monitored_cpu_seconds,
                unmonitored_cpu_seconds,
                cpu_overhead: monitored_cpu_seconds / unmonitored_cpu_seconds.max(1e-9) - 1.0,
            }
        })
        .collect();
    Ok(ProgramsResult {
        tree: SOURCE_TREE.to_string(),
        files,
        bytes,
        rounds,
        programs,
    })
}
