//! `check --repair`: fixing what a check found.
//!
//! A repair acts on the findings of the check that just ran ([`crate::inspection`]), in the write
//! order every operation keeps (data, then catalog, then index; removals after the commit
//! that stops referring to them), so that a crash at any point leaves a store the next
//! command recovers and the next repair finishes:
//!
//! 1. recovery ([`BackupStore::recover`]), then the leftovers: container files no record
//!    names and temporary files are removed;
//! 2. derived catalog records are rebuilt from primary ones and committed: segment heads and
//!    their live reference counts from the live recipes, chunks' direct reference counts from
//!    the archival recipes, container records from the segment records that place chunks in
//!    them; backup records their series forgot are listed again, and series records that do
//!    not decode are rebuilt from their backups' records. When some recipe cannot be read, no
//!    count is lowered (a leak is better than releasing a chunk a backup may need);
//! 3. every damaged container is rewritten: each frame a segment record places in it is read
//!    and verified (CRC, decompression, the fingerprint of each stored chunk); intact frames
//!    are copied (or, holding removed chunks, written again from their stored ones), and each
//!    chunk of a damaged frame is replaced by an intact copy with the same fingerprint stored
//!    anywhere else in the store, and otherwise marked lost ([`crate::losses`]). New
//!    containers are synced, the catalog commits, then the old files go;
//! 4. what is lost is mapped to backups and files and recorded in the catalog (table
//!    `losses`), with damage nothing can rebuild (an unreadable recipe, say), so that later
//!    checks report it as lost rather than as new damage;
//! 5. the segment index is rebuilt from the catalog.
//!
//! Commits release the space reserve first, so a repair works on a full disk as far as it
//! frees space (rewriting a container needs room for its intact chunks).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use onecopy_core::catalog::CatalogView;
use onecopy_core::check::{CheckOptions, FaceReport, Finding, FindingKind};
use onecopy_core::container::{ChunkLocation, ContainerId, ContainerWriter};
use onecopy_core::fingerprint::Fingerprint;
use onecopy_core::storage::Storage;

use crate::changes::Changes;
use crate::error::{BackupError, Result};
use crate::frames::{FrameCoding, FrameWriter};
use crate::inspection::{
    face_path, verify_frame, Inspection, PlacedFrame, Problem, ReferenceCounts, FACE,
};
use crate::losses::{self, put_losses, LossRecord};
use crate::recipe::{ChunkReference, Recipe};
use crate::resolve::{resolve, SegmentCache};
use crate::segment::{
    segment_records, ChunkStorage, ContainerKind, SegmentContainer, SegmentHead, SegmentId,
    SegmentRecord, CONTAINERS, SEGMENT_HEADS,
};
use crate::series::{BackupId, BackupRecord, SeriesRecord, BACKUPS, SERIES};
use crate::store::{now_unix_ns, BackupStore, CATALOG_FILE};

/// Where a stored chunk is, for finding intact copies of damaged ones.
#[derive(Clone, Copy, Debug)]
struct ChunkCopy {
    segment: SegmentId,
    index: u32,
    frame: ChunkLocation,
    within: u32,
    raw_bytes: u32,
}

/// What the rewrite of one damaged container did.
#[derive(Default)]
struct Rewritten {
    new_id: Option<ContainerId>,
    copied: u64,
    redirected: Vec<String>,
    lost: Vec<(SegmentId, u32)>,
}

impl BackupStore {
    /// Repairs what `inspection` found; see the module documentation.
    pub(crate) fn repair(&mut self, inspection: Inspection) -> Result<FaceReport> {
        self.mutate("repairing the backup store", |store| {
            store.repair_unguarded(inspection)
        })
    }

    fn repair_unguarded(&mut self, mut inspection: Inspection) -> Result<FaceReport> {
        self.recover()?;
        self.rewrite_catalog_header(&mut inspection)?;
        self.remove_leftovers(&mut inspection)?;
        self.rebuild_derived_records(&mut inspection)?;
        let lost_chunks = self.rewrite_damaged_containers(&mut inspection)?;
        self.record_losses(&mut inspection, &lost_chunks)?;
        self.rebuild_index()?;
        let index_state = if self.index.is_some() {
            "rebuilt from the catalog"
        } else {
            "could not be rebuilt (see the notices); the store runs without it"
        };
        for (finding, problem) in &mut inspection.findings {
            if *problem == Problem::Index && finding.repair.is_none() {
                finding.repair = Some(index_state.to_string());
            }
        }
        self.restore_reserve();
        Ok(inspection.report(true))
    }

