//! A full disk: writes are refused with ENOSPC before they change anything, reads and fsync
//! go on, writes resume when room comes back, and the commits that make data durable always
//! have room (as the block device does; both use `onecopy_core::storage::space`).
//!
//! 1. **Admission.** Every request that adds data (a write, a new inode, an xattr) asks
//!    [`FsEngine::admit`] first, under the engine lock and before it changes anything. The
//!    engine samples the free space of its storage (`statvfs`) at most every
//!    [`SAMPLE_INTERVAL`] or [`SAMPLE_BYTES`] of admitted data and counts what it admitted
//!    since. Below the *headroom* (room for the container bytes still buffered, a checkpoint
//!    of the dirty pages and the namespace, and a margin) the request fails with ENOSPC, and
//!    the engine refuses such requests until the free space is back above the headroom plus
//!    [`RESUME_MARGIN_BYTES`] (sampled again at most every [`REFUSING_SAMPLE_INTERVAL`]).
//!    Reads, fsync, unlink, truncate, rename and attribute changes are never refused.
//! 2. **The reserve.** `fs/reserve` holds [`RESERVE_BYTES`] of allocated space while there is
//!    room. When an fsync or a checkpoint finds the disk full anyway (another program filled
//!    it), the reserve is released and the operation tried again (a container write that
//!    failed is written again whole, at the same place), so acknowledged writes still become
//!    durable. The reserve is taken back once there is room.
//! 3. **Checkpoints wait.** A checkpoint due while there is no room for it is put off (the
//!    journal holds the changes until there is).
//!
//! Not guaranteed: a request admitted just before another program takes the last free bytes
//! can still find the disk full half way; the face then stops (every request fails with EIO
//! until it is mounted again, and recovery replays the journal), as after any failed write.

use std::time::Duration;

use onecopy_core::pages::PAGE_BYTES;
use onecopy_core::storage::no_space;
use onecopy_core::storage::space::{self, Admission, FreeSpace, SpaceTuning};

use super::{FsEngine, State};
use crate::error::{FsError, Result};
use crate::options::CHUNK_BYTES_MAX;

/// Room kept free besides buffered container bytes and a checkpoint: journal records of
/// requests that are never refused, and a new container.
const MARGIN_BYTES: u64 = 8 << 20;
/// Bytes of `fs/reserve`.
pub const RESERVE_BYTES: u64 = 8 << 20;
/// Sampling and margins: a sample at most every second or 16 MiB of admitted data (every
/// 100 ms while requests are refused); requests resume 4 MiB above the headroom.
pub(crate) const TUNING: SpaceTuning = SpaceTuning {
    sample_interval: Duration::from_secs(1),
    sample_bytes: 16 << 20,
    refusing_sample_interval: Duration::from_millis(100),
    resume_margin_bytes: 4 << 20,
    reserve_bytes: RESERVE_BYTES,
};
/// Bytes a container writer buffers before it writes (the core's write buffer) plus the
/// largest chunk one append adds to it.
const BUFFERED_BYTES_MAX: u64 = (1 << 20) + CHUNK_BYTES_MAX;
/// Bytes every request is counted for besides its data (its journal record, roughly).
pub(crate) const REQUEST_OVERHEAD_BYTES: u64 = 4 << 10;

const _: () = assert!(RESERVE_BYTES <= MARGIN_BYTES);
const _: () = assert!(TUNING.sample_bytes >= TUNING.reserve_bytes);

/// Free space as the engine sees it (`onecopy fs stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SpaceStats {
    /// Free bytes at the last sample, when the storage can tell.
    pub free_bytes_sampled: Option<u64>,
    /// Requests that add data are refused (ENOSPC) until there is room.
    pub writes_refused: bool,
    /// Requests refused for lack of room since open.
    pub refused_requests: u64,
    /// `fs/reserve` holds room for the commits that make data durable.
    pub reserve_held: bool,
}

/// The engine's view of the free space: the core's, and the size of the namespace, which a
/// checkpoint writes whole.
#[derive(Debug)]
pub(crate) struct SpaceGuard {
    pub(crate) free: FreeSpace,
    /// Bytes of the namespace at the last checkpoint.
    pub(crate) namespace_bytes: u64,
}

