//! The fingerprint index: "have we stored this fingerprint, and where?".
//!
//! Every face of onecopy asks it: the block device maps a chunk fingerprint to a chunk id, the
//! backup store maps a segment fingerprint to a segment id; both are a `u64` *value* here. As
//! in paper 1's metadata store (§3.3.1) the index has three parts, consulted in this order:
//!
//! 1. a membership [`filter`] in memory answers "certainly absent" for most new fingerprints;
//! 2. an entry [`cache`] in memory, under a hard byte budget, answers for popular entries;
//! 3. the on-disk index ([`disk`]), an extendible hash table in page-store pages, holds every
//!    entry and answers any lookup with one page read.
//!
//! [`FingerprintIndex`] composes them. A lookup: filter says no -> absent (a *filter
//! negative*); cache hit -> its value; otherwise the on-disk index is read (a *disk lookup*,
//! which pays the injected latency, see below) and a found entry enters the cache.
//!
//! **Injected latency.** To reproduce paper 1's experiments (§4.2.2: on-disk latencies from
//! 10 µs to 10 ms), every disk lookup and prefetch load can wait [`IndexOptions::latency_ns`].
//! Waits shorter than [`LATENCY_SLEEP_THRESHOLD_NS`] busy-wait (a sleep would overshoot them by
//! tens of microseconds); longer ones sleep until [`LATENCY_SPIN_MARGIN_NS`] before the deadline
//! and busy-wait the rest. Inserts and removals do not wait: in the write path they follow the
//! lookup that already paid for reading the bucket page.
//!
//! **Filter growth.** A filter is sized for `max(expected_entries, entries x 1.25)`. When it
//! reaches its capacity (for a Bloom filter: insertions since it was built, which also counts
//! removed entries it cannot forget) or a cuckoo filter cannot place a tag, it is rebuilt from
//! the keys of the on-disk index at [`FILTER_GROWTH_FACTOR`] times the current entry count.
//! Rebuilding reads every bucket page once. Growing by g costs g / (g - 1) entries read per
//! insert, amortised, and holds the filter between 1 and g times its smallest size: at 1.25,
//! five entries (a twentieth of a bucket page) per insert. Why 1.25 and not more: the top of
//! the cycle must stay inside the block device's memory budget (docs/DESIGN.md, "Membership
//! filter"). A filter never saturates silently.
//!
//! **Crash safety.** Everything durable lives in page-store areas (`<prefix>.buckets`,
//! `<prefix>.directory`, `<prefix>.filter`) and becomes durable at the owner's checkpoint.
//! The filter is derived data: [`FingerprintIndex::prepare_checkpoint`] saves its changed pages
//! (call it just before [`PageStore::checkpoint`]), stamped with the on-disk index's change
//! count. At open a saved filter is used only if its stamp matches; otherwise (never saved,
//! saved before later changes, or a crash between) it is rebuilt from the on-disk entries,
//! which costs one read of every bucket page. After a crash the owner replays its journal
//! through `insert`/`remove`, which update both parts alike.

pub mod cache;
pub mod disk;
pub mod filter;
pub mod warm;

use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::fingerprint::Fingerprint;
use crate::pages::{AreaId, PageStore};
use crate::{Error, Result};
use cache::{Cache, CachePolicy, EntryCache};
pub use disk::IndexKey;
use disk::{DiskIndex, DiskIndexLimits, GLOBAL_DEPTH_MAX};
use filter::{Filter, FilterKind, MembershipFilter};

/// Injected latencies below this busy-wait; longer ones mostly sleep.
pub const LATENCY_SLEEP_THRESHOLD_NS: u64 = 200_000;
/// A sleeping wait wakes this long before its deadline and busy-waits the rest.
pub const LATENCY_SPIN_MARGIN_NS: u64 = 100_000;
/// Largest injected latency accepted (one second).
pub const LATENCY_NS_MAX: u64 = 1_000_000_000;
/// A rebuilt filter holds this many times the current entries.
pub const FILTER_GROWTH_FACTOR: f64 = 1.25;

