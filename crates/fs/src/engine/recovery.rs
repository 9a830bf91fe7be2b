//! Opening the face: the last checkpoint, then the journals after it.
//!
//! 1. The page store opens at its newest intact manifest; its user state holds the
//!    [`CheckpointState`] and the namespace of every file system.
//! 2. Each journal generation from the checkpoint's on is scanned; its intact records are
//!    replayed through the live path's `apply`, in order. A record storing a chunk whose
//!    container bytes did not reach the media ends the replay: it and everything after it
//!    were never acknowledged by an fsync (fsync syncs containers before the journal).
//! 3. Containers at or past the recovered next container id hold only writes that were
//!    never acknowledged (their journal records did not survive): they are removed, since
//!    their ids are about to be handed out again.
//! 4. Inodes without links and without open handles (unlinked while open at the crash) are
//!    removed, their chunks released.
//! 5. A writable open continues in a new journal generation and checkpoints at once.
//!
//! Damage in a journal (durable bytes that fail their checks) is refused with an error naming
//! it, as is a face whose checkpoint is gone while journals remain; `onecopy check` reports it.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Instant;

use onecopy_core::bytes::ByteReader;
use onecopy_core::check::{Finding, FindingKind};
use onecopy_core::chunk_store::{ChunkStore, ChunkStoreOptions};
use onecopy_core::container::ContainerStore;
use onecopy_core::index::FingerprintIndex;
use onecopy_core::journal::Journal;
use onecopy_core::pages::{PageStore, PageStoreOptions};
use onecopy_core::storage::{read_all, write_atomically, Storage};
use parking_lot::Mutex;

use super::{
    apply, CheckpointState, ChunkCache, FaceConfig, FileSystem, FsEngine, RuntimeOptions, State,
    CONFIG_FILE, META_DIRECTORY,
};
use crate::changes::{self, FileSystemRecord, FsChange, FsId};
use crate::error::{FsError, Result};
use crate::node::{put_inode, put_u32, put_u64, take_bytes, take_inode, Ino};

/// How to open the face.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// Recover and serve.
    ReadWrite,
    /// Look without writing anything, not even recovery (checks; `mount -o ro` too).
    ReadOnly,
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
    /// Opens the face stored in `storage` (created with the default configuration if new),
    /// recovering from a crash when writable.
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
        let generations = Journal::generations(storage.as_ref(), META_DIRECTORY)?;
        if fresh && !generations.is_empty() {
            return Err(FsError::Core(onecopy_core::Error::corrupt(
                format!("{}/meta", storage.describe()),
                "journals exist but no checkpoint does (both manifests are lost)",
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
        let mut findings = Vec::new();
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
        let mut last_generation = 0;
        let mut stopped = false;
        for &generation in generations
            .iter()
            .filter(|&&generation| generation >= saved.journal_generation)
        {
            last_generation = generation;
            if stopped {
                continue;
            }
            let scan = Journal::scan(storage.as_ref(), META_DIRECTORY, generation)?;
            if !scan.is_intact() {
                let detail = scan
                    .damage
                    .iter()
                    .map(|damage| format!("{} at byte {}", damage.detail, damage.offset))
                    .collect::<Vec<_>>()
                    .join("; ");
                return Err(FsError::Core(onecopy_core::Error::corrupt(
                    format!("fs/{}", scan.name),
                    format!("durable journal records are damaged: {detail}"),
                )));
            }
            let records = &scan.records[..scan.prefix];
            scan.for_each_payload(records, |_, payload| -> Result<()> {
                if stopped {
                    return Ok(());
                }
                let decoded = changes::decode(payload)?;
                for change in &decoded {
                    if let FsChange::Chunk(chunk) = change {
                        if !chunks.stored_data_is_durable(chunk)? {
                            stopped = true;
                            findings.push(Finding::new(
                                FindingKind::Leftover,
                                format!("fs/{}", scan.name),
                                "records after the last fsync whose data never reached the \
                                 disk were dropped"
                                    .to_string(),
                            ));
                            return Ok(());
                        }
                    }
                }
                for change in &decoded {
                    apply(&mut pages, &mut chunks, &mut pieces, &mut systems, change)?;
                }
                Ok(())
            })?;
        }
        if !read_only {
            chunks.close_recovered_container(&mut pages)?;
        }
        findings.extend(chunks.leftover_containers("fs", read_only)?);
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
        let journal = if read_only {
            None
        } else {
            let next_generation = last_generation.max(saved.journal_generation) + 1;
            Some(Journal::create(
                storage.clone(),
                META_DIRECTORY,
                next_generation,
                runtime.checkpoint_journal_bytes,
            )?)
        };
        let engine = Arc::new(FsEngine {
            storage,
            config,
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
                chunk_changes: Vec::new(),
                payload: Vec::new(),
                previous_generation: saved.journal_generation,
                failure: None,
            }),
            opened: Instant::now(),
            last_request_ms: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            findings,
        });
        if !read_only {
            engine.finish_deletions()?;
            engine.trim_past_end()?;
            engine.remove_orphans()?;
            let mut state = engine.state.lock();
            engine.checkpoint_locked(&mut state)?;
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
