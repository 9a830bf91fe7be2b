//! Resolving a recipe to stored chunks: following direct references and chains of indirect
//! ones (paper 2 §2.4.1, §3.2 `restore`).
//!
//! Indirect references are resolved a whole backup at a time, one hop per step: every
//! unresolved reference of the backup is looked up in its successor's recipe, those still
//! indirect move on to the next successor, and so on. Each recipe on the chain is loaded once,
//! so a chain of `k` backups costs `k` recipe reads however many references follow it.

use std::collections::HashMap;
use std::sync::Arc;

use onecopy_core::catalog::CatalogView;
use onecopy_core::container::ChunkLocation;

use crate::error::{BackupError, Result};
use crate::recipe::{ChunkReference, Recipe};
use crate::segment::{ChunkStorage, SegmentId, SegmentRecord};
use crate::series::{load_backup, BackupRecord, SeriesRecord};
use crate::store::load_segment;

/// Segment records kept by a [`SegmentCache`] before it starts over.
const SEGMENT_CACHE_ENTRIES_MAX: usize = 4096;

/// Where one chunk of a backup's stream comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkSource {
    /// A null chunk.
    Zero { raw_bytes: u32 },
    /// Chunk `index` of segment `segment`.
    Stored { segment: SegmentId, index: u32 },
}

/// Counters of a resolution.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ResolveReport {
    pub chunks: u64,
    pub indirect_references: u64,
    /// Longest chain followed, in backups.
    pub chain_length_max: u32,
}

/// Every chunk of `backup`, in stream order.
pub fn resolve(
    view: &impl CatalogView,
    series: &SeriesRecord,
    backup: &BackupRecord,
) -> Result<(Vec<ChunkSource>, ResolveReport)> {
    let recipe = Recipe::load(view, backup.id, backup.recipe_parts)?;
    let mut report = ResolveReport::default();
    let mut sources = Vec::with_capacity(recipe.chunk_count() as usize);
    let mut pending: Vec<(usize, u64)> = Vec::new();
    match &recipe {
        Recipe::Live(entries) => {
            for entry in entries {
                for index in 0..entry.chunk_count {
                    sources.push(ChunkSource::Stored {
                        segment: entry.segment,
                        index,
                    });
                }
            }
        }
        Recipe::Archival(entries) => {
            for entry in entries {
                sources.push(match *entry {
                    ChunkReference::Zero { raw_bytes } => ChunkSource::Zero { raw_bytes },
                    ChunkReference::Direct { segment, index, .. } => {
                        ChunkSource::Stored { segment, index }
                    }
                    ChunkReference::Indirect { ordinal, .. } => {
                        pending.push((sources.len(), ordinal));
                        report.indirect_references += 1;
                        // Placeholder, replaced below.
                        ChunkSource::Zero { raw_bytes: 0 }
                    }
                });
            }
        }
    }
    let mut version = backup.version;
    while !pending.is_empty() {
        let (next_version, next_id) = series.successor(version).ok_or_else(|| {
            BackupError::corrupt(
                format!("backup {}@{}", series.name, backup.version),
                format!("indirect references past version {version}, the newest"),
            )
        })?;
        report.chain_length_max += 1;
        let next = load_backup(view, next_id)?;
        let next_recipe = Recipe::load(view, next.id, next.recipe_parts)?;
        let starts = next_recipe.live_starts();
        let mut still = Vec::new();
        for (position, ordinal) in pending {
            let corrupt = || {
                BackupError::corrupt(
                    format!("backup {}@{}", series.name, backup.version),
                    format!("indirect reference to chunk {ordinal} of version {next_version}, which has none"),
                )
            };
            sources[position] = match &next_recipe {
                Recipe::Live(_) => {
                    let found = next_recipe
                        .live_position(&starts, ordinal)
                        .ok_or_else(corrupt)?;
                    ChunkSource::Stored {
                        segment: found.segment,
                        index: found.index,
                    }
                }
                Recipe::Archival(entries) => {
                    match *entries.get(ordinal as usize).ok_or_else(corrupt)? {
                        ChunkReference::Zero { raw_bytes } => ChunkSource::Zero { raw_bytes },
                        ChunkReference::Direct { segment, index, .. } => {
                            ChunkSource::Stored { segment, index }
                        }
                        ChunkReference::Indirect { ordinal, .. } => {
                            still.push((position, ordinal));
                            continue;
                        }
                    }
                }
            };
        }
        pending = still;
        version = next_version;
    }
    report.chunks = sources.len() as u64;
    Ok((sources, report))
}