impl SpaceGuard {
    pub(crate) fn new(reserve_held: bool) -> SpaceGuard {
        SpaceGuard {
            free: FreeSpace::new(TUNING, reserve_held),
            namespace_bytes: 0,
        }
    }

    pub(crate) fn stats(&self) -> SpaceStats {
        SpaceStats {
            free_bytes_sampled: self.free.free_bytes_sampled(),
            writes_refused: self.free.refusing(),
            refused_requests: self.free.refused(),
            reserve_held: self.free.reserve_held(),
        }
    }
}

impl FsEngine {
    /// Admits a request that adds `bytes` of data, or refuses it with ENOSPC when the disk
    /// has no room for it and what it makes the engine write (see the module documentation).
    pub(crate) fn admit(&self, state: &mut State, bytes: u64) -> Result<()> {
        let headroom = headroom(state);
        // The reserve comes back only once the journal is open: recovery writes it first.
        let may_take_reserve = state.journal.is_some();
        let storage = self.storage();
        let admission = state.space.free.admit(
            storage.as_ref(),
            bytes + REQUEST_OVERHEAD_BYTES,
            headroom,
            may_take_reserve,
        )?;
        match admission {
            Admission::Admitted => Ok(()),
            Admission::Refused {
                estimate, needed, ..
            } => Err(FsError::Core(no_space(format!(
                "{} free in {}, {} needed for the data buffered and a checkpoint; writes \
                 resume once there is room (remove files and run `onecopy fs compact`, or \
                 free space on that disk)",
                onecopy_core::units::format_size(estimate),
                storage.describe(),
                onecopy_core::units::format_size(needed)
            )))),
        }
    }

    /// Runs `operation`; if it finds the disk full and the reserve is held, releases the
    /// reserve and runs it once more. For the writes that must go through: fsync, and the
    /// checkpoints that commit what was acknowledged.
    pub(crate) fn with_reserve<T>(
        &self,
        state: &mut State,
        mut operation: impl FnMut(&Self, &mut State) -> Result<T>,
    ) -> Result<T> {
        space::with_reserve(
            state,
            self.storage().as_ref(),
            |state| &mut state.space.free,
            is_full,
            |state| operation(self, state),
        )
    }

    /// Whether a checkpoint has room now: the dirty pages, the namespace and a new journal's
    /// first pages. Without room, the reserve is released for it.
    pub(crate) fn room_for_checkpoint(&self, state: &mut State) -> Result<bool> {
        let needed = checkpoint_bytes(state);
        Ok(state.space.free.room_for(self.storage().as_ref(), needed)?)
    }

    /// Bytes a compaction may copy now: the free space beyond the headroom (everything when
    /// the storage cannot tell). On a full disk it is 0, so a compaction retires only the
    /// containers that hold no live chunk, which gives room back without taking any.
    pub(crate) fn room_for_copies(&self, state: &State) -> Result<u64> {
        Ok(match self.storage().available_bytes()? {
            Some(free) => free.saturating_sub(headroom(state)),
            None => u64::MAX,
        })
    }

    /// Creates `fs/reserve` when the storage knows its free space and has room (best
    /// effort: without room the engine runs without a reserve until there is).
    pub(crate) fn hold_reserve(&self, state: &mut State) -> Result<()> {
        Ok(state.space.free.take_reserve(self.storage().as_ref())?)
    }
}

/// What a checkpoint writes: the dirty pages, the namespace (twice: a manifest is written
/// beside the other) and a margin for a new journal's first pages.
fn checkpoint_bytes(state: &State) -> u64 {
    (state.pages.dirty_page_count() as u64 + 64) * PAGE_BYTES as u64
        + 2 * state.space.namespace_bytes
}

/// Room the engine keeps free besides new data.
fn headroom(state: &State) -> u64 {
    checkpoint_bytes(state) + BUFFERED_BYTES_MAX + MARGIN_BYTES
}

/// True when `error` is a full disk.
pub(crate) fn is_full(error: &FsError) -> bool {
    match error {
        FsError::Core(error) => onecopy_core::storage::is_full(error),
        _ => false,
    }
}