    /// Damage to the header of a catalog that opened: a commit writes the whole header again
    /// from what redb holds in memory (the new commit goes into the damaged slot).
    fn rewrite_catalog_header(&mut self, inspection: &mut Inspection) -> Result<()> {
        if !inspection
            .findings
            .iter()
            .any(|(_, problem)| *problem == Problem::CatalogHeader)
        {
            return Ok(());
        }
        let state = self.state.clone();
        self.release_reserve()?;
        let write = self.catalog.write()?;
        self.commit(write, state, &[])?;
        let left = onecopy_core::catalog::Catalog::inspect_header(&self.storage, CATALOG_FILE)?;
        for (finding, problem) in &mut inspection.findings {
            if *problem == Problem::CatalogHeader {
                finding.repair = left.is_empty().then(|| {
                    "rewritten by a commit from the header redb holds in memory".to_string()
                });
            }
        }
        Ok(())
    }

    /// Step 1: leftover containers (highest id first, each removal durable before the next,
    /// as in recovery) and temporary files.
    fn remove_leftovers(&mut self, inspection: &mut Inspection) -> Result<()> {
        let mut containers: Vec<ContainerId> = Vec::new();
        let mut files = Vec::new();
        for (_, problem) in &inspection.findings {
            match problem {
                Problem::LeftoverContainer(id) => containers.push(*id),
                Problem::LeftoverFile(name) => files.push(name.clone()),
                _ => {}
            }
        }
        containers.sort_unstable();
        for &id in containers.iter().rev() {
            self.remove_containers(&[id])?;
        }
        for name in &files {
            self.storage.remove(name)?;
            self.storage
                .sync_directory(onecopy_core::storage::parent_directory(name))?;
        }
        for (finding, problem) in &mut inspection.findings {
            if matches!(
                problem,
                Problem::LeftoverContainer(_) | Problem::LeftoverFile(_)
            ) {
                finding.repair = Some("removed".to_string());
            }
        }
        Ok(())
    }

