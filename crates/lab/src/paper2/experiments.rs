//! Running one dataset through a set of store configurations: every backup, reverse
//! deduplication and space measure as the series grows, then restores of every version,
//! restores with prefetching, and deletions (see the [module documentation](super) for how
//! each maps to a figure of the paper).

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use onecopy_backup::{BackupSource, DeleteMethod};
use serde::{Deserialize, Serialize};

use super::measure::{
    BackupMeasure, BatchDeleteMeasure, DeleteMeasure, RestoreMeasure, ReverseMeasure, SpaceMeasure,
    StoreConfig, StoreUnderTest,
};
use super::synthetic::{hash_file, EvolvingImage, SyntheticSpec, WeekChanges};
use super::typescript::Release;
use onecopy_core::error::IoContext;

use crate::error::{LabError, Result};

/// What to measure on a dataset besides backups and space.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DatasetPlan {
    pub stores: Vec<StoreConfig>,
    /// Restore every version of every store after the last backup (Fig. 6, 9).
    pub restores: bool,
    /// Stores restored again with prefetching on (Fig. 8).
    pub prefetch_stores: Vec<String>,
    /// Store whose deletions are measured (Fig. 10), with the weeks at which a copy of it
    /// deletes its oldest backup by each method.
    pub deletion_store: Option<String>,
    pub deletion_checkpoints: Vec<u32>,
    /// Stores whose oldest backups are deleted at once after the last backup (Fig. 10b),
    /// with the methods to measure on each.
    #[serde(default)]
    pub batch_stores: Vec<(String, Vec<DeleteMethod>)>,
    /// How many of the oldest backups each batch deletion removes.
    #[serde(default)]
    pub batch_counts: Vec<u32>,
}

/// The space of every store after a week's backups and reverse deduplications.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SpaceRecord {
    pub store: String,
    pub week: u32,
    /// Stream bytes of all backups so far.
    pub logical_bytes: u64,
    /// Null bytes among them (never stored; excluded from the saving, as in the paper).
    pub zero_bytes: u64,
    /// Container bytes the inline phase wrote so far (what segment deduplication alone keeps).
    pub inline_stored_bytes: u64,
    pub space: SpaceMeasure,
}

impl SpaceRecord {
    /// Percent of non-null bytes not stored, after reverse deduplication.
    pub fn saving_percent(&self) -> f64 {
        saving(
            self.space.container_bytes,
            self.logical_bytes - self.zero_bytes,
        )
    }

    /// Percent of non-null bytes not stored by inline (segment) deduplication alone.
    pub fn inline_saving_percent(&self) -> f64 {
        saving(
            self.inline_stored_bytes,
            self.logical_bytes - self.zero_bytes,
        )
    }
}

fn saving(stored: u64, logical: u64) -> f64 {
    if logical == 0 {
        return f64::NAN;
    }
    100.0 * (1.0 - stored as f64 / logical as f64)
}

/// A deletion of the oldest backup from a copy of a store.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeletionRecord {
    /// Backups in the store when the deletion ran.
    pub backups: u32,
    pub container_bytes_before: u64,
    pub measure: DeleteMeasure,
}

/// Everything measured on one dataset.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DatasetResults {
    pub dataset: String,
    pub synthetic: Option<SyntheticSpec>,
    /// Bytes of the first version's files.
    pub content_bytes: u64,
    pub series: u32,
    pub versions: u32,
    /// Version labels (release names for the real series).
    pub version_names: Vec<String>,
    pub stores: Vec<StoreConfig>,
    pub changes: Vec<WeekChanges>,
    pub backups: Vec<BackupMeasure>,
    pub reverses: Vec<ReverseMeasure>,
    pub space: Vec<SpaceRecord>,
    pub restores: Vec<RestoreMeasure>,
    /// Deleting the oldest backup at growing repository sizes (Fig. 10, checkpoints).
    pub deletions: Vec<DeletionRecord>,
    /// Deleting backups one by one from the oldest, on copies of the final store (Fig. 10a).
    pub incremental_deletions: Vec<DeleteMeasure>,
    /// Deleting the n oldest backups at once, on copies of the final store (Fig. 10b).
    #[serde(default)]
    pub batch_deletions: Vec<BatchDeleteMeasure>,
    /// Runs of the dataset whose timings are here (every run generates the same versions;
    /// space is recorded from the first).
    #[serde(default = "one_run")]
    pub runs: u32,
}

