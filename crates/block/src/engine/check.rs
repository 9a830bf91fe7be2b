//! `onecopy check` of the block device: what is damaged, what a repair rebuilds, what is lost.
//!
//! A check reads, in this order, and changes nothing:
//!
//! 1. what opening found ([`Engine::open_findings`]: manifests, journals, leftovers);
//! 2. every metadata page against its checksum. A damaged page of a volume's map loses the
//!    blocks it maps; one of the chunk table loses the chunks it describes (and so the blocks
//!    that use them); one of the container table or the fingerprint index loses nothing:
//!    those are derived;
//! 3. every chunk record in use: its container exists (and with `read_data`, its bytes pass
//!    their checksum and, for indexed chunks, their fingerprint);
//! 4. every map entry: blocks recorded lost by an earlier repair, and blocks that refer to
//!    a chunk that is damaged, missing or not in use;
//! 5. the derived tables against what they derive from: reference counts against the maps,
//!    the store's scalars, the container table against the chunks and files, the
//!    fingerprint index against the chunk records; and every sealed container's trailer.
//!
//! A repair then makes the rest usable: damaged map pages and every block that refers to a
//! damaged chunk become lost blocks (reads of them fail, naming them, until they are written
//! again), damaged chunk-table pages become free records, every derived table is rebuilt
//! ([`ChunkStore::rebuild`]), containers whose trailer or record headers are damaged are
//! compacted (their live chunks copied to a new container), and a checkpoint makes it all
//! durable. The report says what each finding lost.
//!
//! [`ChunkStore::rebuild`]: onecopy_core::chunk_store::ChunkStore::rebuild

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use crate::error::Result;
use onecopy_core::check::{CheckOptions, FaceReport, Finding, FindingKind};
use onecopy_core::chunk_store::{ChunkId, ContainerState, RebuildReport, ZERO_CHUNK};
use onecopy_core::container::{ChunkLocation, ContainerId};
use onecopy_core::fingerprint::Fingerprint;
use onecopy_core::gc::{self, CompactionPlan, PlannedContainer};
use onecopy_core::index::IndexKey;
use onecopy_core::pages::DamagedPage;
use onecopy_core::Error;

use super::recovery::block_ranges;
use super::{
    map_entry, set_map_entry, Engine, EngineState, OpenMode, LOST_CHUNK, MAP_ENTRIES_PER_PAGE,
};
use crate::changes::BlockChange;
use crate::volume::{VolumeId, VolumeRecord};

/// Why a chunk cannot be read.
#[derive(Clone, Debug)]
enum ChunkDamage {
    /// Its record's page is damaged: where the chunk is, is unknown.
    RecordPage,
    /// Its container file is missing.
    ContainerMissing(ContainerId),
    /// Its container file ends before the chunk's bytes do.
    ContainerCut(ContainerId),
    /// Its bytes fail their checksum or fingerprint.
    Data(String),
}

/// The chunks in use a missing or cut container lost, and the blocks that used them.
#[derive(Default)]
struct ContainerLoss {
    chunks: u64,
    blocks: Vec<(VolumeId, u64)>,
}

/// What a check found, before it is reported or repaired.
#[derive(Default)]
struct Analysis {
    damaged_pages: Vec<DamagedPage>,
    /// Chunk ids in the damaged pages of the chunk table.
    damaged_record_ids: HashSet<ChunkId>,
    /// Chunks in use that cannot be read.
    damaged_chunks: BTreeMap<ChunkId, ChunkDamage>,
    /// References held by the maps (lost and bad entries excluded), by chunk id.
    counted: Vec<u32>,
    /// Blocks an earlier repair marked lost, by volume.
    recorded_lost: BTreeMap<VolumeId, Vec<u64>>,
    /// Blocks whose chunk is damaged, missing or not in use, by volume, with the chunk.
    bad_references: BTreeMap<VolumeId, Vec<(u64, ChunkId)>>,
    /// Blocks of damaged map pages, by volume.
    unmapped: BTreeMap<VolumeId, Vec<u64>>,
    /// Containers whose header, trailer, size or record headers are damaged.
    damaged_containers: BTreeMap<ContainerId, String>,
    /// Containers that hold chunks in use, but the live writer's.
    containers_in_use: BTreeSet<ContainerId>,
    /// With `read_data`: where each chunk in use lives, by container, to compare with the
    /// record headers in the container's body.
    locations: BTreeMap<ContainerId, Vec<(ChunkLocation, Option<Fingerprint>)>>,
}

