//! `check`: what is wrong with the backup store, as a [`FaceReport`].
//!
//! Terms (see [`onecopy_core::check`]): **primary data** is the catalog's series, backups,
//! recipes and segment records, and the containers' chunk bytes; **derived data** is the
//! segment index, the segment heads' reference counts, the chunks' direct reference counts and
//! the container records, all rebuilt from primary data; **leftovers** are files of an
//! interrupted command that nothing refers to.
//!
//! The check, in order (it reads; nothing is written without [`CheckOptions::repair`]):
//!
//! 1. the catalog: opening it verifies every page checksum ([`BackupStore::open`]); a catalog
//!    that fails is reported by [`BackupStore::check_at`], which does not need it to open;
//! 2. every series and backup: records decode, every recipe decodes and resolves (indirect
//!    chains end at stored or null chunks), sizes add up; chunks a repair marked lost are
//!    collected for the report;
//! 3. the two-level reference counts against the recipes, segment heads against records,
//!    container records against the segment records that place chunks in them;
//! 4. every container a segment record uses: the file exists with the recorded size, its
//!    header names it, its trailer decodes, carries the recorded time stamp and lists every
//!    chunk with the catalog's fingerprint, sizes, flags and CRC;
//! 5. with [`CheckOptions::read_data`], every stored chunk is read: the record header
//!    in front of it is compared with the catalog field by field, and its bytes are
//!    CRC-checked, decompressed and fingerprinted again;
//! 6. files nothing refers to: containers without a record, temporary files;
//! 7. the segment index: its pages' checksums, its structure, and its entries against the
//!    shared segments of the catalog.
//!
//! Every problem is a [`Finding`] naming the object (container id and offset, segment and
//! chunk index, `backup SERIES@VERSION`, a file in a backup) with its kind. A repair
//! ([`crate::repair`]) then fixes what the findings describe and records what it did in
//! them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

use onecopy_core::catalog::CatalogView;
use onecopy_core::check::{CheckOptions, FaceReport, Finding, FindingKind};
use onecopy_core::container::format::HEADER_BYTES;
use onecopy_core::container::{codec, ContainerId, ContainerStore};
use onecopy_core::fingerprint::Fingerprinter;
use onecopy_core::storage::Storage;
use onecopy_core::Error as CoreError;
use rayon::prelude::*;

use crate::error::{BackupError, Result};
pub use crate::inspection::FACE;
use crate::inspection::{
    container_object, face_path, record_header_differs, verify_frame, ContainerVerdict, Inspection,
    PlacedFrame, Problem, ReferenceCounts,
};
use crate::losses::{self, load_losses, LostRange};
use crate::recipe::{ChunkReference, Recipe};
use crate::resolve::{locate, resolve, ChunkBytes, ChunkSource, SegmentCache};
use crate::segment::{
    segment_records, ChunkStorage, ContainerKind, SegmentContainer, SegmentHead, SegmentId,
    SegmentRecord, SegmentState, CONTAINERS, SEGMENT_HEADS,
};
use crate::series::{BackupId, BackupRecord, SeriesRecord, BACKUPS, SERIES};
use crate::store::{
    by_index_key, indexable_segments, BackupStore, OpenOptions, CATALOG_FILE, CONTAINERS_DIRECTORY,
};

/// Bytes of a container header's magic, which opens every container file.
const CONTAINER_MAGIC: &[u8; 8] = b"OCCNTR01";

impl BackupStore {
    /// Checks the store and, with [`CheckOptions::repair`], repairs it; see the module
    /// documentation. Without `repair` nothing is written. A repair needs the store opened
    /// for writing (a read-only store panics: a caller bug); [`BackupStore::check_at`] opens
    /// it as the options need.
    pub fn check(&mut self, options: CheckOptions) -> Result<FaceReport> {
        let started = Instant::now();
        let inspection = self.inspect(options)?;
        let report = if options.repair && inspection.findings.iter().any(needs_repair) {
            assert!(
                !self.catalog.is_read_only(),
                "a repair needs the store opened for writing"
            );
            self.repair(inspection)?
        } else {
            inspection.report(false)
        };
        let mut report = report;
        report.count("milliseconds", started.elapsed().as_millis() as u64);
        Ok(report)
    }