fn one_run() -> u32 {
    1
}

impl DatasetResults {
    /// Adds the timings of a further run of the same dataset, numbered `run`.
    pub fn add_run(&mut self, mut other: DatasetResults, run: u32) {
        other.stamp_run(run);
        self.backups.extend(other.backups);
        self.reverses.extend(other.reverses);
        self.restores.extend(other.restores);
        self.deletions.extend(other.deletions);
        self.incremental_deletions
            .extend(other.incremental_deletions);
        self.batch_deletions.extend(other.batch_deletions);
        self.runs = self.runs.max(run + 1);
    }

    /// Numbers every timed record as run `run`.
    pub fn stamp_run(&mut self, run: u32) {
        self.backups.iter_mut().for_each(|record| record.run = run);
        self.reverses.iter_mut().for_each(|record| record.run = run);
        self.restores.iter_mut().for_each(|record| record.run = run);
        self.deletions
            .iter_mut()
            .for_each(|record| record.measure.run = run);
        self.incremental_deletions
            .iter_mut()
            .for_each(|record| record.run = run);
        self.batch_deletions
            .iter_mut()
            .for_each(|record| record.run = run);
    }
}

/// The input of a dataset: evolving images or unpacked releases.
pub enum DatasetSource<'a> {
    Synthetic {
        spec: SyntheticSpec,
        base_tree: &'a Path,
        base_image: &'a Path,
        content_bytes: u64,
    },
    Releases(&'a [Release]),
}

