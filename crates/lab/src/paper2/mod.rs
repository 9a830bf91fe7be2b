//! Paper 2 §4: RevDedup against conventional inline deduplication, on synthetic backup series
//! (Table 1) and a real one, and the backup store against restic and borg.
//!
//! # Datasets
//!
//! - **SG1..SG5** ([`synthetic`]): one series of weekly full backups of an ext4 image whose
//!   files change α% / β% / γ a weekday as Table 1 says, at a scale that runs here
//!   ([`Scale`]); **GP** is a group of series from one base image.
//! - **typescript** ([`typescript`]): successive nightly builds of the npm package, unpacked
//!   (the paper's real dataset, student VM images, is not public).
//!
//! # Experiments and figures
//!
//! | paper | what | here |
//! |---|---|---|
//! | Fig. 4 | storage saving, inline part and after reverse deduplication, segment sizes 1/4/8 MiB against Conv | every dataset |
//! | Fig. 5 | backup throughput per week, container sizes 4/16/32 MiB and segment sizes | SG1, GP, typescript |
//! | Fig. 6 | restore throughput per version after all backups, cold cache | SG1, GP, typescript |
//! | Fig. 7 | reverse deduplication throughput per week | SG1 |
//! | Fig. 8 | restore with and without prefetching, Conv and RevDedup | SG1 |
//! | Fig. 9 | restore per version with live windows 1, 2, 4 | SG1 |
//! | Table 2 | backup and restore throughput on unique data, beside memcpy, hashing and the disk's own write and read rates measured in the same run ([`unique`]) | random data |
//! | Table 3 | index and write time of the second backup, with the disk's part (the seal) and the cost per new segment | SG1 |
//! | Fig. 10 | deleting the oldest backup: time stamps against mark and sweep, one by one (a), the n oldest at once (b) and at growing repository sizes | SG1 |
//! | goals | onecopy, restic and borg on the typescript series ([`comparison`]) | typescript |
//!
//! The paper averages five runs (Figs. 5-10): every dataset runs [`Scale::repetitions`]
//! times on the same generated versions, and the figures draw the mean with the lowest and
//! highest run as error bars (the storage figure does not vary between runs; the throughputs
//! of Figs. 5 and 7 do, SG2-SG5's included).
//!
//! Differences from the paper's method, all deliberate and documented in docs/LAB.md:
//! throughputs include chunking and fingerprinting (the paper precomputed fingerprints), the
//! stores run without compression (the paper ignores it) except in the peer comparison, and
//! restores go to a hashing sink (images) or a directory (trees) rather than a disk file.

pub mod comparison;
pub mod experiments;
pub mod figures;
pub mod files;
pub mod measure;
pub mod peers;
pub mod synthetic;
pub mod tables;
pub mod typescript;
pub mod unique;

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use self::comparison::{ComparisonResults, GoalRow};
use self::experiments::{DatasetPlan, DatasetResults, DatasetSource};
use self::measure::StoreConfig;
use self::synthetic::SyntheticSpec;
use onecopy_backup::DeleteMethod;
use onecopy_core::error::IoContext;

use self::peers::Tool;
use crate::error::{LabError, Result};
use crate::results::remove_directory_if_present;
use crate::results::{write_json, write_text, HostSnapshot};

/// A dataset of the experiment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dataset {
    Sg1,
    Sg2,
    Sg3,
    Sg4,
    Sg5,
    Gp,
    Typescript,
}

impl Dataset {
    pub const ALL: [Dataset; 7] = [
        Dataset::Sg1,
        Dataset::Sg2,
        Dataset::Sg3,
        Dataset::Sg4,
        Dataset::Sg5,
        Dataset::Gp,
        Dataset::Typescript,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Dataset::Sg1 => "sg1",
            Dataset::Sg2 => "sg2",
            Dataset::Sg3 => "sg3",
            Dataset::Sg4 => "sg4",
            Dataset::Sg5 => "sg5",
            Dataset::Gp => "gp",
            Dataset::Typescript => "typescript",
        }
    }
}