impl Engine {
    /// Checks the block device (see the module documentation). With `options.repair` the
    /// engine must have been opened with [`OpenMode::Repair`]; the repair ends with a
    /// checkpoint. Damage is reported in the findings; only I/O failures that prevent the
    /// check are errors.
    pub fn check(&self, options: CheckOptions) -> Result<FaceReport> {
        if options.repair && self.mode() != OpenMode::Repair {
            return Err(Error::InvalidArgument(
                "a repair needs the block device opened for repair (`onecopy check --repair`)"
                    .to_string(),
            )
            .into());
        }
        let mut state = self.state.lock();
        let mut report = FaceReport::new("block");
        for finding in self.open_findings() {
            report.push(finding.clone());
        }
        let analysis = self.analyse(&mut state, options, &mut report)?;
        if options.repair {
            let result = self.repair_locked(&mut state, &analysis, &mut report);
            self.fail_on_error(&mut state, result)?;
            report.repaired = true;
        }
        Ok(report)
    }

    fn analyse(
        &self,
        state: &mut EngineState,
        options: CheckOptions,
        report: &mut FaceReport,
    ) -> Result<Analysis> {
        let mut analysis = Analysis::default();
        let (pages_checked, damaged_pages) = state.pages.verify()?;
        report.count("pages", pages_checked);
        let volumes: Vec<Arc<VolumeRecord>> = state
            .volumes
            .values()
            .map(|volume| Arc::clone(&volume.record))
            .collect();
        let records_per_page = state.chunks.records_per_page();
        for damaged in &damaged_pages {
            if damaged.area == "chunks" {
                let first = damaged.page * records_per_page;
                analysis
                    .damaged_record_ids
                    .extend(first..first + records_per_page);
            } else if let Some(volume) = volumes
                .iter()
                .find(|volume| volume.map_area_name() == damaged.area)
            {
                let first = damaged.page * MAP_ENTRIES_PER_PAGE;
                let end = (first + MAP_ENTRIES_PER_PAGE).min(volume.block_count());
                analysis
                    .unmapped
                    .entry(volume.id)
                    .or_default()
                    .extend(first..end);
            }
        }
        analysis.damaged_pages = damaged_pages;

        self.analyse_chunks(state, options, &mut analysis, report)?;
        self.analyse_maps(state, &volumes, &mut analysis, report)?;
        self.analyse_containers(state, &mut analysis, report)?;
        self.report_damage(state, &volumes, &analysis, report);
        self.analyse_derived(state, &analysis, report)?;
        Ok(analysis)
    }

