//! A real-world workload in the manner of paper 3, Table 6 (and Fig. 14): successive
//! releases of a source tree kept on the file system, the newest in use, the older ones
//! cold.
//!
//! The releases are the unpacked `typescript` nightlies that `onecopy lab paper2` keeps in
//! its cache (`<cache>/typescript/trees/<version>/package`) when there are at least two;
//! otherwise they are made from the first bytes of `/usr/include`: each release edits 8% of
//! the files of the one before (a span of text replaced by a slice of another file, which
//! shifts the rest of the file), drops 1% and adds 1% (edited copies).
//!
//! Days are compressed into seconds with the ranker's parameters (MIN_EVALUATION_INT 1 s,
//! MAX_HOT_INT [`HOT_SECONDS`], MIN_EVALUATION_CNT 2):
//!
//! 1. every release is written into `releases/<n>/`;
//! 2. after MAX_HOT_INT without reads every file is cold;
//! 3. the newest release is used: 30% of its files read whole twice (sequential), 20% read
//!    by three 4 KiB `pread`s at random offsets (random), and 5% edited in place (recently
//!    modified, rank 0);
//! 4. at once, `fs dedup`; then the ranks and the savings, and the sequential files of the
//!    newest release read cold (Fig. 14).
//!
//! The same data under all-big and all-small (deduplicated right after writing) and not
//! deduplicated give the comparison of Table 6's last columns.

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use onecopy_fs::FsOptions;

use super::bed::MountedFs;
use super::mixes::{deduplicate, BIG_CHUNK_BYTES, SMALL_CHUNK_BYTES};
use super::synthetic::Random;
use crate::error::{LabError, Result};
use crate::mount::sync_file_system;

/// MAX_HOT_INT of the compressed timeline, seconds.
pub const HOT_SECONDS: u64 = 2;
/// The tree the releases are made from when no downloaded series is cached.
pub const SOURCE_TREE: &str = "/usr/include";

/// Relative path to contents.
type Tree = BTreeMap<PathBuf, Vec<u8>>;

/// One system's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct ReleasesRun {
    pub system: String,
    pub logical_bytes: u64,
    pub stored_bytes: u64,
    pub savings: f64,
    /// Share of the files in each rank after deduplication.
    pub rank_shares: [f64; 4],
    /// The newest release's sequentially used files, read cold, whole.
    pub sequential_mb_per_second: f64,
}

/// Table 6's numbers for one series.
#[derive(Clone, Debug, Serialize)]
pub struct ReleasesResult {
    /// Where the releases came from.
    pub source: String,
    pub releases: u64,
    pub files: u64,
    pub bytes: u64,
    pub runs: Vec<ReleasesRun>,
}

fn load_tree(root: &Path, bytes_max: u64) -> Result<Tree> {
    fn walk(
        root: &Path,
        directory: &Path,
        bytes_max: u64,
        tree: &mut Tree,
        bytes: &mut u64,
    ) -> Result<()> {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(directory)
            .map_err(|error| LabError::io(format!("listing {}", directory.display()), error))?
            .filter_map(|entry| entry.ok().map(|entry| entry.path()))
            .collect();
        entries.sort();
        for path in entries {
            if *bytes >= bytes_max {
                break;
            }
            let metadata = std::fs::symlink_metadata(&path)
                .map_err(|error| LabError::io(format!("reading {}", path.display()), error))?;
            if metadata.is_dir() {
                walk(root, &path, bytes_max, tree, bytes)?;
            } else if metadata.is_file() {
                let data = std::fs::read(&path)
                    .map_err(|error| LabError::io(format!("reading {}", path.display()), error))?;
                *bytes += data.len() as u64;
                let relative = path
                    .strip_prefix(root)
                    .expect("under the root")
                    .to_path_buf();
                tree.insert(relative, data);
            }
        }
        Ok(())
    }
    let mut tree = Tree::new();
    let mut bytes = 0;
    walk(root, root, bytes_max, &mut tree, &mut bytes)?;
    Ok(tree)
}