    /// Checks (and with `options.repair` repairs) the backup face kept in `storage` without
    /// needing it to open: a catalog that fails to open is reported as damage naming it and
    /// what redb found, and a repair does what can be done about it. Errors only for I/O
    /// errors it cannot get past; never for damage. A face never used (no catalog and no
    /// containers) gives an empty report.
    pub fn check_at(storage: Arc<dyn Storage>, options: CheckOptions) -> Result<FaceReport> {
        if !storage.exists(CATALOG_FILE)? {
            return missing_catalog_report(&storage);
        }
        if storage.authenticates_reads() {
            // Opening reads such a catalog page by page; a check reads and verifies all of it.
            match onecopy_core::catalog::Catalog::open_verified_copy(&storage, CATALOG_FILE) {
                Ok(_) | Err(CoreError::Limit(_)) => {}
                Err(error) => {
                    let error = BackupError::from(error);
                    if is_catalog_damage(&error) {
                        return crate::repair::check_damaged_catalog(storage, options, error);
                    }
                    return Err(error);
                }
            }
        }
        let opened = BackupStore::open(
            Arc::clone(&storage),
            OpenOptions {
                read_only: !options.repair,
                ..OpenOptions::default()
            },
        );
        match opened {
            Ok(mut store) => store.check(options),
            Err(error) if is_catalog_damage(&error) => {
                crate::repair::check_damaged_catalog(storage, options, error)
            }
            Err(error) => Err(error),
        }
    }

    /// Runs steps 1-7 of the module documentation.
    pub(crate) fn inspect(&mut self, options: CheckOptions) -> Result<Inspection> {
        let mut inspection = Inspection {
            findings: Vec::new(),
            checked: BTreeMap::new(),
            containers: BTreeMap::new(),
            placed: HashMap::new(),
            container_records: HashMap::new(),
            counts_complete: true,
        };
        self.catalog.read_ahead();
        if let Ok(file) = self.storage.open(CATALOG_FILE, false) {
            inspection.count("catalog_bytes_verified", file.len()?);
        }
        let header = onecopy_core::catalog::Catalog::inspect_header(&self.storage, CATALOG_FILE)?;
        if !header.is_empty() {
            inspection.push(
                Finding::new(
                    FindingKind::Damage,
                    face_path(CATALOG_FILE),
                    format!("its header (redb's super-header): {}", header.join("; ")),
                ),
                Problem::CatalogHeader,
            );
        }
        let read = self.catalog.read()?;
        let recorded = load_losses(&read)?;
        let backups = self.inspect_backups(&read, &mut inspection)?;
        self.inspect_segments(&read, &backups.counts, &mut inspection)?;
        self.inspect_containers(options, &mut inspection)?;
        self.inspect_files(&mut inspection)?;
        self.inspect_index(&read, &mut inspection)?;
        self.report_losses(&read, &backups, &recorded, &mut inspection)?;
        Ok(inspection)
    }

    /// Step 2: series, backups and recipes; counts the references they hold.
    fn inspect_backups(
        &self,
        read: &impl CatalogView,
        inspection: &mut Inspection,
    ) -> Result<BackupsSeen> {
        let mut seen = BackupsSeen::default();
        let mut cache = SegmentCache::new();
        let mut listed = BTreeSet::new();
        for (name, bytes) in read.list(SERIES)? {
            let series: SeriesRecord = match serde_json::from_slice(&bytes) {
                Ok(series) => series,
                Err(error) => {
                    inspection.push(
                        Finding::new(
                            FindingKind::Damage,
                            format!("series {name} (catalog record series/{name})"),
                            format!("does not decode: {error}"),
                        ),
                        Problem::DamagedSeries(name.clone()),
                    );
                    continue;
                }
            };
            inspection.count("series", 1);
            for (&version, &id) in &series.versions {
                listed.insert(id);
                inspection.count("backups", 1);
                let label = format!("backup {name}@{version}");
                match check_backup(read, &series, id, version, &mut cache, &mut seen.counts) {
                    Ok(checked) => {
                        if !checked.lost.is_empty() {
                            seen.with_losses.push(checked);
                        }
                    }
                    Err(error) => {
                        if let Some(recipe_unread) = error.recipe_unread {
                            seen.counts.complete &= !recipe_unread;
                        }
                        inspection.push(
                            Finding::new(FindingKind::Damage, &label, error.detail)
                                .with_lost([format!("{label} (all of it)")]),
                            Problem::Unrepairable,
                        );
                    }
                }
            }
        }
        for (id, bytes) in read.range_id(BACKUPS, 0, u64::MAX)? {
            if listed.contains(&id) {
                continue;
            }
            // Its references are not counted above.
            seen.counts.complete = false;
            let record: Option<BackupRecord> = serde_json::from_slice(&bytes).ok();
            let (object, problem) = match &record {
                Some(record) => (
                    format!(
                        "backup {}@{} (catalog record backups/{id})",
                        record.series, record.version
                    ),
                    Problem::UnlistedBackup(id),
                ),
                None => (
                    format!("catalog record backups/{id}"),
                    Problem::Unrepairable,
                ),
            };
            inspection.push(
                Finding::new(
                    FindingKind::Damage,
                    object,
                    "a backup record its series does not list (not restorable until listed)",
                ),
                problem,
            );
        }
        inspection.counts_complete = seen.counts.complete;
        Ok(seen)
    }