/// Runs `plan` over `source` in `work` (a directory of its own, removed at the end).
pub fn run_dataset(
    name: &str,
    source: DatasetSource,
    plan: &DatasetPlan,
    work: &Path,
    read_threads: usize,
    log: &mut dyn FnMut(&str),
) -> Result<DatasetResults> {
    fs::create_dir_all(work).context_io(|| format!("creating {}", work.display()))?;
    let mut stores = Vec::new();
    for config in &plan.stores {
        stores.push(StoreUnderTest::create(
            config.clone(),
            &work.join(format!("store-{}", config.label)),
            read_threads,
        )?);
    }
    let mut results = DatasetResults {
        dataset: name.to_string(),
        stores: plan.stores.clone(),
        runs: 1,
        ..DatasetResults::default()
    };
    let mut totals: HashMap<String, (u64, u64, u64)> = HashMap::new();
    // What each backup must restore to: an image hash or a release tree.
    let mut expected_hashes: HashMap<(String, u32), [u8; 32]> = HashMap::new();
    let mut expected_trees: HashMap<(String, u32), PathBuf> = HashMap::new();

    let (series_names, weeks) = match &source {
        DatasetSource::Synthetic {
            spec,
            content_bytes,
            ..
        } => {
            results.synthetic = Some(spec.clone());
            results.content_bytes = *content_bytes;
            let names: Vec<String> = if spec.series == 1 {
                vec![name.to_string()]
            } else {
                (1..=spec.series)
                    .map(|index| format!("{name}-{index:02}"))
                    .collect()
            };
            results.version_names = (1..=spec.weeks)
                .map(|week| format!("week {week}"))
                .collect();
            (names, spec.weeks)
        }
        DatasetSource::Releases(releases) => {
            results.content_bytes = super::files::directory_bytes(&releases[0].tree)?;
            results.version_names = releases
                .iter()
                .map(|release| release.version.clone())
                .collect();
            (vec![name.to_string()], releases.len() as u32)
        }
    };
    results.series = series_names.len() as u32;
    results.versions = weeks;
    let mut images = Vec::new();
    if let DatasetSource::Synthetic {
        base_tree,
        base_image,
        ..
    } = &source
    {
        for (index, series) in series_names.iter().enumerate() {
            images.push(EvolvingImage::start(
                base_image,
                base_tree,
                &work.join(format!("{series}.img")),
                seed(name, index as u64),
            )?);
        }
    }

    for week in 1..=weeks {
        for (index, series) in series_names.iter().enumerate() {
            match &source {
                DatasetSource::Synthetic { spec, .. } => {
                    if week > 1 {
                        results.changes.push(images[index].advance_week(spec)?);
                    }
                    expected_hashes
                        .insert((series.clone(), week), hash_file(images[index].path())?);
                }
                DatasetSource::Releases(releases) => {
                    expected_trees.insert(
                        (series.clone(), week),
                        releases[week as usize - 1].tree.clone(),
                    );
                }
            }
            let backup_source = || -> Result<BackupSource> {
                Ok(match &source {
                    DatasetSource::Synthetic { .. } => {
                        BackupSource::File(images[index].path().to_path_buf())
                    }
                    DatasetSource::Releases(releases) => {
                        BackupSource::Directory(releases[week as usize - 1].tree.clone())
                    }
                })
            };
            for store in &mut stores {
                let measure = store.backup(series, backup_source()?)?;
                let total = totals.entry(store.config.label.clone()).or_default();
                total.0 += measure.logical_bytes;
                total.1 += measure.zero_bytes;
                total.2 += measure.new_stored_bytes;
                results.backups.push(measure);
                results.reverses.extend(store.reverse_pending(series)?);
            }
        }
        for store in &mut stores {
            let (logical_bytes, zero_bytes, inline_stored_bytes) = totals[&store.config.label];
            results.space.push(SpaceRecord {
                store: store.config.label.clone(),
                week,
                logical_bytes,
                zero_bytes,
                inline_stored_bytes,
                space: store.space()?,
            });
        }
        let last = results.space.len();
        let summary: Vec<String> = results.space[last - stores.len()..]
            .iter()
            .map(|record| format!("{} {:.1}%", record.store, record.saving_percent()))
            .collect();
        log(&format!(
            "{name}: week {week}/{weeks}: saving {}",
            summary.join(", ")
        ));
        if plan.deletion_checkpoints.contains(&week) && week >= 2 {
            if let Some(label) = &plan.deletion_store {
                let store = find_store(&mut stores, label)?;
                results.deletions.extend(delete_oldest_on_copies(
                    store,
                    &series_names[0],
                    week,
                    work,
                )?);
            }
        }
    }
    drop(images);

    if plan.restores {
        for store in &mut stores {
            restore_all(
                store,
                &series_names,
                weeks,
                &expected_hashes,
                &expected_trees,
                work,
                &mut results.restores,
            )?;
            log(&format!(
                "{name}: restored every version from {}",
                store.config.label
            ));
        }
        for label in &plan.prefetch_stores {
            let store = find_store(&mut stores, label)?;
            store.open(true)?;
            restore_all(
                store,
                &series_names,
                weeks,
                &expected_hashes,
                &expected_trees,
                work,
                &mut results.restores,
            )?;
            store.open(false)?;
            log(&format!(
                "{name}: restored every version from {label} with prefetching"
            ));
        }
    }
    if let Some(label) = &plan.deletion_store {
        let store = find_store(&mut stores, label)?;
        results.incremental_deletions = delete_incrementally(store, &series_names[0], weeks, work)?;
        log(&format!(
            "{name}: deleted backups one by one from copies of {label}"
        ));
    }
    for (label, methods) in &plan.batch_stores {
        let store = find_store(&mut stores, label)?;
        for &count in &plan.batch_counts {
            for &method in methods {
                let mut copy = store.copy_to(&work.join("batch-copy"))?;
                results.batch_deletions.push(copy.delete_oldest(
                    &series_names[0],
                    count,
                    method,
                )?);
                copy.destroy()?;
            }
        }
        log(&format!(
            "{name}: deleted the oldest {:?} backups at once from copies of {label}",
            plan.batch_counts
        ));
    }
    for store in stores {
        store.destroy()?;
    }
    fs::remove_dir_all(work).context_io(|| format!("removing {}", work.display()))?;
    Ok(results)
}

