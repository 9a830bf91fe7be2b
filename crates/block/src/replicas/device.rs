//! Device profiles of the read planner: what the engine assumes of the device under its
//! containers, and where a copy lies on it.
//!
//! The engine does not see the device's geometry; it models it. A chunk's *position* is its
//! place in the engine's own layout: containers in id order, each `container_bytes` long, so
//! `container id × container_bytes + offset`. On a hard disk, a file system that allocates
//! files roughly in creation order puts containers near that order; the position is a model of
//! where the head goes, not a measurement of it. Scratch regions (selective duplication) are
//! given positions spread evenly over that layout ([`region_positions`]).
//!
//! - `hdd`: a read that starts where the head is (the end of the last read or write) costs
//!   nothing to reach; any other costs a positioning time: the settle time and half a turn of
//!   the platter (the mean rotational wait) plus a seek growing with the square root of the
//!   distance over the *stroke* (the span the data occupies), up to a full stroke
//!   ([`HDD_SETTLE_NS`], [`HDD_HALF_ROTATION_NS`], [`HDD_FULL_STROKE_NS`]: a 7200 rpm disk's
//!   figures). So the nearest copy is the cheapest, and a copy that splits a run into two
//!   requests pays for the second positioning.
//! - `ssd`: there is no head; the cost is the reads in flight in the copy's region (the
//!   position's [`SSD_REGION_BYTES`] span), so a read goes to the least busy region.
//! - `none`: every block is read from its own copy (replica retrieval off).

use std::str::FromStr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use super::planner::DeviceModel;
use onecopy_core::Error;

/// The `hdd` profile's settle time: the cost of the shortest seek.
pub const HDD_SETTLE_NS: u64 = 2_000_000;
/// The `hdd` profile's mean rotational wait: half a turn at 7200 rpm.
pub const HDD_HALF_ROTATION_NS: u64 = 4_166_667;
/// The `hdd` profile's seek over the whole stroke.
pub const HDD_FULL_STROKE_NS: u64 = 21_000_000;
/// Span of one region of the `ssd` profile.
pub const SSD_REGION_BYTES: u64 = 1 << 30;
/// Regions whose reads in flight the `ssd` profile counts (positions wrap around them).
pub const SSD_REGIONS: usize = 64;

/// The device model the read planner uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceProfile {
    /// Every block is read from its own copy.
    None,
    /// A hard disk: the nearest copy to the head.
    Hdd,
    /// Flash: the copy in the region with the fewest reads in flight.
    #[default]
    Ssd,
}

impl DeviceProfile {
    pub fn name(self) -> &'static str {
        match self {
            DeviceProfile::None => "none",
            DeviceProfile::Hdd => "hdd",
            DeviceProfile::Ssd => "ssd",
        }
    }
}

impl std::fmt::Display for DeviceProfile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DeviceProfile {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self, Error> {
        [DeviceProfile::None, DeviceProfile::Hdd, DeviceProfile::Ssd]
            .into_iter()
            .find(|profile| profile.name().eq_ignore_ascii_case(text))
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "unknown device profile {text:?}; choose hdd, ssd or none"
                ))
            })
    }
}

/// The live state the profiles read: the head, and reads in flight by region. Updated
/// without the engine lock (atomics), so the model is approximate under concurrent requests,
/// as a device's own view would be.
#[derive(Debug)]
pub struct DeviceState {
    profile: DeviceProfile,
    head: AtomicU64,
    /// The span the `hdd` profile's seeks are measured against.
    stroke: AtomicU64,
    in_flight: [AtomicU32; SSD_REGIONS],
}

impl DeviceState {
    pub fn new(profile: DeviceProfile) -> DeviceState {
        DeviceState {
            profile,
            head: AtomicU64::new(0),
            stroke: AtomicU64::new(1),
            in_flight: std::array::from_fn(|_| AtomicU32::new(0)),
        }
    }

    /// Sets the span the data occupies, in the unit of positions: the `hdd` profile's stroke.
    pub fn set_stroke(&self, stroke: u64) {
        self.stroke.store(stroke.max(1), Ordering::Relaxed);
    }

    /// The `hdd` profile's cost of moving `distance` positions: see the module documentation.
    pub fn positioning_ns(&self, distance: u64) -> u64 {
        if distance == 0 {
            return 0;
        }
        let stroke = self.stroke.load(Ordering::Relaxed).max(1);
        let fraction = (distance as f64 / stroke as f64).min(1.0);
        let seek = (HDD_FULL_STROKE_NS - HDD_SETTLE_NS) as f64 * fraction.sqrt();
        HDD_SETTLE_NS + HDD_HALF_ROTATION_NS + seek as u64
    }

