//! `backup check`: verifies that every recipe resolves and every checksum holds.
//!
//! What is checked, in order:
//!
//! 1. the catalog's own page checksums;
//! 2. every backup of every series: its recipe decodes, every indirect chain ends at a stored
//!    or null chunk, the sizes add up to the backup's size;
//! 3. the two-level reference counts: each segment's count equals its occurrences in live
//!    recipes, each chunk's count its direct references in archival recipes; heads agree
//!    with records; shared segments are complete;
//! 4. containers: each record's file exists, its trailer's time stamp matches, and every
//!    stored chunk of its segments is in its trailer with the same fingerprint, sizes and CRC;
//! 5. with [`CheckOptions::read_data`], every stored chunk is read, its CRC checked,
//!    decompressed and fingerprinted again.
//!
//! Leftovers of an interrupted command are *not* errors: containers without a record and a
//! segment index out of step with the catalog are reported as warnings (the next mutating
//! command removes or reconciles them).

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use onecopy_core::catalog::CatalogView;
use onecopy_core::container::{ContainerId, ContainerStore};
use onecopy_core::fingerprint::FingerprintAlgorithm;
use rayon::prelude::*;
use serde::Serialize;

use crate::error::Result;
use crate::recipe::{ChunkReference, Recipe};
use crate::resolve::{resolve, ChunkSource, SegmentCache};
use crate::restore::decode_chunk;
use crate::segment::{
    ChunkStorage, ContainerKind, ContainerRecord, SegmentHead, SegmentRecord, SegmentState,
    CONTAINERS, SEGMENTS, SEGMENT_HEADS,
};
use crate::series::{load_backup, SeriesRecord, BACKUPS, SERIES};
use crate::store::{by_index_key, indexable_segments, BackupStore};

/// Errors listed before the check stops collecting them.
const ERRORS_LISTED_MAX: usize = 200;

/// What to check.
#[derive(Clone, Copy, Debug)]
pub struct CheckOptions {
    /// Read and verify every stored chunk (default true).
    pub read_data: bool,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions { read_data: true }
    }
}

/// What a check found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CheckReport {
    pub series: u64,
    pub backups: u64,
    pub segments: u64,
    pub containers: u64,
    pub chunks_verified: u64,
    pub bytes_verified: u64,
    /// Problems that make a backup unrestorable or the counts wrong.
    pub errors: Vec<String>,
    /// Leftovers of interrupted commands, repaired by the next mutating command.
    pub warnings: Vec<String>,
    pub seconds: f64,
}

impl CheckReport {
    /// True when no error was found.
    pub fn is_ok(&self) -> bool {
        self.errors.is_empty()
    }

    fn error(&mut self, message: String) {
        if self.errors.len() < ERRORS_LISTED_MAX {
            self.errors.push(message);
        }
    }
}