fn find_store<'a>(stores: &'a mut [StoreUnderTest], label: &str) -> Result<&'a mut StoreUnderTest> {
    stores
        .iter_mut()
        .find(|store| store.config.label == label)
        .ok_or_else(|| LabError::InvalidOption(format!("no store {label:?} in the plan")))
}

/// A seed per dataset and series, so every run generates the same changes.
fn seed(dataset: &str, series: u64) -> u64 {
    let hash = blake3::hash(dataset.as_bytes());
    u64::from_le_bytes(hash.as_bytes()[..8].try_into().expect("eight bytes")) ^ series
}

#[allow(clippy::too_many_arguments)]
fn restore_all(
    store: &mut StoreUnderTest,
    series_names: &[String],
    weeks: u32,
    expected_hashes: &HashMap<(String, u32), [u8; 32]>,
    expected_trees: &HashMap<(String, u32), PathBuf>,
    work: &Path,
    restores: &mut Vec<RestoreMeasure>,
) -> Result<()> {
    for series in series_names {
        for week in 1..=weeks {
            let key = (series.clone(), week);
            if let Some(tree) = expected_trees.get(&key) {
                let target = work.join("restore");
                let measure = store.restore_directory(series, week, &target, Some(tree))?;
                fs::remove_dir_all(&target)
                    .context_io(|| format!("removing {}", target.display()))?;
                restores.push(measure);
            } else {
                restores.push(store.restore_hashed(
                    series,
                    week,
                    expected_hashes.get(&key).copied(),
                )?);
            }
        }
    }
    Ok(())
}

/// Deletions of the oldest backup per checkpoint and run, each on a fresh copy: the times
/// vary with the machine's load (a commit is a few fsyncs), and the runs of the dataset
/// repeat them.
const DELETION_REPETITIONS: usize = 1;

/// Copies `store` and deletes the oldest backup of `series` from each copy, by time stamp and
/// by mark and sweep, [`DELETION_REPETITIONS`] times each.
fn delete_oldest_on_copies(
    store: &mut StoreUnderTest,
    series: &str,
    backups: u32,
    work: &Path,
) -> Result<Vec<DeletionRecord>> {
    let container_bytes_before = store.space()?.container_bytes;
    let mut records = Vec::new();
    for _ in 0..DELETION_REPETITIONS {
        for method in [DeleteMethod::Timestamp, DeleteMethod::MarkAndSweep] {
            let mut copy = store.copy_to(&work.join("deletion-copy"))?;
            let measure = copy.delete(series, 1, method)?;
            copy.destroy()?;
            records.push(DeletionRecord {
                backups,
                container_bytes_before,
                measure,
            });
        }
    }
    Ok(records)
}

/// Deletes versions 1..weeks-1 one at a time from two copies of `store` (one per method).
fn delete_incrementally(
    store: &mut StoreUnderTest,
    series: &str,
    weeks: u32,
    work: &Path,
) -> Result<Vec<DeleteMeasure>> {
    let mut measures = Vec::new();
    for method in [DeleteMethod::Timestamp, DeleteMethod::MarkAndSweep] {
        let mut copy = store.copy_to(&work.join("incremental-copy"))?;
        for version in 1..weeks {
            measures.push(copy.delete(series, version, method)?);
        }
        copy.destroy()?;
    }
    Ok(measures)
}