    /// Step 3: segment heads and records against each other and the counts; container
    /// records against the segment records.
    fn inspect_segments(
        &self,
        read: &impl CatalogView,
        counts: &ReferenceCounts,
        inspection: &mut Inspection,
    ) -> Result<()> {
        let mut derived: Vec<String> = Vec::new();
        let heads: HashMap<u64, Vec<u8>> = read
            .range_id(SEGMENT_HEADS, 0, u64::MAX)?
            .into_iter()
            .collect();
        let mut records: HashMap<SegmentId, SegmentRecord> = HashMap::new();
        for (id, bytes) in segment_records(read)? {
            inspection.count("segments", 1);
            match SegmentRecord::decode(&bytes, id) {
                Ok(record) => {
                    records.insert(id, record);
                }
                Err(error) => {
                    let users = counts.users_of(id);
                    inspection.push(
                        Finding::new(
                            FindingKind::Damage,
                            format!("segment {id} (catalog record segments/{id})"),
                            describe(&error),
                        )
                        .with_lost(
                            users
                                .iter()
                                .map(|label| format!("{label}: every chunk of segment {id}")),
                        ),
                        Problem::Unrepairable,
                    );
                }
            }
        }
        for (&id, bytes) in &heads {
            let head = match SegmentHead::decode(bytes, id) {
                Ok(head) => head,
                Err(error) => {
                    derived.push(describe(&error));
                    continue;
                }
            };
            let Some(record) = records.get(&id) else {
                if counts.live.contains_key(&id) {
                    continue; // Reported with the record above, or as a damaged recipe.
                }
                derived.push(format!("segment {id} has a head but no record"));
                continue;
            };
            if head.fingerprint != record.fingerprint || head.state != record.state {
                derived.push(format!("segment {id}: its head and record disagree"));
            }
            let counted = counts.live.get(&id).copied().unwrap_or(0);
            // Unreadable recipes are not counted: a recorded count above the count from the
            // readable ones is then expected (and a repair keeps it).
            let wrong = head.live_references < counted
                || (head.live_references > counted && counts.complete);
            if wrong {
                derived.push(format!(
                    "segment {id}: {} live references recorded, {counted} in live recipes",
                    head.live_references
                ));
            }
        }
        let borrows = crate::repair::borrow_counts(records.values());
        for (&id, record) in &records {
            if !heads.contains_key(&id) {
                derived.push(format!("segment {id} has a record but no head"));
            }
            if record.state == SegmentState::Shared
                && record
                    .chunks
                    .iter()
                    .any(|chunk| chunk.storage == ChunkStorage::Removed)
            {
                inspection.push(
                    Finding::new(
                        FindingKind::Damage,
                        format!("segment {id}"),
                        "a shared segment lost chunks to a removal (live recipes still read them)",
                    ),
                    Problem::Unrepairable,
                );
            }
            for (index, chunk) in record.chunks.iter().enumerate() {
                let key = (id, index as u32);
                let counted = counts.direct.get(&key).copied().unwrap_or(0)
                    + borrows.get(&key).copied().unwrap_or(0);
                if let ChunkStorage::Borrowed {
                    segment,
                    index: target,
                } = chunk.storage
                {
                    let held = records.get(&segment).and_then(|lender| {
                        lender.chunks.get(target as usize).map(|lent| {
                            matches!(lent.storage, ChunkStorage::Stored(_) | ChunkStorage::Lost)
                        })
                    });
                    if held != Some(true) {
                        inspection.push(
                            Finding::new(
                                FindingKind::Damage,
                                format!("chunk {index} of segment {id}"),
                                format!(
                                    "it borrows chunk {target} of segment {segment}, which does \
                                     not hold its bytes"
                                ),
                            )
                            .with_lost(
                                counts
                                    .users_of(id)
                                    .iter()
                                    .map(|label| format!("{label}: chunk {index} of segment {id}")),
                            ),
                            Problem::Unrepairable,
                        );
                    }
                }
                let wrong = chunk.direct_references < counted
                    || (chunk.direct_references > counted && counts.complete);
                if wrong {
                    derived.push(format!(
                        "chunk {index} of segment {id}: {} direct references recorded, \
                         {counted} in archival recipes and borrowing chunks",
                        chunk.direct_references
                    ));
                }
            }
            if let Some(container) = record.container {
                let frames = PlacedFrame::of_segment(id, record, &self.fingerprinter);
                if !frames.is_empty() {
                    inspection
                        .placed
                        .entry(container)
                        .or_default()
                        .extend(frames);
                }
            }
        }
        let mut container_records: HashMap<ContainerId, SegmentContainer> = HashMap::new();
        for (id, bytes) in read.range_id(CONTAINERS, 0, u64::MAX)? {
            inspection.count("containers", 1);
            match SegmentContainer::decode(&bytes, id) {
                Ok(record) => {
                    container_records.insert(id, record);
                }
                Err(error) => derived.push(describe(&error)),
            }
        }
        for (&id, record) in &records {
            let Some(container) = record.container else {
                continue;
            };
            match container_records.get(&container) {
                Some(held) if held.segments.contains(&id) => {
                    if record.state == SegmentState::Shared && held.kind != ContainerKind::Shared {
                        derived.push(format!(
                            "shared segment {id} is in archival container {container:016x}"
                        ));
                    }
                }
                _ => derived.push(format!(
                    "segment {id} is in container {container:016x}, whose record does not list it"
                )),
            }
        }
        for (&id, record) in &container_records {
            for segment in &record.segments {
                if records
                    .get(segment)
                    .is_some_and(|r| r.container != Some(id))
                {
                    derived.push(format!(
                        "container {id:016x} lists segment {segment}, which is elsewhere"
                    ));
                }
            }
            if record
                .segments
                .iter()
                .all(|segment| !records.contains_key(segment))
            {
                derived.push(format!(
                    "container {id:016x} has a record but no segment in it"
                ));
            }
        }
        if !derived.is_empty() {
            let count = derived.len();
            let mut shown: Vec<String> = derived.into_iter().take(10).collect();
            if count > shown.len() {
                shown.push(format!("and {} more", count - shown.len()));
            }
            inspection.push(
                Finding::new(
                    FindingKind::Derived,
                    face_path(CATALOG_FILE)
                        + " (reference counts, segment heads, container records)",
                    format!(
                        "{count} derived records disagree with the primary ones: {}",
                        shown.join("; ")
                    ),
                ),
                Problem::DerivedCatalog,
            );
        }
        inspection.container_records = container_records;
        Ok(())
    }