    /// Step 3: every chunk in use can be found, and with `read_data` read.
    fn analyse_chunks(
        &self,
        state: &mut EngineState,
        options: CheckOptions,
        analysis: &mut Analysis,
        report: &mut FaceReport,
    ) -> Result<()> {
        let files: HashSet<ContainerId> = state.chunks.containers().list()?.into_iter().collect();
        let mut lengths: HashMap<ContainerId, u64> = HashMap::new();
        // The container a read-write engine appends to may hold bytes not written yet; in a
        // read-only or repair open, the one the last run appended to is like any other.
        let live = state
            .chunks
            .state()
            .open_container
            .filter(|_| self.mode() == OpenMode::ReadWrite);
        let algorithm = self.config().fingerprint;
        let end = state.chunks.state().chunk_id_next;
        let mut data = Vec::new();
        for id in 1..end {
            if analysis.damaged_record_ids.contains(&id) {
                analysis.damaged_chunks.insert(id, ChunkDamage::RecordPage);
                continue;
            }
            let record = state.chunks.record(&mut state.pages, id)?;
            if !record.in_use {
                continue;
            }
            report.count("chunks", 1);
            let container = record.location.container;
            let open = live == Some(container);
            if !open {
                if !files.contains(&container) {
                    analysis
                        .damaged_chunks
                        .insert(id, ChunkDamage::ContainerMissing(container));
                    continue;
                }
                analysis.containers_in_use.insert(container);
                let length = match lengths.get(&container) {
                    Some(&length) => length,
                    None => {
                        let length = state.chunks.containers().container_bytes(container)?;
                        lengths.insert(container, length);
                        length
                    }
                };
                let end = record.location.offset as u64 + record.location.stored_bytes as u64;
                if end > length {
                    analysis
                        .damaged_chunks
                        .insert(id, ChunkDamage::ContainerCut(container));
                    continue;
                }
            }
            if !options.read_data {
                continue;
            }
            if !open {
                analysis.locations.entry(container).or_default().push((
                    record.location,
                    record.indexed.then_some(record.fingerprint),
                ));
            }
            report.count("chunk_bytes", record.location.raw_bytes as u64);
            data.resize(record.location.raw_bytes as usize, 0);
            let damage = match state.chunks.read_into(&mut state.pages, id, &mut data) {
                Ok(()) if record.indexed && algorithm.hash(&data) != record.fingerprint => {
                    Some("its bytes do not match its fingerprint".to_string())
                }
                Ok(()) => None,
                Err(error) if error.is_corrupt() || matches!(error, Error::NotFound(_)) => {
                    Some(error.to_string())
                }
                Err(error) => return Err(error.into()),
            };
            if let Some(detail) = damage {
                analysis
                    .damaged_chunks
                    .insert(id, ChunkDamage::Data(detail));
            }
        }
        Ok(())
    }

    /// Step 4: every map entry.
    fn analyse_maps(
        &self,
        state: &mut EngineState,
        volumes: &[Arc<VolumeRecord>],
        analysis: &mut Analysis,
        report: &mut FaceReport,
    ) -> Result<()> {
        let end = state.chunks.state().chunk_id_next;
        analysis.counted = vec![0u32; end as usize];
        for record in volumes {
            let map = state.volumes[&record.id].map;
            let area = state.pages.area(&record.map_area_name());
            let written_blocks =
                (state.pages.page_count(area) * MAP_ENTRIES_PER_PAGE).min(record.block_count());
            let unmapped: HashSet<u64> = analysis
                .unmapped
                .get(&record.id)
                .map(|blocks| blocks.iter().copied().collect())
                .unwrap_or_default();
            for block in 0..written_blocks {
                if unmapped.contains(&block) {
                    continue;
                }
                report.count("blocks", 1);
                let chunk = map_entry(&mut state.pages, &map, block)?;
                if chunk == ZERO_CHUNK {
                    continue;
                }
                if chunk == LOST_CHUNK {
                    // Blocks this open's salvage marked are reported with their journal damage.
                    let salvaged = self
                        .salvaged_lost
                        .get(&record.id)
                        .is_some_and(|blocks| blocks.contains(&block));
                    if !salvaged {
                        analysis
                            .recorded_lost
                            .entry(record.id)
                            .or_default()
                            .push(block);
                    }
                    continue;
                }
                let usable = chunk < end
                    && !analysis.damaged_chunks.contains_key(&chunk)
                    && state.chunks.record(&mut state.pages, chunk)?.in_use;
                if usable {
                    let count = &mut analysis.counted[chunk as usize];
                    *count = count.saturating_add(1);
                } else {
                    analysis
                        .bad_references
                        .entry(record.id)
                        .or_default()
                        .push((block, chunk));
                }
            }
        }
        Ok(())
    }