    pub fn profile(&self) -> DeviceProfile {
        self.profile
    }

    /// True when the profile follows a head ([`DeviceProfile::Hdd`]).
    pub fn tracks_head(&self) -> bool {
        self.profile == DeviceProfile::Hdd
    }

    /// Records that the device moved to `position` (a read or write ending there).
    pub fn moved_to(&self, position: u64) {
        if self.profile == DeviceProfile::Hdd {
            self.head.store(position, Ordering::Relaxed);
        }
    }

    /// Counts a read starting at `position`, until [`DeviceState::read_done`].
    pub fn read_started(&self, position: u64) {
        if self.profile == DeviceProfile::Ssd {
            self.in_flight[region(position)].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Ends a read counted by [`DeviceState::read_started`].
    pub fn read_done(&self, position: u64) {
        if self.profile == DeviceProfile::Ssd {
            // Saturating: a count is never taken below zero by a stray call.
            let _ = self.in_flight[region(position)].fetch_update(
                Ordering::Relaxed,
                Ordering::Relaxed,
                |count| Some(count.saturating_sub(1)),
            );
        }
    }
}

fn region(position: u64) -> usize {
    ((position / SSD_REGION_BYTES) % SSD_REGIONS as u64) as usize
}

impl DeviceModel for DeviceState {
    /// The `hdd` profile's head position; unused by the others.
    type Head = u64;

    fn head(&self) -> u64 {
        self.head.load(Ordering::Relaxed)
    }

    fn read(&self, head: u64, position: u64, length: u64) -> (u64, u64) {
        match self.profile {
            DeviceProfile::None => (0, head),
            DeviceProfile::Hdd => (
                self.positioning_ns(head.abs_diff(position)),
                position + length,
            ),
            DeviceProfile::Ssd => (
                u64::from(self.in_flight[region(position)].load(Ordering::Relaxed)),
                head,
            ),
        }
    }
}

/// Positions of `regions` scratch regions spread over a layout of `span` (bytes, or sectors):
/// region `r` in the middle of the `r`-th of `regions` equal parts, so every position is at
/// most a `regions`-th of the span from one of them (paper 4 Fig. 7 interleaves its scratch
/// volumes with the file system's space the same way).
pub fn region_positions(span: u64, regions: u32) -> Vec<u64> {
    assert!(regions > 0, "at least one region");
    let regions = u64::from(regions);
    (0..regions)
        .map(|region| ((2 * region + 1) as u128 * span as u128 / (2 * regions) as u128) as u64)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replicas::planner::{plan_run, BlockCandidates};

    /// Goal: the hdd profile reads the copy nearest the head and costs a jump at least a
    /// settle and half a turn, the ssd profile the least busy region, `none` always the own
    /// copy; regions spread evenly. Method: two copies, the head and the reads in flight set by
    /// hand.
    #[test]
    fn profiles_choose_as_documented() {
        let block = [BlockCandidates {
            positions: vec![0, 10 * SSD_REGION_BYTES],
            length: 4096,
        }];
        let hdd = DeviceState::new(DeviceProfile::Hdd);
        hdd.set_stroke(16 * SSD_REGION_BYTES);
        hdd.moved_to(9 * SSD_REGION_BYTES);
        assert_eq!(plan_run(&hdd, &block).choices, vec![1]);
        assert_eq!(hdd.positioning_ns(0), 0);
        assert!(hdd.positioning_ns(1) >= HDD_SETTLE_NS + HDD_HALF_ROTATION_NS);
        assert_eq!(
            hdd.positioning_ns(16 * SSD_REGION_BYTES),
            HDD_FULL_STROKE_NS + HDD_HALF_ROTATION_NS
        );
        let ssd = DeviceState::new(DeviceProfile::Ssd);
        assert_eq!(
            plan_run(&ssd, &block).choices,
            vec![0],
            "a tie keeps the own copy"
        );
        ssd.read_started(0);
        assert_eq!(plan_run(&ssd, &block).choices, vec![1]);
        ssd.read_done(0);
        ssd.read_done(0);
        assert_eq!(plan_run(&ssd, &block).choices, vec![0]);
        let none = DeviceState::new(DeviceProfile::None);
        assert_eq!(plan_run(&none, &block).choices, vec![0]);
        assert_eq!(region_positions(100, 4), vec![12, 37, 62, 87]);
        assert_eq!("HDD".parse::<DeviceProfile>().unwrap(), DeviceProfile::Hdd);
        assert!("tape".parse::<DeviceProfile>().is_err());
    }
}
