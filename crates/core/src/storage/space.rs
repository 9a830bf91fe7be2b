//! Free space as a face that writes to a disk sees it: admission of the requests that add
//! data, and the reserve that lets the commits through a full disk. The block device and the
//! file systems share it; each face adds what it must keep free (its *headroom*: buffered
//! container bytes, a checkpoint, a margin) and its own messages.
//!
//! - **Admission.** [`FreeSpace::admit`] samples the storage's free space (`statvfs`) at most
//!   every [`SpaceTuning::sample_interval`] or [`SpaceTuning::sample_bytes`] of admitted data
//!   and counts what it admitted since. Below the headroom a request is refused, before it
//!   changes anything, and requests stay refused until the estimate is back above the
//!   headroom plus [`SpaceTuning::resume_margin_bytes`] (sampled every
//!   [`SpaceTuning::refusing_sample_interval`] meanwhile), so a disk on the edge does not
//!   flap.
//! - **The reserve** ([`super::RESERVE_FILE`], [`SpaceTuning::reserve_bytes`] of allocated
//!   space) is released when a commit finds the disk full anyway ([`with_reserve`]) and taken
//!   back by the first sample that finds room for it beyond the headroom.

use std::time::{Duration, Instant};

use super::{create_reserve, remove_reserve, Storage};
use crate::{Error, Result};

/// A face's sampling and margins.
#[derive(Clone, Copy, Debug)]
pub struct SpaceTuning {
    /// Free space is sampled at most this often while requests are admitted...
    pub sample_interval: Duration,
    /// ...or after this many bytes were admitted since the last sample.
    pub sample_bytes: u64,
    /// While requests are refused, free space is sampled at most this often.
    pub refusing_sample_interval: Duration,
    /// Requests resume once this much more than the headroom is free.
    pub resume_margin_bytes: u64,
    /// Bytes of the reserve file.
    pub reserve_bytes: u64,
}

/// What [`FreeSpace::admit`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// The request may go on; its bytes are counted.
    Admitted,
    /// No room: `estimate` bytes are free, `needed` would be. `started` is true for the
    /// request that turned refusing on.
    Refused {
        estimate: u64,
        needed: u64,
        started: bool,
    },
}

/// The free space a face has seen, and whether it refuses requests; see the module
/// documentation.
#[derive(Debug)]
pub struct FreeSpace {
    tuning: SpaceTuning,
    /// Free bytes at the last sample (`None`: the storage cannot tell, nothing is refused).
    sampled_free: Option<u64>,
    sampled_at: Option<Instant>,
    /// Bytes admitted since the sample.
    admitted_since: u64,
    refusing: bool,
    reserve_held: bool,
    /// Requests refused since open.
    refused: u64,
}

impl FreeSpace {
    /// Nothing sampled yet; `reserve_held` says whether the reserve file exists.
    pub fn new(tuning: SpaceTuning, reserve_held: bool) -> FreeSpace {
        assert!(
            tuning.sample_bytes >= tuning.reserve_bytes,
            "a sample is due before the admitted bytes could eat a reserve's worth"
        );
        FreeSpace {
            tuning,
            sampled_free: None,
            sampled_at: None,
            admitted_since: 0,
            refusing: false,
            reserve_held,
            refused: 0,
        }
    }

    /// Free bytes at the last sample, when the storage can tell.
    pub fn free_bytes_sampled(&self) -> Option<u64> {
        self.sampled_free
    }

    /// Whether requests that add data are refused now.
    pub fn refusing(&self) -> bool {
        self.refusing
    }

    /// Requests refused since open.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// Whether the reserve file exists.
    pub fn reserve_held(&self) -> bool {
        self.reserve_held
    }

    /// Refuses requests from now on (the disk was found full), until a sample finds room.
    pub fn refuse(&mut self) {
        self.refusing = true;
    }

    /// Admits a request adding `bytes` while the face must keep `headroom` bytes free, or
    /// refuses it (see the module documentation). A sample that finds room for the reserve
    /// beyond the headroom takes it back when `may_take_reserve`.
    pub fn admit(
        &mut self,
        storage: &dyn Storage,
        bytes: u64,
        headroom: u64,
        may_take_reserve: bool,
    ) -> Result<Admission> {
        let due = match self.sampled_at {
            None => true,
            Some(at) if self.refusing => at.elapsed() >= self.tuning.refusing_sample_interval,
            Some(at) => {
                at.elapsed() >= self.tuning.sample_interval
                    || self.admitted_since >= self.tuning.sample_bytes
            }
        };
        if due {
            self.sample(storage, headroom, may_take_reserve)?;
        }
        let Some(free) = self.sampled_free else {
            return Ok(Admission::Admitted);
        };
        let estimate = free.saturating_sub(self.admitted_since);
        if self.refusing && estimate >= headroom + self.tuning.resume_margin_bytes {
            self.refusing = false;
        }
        let started = !self.refusing && estimate < headroom.saturating_add(bytes);
        self.refusing |= started;
        if self.refusing {
            self.refused += 1;
            return Ok(Admission::Refused {
                estimate,
                needed: headroom.saturating_add(bytes),
                started,
            });
        }
        self.admitted_since += bytes;
        Ok(Admission::Admitted)
    }

    fn sample(
        &mut self,
        storage: &dyn Storage,
        headroom: u64,
        may_take_reserve: bool,
    ) -> Result<()> {
        let free = storage.available_bytes()?;
        self.sampled_free = free;
        self.sampled_at = Some(Instant::now());
        self.admitted_since = 0;
        let room_for_reserve =
            headroom + self.tuning.resume_margin_bytes + self.tuning.reserve_bytes;
        if free.is_some_and(|free| free >= room_for_reserve)
            && may_take_reserve
            && !self.reserve_held
        {
            // Best effort: without room the face runs without a reserve until there is.
            self.reserve_held = create_reserve(storage, self.tuning.reserve_bytes).is_ok();
        }
        Ok(())
    }

