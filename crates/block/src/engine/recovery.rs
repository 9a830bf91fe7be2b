//! Opening the block face: the last checkpoint, the journals to replay, crashes told from
//! damage, and what a repair salvages.
//!
//! 1. The page store opens at the newest intact manifest. It names journal generation `a`;
//!    every journal from `a` on is replayed, in order. Normally that is `a` alone. When the
//!    other manifest is newer but fails its checks, journal `a + 1` exists too: either a
//!    checkpoint was interrupted (its manifest is torn, its new journal empty) or the newer
//!    manifest was damaged after it was written, and then the older manifest with journals
//!    `a` and `a + 1` rebuilds exactly the state the damaged one held, because a checkpoint
//!    keeps the journal of the checkpoint before it (see [`CheckpointState`]).
//! 2. Each journal is scanned ([`Journal::scan`]): intact records are replayed; a torn tail
//!    of the last journal is dropped (never acknowledged); damage is refused in
//!    [`OpenMode::ReadWrite`], reported in [`OpenMode::ReadOnly`], and salvaged in
//!    [`OpenMode::Repair`].
//! 3. A replayed record whose new chunk bytes are not in their container is the torn tail if
//!    the journal was not synced after it, and damage (an acknowledged write whose data is
//!    gone) if it was.
//! 4. Salvage: the records after a damaged one are applied without their reference counts
//!    (which the repair rebuilds from the maps), the blocks the damaged record wrote (its
//!    tag) are marked lost unless a later record wrote them again, and the repair then
//!    rebuilds every derived table ([`Engine::check`]).
//!
//! [`CheckpointState`]: super::CheckpointState

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use crate::error::{BlockError, Result};
use onecopy_core::check::{Finding, FindingKind};
use onecopy_core::chunk_store::{ChunkStore, ChunkStoreOptions};
use onecopy_core::container::ContainerOptions;
use onecopy_core::container::ContainerStore;
use onecopy_core::journal::{Journal, JournalEnd, JournalScan, ScannedRecord};
use onecopy_core::pages::{ManifestState, PageStore, PageStoreOptions};
use onecopy_core::storage::{
    is_full, join, remove_reserve, reserve_exists, write_atomically, Storage,
};
use onecopy_core::Error;

use super::{
    apply_change, load_or_create_config, refuse_other_config, set_map_entry, set_volume,
    stored_config, CheckpointState, Engine, EngineCounters, EngineState, VolumeStates, CONFIG_FILE,
    LOST_CHUNK, META_DIRECTORY,
};
use crate::cache::ContentCache;
use crate::changes::{self, BlockChange};
use crate::config::{BlockConfig, RuntimeOptions};
use crate::hints::CopyDetector;
use crate::replicas::Replicas;
use crate::volume::{VolumeId, VOLUME_ID_MAX};
use onecopy_core::storage::space::FreeSpace;

/// How a block face is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// To serve and change it. Crash recovery runs and is made durable by a checkpoint.
    /// Damage that loses acknowledged data (a damaged journal record, a missing journal) is
    /// refused with an error that names it and says to run `onecopy check --repair`; damage
    /// that loses nothing (an older manifest, a newer one with its journals intact) is
    /// recovered from and listed in the open findings.
    ReadWrite,
    /// To look without writing anything, not even recovery: damage is reported in the open
    /// findings and replay stops before it. For checks, and for a repository whose disk is
    /// full. Every change is refused.
    ReadOnly,
    /// To repair: as `ReadWrite`, but damaged journals are salvaged (see the module
    /// documentation) instead of refused.
    Repair,
}

/// Blocks a salvage marked lost, by volume.
type LostBlocks = BTreeMap<VolumeId, BTreeSet<u64>>;