impl fmt::Display for Dataset {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.name())
    }
}

impl std::str::FromStr for Dataset {
    type Err = LabError;
    fn from_str(text: &str) -> Result<Self> {
        Dataset::ALL
            .into_iter()
            .find(|dataset| dataset.name() == text.to_ascii_lowercase())
            .ok_or_else(|| {
                LabError::InvalidOption(format!(
                    "dataset {text:?}: use sg1, sg2, sg3, sg4, sg5, gp or typescript"
                ))
            })
    }
}

/// How big the datasets are.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Scale {
    /// Size of each synthetic disk image (the paper's: 8 GB).
    pub image_bytes: u64,
    /// Files in the base image (the paper's: 1.1 GB); γ scales with it.
    pub content_bytes: u64,
    /// Weekly backups of SG1..SG5 (the paper's: 78).
    pub weeks: u32,
    /// Series of GP (the paper's: 16) and their weekly backups (the paper's: 20).
    pub group_series: u32,
    pub group_weeks: u32,
    /// Releases of the real series (at least 20 in the full run).
    pub releases: usize,
    /// Points at which deleting the oldest backup is measured on a copy (Fig. 10).
    pub deletion_checkpoints: u32,
    /// Runs of every dataset (the paper's: five) and of the unique-data test.
    #[serde(default = "one")]
    pub repetitions: u32,
    /// Bytes of unique data written and read back per run (Table 2; the paper's: 8 GB).
    #[serde(default)]
    pub unique_bytes: u64,
    /// Runs of the unique-data test (the paper's: 20); 0 for [`Scale::repetitions`].
    #[serde(default)]
    pub unique_runs: u32,
}

fn one() -> u32 {
    1
}

impl Scale {
    /// The full run: about an hour on two shared cores.
    pub fn full() -> Scale {
        Scale {
            image_bytes: 384 << 20,
            content_bytes: 128 << 20,
            weeks: 20,
            group_series: 4,
            group_weeks: 10,
            releases: 24,
            deletion_checkpoints: 4,
            repetitions: 5,
            unique_bytes: 256 << 20,
            unique_runs: 0,
        }
    }

    /// A smoke test of a few minutes.
    pub fn quick() -> Scale {
        Scale {
            image_bytes: 64 << 20,
            content_bytes: 16 << 20,
            weeks: 4,
            group_series: 2,
            group_weeks: 3,
            releases: 4,
            deletion_checkpoints: 2,
            repetitions: 2,
            unique_bytes: 32 << 20,
            unique_runs: 0,
        }
    }

    /// The image size: at least [`Scale::image_bytes`], and room for the files every series
    /// adds (γ a weekday for every week but the first) with a quarter to spare for ext4's own
    /// blocks, rounded up to 16 MiB.
    pub fn image_bytes_for(&self, datasets: &[Dataset], content_bytes: u64) -> Result<u64> {
        let mut added_max = 0u64;
        for dataset in datasets {
            let weeks = match dataset {
                Dataset::Gp => self.group_weeks,
                _ => self.weeks,
            };
            let spec = SyntheticSpec::from_table(dataset.name(), content_bytes, 1, weeks)?;
            let days = u64::from(weeks.saturating_sub(1) * synthetic::WEEKDAYS_PER_WEEK);
            added_max = added_max.max(days * spec.new_bytes_per_day);
        }
        let needed = (content_bytes + added_max) / 4 * 5;
        Ok(self.image_bytes.max(needed.div_ceil(16 << 20) * (16 << 20)))
    }

    /// How many of the oldest of `weeks` backups the batch deletions remove (Fig. 10b; the
    /// paper's run from 1 to all but the newest): 1, a quarter, half, three quarters and all
    /// but the newest.
    pub fn batch_counts(weeks: u32) -> Vec<u32> {
        let mut counts: Vec<u32> = [
            1,
            weeks / 4,
            weeks / 2,
            weeks * 3 / 4,
            weeks.saturating_sub(1),
        ]
        .into_iter()
        .filter(|&count| count >= 1 && count < weeks)
        .collect();
        counts.sort_unstable();
        counts.dedup();
        counts
    }