/// The release after `tree`; see the module documentation.
fn next_release(tree: &Tree, random: &mut Random, serial: usize) -> Tree {
    let sources: Vec<&Vec<u8>> = tree.values().collect();
    let edit = |data: &[u8], random: &mut Random| -> Vec<u8> {
        let source = sources[random.below(sources.len() as u64) as usize];
        let at = random.below(data.len() as u64 + 1) as usize;
        let removed = (random.below(2048) as usize).min(data.len() - at);
        let taken_from = random.below(source.len() as u64 + 1) as usize;
        let taken = (random.below(2048) as usize).min(source.len() - taken_from);
        let mut edited = Vec::with_capacity(data.len() + taken);
        edited.extend_from_slice(&data[..at]);
        edited.extend_from_slice(&source[taken_from..taken_from + taken]);
        edited.extend_from_slice(&data[at + removed..]);
        edited
    };
    let mut next = Tree::new();
    let mut added = Vec::new();
    for (path, data) in tree {
        let draw = random.below(100);
        if draw == 0 {
            continue;
        }
        if draw == 1 {
            let mut name = path.as_os_str().to_owned();
            name.push(format!(".{serial}"));
            added.push((PathBuf::from(name), edit(data, random)));
        }
        let data = if draw < 10 {
            edit(data, random)
        } else {
            data.clone()
        };
        next.insert(path.clone(), data);
    }
    next.extend(added);
    next
}

/// The releases: cached downloads, or made from [`SOURCE_TREE`].
fn releases(cache: Option<&Path>, count: usize, bytes_max: u64) -> Result<(String, Vec<Tree>)> {
    if let Some(cache) = cache {
        let trees = cache.join("typescript").join("trees");
        if let Ok(entries) = std::fs::read_dir(&trees) {
            let mut versions: Vec<PathBuf> = entries
                .filter_map(|entry| entry.ok().map(|entry| entry.path().join("package")))
                .filter(|path| path.is_dir())
                .collect();
            versions.sort();
            versions.truncate(count);
            if versions.len() >= 2 {
                let loaded = versions
                    .iter()
                    .map(|path| load_tree(path, u64::MAX))
                    .collect::<Result<Vec<_>>>()?;
                return Ok((
                    format!("typescript nightlies from {}", trees.display()),
                    loaded,
                ));
            }
        }
    }
    let first = load_tree(Path::new(SOURCE_TREE), bytes_max)?;
    if first.is_empty() {
        return Err(LabError::Missing(format!(
            "{SOURCE_TREE} holds no files: install a package with C headers (libc6-dev)"
        )));
    }
    let mut random = Random::new(0x7AB1_E006);
    let mut series = vec![first];
    while series.len() < count {
        let next = next_release(
            series.last().expect("one release"),
            &mut random,
            series.len(),
        );
        series.push(next);
    }
    Ok((
        format!("{SOURCE_TREE} (first {bytes_max} bytes), edited release by release"),
        series,
    ))
}

fn write_tree(root: &Path, tree: &Tree) -> Result<()> {
    for (path, data) in tree {
        let path = root.join(path);
        let parent = path.parent().expect("a file has a directory");
        std::fs::create_dir_all(parent)
            .map_err(|error| LabError::io(format!("creating {}", parent.display()), error))?;
        std::fs::write(&path, data)
            .map_err(|error| LabError::io(format!("writing {}", path.display()), error))?;
    }
    Ok(())
}

/// How the newest release is used: 0 untouched, 1 read sequentially, 2 read randomly,
/// 3 edited. Fixed per file.
fn uses(tree: &Tree) -> Vec<u8> {
    let mut random = Random::new(0x05E5);
    tree.keys()
        .map(|_| match random.below(100) {
            0..30 => 1,
            30..50 => 2,
            50..55 => 3,
            _ => 0,
        })
        .collect()
}

fn read_whole(path: &Path) -> Result<u64> {
    std::fs::read(path)
        .map(|data| data.len() as u64)
        .map_err(|error| LabError::io(format!("reading {}", path.display()), error))
}

