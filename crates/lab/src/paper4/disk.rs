//! A service-time model of one 7200 rpm hard disk, for what this machine's virtual disk cannot
//! show: where the head is, and what moving it costs.
//!
//! One request costs seek + rotational latency + transfer:
//!
//! - **Seek** over a distance of `x` (a fraction of the full stroke, measured in cylinders)
//!   follows the usual two-part curve (Ruemmler and Wilkes, "An introduction to disk drive
//!   modeling", IEEE Computer 27(3), 1994, §"Seek time"): `settle + a·√x` for short seeks,
//!   where the arm accelerates and decelerates, and `b + c·x` for long ones, where it coasts.
//!   The constants fit the datasheet of the disk paper 4 measured on, the Western Digital
//!   Caviar WD5000AAKB (500 GB, 7200 rpm; WD's Caviar Blue/SE16 specification lists
//!   track-to-track 2.0 ms, average read seek 8.9 ms, full stroke 21.0 ms): the curve starts at
//!   2.0 ms for one cylinder, is continuous at `x = 0.3`, ends at 21.0 ms, and averages 8.9 ms
//!   over uniformly random pairs of positions ([`tests`] checks the three figures).
//! - **Rotation**: the platter turns at 7200 rpm (8.33 ms per turn) from angle 0 at time 0; a
//!   request waits, after its seek, until its first sector comes under the head. So the latency
//!   is not an average: back-to-back sequential requests wait for nothing. (A sector passes in
//!   a whole 8,333 ns, so the model turns at 7200.3 rpm.)
//! - **Transfer**: one track of [`SECTORS_PER_TRACK`] sectors per turn (61 MB/s, the order of
//!   the WD5000AAKB's sustained media rate).
//! - **Queue**: requests are served one at a time in arrival order (FIFO); a request arriving
//!   while the disk is busy waits. Its *service time* (paper 4's per-request disk I/O time, what
//!   blktrace measures from dispatch to completion) excludes the wait; its *response time*
//!   includes it.
//! - **The drive's buffer**, for one case only: a read of sectors that the previous request
//!   read (no other request between) is served from the drive's buffer, at the interface's
//!   speed ([`INTERFACE_NS_PER_SECTOR`], SATA's 300 MB/s) without moving and without holding
//!   up the mechanism for the next request. The FIU traces hold
//!   such immediate re-reads (the mail excerpt: 582 of its 8,905 reads); without the buffer each
//!   would wait a whole turn of the platter.
//!
//! Not modelled: zoned recording (outer tracks are faster), the rest of the drive's cache and
//! its read-ahead, command queueing inside the drive, head switches within a cylinder.

/// Sectors (512 bytes) on one track.
pub const SECTORS_PER_TRACK: u64 = 1000;
/// Recording surfaces: tracks per cylinder.
pub const HEADS: u64 = 4;
/// Sectors of the modelled disk (500 GB).
pub const CAPACITY_SECTORS: u64 = 976_773_168;
/// Time for one sector to pass under the head: a whole number of nanoseconds, so that angles
/// and transfers add up exactly (sequential requests meet no rounding gap).
pub const SECTOR_NS: u64 = 8_333;
/// One turn of the platter: 8.333 ms, 7200 rpm.
pub const ROTATION_NS: u64 = SECTOR_NS * SECTORS_PER_TRACK;
/// Seek curve (milliseconds): settle time and the short-seek coefficient of `√x`.
pub const SEEK_SETTLE_MS: f64 = 2.0;
pub const SEEK_SHORT_MS: f64 = 10.588;
/// Where the short-seek part ends (fraction of the full stroke).
pub const SEEK_KNEE: f64 = 0.3;
/// Long-seek part: `b + c·x` milliseconds.
pub const SEEK_LONG_BASE_MS: f64 = 2.142;
pub const SEEK_LONG_SLOPE_MS: f64 = 18.858;

/// Time to move one sector over the interface from the drive's buffer (300 MB/s).
pub const INTERFACE_NS_PER_SECTOR: u64 = 1_707;

const SECTORS_PER_CYLINDER: u64 = SECTORS_PER_TRACK * HEADS;
const CYLINDERS: u64 = CAPACITY_SECTORS.div_ceil(SECTORS_PER_CYLINDER);

/// Seek time, in nanoseconds, between cylinders `distance` apart.
pub fn seek_ns(distance_cylinders: u64) -> u64 {
    if distance_cylinders == 0 {
        return 0;
    }
    let x = (distance_cylinders as f64 / CYLINDERS as f64).min(1.0);
    let milliseconds = if x < SEEK_KNEE {
        SEEK_SETTLE_MS + SEEK_SHORT_MS * x.sqrt()
    } else {
        SEEK_LONG_BASE_MS + SEEK_LONG_SLOPE_MS * x
    };
    (milliseconds * 1e6) as u64
}

fn cylinder(sector: u64) -> u64 {
    sector / SECTORS_PER_CYLINDER
}

/// The time of one request on the disk.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Service {
    /// When the disk started it (after any wait in the queue).
    pub start_ns: u64,
    pub seek_ns: u64,
    pub rotation_ns: u64,
    pub transfer_ns: u64,
}

impl Service {
    /// Time on the disk: seek, rotation and transfer.
    pub fn service_ns(&self) -> u64 {
        self.seek_ns + self.rotation_ns + self.transfer_ns
    }

    pub fn end_ns(&self) -> u64 {
        self.start_ns + self.service_ns()
    }
}

/// The disk: head position and queue.
#[derive(Clone, Debug, Default)]
pub struct Disk {
    /// The sector after the last one transferred: where the head is.
    head_sector: u64,
    /// When the request being served ends.
    busy_until_ns: u64,
    /// Sectors the last request read, held in the drive's buffer (none after a write).
    buffered: Option<(u64, u64)>,
}