    /// Step 5, containers: every one in use starts with its header, and every sealed one
    /// ends in its trailer at the size its seal recorded.
    fn analyse_containers(
        &self,
        state: &mut EngineState,
        analysis: &mut Analysis,
        report: &mut FaceReport,
    ) -> Result<()> {
        for &id in &analysis.containers_in_use {
            if state.chunks.containers().created_at(id)?.is_none() {
                analysis
                    .damaged_containers
                    .insert(id, "its header (bytes 0..64) is damaged".to_string());
            }
        }
        if analysis
            .damaged_pages
            .iter()
            .any(|page| page.area == "containers")
        {
            // The table is rebuilt by a repair; its records cannot be trusted here.
            return Ok(());
        }
        for id in 1..state.chunks.state().container_id_next {
            let container = state.chunks.container_record(&mut state.pages, id)?;
            if container.state != ContainerState::Sealed {
                continue;
            }
            report.count("containers", 1);
            match state.chunks.containers().verify_sealed(id, container.bytes) {
                Ok(()) => {}
                Err(Error::Corrupt { detail, .. }) => {
                    analysis.damaged_containers.entry(id).or_insert(detail);
                }
                // A missing file was reported with the chunks that live in it.
                Err(Error::NotFound(_)) => {}
                Err(error) => return Err(error.into()),
            }
        }
        // With `read_data`, the body too: every chunk in use must sit behind an intact
        // record header that describes it as its chunk record does.
        for (&id, chunks) in &analysis.locations {
            if analysis.damaged_containers.contains_key(&id) {
                continue;
            }
            for (location, fingerprint) in chunks {
                let at = location.header_offset();
                let stored = match state.chunks.containers().chunk_at(id, at) {
                    Ok(stored) => stored,
                    // A missing file was reported with the chunks that live in it.
                    Err(Error::NotFound(_)) => break,
                    Err(error) => return Err(error.into()),
                };
                let described = stored.is_some_and(|stored| {
                    stored.location == *location
                        && fingerprint.is_none_or(|fingerprint| stored.fingerprint == fingerprint)
                });
                if !described {
                    analysis.damaged_containers.insert(
                        id,
                        format!(
                            "the record header at byte {at} is damaged or does not describe \
                             its chunk"
                        ),
                    );
                    break;
                }
            }
        }
        Ok(())
    }