    /// Runs of each dataset: [`Scale::repetitions`], at least one.
    pub fn runs(&self) -> u32 {
        self.repetitions.max(1)
    }

    /// Weeks at which the oldest backup is deleted on a copy: evenly spread, the last one
    /// included.
    pub fn checkpoints(&self, weeks: u32) -> Vec<u32> {
        let count = self.deletion_checkpoints.clamp(1, weeks.max(1));
        (1..=count)
            .map(|index| (weeks * index).div_ceil(count))
            .filter(|&week| week >= 2)
            .collect()
    }
}

/// Options of a run.
#[derive(Clone, Debug)]
pub struct Paper2Options {
    pub output_directory: PathBuf,
    /// Where stores, images and peer repositories are made (removed at the end).
    pub work_directory: PathBuf,
    /// Where downloaded releases are kept between runs.
    pub cache_directory: PathBuf,
    /// Tree the base image's files are copied from.
    pub base_source: PathBuf,
    pub datasets: Vec<Dataset>,
    pub scale: Scale,
    /// Tools compared on the real series (empty: no comparison).
    pub peers: Vec<Tool>,
    /// The onecopy executable for the comparison (the running one).
    pub onecopy_executable: PathBuf,
    pub release_prefix: String,
    pub read_threads: usize,
}

/// Everything a run measured (`results.json`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Paper2Results {
    pub scale: Scale,
    pub host_before: HostSnapshot,
    pub host_after: HostSnapshot,
    pub datasets: Vec<DatasetResults>,
    /// Table 2: throughput on unique data and the machine's limits.
    #[serde(default)]
    pub unique: Option<unique::UniqueResults>,
    pub comparison: Option<ComparisonResults>,
    pub goals: Vec<GoalRow>,
    pub seconds: f64,
}

/// The stores each dataset runs through.
pub fn plan(dataset: Dataset, scale: &Scale) -> DatasetPlan {
    let segment_sizes = || {
        vec![
            StoreConfig::conventional(),
            StoreConfig::revdedup(1 << 20, 32 << 20, 1),
            StoreConfig::revdedup(4 << 20, 32 << 20, 1),
            StoreConfig::revdedup(8 << 20, 32 << 20, 1),
        ]
    };
    match dataset {
        Dataset::Sg1 => {
            let mut stores = segment_sizes();
            stores.push(StoreConfig::revdedup(4 << 20, 4 << 20, 1));
            stores.push(StoreConfig::revdedup(4 << 20, 16 << 20, 1));
            stores.push(StoreConfig::revdedup(4 << 20, 32 << 20, 2));
            stores.push(StoreConfig::revdedup(4 << 20, 32 << 20, 4));
            DatasetPlan {
                stores,
                restores: true,
                prefetch_stores: vec!["conv".into(), "rev-4M".into()],
                deletion_store: Some("rev-4M".into()),
                deletion_checkpoints: scale.checkpoints(scale.weeks),
                batch_stores: vec![
                    (
                        "rev-4M".into(),
                        vec![DeleteMethod::Timestamp, DeleteMethod::MarkAndSweep],
                    ),
                    ("conv".into(), vec![DeleteMethod::MarkAndSweep]),
                ],
                batch_counts: Scale::batch_counts(scale.weeks),
            }
        }
        Dataset::Gp | Dataset::Typescript => DatasetPlan {
            stores: segment_sizes(),
            restores: true,
            prefetch_stores: Vec::new(),
            deletion_store: None,
            deletion_checkpoints: Vec::new(),
            batch_stores: Vec::new(),
            batch_counts: Vec::new(),
        },
        _ => DatasetPlan {
            stores: segment_sizes(),
            restores: false,
            prefetch_stores: Vec::new(),
            deletion_store: None,
            deletion_checkpoints: Vec::new(),
            batch_stores: Vec::new(),
            batch_counts: Vec::new(),
        },
    }
}