    /// Step 2: derived records, unlisted backups and undecodable series, in one commit.
    fn rebuild_derived_records(&mut self, inspection: &mut Inspection) -> Result<()> {
        let wanted = inspection.findings.iter().any(|(_, problem)| {
            matches!(
                problem,
                Problem::DerivedCatalog | Problem::UnlistedBackup(_) | Problem::DamagedSeries(_)
            )
        });
        if !wanted {
            return Ok(());
        }
        let read = self.catalog.read()?;
        let mut changes = Changes::default();
        let mut series = self.repaired_series(&read, inspection)?;
        for record in series.values_mut() {
            changes.series.insert(record.name.clone(), record.clone());
        }
        let counts = count_references(&read, &series)?;
        let complete = counts.complete && inspection.counts_complete;
        let mut rewritten = (0u64, 0u64, 0u64);
        let mut records: HashMap<SegmentId, SegmentRecord> = HashMap::new();
        for (id, bytes) in segment_records(&read)? {
            if let Ok(record) = SegmentRecord::decode(&bytes, id) {
                records.insert(id, record);
            }
        }
        let settle = |recorded: u32, counted: u32| {
            if complete {
                counted
            } else {
                recorded.max(counted)
            }
        };
        let borrows = borrow_counts(records.values());
        for (&id, record) in &records {
            let mut fixed = record.clone();
            for (index, chunk) in fixed.chunks.iter_mut().enumerate() {
                if chunk.storage.is_held() {
                    let key = (id, index as u32);
                    let counted = counts.direct.get(&key).copied().unwrap_or(0)
                        + borrows.get(&key).copied().unwrap_or(0);
                    chunk.direct_references = settle(chunk.direct_references, counted);
                }
            }
            if fixed != *record {
                rewritten.1 += 1;
                changes.records.insert(id, Some(fixed));
            }
            let stored_head = read
                .get_id(SEGMENT_HEADS, id)?
                .and_then(|bytes| SegmentHead::decode(&bytes, id).ok());
            let counted = counts.live.get(&id).copied().unwrap_or(0);
            let head = SegmentHead {
                fingerprint: record.fingerprint,
                state: record.state,
                live_references: settle(
                    stored_head.map_or(0, |head| head.live_references),
                    counted,
                ),
            };
            if stored_head != Some(head) {
                rewritten.0 += 1;
                changes.heads.insert(id, Some(head));
            }
        }
        for (id, _) in read.range_id(SEGMENT_HEADS, 0, u64::MAX)? {
            if !records.contains_key(&id) && !counts.live.contains_key(&id) {
                rewritten.0 += 1;
                changes.heads.insert(id, None);
            }
        }
        // Container records from the segment records that place chunks in them.
        let mut holding: BTreeMap<ContainerId, Vec<SegmentId>> = BTreeMap::new();
        for (&id, record) in &records {
            if let Some(container) = record.container {
                holding.entry(container).or_default().push(id);
            }
        }
        let mut dropped = Vec::new();
        for (id, _) in read.range_id(CONTAINERS, 0, u64::MAX)? {
            if !holding.contains_key(&id) {
                rewritten.2 += 1;
                changes.containers.insert(id, None);
                dropped.push(id);
            }
        }
        for (&id, segments) in &mut holding {
            segments.sort_unstable();
            let stored = read
                .get_id(CONTAINERS, id)?
                .and_then(|bytes| SegmentContainer::decode(&bytes, id).ok());
            let file_bytes = self.containers.container_bytes(id).ok();
            let expected = match &stored {
                Some(record) => SegmentContainer {
                    segments: segments.clone(),
                    bytes: file_bytes.unwrap_or(record.bytes),
                    ..record.clone()
                },
                None => {
                    let timestamp = self
                        .containers
                        .read_contents(id)
                        .map_or(0, |contents| contents.timestamp);
                    SegmentContainer {
                        kind: if timestamp == 0 {
                            ContainerKind::Shared
                        } else {
                            ContainerKind::Archival
                        },
                        timestamp,
                        bytes: file_bytes.unwrap_or(0),
                        segments: segments.clone(),
                    }
                }
            };
            if stored.as_ref() != Some(&expected) {
                rewritten.2 += 1;
                changes.containers.insert(id, Some(expected));
            }
        }
        drop(read);
        let state = self.state.clone();
        self.release_reserve()?;
        let mut write = self.catalog.write()?;
        changes.apply(&mut write)?;
        self.commit(write, state, &dropped)?;
        self.remove_containers(&dropped)?;
        let counted = if complete {
            String::new()
        } else {
            "; some recipes do not read, so no count was lowered".to_string()
        };
        for (finding, problem) in &mut inspection.findings {
            let text = match problem {
                Problem::DerivedCatalog => format!(
                    "rebuilt from the recipes and segment records: {} segment heads, {} \
                     segment records' chunk counts, {} container records{counted}",
                    rewritten.0, rewritten.1, rewritten.2
                ),
                Problem::UnlistedBackup(_) => "listed in its series again".to_string(),
                Problem::DamagedSeries(_) => "rebuilt from its backups' records (its live \
                                              window and retention are the defaults again)"
                    .to_string(),
                _ => continue,
            };
            finding.repair = Some(text);
        }
        Ok(())
    }

    /// The series as they will be after the repair: the ones that decode, those rebuilt from
    /// their backups' records, with unlisted backups listed again.
    fn repaired_series(
        &self,
        read: &impl CatalogView,
        inspection: &Inspection,
    ) -> Result<BTreeMap<String, SeriesRecord>> {
        let mut series: BTreeMap<String, SeriesRecord> = BTreeMap::new();
        for (name, bytes) in read.list(SERIES)? {
            if let Ok(record) = serde_json::from_slice::<SeriesRecord>(&bytes) {
                series.insert(name, record);
            }
        }
        let mut to_list: BTreeSet<BackupId> = BTreeSet::new();
        let mut rebuild: BTreeSet<String> = BTreeSet::new();
        for (_, problem) in &inspection.findings {
            match problem {
                Problem::UnlistedBackup(id) => {
                    to_list.insert(*id);
                }
                Problem::DamagedSeries(name) => {
                    rebuild.insert(name.clone());
                }
                _ => {}
            }
        }
        let mut touched = BTreeSet::new();
        for (id, bytes) in read.range_id(BACKUPS, 0, u64::MAX)? {
            let Ok(record) = serde_json::from_slice::<BackupRecord>(&bytes) else {
                continue;
            };
            if !to_list.contains(&id) && !rebuild.contains(&record.series) {
                continue;
            }
            let entry = series.entry(record.series.clone()).or_insert_with(|| {
                SeriesRecord::new(&record.series, crate::config::SeriesOptions::default())
            });
            entry.versions.insert(record.version, id);
            entry.version_next = entry.version_next.max(record.version + 1);
            touched.insert(record.series.clone());
        }
        series.retain(|name, _| touched.contains(name));
        Ok(series)
    }

