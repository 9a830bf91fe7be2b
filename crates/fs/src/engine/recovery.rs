//! Opening the face: the last checkpoint, then the journals after it; crashes told from
//! damage, and what a repair salvages.
//!
//! 1. The page store opens at its newest intact manifest; its user state holds the
//!    [`CheckpointState`] and the namespace of every file system. A newest manifest that
//!    fails its checks falls back to the older one, whose journals a checkpoint keeps.
//! 2. Each journal generation from the checkpoint's on is scanned; its intact records are
//!    replayed through the live path's `apply`, in order. A record storing a chunk whose
//!    container bytes did not reach the media ends the replay when the journal was not
//!    synced past it (a torn tail: never acknowledged, since fsync syncs containers before
//!    the journal), and is damage when it was.
//! 3. Damage (durable journal bytes that fail their checks, a journal cut short or missing,
//!    an acknowledged record whose chunk bytes are gone) is refused in
//!    [`OpenMode::ReadWrite`] with an error naming it, reported in [`OpenMode::ReadOnly`]
//!    (replay stops before it), and salvaged in [`OpenMode::Repair`] ([`super::salvage`]).
//! 4. Containers at or past the recovered next container id hold only writes that were
//!    never acknowledged (their journal records did not survive): they are removed, since
//!    their ids are about to be handed out again.
//! 5. A repair marks lost what the damage took, repairs the namespace and rebuilds the chunk
//!    store's derived tables from the extent maps ([`super::repair`]).
//! 6. Inodes without links and without open handles (unlinked while open at the crash) are
//!    removed, their chunks released; deletions and truncations a crash interrupted are
//!    finished.
//! 7. A writable open continues in a new journal generation and checkpoints at once (a
//!    repair twice, so that no fallback leads back into the damage it repaired).

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Instant;

use onecopy_core::bytes::ByteReader;
use onecopy_core::check::{Finding, FindingKind};
use onecopy_core::chunk_store::{ChunkStore, ChunkStoreOptions};
use onecopy_core::container::ContainerStore;
use onecopy_core::index::FingerprintIndex;
use onecopy_core::journal::{Journal, JournalEnd, JournalScan, ScannedRecord};
use onecopy_core::pages::{ManifestState, PageStore, PageStoreOptions};
use onecopy_core::storage::{read_all, remove_reserve, reserve_exists, write_atomically, Storage};
use parking_lot::Mutex;

use super::salvage::{describe, Salvage};
use super::space::SpaceGuard;
use super::{
    apply, CheckpointState, ChunkCache, FaceConfig, FileSystem, FsEngine, RuntimeOptions, State,
    CONFIG_FILE, META_DIRECTORY,
};
use crate::changes::{self, FileSystemRecord, FsChange, FsId};
use crate::error::{FsError, Result};
use crate::node::{put_inode, put_u32, put_u64, take_bytes, take_inode, Ino};
use crate::summary::RecordSummary;
use onecopy_core::storage::is_full;

/// How to open the face.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// Recover and serve. Damage that loses acknowledged data (a damaged journal record, a
    /// missing journal) is refused with an error that names it and says to run `onecopy
    /// check --repair`.
    ReadWrite,
    /// Look without writing anything, not even recovery (checks; `mount -o ro` too): damage
    /// is reported in the open findings and replay stops before it.
    ReadOnly,
    /// Repair (`onecopy check --repair`): as `ReadWrite`, but damaged journals are salvaged,
    /// what they lost is marked lost, the namespace is repaired and every derived table
    /// rebuilt.
    Repair,
}