    /// Steps 4 and 5: every container a segment record uses.
    fn inspect_containers(&self, options: CheckOptions, inspection: &mut Inspection) -> Result<()> {
        let fingerprinter = &self.fingerprinter;
        let mut ids: Vec<ContainerId> = inspection.placed.keys().copied().collect();
        ids.sort_unstable();
        let verdicts: Vec<(ContainerId, Result<ContainerVerdict>)> = ids
            .par_iter()
            .map(|&id| {
                let record = inspection.container_records.get(&id);
                let frames = &inspection.placed[&id];
                (
                    id,
                    verify_container(
                        &self.containers,
                        fingerprinter,
                        id,
                        record,
                        frames,
                        options.read_data,
                    ),
                )
            })
            .collect();
        for (id, verdict) in verdicts {
            let verdict = verdict?;
            inspection.count("chunks_verified", verdict.chunks_verified);
            inspection.count("bytes_verified", verdict.bytes_verified);
            if !verdict.is_damaged() {
                continue;
            }
            let object = container_object(&self.containers, id);
            if verdict.missing {
                inspection.push(
                    Finding::new(FindingKind::Damage, &object, "the file is missing"),
                    Problem::Container(id),
                );
            } else {
                if !verdict.structure.is_empty() {
                    inspection.push(
                        Finding::new(FindingKind::Damage, &object, verdict.structure.join("; ")),
                        Problem::Container(id),
                    );
                }
                for (&(segment, index), (offset, detail)) in &verdict.damaged {
                    inspection.push(
                        Finding::new(
                            FindingKind::Damage,
                            format!(
                                "chunk {index} of segment {segment} (container {id:016x}, offset {offset})"
                            ),
                            detail.clone(),
                        ),
                        Problem::Container(id),
                    );
                }
            }
            inspection.containers.insert(id, verdict);
        }
        Ok(())
    }