impl BackupStore {
    /// Checks the store; see the module documentation. Changes nothing.
    pub fn check(&mut self, options: CheckOptions) -> Result<CheckReport> {
        let started = Instant::now();
        let mut report = CheckReport::default();
        self.catalog.read_ahead();
        if !self.catalog.verify()? {
            report.error("the catalog failed its integrity check".to_string());
        }
        let read = self.catalog.read()?;
        let mut live_counts: HashMap<u64, u32> = HashMap::new();
        let mut direct_counts: HashMap<(u64, u32), u32> = HashMap::new();
        let mut listed_backups = HashSet::new();
        let mut cache = SegmentCache::new();
        for (name, series) in read.list_json::<SeriesRecord>(SERIES)? {
            report.series += 1;
            for (&version, &id) in &series.versions {
                listed_backups.insert(id);
                report.backups += 1;
                let label = format!("backup {name}@{version}");
                if let Err(error) = check_backup(
                    &read,
                    &series,
                    id,
                    &mut cache,
                    &mut live_counts,
                    &mut direct_counts,
                ) {
                    report.error(format!("{label}: {error}"));
                }
            }
        }
        for (id, _) in read.range_id(BACKUPS, 0, u64::MAX)? {
            if !listed_backups.contains(&id) {
                report.error(format!("backup record {id} belongs to no series"));
            }
        }

        let heads: HashMap<u64, Vec<u8>> = read
            .range_id(SEGMENT_HEADS, 0, u64::MAX)?
            .into_iter()
            .collect();
        let mut records: HashMap<u64, SegmentRecord> = HashMap::new();
        for (id, bytes) in read.range_id(SEGMENTS, 0, u64::MAX)? {
            report.segments += 1;
            match SegmentRecord::decode(&bytes, id) {
                Ok(record) => {
                    records.insert(id, record);
                }
                Err(error) => report.error(error.to_string()),
            }
        }
        for (&id, bytes) in &heads {
            let head = match SegmentHead::decode(bytes, id) {
                Ok(head) => head,
                Err(error) => {
                    report.error(error.to_string());
                    continue;
                }
            };
            let Some(record) = records.get(&id) else {
                report.error(format!("segment {id} has a head but no record"));
                continue;
            };
            if head.fingerprint != record.fingerprint || head.state != record.state {
                report.error(format!("segment {id}: head and record disagree"));
            }
            let counted = live_counts.get(&id).copied().unwrap_or(0);
            if head.live_references != counted {
                report.error(format!(
                    "segment {id}: {} live references recorded, {counted} in live recipes",
                    head.live_references
                ));
            }
            if head.state == SegmentState::Shared
                && record
                    .chunks
                    .iter()
                    .any(|chunk| matches!(chunk.storage, ChunkStorage::Removed))
            {
                report.error(format!("segment {id} is shared but lost chunks"));
            }
            if head.state == SegmentState::Archival && head.live_references > 0 {
                report.error(format!("segment {id} is archival but live recipes use it"));
            }
            for (index, chunk) in record.chunks.iter().enumerate() {
                let counted = direct_counts.get(&(id, index as u32)).copied().unwrap_or(0);
                if chunk.direct_references != counted {
                    report.error(format!(
                        "chunk {index} of segment {id}: {} direct references recorded, {counted} in archival recipes",
                        chunk.direct_references
                    ));
                }
            }
        }
        for &id in records.keys() {
            if !heads.contains_key(&id) {
                report.error(format!("segment {id} has a record but no head"));
            }
        }

        let mut container_records: HashMap<ContainerId, ContainerRecord> = HashMap::new();
        for (id, bytes) in read.range_id(CONTAINERS, 0, u64::MAX)? {
            report.containers += 1;
            match ContainerRecord::decode(&bytes, id) {
                Ok(record) => {
                    container_records.insert(id, record);
                }
                Err(error) => report.error(error.to_string()),
            }
        }
        for (&id, record) in &records {
            if let Some(container) = record.container {
                let listed = container_records
                    .get(&container)
                    .is_some_and(|container_record| container_record.segments.contains(&id));
                if !listed {
                    report.error(format!("segment {id} is in container {container:016x}, whose record does not list it"));
                }
                if record.state == SegmentState::Shared
                    && container_records
                        .get(&container)
                        .is_some_and(|c| c.kind != ContainerKind::Shared)
                {
                    report.error(format!(
                        "shared segment {id} is in archival container {container:016x}"
                    ));
                }
            }
        }
        let verified: Vec<std::result::Result<(u64, u64), String>> = container_records
            .par_iter()
            .map(|(&id, record)| {
                check_container(
                    &self.containers,
                    self.state.options.fingerprint,
                    id,
                    record,
                    &records,
                    options.read_data,
                )
            })
            .collect();
        for outcome in verified {
            match outcome {
                Ok((chunks, bytes)) => {
                    report.chunks_verified += chunks;
                    report.bytes_verified += bytes;
                }
                Err(message) => report.error(message),
            }
        }

        for id in self.containers.list()? {
            if !container_records.contains_key(&id) {
                report.warnings.push(format!(
                    "container {id:016x} has no record (left by an interrupted command; removed by the next change)"
                ));
            }
        }
        let expected = by_index_key(&indexable_segments(&read)?);
        let mut index_entries = 0u64;
        let mut index_mismatch = 0u64;
        self.index.for_each_entry(&mut self.pages, |key, id| {
            index_entries += 1;
            if expected.get(key) != Some(&id) {
                index_mismatch += 1;
            }
        })?;
        if index_mismatch > 0 || index_entries != expected.len() as u64 {
            report.warnings.push(format!(
                "the segment index holds {index_entries} entries ({index_mismatch} stale) for {} shared \
                 segments (reconciled by the next change)",
                expected.len()
            ));
        }
        report.seconds = started.elapsed().as_secs_f64();
        Ok(report)
    }
}