/// Encodes the user state of a checkpoint: JSON length u32 | CheckpointState JSON | file
/// system count u32 | per file system: record JSON (length u32, bytes), inode count u64,
/// per inode its number u64 and encoding.
pub(crate) fn encode_checkpoint(
    saved: &CheckpointState,
    systems: &BTreeMap<FsId, FileSystem>,
) -> Vec<u8> {
    let mut out = Vec::new();
    let json = serde_json::to_vec(saved).expect("checkpoint state serialises");
    crate::node::put_bytes(&mut out, &json);
    put_u32(&mut out, systems.len() as u32);
    for system in systems.values() {
        let record = serde_json::to_vec(&system.record).expect("records serialise");
        crate::node::put_bytes(&mut out, &record);
        put_u64(&mut out, system.inodes.len() as u64);
        let mut inos: Vec<&Ino> = system.inodes.keys().collect();
        inos.sort_unstable();
        for ino in inos {
            put_u64(&mut out, *ino);
            put_inode(&mut out, &system.inodes[ino]);
        }
    }
    out
}

fn decode_checkpoint(
    bytes: &[u8],
    what: &str,
) -> Result<(CheckpointState, BTreeMap<FsId, FileSystem>)> {
    let malformed = |detail: &str| {
        FsError::Core(onecopy_core::Error::corrupt(
            what.to_string(),
            format!("the checkpoint state does not decode: {detail}"),
        ))
    };
    let mut reader = ByteReader::new(bytes);
    let json = take_bytes(&mut reader).ok_or_else(|| malformed("truncated state"))?;
    let saved: CheckpointState =
        serde_json::from_slice(&json).map_err(|error| malformed(&error.to_string()))?;
    let mut systems = BTreeMap::new();
    let count = reader.u32().ok_or_else(|| malformed("truncated"))?;
    for _ in 0..count {
        let json = take_bytes(&mut reader).ok_or_else(|| malformed("truncated record"))?;
        let record: FileSystemRecord =
            serde_json::from_slice(&json).map_err(|error| malformed(&error.to_string()))?;
        let mut system = FileSystem::new(record);
        let inodes = reader.u64().ok_or_else(|| malformed("truncated"))?;
        for _ in 0..inodes {
            let ino = reader.u64().ok_or_else(|| malformed("truncated inode"))?;
            let inode = take_inode(&mut reader).ok_or_else(|| malformed("bad inode"))?;
            system.set_inode(ino, inode);
        }
        systems.insert(system.record.id, system);
    }
    Ok((saved, systems))
}

/// The configuration the face in `storage` was created with, if it exists yet.
pub fn stored_config(storage: &dyn Storage) -> Result<Option<FaceConfig>> {
    if !storage.exists(CONFIG_FILE)? {
        return Ok(None);
    }
    let config = serde_json::from_slice(&read_all(storage, CONFIG_FILE)?).map_err(|error| {
        FsError::Core(onecopy_core::Error::corrupt(
            "fs/config.json",
            error.to_string(),
        ))
    })?;
    Ok(Some(config))
}

