//! *Warming*: asking the processor to start loading, into its caches, memory a lookup is about
//! to read, without waiting for it and without changing anything.
//!
//! A cached lookup is bound by memory latency, not by instructions: it reads one random cache
//! line of the filter and one random line of the cache's slot table, each a miss in a table
//! of megabytes. Issued one after the other, the misses cost their latencies in sequence.
//! Warmed first, several lines load at once: the filter's and the slot table's line of one
//! lookup, and the lines of every lookup of a batch ([`FingerprintIndex::warm`]), so the
//! misses of a batch overlap instead of queueing.
//!
//! Not to be confused with a *prefetch* of the cache policies ([`EntryCache::prefetch`]),
//! which loads index entries named by a hint into the cache.
//!
//! [`FingerprintIndex::warm`]: super::FingerprintIndex::warm
//! [`EntryCache::prefetch`]: super::cache::EntryCache::prefetch

/// Starts loading the cache line holding `item` into every level of the processor's caches.
/// On targets without a prefetch instruction this does nothing.
#[inline(always)]
pub fn warm<T>(item: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of the x86-64 baseline, so the instruction exists; a prefetch never
    // faults and reads nothing the program sees, and the address comes from a live reference.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>((item as *const T).cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = item;
}