/// How a [`FingerprintIndex`] is built. Serialised with the repository configuration; every
/// field has a default, so a partial configuration is accepted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IndexOptions {
    /// Replacement policy of the entry cache. Default: ARC.
    pub cache_policy: CachePolicy,
    /// Memory budget of the entry cache in bytes, a hard limit; the entry limit follows from
    /// the policy's exact cost per entry (75 to 107 bytes at 64 MiB, see [`cache`]). Default:
    /// 64 MiB (paper 1 §5.4.4's cache size): 898,779 entries with LRU, 629,145 with ARC.
    pub cache_bytes: u64,
    /// Kind of membership filter. Default: blocked Bloom (use cuckoo when entries are often
    /// removed).
    pub filter_kind: FilterKind,
    /// Target false-positive rate of the filter. Default: 0.01, as in paper 1 §4.2.2.
    pub false_positive_rate: f64,
    /// Entries the filter is first sized for; it grows beyond. Default: 1M.
    pub expected_entries: u64,
    /// Latency added to every on-disk lookup, in nanoseconds. Default: 0.
    pub latency_ns: u64,
    /// Save the filter at checkpoints so that opening does not rebuild it. Default: true.
    pub persist_filter: bool,
    /// Depth limit of the on-disk directory (at most [`GLOBAL_DEPTH_MAX`]). Default: the most.
    pub global_depth_max: u32,
}

impl Default for IndexOptions {
    fn default() -> Self {
        IndexOptions {
            cache_policy: CachePolicy::default(),
            cache_bytes: 64 << 20,
            filter_kind: FilterKind::default(),
            false_positive_rate: 0.01,
            expected_entries: 1 << 20,
            latency_ns: 0,
            persist_filter: true,
            global_depth_max: GLOBAL_DEPTH_MAX,
        }
    }
}

impl IndexOptions {
    /// Checks every field; the error names the field and its accepted range.
    pub fn validate(&self) -> Result<()> {
        filter::check_parameters(self.expected_entries, self.false_positive_rate)?;
        if self.cache_policy.entries_for_budget(self.cache_bytes) == 0 {
            return Err(Error::InvalidArgument(format!(
                "cache_bytes {} is too small for one {} entry ({} bytes)",
                self.cache_bytes,
                self.cache_policy,
                self.cache_policy.memory_bytes_for(1)
            )));
        }
        if self.latency_ns > LATENCY_NS_MAX {
            return Err(Error::InvalidArgument(format!(
                "latency_ns {} exceeds the maximum of {LATENCY_NS_MAX}",
                self.latency_ns
            )));
        }
        if self.global_depth_max > GLOBAL_DEPTH_MAX {
            return Err(Error::InvalidArgument(format!(
                "global_depth_max {} exceeds the format's maximum of {GLOBAL_DEPTH_MAX}",
                self.global_depth_max
            )));
        }
        Ok(())
    }
}

/// What the index did, for statistics and experiments. Counts since open (or the last
/// [`FingerprintIndex::reset_counters`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexCounters {
    /// Calls to `lookup`.
    pub lookups: u64,
    /// Lookups the filter answered "absent".
    pub filter_negatives: u64,
    /// Lookups answered by the entry cache.
    pub cache_hits: u64,
    /// Lookups that passed the filter and missed the cache.
    pub cache_misses: u64,
    /// Lookups that read the on-disk index (each paid the injected latency).
    pub disk_lookups: u64,
    /// Disk lookups that found the entry (the others were filter false positives).
    pub disk_hits: u64,
    /// Calls to `prefetch`.
    pub prefetches: u64,
    /// Prefetches that read the on-disk index (the entry was not cached and the filter
    /// did not exclude it).
    pub prefetch_loads: u64,
    /// Calls to `insert`.
    pub inserts: u64,
    /// Calls to `remove` that removed an entry.
    pub removes: u64,
    /// Filters built from the on-disk entries (at open or to grow).
    pub filter_rebuilds: u64,
    /// Processor nanoseconds the injected latency spent busy-waiting (the part of each wait
    /// too short to sleep): processor time an experiment subtracts, since a real index read
    /// waits idle.
    pub injected_wait_busy_ns: u64,
    /// Saved filters found damaged at open and rebuilt (part of `filter_rebuilds`).
    pub damaged_filter_rebuilds: u64,
    /// Bucket pages found damaged in use and reset to empty: their entries are missing
    /// until a repair rebuilds the index (lookups miss, so duplicates are stored again).
    pub damaged_buckets_reset: u64,
}