    /// Findings for primary damage: pages, chunks, references, containers.
    fn report_damage(
        &self,
        state: &EngineState,
        volumes: &[Arc<VolumeRecord>],
        analysis: &Analysis,
        report: &mut FaceReport,
    ) {
        let name = |id: VolumeId| {
            volumes
                .iter()
                .find(|volume| volume.id == id)
                .map_or_else(|| format!("id {id}"), |volume| volume.name.clone())
        };
        // Chunks that cannot be read, with the blocks that use them.
        let mut users: BTreeMap<ChunkId, Vec<(VolumeId, u64)>> = BTreeMap::new();
        for (&volume, blocks) in &analysis.bad_references {
            for &(block, chunk) in blocks {
                users.entry(chunk).or_default().push((volume, block));
            }
        }
        for damaged in &analysis.damaged_pages {
            let object = format!(
                "block/meta/pages: page {} of area {}",
                damaged.page, damaged.area
            );
            let finding = if damaged.area == "chunks" {
                let per_page = state.chunks.records_per_page();
                let first = damaged.page * per_page;
                let blocks: Vec<(VolumeId, u64)> = users
                    .range(first..first + per_page)
                    .flat_map(|(_, blocks)| blocks.iter().copied())
                    .collect();
                Finding::new(
                    FindingKind::Damage,
                    object,
                    format!(
                        "{}; the records of chunks {first} to {} are unreadable, so where the \
                         blocks using them are stored is unknown",
                        damaged.detail,
                        first + per_page - 1
                    ),
                )
                .with_lost(lost_blocks(&blocks, &name))
            } else if let Some(volume) = volumes
                .iter()
                .find(|volume| volume.map_area_name() == damaged.area)
            {
                let blocks = &analysis.unmapped[&volume.id];
                Finding::new(
                    FindingKind::Damage,
                    object,
                    format!(
                        "{}; it maps blocks {} to {} of volume {}",
                        damaged.detail,
                        blocks.first().copied().unwrap_or(0),
                        blocks.last().copied().unwrap_or(0),
                        volume.name
                    ),
                )
                .with_lost(block_ranges(&volume.name, blocks))
            } else {
                Finding::new(
                    FindingKind::Derived,
                    object,
                    format!("{} (derived data, rebuilt by a repair)", damaged.detail),
                )
            };
            report.push(finding);
        }
        let mut reported = HashSet::new();
        // Chunks of a missing or cut container are reported with their container, once.
        let mut by_container: BTreeMap<(ContainerId, bool), ContainerLoss> = BTreeMap::new();
        for (&chunk, damage) in &analysis.damaged_chunks {
            reported.insert(chunk);
            let blocks = users.get(&chunk).cloned().unwrap_or_default();
            let (object, detail) = match damage {
                // Reported with its page.
                ChunkDamage::RecordPage => continue,
                ChunkDamage::ContainerMissing(container) | ChunkDamage::ContainerCut(container) => {
                    let missing = matches!(damage, ChunkDamage::ContainerMissing(_));
                    let entry = by_container.entry((*container, missing)).or_default();
                    entry.chunks += 1;
                    entry.blocks.extend(blocks);
                    continue;
                }
                ChunkDamage::Data(detail) => (format!("chunk {chunk}"), detail.clone()),
            };
            report.push(
                Finding::new(FindingKind::Damage, object, detail)
                    .with_lost(lost_blocks(&blocks, &name)),
            );
        }
        for (&(container, missing), ContainerLoss { chunks, blocks }) in &by_container {
            let detail = if missing {
                format!("the container file is missing; {chunks} chunks in use were stored in it")
            } else {
                format!("the container file is cut short: {chunks} chunks in use lay past its end")
            };
            report.push(
                Finding::new(
                    FindingKind::Damage,
                    format!("block/{}", state.chunks.containers().name(container)),
                    detail,
                )
                .with_lost(lost_blocks(blocks, &name)),
            );
        }
        for (&chunk, blocks) in &users {
            if reported.contains(&chunk) {
                continue;
            }
            report.push(
                Finding::new(
                    FindingKind::Damage,
                    format!("chunk {chunk}"),
                    "map entries refer to it, but it is not in use",
                )
                .with_lost(lost_blocks(blocks, &name)),
            );
        }
        for (&volume, blocks) in &analysis.recorded_lost {
            report.push(
                Finding::new(
                    FindingKind::Lost,
                    format!("volume {}", name(volume)),
                    format!(
                        "{} blocks were recorded lost by an earlier repair; reads of them fail \
                         until they are written again (restore them from a backup, or write \
                         zeros and run the file system's check)",
                        blocks.len()
                    ),
                )
                .with_lost(block_ranges(&name(volume), blocks)),
            );
        }
        for (&container, detail) in &analysis.damaged_containers {
            if by_container.contains_key(&(container, false)) {
                // Reported as cut, with what it lost; a repair still moves what is left.
                continue;
            }
            report.push(Finding::new(
                FindingKind::Damage,
                format!("block/{}", state.chunks.containers().name(container)),
                format!(
                    "{detail}; its chunks are read through the chunk table, so nothing is lost, \
                     but the container no longer describes itself (a repair copies its live \
                     chunks to a new container)"
                ),
            ));
        }
    }