impl Engine {
    /// Opens the block face stored in `storage` in `mode`; see [`OpenMode`]. A new face is
    /// created with `config_for_new` (or the default) unless the mode is read-only.
    pub fn open_with(
        storage: Arc<dyn Storage>,
        config_for_new: Option<BlockConfig>,
        runtime: RuntimeOptions,
        mode: OpenMode,
    ) -> Result<Arc<Engine>> {
        let read_only = mode == OpenMode::ReadOnly;
        // A face without a checkpoint is new, unless it holds data: then its checkpoints are
        // lost, and nothing may be created over what is left.
        let new_face = !has_checkpoint(storage.as_ref())?;
        if new_face {
            refuse_data_without_checkpoint(&storage)?;
            if read_only {
                return Err(Error::NotFound("the block device (never used)".to_string()).into());
            }
        }
        let created_config = if new_face {
            Some(load_or_create_config(
                storage.as_ref(),
                config_for_new.clone(),
            )?)
        } else {
            None
        };
        let options = PageStoreOptions {
            cache_pages: runtime.metadata_cache_pages,
        };
        let (mut pages, saved) = if read_only {
            PageStore::open_read_only(storage.clone(), META_DIRECTORY, options)?
        } else {
            PageStore::open(storage.clone(), META_DIRECTORY, options)?
        };
        let fresh = saved.is_empty();
        let saved: CheckpointState = if fresh {
            CheckpointState {
                next_volume_id: 1,
                ..CheckpointState::default()
            }
        } else {
            let manifest = || format!("block/{}", pages.manifest_name(pages.current_manifest()));
            let state: CheckpointState = serde_json::from_slice(&saved).map_err(|error| {
                Error::corrupt(
                    manifest(),
                    format!("the checkpoint state does not decode: {error}"),
                )
            })?;
            check_volume_ids(&state).map_err(|detail| Error::corrupt(manifest(), detail))?;
            state
        };
        let mut findings = Vec::new();
        let config = match created_config {
            Some(config) => config,
            None => reconcile_config(
                storage.as_ref(),
                saved.config.as_ref(),
                config_for_new.as_ref(),
                read_only,
                &mut findings,
            )?,
        };
        let containers = Arc::new(ContainerStore::with_write_behind(
            storage.clone(),
            "containers",
            config.containers,
        )?);
        let mut chunks = ChunkStore::open(
            &mut pages,
            Arc::clone(&containers),
            saved.chunk_store.clone(),
            ChunkStoreOptions {
                fingerprint: config.fingerprint,
                index: runtime.index.clone(),
            },
        )?;
        let mut volumes = VolumeStates::default();
        for record in &saved.volumes {
            set_volume(&mut pages, &mut volumes, record.clone());
        }

        let generations = journals_to_replay(
            storage.as_ref(),
            &pages,
            &saved,
            fresh,
            mode != OpenMode::ReadWrite,
            &mut findings,
        )?;
        let mut replay = Replay {
            mode,
            pages: &mut pages,
            chunks: &mut chunks,
            volumes: &mut volumes,
            findings: &mut findings,
            salvaging: false,
            lost: LostBlocks::new(),
            stopped: false,
        };
        for (index, &generation) in generations.iter().enumerate() {
            let last = index + 1 == generations.len();
            replay.generation(storage.as_ref(), generation, last, fresh && index == 0)?;
            if replay.stopped {
                break;
            }
        }
        let lost = std::mem::take(&mut replay.lost);
        mark_lost(&mut pages, &volumes, &lost)?;
        if !read_only {
            chunks.close_recovered_container(&mut pages)?;
        }
        // Derived tables found damaged while opening were reset; they are rebuilt now
        // (reported either way), except in a read-only open, which only reports.
        let derived_damage = chunks.take_derived_damage();
        if !derived_damage.is_empty() {
            let rebuilt = if read_only {
                Vec::new()
            } else {
                chunks.rebuild_damaged(&mut pages)?
            };
            for damage in derived_damage {
                let mut finding = Finding::new(
                    FindingKind::Derived,
                    format!("block/meta/pages: {}", damage.object),
                    format!("{}: {} (derived data)", damage.table, damage.detail),
                );
                if !rebuilt.is_empty() {
                    finding = finding.repaired(rebuilt.join("; "));
                }
                findings.push(finding);
            }
        }
        findings.extend(chunks.leftover_containers("block", read_only)?);

        let names: BTreeMap<String, VolumeId> = volumes
            .values()
            .map(|volume| (volume.record.name.clone(), volume.record.id))
            .collect();
        let next_volume_id = volumes
            .keys()
            .map(|&id| id + 1)
            .chain([saved.next_volume_id])
            .max()
            .expect("not empty");
        let next_generation = generations.last().copied().unwrap_or(0) + 1;
        let reserve_held = reserve_exists(storage.as_ref())?;
        let journal = if read_only {
            None
        } else {
            // Recovery continues in a new generation; the checkpoint below names it. On a
            // full disk the reserve makes room for it.
            let create = || {
                Journal::create(
                    storage.clone(),
                    META_DIRECTORY,
                    next_generation,
                    runtime.checkpoint_journal_bytes,
                )
            };
            Some(match create() {
                Err(error) if is_full(&error) && remove_reserve(storage.as_ref())? => {
                    Journal::remove(storage.as_ref(), META_DIRECTORY, next_generation)?;
                    create()?
                }
                other => other?,
            })
        };
        let write_behind = Arc::clone(
            containers
                .write_behind()
                .expect("the block device's containers are written behind"),
        );
        let content_cache = ContentCache::new(
            runtime.content_cache_bytes,
            &runtime.content_cache_policy,
            config.fingerprint,
        )?;
        // Duplicates are derived and never trusted across runs: whatever scratch files a
        // previous run left are removed.
        if !read_only {
            Replicas::remove_leftovers(storage.as_ref())?;
        }
        let replicas = Replicas::new(
            runtime.replicas.clone(),
            config.containers.container_bytes,
            content_cache.key_algorithm(),
        );
        let engine = Arc::new(Engine {
            write_behind,
            content_cache,
            replicas,
            storage,
            config,
            runtime,
            mode,
            open_findings: findings,
            salvaged_lost: lost,
            state: Mutex::new(EngineState {
                pages,
                journal,
                chunks,
                volumes,
                names,
                next_volume_id,
                previous_generation: saved.journal_generation,
                counters: EngineCounters::default(),
                copies: CopyDetector::default(),
                chunk_changes: Vec::new(),
                changes: Vec::new(),
                payload: Vec::new(),
                failure: None,
                space: FreeSpace::new(super::space::TUNING, reserve_held),
            }),
            opened: Instant::now(),
            last_request_ms: AtomicU64::new(0),
        });
        {
            let mut state = engine.state.lock();
            if mode == OpenMode::ReadWrite {
                // Make recovery durable before serving anything. A repair checkpoints only
                // once it has rebuilt what salvage left inconsistent ([`Engine::check`]).
                engine.with_reserve(&mut state, |engine, state| engine.checkpoint_locked(state))?;
                engine.finish_deletions(&mut state)?;
            }
            // A storage that cannot tell its free space gets no reserve; otherwise, best
            // effort: without room the engine runs without one until there is.
            if mode != OpenMode::ReadOnly {
                state.space.take_reserve(engine.storage().as_ref())?;
            }
            let ids: Vec<VolumeId> = state.volumes.keys().copied().collect();
            for id in ids {
                engine.derive_filesystem_map(&mut state, id);
            }
        }
        onecopy_core::memory::return_freed_heap();
        Ok(engine)
    }

