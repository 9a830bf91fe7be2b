//! A full disk: writes are refused with ENOSPC before they change anything, reads go on,
//! writes resume when room comes back, and metadata always has room to commit.
//!
//! 1. **Admission.** Every write request asks [`Engine::admit_write`]. The engine samples
//!    the free space of its storage (`statvfs`) at most every [`SAMPLE_INTERVAL`] or
//!    [`SAMPLE_BYTES`] of admitted data, and counts what it admitted since. Below the
//!    *headroom* (room for the data queued for writing, a checkpoint of every dirty page and
//!    a margin) a write fails with ENOSPC, before it changes anything, and the engine
//!    refuses writes until the free space is back above the headroom plus
//!    [`RESUME_MARGIN_BYTES`] (sampled again at most every [`REFUSING_SAMPLE_INTERVAL`]).
//!    Reads, trims, deletions and compaction are never refused: they are how room comes
//!    back.
//! 2. **The reserve.** `block/reserve` holds [`RESERVE_BYTES`] of allocated space while
//!    there is room. When a FLUSH or a checkpoint finds the disk full anyway (another
//!    program filled it), the reserve is released and the operation tried again, so
//!    acknowledged writes still become durable and a full data area never blocks the
//!    commit that frees space. The reserve is taken back once there is room.
//! 3. **Checkpoints wait.** A checkpoint due while there is no room for it is put off (the
//!    journal holds the changes); one that cannot be put off (a volume change, shutdown)
//!    fails before it starts writing.
//!
//! Container bytes that found the disk full stay queued in memory, readable, and are
//! written by the next FLUSH ([`onecopy_core::container::WriteBehind`]).

use std::time::Duration;

use crate::error::{BlockError, Result};
use onecopy_core::pages::PAGE_BYTES;
use onecopy_core::storage::no_space;
use onecopy_core::storage::space::{self, Admission, FreeSpace, SpaceTuning};

use super::{Engine, EngineState};

/// Room kept free besides queued data and dirty pages: journal growth and a new
/// container.
const MARGIN_BYTES: u64 = 16 << 20;
/// Bytes of `block/reserve`.
pub const RESERVE_BYTES: u64 = 16 << 20;
/// Sampling and margins: a sample at most every second or 32 MiB of admitted writes (every
/// 100 ms while writes are refused); writes resume 8 MiB above the headroom.
pub(crate) const TUNING: SpaceTuning = SpaceTuning {
    sample_interval: Duration::from_secs(1),
    sample_bytes: 32 << 20,
    refusing_sample_interval: Duration::from_millis(100),
    resume_margin_bytes: 8 << 20,
    reserve_bytes: RESERVE_BYTES,
};

const _: () = assert!(RESERVE_BYTES <= MARGIN_BYTES);
const _: () = assert!(TUNING.sample_bytes >= TUNING.reserve_bytes);
/// Room a round of selective duplication leaves free beyond its copies: duplicates are
/// derived, and never take the room the engine's own writes and checkpoints need.
pub(crate) const DUPLICATION_HEADROOM_BYTES: u64 = 4 * MARGIN_BYTES + RESERVE_BYTES;

/// Free space as the engine sees it ([`crate::EngineStats::space`]).
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct SpaceStats {
    /// Free bytes at the last sample, when the storage can tell.
    pub free_bytes_sampled: Option<u64>,
    /// Writes are refused (ENOSPC) until there is room.
    pub writes_refused: bool,
    /// Write requests refused for lack of room since open.
    pub refused_writes: u64,
    /// `block/reserve` holds room for the commits that free space.
    pub reserve_held: bool,
}

impl SpaceStats {
    /// What `volume stats` shows of `space`.
    pub(crate) fn of(space: &FreeSpace) -> SpaceStats {
        SpaceStats {
            free_bytes_sampled: space.free_bytes_sampled(),
            writes_refused: space.refusing(),
            refused_writes: space.refused(),
            reserve_held: space.reserve_held(),
        }
    }
}

impl Engine {
    /// Admits a write request of `bytes`, or refuses it with ENOSPC when the disk has no
    /// room for it and what it will make the engine write (see the module documentation).
    pub(crate) fn admit_write(&self, state: &mut EngineState, bytes: u64) -> Result<()> {
        let headroom = self.headroom(state);
        let storage = self.storage();
        match state.space.admit(storage.as_ref(), bytes, headroom, true)? {
            Admission::Admitted => Ok(()),
            Admission::Refused {
                estimate,
                needed,
                started,
            } => {
                if started {
                    // Duplicates are derived: their room goes back at once, for the next
                    // sample.
                    self.replicas.drop_all(storage.as_ref())?;
                }
                Err(no_space(format!(
                    "{} free in {}, {} needed for the data queued and a checkpoint; writes \
                     resume once there is room (delete data, trim, or `onecopy volume compact`)",
                    onecopy_core::units::format_size(estimate),
                    storage.describe(),
                    onecopy_core::units::format_size(needed)
                ))
                .into())
            }
        }
    }

    /// Room the engine keeps free for what it has to write besides new data.
    fn headroom(&self, state: &EngineState) -> u64 {
        let dirty = state.pages.dirty_page_count() as u64 * PAGE_BYTES as u64;
        let queued = onecopy_core::container::QUEUED_BYTES_MAX as u64;
        dirty + queued + MARGIN_BYTES
    }

    /// Runs `operation`; if it finds the disk full and the reserve is held, releases the
    /// reserve and runs it once more. For the writes that must go through: FLUSH, and the
    /// checkpoints that commit what frees space.
    pub(crate) fn with_reserve<T>(
        &self,
        state: &mut EngineState,
        mut operation: impl FnMut(&Self, &mut EngineState) -> Result<T>,
    ) -> Result<T> {
        space::with_reserve(
            state,
            self.storage().as_ref(),
            |state| &mut state.space,
            BlockError::is_full,
            |state| operation(self, state),
        )
    }

    /// Whether a checkpoint has room now: the dirty pages, a manifest and a new journal's
    /// first pages. A checkpoint that does not fit first releases the reserve.
    pub(crate) fn room_for_checkpoint(&self, state: &mut EngineState) -> Result<bool> {
        let needed = (state.pages.dirty_page_count() as u64 + 64) * PAGE_BYTES as u64;
        Ok(state.space.room_for(self.storage().as_ref(), needed)?)
    }
}