    /// Step 3: every damaged container rewritten. Returns the chunks marked lost, by the
    /// container they were in.
    fn rewrite_damaged_containers(
        &mut self,
        inspection: &mut Inspection,
    ) -> Result<BTreeMap<ContainerId, Vec<(SegmentId, u32)>>> {
        let damaged: BTreeSet<ContainerId> = inspection
            .findings
            .iter()
            .filter_map(|(finding, problem)| match problem {
                Problem::Container(id) if finding.repair.is_none() => Some(*id),
                _ => None,
            })
            .collect();
        if damaged.is_empty() {
            return Ok(BTreeMap::new());
        }
        let fingerprinter = &self.fingerprinter;
        let read = self.catalog.read()?;
        // The segments placing frames in each damaged container now (step 2 may have
        // committed, but it never moves chunks), and where every stored chunk is.
        let mut placed: HashMap<ContainerId, Vec<SegmentId>> = HashMap::new();
        let mut by_fingerprint: HashMap<Fingerprint, Vec<ChunkCopy>> = HashMap::new();
        for (id, bytes) in segment_records(&read)? {
            let Ok(record) = SegmentRecord::decode(&bytes, id) else {
                continue;
            };
            let Some(container) = record.container else {
                continue;
            };
            if damaged.contains(&container) && !record.frames.is_empty() {
                placed.entry(container).or_default().push(id);
            }
            for (index, chunk) in record.chunks.iter().enumerate() {
                if let ChunkStorage::Stored(place) = chunk.storage {
                    by_fingerprint
                        .entry(chunk.fingerprint)
                        .or_default()
                        .push(ChunkCopy {
                            segment: id,
                            index: index as u32,
                            frame: *record.frame(place),
                            within: place.within,
                            raw_bytes: chunk.raw_bytes,
                        });
                }
            }
        }
        let mut changes = Changes::default();
        let mut state = self.state.clone();
        let mut outcomes: BTreeMap<ContainerId, Rewritten> = BTreeMap::new();
        for &id in &damaged {
            let segments = placed.remove(&id).unwrap_or_default();
            let record = crate::store::load_container(&read, id).ok();
            let outcome = self.rewrite_container(
                &read,
                &mut changes,
                &mut state,
                id,
                record.as_ref(),
                &segments,
                &by_fingerprint,
                fingerprinter,
            )?;
            outcomes.insert(id, outcome);
        }
        let mut dropped: Vec<ContainerId> = damaged
            .iter()
            .copied()
            .filter(|&id| {
                self.storage
                    .exists(&self.containers.name(id))
                    .unwrap_or(true)
            })
            .collect();
        dropped.sort_unstable();
        let all_lost: BTreeSet<(SegmentId, u32)> = outcomes
            .values()
            .flat_map(|outcome| outcome.lost.iter().copied())
            .collect();
        for &(segment, _) in &all_lost {
            state.damaged_segments.insert(segment);
        }
        // A segment borrowing a lost chunk reads it lost too: never deduplicated against.
        for (borrower, _) in borrowers_of(&read, &all_lost)? {
            state.damaged_segments.insert(borrower.0);
        }
        drop(read);
        self.release_reserve()?;
        let mut write = self.catalog.write()?;
        changes.apply(&mut write)?;
        self.commit(write, state, &dropped)?;
        self.remove_containers(&dropped)?;
        let mut lost_chunks = BTreeMap::new();
        for (finding, problem) in &mut inspection.findings {
            let Problem::Container(id) = problem else {
                continue;
            };
            let Some(outcome) = outcomes.get(id) else {
                continue;
            };
            let mut text = match outcome.new_id {
                Some(new_id) => format!(
                    "rewritten as container {new_id:016x} from its intact chunks ({} copied)",
                    outcome.copied
                ),
                None => "dropped (none of its chunks could be kept)".to_string(),
            };
            if !outcome.redirected.is_empty() {
                text += &format!(
                    "; {} damaged chunks taken from intact copies elsewhere ({})",
                    outcome.redirected.len(),
                    outcome
                        .redirected
                        .iter()
                        .take(5)
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            if !outcome.lost.is_empty() {
                text += &format!(
                    "; {} chunks with no intact copy marked lost",
                    outcome.lost.len()
                );
            }
            finding.repair = Some(text);
        }
        for (id, outcome) in outcomes {
            if !outcome.lost.is_empty() {
                lost_chunks.insert(id, outcome.lost);
            }
        }
        Ok(lost_chunks)
    }

    /// Rewrites container `id` from the frames `placing` segments place in it: see step 3 of
    /// the module documentation.
    #[allow(clippy::too_many_arguments)]
    fn rewrite_container(
        &self,
        view: &impl CatalogView,
        changes: &mut Changes,
        state: &mut crate::store::StoreState,
        id: ContainerId,
        record: Option<&SegmentContainer>,
        placing: &[SegmentId],
        by_fingerprint: &HashMap<Fingerprint, Vec<ChunkCopy>>,
        fingerprinter: &onecopy_core::fingerprint::Fingerprinter,
    ) -> Result<Rewritten> {
        let mut outcome = Rewritten::default();
        let data = self.read_whole(id);
        let timestamp = record
            .map(|record| record.timestamp)
            .or_else(|| {
                self.containers
                    .read_contents(id)
                    .ok()
                    .map(|contents| contents.timestamp)
            })
            .unwrap_or(0);
        let kind = record.map_or(
            if timestamp == 0 {
                ContainerKind::Shared
            } else {
                ContainerKind::Archival
            },
            |record| record.kind,
        );
        let level = self.state.options.compression_level;
        let mut writer: Option<ContainerWriter> = None;
        let mut kept_segments: BTreeSet<SegmentId> = BTreeSet::new();
        let mut segments: BTreeSet<SegmentId> = BTreeSet::new();
        for &segment in placing {
            segments.insert(segment);
            let Ok(segment_record) = changes.record_mut(view, segment) else {
                continue;
            };
            let mut segment_record = segment_record.clone();
            let frames = PlacedFrame::of_segment(segment, &segment_record, fingerprinter);
            // Each frame: its stored bytes when they verify, its chunks' bytes otherwise
            // (from the frame when it decodes, else from intact copies elsewhere).
            enum Recovered {
                Whole(Vec<u8>),
                Chunks(Vec<(u32, Fingerprint, Option<Vec<u8>>)>),
            }
            let mut recovered = Vec::with_capacity(frames.len());
            for frame in &frames {
                let own = data
                    .as_deref()
                    .and_then(|data| verify_frame(data, frame, fingerprinter).ok());
                if let (Some(_), Some(data), Some(_)) = (&own, &data, frame.fingerprint) {
                    let start = frame.location.offset as usize;
                    let stored = data[start..start + frame.location.stored_bytes as usize].to_vec();
                    outcome.copied += frame.chunks.len() as u64;
                    recovered.push((frame, Recovered::Whole(stored)));
                    continue;
                }
                let mut chunks = Vec::with_capacity(frame.chunks.len());
                for &(index, fingerprint, within, raw_bytes) in &frame.chunks {
                    let bytes = match &own {
                        Some(raw) => {
                            outcome.copied += 1;
                            Some(raw[within as usize..(within + raw_bytes) as usize].to_vec())
                        }
                        None => match self.intact_copy(
                            fingerprint,
                            &frame.location,
                            by_fingerprint,
                            fingerprinter,
                        ) {
                            Some((from, bytes)) => {
                                outcome.redirected.push(format!(
                                    "chunk {index} of segment {segment} from chunk {} of segment {} in container {:016x}",
                                    from.index, from.segment, from.frame.container
                                ));
                                Some(bytes)
                            }
                            None => None,
                        },
                    };
                    chunks.push((index, fingerprint, bytes));
                }
                recovered.push((frame, Recovered::Chunks(chunks)));
            }
            for (_, recovered) in &recovered {
                if let Recovered::Chunks(chunks) = recovered {
                    for (index, _, bytes) in chunks {
                        if bytes.is_none() {
                            outcome.lost.push((segment, *index));
                            segment_record.chunks[*index as usize].storage = ChunkStorage::Lost;
                        }
                    }
                }
            }
            if !segment_record.has_stored() {
                segment_record.frames.clear();
                *changes.record_mut(view, segment)? = segment_record;
                continue;
            }
            if writer.is_none() {
                let new_id = state.container_id_next;
                state.container_id_next += 1;
                writer = Some(
                    self.containers
                        .create(new_id, now_unix_ns() / 1_000_000_000)?,
                );
                outcome.new_id = Some(new_id);
            }
            let mut frame_writer = FrameWriter::new(
                writer.as_mut().expect("created above"),
                fingerprinter,
                FrameCoding::Keep(level),
            );
            for (frame, recovered) in recovered {
                match recovered {
                    Recovered::Whole(stored) => {
                        let chunks: Vec<(u32, Fingerprint, u32)> = frame
                            .chunks
                            .iter()
                            .map(|&(index, fingerprint, _, raw_bytes)| {
                                (index, fingerprint, raw_bytes)
                            })
                            .collect();
                        frame_writer.copy(&frame.location, &stored, &chunks)?;
                    }
                    Recovered::Chunks(chunks) => {
                        for (index, fingerprint, bytes) in chunks {
                            if let Some(bytes) = bytes {
                                frame_writer.push(index, fingerprint, bytes)?;
                            }
                        }
                    }
                }
            }
            frame_writer.finish(&mut segment_record)?;
            *changes.record_mut(view, segment)? = segment_record;
            kept_segments.insert(segment);
        }
        if let Some(record) = record {
            segments.extend(record.segments.iter().copied());
        }
        for &segment in &segments {
            let Ok(segment_record) = changes.record_mut(view, segment) else {
                continue; // A record that does not decode: reported apart.
            };
            if segment_record.container != Some(id) {
                continue;
            }
            segment_record.container = if kept_segments.contains(&segment) {
                outcome.new_id
            } else {
                None
            };
        }
        changes.containers.insert(id, None);
        if let (Some(writer), Some(new_id)) = (writer, outcome.new_id) {
            let sealed = writer.seal(timestamp)?;
            changes.containers.insert(
                new_id,
                Some(SegmentContainer {
                    kind,
                    timestamp,
                    bytes: sealed.bytes,
                    segments: kept_segments.into_iter().collect(),
                }),
            );
        }
        Ok(outcome)
    }

    /// The whole file of container `id`, or `None` when it does not read.
    fn read_whole(&self, id: ContainerId) -> Option<Vec<u8>> {
        let file = self.containers.file(id).ok()?;
        let length = file.len().ok()?;
        let mut data = vec![0u8; length as usize];
        file.read_at(0, &mut data).ok()?;
        Some(data)
    }

    /// The bytes of an intact copy of a chunk with this fingerprint stored in a frame other
    /// than `not_in`, verified (a copy in another damaged container serves if its own frame is
    /// intact).
    fn intact_copy(
        &self,
        fingerprint: Fingerprint,
        not_in: &ChunkLocation,
        by_fingerprint: &HashMap<Fingerprint, Vec<ChunkCopy>>,
        fingerprinter: &onecopy_core::fingerprint::Fingerprinter,
    ) -> Option<(ChunkCopy, Vec<u8>)> {
        for candidate in by_fingerprint.get(&fingerprint)? {
            if candidate.frame == *not_in {
                continue;
            }
            let Ok(raw) = crate::frames::read_frame(&self.containers, &candidate.frame) else {
                continue;
            };
            let start = candidate.within as usize;
            let Some(bytes) = raw.get(start..start + candidate.raw_bytes as usize) else {
                continue;
            };
            if fingerprinter.hash(bytes) == fingerprint {
                return Some((*candidate, bytes.to_vec()));
            }
        }
        None
    }

    /// Step 4: what is lost, by backup and file, into the findings and the catalog.
    fn record_losses(
        &mut self,
        inspection: &mut Inspection,
        lost_chunks: &BTreeMap<ContainerId, Vec<(SegmentId, u32)>>,
    ) -> Result<()> {
        let unrepairable = inspection.findings.iter().any(|(finding, problem)| {
            *problem == Problem::Unrepairable && finding.repair.is_none()
        });
        if lost_chunks.is_empty() && !unrepairable {
            return Ok(());
        }
        let read = self.catalog.read()?;
        // Every backup's lost chunks, by (segment, index), with its description per chunk set.
        let all_lost: BTreeSet<(SegmentId, u32)> =
            lost_chunks.values().flatten().copied().collect();
        let mut lines_by_container: BTreeMap<ContainerId, Vec<String>> = BTreeMap::new();
        if !all_lost.is_empty() {
            let mut owner: HashMap<(SegmentId, u32), ContainerId> = lost_chunks
                .iter()
                .flat_map(|(&container, chunks)| {
                    chunks.iter().map(move |&chunk| (chunk, container))
                })
                .collect();
            let mut damaged_segments: BTreeSet<SegmentId> =
                all_lost.iter().map(|&(segment, _)| segment).collect();
            // Chunks borrowing a lost chunk are lost with it, in its container's finding.
            for (borrower, lender) in borrowers_of(&read, &all_lost)? {
                if let Some(&container) = owner.get(&lender) {
                    owner.insert(borrower, container);
                    damaged_segments.insert(borrower.0);
                }
            }
            for (_, bytes) in read.list(SERIES)? {
                let Ok(series) = serde_json::from_slice::<SeriesRecord>(&bytes) else {
                    continue;
                };
                for (&version, &id) in &series.versions {
                    let Ok(backup) = crate::series::load_backup(&read, id) else {
                        continue;
                    };
                    let Ok((sources, _)) = resolve(&read, &series, &backup) else {
                        continue;
                    };
                    let mut cache = SegmentCache::new();
                    let lost =
                        losses::stream_losses(&read, &sources, &damaged_segments, &mut cache)?;
                    let label = format!("backup {}@{version}", series.name);
                    let mut by_container: BTreeMap<ContainerId, Vec<losses::LostRange>> =
                        BTreeMap::new();
                    for range in lost {
                        if let Some(&container) = owner.get(&(range.segment, range.index)) {
                            by_container.entry(container).or_default().push(range);
                        }
                    }
                    for (container, ranges) in by_container {
                        lines_by_container.entry(container).or_default().extend(
                            losses::describe_backup_losses(
                                self, &read, &backup, &sources, &ranges, &label,
                            ),
                        );
                    }
                }
            }
        }
        let now = now_unix_ns();
        let mut records = Vec::new();
        let mut described: BTreeSet<ContainerId> = BTreeSet::new();
        for (finding, problem) in &mut inspection.findings {
            match problem {
                Problem::Container(id) => {
                    let Some(chunks) = lost_chunks.get(id) else {
                        continue;
                    };
                    // The container's lost data goes with its first finding.
                    if !described.insert(*id) {
                        continue;
                    }
                    let mut lines = lines_by_container.remove(id).unwrap_or_default();
                    if lines.is_empty() {
                        lines.push(format!(
                            "{} chunks no backup references directly any more",
                            chunks.len()
                        ));
                    }
                    finding.lost = lines.clone();
                    records.push(LossRecord {
                        recorded_unix_ns: now,
                        object: finding.object.clone(),
                        damage: finding.detail.clone(),
                        chunks: chunks.clone(),
                        lost: lines,
                    });
                }
                Problem::Unrepairable if finding.repair.is_none() => {
                    finding.repair = Some(
                        "nothing can rebuild it; recorded as lost (later checks list it as \
                         lost)"
                            .to_string(),
                    );
                    if finding.lost.is_empty() {
                        finding
                            .lost
                            .push(format!("{} (unreadable)", finding.object));
                    }
                    records.push(LossRecord {
                        recorded_unix_ns: now,
                        object: finding.object.clone(),
                        damage: finding.detail.clone(),
                        chunks: Vec::new(),
                        lost: finding.lost.clone(),
                    });
                }
                _ => {}
            }
        }
        drop(read);
        if records.is_empty() {
            return Ok(());
        }
        let state = self.state.clone();
        let mut write = self.catalog.write()?;
        put_losses(&mut write, &records)?;
        self.commit(write, state, &[])
    }
}

/// The references the recipes of `series` hold, counted again for a repair.
fn count_references(
    read: &impl CatalogView,
    series: &BTreeMap<String, SeriesRecord>,
) -> Result<ReferenceCounts> {
    let mut counts = ReferenceCounts {
        complete: true,
        ..Default::default()
    };
    let mut all: BTreeMap<String, SeriesRecord> = BTreeMap::new();
    for (name, bytes) in read.list(SERIES)? {
        if let Ok(record) = serde_json::from_slice::<SeriesRecord>(&bytes) {
            all.insert(name, record);
        }
    }
    all.extend(
        series
            .iter()
            .map(|(name, record)| (name.clone(), record.clone())),
    );
    for record in all.values() {
        for &id in record.versions.values() {
            let recipe = crate::series::load_backup(read, id)
                .and_then(|backup| Recipe::load(read, backup.id, backup.recipe_parts));
            let Ok(recipe) = recipe else {
                counts.complete = false;
                continue;
            };
            match recipe {
                Recipe::Live(references) => {
                    for reference in references {
                        *counts.live.entry(reference.segment).or_insert(0) += 1;
                    }
                }
                Recipe::Archival(references) => {
                    for reference in references {
                        if let ChunkReference::Direct { segment, index, .. } = reference {
                            *counts.direct.entry((segment, index)).or_insert(0) += 1;
                        }
                    }
                }
            }
        }
    }
    Ok(counts)
}

/// `check` of a face whose catalog does not open: the damage, named, and with a repair,
/// what can be done about it. The repair puts right redb's super-header
/// ([`Catalog::repair_header`]; the damaged file is kept beside it) and then checks and
/// repairs the rest as usual. Damage inside the catalog's pages cannot be repaired: the
/// records it held exist nowhere else (restore the catalog from a copy).
///
/// [`Catalog::repair_header`]: onecopy_core::catalog::Catalog::repair_header
pub(crate) fn check_damaged_catalog(
    storage: Arc<dyn Storage>,
    options: CheckOptions,
    error: BackupError,
) -> Result<FaceReport> {
    let object = face_path(CATALOG_FILE);
    let detail = format!("the catalog does not open: {error}");
    let unrepaired = |why: Option<String>| -> Result<FaceReport> {
        let mut report = FaceReport::new(FACE);
        let containers = onecopy_core::container::ContainerStore::new(
            Arc::clone(&storage),
            crate::store::CONTAINERS_DIRECTORY,
            onecopy_core::container::ContainerOptions::default(),
        )?;
        report.count("container_files", containers.list()?.len() as u64);
        let mut finding = Finding::new(FindingKind::Damage, &object, &detail);
        if let Some(why) = why {
            finding.detail += &format!(
                "; the repair could not put it right ({why}): no backup can be listed or \
                 restored until the catalog is restored from a copy"
            );
        }
        report.push(finding);
        Ok(report)
    };
    if !options.repair {
        return unrepaired(None);
    }
    let repaired = match onecopy_core::catalog::Catalog::repair_header(&storage, CATALOG_FILE) {
        Ok(repaired) if !repaired.repaired.is_empty() => repaired,
        Ok(_) => return unrepaired(Some("its header is intact".to_string())),
        Err(repair_error) if repair_error.is_corrupt() => {
            return unrepaired(Some(repair_error.to_string()))
        }
        Err(repair_error) => return Err(repair_error.into()),
    };
    let mut store = BackupStore::open(Arc::clone(&storage), crate::store::OpenOptions::default())?;
    let mut report = store.check(options)?;
    let mut finding = Finding::new(FindingKind::Damage, &object, detail).repaired(format!(
        "redb's header put right: {}{}",
        repaired.repaired.join(", "),
        repaired
            .kept_as
            .map(|kept| format!(" (the damaged file is kept as {})", face_path(&kept)))
            .unwrap_or_default()
    ));
    if repaired.rolled_back {
        finding = finding.with_lost([
            "the catalog's last commit: what the last backup command did (a backup created, \
             deleted or reverse-deduplicated) is undone"
                .to_string(),
        ]);
    }
    report.findings.insert(0, finding);
    report.repaired = true;
    Ok(report)
}

/// How many borrowed chunks of `records` name each (segment, index): direct references that
/// segment records, not recipes, hold.
pub(crate) fn borrow_counts<'a>(
    records: impl IntoIterator<Item = &'a SegmentRecord>,
) -> HashMap<(SegmentId, u32), u32> {
    let mut counts = HashMap::new();
    for record in records {
        for target in record.borrowed() {
            *counts.entry(target).or_insert(0) += 1;
        }
    }
    counts
}

/// A chunk of a segment: (segment, index).
type ChunkAt = (SegmentId, u32);

/// The chunks that borrow one of `lent`, as (borrower, lender).
fn borrowers_of(
    view: &impl CatalogView,
    lent: &BTreeSet<ChunkAt>,
) -> Result<Vec<(ChunkAt, ChunkAt)>> {
    let mut found = Vec::new();
    if lent.is_empty() {
        return Ok(found);
    }
    for (id, bytes) in segment_records(view)? {
        let Ok(record) = SegmentRecord::decode(&bytes, id) else {
            continue;
        };
        for (index, chunk) in record.chunks.iter().enumerate() {
            if let ChunkStorage::Borrowed {
                segment,
                index: target,
            } = chunk.storage
            {
                if lent.contains(&(segment, target)) {
                    found.push(((id, index as u32), (segment, target)));
                }
            }
        }
    }
    Ok(found)
}