impl FsEngine {
    /// Opens the face stored in `storage` (created with the default configuration if new)
    /// in `mode`; see [`OpenMode`] and the module documentation.
    pub fn open(
        storage: Arc<dyn Storage>,
        runtime: RuntimeOptions,
        mode: OpenMode,
    ) -> Result<Arc<FsEngine>> {
        let read_only = mode == OpenMode::ReadOnly;
        let config = match stored_config(storage.as_ref())? {
            Some(config) => config,
            None if read_only => {
                return Err(FsError::Core(onecopy_core::Error::NotFound(
                    "the file system face (never used)".to_string(),
                )))
            }
            None => {
                let config = FaceConfig::default();
                let bytes = serde_json::to_vec_pretty(&config).expect("config serialises");
                write_atomically(storage.as_ref(), CONFIG_FILE, &bytes)?;
                config
            }
        };
        let options = PageStoreOptions {
            cache_pages: runtime.metadata_cache_pages,
        };
        let (mut pages, saved_bytes) = if read_only {
            PageStore::open_read_only(storage.clone(), META_DIRECTORY, options)?
        } else {
            PageStore::open(storage.clone(), META_DIRECTORY, options)?
        };
        let fresh = saved_bytes.is_empty();
        let present = Journal::generations(storage.as_ref(), META_DIRECTORY)?;
        if fresh && !present.is_empty() {
            return Err(FsError::Core(onecopy_core::Error::corrupt(
                format!("{}/meta", storage.describe()),
                "journals exist but no checkpoint does (both manifests are lost); nothing was \
                 changed: restore fs/meta from a copy of the repository",
            )));
        }
        let (saved, mut systems) = if fresh {
            (
                CheckpointState {
                    next_fs_id: 1,
                    config: config.clone(),
                    ..CheckpointState::default()
                },
                BTreeMap::new(),
            )
        } else {
            let what = format!("fs/{}", pages.manifest_name(pages.current_manifest()));
            decode_checkpoint(&saved_bytes, &what)?
        };
        let containers = Arc::new(ContainerStore::new(
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
        let mut findings = manifest_findings(&pages, &present, &saved, fresh);
        // The piece index is derived data (a missing entry costs a missed deduplication,
        // never data): damage empties it, and the pieces of big chunks stored from now on
        // fill it again.
        let (mut pieces, piece_damage) =
            FingerprintIndex::open_or_reset(&mut pages, "pieces", runtime.piece_index.clone())?;
        if let Some(error) = piece_damage {
            findings.push(
                Finding::new(
                    FindingKind::Derived,
                    "fs/meta: piece index",
                    format!("damaged: {error}"),
                )
                .repaired("emptied; the pieces of big chunks stored from now on fill it"),
            );
        }
        // The journal the checkpoint names, and every later one.
        let generations: Vec<u64> = if fresh {
            Vec::new()
        } else {
            std::iter::once(saved.journal_generation)
                .chain(
                    present
                        .iter()
                        .copied()
                        .filter(|&generation| generation > saved.journal_generation),
                )
                .collect()
        };
        let mut replay = Replay {
            mode,
            pages: &mut pages,
            chunks: &mut chunks,
            pieces: &mut pieces,
            systems: &mut systems,
            findings: &mut findings,
            salvage: None,
            stopped: false,
        };
        let last_written = replay.last_written(storage.as_ref(), &generations)?;
        for &generation in &generations {
            replay.generation(storage.as_ref(), generation, generation >= last_written)?;
            if replay.stopped {
                break;
            }
        }
        let salvage = replay.salvage.take();
        if !read_only {
            chunks.close_recovered_container(&mut pages)?;
        }
        // Derived tables found damaged while opening were reset; they are rebuilt now
        // (reported either way), except in a read-only open, which only reports.
        let derived_damage = chunks.take_derived_damage();
        if !derived_damage.is_empty() {
            let rebuilt = if read_only || mode == OpenMode::Repair {
                Vec::new()
            } else {
                chunks.rebuild_damaged(&mut pages)?
            };
            for damage in derived_damage {
                let mut finding = Finding::new(
                    FindingKind::Derived,
                    format!("fs/meta/pages: {}", damage.object),
                    format!("{}: {} (derived data)", damage.table, damage.detail),
                );
                if !rebuilt.is_empty() {
                    finding = finding.repaired(rebuilt.join("; "));
                } else if mode == OpenMode::Repair {
                    finding = finding.repaired("rebuilt from the chunk records and extent maps");
                }
                findings.push(finding);
            }
        }
        findings.extend(chunks.leftover_containers("fs", read_only)?);
        let salvaged_files = if mode == OpenMode::Repair {
            super::repair::repair_opened(
                &mut pages,
                &mut chunks,
                &mut systems,
                salvage.unwrap_or_default(),
                &mut findings,
            )?
        } else {
            Default::default()
        };
        let stamp_next = systems
            .values()
            .flat_map(|system| system.inodes.values().map(|inode| inode.monitor.stamp))
            .chain([saved.stamp_next])
            .max()
            .unwrap_or(0);
        let next_fs_id = systems
            .keys()
            .map(|&id| id + 1)
            .chain([saved.next_fs_id, 1])
            .max()
            .expect("not empty");
        let mut reserve_held = reserve_exists(storage.as_ref())?;
        let journal = if read_only {
            None
        } else {
            // Recovery continues in a new generation; the checkpoint below names it. On a
            // full disk the reserve makes room for it.
            let last_generation = present.last().copied().unwrap_or(0);
            let next_generation = last_generation.max(saved.journal_generation) + 1;
            let create = || {
                Journal::create(
                    storage.clone(),
                    META_DIRECTORY,
                    next_generation,
                    runtime.checkpoint_journal_bytes,
                )
            };
            Some(match create() {
                Err(error) if is_full(&error) && reserve_held => {
                    remove_reserve(storage.as_ref())?;
                    reserve_held = false;
                    Journal::remove(storage.as_ref(), META_DIRECTORY, next_generation)?;
                    create()?
                }
                other => other?,
            })
        };
        let engine = Arc::new(FsEngine {
            storage,
            config,
            mode,
            cache: Arc::new(Mutex::new(ChunkCache {
                limit: runtime.chunk_cache_entries,
                ..ChunkCache::default()
            })),
            runtime,
            state: Mutex::new(State {
                pages,
                journal,
                chunks,
                pieces,
                systems,
                next_fs_id,
                stamp_next,
                changes: Vec::new(),
                summary: Default::default(),
                chunk_changes: Vec::new(),
                payload: Vec::new(),
                previous_generation: saved.journal_generation,
                failure: None,
                space: SpaceGuard::new(reserve_held),
            }),
            opened: Instant::now(),
            last_request_ms: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            findings,
            salvaged_files,
        });
        if mode == OpenMode::Repair {
            // The repaired state first: it was made in memory only.
            let mut state = engine.state.lock();
            engine.with_reserve(&mut state, |engine, state| engine.checkpoint_locked(state))?;
        }
        if !read_only {
            engine.finish_deletions()?;
            engine.trim_past_end()?;
            engine.remove_orphans()?;
            let mut state = engine.state.lock();
            engine.with_reserve(&mut state, |engine, state| engine.checkpoint_locked(state))?;
            engine.hold_reserve(&mut state)?;
        }
        Ok(engine)
    }

    /// Finishes the deletions of file systems a crash interrupted.
    fn finish_deletions(&self) -> Result<()> {
        let deleting: Vec<FsId> = {
            let state = self.state.lock();
            state
                .systems
                .values()
                .filter(|system| system.record.deleting)
                .map(|system| system.record.id)
                .collect()
        };
        for fs in deleting {
            self.delete_file_system(fs)?;
        }
        Ok(())
    }

    /// Removes extents past the end of files (left by a truncation a crash interrupted), so
    /// that a later extension reads zeros there.
    fn trim_past_end(&self) -> Result<()> {
        let trims: Vec<(FsId, Ino, u64)> = {
            let state = self.state.lock();
            state
                .systems
                .values()
                .flat_map(|system| {
                    system.inodes.iter().filter_map(move |(&ino, inode)| {
                        let size = inode.attributes.size;
                        let past = inode
                            .extents
                            .iter()
                            .next_back()
                            .is_some_and(|(offset, extent)| offset + extent.length as u64 > size);
                        past.then_some((system.record.id, ino, size))
                    })
                })
                .collect()
        };
        for (fs, ino, size) in trims {
            self.mutate(|state| super::data::punch(state, fs, ino, size, u64::MAX))?;
        }
        Ok(())
    }

    /// Removes inodes without links (unlinked while open when the last run ended).
    fn remove_orphans(&self) -> Result<()> {
        let orphans: Vec<(FsId, Ino)> = {
            let state = self.state.lock();
            state
                .systems
                .values()
                .flat_map(|system| {
                    system
                        .inodes
                        .iter()
                        .filter(|(_, inode)| inode.attributes.nlink == 0)
                        .map(|(&ino, _)| (system.record.id, ino))
                })
                .collect()
        };
        for (fs, ino) in orphans {
            self.mutate(|state| super::namespace::drop_inode(state, fs, ino))?;
        }
        Ok(())
    }
}

/// Findings about the manifests: a damaged newest one (the state was rebuilt from the older
/// one and the journals a checkpoint keeps for this, so nothing is lost), a damaged older one
/// (the fallback is gone until the next checkpoint).
fn manifest_findings(
    pages: &PageStore,
    present: &[u64],
    saved: &CheckpointState,
    fresh: bool,
) -> Vec<Finding> {
    let mut findings = Vec::new();
    let other = 1 - pages.current_manifest();
    let ManifestState::Invalid { detail } = &pages.manifest_states()[other] else {
        return findings;
    };
    let name = format!("fs/{}", pages.manifest_name(other));
    let current = format!("fs/{}", pages.manifest_name(pages.current_manifest()));
    let later_journals = present
        .iter()
        .any(|&generation| generation > saved.journal_generation);
    // A checkpoint creates the next journal before its manifest, and removes the journals
    // before the one its predecessor named only once the manifest is durable: a later
    // journal with the previous one gone means the damaged manifest had been written whole.
    let newer_written = !fresh
        && later_journals
        && saved.previous_journal_generation != 0
        && !present.contains(&saved.previous_journal_generation);
    let detail = if later_journals {
        format!(
            "the newest manifest fails its checks ({detail}); the state it held was rebuilt \
             from {current} and the journals after it, so nothing is lost{}",
            if newer_written {
                ""
            } else {
                " (or a crash tore it during its checkpoint)"
            }
        )
    } else {
        format!(
            "the older manifest fails its checks ({detail}); nothing is lost, but a damaged \
             {current} could not fall back to it until the next checkpoint rewrites it"
        )
    };
    let mut finding = Finding::new(FindingKind::Damage, name, detail);
    if !later_journals || newer_written {
        findings.push(finding);
    } else {
        // A torn manifest of an interrupted checkpoint is a crash, not damage.
        finding.kind = FindingKind::Leftover;
        findings.push(finding);
    }
    findings
}

/// Replays journals into the tables; see the module documentation.
struct Replay<'a> {
    mode: OpenMode,
    pages: &'a mut PageStore,
    chunks: &'a mut ChunkStore,
    pieces: &'a mut FingerprintIndex,
    systems: &'a mut BTreeMap<FsId, FileSystem>,
    findings: &'a mut Vec<Finding>,
    /// Past damage in repair mode: later records are applied by salvage.
    salvage: Option<Salvage>,
    /// Replay ended early (damage outside a repair, or a torn tail).
    stopped: bool,
}

impl Replay<'_> {
    /// The first of `generations` from which on no journal holds anything: a torn end before
    /// it is damage (a later journal was written, so a checkpoint synced this one whole).
    fn last_written(&self, storage: &dyn Storage, generations: &[u64]) -> Result<u64> {
        for &generation in generations.iter().rev() {
            match Journal::scan(storage, META_DIRECTORY, generation) {
                Ok(scan)
                    if scan.records.is_empty()
                        && scan.damage.is_empty()
                        && scan.end == JournalEnd::Clean => {}
                Ok(_) => return Ok(generation),
                Err(onecopy_core::Error::NotFound(_)) => {}
                Err(error) => return Err(error.into()),
            }
        }
        Ok(generations.first().copied().unwrap_or(0))
    }