    /// Creates the reserve file when the storage knows its free space and has room (best
    /// effort: without room the face runs without a reserve until a sample finds it).
    pub fn take_reserve(&mut self, storage: &dyn Storage) -> Result<()> {
        if self.reserve_held || storage.available_bytes()?.is_none() {
            return Ok(());
        }
        self.reserve_held = create_reserve(storage, self.tuning.reserve_bytes).is_ok();
        Ok(())
    }

    /// Removes the reserve file; true when it was held. The next admission samples again.
    pub fn release_reserve(&mut self, storage: &dyn Storage) -> Result<bool> {
        if !self.reserve_held {
            return Ok(false);
        }
        remove_reserve(storage)?;
        self.reserve_held = false;
        self.sampled_at = None;
        Ok(true)
    }

    /// Whether `needed` bytes are free now, releasing the reserve for them when they are not.
    pub fn room_for(&mut self, storage: &dyn Storage, needed: u64) -> Result<bool> {
        let Some(free) = storage.available_bytes()? else {
            return Ok(true);
        };
        if free >= needed {
            return Ok(true);
        }
        Ok(self.release_reserve(storage)?
            && storage.available_bytes()?.unwrap_or(u64::MAX) >= needed)
    }
}

/// Runs `operation` on `state`; when it finds the disk full (`is_full`) and the reserve
/// (`space(state)`) is held, releases the reserve, refuses requests from then on, and runs it
/// once more. For the writes that must go through: a FLUSH or fsync, and the checkpoints that
/// commit what was acknowledged or what frees space.
pub fn with_reserve<S, T, E: From<Error>>(
    state: &mut S,
    storage: &dyn Storage,
    space: impl Fn(&mut S) -> &mut FreeSpace,
    is_full: impl Fn(&E) -> bool,
    mut operation: impl FnMut(&mut S) -> std::result::Result<T, E>,
) -> std::result::Result<T, E> {
    match operation(state) {
        Err(error) if is_full(&error) && space(state).release_reserve(storage)? => {
            space(state).refuse();
            operation(state)
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{SimulatedStorage, RESERVE_FILE};

    const MIB: u64 = 1 << 20;

    fn tuning() -> SpaceTuning {
        SpaceTuning {
            sample_interval: Duration::from_secs(3600),
            sample_bytes: 64 * MIB,
            refusing_sample_interval: Duration::ZERO,
            resume_margin_bytes: 2 * MIB,
            reserve_bytes: MIB,
        }
    }

    /// Goal: requests are refused below the headroom before anything is counted, stay
    /// refused until the free space is a margin above it, and admitted bytes count against
    /// the last sample between samples. Method: a simulated disk of 16 MiB, a headroom of
    /// 8 MiB, the capacity changed by hand.
    #[test]
    fn admission_refuses_below_the_headroom_and_resumes_above_the_margin() {
        let storage = SimulatedStorage::new();
        storage.set_capacity(Some(16 * MIB));
        let mut space = FreeSpace::new(tuning(), false);
        let headroom = 8 * MIB;
        assert_eq!(
            space.admit(&storage, 3 * MIB, headroom, false).unwrap(),
            Admission::Admitted
        );
        assert_eq!(
            space.admit(&storage, 3 * MIB, headroom, false).unwrap(),
            Admission::Admitted
        );
        // 16 - 6 admitted = 10 MiB estimated: 3 more would leave less than the headroom.
        assert_eq!(
            space.admit(&storage, 3 * MIB, headroom, false).unwrap(),
            Admission::Refused {
                estimate: 10 * MIB,
                needed: 11 * MIB,
                started: true
            }
        );
        assert!(space.refusing());
        // Room for the request but not for the resume margin: still refused.
        storage.set_capacity(Some(9 * MIB));
        assert!(matches!(
            space.admit(&storage, 0, headroom, false).unwrap(),
            Admission::Refused { started: false, .. }
        ));
        storage.set_capacity(Some(10 * MIB));
        assert_eq!(
            space.admit(&storage, MIB, headroom, false).unwrap(),
            Admission::Admitted
        );
        assert_eq!(space.refused(), 2);
    }

    /// Goal: a sample with room takes the reserve back, and an operation that finds the disk
    /// full releases it, refuses requests and runs again. Method: a simulated disk; the
    /// operation fails as a full disk the first time.
    #[test]
    fn the_reserve_is_taken_back_and_released_for_a_commit() {
        let storage = SimulatedStorage::new();
        storage.set_capacity(Some(64 * MIB));
        let mut space = FreeSpace::new(tuning(), false);
        space.admit(&storage, 0, 8 * MIB, true).unwrap();
        assert!(space.reserve_held());
        assert!(storage.exists(RESERVE_FILE).unwrap());
        let mut runs = 0;
        let result: Result<u32> = with_reserve(
            &mut space,
            &storage,
            |space| space,
            crate::storage::is_full,
            |_| {
                runs += 1;
                if runs == 1 {
                    Err(crate::storage::no_space("the test's first run".into()))
                } else {
                    Ok(7)
                }
            },
        );
        assert_eq!(result.unwrap(), 7);
        assert_eq!(runs, 2);
        assert!(!space.reserve_held() && space.refusing());
        assert!(!storage.exists(RESERVE_FILE).unwrap());
    }
}