/// Segment records read during one operation, shared between threads.
pub struct SegmentCache {
    records: HashMap<SegmentId, Arc<SegmentRecord>>,
}

impl SegmentCache {
    pub fn new() -> Self {
        SegmentCache {
            records: HashMap::new(),
        }
    }

    /// The record of `segment`, read once.
    pub fn get(
        &mut self,
        view: &impl CatalogView,
        segment: SegmentId,
    ) -> Result<Arc<SegmentRecord>> {
        if let Some(record) = self.records.get(&segment) {
            return Ok(Arc::clone(record));
        }
        if self.records.len() >= SEGMENT_CACHE_ENTRIES_MAX {
            self.records.clear();
        }
        let record = Arc::new(load_segment(view, segment)?);
        self.records.insert(segment, Arc::clone(&record));
        Ok(record)
    }
}

impl Default for SegmentCache {
    fn default() -> Self {
        Self::new()
    }
}

/// Where the bytes of a stored chunk are ([`locate`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ChunkBytes {
    /// A null chunk: zeros.
    Zero,
    /// In frame `frame`, from raw byte `within`.
    Frame { frame: ChunkLocation, within: u32 },
    /// Recorded as lost by a repair (its own bytes, or those of the chunk it borrows).
    Lost,
}

/// Where chunk `index` of `segment` reads from, and its size: its own frame, or the frame of
/// the chunk it borrows. A removed chunk, or a borrowed one whose lender does not hold it, is
/// corruption.
pub(crate) fn locate(
    view: &impl CatalogView,
    cache: &mut SegmentCache,
    segment: SegmentId,
    index: u32,
) -> Result<(ChunkBytes, u32)> {
    let record = cache.get(view, segment)?;
    let chunk = *record.chunks.get(index as usize).ok_or_else(|| {
        BackupError::corrupt(format!("segment {segment}"), format!("no chunk {index}"))
    })?;
    let bytes = match chunk.storage {
        ChunkStorage::Zero => ChunkBytes::Zero,
        ChunkStorage::Stored(place) => ChunkBytes::Frame {
            frame: *record.frame(place),
            within: place.within,
        },
        ChunkStorage::Lost => ChunkBytes::Lost,
        ChunkStorage::Removed => {
            return Err(BackupError::corrupt(
                format!("segment {segment}"),
                format!("chunk {index} is referenced but was removed"),
            ))
        }
        ChunkStorage::Borrowed {
            segment: lender,
            index: lent,
        } => {
            let lender_record = cache.get(view, lender)?;
            let lent_chunk = lender_record.chunks.get(lent as usize);
            match lent_chunk.map(|lent_chunk| (lent_chunk.storage, lent_chunk.raw_bytes)) {
                Some((ChunkStorage::Stored(place), raw_bytes)) if raw_bytes == chunk.raw_bytes => {
                    ChunkBytes::Frame {
                        frame: *lender_record.frame(place),
                        within: place.within,
                    }
                }
                Some((ChunkStorage::Lost, _)) => ChunkBytes::Lost,
                _ => {
                    return Err(BackupError::corrupt(
                        format!("chunk {index} of segment {segment}"),
                        format!(
                            "it borrows chunk {lent} of segment {lender}, which does not hold it"
                        ),
                    ))
                }
            }
        }
    };
    Ok((bytes, chunk.raw_bytes))
}