    /// Records damage that loses acknowledged data; a read-write open refuses it instead,
    /// with an error naming it.
    fn lossy(&mut self, finding: Finding) -> Result<()> {
        if self.mode == OpenMode::ReadWrite {
            let lost = if finding.lost.is_empty() {
                String::new()
            } else {
                format!(" (it changed: {})", finding.lost.join("; "))
            };
            return Err(FsError::Core(onecopy_core::Error::corrupt(
                finding.object,
                format!(
                    "{}{lost}; the file systems are not served with older data as if it were \
                     current: `onecopy check --repair` salvages the rest and marks exactly \
                     that lost",
                    finding.detail
                ),
            )));
        }
        self.findings.push(finding);
        Ok(())
    }

    fn generation(&mut self, storage: &dyn Storage, generation: u64, last: bool) -> Result<()> {
        let name = format!("fs/{}", Journal::file_name(META_DIRECTORY, generation));
        let scan = match Journal::scan(storage, META_DIRECTORY, generation) {
            Ok(scan) => scan,
            Err(onecopy_core::Error::NotFound(_)) => {
                let mut finding = Finding::new(
                    FindingKind::Damage,
                    name,
                    "the journal is missing: the changes acknowledged since the last \
                     checkpoint are lost, and which files they changed is unknown",
                )
                .with_lost(["the changes since the last checkpoint (files unknown)".to_string()]);
                if self.mode == OpenMode::Repair {
                    finding = finding.repaired("the file systems continue from the checkpoint");
                    self.salvage.get_or_insert_with(Salvage::default);
                } else {
                    self.stopped = true;
                }
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
        // Journals before the last written one were synced whole when the next began.
        let proven = |record: &ScannedRecord| !last || record.offset < durable_end;
        let prefix: Vec<ScannedRecord> = scan.records[..scan.prefix].to_vec();
        let mut torn_at = None;
        scan.for_each_payload(&prefix, |record, payload| -> Result<()> {
            if torn_at.is_some() || self.stopped {
                return Ok(());
            }
            let changes = decode_record(&name, record, payload)?;
            if self.data_is_durable(&changes)? {
                return self.apply(&changes, record);
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
            let mut finding = Finding::new(
                FindingKind::Damage,
                format!("{name} at byte {offset}"),
                "the journal ends early although a later checkpoint synced it whole (a torn \
                 record, or one whose chunk bytes are not in their container)",
            )
            .with_lost(["the changes after it (files unknown)".to_string()]);
            if self.mode == OpenMode::Repair {
                finding = finding.repaired("the intact records of later journals were applied");
                self.salvage.get_or_insert_with(Salvage::default);
            } else {
                self.stopped = true;
            }
            return self.lossy(finding);
        }
        if torn_at.is_some() {
            // Never acknowledged: a crash before the fsync that would have made it durable.
            self.findings.push(Finding::new(
                FindingKind::Leftover,
                name,
                "records after the last fsync whose data never reached the disk were dropped",
            ));
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
        let mut pending = Vec::new();
        for damage in &scan.damage {
            let summary = damage
                .tag
                .as_ref()
                .map_or(RecordSummary::Unknown, RecordSummary::of_tag);
            let mut lost = if damage.tag.is_some() {
                vec![describe(self.systems, &summary)]
            } else if damage.cut {
                vec![format!(
                    "the changes held from byte {} of {name} on (files unknown)",
                    damage.offset
                )]
            } else {
                vec![format!(
                    "the changes held in bytes {}..{} of {name} (files unknown)",
                    damage.offset, damage.end
                )]
            };
            if damage.cut && damage.tag.is_some() {
                lost.push(format!(
                    "the changes after byte {} of {name}, if there were any (files unknown)",
                    damage.offset
                ));
            }
            let finding = Finding::new(
                FindingKind::Damage,
                format!("{name} at byte {}", damage.offset),
                format!(
                    "{} (bytes {}..{}); the record changed {}",
                    damage.detail,
                    damage.offset,
                    damage.end,
                    describe(self.systems, &summary)
                ),
            )
            .with_lost(lost);
            pending.push((damage.end, summary, finding));
        }
        if self.mode != OpenMode::Repair {
            for (_, _, finding) in pending {
                self.lossy(finding)?;
            }
            self.stopped = true;
            return Ok(());
        }
        // Each damaged record is lost before the later records are applied, in file order.
        let later: Vec<ScannedRecord> = scan.records[scan.prefix..].to_vec();
        let mut pending = pending.into_iter().peekable();
        let mut salvage = self.salvage.take().unwrap_or_default();
        let result = scan.for_each_payload(&later, |record, payload| -> Result<()> {
            while let Some((_, summary, finding)) =
                pending.next_if(|(end, _, _)| *end <= record.offset)
            {
                salvage.damaged(summary);
                self.findings.push(salvaged(finding, &summary));
            }
            let changes = decode_record(name, record, payload)?;
            if self.data_is_durable(&changes)? {
                salvage.apply(
                    self.pages,
                    self.chunks,
                    self.pieces,
                    self.systems,
                    &changes,
                    RecordSummary::of_tag(&record.tag),
                )
            } else {
                let summary = RecordSummary::of_tag(&record.tag);
                salvage.damaged(summary);
                let finding = missing_data_finding(name, record, self.systems);
                self.findings.push(salvaged(finding, &summary));
                Ok(())
            }
        });
        for (_, summary, finding) in pending {
            salvage.damaged(summary);
            self.findings.push(salvaged(finding, &summary));
        }
        self.salvage = Some(salvage);
        result
    }

    fn missing_data(&mut self, name: &str, record: &ScannedRecord) -> Result<()> {
        let finding = missing_data_finding(name, record, self.systems);
        if self.mode == OpenMode::Repair {
            let summary = RecordSummary::of_tag(&record.tag);
            let salvage = self.salvage.get_or_insert_with(Salvage::default);
            salvage.damaged(summary);
            self.findings.push(salvaged(finding, &summary));
            return Ok(());
        }
        self.stopped = true;
        self.lossy(finding)
    }

    fn data_is_durable(&self, changes: &[FsChange]) -> Result<bool> {
        for change in changes {
            if let FsChange::Chunk(chunk) = change {
                if !self.chunks.stored_data_is_durable(chunk)? {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    fn apply(&mut self, changes: &[FsChange], record: &ScannedRecord) -> Result<()> {
        match &mut self.salvage {
            Some(salvage) => salvage.apply(
                self.pages,
                self.chunks,
                self.pieces,
                self.systems,
                changes,
                RecordSummary::of_tag(&record.tag),
            ),
            None => {
                for change in changes {
                    apply(self.pages, self.chunks, self.pieces, self.systems, change)?;
                }
                Ok(())
            }
        }
    }
}

/// A damaged record's finding once salvaged: the bytes it changed are listed as lost by the
/// repair, per file and exactly (what later records rewrote is not lost); what else it
/// changed stays listed here.
fn salvaged(mut finding: Finding, summary: &RecordSummary) -> Finding {
    if matches!(
        summary,
        RecordSummary::Data { .. } | RecordSummary::File { .. }
    ) {
        finding.lost.retain(|lost| lost.contains("files unknown"));
    }
    finding.repaired(
        "the intact records after it were applied; the bytes it changed that no later record \
         rewrote are marked lost",
    )
}

/// Decodes the payload of an intact record; a payload whose checksum holds but that does not
/// decode is damage named by its place.
fn decode_record(name: &str, record: &ScannedRecord, payload: &[u8]) -> Result<Vec<FsChange>> {
    changes::decode(payload).map_err(|error| {
        FsError::Core(onecopy_core::Error::corrupt(
            format!("{name} at byte {}", record.offset),
            error.to_string(),
        ))
    })
}

/// The finding of an acknowledged record whose chunk bytes are not in their container.
fn missing_data_finding(
    name: &str,
    record: &ScannedRecord,
    systems: &BTreeMap<FsId, FileSystem>,
) -> Finding {
    let summary = RecordSummary::of_tag(&record.tag);
    Finding::new(
        FindingKind::Damage,
        format!("{name} at byte {}", record.offset),
        "an acknowledged change refers to chunk bytes that are missing or damaged in their \
         container",
    )
    .with_lost([describe(systems, &summary)])
}