    /// Step 6: files nothing refers to.
    fn inspect_files(&self, inspection: &mut Inspection) -> Result<()> {
        let mut listed = 0;
        for id in self.containers.list()? {
            listed += 1;
            if inspection.placed.contains_key(&id) || inspection.container_records.contains_key(&id)
            {
                continue;
            }
            inspection.push(
                Finding::new(
                    FindingKind::Leftover,
                    container_object(&self.containers, id),
                    "no catalog record names it (left by an interrupted command, or on object \
                     storage by a backup for the next changing command to delete)",
                ),
                Problem::LeftoverContainer(id),
            );
        }
        inspection.count("container_files", listed);
        let mut temporary = Vec::new();
        for directory in ["", crate::segment_index::PAGES_DIRECTORY] {
            for name in self.storage.list(directory)? {
                if name.ends_with(".tmp") || name.ends_with(".new") {
                    temporary.push(name);
                }
            }
        }
        for name in temporary {
            inspection.push(
                Finding::new(
                    FindingKind::Leftover,
                    face_path(&name),
                    "a temporary file of an interrupted command",
                ),
                Problem::LeftoverFile(name),
            );
        }
        Ok(())
    }

    /// Step 7: the segment index.
    fn inspect_index(
        &mut self,
        read: &impl CatalogView,
        inspection: &mut Inspection,
    ) -> Result<()> {
        let object = "segment index (backup/meta)";
        // A manifest that does not read is what a checkpoint interrupted by a crash leaves,
        // or damage; either way the index uses the other one (possibly an older checkpoint,
        // which the serial comparison below reports) and the next checkpoint rewrites it.
        let manifests = crate::segment_index::SegmentIndex::damaged_manifests(&self.storage)?;
        for (name, problem) in manifests {
            inspection.push(
                Finding::new(
                    FindingKind::Leftover,
                    face_path(&name),
                    format!(
                        "{problem}: not a valid manifest (an interrupted checkpoint, or damage); \
                         the segment index uses the other one"
                    ),
                ),
                Problem::Index,
            );
        }
        let expected = by_index_key(&indexable_segments(read, &self.state.damaged_segments)?);
        if let Some(damage) = &self.index_damage {
            let mut detail = damage.clone();
            if self.index.is_some() {
                detail += "; thrown away at open (the next change or a repair fills it again)";
            }
            // An index that was never written while there is nothing to index is what an
            // interrupted first backup leaves: nothing is missing from it.
            let kind = if self.index.is_none()
                && expected.is_empty()
                && !crate::segment_index::SegmentIndex::exists(&self.storage)?
            {
                detail += "; nothing needs indexing yet (the next change creates it)";
                FindingKind::Leftover
            } else {
                FindingKind::Derived
            };
            inspection.push(Finding::new(kind, object, detail), Problem::Index);
            return Ok(());
        }
        let Some(index) = self.index.as_mut() else {
            inspection.push(
                Finding::new(FindingKind::Derived, object, "not open (see the notices)"),
                Problem::Index,
            );
            return Ok(());
        };
        if let Err(error) = index.verify() {
            inspection.push(
                Finding::new(FindingKind::Derived, object, describe(&error)),
                Problem::Index,
            );
            return Ok(());
        }
        let (mut entries, mut mismatched) = (0u64, 0u64);
        index.for_each_entry(|key, id| {
            entries += 1;
            if expected.get(key) != Some(&id) {
                mismatched += 1;
            }
        })?;
        inspection.count("index_entries", entries);
        let missing = expected.len() as u64 - (entries - mismatched).min(expected.len() as u64);
        if mismatched == 0 && missing == 0 {
            return Ok(());
        }
        let detail = format!(
            "{entries} entries ({mismatched} stale, {missing} missing) for {} shared segments; \
             checkpoint of catalog serial {}, the catalog is at {}",
            expected.len(),
            index.serial(),
            self.state.serial
        );
        // An index checkpointed at another serial is what an interrupted command leaves, and
        // the next change reconciles it; at the same serial, the index itself is wrong.
        let kind = if index.serial() != self.state.serial {
            FindingKind::Leftover
        } else {
            FindingKind::Derived
        };
        inspection.push(Finding::new(kind, object, detail), Problem::Index);
        Ok(())
    }

