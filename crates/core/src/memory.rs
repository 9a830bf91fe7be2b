//! Keeping the process's resident memory to what it uses.
//!
//! Opening a repository reads and decodes whole manifests, page tables and saved filters;
//! the buffers it frees stay in the allocator's free lists, counted in the process's resident
//! memory, unless they are handed back. A block server that is idle after opening would
//! otherwise hold memory it does not use that grows with the stored data (docs/BENCHMARKS.md,
//! "Figures the design refers to", gives the size).
//!
//! glibc also moves its threshold for serving allocations from fresh mappings instead of the
//! heap: freeing a mapped block of n bytes raises it to n (up to 32 MiB). Once the open has
//! freed large decode buffers, later large tables can come from the heap, where a zeroed
//! allocation is written (recycled memory must be cleared) and so resident at once, while a
//! fresh mapping is zero pages that become resident only when used. Which happens would
//! depend on the order of the allocations before, so the resident memory of the same
//! repository would depend on how it was written. [`map_large_allocations`] fixes the
//! threshold.

/// Allocations of at least this many bytes get their own mapping (see
/// [`map_large_allocations`]). Large enough that the block server's per-request buffers
/// (4 KiB blocks, pooled payloads) stay on the heap; small enough that every table that
/// grows with the stored data (filter, index directory, page tables) is mapped.
pub const MAPPED_ALLOCATION_BYTES: usize = 256 << 10;

/// Free memory at the top of a heap that glibc keeps instead of returning it at once. Fixing
/// the mapping threshold also fixes this one, at 128 KiB unless set, at which the server's
/// worker threads would return a few pages per request (about one `madvise` per 1 MiB
/// write). This is glibc's own rule: twice the mapping threshold.
pub const HEAP_TOP_KEPT_BYTES: usize = 4 * MAPPED_ALLOCATION_BYTES;

/// Serves allocations of [`MAPPED_ALLOCATION_BYTES`] or more from their own mappings, always,
/// instead of letting glibc raise that threshold as mapped blocks are freed: such a block is
/// resident only where it is used, and its memory goes back to the system when it is freed.
/// Process-wide; call it once, before the allocations it should govern. The price is a
/// `mmap` and `munmap` per large allocation, which suits a long-running server whose large
/// tables live long and whose buffers are reused, not a tool that allocates large buffers
/// per item.
pub fn map_large_allocations() {
    set_heap_thresholds(MAPPED_ALLOCATION_BYTES, HEAP_TOP_KEPT_BYTES);
}

/// Fixes glibc's mapping threshold (allocations of `mapped_from` bytes or more get their own
/// mapping) and the free bytes it keeps at a heap's top (`kept_at_top`); either setting also
/// stops glibc from moving the mapping threshold by itself.
fn set_heap_thresholds(mapped_from: usize, kept_at_top: usize) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt changes allocator parameters; it takes no pointers.
    unsafe {
        let mapped = libc::mallopt(libc::M_MMAP_THRESHOLD, mapped_from as libc::c_int);
        let kept = libc::mallopt(libc::M_TRIM_THRESHOLD, kept_at_top as libc::c_int);
        debug_assert_eq!((mapped, kept), (1, 1), "glibc accepts both values");
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = (mapped_from, kept_at_top);
}

/// Lets glibc keep at most one heap (arena) per core instead of eight. Threads that
/// allocate on one heap and free on another (a worker's compression context and buffers, a
/// frame handed to the writing thread) leave free memory in each heap that the others cannot
/// use; with fewer heaps less of it is held. Process-wide; call it once, before threads start.
/// A first backup took as long with two heaps as with glibc's default (docs/BENCHMARKS.md,
/// "Recompression", gives that and what the limit saves).
pub fn limit_heaps_to_cores() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let cores = std::thread::available_parallelism().map_or(1, |count| count.get());
        // SAFETY: mallopt changes allocator parameters; it takes no pointers.
        let set = unsafe { libc::mallopt(libc::M_ARENA_MAX, cores.min(64) as libc::c_int) };
        debug_assert_eq!(set, 1, "glibc accepts an arena count");
    }
}

/// Buffers up to this size come from the heap once [`keep_freed_buffers`] is called.
pub const HEAP_BUFFER_BYTES_MAX: usize = 64 << 20;

/// Serves allocations of up to [`HEAP_BUFFER_BYTES_MAX`] from the heap and keeps what is
/// freed (up to four times that at the heap's top) for the next ones, instead of glibc's
/// default of handing it back once more than twice its mapping threshold is free. For a
/// command that allocates and frees buffers of the same few MiB over and over (a restore's
/// windows and the frames decoded for them): each fresh mapping costs a page fault and a
/// zeroed page per page touched, which was a tenth of a restore's CPU time
/// (docs/BENCHMARKS.md, "Restores and freed buffers"). The price is the freed buffers'
/// memory, kept until the process ends. Process-wide; call it once, early.
pub fn keep_freed_buffers() {
    set_heap_thresholds(HEAP_BUFFER_BYTES_MAX, 4 * HEAP_BUFFER_BYTES_MAX);
}

/// Hands the heap memory freed so far back to the operating system. Call it after work that
/// allocates and frees much, not on a hot path: it walks the allocator's free lists.
pub fn return_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases memory that is free; it takes no pointers.
    unsafe {
        libc::malloc_trim(0);
    }
}
