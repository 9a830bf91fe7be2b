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

use std::time::{Duration, Instant};

use crate::error::Result;
use onecopy_core::pages::PAGE_BYTES;
use onecopy_core::storage::{create_reserve, no_space, remove_reserve};

use super::{Engine, EngineState};

/// Free space is sampled at most this often while writes are admitted...
const SAMPLE_INTERVAL: Duration = Duration::from_secs(1);
/// ...or after this much admitted data, whichever comes first.
const SAMPLE_BYTES: u64 = 32 << 20;
/// While writes are refused, free space is sampled at most this often.
const REFUSING_SAMPLE_INTERVAL: Duration = Duration::from_millis(100);
/// Room kept free besides queued data and dirty pages: journal growth and a new
/// container.
const MARGIN_BYTES: u64 = 16 << 20;
/// Writes resume once this much more than the headroom is free.
const RESUME_MARGIN_BYTES: u64 = 8 << 20;
/// Bytes of `block/reserve`.
pub const RESERVE_BYTES: u64 = 16 << 20;

const _: () = assert!(RESERVE_BYTES <= MARGIN_BYTES);
/// Room a round of selective duplication leaves free beyond its copies: duplicates are
/// derived, and never take the room the engine's own writes and checkpoints need.
pub(crate) const DUPLICATION_HEADROOM_BYTES: u64 = 4 * MARGIN_BYTES + RESERVE_BYTES;
const _: () = assert!(SAMPLE_BYTES >= RESERVE_BYTES);

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

/// The engine's view of the free space; see the module documentation.
#[derive(Debug)]
pub(crate) struct SpaceGuard {
    /// Free bytes at the last sample (`None`: the storage cannot tell, nothing is refused).
    sampled_free: Option<u64>,
    sampled_at: Option<Instant>,
    /// Bytes admitted since the sample.
    admitted_since: u64,
    /// Writes are refused until room comes back.
    refusing: bool,
    /// `block/reserve` exists.
    reserve_held: bool,
    /// Writes refused since open.
    pub(crate) writes_refused: u64,
}

impl SpaceGuard {
    pub(crate) fn new(reserve_held: bool) -> SpaceGuard {
        SpaceGuard {
            sampled_free: None,
            sampled_at: None,
            admitted_since: 0,
            refusing: false,
            reserve_held,
            writes_refused: 0,
        }
    }

    /// What `volume stats` shows.
    pub(crate) fn stats(&self) -> SpaceStats {
        SpaceStats {
            free_bytes_sampled: self.sampled_free,
            writes_refused: self.refusing,
            refused_writes: self.writes_refused,
            reserve_held: self.reserve_held,
        }
    }

    /// True while `block/reserve` exists.
    pub(crate) fn reserve_held(&self) -> bool {
        self.reserve_held
    }

    /// Records that `block/reserve` was created.
    pub(crate) fn hold_reserve(&mut self) {
        self.reserve_held = true;
    }

    /// Refuses writes from now on (the disk was found full), until a sample finds room.
    pub(crate) fn refuse(&mut self) {
        self.refusing = true;
    }
}

impl Engine {
    /// Admits a write request of `bytes`, or refuses it with ENOSPC when the disk has no
    /// room for it and what it will make the engine write (see the module documentation).
    pub(crate) fn admit_write(&self, state: &mut EngineState, bytes: u64) -> Result<()> {
        let due = match state.space.sampled_at {
            None => true,
            Some(at) if state.space.refusing => at.elapsed() >= REFUSING_SAMPLE_INTERVAL,
            Some(at) => {
                at.elapsed() >= SAMPLE_INTERVAL || state.space.admitted_since >= SAMPLE_BYTES
            }
        };
        if due {
            self.sample_space(state)?;
        }
        let Some(free) = state.space.sampled_free else {
            return Ok(());
        };
        let estimate = free.saturating_sub(state.space.admitted_since);
        let headroom = self.headroom(state);
        if state.space.refusing && estimate >= headroom + RESUME_MARGIN_BYTES {
            state.space.refusing = false;
        }
        if !state.space.refusing && estimate < headroom.saturating_add(bytes) {
            state.space.refusing = true;
            // Duplicates are derived: their room goes back at once, for the next sample.
            self.replicas.drop_all(self.storage().as_ref())?;
        }
        if state.space.refusing {
            state.space.writes_refused += 1;
            return Err(no_space(format!(
                "{} free in {}, {} needed for the data queued and a checkpoint; writes \
                 resume once there is room (delete data, trim, or `onecopy volume compact`)",
                onecopy_core::units::format_size(estimate),
                self.storage().describe(),
                onecopy_core::units::format_size(headroom + bytes)
            ))
            .into());
        }
        state.space.admitted_since += bytes;
        Ok(())
    }

    /// Room the engine keeps free for what it has to write besides new data.
    fn headroom(&self, state: &EngineState) -> u64 {
        let dirty = state.pages.dirty_page_count() as u64 * PAGE_BYTES as u64;
        let queued = onecopy_core::container::QUEUED_BYTES_MAX as u64;
        dirty + queued + MARGIN_BYTES
    }

    fn sample_space(&self, state: &mut EngineState) -> Result<()> {
        let free = self.storage().available_bytes()?;
        state.space.sampled_free = free;
        state.space.sampled_at = Some(Instant::now());
        state.space.admitted_since = 0;
        if let Some(free) = free {
            // Take the reserve back once there is room for it beyond the headroom.
            if !state.space.reserve_held
                && free >= self.headroom(state) + RESUME_MARGIN_BYTES + RESERVE_BYTES
            {
                state.space.reserve_held = self.create_reserve().is_ok();
            }
        }
        Ok(())
    }

    /// Creates `block/reserve` with [`RESERVE_BYTES`] of written (allocated) bytes.
    pub(crate) fn create_reserve(&self) -> Result<()> {
        Ok(create_reserve(self.storage().as_ref(), RESERVE_BYTES)?)
    }

    /// Releases `block/reserve`; true when it was held.
    pub(crate) fn release_reserve(&self, state: &mut EngineState) -> Result<bool> {
        if !state.space.reserve_held {
            return Ok(false);
        }
        remove_reserve(self.storage().as_ref())?;
        state.space.reserve_held = false;
        state.space.sampled_at = None;
        Ok(true)
    }

    /// Runs `operation`; if it finds the disk full and the reserve is held, releases the
    /// reserve and runs it once more. For the writes that must go through: FLUSH, and the
    /// checkpoints that commit what frees space.
    pub(crate) fn with_reserve<T>(
        &self,
        state: &mut EngineState,
        mut operation: impl FnMut(&Self, &mut EngineState) -> Result<T>,
    ) -> Result<T> {
        match operation(self, state) {
            Err(error) if error.is_full() && self.release_reserve(state)? => {
                state.space.refusing = true;
                operation(self, state)
            }
            other => other,
        }
    }

    /// Whether a checkpoint has room now: the dirty pages, a manifest and a new journal's
    /// first pages. A checkpoint that does not fits first releases the reserve.
    pub(crate) fn room_for_checkpoint(&self, state: &mut EngineState) -> Result<bool> {
        let Some(free) = self.storage().available_bytes()? else {
            return Ok(true);
        };
        let needed = (state.pages.dirty_page_count() as u64 + 64) * PAGE_BYTES as u64;
        if free >= needed {
            return Ok(true);
        }
        Ok(self.release_reserve(state)?
            && self.storage().available_bytes()?.unwrap_or(u64::MAX) >= needed)
    }
}