    /// Lost findings: backups with chunks an earlier repair marked lost, and damage an
    /// earlier repair recorded by name.
    fn report_losses(
        &self,
        read: &impl CatalogView,
        backups: &BackupsSeen,
        recorded: &[(u64, crate::losses::LossRecord)],
        inspection: &mut Inspection,
    ) -> Result<()> {
        let by_object: HashMap<&str, &crate::losses::LossRecord> = recorded
            .iter()
            .map(|(_, record)| (record.object.as_str(), record))
            .collect();
        for (finding, problem) in &mut inspection.findings {
            if finding.kind != FindingKind::Damage {
                continue;
            }
            if let Some(record) = by_object.get(finding.object.as_str()) {
                finding.kind = FindingKind::Lost;
                finding.detail = format!(
                    "{} (recorded by a repair at {}; it could not be rebuilt)",
                    finding.detail,
                    crate::losses::format_time(record.recorded_unix_ns)
                );
                finding.lost = record.lost.clone();
                *problem = Problem::Recorded;
            }
        }
        for checked in &backups.with_losses {
            let chunks: BTreeSet<(SegmentId, u32)> = checked
                .lost
                .iter()
                .map(|range| (range.segment, range.index))
                .collect();
            let damage: Vec<String> = recorded
                .iter()
                .filter(|(_, record)| record.chunks.iter().any(|chunk| chunks.contains(chunk)))
                .map(|(_, record)| {
                    format!(
                        "{}: {} (repaired at {})",
                        record.object,
                        record.damage,
                        crate::losses::format_time(record.recorded_unix_ns)
                    )
                })
                .collect();
            let bytes: u64 = losses::merged(&checked.lost)
                .iter()
                .map(|(start, end)| end - start)
                .sum();
            let lost = losses::describe_backup_losses(
                self,
                read,
                &checked.backup,
                &checked.sources,
                &checked.lost,
                &checked.label,
            );
            let detail = if damage.is_empty() {
                format!("{bytes} bytes in {} chunks are lost", checked.lost.len())
            } else {
                format!(
                    "{bytes} bytes in {} chunks are lost to damage: {}",
                    checked.lost.len(),
                    damage.join("; ")
                )
            };
            inspection.push(
                Finding::new(FindingKind::Lost, &checked.label, detail).with_lost(lost),
                Problem::Recorded,
            );
        }
        Ok(())
    }
}

/// True when the finding asks a repair for something.
fn needs_repair((finding, problem): &(Finding, Problem)) -> bool {
    finding.repair.is_none() && *problem != Problem::Recorded
}

/// True when an open failed because the catalog is damaged (as opposed to I/O errors).
pub(crate) fn is_catalog_damage(error: &BackupError) -> bool {
    matches!(
        error,
        BackupError::Core(CoreError::Corrupt { .. } | CoreError::Catalog { .. })
            | BackupError::Corrupt { .. }
    )
}

/// The report for a face without a catalog: nothing when nothing else is there either, the
/// catalog's loss when containers exist.
fn missing_catalog_report(storage: &Arc<dyn Storage>) -> Result<FaceReport> {
    let mut report = FaceReport::new(FACE);
    let containers = storage
        .list(CONTAINERS_DIRECTORY)
        .map(|names| names.len())
        .unwrap_or(0);
    let mut shards = 0;
    for shard in 0..=0xffu32 {
        shards += storage
            .list(&format!("{CONTAINERS_DIRECTORY}/{shard:02x}"))?
            .len();
    }
    if containers + shards > 0 {
        report.push(Finding::new(
            FindingKind::Damage,
            face_path(CATALOG_FILE),
            format!(
                "the catalog is missing while {} container files exist: no backup can be \
                 restored",
                containers + shards
            ),
        ));
    }
    Ok(report)
}

/// What step 2 saw.
struct BackupsSeen {
    counts: ReferenceCounts,
    with_losses: Vec<CheckedBackup>,
}

impl Default for BackupsSeen {
    fn default() -> Self {
        BackupsSeen {
            counts: ReferenceCounts {
                complete: true,
                ..ReferenceCounts::default()
            },
            with_losses: Vec::new(),
        }
    }
}

/// A backup that resolved, with its lost chunks.
pub(crate) struct CheckedBackup {
    pub label: String,
    pub backup: BackupRecord,
    pub sources: Vec<ChunkSource>,
    pub lost: Vec<LostRange>,
}

/// Why a backup did not check.
struct BackupDamage {
    detail: String,
    /// Some(true) when its recipe did not read (its references are then not counted).
    recipe_unread: Option<bool>,
}

