//! `memory::map_large_allocations`: a large block is resident only where it is used, and its
//! memory leaves the process when it is freed, whatever was allocated and freed before.
//!
//! A test binary of its own: the setting is process-wide and the check reads the process's
//! resident memory, which other tests running beside it would move.

#![cfg(all(target_os = "linux", target_env = "gnu"))]

use std::hint::black_box;

use onecopy_core::memory::{map_large_allocations, MAPPED_ALLOCATION_BYTES};

const MIB: usize = 1 << 20;

/// Anonymous resident memory of this process, in bytes.
fn resident_anonymous_bytes() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("procfs");
    let line = status
        .lines()
        .find(|line| line.starts_with("RssAnon:"))
        .expect("RssAnon in /proc/self/status");
    let kib: usize = line
        .split_whitespace()
        .nth(1)
        .and_then(|value| value.parse().ok())
        .expect("RssAnon in kB");
    kib * 1024
}

#[test]
fn freed_and_zeroed_large_blocks_are_not_resident() {
    map_large_allocations();
    const { assert!(2 * MIB > MAPPED_ALLOCATION_BYTES) };
    // What raised glibc's own threshold before: a large mapped block freed (here 8 MiB).
    drop(black_box(vec![1u8; 8 * MIB]));
    let before = resident_anonymous_bytes();
    // A 4 MiB block written whole, then freed: with a moving threshold it came from the heap
    // and stayed resident after the free.
    let written = black_box(vec![1u8; 4 * MIB]);
    drop(written);
    // A zeroed 2 MiB block: from recycled heap memory it would be cleared, so resident.
    let zeroed = black_box(vec![0u8; 2 * MIB]);
    let after = resident_anonymous_bytes();
    assert!(
        after < before + MIB,
        "resident anonymous memory grew from {before} to {after} bytes"
    );
    // Used, it is resident.
    let mut zeroed = zeroed;
    zeroed.iter_mut().step_by(4096).for_each(|byte| *byte = 1);
    black_box(&zeroed);
    let used = resident_anonymous_bytes();
    assert!(
        used >= after + MIB,
        "writing 2 MiB moved resident memory from {after} to {used} bytes"
    );
}