    /// What opening found (see [`OpenMode`]): damage and leftovers of manifests, journals
    /// and containers, and what a repair salvaged and lost.
    pub fn open_findings(&self) -> &[Finding] {
        &self.open_findings
    }
}

/// True when a manifest file holds anything: the face has been checkpointed at least once
/// (creation writes an empty manifest before anything else).
fn has_checkpoint(storage: &dyn Storage) -> Result<bool> {
    for name in ["manifest.0", "manifest.1"] {
        let name = join(META_DIRECTORY, name);
        if storage.exists(&name)? && storage.open(&name, false)?.len()? > 0 {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Refuses to open a face without a checkpoint that holds data: its manifests are lost, and
/// opening it as a new face would hand out its container ids again and remove its containers
/// as leftovers.
fn refuse_data_without_checkpoint(storage: &Arc<dyn Storage>) -> Result<()> {
    let mut held = Vec::new();
    let pages = join(META_DIRECTORY, "pages");
    if storage.exists(&pages)? && storage.open(&pages, false)?.len()? > 0 {
        held.push("metadata pages");
    }
    if !Journal::generations(storage.as_ref(), META_DIRECTORY)?.is_empty() {
        held.push("journals");
    }
    let containers = ContainerStore::new(
        Arc::clone(storage),
        "containers",
        ContainerOptions::default(),
    )?;
    if !containers.list()?.is_empty() {
        held.push("containers");
    }
    if held.is_empty() {
        return Ok(());
    }
    Err(Error::corrupt(
        format!("block/{META_DIRECTORY}/manifest.0 and block/{META_DIRECTORY}/manifest.1"),
        format!(
            "both manifests are missing or empty, but the block device holds {}: which chunks \
             the volumes' blocks use is recorded only in the checkpoints, so the block device \
             can be neither opened nor rebuilt, and nothing was changed; restore block/meta \
             from a backup of the repository (the chunk data in block/containers is untouched)",
            held.join(", ")
        ),
    )
    .into())
}

/// Checks the volume ids a checkpoint names: every volume's id is below the next id, which is
/// at least 1 and at most one past [`VOLUME_ID_MAX`]. Damaged ids would otherwise give a new
/// volume the id of an existing one, or one the chunk owner tags cannot hold.
fn check_volume_ids(state: &CheckpointState) -> std::result::Result<(), String> {
    let next = state.next_volume_id;
    if next == 0 || next > VOLUME_ID_MAX + 1 {
        return Err(format!(
            "the next volume id {next} is outside 1..={}",
            VOLUME_ID_MAX + 1
        ));
    }
    match state.volumes.iter().find(|volume| volume.id >= next) {
        Some(volume) => Err(format!(
            "volume {} has id {}, not below the next volume id {next}",
            volume.name, volume.id
        )),
        None => Ok(()),
    }
}

/// The configuration of an existing face: `config.json`, checked against the copy the
/// checkpoint keeps, which wins (the manifest's checksum covers it; the file has none). A
/// damaged, missing or different file is reported and, unless read-only, rewritten.
fn reconcile_config(
    storage: &dyn Storage,
    saved: Option<&BlockConfig>,
    wanted: Option<&BlockConfig>,
    read_only: bool,
    findings: &mut Vec<Finding>,
) -> Result<BlockConfig> {
    let stored = stored_config(storage);
    let Some(saved) = saved else {
        // A checkpoint written before the copy was kept: the file is all there is.
        let config = stored?.ok_or_else(|| {
            Error::corrupt(
                format!("block/{CONFIG_FILE}"),
                "the file is missing, and the checkpoint keeps no copy of it",
            )
        })?;
        refuse_other_config(&config, wanted)?;
        return Ok(config);
    };
    refuse_other_config(saved, wanted)?;
    let problem = match stored {
        Ok(Some(stored)) if stored == *saved => return Ok(saved.clone()),
        Ok(Some(_)) => "it differs from the copy the checkpoint keeps".to_string(),
        Ok(None) => "the file is missing".to_string(),
        Err(BlockError::Core(Error::Corrupt { detail, .. })) => {
            format!("it does not decode ({detail})")
        }
        Err(error) => return Err(error),
    };
    let mut finding = Finding::new(
        FindingKind::Damage,
        format!("block/{CONFIG_FILE}"),
        format!("{problem}; the copy the checkpoint keeps is used, so nothing is lost"),
    );
    if !read_only {
        let bytes = serde_json::to_vec_pretty(saved).expect("config serialises");
        write_atomically(storage, CONFIG_FILE, &bytes)?;
        finding = finding.repaired("rewritten from the copy the checkpoint keeps");
    }
    findings.push(finding);
    Ok(saved.clone())
}

/// The journal generations to replay after the checkpoint `saved`, in order, and findings
/// about the manifests and stray journals. With `check_previous`, the journal a fallback to
/// the older manifest would replay is checked too: its damage loses nothing now, but it would
/// make a damaged newest manifest lossy.
fn journals_to_replay(
    storage: &dyn Storage,
    pages: &PageStore,
    saved: &CheckpointState,
    fresh: bool,
    check_previous: bool,
    findings: &mut Vec<Finding>,
) -> Result<Vec<u64>> {
    let present = Journal::generations(storage, META_DIRECTORY)?;
    let current = saved.journal_generation;
    let generations: Vec<u64> = std::iter::once(current)
        .chain(
            present
                .iter()
                .copied()
                .filter(|&generation| generation > current),
        )
        .collect();
    for &generation in &present {
        if generation < saved.previous_journal_generation.min(current) {
            findings.push(Finding::new(
                FindingKind::Leftover,
                format!("block/{}", Journal::file_name(META_DIRECTORY, generation)),
                "a journal no checkpoint needs (removed by the next checkpoint)",
            ));
        }
    }
    let other = 1 - pages.current_manifest();
    if let ManifestState::Invalid { detail } = &pages.manifest_states()[other] {
        let name = format!("block/{}", pages.manifest_name(other));
        let current_name = format!("block/{}", pages.manifest_name(pages.current_manifest()));
        if generations.len() > 1 {
            // The other manifest was the newer one, torn by a crash during its checkpoint or
            // damaged after it. A checkpoint removes the journals before the one its
            // predecessor named only once it is durable, so a missing previous journal (or
            // records in the newer journals, appended only after a checkpoint completes)
            // means that manifest had been durable.
            let newer_written = !fresh && !present.contains(&saved.previous_journal_generation);
            let newer_has_records =
                generations[1..]
                    .iter()
                    .try_fold(false, |found, &generation| {
                        Journal::scan(storage, META_DIRECTORY, generation).map(|scan| {
                            found || !scan.records.is_empty() || !scan.damage.is_empty()
                        })
                    })?;
            if newer_written || newer_has_records {
                findings.push(Finding::new(
                    FindingKind::Damage,
                    name,
                    format!(
                        "the newest manifest is damaged ({detail}); the state it held was \
                         rebuilt from {current_name} and journals {} to {}",
                        generations[0],
                        generations[generations.len() - 1]
                    ),
                ));
            }
        } else {
            findings.push(Finding::new(
                FindingKind::Damage,
                name,
                format!(
                    "the older manifest is damaged ({detail}); nothing is lost, but a \
                     damaged {current_name} could not fall back to it until the next \
                     checkpoint rewrites it"
                ),
            ));
        }
    }
    let previous = saved.previous_journal_generation;
    // Journal generations start at 1; 0 is a face that has no previous checkpoint yet.
    if check_previous && !fresh && generations.len() == 1 && previous != 0 && previous < current {
        if let Some(finding) = previous_journal_finding(storage, previous)? {
            findings.push(finding);
        }
    }
    Ok(generations)
}

/// Damage to journal `generation`, the one a fallback to the older manifest replays: it was
/// synced whole before the newest checkpoint, so anything but intact records is damage.
fn previous_journal_finding(storage: &dyn Storage, generation: u64) -> Result<Option<Finding>> {
    let name = format!("block/{}", Journal::file_name(META_DIRECTORY, generation));
    let consequence = "nothing is lost, but a damaged newest manifest could not fall back to \
                       the older one without loss until the next checkpoint makes this journal \
                       unnecessary";
    let scan = match Journal::scan(storage, META_DIRECTORY, generation) {
        Ok(scan) => scan,
        Err(Error::NotFound(_)) => {
            return Ok(Some(Finding::new(
                FindingKind::Damage,
                name,
                format!("the journal the older manifest names is missing; {consequence}"),
            )))
        }
        Err(error) => return Err(error.into()),
    };
    let (object, problem) = if let Some(damage) = scan.damage.first() {
        (
            format!("{name} at byte {}", damage.offset),
            format!(
                "{} (bytes {}..{})",
                damage.detail, damage.offset, damage.end
            ),
        )
    } else if let JournalEnd::Torn { offset, bytes } = scan.end {
        (
            format!("{name} at byte {offset}"),
            format!("{bytes} bytes at offset {offset} fail their checks"),
        )
    } else if scan.header_damaged {
        (name, "the file header (bytes 0..64) is damaged".to_string())
    } else {
        return Ok(None);
    };
    Ok(Some(Finding::new(
        FindingKind::Damage,
        object,
        format!("{problem}; {consequence}"),
    )))
}

/// Replays journals into the tables; see the module documentation.
struct Replay<'a> {
    mode: OpenMode,
    pages: &'a mut PageStore,
    chunks: &'a mut ChunkStore,
    volumes: &'a mut VolumeStates,
    findings: &'a mut Vec<Finding>,
    /// Past damage in repair mode: records are applied without reference counts.
    salvaging: bool,
    /// Blocks of damaged records, minus those written again by later records.
    lost: LostBlocks,
    /// Replay ended before the last journal (damage in read-only or read-write mode, or a
    /// torn tail).
    stopped: bool,
}

impl Replay<'_> {
    /// Records a finding of damage that loses acknowledged data; a read-write open refuses
    /// it instead, with an error naming it.
    fn lossy(&mut self, finding: Finding) -> Result<()> {
        if self.mode == OpenMode::ReadWrite {
            return Err(Error::corrupt(
                finding.object,
                format!(
                    "{}; the block device does not serve older data as if it were current, \
                     and `onecopy check --repair` recovers what can be recovered",
                    finding.detail
                ),
            )
            .into());
        }
        self.findings.push(finding);
        Ok(())
    }

    fn generation(
        &mut self,
        storage: &dyn Storage,
        generation: u64,
        last: bool,
        may_be_missing: bool,
    ) -> Result<()> {
        let name = format!("block/{}", Journal::file_name(META_DIRECTORY, generation));
        let scan = match Journal::scan(storage, META_DIRECTORY, generation) {
            Ok(scan) => scan,
            Err(Error::NotFound(_)) if may_be_missing => return Ok(()),
            Err(Error::NotFound(_)) => {
                let mut finding = Finding::new(
                    FindingKind::Damage,
                    name,
                    "the journal is missing: the writes acknowledged since the last \
                     checkpoint are lost, and which blocks they wrote is unknown",
                )
                .with_lost(["writes since the last checkpoint (blocks unknown)".to_string()]);
                if self.mode == OpenMode::Repair {
                    finding =
                        finding.repaired("the block device continues from the last checkpoint");
                }
                self.stopped = true;
                return self.lossy(finding);
            }
            Err(error) => return Err(error.into()),
        };
        if scan.header_damaged {
            let mut finding = Finding::new(
                FindingKind::Damage,
                name.clone(),
                "the journal's file header (bytes 0..64) is damaged; its records were read \
                 without it",
            );
            if self.mode != OpenMode::ReadOnly {
                finding = finding.repaired("a new journal replaces it at the next checkpoint");
            }
            self.findings.push(finding);
        }
        let durable_end = scan
            .records
            .iter()
            .map(|record| record.synced_end)
            .max()
            .unwrap_or(0);
        // The journals before the last were complete and synced when the next began.
        let proven = |record: &ScannedRecord| !last || record.offset < durable_end;
        let prefix: Vec<ScannedRecord> = scan.records[..scan.prefix].to_vec();
        let mut torn_at = None;
        scan.for_each_payload(&prefix, |record, payload| {
            if torn_at.is_some() || self.stopped {
                return Ok(());
            }
            let changes = changes::decode(payload).map_err(|error| {
                Error::corrupt(
                    format!("{name} at byte {}", record.offset),
                    error.to_string(),
                )
            })?;
            if self.data_is_durable(&changes)? {
                return self.apply(&changes);
            }
            if proven(record) {
                self.missing_data(&name, record)
            } else {
                torn_at = Some(record.offset);
                Ok(())
            }
        })?;
        if self.stopped {
            return Ok(());
        }
        let torn = torn_at.or(match scan.end {
            JournalEnd::Torn { offset, .. } => Some(offset),
            JournalEnd::Clean => None,
        });
        if let Some(offset) = torn.filter(|_| !last) {
            self.stopped = true;
            return self.lossy(
                Finding::new(
                    FindingKind::Damage,
                    format!("{name} at byte {offset}"),
                    "the journal ends early although a later checkpoint synced it whole (a \
                     torn record, or one whose chunk bytes are not in their container)",
                )
                .with_lost(["the writes after it (blocks unknown)".to_string()]),
            );
        }
        if torn_at.is_some() {
            self.stopped = true;
            return Ok(());
        }
        if scan.damage.is_empty() {
            return Ok(());
        }
        self.damaged(&name, &scan)
    }

    /// Handles the damage of `scan`: a finding per damaged region, and in repair mode the
    /// records after it applied by salvage.
    fn damaged(&mut self, name: &str, scan: &JournalScan) -> Result<()> {
        let mut lost_by_damage = Vec::new();
        for damage in &scan.damage {
            let blocks = damage.tag.as_ref().and_then(changes::tag_blocks);
            let mut lost = match &blocks {
                Some((volume, range)) => vec![format!(
                    "{} blocks {}-{}",
                    self.volume_label(*volume),
                    range.start,
                    range.end - 1
                )],
                None if damage.tag.is_some() => Vec::new(),
                None if damage.cut => vec![format!(
                    "the writes held from byte {} of {name} on (blocks unknown)",
                    damage.offset
                )],
                None => vec![format!(
                    "the writes held in bytes {}..{} of {name} (blocks unknown)",
                    damage.offset, damage.end
                )],
            };
            if damage.cut && damage.tag.is_some() {
                // The file ends inside this record: records after it, if there were any,
                // are gone without a trace.
                lost.push(format!(
                    "the writes after byte {} of {name}, if there were any (blocks unknown)",
                    damage.offset
                ));
            }
            let mut finding = Finding::new(
                FindingKind::Damage,
                format!("{name} at byte {}", damage.offset),
                format!(
                    "{} (bytes {}..{})",
                    damage.detail, damage.offset, damage.end
                ),
            )
            .with_lost(lost);
            if self.mode == OpenMode::Repair {
                finding = finding.repaired(
                    "the intact records after it were applied and the blocks it wrote marked \
                     lost",
                );
            }
            lost_by_damage.push((damage.end, blocks));
            self.lossy(finding)?;
        }
        if self.mode != OpenMode::Repair {
            self.stopped = true;
            return Ok(());
        }
        self.salvaging = true;
        // Each damaged record's blocks are lost unless a record after it wrote them again.
        let later: Vec<ScannedRecord> = scan.records[scan.prefix..].to_vec();
        let mut pending = lost_by_damage.into_iter().peekable();
        scan.for_each_payload(&later, |record, payload| {
            while let Some((_, blocks)) = pending.next_if(|(end, _)| *end <= record.offset) {
                if let Some((volume, range)) = blocks {
                    self.lost.entry(volume).or_default().extend(range);
                }
            }
            let changes = changes::decode(payload)?;
            if self.data_is_durable(&changes)? {
                self.apply(&changes)
            } else {
                self.missing_data(name, record)
            }
        })?;
        for (_, blocks) in pending {
            if let Some((volume, range)) = blocks {
                self.lost.entry(volume).or_default().extend(range);
            }
        }
        Ok(())
    }

    fn missing_data(&mut self, name: &str, record: &ScannedRecord) -> Result<()> {
        let lost = match changes::tag_blocks(&record.tag) {
            Some((volume, range)) => {
                if self.mode == OpenMode::Repair {
                    self.lost.entry(volume).or_default().extend(range.clone());
                }
                vec![format!(
                    "{} blocks {}-{}",
                    self.volume_label(volume),
                    range.start,
                    range.end - 1
                )]
            }
            None => Vec::new(),
        };
        let mut finding = Finding::new(
            FindingKind::Damage,
            format!("{name} at byte {}", record.offset),
            "an acknowledged write refers to chunk bytes that are missing or damaged in their \
             container",
        )
        .with_lost(lost);
        if self.mode == OpenMode::Repair {
            finding = finding.repaired("the blocks it wrote are marked lost");
            self.salvaging = true;
        } else {
            self.stopped = true;
        }
        self.lossy(finding)
    }

    fn data_is_durable(&self, changes: &[BlockChange]) -> Result<bool> {
        for change in changes {
            if let BlockChange::Chunk(chunk_change) = change {
                if !self.chunks.stored_data_is_durable(chunk_change)? {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    fn apply(&mut self, changes: &[BlockChange]) -> Result<()> {
        if !self.salvaging {
            for change in changes {
                apply_change(self.pages, self.chunks, self.volumes, change)?;
            }
            return Ok(());
        }
        for change in changes {
            match change {
                BlockChange::Chunk(chunk_change) => {
                    self.chunks.salvage_apply(self.pages, chunk_change)?
                }
                BlockChange::Map {
                    volume,
                    block,
                    chunk,
                } => {
                    let Some(state) = self.volumes.get(volume) else {
                        continue;
                    };
                    if *block >= state.record.block_count() {
                        continue;
                    }
                    set_map_entry(self.pages, &state.map, *block, *chunk)?;
                    if let Some(blocks) = self.lost.get_mut(volume) {
                        blocks.remove(block);
                    }
                }
                BlockChange::VolumeSet(_) | BlockChange::VolumeRemoved(_) => {
                    apply_change(self.pages, self.chunks, self.volumes, change)?
                }
            }
        }
        Ok(())
    }

    fn volume_label(&self, volume: VolumeId) -> String {
        match self.volumes.get(&volume) {
            Some(state) => format!("volume {}", state.record.name),
            None => format!("volume id {volume}"),
        }
    }
}

/// Points the map entries of lost blocks at [`LOST_CHUNK`]; the reference counts of the
/// chunks they named are rebuilt by the repair.
fn mark_lost(pages: &mut PageStore, volumes: &VolumeStates, lost: &LostBlocks) -> Result<()> {
    for (volume, blocks) in lost {
        let Some(state) = volumes.get(volume) else {
            continue;
        };
        for &block in blocks {
            if block < state.record.block_count() {
                set_map_entry(pages, &state.map, block, LOST_CHUNK)?;
            }
        }
    }
    Ok(())
}

/// Runs of consecutive blocks, as "volume NAME blocks A-B".
pub(crate) fn block_ranges<'a>(
    volume: &str,
    blocks: impl IntoIterator<Item = &'a u64>,
) -> Vec<String> {
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for &block in blocks {
        match ranges.last_mut() {
            Some((_, end)) if *end + 1 == block => *end = block,
            _ => ranges.push((block, block)),
        }
    }
    ranges
        .into_iter()
        .map(|(start, end)| format!("volume {volume} blocks {start}-{end}"))
        .collect()
}
