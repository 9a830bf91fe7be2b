//! Planning a reverse deduplication; see the [module documentation](super).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Instant;

use onecopy_core::catalog::CatalogView;
use onecopy_core::fingerprint::Fingerprint;
use serde::Serialize;

use crate::changes::Changes;
use crate::error::{BackupError, Result};
use crate::recipe::{ChunkReference, Recipe};
use crate::resolve::{resolve, ChunkSource, SegmentCache};
use crate::segment::{ChunkStorage, SegmentId};
use crate::series::{load_backup, load_series, BackupRecord, BackupState, SeriesRecord};
use crate::settle::{plan_settlement, Settlement};
use crate::store::BackupStore;

/// What reverse-deduplicating one backup will do.
#[derive(Clone, Debug, Serialize)]
pub struct ReversePlan {
    pub series: String,
    pub version: u32,
    pub successor_version: u32,
    /// Bytes of the backup's stream.
    pub logical_bytes: u64,
    pub chunks: u64,
    pub zero_chunks: u64,
    /// Chunks that become (or stay) indirect references to the successor.
    pub indirect_chunks: u64,
    pub direct_chunks: u64,
    /// Segments the successor holds too, mapped to it without reading their records.
    pub shared_segments: u64,
    pub settlement: Settlement,
    pub plan_seconds: f64,
    /// Catalog serial the plan was made at; executing it later is refused.
    #[serde(skip)]
    pub(crate) serial: u64,
    #[serde(skip)]
    pub(crate) changes: Changes,
}

impl BackupStore {
    /// Versions of `series` waiting for reverse deduplication: outside the live window, with a
    /// successor, oldest first (the order they must be processed in).
    pub fn pending_reverse(&self, series: &str) -> Result<Vec<u32>> {
        let read = self.catalog.read()?;
        let record = load_series(&read, series)?;
        let mut pending = Vec::new();
        for (&version, &id) in &record.versions {
            if record.in_live_window(version) || record.successor(version).is_none() {
                continue;
            }
            if load_backup(&read, id)?.reverse_pending {
                pending.push(version);
            }
        }
        Ok(pending)
    }

