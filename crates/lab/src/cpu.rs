//! Processor time of this process, of the calling thread and of a child process, for the CPU
//! time per operation that paper 1 §5.3 reports ("micro-seconds per operation").
//!
//! What each clock covers, in the testbed of [`crate::mount`]:
//!
//! - [`process_seconds`]: every thread of the lab process, ended threads included: the
//!   workload drivers (their system calls run ext4 on their behalf), the NBD server and the
//!   engine behind it;
//! - [`thread_seconds`]: the calling thread only, so a driver can tell its own share from the
//!   engine's;
//! - [`child_seconds`]: another process by pid (nbdfuse, which turns FUSE requests into NBD).
//!
//! Kernel threads (jbd2, writeback, the loop device's workers) belong to no process and are
//! not counted.

use std::fs;

use crate::error::{LabError, Result};

/// User plus system seconds of `who` (`RUSAGE_SELF` or `RUSAGE_THREAD`).
fn rusage_seconds(who: libc::c_int) -> f64 {
    // SAFETY: getrusage writes one rusage into memory we own; all-zero bytes are a valid
    // rusage to start from.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        let status = libc::getrusage(who, &mut usage);
        assert_eq!(status, 0, "getrusage of a valid target cannot fail");
        usage
    };
    let seconds = |time: libc::timeval| time.tv_sec as f64 + time.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// Processor seconds of this whole process so far (user and system, every thread).
pub fn process_seconds() -> f64 {
    rusage_seconds(libc::RUSAGE_SELF)
}

/// Processor seconds of the calling thread so far (user and system).
pub fn thread_seconds() -> f64 {
    rusage_seconds(libc::RUSAGE_THREAD)
}

/// Processor seconds of process `pid` so far (user and system of all its threads), from
/// `/proc/PID/stat`; its resolution is one clock tick (10 ms on common kernels).
pub fn child_seconds(pid: u32) -> Result<f64> {
    let path = format!("/proc/{pid}/stat");
    let text = fs::read_to_string(&path).map_err(|error| LabError::io(&path, error))?;
    parse_stat_seconds(&text, clock_ticks_per_second()).ok_or_else(|| {
        LabError::io(
            &path,
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("no utime and stime in {text:?}"),
            ),
        )
    })
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    assert!(ticks > 0, "the kernel reports its clock tick rate");
    ticks as f64
}

/// utime + stime of a `/proc/PID/stat` line, in seconds. The command name (field 2) is in
/// parentheses and may hold spaces, so fields are counted after its closing parenthesis:
/// field 3 (state) comes first, utime is field 14 and stime field 15.
fn parse_stat_seconds(text: &str, ticks_per_second: f64) -> Option<f64> {
    let (_, after_name) = text.rsplit_once(')')?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let utime: u64 = fields.get(14 - 3)?.parse().ok()?;
    let stime: u64 = fields.get(15 - 3)?.parse().ok()?;
    Some((utime + stime) as f64 / ticks_per_second)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: utime and stime are read from the right fields even when the command name holds
    /// spaces and parentheses.
    #[test]
    fn stat_fields_are_counted_after_the_name() {
        let line = "1234 (nbd fuse (x)) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 \
                    3 0 500 1000 10";
        assert_eq!(parse_stat_seconds(line, 100.0), Some(3.0));
        assert_eq!(parse_stat_seconds("garbage", 100.0), None);
    }

    /// Goal: the clocks move with work done; method: spin for 50 ms of processor time and
    /// read the thread's, the process's and (through /proc) this process's own clock.
    #[test]
    fn clocks_count_work() {
        let (thread_before, process_before) = (thread_seconds(), process_seconds());
        let own_before = child_seconds(std::process::id()).unwrap();
        let mut sum = 0u64;
        while thread_seconds() - thread_before < 0.05 {
            sum = sum.wrapping_add(std::hint::black_box(sum) | 1);
        }
        assert!(sum > 0);
        assert!(process_seconds() - process_before >= 0.05);
        assert!(child_seconds(std::process::id()).unwrap() >= own_before);
        assert!(child_seconds(u32::MAX).is_err());
    }
}
