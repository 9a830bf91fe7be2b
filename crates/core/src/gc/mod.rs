//! Garbage collection of the chunk store, split into pure *plans* and their *execution*.
//!
//! * **Reference counting** frees a chunk the moment its last reference goes
//!   ([`ChunkStore::release`]); its bytes stay in the container as garbage.
//! * **Compaction** reclaims that garbage: [`plan_compaction`] picks sealed or closed
//!   containers whose live fraction is low; [`execute_compaction`] copies their live chunks to
//!   the open container (a `Relocated` change per chunk, so no map changes) and retires them.
//!   Retired containers are removed after the next checkpoint
//!   ([`ChunkStore::remove_retired_containers`]).
//! * **Mark and sweep** is the baseline collector and the repair tool: the owner counts the
//!   references its maps hold (mark), [`plan_sweep`] compares them with the stored counts, and
//!   [`execute_sweep`] sets every count that differs, freeing unreferenced chunks (sweep).
//!
//! A plan only reads the tables, so `--dry-run` shows it without changing anything.

use std::collections::HashSet;

use serde::Serialize;

use crate::chunk_store::{ChunkChange, ChunkId, ChunkStore, ContainerState};
use crate::container::{ChunkHeader, ContainerId};
use crate::pages::PageStore;
use crate::{Error, Result};

/// When compaction considers a container.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct CompactionOptions {
    /// Containers whose live bytes are at most this fraction of their size are compacted.
    pub live_fraction_max: f64,
    /// Upper bound on live bytes copied by one run.
    pub copy_bytes_limit: u64,
}

impl Default for CompactionOptions {
    fn default() -> Self {
        CompactionOptions {
            live_fraction_max: 0.5,
            copy_bytes_limit: 256 << 20,
        }
    }
}

/// One container chosen for compaction.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct PlannedContainer {
    pub id: ContainerId,
    /// Bytes of the container file.
    pub bytes: u64,
    pub live_bytes: u64,
    pub live_chunks: u32,
}

/// What a compaction run would do.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CompactionPlan {
    pub containers: Vec<PlannedContainer>,
    /// Live bytes to copy.
    pub copy_bytes: u64,
    /// Bytes freed once the containers are removed.
    pub reclaim_bytes: u64,
}

/// What a compaction run did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CompactionReport {
    pub chunks_moved: u64,
    pub bytes_moved: u64,
    pub containers_retired: u64,
}

/// Chooses containers to compact, emptiest first, within the copy limit. Pure: reads tables.
pub fn plan_compaction(
    store: &ChunkStore,
    pages: &mut PageStore,
    options: &CompactionOptions,
) -> Result<CompactionPlan> {
    let mut candidates = Vec::new();
    for id in 1..store.state().container_id_next {
        let record = store.container_record(pages, id)?;
        let compactable = matches!(
            record.state,
            ContainerState::Sealed | ContainerState::Closed
        );
        if !compactable || store.state().open_container == Some(id) {
            continue;
        }
        let bytes = match record.state {
            ContainerState::Sealed => record.bytes,
            _ => store.containers().container_bytes(id)?,
        };
        let fraction = record.live_bytes as f64 / bytes.max(1) as f64;
        if record.live_chunks == 0 || fraction <= options.live_fraction_max {
            candidates.push((
                fraction,
                PlannedContainer {
                    id,
                    bytes,
                    live_bytes: record.live_bytes,
                    live_chunks: record.live_chunks,
                },
            ));
        }
    }
    candidates.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut plan = CompactionPlan::default();
    for (_, container) in candidates {
        if container.live_bytes > 0
            && plan.copy_bytes + container.live_bytes > options.copy_bytes_limit
        {
            continue;
        }
        plan.copy_bytes += container.live_bytes;
        plan.reclaim_bytes += container.bytes;
        plan.containers.push(container);
    }
    Ok(plan)
}