impl From<BackupError> for BackupDamage {
    fn from(error: BackupError) -> Self {
        BackupDamage {
            detail: describe(&error),
            recipe_unread: None,
        }
    }
}

/// Checks one backup's record, recipe and chains, and counts its references.
fn check_backup(
    read: &impl CatalogView,
    series: &SeriesRecord,
    id: BackupId,
    version: u32,
    cache: &mut SegmentCache,
    counts: &mut ReferenceCounts,
) -> std::result::Result<CheckedBackup, BackupDamage> {
    let backup = crate::series::load_backup(read, id).map_err(|error| BackupDamage {
        detail: describe(&error),
        recipe_unread: Some(true),
    })?;
    let label = format!("backup {}@{version}", series.name);
    if backup.id != id || backup.version != version || backup.series != series.name {
        return Err(BackupDamage {
            detail: format!(
                "catalog record backups/{id} holds backup {}@{} (id {}), not this one",
                backup.series, backup.version, backup.id
            ),
            recipe_unread: Some(true),
        });
    }
    let recipe =
        Recipe::load(read, backup.id, backup.recipe_parts).map_err(|error| BackupDamage {
            detail: describe(&error),
            recipe_unread: Some(true),
        })?;
    match &recipe {
        Recipe::Live(references) => {
            for reference in references {
                *counts.live.entry(reference.segment).or_insert(0) += 1;
                counts
                    .users
                    .entry(reference.segment)
                    .or_default()
                    .insert(label.clone());
            }
        }
        Recipe::Archival(references) => {
            for reference in references {
                if let ChunkReference::Direct { segment, index, .. } = *reference {
                    *counts.direct.entry((segment, index)).or_insert(0) += 1;
                    counts
                        .users
                        .entry(segment)
                        .or_default()
                        .insert(label.clone());
                }
            }
        }
    }
    let (sources, _) = resolve(read, series, &backup)?;
    let mut bytes = 0u64;
    let mut lost = Vec::new();
    for source in &sources {
        let raw_bytes = match *source {
            ChunkSource::Zero { raw_bytes } => raw_bytes as u64,
            ChunkSource::Stored { segment, index } => {
                let (located, raw_bytes) = locate(read, cache, segment, index)?;
                if located == ChunkBytes::Lost {
                    lost.push(LostRange {
                        start: bytes,
                        end: bytes + raw_bytes as u64,
                        segment,
                        index,
                    });
                }
                raw_bytes as u64
            }
        };
        bytes += raw_bytes;
    }
    if bytes != backup.logical_bytes || sources.len() as u64 != backup.chunk_count {
        return Err(BackupDamage {
            detail: format!(
                "its recipe has {} chunks of {bytes} bytes, its record says {} chunks of {} bytes",
                sources.len(),
                backup.chunk_count,
                backup.logical_bytes
            ),
            recipe_unread: None,
        });
    }
    Ok(CheckedBackup {
        label,
        backup,
        sources: if lost.is_empty() { Vec::new() } else { sources },
        lost,
    })
}