    /// Plans the reverse deduplication of `series@version` against its successor.
    pub fn plan_reverse(&self, series: &str, version: u32) -> Result<ReversePlan> {
        let started = Instant::now();
        let read = self.catalog.read()?;
        let series_record = load_series(&read, series)?;
        let id =
            *series_record
                .versions
                .get(&version)
                .ok_or_else(|| BackupError::VersionNotFound {
                    series: series.to_string(),
                    version,
                })?;
        let mut backup = load_backup(&read, id)?;
        if !backup.reverse_pending {
            return Err(BackupError::InvalidArgument(format!(
                "backup {series}@{version} is already reverse-deduplicated"
            )));
        }
        let (successor_version, successor_id) =
            series_record.successor(version).ok_or_else(|| {
                BackupError::InvalidArgument(format!(
                    "backup {series}@{version} is the newest: there is nothing to deduplicate \
                     it against yet"
                ))
            })?;
        let successor = load_backup(&read, successor_id)?;
        let recipe = Recipe::load(&read, backup.id, backup.recipe_parts)?;

        // A segment both backups hold (unchanged data, placed by the files cache or found
        // inline) maps chunk by chunk to its place in the successor without reading its
        // record: the first ordinal of each segment of a live successor.
        let successor_recipe = Recipe::load(&read, successor.id, successor.recipe_parts)?;
        let mut successor_starts: HashMap<SegmentId, u64> = HashMap::new();
        if let Recipe::Live(entries) = &successor_recipe {
            let mut ordinal = 0u64;
            for entry in entries {
                successor_starts.entry(entry.segment).or_insert(ordinal);
                ordinal += entry.chunk_count as u64;
            }
        }
        let own: HashSet<SegmentId> = match &recipe {
            Recipe::Live(references) => references.iter().map(|entry| entry.segment).collect(),
            Recipe::Archival(_) => HashSet::new(),
        };
        let all_shared = matches!(&recipe, Recipe::Live(references)
            if references.iter().all(|entry| successor_starts.contains_key(&entry.segment)));
        // The other chunks are looked up by fingerprint among the successor's chunks, except
        // those of segments the backup holds itself: a chunk found only there is a duplicate
        // within the backup, which stays a direct reference.
        let following = if all_shared {
            HashMap::new()
        } else {
            successor_fingerprints(&read, &series_record, &successor, &successor_recipe, &own)?
        };
        let mut changes = Changes::default();
        let mut candidates = BTreeSet::new();
        let mut shared_segments = 0u64;
        let mut entries = Vec::with_capacity(recipe.chunk_count() as usize);
        let what = format!("backup {series}@{version}");
        match &recipe {
            Recipe::Live(references) => {
                for reference in references {
                    changes.release_live_reference(&read, reference.segment, &what)?;
                    if let Some(&start) = successor_starts.get(&reference.segment) {
                        // Still shared by the successor: nothing settles, nothing is read.
                        shared_segments += 1;
                        entries.extend((0..reference.chunk_count as u64).map(|index| {
                            ChunkReference::Indirect {
                                ordinal: start + index,
                            }
                        }));
                        continue;
                    }
                    candidates.insert(reference.segment);
                    let record = changes.record_mut(&read, reference.segment)?;
                    for (index, chunk) in record.chunks.iter_mut().enumerate() {
                        let raw_bytes = chunk.raw_bytes;
                        entries.push(match chunk.storage {
                            ChunkStorage::Zero => ChunkReference::Zero { raw_bytes },
                            ChunkStorage::Removed => {
                                return Err(BackupError::corrupt(
                                    &what,
                                    "a live segment lost a chunk",
                                ))
                            }
                            // A lost chunk the successor stores intact heals here.
                            ChunkStorage::Stored(_)
                            | ChunkStorage::Lost
                            | ChunkStorage::Borrowed { .. } => {
                                match following.get(&chunk.fingerprint) {
                                    Some(&ordinal) => ChunkReference::Indirect { ordinal },
                                    None => {
                                        chunk.direct_references += 1;
                                        ChunkReference::Direct {
                                            raw_bytes,
                                            segment: reference.segment,
                                            index: index as u32,
                                        }
                                    }
                                }
                            }
                        });
                    }
                }
            }
            Recipe::Archival(references) => {
                // Its successor was deleted while it was the newest: only direct references
                // (and zeros) are left; re-check them against the new successor.
                for &reference in references {
                    let ChunkReference::Direct { segment, index, .. } = reference else {
                        entries.push(reference);
                        continue;
                    };
                    let record = changes.record_mut(&read, segment)?;
                    let chunk = record.chunks.get_mut(index as usize).ok_or_else(|| {
                        BackupError::corrupt(
                            &what,
                            format!("segment {segment} has no chunk {index}"),
                        )
                    })?;
                    match following.get(&chunk.fingerprint) {
                        Some(&ordinal) => {
                            chunk.direct_references = chunk.direct_references.checked_sub(1).ok_or_else(|| {
                                BackupError::corrupt(&what, format!("chunk {index} of segment {segment} has no direct reference"))
                            })?;
                            candidates.insert(segment);
                            entries.push(ChunkReference::Indirect { ordinal });
                        }
                        None => entries.push(reference),
                    }
                }
            }
        }
        let mut plan = ReversePlan {
            series: series.to_string(),
            version,
            successor_version,
            logical_bytes: backup.logical_bytes,
            chunks: entries.len() as u64,
            zero_chunks: 0,
            indirect_chunks: 0,
            direct_chunks: 0,
            shared_segments,
            settlement: Settlement::default(),
            plan_seconds: 0.0,
            serial: self.state.serial,
            changes: Changes::default(),
        };
        for entry in &entries {
            match entry {
                ChunkReference::Zero { .. } => plan.zero_chunks += 1,
                ChunkReference::Direct { .. } => plan.direct_chunks += 1,
                ChunkReference::Indirect { .. } => plan.indirect_chunks += 1,
            }
        }
        let settlement = plan_settlement(&mut changes, &read, &candidates, backup.created_unix_ns)?;
        let archival = Recipe::Archival(entries);
        backup.state = BackupState::Archival;
        backup.reverse_pending = false;
        backup.archival_bytes += settlement.copy_archival_bytes;
        let previous_parts = backup.recipe_parts;
        backup.recipe_parts = archival.part_count();
        changes
            .recipes
            .insert(backup.id, (Some(archival), previous_parts));
        changes.backups.insert(backup.id, Some(backup));
        plan.settlement = settlement;
        plan.changes = changes;
        plan.plan_seconds = started.elapsed().as_secs_f64();
        Ok(plan)
    }
}

/// The fingerprints of the successor's stored chunks, with the first ordinal of each, leaving
/// out the chunks of the segments in `skipped`.
fn successor_fingerprints(
    read: &impl CatalogView,
    series: &SeriesRecord,
    successor: &BackupRecord,
    successor_recipe: &Recipe,
    skipped: &HashSet<SegmentId>,
) -> Result<HashMap<Fingerprint, u64>> {
    let mut cache = SegmentCache::new();
    let mut following = HashMap::new();
    let mut add = |ordinal: u64, segment: SegmentId, index: u32| -> Result<()> {
        let record = cache.get(read, segment)?;
        let chunk = record.chunks.get(index as usize).ok_or_else(|| {
            BackupError::corrupt(format!("segment {segment}"), format!("no chunk {index}"))
        })?;
        // Chunks that read (stored, or borrowed from a stored one); zero chunks keep no
        // fingerprint.
        if matches!(
            chunk.storage,
            ChunkStorage::Stored(_) | ChunkStorage::Borrowed { .. }
        ) {
            following.entry(chunk.fingerprint).or_insert(ordinal);
        }
        Ok(())
    };
    match successor_recipe {
        Recipe::Live(entries) => {
            let mut ordinal = 0u64;
            for entry in entries {
                if !skipped.contains(&entry.segment) {
                    for index in 0..entry.chunk_count {
                        add(ordinal + index as u64, entry.segment, index)?;
                    }
                }
                ordinal += entry.chunk_count as u64;
            }
        }
        Recipe::Archival(_) => {
            let (sources, _) = resolve(read, series, successor)?;
            for (ordinal, source) in sources.iter().enumerate() {
                if let ChunkSource::Stored { segment, index } = *source {
                    if !skipped.contains(&segment) {
                        add(ordinal as u64, segment, index)?;
                    }
                }
            }
        }
    }
    Ok(following)
}