/// Copies the live chunks of the planned containers into the open container and retires the
/// planned containers. Appends the changes made to `changes`; the owner journals them.
pub fn execute_compaction(
    store: &mut ChunkStore,
    pages: &mut PageStore,
    plan: &CompactionPlan,
    changes: &mut Vec<ChunkChange>,
) -> Result<CompactionReport> {
    let mut report = CompactionReport::default();
    let chosen: HashSet<ContainerId> = plan.containers.iter().map(|c| c.id).collect();
    let moving = plan.containers.iter().any(|c| c.live_chunks > 0);
    if moving {
        let mut stored = Vec::new();
        for id in 1..store.state().chunk_id_next {
            let record = store.record(pages, id)?;
            if !record.in_use || !chosen.contains(&record.location.container) {
                continue;
            }
            store
                .containers()
                .read_stored(&record.location, &mut stored)?;
            let header = ChunkHeader {
                fingerprint: record.fingerprint,
                stored_bytes: record.location.stored_bytes,
                raw_bytes: record.location.raw_bytes,
                flags: record.location.flags,
                checksum: record.location.checksum,
            };
            store.ensure_room_for(pages, stored.len(), changes)?;
            let writer = store.writer_mut().expect("a container is open");
            assert!(
                !chosen.contains(&writer.id()),
                "the open container is never compacted"
            );
            let location = writer.append_stored(header, &stored)?;
            store.push_change(pages, ChunkChange::Relocated { id, location }, changes)?;
            report.chunks_moved += 1;
            report.bytes_moved += location.footprint_bytes();
        }
    }
    for container in &plan.containers {
        let record = store.container_record(pages, container.id)?;
        if record.live_chunks != 0 {
            return Err(Error::corrupt(
                format!("container {}", container.id),
                format!("{} live chunks remain after compaction", record.live_chunks),
            ));
        }
        store.push_change(
            pages,
            ChunkChange::ContainerRetired { id: container.id },
            changes,
        )?;
        report.containers_retired += 1;
    }
    Ok(report)
}

/// One stored reference count that differs from the count the maps hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ReferenceCorrection {
    pub id: ChunkId,
    pub stored: u32,
    pub counted: u32,
}

/// What a sweep would change.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SweepPlan {
    pub chunks_in_use: u64,
    pub corrections: Vec<ReferenceCorrection>,
    /// Chunk ids the maps refer to that are not in use: data loss that no sweep can repair.
    pub dangling: Vec<ChunkId>,
}

/// Compares the stored reference counts with `counted` (references held by the owner's
/// maps, indexed by chunk id; ids beyond its end count zero). Pure: reads tables.
pub fn plan_sweep(store: &ChunkStore, pages: &mut PageStore, counted: &[u32]) -> Result<SweepPlan> {
    let mut plan = SweepPlan::default();
    let end = store.state().chunk_id_next.max(counted.len() as u64);
    for id in 1..end {
        let count = counted.get(id as usize).copied().unwrap_or(0);
        let record = if id < store.state().chunk_id_next {
            store.record(pages, id)?
        } else {
            Default::default()
        };
        if !record.in_use {
            if count > 0 {
                plan.dangling.push(id);
            }
            continue;
        }
        plan.chunks_in_use += 1;
        if record.references != count {
            plan.corrections.push(ReferenceCorrection {
                id,
                stored: record.references,
                counted: count,
            });
        }
    }
    Ok(plan)
}

/// Sets every corrected reference count; counts of zero free their chunks.
pub fn execute_sweep(
    store: &mut ChunkStore,
    pages: &mut PageStore,
    plan: &SweepPlan,
    changes: &mut Vec<ChunkChange>,
) -> Result<u64> {
    for correction in &plan.corrections {
        store.push_change(
            pages,
            ChunkChange::ReferencesSet {
                id: correction.id,
                references: correction.counted,
            },
            changes,
        )?;
    }
    Ok(plan.corrections.len() as u64)
}