/// Runs the experiment and writes results.json, CSV tables, the figures and summary.md into
/// the output directory; returns the files written. `log` receives progress lines.
pub fn run_experiment(options: &Paper2Options, log: &mut dyn FnMut(&str)) -> Result<Vec<PathBuf>> {
    let started = std::time::Instant::now();
    if options.datasets.is_empty() {
        return Err(LabError::InvalidOption("no dataset to run".into()));
    }
    for program in ["mke2fs", "debugfs", "/usr/bin/time"] {
        if program.starts_with('/') && !Path::new(program).exists() {
            return Err(LabError::Missing(format!(
                "{program} is missing: install the `time` package (scripts/setup.sh)"
            )));
        }
    }
    let work = options
        .work_directory
        .join(format!("onecopy-paper2-{}", std::process::id()));
    fs::create_dir_all(&work).context_io(|| format!("creating {}", work.display()))?;
    let host_before = HostSnapshot::take();
    let unique = if options.scale.unique_bytes > 0 {
        let measured = unique::run_unique(
            options.scale.unique_bytes,
            match options.scale.unique_runs {
                0 => options.scale.repetitions.max(1),
                runs => runs,
            },
            &work.join("unique"),
            options.read_threads,
            log,
        )?;
        Some(measured)
    } else {
        None
    };
    let mut datasets = Vec::new();
    let synthetic: Vec<Dataset> = options
        .datasets
        .iter()
        .copied()
        .filter(|dataset| *dataset != Dataset::Typescript)
        .collect();
    if !synthetic.is_empty() {
        let base_tree = work.join("base-tree");
        let content_bytes = synthetic::build_base_tree(
            &options.base_source,
            &base_tree,
            options.scale.content_bytes,
        )?;
        let base_image = work.join("base.img");
        let image_bytes = options.scale.image_bytes_for(&synthetic, content_bytes)?;
        synthetic::build_image(&base_tree, &base_image, image_bytes)?;
        log(&format!(
            "base image: {} MiB of files from {} in a {} MiB ext4 image",
            content_bytes >> 20,
            options.base_source.display(),
            image_bytes >> 20
        ));
        for dataset in synthetic {
            let (series, weeks) = match dataset {
                Dataset::Gp => (options.scale.group_series, options.scale.group_weeks),
                _ => (1, options.scale.weeks),
            };
            let spec = SyntheticSpec::from_table(dataset.name(), content_bytes, series, weeks)?;
            let mut results: Option<DatasetResults> = None;
            let runs = options.scale.runs();
            for run in 0..runs {
                if runs > 1 {
                    log(&format!("{dataset}: run {}/{runs}", run + 1));
                }
                let measured = experiments::run_dataset(
                    dataset.name(),
                    DatasetSource::Synthetic {
                        spec: spec.clone(),
                        base_tree: &base_tree,
                        base_image: &base_image,
                        content_bytes,
                    },
                    &plan(dataset, &options.scale),
                    &work.join(dataset.name()),
                    options.read_threads,
                    log,
                )?;
                match &mut results {
                    None => results = Some(measured),
                    Some(first) => first.add_run(measured, run),
                }
            }
            datasets.push(results.expect("at least one run"));
            write_json(&options.output_directory.join("partial.json"), &datasets)?;
        }
        remove_directory_if_present(&base_tree)?;
        fs::remove_file(&base_image).context_io(|| format!("removing {}", base_image.display()))?;
    }
    let mut comparison = None;
    if options.datasets.contains(&Dataset::Typescript) {
        let releases = typescript::prepare(
            &options.cache_directory,
            &options.release_prefix,
            options.scale.releases,
            log,
        )?;
        let mut results: Option<DatasetResults> = None;
        let runs = options.scale.runs();
        for run in 0..runs {
            let measured = experiments::run_dataset(
                Dataset::Typescript.name(),
                DatasetSource::Releases(&releases),
                &plan(Dataset::Typescript, &options.scale),
                &work.join("typescript"),
                options.read_threads,
                log,
            )?;
            match &mut results {
                None => results = Some(measured),
                Some(first) => first.add_run(measured, run),
            }
        }
        datasets.push(results.expect("at least one run"));
        if !options.peers.is_empty() {
            comparison = Some(comparison::run_comparison(
                &releases,
                &options.peers,
                &options.onecopy_executable,
                &options.scale.checkpoints(releases.len() as u32),
                &work.join("peers"),
                log,
            )?);
        }
    }
    remove_directory_if_present(&work)?;
    let saving = datasets
        .iter()
        .find(|dataset| dataset.dataset == "typescript")
        .and_then(|dataset| {
            Some((
                figures::final_saving(dataset, "rev-4M")?,
                figures::final_saving(dataset, "conv")?,
            ))
        });
    let goals = comparison
        .as_ref()
        .map(|comparison| comparison::goal_table(comparison, saving))
        .unwrap_or_default();
    let results = Paper2Results {
        scale: options.scale.clone(),
        host_before,
        host_after: HostSnapshot::take(),
        datasets,
        unique,
        comparison,
        goals,
        seconds: started.elapsed().as_secs_f64(),
    };
    let _ = fs::remove_file(options.output_directory.join("partial.json"));
    write_outputs(&options.output_directory, &results)
}