    /// Step 5, derived tables.
    fn analyse_derived(
        &self,
        state: &mut EngineState,
        analysis: &Analysis,
        report: &mut FaceReport,
    ) -> Result<()> {
        let chunk_pages_damaged = !analysis.damaged_record_ids.is_empty();
        let end = state.chunks.state().chunk_id_next;
        let mut references_wrong = 0u64;
        let mut unreferenced = 0u64;
        let mut index_missing = 0u64;
        let mut live_chunks = 0u64;
        let index_damaged = analysis
            .damaged_pages
            .iter()
            .any(|page| page.area.starts_with("index."));
        for id in 1..end {
            if analysis.damaged_record_ids.contains(&id) {
                continue;
            }
            let record = state.chunks.record(&mut state.pages, id)?;
            if !record.in_use {
                continue;
            }
            live_chunks += 1;
            if analysis.damaged_chunks.contains_key(&id) {
                // Reported as damage; its references are bad ones.
                continue;
            }
            let counted = analysis.counted[id as usize];
            if counted == 0 {
                unreferenced += 1;
            } else if record.references != counted {
                references_wrong += 1;
            }
            if record.indexed && !index_damaged {
                // The index names one chunk per fingerprint; chunks sharing a weak one are
                // reached along its chain.
                let reached = state.chunks.chain(&mut state.pages, &record.fingerprint)?;
                if !reached.contains(&id) {
                    index_missing += 1;
                }
            }
        }
        let mut derived = Vec::new();
        if references_wrong > 0 {
            derived.push(format!(
                "{references_wrong} reference counts differ from the maps"
            ));
        }
        if unreferenced > 0 {
            derived.push(format!(
                "{unreferenced} chunks are in use but no block refers to them"
            ));
        }
        if !chunk_pages_damaged && live_chunks != state.chunks.state().live_chunks {
            derived.push(format!(
                "the store counts {} chunks in use, the chunk table holds {live_chunks}",
                state.chunks.state().live_chunks
            ));
        }
        if index_missing > 0 {
            derived.push(format!(
                "{index_missing} indexed chunks are missing from the fingerprint index"
            ));
        }
        if !index_damaged {
            let mut entries = Vec::new();
            let EngineState { pages, chunks, .. } = state;
            chunks
                .index()
                .for_each_entry(pages, |key, value| entries.push((*key, value)))?;
            report.count("index_entries", entries.len() as u64);
            let mut stale = 0u64;
            for (key, value) in entries {
                let valid =
                    value > 0 && value < end && !analysis.damaged_record_ids.contains(&value) && {
                        let record = chunks.record(pages, value)?;
                        record.in_use && record.indexed && IndexKey::of(&record.fingerprint) == key
                    };
                if !valid {
                    stale += 1;
                }
            }
            if stale > 0 {
                derived.push(format!(
                    "{stale} fingerprint index entries point at the wrong chunk"
                ));
            }
        }
        if !derived.is_empty() {
            report.push(Finding::new(
                FindingKind::Derived,
                "block/meta/pages: chunk table, index and container table",
                derived.join("; "),
            ));
        }
        Ok(())
    }