fn run_system(work: &Path, system: &str, series: &[Tree]) -> Result<ReleasesRun> {
    let selective = system == "selective";
    let (big, small) = match system {
        "all-big" => (BIG_CHUNK_BYTES, BIG_CHUNK_BYTES),
        "all-small" => (SMALL_CHUNK_BYTES, SMALL_CHUNK_BYTES),
        _ => (BIG_CHUNK_BYTES, SMALL_CHUNK_BYTES),
    };
    let options = FsOptions {
        min_evaluation_interval_seconds: if selective { 1 } else { 0 },
        max_hot_interval_seconds: HOT_SECONDS,
        min_evaluation_count: if selective { 2 } else { 0 },
        idle_seconds: 0,
        big_chunk_bytes: big,
        small_chunk_bytes: small,
        ..FsOptions::default()
    };
    let mut bed = MountedFs::create(work, options)?;
    let root = bed.mount_point().join("releases");
    for (index, tree) in series.iter().enumerate() {
        write_tree(&root.join(format!("{index:03}")), tree)?;
    }
    sync_file_system(bed.mount_point())?;
    let newest = series.last().expect("a series has a release");
    let newest_root = root.join(format!("{:03}", series.len() - 1));
    let uses = uses(newest);
    if selective {
        std::thread::sleep(Duration::from_secs(HOT_SECONDS + 1));
        let mut random = Random::new(0xED17);
        for ((path, data), usage) in newest.iter().zip(&uses) {
            let path = newest_root.join(path);
            match usage {
                1 => {
                    read_whole(&path)?;
                    read_whole(&path)?;
                }
                2 => {
                    let file = std::fs::File::open(&path).map_err(|error| {
                        LabError::io(format!("opening {}", path.display()), error)
                    })?;
                    let mut buffer = [0u8; 4096];
                    for _ in 0..3 {
                        let offset = random.below(data.len() as u64 + 1);
                        file.read_at(&mut buffer, offset).map_err(|error| {
                            LabError::io(format!("reading {}", path.display()), error)
                        })?;
                    }
                }
                3 => {
                    let mut edited = data.clone();
                    edited.extend_from_slice(b"\n/* edited */\n");
                    std::fs::write(&path, edited).map_err(|error| {
                        LabError::io(format!("writing {}", path.display()), error)
                    })?;
                }
                _ => {}
            }
        }
    }
    if system != "none" {
        deduplicate(&bed)?;
    }
    let stats = bed
        .engine()
        .stats(bed.fs())
        .map_err(|error| LabError::engine("reading file system statistics", error))?;
    let files = stats.files.max(1) as f64;
    let rank_shares = std::array::from_fn(|rank| stats.ranks[rank].files as f64 / files);
    bed.cold_remount()?;
    let started = Instant::now();
    let mut bytes = 0;
    for (path, usage) in newest.keys().zip(&uses) {
        if *usage == 1 {
            bytes += read_whole(&newest_root.join(path))?;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    bed.teardown()?;
    Ok(ReleasesRun {
        system: system.to_string(),
        logical_bytes: stats.logical_bytes,
        stored_bytes: stats.stored_bytes,
        savings: if stats.logical_bytes == 0 {
            0.0
        } else {
            1.0 - stats.stored_bytes as f64 / stats.logical_bytes as f64
        },
        rank_shares,
        sequential_mb_per_second: bytes as f64 / 1e6 / seconds.max(1e-9),
    })
}

/// Runs the series under the four systems.
pub fn run(
    work: &Path,
    cache: Option<&Path>,
    count: usize,
    bytes_max: u64,
    log: &mut dyn FnMut(&str),
) -> Result<ReleasesResult> {
    assert!(count >= 2, "a series of at least two releases");
    let (source, series) = releases(cache, count, bytes_max)?;
    let mut result = ReleasesResult {
        source,
        releases: series.len() as u64,
        files: series.iter().map(|tree| tree.len() as u64).sum(),
        bytes: series
            .iter()
            .flat_map(|tree| tree.values())
            .map(|data| data.len() as u64)
            .sum(),
        runs: Vec::new(),
    };
    for system in ["none", "all-big", "all-small", "selective"] {
        log(&format!("paper3: releases, {system}"));
        result.runs.push(run_system(work, system, &series)?);
    }
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a made release keeps most files, edits some, drops and adds a few, and stays
    /// deterministic. Method: a release of 1,000 small files, made twice from one seed.
    #[test]
    fn next_release_edits_drops_and_adds_a_few_files() {
        let tree: Tree = (0..1000)
            .map(|index| (PathBuf::from(format!("f{index}")), vec![index as u8; 3000]))
            .collect();
        let next = next_release(&tree, &mut Random::new(9), 1);
        assert_eq!(next, next_release(&tree, &mut Random::new(9), 1));
        let kept = tree.keys().filter(|path| next.contains_key(*path)).count();
        let unchanged = tree
            .iter()
            .filter(|(path, data)| next.get(*path) == Some(*data))
            .count();
        let added = next.keys().filter(|path| !tree.contains_key(*path)).count();
        assert!((970..1000).contains(&kept), "kept {kept}");
        assert!((850..960).contains(&unchanged), "unchanged {unchanged}");
        assert!((1..30).contains(&added), "added {added}");
    }
}