/// Writes results.json, the CSV tables, the figures and summary.md; returns the paths.
pub fn write_outputs(directory: &Path, results: &Paper2Results) -> Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let json = directory.join("results.json");
    write_json(&json, results)?;
    written.push(json);
    written.extend(tables::write_tables(directory, results)?);
    written.extend(figures::write_figures(directory, results)?);
    let summary = directory.join("summary.md");
    write_text(&summary, &tables::summary(results))?;
    written.push(summary);
    Ok(written)
}

/// Reads a results.json written by [`run_experiment`].
pub fn read_results(path: &Path) -> Result<Paper2Results> {
    crate::results::read_json(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: deletion checkpoints spread over the series and end at its last week; method:
    /// a few scales.
    #[test]
    fn checkpoints_spread_to_the_end() {
        let mut scale = Scale::quick();
        scale.deletion_checkpoints = 4;
        assert_eq!(scale.checkpoints(20), vec![5, 10, 15, 20]);
        assert_eq!(scale.checkpoints(3), vec![2, 3]);
        scale.deletion_checkpoints = 1;
        assert_eq!(scale.checkpoints(7), vec![7]);
    }

    /// Goal: the image leaves room for every file a series adds; method: SG4 (twice Table 1's
    /// γ) over 20 weeks needs more than a small configured image, a quick scale does not.
    #[test]
    fn image_leaves_room_for_new_files() {
        let mut scale = Scale::full();
        scale.image_bytes = 64 << 20;
        let content = 127 << 20;
        let bytes = scale
            .image_bytes_for(&[Dataset::Sg1, Dataset::Sg4], content)
            .expect("known datasets");
        let added = 19
            * 5
            * SyntheticSpec::from_table("sg4", content, 1, 20)
                .expect("known")
                .new_bytes_per_day;
        assert!(bytes >= content + added + (content + added) / 5);
        assert_eq!(bytes % (16 << 20), 0);
        let quick = Scale::quick();
        assert_eq!(
            quick
                .image_bytes_for(&[Dataset::Sg4], 16 << 20)
                .expect("known"),
            quick.image_bytes
        );
    }

    /// Goal: batch deletions remove 1 up to all but the newest backup, each count once;
    /// method: the full and quick week counts and a two-week series.
    #[test]
    fn batch_counts_span_the_series() {
        assert_eq!(Scale::batch_counts(20), vec![1, 5, 10, 15, 19]);
        assert_eq!(Scale::batch_counts(4), vec![1, 2, 3]);
        assert_eq!(Scale::batch_counts(2), vec![1]);
        assert!(Scale::batch_counts(1).is_empty());
    }

    /// Goal: dataset names parse both ways; method: every dataset and a bad name.
    #[test]
    fn datasets_parse() {
        for dataset in Dataset::ALL {
            assert_eq!(dataset.name().parse::<Dataset>().expect("parses"), dataset);
        }
        assert!("sg6".parse::<Dataset>().is_err());
    }
}