    /// Makes the face usable again after `analysis` (see the module documentation).
    fn repair_locked(
        &self,
        state: &mut EngineState,
        analysis: &Analysis,
        report: &mut FaceReport,
    ) -> Result<()> {
        // Lost blocks first: damaged map pages, then every block whose chunk is unusable.
        let mut newly_lost: BTreeMap<VolumeId, BTreeSet<u64>> = BTreeMap::new();
        for damaged in &analysis.damaged_pages {
            let area = state
                .pages
                .find_area(&damaged.area)
                .expect("a damaged page belongs to an area");
            let page = state.pages.overwrite(area, damaged.page)?;
            if damaged.area.starts_with("volume.") {
                // Every entry of the page: reads of these blocks fail until they are
                // written. Entries past the volume's end are never read.
                for entry in page.chunks_exact_mut(8) {
                    entry.copy_from_slice(&LOST_CHUNK.to_le_bytes());
                }
            }
        }
        for (&volume, blocks) in &analysis.unmapped {
            newly_lost.entry(volume).or_default().extend(blocks);
        }
        for (&volume, blocks) in &analysis.bad_references {
            let map = state.volumes[&volume].map;
            for &(block, _) in blocks {
                set_map_entry(&mut state.pages, &map, block, LOST_CHUNK)?;
                newly_lost.entry(volume).or_default().insert(block);
            }
        }
        let mut counted = analysis.counted.clone();
        for &id in analysis.damaged_chunks.keys() {
            if let Some(count) = counted.get_mut(id as usize) {
                *count = 0;
            }
        }
        let rebuilt = self.rebuild_derived_locked(state, &counted)?;
        // Containers that no longer describe themselves: their live chunks move.
        let damaged: Vec<ContainerId> = analysis.damaged_containers.keys().copied().collect();
        let moved = self.compact_containers(state, &damaged)?;
        self.checkpoint_locked(state)?;
        self.finish_deletions(state)?;
        // A second checkpoint retires the manifest and journals from before the repair, so
        // that a fallback from a damaged newest manifest never returns to the damage.
        self.checkpoint_locked(state)?;

        let lost_total: usize = newly_lost.values().map(BTreeSet::len).sum();
        for finding in &mut report.findings {
            if finding.repair.is_some() {
                continue;
            }
            finding.repair = match finding.kind {
                FindingKind::Damage if !finding.lost.is_empty() => {
                    Some("the blocks named are marked lost; the rest is usable".to_string())
                }
                FindingKind::Damage if finding.object.contains("containers/") => Some(format!(
                    "live chunks copied to a new container ({} chunks moved)",
                    moved
                )),
                FindingKind::Damage if finding.object.contains("page") => {
                    Some("the page was replaced".to_string())
                }
                FindingKind::Damage => Some("rewritten by a checkpoint".to_string()),
                FindingKind::Derived => Some(format!(
                    "rebuilt: {} reference counts set, {} chunks freed, {} container records \
                     and {} index entries written",
                    rebuilt.references_corrected,
                    rebuilt.chunks_freed,
                    rebuilt.containers_corrected,
                    rebuilt.index_entries
                )),
                FindingKind::Leftover => Some("removed".to_string()),
                FindingKind::Lost => None,
            };
        }
        let salvaged: usize = self.salvaged_lost.values().map(BTreeSet::len).sum();
        report.count("blocks_marked_lost", (lost_total + salvaged) as u64);
        Ok(())
    }

    /// Rebuilds every derived table from the chunk records and `counted` (the references the
    /// maps hold, by chunk id), as [`ChunkStore::rebuild`] does. Map entries must refer only
    /// to chunks in use.
    ///
    /// [`ChunkStore::rebuild`]: onecopy_core::chunk_store::ChunkStore::rebuild
    pub(crate) fn rebuild_derived_locked(
        &self,
        state: &mut EngineState,
        counted: &[u32],
    ) -> Result<RebuildReport> {
        Ok(state.chunks.rebuild(&mut state.pages, counted)?)
    }

    /// Copies the live chunks of `containers` to the open container and retires them.
    fn compact_containers(
        &self,
        state: &mut EngineState,
        containers: &[ContainerId],
    ) -> Result<u64> {
        if containers.is_empty() {
            return Ok(0);
        }
        let mut plan = CompactionPlan::default();
        for &id in containers {
            let record = state.chunks.container_record(&mut state.pages, id)?;
            if !record.state.holds_chunks() {
                continue;
            }
            plan.containers.push(PlannedContainer {
                id,
                bytes: record.bytes,
                live_bytes: record.live_bytes,
                live_chunks: record.live_chunks,
            });
        }
        let mut chunk_changes = Vec::new();
        let EngineState { pages, chunks, .. } = &mut *state;
        let moved = gc::execute_compaction(chunks, pages, &plan, &mut chunk_changes)?;
        state
            .changes
            .extend(chunk_changes.into_iter().map(BlockChange::Chunk));
        self.log_changes(state)?;
        self.write_queued()?;
        Ok(moved.chunks_moved)
    }
}

/// Block ranges of `(volume, block)` pairs, by volume.
fn lost_blocks(blocks: &[(VolumeId, u64)], name: &dyn Fn(VolumeId) -> String) -> Vec<String> {
    let mut by_volume: BTreeMap<VolumeId, BTreeSet<u64>> = BTreeMap::new();
    for &(volume, block) in blocks {
        by_volume.entry(volume).or_default().insert(block);
    }
    by_volume
        .iter()
        .flat_map(|(&volume, blocks)| block_ranges(&name(volume), blocks))
        .collect()
}