/// Memory held by an index, by part, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexMemory {
    pub filter_bytes: u64,
    pub cache_bytes: u64,
    pub directory_bytes: u64,
}

impl IndexMemory {
    /// The sum of the parts.
    pub fn total_bytes(&self) -> u64 {
        self.filter_bytes + self.cache_bytes + self.directory_bytes
    }
}

/// The composite fingerprint index; see the module documentation.
///
/// The index does not own the [`PageStore`]: its owner (the block device, the backup store)
/// keeps other areas in the same store, passes it to every call that may touch pages, and
/// checkpoints it after [`prepare_checkpoint`](Self::prepare_checkpoint).
#[derive(Debug)]
pub struct FingerprintIndex {
    disk: DiskIndex,
    filter: Filter,
    cache: Cache,
    filter_area: AreaId,
    options: IndexOptions,
    counters: IndexCounters,
}

impl FingerprintIndex {
    /// Opens (or creates) the index kept in areas named `<name_prefix>.*` of `pages`, loading
    /// the saved filter if it matches and rebuilding it otherwise.
    pub fn open(pages: &mut PageStore, name_prefix: &str, options: IndexOptions) -> Result<Self> {
        options.validate()?;
        let limits = DiskIndexLimits {
            global_depth_max: options.global_depth_max,
        };
        let mut disk = DiskIndex::open(pages, name_prefix, limits)?;
        let mut counters = IndexCounters::default();
        let filter_area = pages.area(&format!("{name_prefix}.filter"));
        pages.set_uncached(filter_area);
        let saved = if options.persist_filter {
            // A damaged saved filter is rebuilt like a stale one: it is derived data.
            let loaded = match filter::store::load(pages, filter_area, disk.change_count()) {
                Err(error) if error.is_corrupt() => {
                    counters.damaged_filter_rebuilds += 1;
                    None
                }
                other => other?,
            };
            loaded.filter(|saved| {
                saved.kind() == options.filter_kind
                    && saved.target_false_positive_rate() == options.false_positive_rate
            })
        } else {
            None
        };
        let filter = match saved {
            Some(saved) => saved,
            None => {
                counters.filter_rebuilds += 1;
                build_filter(&options, &mut disk, pages)?
            }
        };
        let cache = Cache::new(options.cache_policy, options.cache_bytes)?;
        Ok(FingerprintIndex {
            disk,
            filter,
            cache,
            filter_area,
            options,
            counters,
        })
    }

    /// Opens the index as [`open`](Self::open) does; when its directory is damaged, the
    /// index's areas are cleared and it opens empty instead, and the damage is returned: the
    /// index is derived data, and the owner rebuilds it from what it derives from. A damaged
    /// saved filter is rebuilt from the buckets by `open` itself.
    pub fn open_or_reset(
        pages: &mut PageStore,
        name_prefix: &str,
        options: IndexOptions,
    ) -> Result<(Self, Option<Error>)> {
        match FingerprintIndex::open(pages, name_prefix, options.clone()) {
            Err(error) if error.is_corrupt() => {
                for suffix in ["buckets", "directory", "filter"] {
                    let area = pages.area(&format!("{name_prefix}.{suffix}"));
                    pages.clear_area(area)?;
                }
                let index = FingerprintIndex::open(pages, name_prefix, options)?;
                Ok((index, Some(error)))
            }
            other => other.map(|index| (index, None)),
        }
    }