impl Disk {
    pub fn new() -> Disk {
        Disk::default()
    }

    /// Where the head is (a sector number).
    pub fn head_sector(&self) -> u64 {
        self.head_sector
    }

    /// When the disk is next free.
    pub fn busy_until_ns(&self) -> u64 {
        self.busy_until_ns
    }

    /// What serving `sectors` sectors at `sector` would cost, starting at `start_ns` from the
    /// current head position; changes nothing.
    pub fn cost(&self, start_ns: u64, sector: u64, sectors: u64) -> Service {
        assert!(sectors > 0, "a request transfers at least one sector");
        let seek = seek_ns(cylinder(self.head_sector).abs_diff(cylinder(sector)));
        let arrive_ns = start_ns + seek;
        // Angles in sectors of a track: where the platter is when the seek ends, and where
        // the request's first sector is.
        let position_ns = arrive_ns % ROTATION_NS;
        let target_ns = (sector % SECTORS_PER_TRACK) * SECTOR_NS;
        Service {
            start_ns,
            seek_ns: seek,
            rotation_ns: (target_ns + ROTATION_NS - position_ns) % ROTATION_NS,
            transfer_ns: sectors * SECTOR_NS,
        }
    }

    /// Serves a read that arrives at `arrival_ns`: it starts when the disk is free (FIFO); a
    /// read of sectors the previous request read comes from the drive's buffer.
    pub fn read(&mut self, arrival_ns: u64, sector: u64, sectors: u64) -> Service {
        let start_ns = self.start_for(arrival_ns);
        let buffered = self
            .buffered
            .is_some_and(|(first, end)| first <= sector && sector + sectors <= end);
        if buffered {
            // The interface, not the mechanism: the next request's seek and rotation are not
            // delayed by it.
            return Service {
                start_ns,
                transfer_ns: sectors * INTERFACE_NS_PER_SECTOR,
                ..Service::default()
            };
        }
        let service = self.cost(start_ns, sector, sectors);
        self.head_sector = sector + sectors;
        self.buffered = Some((sector, sector + sectors));
        self.busy_until_ns = service.end_ns();
        service
    }

    /// Serves a write that arrives at `arrival_ns` (FIFO, as reads).
    pub fn write(&mut self, arrival_ns: u64, sector: u64, sectors: u64) -> Service {
        let service = self.cost(self.start_for(arrival_ns), sector, sectors);
        self.head_sector = sector + sectors;
        self.busy_until_ns = service.end_ns();
        self.buffered = None;
        service
    }

    /// When a request arriving at `arrival_ns` would start.
    pub fn start_for(&self, arrival_ns: u64) -> u64 {
        arrival_ns.max(self.busy_until_ns)
    }

    /// Moves the head without a request (a write done in idle time), taking no foreground
    /// time.
    pub fn park_at(&mut self, sector: u64) {
        self.head_sector = sector;
        self.buffered = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the seek curve matches the datasheet figures it was fitted to. Method: one
    /// cylinder, the full stroke, and the mean over uniformly random pairs of positions (the
    /// distance density 2(1 - x)), numerically.
    #[test]
    fn seek_curve_matches_the_datasheet() {
        let one = seek_ns(1) as f64 / 1e6;
        assert!((one - 2.0).abs() < 0.05, "track to track {one} ms");
        let full = seek_ns(CYLINDERS) as f64 / 1e6;
        assert!((full - 21.0).abs() < 0.01, "full stroke {full} ms");
        let steps = 100_000;
        let mean: f64 = (0..steps)
            .map(|step| {
                let x = (step as f64 + 0.5) / steps as f64;
                let distance = (x * CYLINDERS as f64) as u64;
                seek_ns(distance) as f64 / 1e6 * 2.0 * (1.0 - x) / steps as f64
            })
            .sum();
        assert!((mean - 8.9).abs() < 0.05, "average seek {mean} ms");
        // Continuous at the knee, and never decreasing.
        let knee = (SEEK_KNEE * CYLINDERS as f64) as u64;
        assert!(seek_ns(knee + 1).abs_diff(seek_ns(knee - 1)) < 20_000);
        assert!((1..CYLINDERS)
            .step_by(997)
            .all(|d| seek_ns(d) <= seek_ns(d + 997)));
    }

    /// Goal: sequential requests cost only their transfer; a FIFO queue delays a request that
    /// arrives while the disk is busy without counting the wait as service; an immediate
    /// re-read comes from the drive's buffer, unless a write came between. Method: two
    /// back-to-back 8-sector reads, one far away arriving during the second, its re-read, a
    /// write and the re-read again.
    #[test]
    fn sequential_requests_and_the_queue() {
        let mut disk = Disk::new();
        let first = disk.read(0, 8_000, 8);
        let second = disk.read(first.end_ns(), 8_008, 8);
        assert_eq!(second.seek_ns, 0);
        assert_eq!(second.rotation_ns, 0);
        assert_eq!(second.transfer_ns, 8 * SECTOR_NS);
        let far = disk.read(second.start_ns, CAPACITY_SECTORS / 2, 8);
        assert_eq!(far.start_ns, second.end_ns(), "waits for the disk");
        assert!(far.seek_ns > 5_000_000);
        assert!(far.rotation_ns < ROTATION_NS);
        // The same sectors again come from the drive's buffer; after a write they do not.
        let again = disk.read(far.end_ns(), CAPACITY_SECTORS / 2, 8);
        assert_eq!(again.service_ns(), 8 * INTERFACE_NS_PER_SECTOR);
        disk.write(again.end_ns(), 0, 8);
        let after_write = disk.read(0, CAPACITY_SECTORS / 2, 8);
        assert!(after_write.seek_ns > 5_000_000);
    }
}