/// Steps 4 and 5 for one container: `frames` are the frames holding stored chunks that
/// segment records place in it; `record` its catalog record, if it has one.
pub(crate) fn verify_container(
    containers: &ContainerStore,
    fingerprinter: &Fingerprinter,
    id: ContainerId,
    record: Option<&SegmentContainer>,
    frames: &[PlacedFrame],
    read_data: bool,
) -> Result<ContainerVerdict> {
    let mut verdict = ContainerVerdict::default();
    let file = match containers.file(id) {
        Ok(file) => file,
        Err(CoreError::NotFound(_)) => {
            verdict.missing = true;
            return Ok(verdict);
        }
        Err(error) => return Err(error.into()),
    };
    let length = file.len()?;
    if let Some(record) = record {
        if length != record.bytes {
            verdict.structure.push(format!(
                "the file has {length} bytes, its record says {}",
                record.bytes
            ));
        }
    }
    let mut header = [0u8; HEADER_BYTES];
    let read = if length >= HEADER_BYTES as u64 {
        file.read_at(0, &mut header)
    } else {
        Ok(())
    };
    match read {
        // An encrypted store's damaged block says what failed (authentication).
        Err(error) => verdict
            .structure
            .push(format!("its header cannot be read: {error}")),
        Ok(()) => {
            let header_ok = length >= HEADER_BYTES as u64
                && &header[..8] == CONTAINER_MAGIC
                && header[16..24] == id.to_le_bytes();
            if !header_ok {
                verdict
                    .structure
                    .push("its header does not name this container".to_string());
            }
        }
    }
    let mut unreferenced = Vec::new();
    match containers.read_contents(id) {
        Ok(contents) => {
            verdict.trailer_timestamp = Some(contents.timestamp);
            if let Some(record) = record {
                if contents.timestamp != record.timestamp {
                    verdict.structure.push(format!(
                        "time stamp {} in its trailer, {} in its record",
                        contents.timestamp, record.timestamp
                    ));
                }
            }
            let by_offset: HashMap<u32, _> = contents
                .chunks
                .iter()
                .map(|chunk| (chunk.location.offset, chunk))
                .collect();
            let placed: std::collections::HashSet<u32> =
                frames.iter().map(|frame| frame.location.offset).collect();
            // Frames no record references any more (all their chunks removed, not yet
            // compacted): their record headers and bytes are compared with the trailer below.
            unreferenced = contents
                .chunks
                .iter()
                .filter(|stored| !placed.contains(&stored.location.offset))
                .map(|stored| PlacedFrame {
                    segment: 0,
                    location: stored.location,
                    fingerprint: Some(stored.fingerprint),
                    chunks: Vec::new(),
                })
                .collect();
            let mut differing = Vec::new();
            for frame in frames {
                let matches = by_offset.get(&frame.location.offset).is_some_and(|stored| {
                    frame
                        .fingerprint
                        .is_none_or(|fingerprint| stored.fingerprint == fingerprint)
                        && stored.location == frame.location
                });
                if !matches {
                    differing.push(format!(
                        "a frame of segment {} (offset {})",
                        frame.segment, frame.location.offset
                    ));
                }
            }
            if !differing.is_empty() {
                verdict.structure.push(format!(
                    "its trailer does not list {} as the catalog does",
                    list_some(&differing)
                ));
            }
        }
        Err(error) => verdict.structure.push(format!("its trailer: {error}")),
    }
    if !read_data {
        return Ok(verdict);
    }
    let mut data = vec![0u8; length as usize];
    file.read_at(0, &mut data)?;
    let mut headers_differing = Vec::new();
    for frame in frames {
        match verify_frame(&data, frame, fingerprinter) {
            Ok(_) => {
                verdict.chunks_verified += frame.chunks.len() as u64;
                verdict.bytes_verified += frame
                    .chunks
                    .iter()
                    .map(|&(_, _, _, raw_bytes)| raw_bytes as u64)
                    .sum::<u64>();
            }
            Err(detail) => {
                for &(index, ..) in &frame.chunks {
                    verdict.damaged.insert(
                        (frame.segment, index),
                        (frame.location.offset, detail.clone()),
                    );
                }
            }
        }
        if let Some(fields) = record_header_differs(&data, frame) {
            headers_differing.push(format!(
                "a frame of segment {} (record header at offset {}: {fields})",
                frame.segment,
                frame.location.header_offset()
            ));
        }
    }
    if !headers_differing.is_empty() {
        verdict.structure.push(format!(
            "record headers differ from the catalog for {}",
            list_some(&headers_differing)
        ));
    }
    let mut garbage_damaged = Vec::new();
    for frame in &unreferenced {
        let start = frame.location.offset as usize;
        let intact = data
            .get(start..start + frame.location.stored_bytes as usize)
            .is_some_and(|stored| codec::verify(&frame.location, stored).is_ok());
        if !intact || record_header_differs(&data, frame).is_some() {
            garbage_damaged.push(format!("offset {}", frame.location.offset));
        }
    }
    if !garbage_damaged.is_empty() {
        verdict.structure.push(format!(
            "chunks no backup references (removed, not yet compacted) differ from the trailer \
             at {}",
            list_some(&garbage_damaged)
        ));
    }
    Ok(verdict)
}

/// What an error says, for a finding's detail: without the advice to run a check, which the
/// error messages carry for other commands.
fn describe(error: &BackupError) -> String {
    match error {
        BackupError::Corrupt { what, detail }
        | BackupError::Core(CoreError::Corrupt { what, detail }) => format!("{what}: {detail}"),
        other => other.to_string(),
    }
}

/// At most five of `items`, then how many more.
fn list_some(items: &[String]) -> String {
    let mut shown: Vec<String> = items.iter().take(5).cloned().collect();
    if items.len() > shown.len() {
        shown.push(format!("{} more", items.len() - shown.len()));
    }
    shown.join(", ")
}