    /// The value stored for `fingerprint`, if any; see the module documentation for the path.
    #[inline]
    pub fn lookup(
        &mut self,
        pages: &mut PageStore,
        fingerprint: &Fingerprint,
    ) -> Result<Option<u64>> {
        self.counters.lookups += 1;
        // The filter line and the slot-table line are independent misses: start the second
        // before waiting for the first.
        self.cache.warm(fingerprint);
        if !self.filter.may_contain(fingerprint) {
            self.counters.filter_negatives += 1;
            return Ok(None);
        }
        if let Some(value) = self.cache.get(fingerprint) {
            self.counters.cache_hits += 1;
            return Ok(Some(value));
        }
        self.counters.cache_misses += 1;
        self.lookup_on_disk(pages, fingerprint)
    }

    /// The value stored for `fingerprint`, like [`lookup`](Self::lookup) but without counting
    /// a lookup, paying the injected latency or changing the cache: for bookkeeping that
    /// follows a lookup already paid for (unlinking a chunk from a chain of a weak
    /// fingerprint, whose bucket the free just read).
    pub fn get(&mut self, pages: &mut PageStore, fingerprint: &Fingerprint) -> Result<Option<u64>> {
        if !self.filter.may_contain(fingerprint) {
            return Ok(None);
        }
        if let Some(value) = self.cache.peek(fingerprint) {
            return Ok(Some(value));
        }
        self.disk.lookup(pages, fingerprint)
    }

    /// Starts loading, for every fingerprint, the memory its [`lookup`](Self::lookup) reads
    /// first (filter and cache lines) into the processor's caches, so that the lookups that
    /// follow overlap their memory latencies ([`warm`](crate::index::warm)). Changes nothing
    /// and counts nothing. Callers warm a batch just before looking it up: lines warmed too
    /// early are evicted again before use.
    pub fn warm(&self, fingerprints: &[Fingerprint]) {
        for fingerprint in fingerprints {
            self.filter.warm(fingerprint);
            self.cache.warm(fingerprint);
        }
    }

    /// Warms, for every fingerprint, the bucket page an insert of it would change (its
    /// header, then the line it would append to), if the page is in memory. For a batch of
    /// new chunks, about to be inserted: the first touch of a random bucket page is most of
    /// an insert's time (docs/BENCHMARKS.md, "Figures the design refers to"). Changes
    /// nothing.
    pub fn warm_buckets(&self, pages: &PageStore, fingerprints: &[Fingerprint]) {
        for append in [false, true] {
            for fingerprint in fingerprints {
                self.disk.warm(pages, fingerprint, append);
            }
        }
    }

    /// Warms what [`remove`](Self::remove) of `fingerprint` reads first: its cache slot and
    /// the header of its bucket page (if in memory). Changes nothing.
    pub fn warm_removal(&self, pages: &PageStore, fingerprint: &Fingerprint) {
        self.cache.warm(fingerprint);
        self.disk.warm(pages, fingerprint, false);
    }

    fn lookup_on_disk(
        &mut self,
        pages: &mut PageStore,
        fingerprint: &Fingerprint,
    ) -> Result<Option<u64>> {
        self.counters.disk_lookups += 1;
        self.pay_latency();
        let found = self.disk.lookup(pages, fingerprint)?;
        if let Some(value) = found {
            self.counters.disk_hits += 1;
            self.cache.insert(fingerprint, value);
        }
        Ok(found)
    }