fn check_container(
    containers: &ContainerStore,
    algorithm: FingerprintAlgorithm,
    id: ContainerId,
    record: &ContainerRecord,
    records: &HashMap<u64, SegmentRecord>,
    read_data: bool,
) -> std::result::Result<(u64, u64), String> {
    let label = format!("container {id:016x}");
    let contents = containers
        .read_contents(id)
        .map_err(|error| format!("{label}: {error}"))?;
    if contents.timestamp != record.timestamp {
        return Err(format!(
            "{label}: time stamp {} in its trailer, {} in its record",
            contents.timestamp, record.timestamp
        ));
    }
    let by_offset: HashMap<u32, _> = contents
        .chunks
        .iter()
        .map(|chunk| (chunk.location.offset, chunk))
        .collect();
    let file = if read_data {
        Some(
            containers
                .file(id)
                .map_err(|error| format!("{label}: {error}"))?,
        )
    } else {
        None
    };
    let (mut chunks, mut bytes) = (0u64, 0u64);
    for &segment in &record.segments {
        let segment_record = records
            .get(&segment)
            .ok_or_else(|| format!("{label} lists segment {segment}, which has no record"))?;
        if segment_record.container != Some(id) {
            return Err(format!(
                "{label} lists segment {segment}, which is elsewhere"
            ));
        }
        for (index, chunk) in segment_record.chunks.iter().enumerate() {
            let ChunkStorage::Stored(location) = chunk.storage else {
                continue;
            };
            let matches = by_offset.get(&location.offset).is_some_and(|stored| {
                stored.fingerprint == chunk.fingerprint && stored.location == location
            });
            if !matches {
                return Err(format!(
                    "{label}: chunk {index} of segment {segment} is not in its trailer"
                ));
            }
            if let Some(file) = &file {
                let mut stored = vec![0u8; location.stored_bytes as usize];
                file.read_at(location.offset as u64, &mut stored)
                    .map_err(|error| format!("{label}: {error}"))?;
                let raw = decode_chunk(&location, &stored).map_err(|error| error.to_string())?;
                if algorithm.hash(&raw) != chunk.fingerprint {
                    return Err(format!(
                        "{label}: chunk {index} of segment {segment} has the wrong fingerprint"
                    ));
                }
                chunks += 1;
                bytes += raw.len() as u64;
            }
        }
    }
    Ok((chunks, bytes))
}

/// Checks one backup's recipe and chains, and counts its references.
fn check_backup(
    read: &impl CatalogView,
    series: &SeriesRecord,
    id: u64,
    cache: &mut SegmentCache,
    live_counts: &mut HashMap<u64, u32>,
    direct_counts: &mut HashMap<(u64, u32), u32>,
) -> Result<()> {
    let backup = load_backup(read, id)?;
    let recipe = Recipe::load(read, backup.id, backup.recipe_parts)?;
    match &recipe {
        Recipe::Live(references) => {
            for reference in references {
                *live_counts.entry(reference.segment).or_insert(0) += 1;
            }
        }
        Recipe::Archival(references) => {
            for reference in references {
                if let ChunkReference::Direct { segment, index, .. } = *reference {
                    *direct_counts.entry((segment, index)).or_insert(0) += 1;
                }
            }
        }
    }
    let (sources, _) = resolve(read, series, &backup)?;
    let mut bytes = 0u64;
    for source in &sources {
        bytes += match *source {
            ChunkSource::Zero { raw_bytes } => raw_bytes as u64,
            ChunkSource::Stored { segment, index } => {
                let record = cache.get(read, segment)?;
                let chunk = record.chunks.get(index as usize).ok_or_else(|| {
                    crate::error::BackupError::corrupt(
                        format!("segment {segment}"),
                        format!("no chunk {index}"),
                    )
                })?;
                if matches!(chunk.storage, ChunkStorage::Removed) {
                    return Err(crate::error::BackupError::corrupt(
                        format!("segment {segment}"),
                        format!("chunk {index} was removed but is still referenced"),
                    ));
                }
                chunk.raw_bytes as u64
            }
        };
    }
    if bytes != backup.logical_bytes || sources.len() as u64 != backup.chunk_count {
        return Err(crate::error::BackupError::corrupt(
            "recipe",
            format!(
                "{} chunks of {bytes} bytes, the record says {} chunks of {} bytes",
                sources.len(),
                backup.chunk_count,
                backup.logical_bytes
            ),
        ));
    }
    Ok(())
}