    /// Stores `value` for `fingerprint` (replacing any stored value, which is returned). The
    /// entry enters the cache as a demand access.
    pub fn insert(
        &mut self,
        pages: &mut PageStore,
        fingerprint: &Fingerprint,
        value: u64,
    ) -> Result<Option<u64>> {
        self.counters.inserts += 1;
        // The filter holds every key on disk (it is rebuilt from the buckets whenever it may
        // not), so a key it excludes is new: no need to search its bucket.
        let previous = if self.filter.may_contain(fingerprint) {
            self.disk.insert(pages, fingerprint, value)?
        } else {
            self.disk.insert_absent(pages, fingerprint, value)?;
            None
        };
        if previous.is_none() {
            let placed = self.filter.insert(fingerprint);
            if !placed || self.filter.needs_growth() {
                // The disk insert came first, so the rebuild includes this fingerprint.
                self.rebuild_filter(pages)?;
            }
        }
        self.cache.insert(fingerprint, value);
        debug_assert!(self.filter.may_contain(fingerprint));
        Ok(previous)
    }

    /// Removes `fingerprint`; returns its value if it was stored.
    pub fn remove(
        &mut self,
        pages: &mut PageStore,
        fingerprint: &Fingerprint,
    ) -> Result<Option<u64>> {
        let removed = self.disk.remove(pages, fingerprint)?;
        if removed.is_some() {
            self.counters.removes += 1;
            if self.filter.supports_remove() {
                let forgotten = self.filter.remove(fingerprint);
                assert!(forgotten, "a stored fingerprint is in the filter");
            }
        }
        self.cache.remove(fingerprint);
        Ok(removed)
    }

    /// Loads the entry of `fingerprint` into the cache, flagged as prefetched (paper 1 §3.2.3
    /// and §4.4), paying the injected latency. Does nothing when the entry is cached or the
    /// filter excludes it. Returns true when an entry was loaded.
    pub fn prefetch(&mut self, pages: &mut PageStore, fingerprint: &Fingerprint) -> Result<bool> {
        self.counters.prefetches += 1;
        if self.cache.peek(fingerprint).is_some() || !self.filter.may_contain(fingerprint) {
            return Ok(false);
        }
        self.counters.prefetch_loads += 1;
        self.pay_latency();
        match self.disk.lookup(pages, fingerprint)? {
            Some(value) => {
                self.cache.prefetch(fingerprint, value);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Puts an entry the caller already knows into the cache, flagged as prefetched (paper 1
    /// §4.4), without reading the disk: the block device learns a chunk's fingerprint when it
    /// reads the chunk, so a copy's coming write finds it cached. Does nothing when the entry
    /// is cached already.
    pub fn prefetch_known(&mut self, fingerprint: &Fingerprint, value: u64) {
        self.counters.prefetches += 1;
        if self.cache.peek(fingerprint).is_none() {
            self.cache.prefetch(fingerprint, value);
        }
    }

    /// The cached value of `fingerprint`, without touching the cache policy or the disk.
    pub fn get_cached(&self, fingerprint: &Fingerprint) -> Option<u64> {
        self.cache.peek(fingerprint)
    }

    /// False when the filter proves `fingerprint` absent.
    pub fn may_contain(&self, fingerprint: &Fingerprint) -> bool {
        self.filter.may_contain(fingerprint)
    }

    /// Saves the filter's changed pages into the page store (when
    /// [`IndexOptions::persist_filter`] is set). Call it right before [`PageStore::checkpoint`];
    /// a checkpoint without it stays correct but makes the next open rebuild the filter.
    pub fn prepare_checkpoint(&mut self, pages: &mut PageStore) -> Result<()> {
        if self.options.persist_filter {
            filter::store::save(
                &mut self.filter,
                pages,
                self.filter_area,
                self.disk.change_count(),
            )?;
        }
        Ok(())
    }

    /// Replaces the filter with one built from the on-disk entries, sized for
    /// `max(expected_entries, entries x FILTER_GROWTH_FACTOR)`.
    pub fn rebuild_filter(&mut self, pages: &mut PageStore) -> Result<()> {
        self.counters.filter_rebuilds += 1;
        self.filter = build_filter(&self.options, &mut self.disk, pages)?;
        Ok(())
    }

    /// Empties the index: its areas are cleared and it starts again as a new, empty index
    /// (for rebuilds, which then insert every entry).
    pub fn clear(&mut self, pages: &mut PageStore) -> Result<()> {
        let prefix = self.disk.name_prefix().to_string();
        for area in [
            self.disk.buckets_area(),
            self.disk.directory_area(),
            self.filter_area,
        ] {
            pages.clear_area(area)?;
        }
        let counters = self.counters;
        *self = FingerprintIndex::open(pages, &prefix, self.options.clone())?;
        self.counters = counters;
        Ok(())
    }

    /// Calls `visit` for every stored entry's key and value (for rebuilds and `onecopy
    /// check`): the index stores keys, the first 16 bytes of fingerprints ([`IndexKey`]).
    pub fn for_each_entry(
        &mut self,
        pages: &mut PageStore,
        visit: impl FnMut(&IndexKey, u64),
    ) -> Result<()> {
        self.disk.for_each_entry(pages, visit)
    }

    /// Removes the entry of `key` (for repairs, which find stale entries by their key). The
    /// cache, which holds whole fingerprints, is emptied: its entries for this key cannot be
    /// named.
    pub fn remove_key(&mut self, pages: &mut PageStore, key: &IndexKey) -> Result<Option<u64>> {
        let removed = self.disk.remove_key(pages, key)?;
        if removed.is_some() {
            self.counters.removes += 1;
            if self.filter.supports_remove() {
                let forgotten = self.filter.remove(&key.probe());
                assert!(forgotten, "a stored key is in the filter");
            }
        }
        self.cache.clear();
        Ok(removed)
    }

    /// Checks the on-disk structure and that the filter holds every entry. Returns the number
    /// of entries. (Cached values are not compared: the cache holds whole fingerprints, the
    /// disk only their keys. Every hit is confirmed by its user against the whole
    /// fingerprint.)
    pub fn verify(&mut self, pages: &mut PageStore) -> Result<u64> {
        let entries = self.disk.verify(pages)?;
        let mut problem = None;
        let filter = &self.filter;
        self.disk.for_each_entry(pages, |key, _| {
            if problem.is_none() && !filter.may_contain(&key.probe()) {
                problem = Some(format!("key {key} is missing from the filter"));
            }
        })?;
        match problem {
            Some(detail) => Err(Error::corrupt("fingerprint index (in memory)", detail)),
            None => Ok(entries),
        }
    }

    /// Entries stored.
    pub fn len(&self) -> u64 {
        self.disk.len()
    }

    /// True when no entry is stored.
    pub fn is_empty(&self) -> bool {
        self.disk.is_empty()
    }

    /// The counters since open or the last reset.
    pub fn counters(&self) -> IndexCounters {
        IndexCounters {
            damaged_buckets_reset: self.disk.damaged_buckets_reset(),
            ..self.counters
        }
    }

    /// Sets every counter to zero (between phases of an experiment).
    pub fn reset_counters(&mut self) {
        self.counters = IndexCounters::default();
    }

    /// Memory held, by part.
    pub fn memory(&self) -> IndexMemory {
        IndexMemory {
            filter_bytes: self.filter.memory_bytes() as u64,
            cache_bytes: self.cache.memory_bytes() as u64,
            directory_bytes: self.disk.memory_bytes() as u64,
        }
    }

    /// Total memory held, in bytes.
    pub fn memory_bytes(&self) -> u64 {
        self.memory().total_bytes()
    }

    /// Forgets every cached entry (to start an experiment cold).
    pub fn clear_cache(&mut self) {
        self.cache.clear();
    }

    /// The options the index was opened with.
    pub fn options(&self) -> &IndexOptions {
        &self.options
    }

    /// Changes the injected latency (between phases of an experiment).
    pub fn set_latency_ns(&mut self, latency_ns: u64) -> Result<()> {
        let options = IndexOptions {
            latency_ns,
            ..self.options.clone()
        };
        options.validate()?;
        self.options = options;
        Ok(())
    }

    /// The on-disk part (depth, bucket pages, page reads).
    pub fn disk(&self) -> &DiskIndex {
        &self.disk
    }

    /// The filter.
    pub fn filter(&self) -> &Filter {
        &self.filter
    }

    /// The entry cache.
    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    fn pay_latency(&mut self) {
        let latency_ns = self.options.latency_ns;
        if latency_ns == 0 {
            return;
        }
        let deadline = Instant::now() + Duration::from_nanos(latency_ns);
        if latency_ns >= LATENCY_SLEEP_THRESHOLD_NS {
            std::thread::sleep(Duration::from_nanos(latency_ns - LATENCY_SPIN_MARGIN_NS));
        }
        // The thread's processor clock, not the wall clock: a spinning thread preempted on a
        // busy machine waits without using the processor.
        let spin_started = thread_cpu_ns();
        while Instant::now() < deadline {
            std::hint::spin_loop();
        }
        self.counters.injected_wait_busy_ns += thread_cpu_ns().saturating_sub(spin_started);
    }
}

/// Processor nanoseconds the calling thread has used.
fn thread_cpu_ns() -> u64 {
    let mut time = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into memory we own.
    let status = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut time) };
    assert_eq!(status, 0, "every thread has a processor clock");
    time.tv_sec as u64 * 1_000_000_000 + time.tv_nsec as u64
}

/// A filter holding every on-disk entry, sized as the module documentation says.
fn build_filter(
    options: &IndexOptions,
    disk: &mut DiskIndex,
    pages: &mut PageStore,
) -> Result<Filter> {
    let grown = (disk.len() as f64 * FILTER_GROWTH_FACTOR).ceil() as u64;
    let mut capacity = options.expected_entries.max(grown).max(1);
    loop {
        let mut filter = Filter::new(options.filter_kind, capacity, options.false_positive_rate)?;
        let mut placed_all = true;
        // The filters read only a key's bytes, so its probe stands for the fingerprint.
        disk.for_each_entry(pages, |key, _| {
            placed_all &= filter.insert(&key.probe());
        })?;
        // A cuckoo filter at two-thirds load almost never fails to place a tag; if it does,
        // a bigger one is tried rather than losing a fingerprint.
        if placed_all && !filter.needs_growth() {
            return Ok(filter);
        }
        capacity = capacity.checked_mul(2).ok_or_else(|| {
            Error::Limit(format!("a filter for {} entries is too large", disk.len()))
        })?;
    }
}

/// A [`BuildHasher`] for maps keyed by [`Fingerprint`]: fingerprints are uniformly random, so
/// their first eight bytes are the hash. Only for keys whose `Hash` writes such bytes first
/// (fingerprints, or tuples starting with one).
#[derive(Clone, Copy, Debug, Default)]
pub struct FingerprintBuildHasher;

impl BuildHasher for FingerprintBuildHasher {
    type Hasher = FingerprintHasher;

    #[inline]
    fn build_hasher(&self) -> FingerprintHasher {
        FingerprintHasher::default()
    }
}

/// The hasher of [`FingerprintBuildHasher`]: keeps the first eight bytes of the first write
/// of at least eight bytes; length prefixes and small writes are folded in cheaply.
#[derive(Clone, Copy, Debug, Default)]
pub struct FingerprintHasher {
    hash: u64,
    seeded: bool,
}

impl Hasher for FingerprintHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.hash
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        if !self.seeded && bytes.len() >= 8 {
            self.hash ^= u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
            self.seeded = true;
        } else {
            for &byte in bytes {
                self.hash = self.hash.rotate_left(8) ^ byte as u64;
            }
        }
    }

    #[inline]
    fn write_usize(&mut self, _length_prefix: usize) {
        // Slices and arrays write their length first; it carries no information here.
    }
}

#[cfg(test)]
mod tests;
