//! The page store: crash-safe metadata pages with copy-on-write checkpoints.
//!
//! Metadata that is too large for memory (block maps, the chunk table, the on-disk fingerprint
//! index) lives in fixed-size pages grouped into named *areas*. An area is an array of pages
//! addressed by page number; pages never written read as zeros.
//!
//! Changes are made to in-memory *dirty* pages. A [`PageStore::checkpoint`] makes all of them
//! durable at once by shadow paging:
//!
//! 1. every dirty page is written to a free *slot* of the `pages` file — never to a slot the
//!    last durable manifest refers to;
//! 2. the `pages` file is synced;
//! 3. a new *manifest* (every area's page table: slot and CRC-32C per page, plus an opaque
//!    user state) is written to whichever of `manifest.0`/`manifest.1` does not hold the current
//!    one, and synced;
//! 4. only then do the slots of the replaced pages become free for reuse.
//!
//! A crash at any point leaves the previous manifest and every slot it refers to intact, so
//! reopening finds the last completed checkpoint. Between checkpoints the owner records its
//! changes in a [`journal`](crate::journal) and replays them after a crash. A manifest with a
//! bad checksum (torn write) is ignored in favour of the other one; a page whose checksum does
//! not match its manifest entry is reported as [`Error::Corrupt`].
//!
//! Memory: page tables cost 4 bytes per page (the slot) and free slots 1 bit each; dirty pages
//! are held until the next checkpoint (the owner bounds them with
//! [`PageStore::dirty_page_count`]); clean pages are cached up to a fixed number of pages
//! ([`PageStoreOptions::cache_pages`]).
//!
//! A page's checksum is not held in memory: loading a clean page reads it from the durable
//! manifest, which is immutable until the next checkpoint (checkpoints write the *other*
//! manifest file) and which was verified whole when it was read at open or written. That
//! costs one small read per page loaded from the `pages` file, and halves the page tables,
//! which grow with the stored data (a block device at 4 KiB blocks has about one metadata
//! page per 32 chunks).

use std::collections::HashMap;
use std::sync::Arc;

use crate::integer_hash::IntegerBuildHasher;
use crate::storage::{join, Storage, StorageFile};
use crate::{Error, Result};

/// Bytes in a page (and in a slot of the `pages` file).
pub const PAGE_BYTES: usize = 4096;

/// One page of metadata.
pub type Page = [u8; PAGE_BYTES];

/// Identifies an area within a [`PageStore`]; returned by [`PageStore::area`].
pub type AreaId = usize;

const MANIFEST_MAGIC: &[u8; 8] = b"OCPAGES1";
const MANIFEST_HEADER_BYTES: usize = 32;
/// Largest manifest accepted when reading, so a corrupt length cannot exhaust memory.
const MANIFEST_BYTES_MAX: u64 = 1 << 32;
/// Slot number meaning "never written: reads as zeros".
const NO_SLOT: u32 = u32::MAX;
/// Largest number of slots (16 TiB of metadata pages).
const SLOTS_MAX: u32 = NO_SLOT - 1;

/// Tuning of a [`PageStore`].
#[derive(Clone, Copy, Debug)]
pub struct PageStoreOptions {
    /// Clean pages kept in memory (a hard limit).
    pub cache_pages: usize,
}

impl Default for PageStoreOptions {
    fn default() -> Self {
        // 16 MiB of clean pages.
        PageStoreOptions { cache_pages: 4096 }
    }
}

/// Bytes of one page-table entry in a manifest: slot and CRC-32C, little-endian.
const MANIFEST_ENTRY_BYTES: u64 = 8;

#[derive(Debug)]
struct Area {
    name: String,
    /// The slot of each page (or [`NO_SLOT`]). A page with a slot is clean unless it is also
    /// in `dirty`, and is in the durable manifest: its entry there holds its checksum.
    table: Vec<u32>,
    /// Where this area's entries start in the durable manifest file, and how many it has.
    manifest_entries_at: u64,
    manifest_pages: u64,
    dirty: HashMap<u64, Box<Page>, IntegerBuildHasher>,
    /// The owner holds this area decoded in memory: its pages are not kept in the clean
    /// cache, not even after a checkpoint wrote them ([`PageStore::set_uncached`]).
    uncached: bool,
}

impl Area {
    /// Pages that refer to a slot (ever written and not cleared).
    fn live_pages(&self) -> u64 {
        self.table.iter().filter(|&&slot| slot != NO_SLOT).count() as u64
    }

    fn new(name: String, table: Vec<u32>) -> Area {
        Area {
            name,
            table,
            manifest_entries_at: 0,
            manifest_pages: 0,
            dirty: HashMap::default(),
            uncached: false,
        }
    }
}

/// Free slots of the `pages` file, one bit each. A list of `u32` cost 4 bytes per free slot,
/// and a shadow-paged file keeps many: by the RAM benchmark's page-table figures, about one
/// for every two or three live pages.
#[derive(Debug, Default)]
struct FreeSlots {
    words: Vec<u64>,
    count: u64,
    /// No word below this one has a bit set.
    lowest_word: usize,
}

impl FreeSlots {
    fn insert(&mut self, slot: u32) {
        let (word, bit) = (slot as usize / 64, slot % 64);
        if self.words.len() <= word {
            self.words.resize(word + 1, 0);
        }
        assert!(
            self.words[word] & (1 << bit) == 0,
            "slot {slot} freed twice"
        );
        self.words[word] |= 1 << bit;
        self.count += 1;
        self.lowest_word = self.lowest_word.min(word);
    }

    /// Takes `slot` out of the free slots; false if it was not free.
    fn remove(&mut self, slot: u32) -> bool {
        let (word, bit) = (slot as usize / 64, slot % 64);
        match self.words.get_mut(word) {
            Some(bits) if *bits & (1 << bit) != 0 => {
                *bits &= !(1 << bit);
                self.count -= 1;
                true
            }
            _ => false,
        }
    }

    /// Takes the lowest free slot, so the file stays dense.
    fn take_lowest(&mut self) -> Option<u32> {
        if self.count == 0 {
            return None;
        }
        while self.words[self.lowest_word] == 0 {
            self.lowest_word += 1;
        }
        let word = &mut self.words[self.lowest_word];
        let bit = word.trailing_zeros();
        *word &= !(1 << bit);
        self.count -= 1;
        Some((self.lowest_word * 64) as u32 + bit)
    }

    fn memory_bytes(&self) -> usize {
        self.words.capacity() * 8
    }
}

/// Shadow-paged metadata pages; see the module documentation.
#[derive(Debug)]
pub struct PageStore {
    storage: Arc<dyn Storage>,
    directory: String,
    pages_file: Arc<dyn StorageFile>,
    manifests: [Arc<dyn StorageFile>; 2],
    areas: Vec<Area>,
    slot_count: u32,
    free_slots: FreeSlots,
    /// Which of `manifests` holds the durable manifest (meaningless before the first one).
    current_manifest: usize,
    /// Slots of pages dropped by [`clear_area`](PageStore::clear_area): still referenced by the
    /// durable manifest, so free only after the next checkpoint.
    released_slots: Vec<u32>,
    sequence: u64,
    cache: PageCache,
    /// Set when a checkpoint failed half way: the in-memory tables no longer match any durable
    /// manifest, so the store must be reopened.
    poisoned: bool,
    /// What each manifest file held at open.
    manifest_states: [ManifestState; 2],
    /// Opened without the right to write: checkpoints are refused.
    read_only: bool,
}

/// What a manifest file held when the store was opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ManifestState {
    /// Never written.
    Empty,
    /// Intact, from the checkpoint with this sequence number.
    Valid { sequence: u64 },
    /// Fails its checks: torn by a crash during a checkpoint, or damaged.
    Invalid { detail: String },
}

impl PageStore {
    /// Opens the page store in `directory`, creating it when it does not exist. Returns the
    /// store and the user state of the last checkpoint (empty for a new store).
    pub fn open(
        storage: Arc<dyn Storage>,
        directory: &str,
        options: PageStoreOptions,
    ) -> Result<(PageStore, Vec<u8>)> {
        Self::open_as(storage, directory, options, false)
    }

    /// Opens an existing page store without writing anything: checkpoints are refused, and a
    /// missing store is [`Error::NotFound`]. For checks, and for reading a repository whose
    /// disk is full.
    pub fn open_read_only(
        storage: Arc<dyn Storage>,
        directory: &str,
        options: PageStoreOptions,
    ) -> Result<(PageStore, Vec<u8>)> {
        Self::open_as(storage, directory, options, true)
    }

    fn open_as(
        storage: Arc<dyn Storage>,
        directory: &str,
        options: PageStoreOptions,
        read_only: bool,
    ) -> Result<(PageStore, Vec<u8>)> {
        assert!(
            options.cache_pages > 0,
            "the page cache needs room for a page"
        );
        let manifest_names = [join(directory, "manifest.0"), join(directory, "manifest.1")];
        // A missing file is created when writing; read-only, it stands in as an absent file
        // whose every byte is missing, so a deleted file reads as damage, not as "never used".
        let mut created = false;
        let mut open = |name: &str| -> Result<(Arc<dyn StorageFile>, bool)> {
            if storage.exists(name)? {
                return Ok((storage.open(name, false)?, false));
            }
            if read_only {
                return Ok((Arc::new(AbsentFile::new(name, storage.as_ref())), true));
            }
            created = true;
            Ok((storage.open(name, true)?, true))
        };
        let (pages_file, _) = open(&join(directory, "pages"))?;
        let (manifest_0, missing_0) = open(&manifest_names[0])?;
        let (manifest_1, missing_1) = open(&manifest_names[1])?;
        if created {
            storage.sync_directory(directory)?;
        }
        let manifests = [manifest_0, manifest_1];
        // Creation writes a valid empty manifest before anything else, and pages only after
        // it, so a store is new only when both manifests and the pages file are empty; any
        // other store without a valid manifest is corruption.
        let fresh = manifests[0].len()? == 0 && manifests[1].len()? == 0 && pages_file.len()? == 0;
        let mut store = PageStore {
            storage,
            directory: directory.to_string(),
            pages_file,
            manifests,
            areas: Vec::new(),
            slot_count: 0,
            free_slots: FreeSlots::default(),
            current_manifest: 0,
            released_slots: Vec::new(),
            sequence: 0,
            cache: PageCache::new(options.cache_pages),
            poisoned: false,
            manifest_states: [ManifestState::Empty, ManifestState::Empty],
            read_only,
        };
        let user_state = match store.read_newest_manifest([missing_0, missing_1])? {
            Some(manifest) => {
                store.sequence = manifest.sequence;
                store.current_manifest = manifest.file;
                store.slot_count = manifest.slot_count;
                store.areas = manifest.areas;
                store.rebuild_free_slots()?;
                manifest.user_state
            }
            None if fresh && read_only => {
                return Err(Error::NotFound(format!(
                    "a checkpoint of page store {}",
                    store.describe()
                )))
            }
            None if fresh => {
                let (empty, _) = store.encode_manifest(0, &[], |_, _| None)?;
                store.manifests[0].write_at(0, &empty)?;
                store.manifests[0].sync_data()?;
                store.storage.sync_directory(directory)?;
                Vec::new()
            }
            None => {
                return Err(Error::corrupt(
                    format!("{} and {}", manifest_names[0], manifest_names[1]),
                    format!(
                        "neither manifest holds a valid checkpoint ({}; {}), but the page \
                         store {} holds pages",
                        store.manifest_states[0].describe(),
                        store.manifest_states[1].describe(),
                        store.describe()
                    ),
                ))
            }
        };
        Ok((store, user_state))
    }

    /// The id of the area called `name`, creating it (empty) if it does not exist yet. An area
    /// created here becomes durable with the next checkpoint.
    pub fn area(&mut self, name: &str) -> AreaId {
        assert!(!name.is_empty() && name.len() <= u16::MAX as usize);
        if let Some(id) = self.areas.iter().position(|area| area.name == name) {
            return id;
        }
        self.areas.push(Area::new(name.to_string(), Vec::new()));
        self.areas.len() - 1
    }

    /// Keeps the pages of `area` out of the clean cache: the owner holds the area decoded (a
    /// filter, a directory) and reads it with [`read_once`](Self::read_once), so cached pages
    /// would be a second copy. Without this, the pages a checkpoint wrote stayed cached: a
    /// block server that saved its whole filter at open held it twice.
    pub fn set_uncached(&mut self, area: AreaId) {
        self.areas[area].uncached = true;
        let pages = self.page_count(area);
        for page in 0..pages {
            self.cache.remove((area, page));
        }
    }

    /// Page `page` of `area` for modification, zeroed: for an owner that rewrites the whole
    /// page, which then need not be read. It becomes dirty like [`write`](Self::write)'s.
    pub fn overwrite(&mut self, area: AreaId, page: u64) -> Result<&mut Page> {
        self.check_usable()?;
        self.cache.remove((area, page));
        let dirty = self.areas[area]
            .dirty
            .entry(page)
            .or_insert_with(|| Box::new([0u8; PAGE_BYTES]));
        dirty.fill(0);
        Ok(dirty)
    }

    /// Pages in `area` (one past the highest page ever written).
    pub fn page_count(&self, area: AreaId) -> u64 {
        let area = &self.areas[area];
        let dirty_end = area.dirty.keys().max().map_or(0, |&page| page + 1);
        (area.table.len() as u64).max(dirty_end)
    }

    /// Dirty pages waiting for the next checkpoint, over all areas.
    pub fn dirty_page_count(&self) -> usize {
        self.areas.iter().map(|area| area.dirty.len()).sum()
    }

    /// Reads page `page` of `area`. Pages never written read as zeros.
    pub fn read(&mut self, area: AreaId, page: u64) -> Result<&Page> {
        self.check_usable()?;
        if self.areas[area].dirty.contains_key(&page) {
            return Ok(&self.areas[area].dirty[&page]);
        }
        let key = (area, page);
        if !self.cache.contains(key) {
            let loaded = self.load(area, page)?;
            self.cache.insert(key, loaded);
        }
        Ok(self.cache.get(key).expect("just inserted"))
    }

    /// Page `page` of `area` if it is in memory (dirty or cached), without loading it or
    /// counting it as used: for warming ([`crate::index::warm`]).
    pub fn resident(&self, area: AreaId, page: u64) -> Option<&Page> {
        match self.areas[area].dirty.get(&page) {
            Some(dirty) => Some(dirty),
            None => self.cache.peek((area, page)),
        }
    }

    /// Reads page `page` of `area` for a scan that reads each page once (loading a saved
    /// filter, visiting every index entry): a page not already in memory is read, verified
    /// and dropped, not kept in the clean cache. Through [`read`](Self::read), loading a
    /// saved filter kept a second copy of the filter in the cache, and a reopened block
    /// server's memory grew with the data at twice the rate of what it uses.
    pub fn read_once<R>(
        &mut self,
        area: AreaId,
        page: u64,
        visit: impl FnOnce(&Page) -> R,
    ) -> Result<R> {
        self.check_usable()?;
        if let Some(dirty) = self.areas[area].dirty.get(&page) {
            return Ok(visit(dirty));
        }
        if let Some(cached) = self.cache.get((area, page)) {
            return Ok(visit(cached));
        }
        let loaded = self.load(area, page)?;
        Ok(visit(&loaded))
    }

    /// Page `page` of `area` for modification; it becomes dirty and is written at the next
    /// checkpoint.
    pub fn write(&mut self, area: AreaId, page: u64) -> Result<&mut Page> {
        self.check_usable()?;
        if !self.areas[area].dirty.contains_key(&page) {
            let current = match self.cache.remove((area, page)) {
                Some(cached) => cached,
                None => self.load(area, page)?,
            };
            self.areas[area].dirty.insert(page, current);
        }
        Ok(self.areas[area]
            .dirty
            .get_mut(&page)
            .expect("dirty page present"))
    }

    /// Drops every page of `area`: it reads as zeros from now on, and its slots are reused
    /// after the next checkpoint.
    pub fn clear_area(&mut self, area: AreaId) -> Result<()> {
        self.check_usable()?;
        let pages = self.page_count(area);
        let cleared = &mut self.areas[area];
        cleared.dirty.clear();
        for slot in cleared.table.drain(..) {
            if slot != NO_SLOT {
                self.released_slots.push(slot);
            }
        }
        for page in 0..pages {
            self.cache.remove((area, page));
        }
        Ok(())
    }

    /// What each manifest file held when the store was opened.
    pub fn manifest_states(&self) -> &[ManifestState; 2] {
        &self.manifest_states
    }

    /// The storage name of manifest file `index` (0 or 1).
    pub fn manifest_name(&self, index: usize) -> &str {
        self.manifests[index].name()
    }

    /// Which manifest file holds the checkpoint the store was opened at (or last wrote).
    pub fn current_manifest(&self) -> usize {
        self.current_manifest
    }

    /// True when opened with [`open_read_only`](Self::open_read_only).
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// Makes every dirty page and `user_state` durable as one atomic step (see the module
    /// documentation). On error the store is poisoned and must be reopened.
    pub fn checkpoint(&mut self, user_state: &[u8]) -> Result<()> {
        self.check_usable()?;
        if self.read_only {
            return Err(Error::InvalidArgument(format!(
                "page store {} is open read-only",
                self.describe()
            )));
        }
        let result = self.checkpoint_unchecked(user_state);
        if result.is_err() {
            self.poisoned = true;
        }
        result
    }

    /// The sequence number of the last durable checkpoint (0 for a new store).
    pub fn sequence(&self) -> u64 {
        self.sequence
    }

    /// Counts of pages, for statistics and checks: (live pages, slots in the file, free slots).
    pub fn slot_usage(&self) -> (u64, u64, u64) {
        let live = self.areas.iter().map(Area::live_pages).sum();
        (live, self.slot_count as u64, self.free_slots.count)
    }

    /// Page-table use of each area, in the order the areas were opened.
    pub fn area_usage(&self) -> Vec<AreaUsage> {
        self.areas
            .iter()
            .map(|area| AreaUsage {
                name: area.name.clone(),
                table_pages: area.table.len() as u64,
                live_pages: area.live_pages(),
            })
            .collect()
    }

    /// Bytes of page tables and the free-slot list: the part of [`memory_bytes`] that grows
    /// with the metadata, as opposed to the dirty pages and the clean cache.
    ///
    /// [`memory_bytes`]: PageStore::memory_bytes
    pub fn table_bytes(&self) -> u64 {
        let tables: usize = self
            .areas
            .iter()
            .map(|area| area.table.capacity() * std::mem::size_of::<u32>())
            .sum();
        (tables + self.free_slots.memory_bytes()) as u64
    }

    /// Bytes of memory held by page tables, dirty pages and the clean cache.
    pub fn memory_bytes(&self) -> u64 {
        let pages = (self.dirty_page_count() + self.cache.len()) * PAGE_BYTES;
        self.table_bytes() + pages as u64
    }

    /// Reads and verifies every durable page that is not dirty, past the clean cache, and
    /// returns how many were checked and which failed: (area name, page, what is wrong).
    /// Only I/O errors other than damage stop it.
    pub fn verify(&mut self) -> Result<(u64, Vec<DamagedPage>)> {
        let mut checked = 0;
        let mut damaged = Vec::new();
        for area in 0..self.areas.len() {
            for page in 0..self.areas[area].table.len() as u64 {
                if self.areas[area].table[page as usize] == NO_SLOT
                    || self.areas[area].dirty.contains_key(&page)
                {
                    continue;
                }
                checked += 1;
                match self.load(area, page) {
                    Ok(_) => {}
                    Err(error) if error.is_corrupt() => damaged.push(DamagedPage {
                        area: self.areas[area].name.clone(),
                        page,
                        detail: error.to_string(),
                    }),
                    Err(error) => return Err(error),
                }
            }
        }
        Ok((checked, damaged))
    }

    /// Where page `page` of the area called `name` is stored: its byte offset in the
    /// `pages` file, or `None` when it has no durable copy. For fault-injection tests and
    /// tools that need to name a page's bytes.
    pub fn page_offset(&self, name: &str, page: u64) -> Option<u64> {
        let area = self.find_area(name)?;
        let slot = *self.areas[area].table.get(page as usize)?;
        (slot != NO_SLOT).then_some(slot as u64 * PAGE_BYTES as u64)
    }

    /// The area called `name`, if it exists.
    pub fn find_area(&self, name: &str) -> Option<AreaId> {
        self.areas.iter().position(|area| area.name == name)
    }

    fn describe(&self) -> String {
        format!("{} in {}", self.directory, self.storage.describe())
    }

    fn check_usable(&self) -> Result<()> {
        if self.poisoned {
            Err(Error::io(
                format!("page store {}", self.describe()),
                std::io::Error::other("an earlier checkpoint failed; reopen the repository"),
            ))
        } else {
            Ok(())
        }
    }

    fn load(&self, area: AreaId, page: u64) -> Result<Box<Page>> {
        let slot = self.areas[area]
            .table
            .get(page as usize)
            .copied()
            .unwrap_or(NO_SLOT);
        let mut buffer: Box<Page> = Box::new([0u8; PAGE_BYTES]);
        if slot == NO_SLOT {
            return Ok(buffer);
        }
        let expected = self.durable_checksum(area, page, slot)?;
        self.pages_file
            .read_at(slot as u64 * PAGE_BYTES as u64, &mut buffer[..])?;
        let checksum = crc32c::crc32c(&buffer[..]);
        if checksum != expected {
            return Err(Error::corrupt(
                format!(
                    "page {page} of area {} (slot {slot}) in {}",
                    self.areas[area].name,
                    self.describe()
                ),
                format!("checksum {checksum:08x} does not match the manifest's {expected:08x}"),
            ));
        }
        Ok(buffer)
    }

    /// The checksum of clean page `page` of `area`, stored in `slot`, from its entry in the
    /// durable manifest (see the module documentation).
    fn durable_checksum(&self, area: AreaId, page: u64, slot: u32) -> Result<u32> {
        let held = &self.areas[area];
        // Clean pages with a slot got it at a checkpoint, so the durable manifest lists them.
        assert!(
            page < held.manifest_pages,
            "page {page} of area {} has slot {slot} but is not in the durable manifest",
            held.name
        );
        let mut entry = [0u8; MANIFEST_ENTRY_BYTES as usize];
        self.manifests[self.current_manifest].read_at(
            held.manifest_entries_at + page * MANIFEST_ENTRY_BYTES,
            &mut entry,
        )?;
        self.durable_entry_checksum(area, page, slot, &entry)
    }

    /// The checksum in `entry`, page `page`'s entry in the durable manifest, after checking
    /// that it lists `slot`, the slot in memory. The manifest was verified whole and is never
    /// rewritten while durable, so a different slot means the file changed under us.
    fn durable_entry_checksum(
        &self,
        area: AreaId,
        page: u64,
        slot: u32,
        entry: &[u8],
    ) -> Result<u32> {
        let listed = u32::from_le_bytes(entry[..4].try_into().expect("4 bytes"));
        if listed != slot {
            return Err(Error::corrupt(
                format!("manifest {}", self.manifests[self.current_manifest].name()),
                format!(
                    "page {page} of area {} is listed in slot {listed}, not {slot}; the file \
                     changed after it was verified",
                    self.areas[area].name
                ),
            ));
        }
        Ok(u32::from_le_bytes(entry[4..8].try_into().expect("4 bytes")))
    }

    fn allocate_slot(&mut self) -> Result<u32> {
        if let Some(slot) = self.free_slots.take_lowest() {
            return Ok(slot);
        }
        if self.slot_count >= SLOTS_MAX {
            return Err(Error::Limit(format!(
                "page store {} holds the maximum of {SLOTS_MAX} pages",
                self.describe()
            )));
        }
        self.slot_count += 1;
        Ok(self.slot_count - 1)
    }

    fn checkpoint_unchecked(&mut self, user_state: &[u8]) -> Result<()> {
        let mut replaced_slots = Vec::new();
        let mut written_checksums = HashMap::new();
        let mut wrote_pages = false;
        for area_id in 0..self.areas.len() {
            let mut dirty: Vec<(u64, Box<Page>)> = self.areas[area_id].dirty.drain().collect();
            dirty.sort_unstable_by_key(|(page, _)| *page);
            for (page, content) in dirty {
                let slot = self.allocate_slot()?;
                self.pages_file
                    .write_at(slot as u64 * PAGE_BYTES as u64, &content[..])?;
                wrote_pages = true;
                let table = &mut self.areas[area_id].table;
                if table.len() <= page as usize {
                    table.resize(page as usize + 1, NO_SLOT);
                }
                let old = std::mem::replace(&mut table[page as usize], slot);
                if old != NO_SLOT {
                    replaced_slots.push(old);
                }
                written_checksums.insert((area_id, page), crc32c::crc32c(&content[..]));
                if !self.areas[area_id].uncached {
                    self.cache.insert((area_id, page), content);
                }
            }
        }
        if wrote_pages {
            self.pages_file.sync_data()?;
        }
        let (manifest, entries_at) =
            self.encode_manifest(self.sequence + 1, user_state, |area, page| {
                written_checksums.get(&(area, page)).copied()
            })?;
        let target_file = ((self.sequence + 1) % 2) as usize;
        let target = &self.manifests[target_file];
        target.write_at(0, &manifest)?;
        target.set_len(manifest.len() as u64)?;
        target.sync_data()?;
        self.sequence += 1;
        self.current_manifest = target_file;
        for (area, at) in self.areas.iter_mut().zip(entries_at) {
            area.manifest_entries_at = at;
            area.manifest_pages = area.table.len() as u64;
        }
        // The new manifest is durable: nothing durable refers to the replaced slots any more.
        for slot in replaced_slots
            .into_iter()
            .chain(self.released_slots.drain(..))
        {
            self.free_slots.insert(slot);
        }
        Ok(())
    }

    /// The manifest for `sequence` and, per area, the offset of its first page-table entry in
    /// it. Checksums come from `written` for pages this checkpoint wrote, and from the durable
    /// manifest for the others (read in runs, one read per area).
    fn encode_manifest(
        &self,
        sequence: u64,
        user_state: &[u8],
        written: impl Fn(AreaId, u64) -> Option<u32>,
    ) -> Result<(Vec<u8>, Vec<u64>)> {
        let mut body = Vec::new();
        let mut entries_at = Vec::with_capacity(self.areas.len());
        body.extend_from_slice(&self.slot_count.to_le_bytes());
        body.extend_from_slice(&(self.areas.len() as u32).to_le_bytes());
        for (area_id, area) in self.areas.iter().enumerate() {
            body.extend_from_slice(&(area.name.len() as u16).to_le_bytes());
            body.extend_from_slice(area.name.as_bytes());
            body.extend_from_slice(&(area.table.len() as u64).to_le_bytes());
            entries_at.push((MANIFEST_HEADER_BYTES + body.len()) as u64);
            // The durable entries of this area: the checksums of its unchanged pages.
            let durable_pages = area.manifest_pages.min(area.table.len() as u64);
            let mut durable = vec![0u8; (durable_pages * MANIFEST_ENTRY_BYTES) as usize];
            if durable_pages > 0 {
                self.manifests[self.current_manifest]
                    .read_at(area.manifest_entries_at, &mut durable)?;
            }
            for (page, &slot) in area.table.iter().enumerate() {
                let page = page as u64;
                let checksum = if slot == NO_SLOT {
                    0
                } else if let Some(checksum) = written(area_id, page) {
                    checksum
                } else {
                    assert!(
                        page < durable_pages,
                        "a clean page is in the durable manifest"
                    );
                    let entry = &durable[(page * MANIFEST_ENTRY_BYTES) as usize..]
                        [..MANIFEST_ENTRY_BYTES as usize];
                    self.durable_entry_checksum(area_id, page, slot, entry)?
                };
                body.extend_from_slice(&slot.to_le_bytes());
                body.extend_from_slice(&checksum.to_le_bytes());
            }
        }
        body.extend_from_slice(&(user_state.len() as u32).to_le_bytes());
        body.extend_from_slice(user_state);

        let mut manifest = Vec::with_capacity(MANIFEST_HEADER_BYTES + body.len());
        manifest.extend_from_slice(MANIFEST_MAGIC);
        manifest.extend_from_slice(&sequence.to_le_bytes());
        manifest.extend_from_slice(&(body.len() as u64).to_le_bytes());
        manifest.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        manifest.extend_from_slice(&[0u8; 4]);
        debug_assert_eq!(manifest.len(), MANIFEST_HEADER_BYTES);
        manifest.extend_from_slice(&body);
        Ok((manifest, entries_at))
    }

    /// Reads both manifests and returns the newest valid one. `missing` tells which files did
    /// not exist: once a checkpoint of sequence 1 or later exists both files have been written,
    /// so an empty or missing one is damage, not a store that never wrote it.
    fn read_newest_manifest(&mut self, missing: [bool; 2]) -> Result<Option<Manifest>> {
        let mut newest: Option<Manifest> = None;
        for (index, file) in self.manifests.iter().enumerate() {
            // A torn or empty manifest is expected after a crash; the other one is used. The
            // owner tells a torn one from a damaged one (it knows its journals) from
            // `manifest_states`.
            self.manifest_states[index] = match read_manifest(file.as_ref(), index)? {
                Ok(manifest) => {
                    let state = ManifestState::Valid {
                        sequence: manifest.sequence,
                    };
                    if newest
                        .as_ref()
                        .is_none_or(|current| manifest.sequence > current.sequence)
                    {
                        newest = Some(manifest);
                    }
                    state
                }
                Err(None) => ManifestState::Empty,
                Err(Some(detail)) => ManifestState::Invalid { detail },
            };
        }
        if newest
            .as_ref()
            .is_some_and(|manifest| manifest.sequence >= 1)
        {
            for (state, missing) in self.manifest_states.iter_mut().zip(missing) {
                if *state == ManifestState::Empty {
                    *state = ManifestState::Invalid {
                        detail: if missing {
                            "the file is missing".to_string()
                        } else {
                            "the file is empty".to_string()
                        },
                    };
                }
            }
        }
        Ok(newest)
    }

    fn rebuild_free_slots(&mut self) -> Result<()> {
        // Every slot starts free; each one a page uses is taken out, once.
        let mut free = FreeSlots::default();
        for slot in 0..self.slot_count {
            free.insert(slot);
        }
        for area in &self.areas {
            for &slot in &area.table {
                if slot == NO_SLOT {
                    continue;
                }
                if slot >= self.slot_count {
                    return Err(Error::corrupt(
                        format!("manifest of {}", self.describe()),
                        format!("slot {slot} is beyond the slot count"),
                    ));
                }
                if !free.remove(slot) {
                    return Err(Error::corrupt(
                        format!("manifest of {}", self.describe()),
                        format!("slot {slot} is used twice"),
                    ));
                }
            }
        }
        self.free_slots = free;
        Ok(())
    }
}

impl ManifestState {
    /// The state in words, for messages.
    pub fn describe(&self) -> String {
        match self {
            ManifestState::Empty => "empty".to_string(),
            ManifestState::Valid { sequence } => format!("valid, sequence {sequence}"),
            ManifestState::Invalid { detail } => detail.clone(),
        }
    }
}

/// A file of a store opened read-only that does not exist: empty, and any read of it is
/// damage, as a read past the end of any file is.
#[derive(Debug)]
struct AbsentFile {
    name: String,
    described: String,
}

impl AbsentFile {
    fn new(name: &str, storage: &dyn Storage) -> AbsentFile {
        AbsentFile {
            name: name.to_string(),
            described: format!("{name} in {}", storage.describe()),
        }
    }

    fn refused(&self) -> Error {
        Error::InvalidArgument(format!(
            "{} does not exist and the store is open read-only",
            self.described
        ))
    }
}

impl StorageFile for AbsentFile {
    fn len(&self) -> Result<u64> {
        Ok(0)
    }

    fn read_at(&self, offset: u64, buffer: &mut [u8]) -> Result<()> {
        if buffer.is_empty() {
            return Ok(());
        }
        Err(Error::corrupt(
            format!("file {}", self.described),
            format!(
                "{} bytes at offset {offset} are missing: the file does not exist",
                buffer.len()
            ),
        ))
    }

    fn write_at(&self, _offset: u64, _data: &[u8]) -> Result<()> {
        Err(self.refused())
    }

    fn set_len(&self, _length: u64) -> Result<()> {
        Err(self.refused())
    }

    fn sync_data(&self) -> Result<()> {
        Ok(())
    }

    fn name(&self) -> &str {
        &self.name
    }
}

/// A page that failed its checksum ([`PageStore::verify`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DamagedPage {
    pub area: String,
    pub page: u64,
    pub detail: String,
}

/// Page-table use of one area ([`PageStore::area_usage`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct AreaUsage {
    pub name: String,
    /// Entries in the area's page table (pages up to the highest one written).
    pub table_pages: u64,
    /// Entries that refer to a slot (pages ever written and not cleared).
    pub live_pages: u64,
}

struct Manifest {
    /// Which manifest file (0 or 1) it was read from.
    file: usize,
    sequence: u64,
    slot_count: u32,
    areas: Vec<Area>,
    user_state: Vec<u8>,
}

/// The manifest in `file`; `Err(None)` when the file is empty, `Err(Some(why))` when it fails
/// its checks.
type ManifestRead = std::result::Result<Manifest, Option<String>>;

fn read_manifest(file: &dyn StorageFile, index: usize) -> Result<ManifestRead> {
    let length = file.len()?;
    if length == 0 {
        return Ok(Err(None));
    }
    if length < MANIFEST_HEADER_BYTES as u64 || length > MANIFEST_BYTES_MAX {
        return Ok(Err(Some(format!("{length} bytes long"))));
    }
    let mut header = [0u8; MANIFEST_HEADER_BYTES];
    file.read_at(0, &mut header)?;
    if &header[..8] != MANIFEST_MAGIC {
        return Ok(Err(Some("no manifest header at offset 0".to_string())));
    }
    let sequence = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
    let body_length = u64::from_le_bytes(header[16..24].try_into().expect("8 bytes"));
    let checksum = u32::from_le_bytes(header[24..28].try_into().expect("4 bytes"));
    if body_length != length - MANIFEST_HEADER_BYTES as u64 {
        return Ok(Err(Some(format!(
            "the header (offset 16) states a body of {body_length} bytes, the file holds {}",
            length - MANIFEST_HEADER_BYTES as u64
        ))));
    }
    let mut body = vec![0u8; body_length as usize];
    file.read_at(MANIFEST_HEADER_BYTES as u64, &mut body)?;
    if crc32c::crc32c(&body) != checksum {
        return Ok(Err(Some(format!(
            "the body (bytes {MANIFEST_HEADER_BYTES}..{length}) fails its checksum"
        ))));
    }
    // The checksum matched, so a decoding failure means a bug or deliberate tampering.
    decode_manifest_body(index, sequence, &body)
        .map(Ok)
        .ok_or_else(|| Error::corrupt(format!("manifest {}", file.name()), "malformed body"))
}

fn decode_manifest_body(file: usize, sequence: u64, body: &[u8]) -> Option<Manifest> {
    let mut reader = ByteReader { bytes: body };
    let slot_count = reader.u32()?;
    let area_count = reader.u32()?;
    let mut areas = Vec::new();
    for _ in 0..area_count {
        let name_length = reader.u16()? as usize;
        let name = String::from_utf8(reader.take(name_length)?.to_vec()).ok()?;
        let page_count = reader.u64()?;
        if page_count > (reader.bytes.len() / 8) as u64 {
            return None;
        }
        let entries_at = (MANIFEST_HEADER_BYTES + body.len() - reader.bytes.len()) as u64;
        let mut table = Vec::with_capacity(page_count as usize);
        for _ in 0..page_count {
            table.push(reader.u32()?);
            // The checksum stays in the file (see the module documentation).
            reader.u32()?;
        }
        let mut area = Area::new(name, table);
        area.manifest_entries_at = entries_at;
        area.manifest_pages = page_count;
        areas.push(area);
    }
    let user_length = reader.u32()? as usize;
    let user_state = reader.take(user_length)?.to_vec();
    if !reader.bytes.is_empty() {
        return None;
    }
    Some(Manifest {
        file,
        sequence,
        slot_count,
        areas,
        user_state,
    })
}

/// Little-endian decoding of a byte slice that reports truncation as `None`.
pub struct ByteReader<'a> {
    pub bytes: &'a [u8],
}

impl<'a> ByteReader<'a> {
    pub fn take(&mut self, count: usize) -> Option<&'a [u8]> {
        if self.bytes.len() < count {
            return None;
        }
        let (head, tail) = self.bytes.split_at(count);
        self.bytes = tail;
        Some(head)
    }
    pub fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }
    pub fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    pub fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

/// A fixed-capacity cache of clean pages with CLOCK replacement.
#[derive(Debug)]
struct PageCache {
    capacity: usize,
    positions: HashMap<(AreaId, u64), usize, IntegerBuildHasher>,
    entries: Vec<CacheEntry>,
    hand: usize,
}

#[derive(Debug)]
struct CacheEntry {
    key: (AreaId, u64),
    page: Box<Page>,
    referenced: bool,
}

impl PageCache {
    fn new(capacity: usize) -> Self {
        PageCache {
            capacity,
            positions: HashMap::default(),
            entries: Vec::new(),
            hand: 0,
        }
    }

    fn len(&self) -> usize {
        self.entries.len()
    }

    fn contains(&self, key: (AreaId, u64)) -> bool {
        self.positions.contains_key(&key)
    }

    /// The page, without counting it as used.
    fn peek(&self, key: (AreaId, u64)) -> Option<&Page> {
        let position = *self.positions.get(&key)?;
        Some(&self.entries[position].page)
    }

    fn get(&mut self, key: (AreaId, u64)) -> Option<&Page> {
        let position = *self.positions.get(&key)?;
        let entry = &mut self.entries[position];
        entry.referenced = true;
        Some(&entry.page)
    }

    fn insert(&mut self, key: (AreaId, u64), page: Box<Page>) {
        if let Some(&position) = self.positions.get(&key) {
            self.entries[position].page = page;
            return;
        }
        if self.entries.len() < self.capacity {
            self.positions.insert(key, self.entries.len());
            self.entries.push(CacheEntry {
                key,
                page,
                referenced: false,
            });
            return;
        }
        // CLOCK: clear reference bits until an unreferenced entry comes under the hand.
        loop {
            self.hand %= self.entries.len();
            let entry = &mut self.entries[self.hand];
            if entry.referenced {
                entry.referenced = false;
                self.hand += 1;
                continue;
            }
            self.positions.remove(&entry.key);
            self.positions.insert(key, self.hand);
            *entry = CacheEntry {
                key,
                page,
                referenced: false,
            };
            self.hand += 1;
            return;
        }
    }

    fn remove(&mut self, key: (AreaId, u64)) -> Option<Box<Page>> {
        let position = self.positions.remove(&key)?;
        let entry = self.entries.swap_remove(position);
        if position < self.entries.len() {
            let moved = self.entries[position].key;
            self.positions.insert(moved, position);
        }
        Some(entry.page)
    }
}

/// An array of fixed-size records stored in one area of a [`PageStore`]. Records never span
/// pages; record `i` lives in page `i / records_per_page`.
#[derive(Clone, Copy, Debug)]
pub struct RecordArea {
    area: AreaId,
    record_bytes: usize,
    records_per_page: u64,
}

impl RecordArea {
    /// Records of `record_bytes` bytes in `area`.
    pub fn new(area: AreaId, record_bytes: usize) -> Self {
        assert!(record_bytes > 0 && record_bytes <= PAGE_BYTES);
        RecordArea {
            area,
            record_bytes,
            records_per_page: (PAGE_BYTES / record_bytes) as u64,
        }
    }

    /// Records that fit one page.
    pub fn records_per_page(&self) -> u64 {
        self.records_per_page
    }

    /// The bytes of record `index` (zeros if never written).
    pub fn get<'a>(&self, pages: &'a mut PageStore, index: u64) -> Result<&'a [u8]> {
        let (page, start) = self.locate(index);
        let page = pages.read(self.area, page)?;
        Ok(&page[start..start + self.record_bytes])
    }

    /// The bytes of record `index` if its page is in memory, without loading it or counting
    /// it as used: for warming ([`PageStore::resident`]).
    pub fn resident<'a>(&self, pages: &'a PageStore, index: u64) -> Option<&'a [u8]> {
        let (page, start) = self.locate(index);
        let page = pages.resident(self.area, page)?;
        Some(&page[start..start + self.record_bytes])
    }

    /// The bytes of record `index` for modification.
    pub fn get_mut<'a>(&self, pages: &'a mut PageStore, index: u64) -> Result<&'a mut [u8]> {
        let (page, start) = self.locate(index);
        let page = pages.write(self.area, page)?;
        Ok(&mut page[start..start + self.record_bytes])
    }

    fn locate(&self, index: u64) -> (u64, usize) {
        let page = index / self.records_per_page;
        let start = (index % self.records_per_page) as usize * self.record_bytes;
        (page, start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{CrashMode, SimulatedStorage};
    use std::collections::BTreeMap;

    fn fill(pages: &mut PageStore, area: AreaId, page: u64, byte: u8) {
        pages.write(area, page).unwrap().fill(byte);
    }

    /// Goal: pages round-trip through checkpoints and reopening; unwritten pages read as zero.
    #[test]
    fn checkpoint_and_reopen() {
        let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
        let options = PageStoreOptions { cache_pages: 2 };
        let (mut pages, state) = PageStore::open(storage.clone(), "meta", options).unwrap();
        assert!(state.is_empty());
        let maps = pages.area("maps");
        let other = pages.area("other");
        for page in 0..10 {
            fill(&mut pages, maps, page, page as u8 + 1);
        }
        fill(&mut pages, other, 3, 0xee);
        pages.checkpoint(b"state one").unwrap();
        fill(&mut pages, maps, 2, 0x77);
        pages.checkpoint(b"state two").unwrap();

        let (mut reopened, state) = PageStore::open(storage, "meta", options).unwrap();
        assert_eq!(state, b"state two");
        let maps = reopened.area("maps");
        let other = reopened.area("other");
        assert_eq!(reopened.page_count(maps), 10);
        assert_eq!(reopened.read(maps, 2).unwrap()[0], 0x77);
        assert_eq!(reopened.read(maps, 9).unwrap()[100], 10);
        assert_eq!(reopened.read(other, 3).unwrap()[5], 0xee);
        assert_eq!(reopened.read(other, 0).unwrap()[5], 0);
        assert_eq!(reopened.read(maps, 1000).unwrap()[0], 0);
        // Rewriting page 2 freed its first slot; it is reused rather than growing the file.
        let (live, slots, free) = reopened.slot_usage();
        assert_eq!((live, slots, free), (11, 12, 1));
        assert_eq!(reopened.verify().unwrap(), (live, Vec::new()));
    }

    /// Goal: a flipped bit in a stored page is reported as corruption, not returned as data.
    #[test]
    fn corrupt_pages_are_detected() {
        let storage = SimulatedStorage::new();
        let shared: Arc<dyn Storage> = Arc::new(storage.clone());
        let (mut pages, _) =
            PageStore::open(shared.clone(), "meta", PageStoreOptions::default()).unwrap();
        let area = pages.area("a");
        fill(&mut pages, area, 0, 1);
        pages.checkpoint(b"").unwrap();
        let file = shared.open("meta/pages", false).unwrap();
        file.write_at(17, &[0xff]).unwrap();
        let (mut reopened, _) =
            PageStore::open(shared, "meta", PageStoreOptions::default()).unwrap();
        let area = reopened.area("a");
        assert!(reopened.read(area, 0).unwrap_err().is_corrupt());
    }

    /// Goal: a scan reads pages without filling the clean cache, sees dirty content, and
    /// still reports corruption.
    #[test]
    fn read_once_bypasses_the_cache() {
        let storage = SimulatedStorage::new();
        let shared: Arc<dyn Storage> = Arc::new(storage.clone());
        let (mut pages, _) =
            PageStore::open(shared.clone(), "meta", PageStoreOptions::default()).unwrap();
        let area = pages.area("a");
        for page in 0..3 {
            fill(&mut pages, area, page, page as u8 + 1);
        }
        pages.checkpoint(b"").unwrap();
        let (mut reopened, _) =
            PageStore::open(shared.clone(), "meta", PageStoreOptions::default()).unwrap();
        let area = reopened.area("a");
        fill(&mut reopened, area, 2, 0x77);
        let firsts: Vec<u8> = (0..3)
            .map(|page| {
                reopened
                    .read_once(area, page, |content| content[0])
                    .unwrap()
            })
            .collect();
        assert_eq!(firsts, [1, 2, 0x77]);
        assert_eq!(reopened.cache.len(), 0, "read_once cached a page");
        // A page already cached is served from the cache.
        assert_eq!(reopened.read(area, 1).unwrap()[0], 2);
        assert_eq!(
            reopened.read_once(area, 1, |content| content[0]).unwrap(),
            2
        );
        assert_eq!(reopened.cache.len(), 1);

        let file = shared.open("meta/pages", false).unwrap();
        file.write_at(17, &[0xff]).unwrap();
        let (mut corrupted, _) =
            PageStore::open(shared, "meta", PageStoreOptions::default()).unwrap();
        let area = corrupted.area("a");
        let failures = (0..3)
            .filter(|&page| corrupted.read_once(area, page, |_| ()).is_err())
            .count();
        assert_eq!(failures, 1, "the flipped byte is in exactly one page");
    }

    /// Goal: `resident` finds dirty and cached pages (and records in them) without loading a
    /// page, and finds nothing else. Method: pages on disk, dirty and cached, looked up
    /// through `resident` with the clean cache's size checked after each step.
    #[test]
    fn resident_finds_only_pages_in_memory() {
        let storage = SimulatedStorage::new();
        let shared: Arc<dyn Storage> = Arc::new(storage.clone());
        let (mut pages, _) =
            PageStore::open(shared.clone(), "meta", PageStoreOptions::default()).unwrap();
        let area = pages.area("a");
        for page in 0..4 {
            fill(&mut pages, area, page, page as u8 + 1);
        }
        pages.checkpoint(b"").unwrap();
        let options = PageStoreOptions { cache_pages: 2 };
        let (mut reopened, _) = PageStore::open(shared, "meta", options).unwrap();
        let area = reopened.area("a");
        assert!(reopened.resident(area, 0).is_none(), "not loaded yet");
        assert_eq!(reopened.cache.len(), 0, "resident loaded a page");
        fill(&mut reopened, area, 3, 0x33);
        assert_eq!(reopened.resident(area, 3).unwrap()[0], 0x33, "a dirty page");
        let records = RecordArea::new(area, 8);
        assert_eq!(records.resident(&reopened, 3 * 512).unwrap(), [0x33; 8]);
        assert!(records.resident(&reopened, 0).is_none());
        reopened.read(area, 0).unwrap();
        reopened.read(area, 1).unwrap();
        assert_eq!(reopened.resident(area, 0).unwrap()[0], 1, "a cached page");
        reopened.read(area, 2).unwrap();
        let cached = (0..3)
            .filter(|&page| reopened.resident(area, page).is_some())
            .count();
        assert_eq!(cached, 2, "an evicted page is not resident");
        assert_eq!(reopened.cache.len(), 2);
    }

    /// Goal: checksums held only in the durable manifest verify clean pages correctly across
    /// many checkpoints, whether the page was rewritten, carried over unchanged, or its area
    /// cleared; and free slots are reused lowest first, so the file does not grow without
    /// bound. Method: a reference model of every page, read back through a one-page cache
    /// (every read loads) after each checkpoint and after reopening.
    #[test]
    fn checksums_carried_over_checkpoints() {
        let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
        let options = PageStoreOptions { cache_pages: 1 };
        let (mut pages, _) = PageStore::open(storage.clone(), "meta", options).unwrap();
        let areas = [pages.area("a"), pages.area("b")];
        let mut model: BTreeMap<(usize, u64), u8> = BTreeMap::new();
        let mut seed = 7u64;
        for round in 0..40u64 {
            for _ in 0..5 {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let area = areas[(seed >> 60) as usize % 2];
                let page = (seed >> 33) % 24;
                let byte = (seed >> 20) as u8 | 1;
                fill(&mut pages, area, page, byte);
                model.insert((area, page), byte);
            }
            if round % 13 == 12 {
                pages.clear_area(areas[1]).unwrap();
                model.retain(|&(area, _), _| area != areas[1]);
            }
            pages.checkpoint(&round.to_le_bytes()).unwrap();
            for (&(area, page), &byte) in &model {
                assert_eq!(pages.read(area, page).unwrap()[4095], byte, "round {round}");
            }
            let (live, slots, _) = pages.slot_usage();
            assert!(
                slots <= 2 * live + 10,
                "{slots} slots for {live} live pages"
            );
        }
        let (mut reopened, state) = PageStore::open(storage, "meta", options).unwrap();
        assert_eq!(state, 39u64.to_le_bytes());
        let areas = [reopened.area("a"), reopened.area("b")];
        for page in 0..24 {
            for area in areas {
                let expected = model.get(&(area, page)).copied().unwrap_or(0);
                assert_eq!(reopened.read(area, page).unwrap()[0], expected);
            }
        }
        let (live, _, _) = reopened.slot_usage();
        assert_eq!(reopened.verify().unwrap(), (live, Vec::new()));
    }

    /// Goal: a manifest that changes after it was verified (its entries no longer match the
    /// page tables in memory) is reported as corruption when a page is loaded, not used.
    #[test]
    fn manifest_changed_after_open_is_detected() {
        let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
        let options = PageStoreOptions { cache_pages: 1 };
        let (mut pages, _) = PageStore::open(storage.clone(), "meta", options).unwrap();
        let area = pages.area("a");
        fill(&mut pages, area, 0, 1);
        fill(&mut pages, area, 1, 2);
        pages.checkpoint(b"").unwrap();
        let (mut reopened, _) = PageStore::open(storage.clone(), "meta", options).unwrap();
        let area = reopened.area("a");
        // The first checkpoint went to manifest.1; swap the two entries' slots there.
        let manifest = storage.open("meta/manifest.1", false).unwrap();
        let at = reopened.areas[area].manifest_entries_at;
        let mut entries = [0u8; 16];
        manifest.read_at(at, &mut entries).unwrap();
        let mut swapped = entries;
        swapped[..8].copy_from_slice(&entries[8..]);
        swapped[8..].copy_from_slice(&entries[..8]);
        manifest.write_at(at, &swapped).unwrap();
        assert!(reopened.read(area, 0).unwrap_err().is_corrupt());
        assert!(reopened.read(area, 1).unwrap_err().is_corrupt());
    }

    /// Goal: the free-slot bitmap hands out the lowest free slot and counts what it holds.
    #[test]
    fn free_slots_lowest_first() {
        let mut free = FreeSlots::default();
        for slot in [130, 3, 64, 65] {
            free.insert(slot);
        }
        assert_eq!(free.count, 4);
        assert_eq!(free.take_lowest(), Some(3));
        assert_eq!(free.take_lowest(), Some(64));
        free.insert(1);
        assert_eq!(free.take_lowest(), Some(1));
        assert_eq!(free.take_lowest(), Some(65));
        assert_eq!(free.take_lowest(), Some(130));
        assert_eq!(free.take_lowest(), None);
        assert_eq!(free.count, 0);
    }

    /// Goal: after a crash at every sync point, with torn writes, reopening yields exactly the
    /// last completed checkpoint. Method: a reference model of page contents per checkpoint.
    #[test]
    fn crash_at_every_sync_yields_last_checkpoint() {
        let rounds = 6u64;
        // Count the syncs of a full run first.
        let total_syncs = {
            let storage = SimulatedStorage::new();
            run_rounds(&storage, rounds, &mut Vec::new());
            storage.sync_count()
        };
        for crash_at in 1..=total_syncs {
            for seed in 0..3 {
                let storage = SimulatedStorage::new();
                storage.crash_after_syncs(crash_at);
                let mut completed = Vec::new();
                run_rounds(&storage, rounds, &mut completed);
                let after: Arc<dyn Storage> = Arc::new(storage.crash(CrashMode::Torn { seed }));
                let (mut pages, state) =
                    PageStore::open(after, "meta", PageStoreOptions { cache_pages: 3 }).unwrap();
                let area = pages.area("a");
                // The durable state is one of the checkpoints that returned, or the one that
                // was in flight when the crash hit (its manifest may have become durable).
                let round = if state.is_empty() {
                    0
                } else {
                    u64::from_le_bytes(state[..8].try_into().unwrap())
                };
                assert!(round <= completed.len() as u64 + 1);
                let expected = model_after(round);
                for (page, byte) in expected {
                    assert_eq!(
                        pages.read(area, page).unwrap()[0],
                        byte,
                        "crash at {crash_at}"
                    );
                    assert!(pages.read(area, page).unwrap().iter().all(|&b| b == byte));
                }
            }
        }
    }

    fn model_after(round: u64) -> BTreeMap<u64, u8> {
        let mut model = BTreeMap::new();
        for r in 1..=round {
            for page in (r % 3)..(r % 3 + 4) {
                model.insert(page, (r * 10 + page) as u8);
            }
        }
        model
    }

    fn run_rounds(storage: &SimulatedStorage, rounds: u64, completed: &mut Vec<u64>) {
        let shared: Arc<dyn Storage> = Arc::new(storage.clone());
        let Ok((mut pages, _)) = PageStore::open(shared, "meta", PageStoreOptions::default())
        else {
            return;
        };
        let area = pages.area("a");
        for round in 1..=rounds {
            for page in (round % 3)..(round % 3 + 4) {
                match pages.write(area, page) {
                    Ok(content) => content.fill((round * 10 + page) as u8),
                    Err(_) => return,
                }
            }
            if pages.checkpoint(&round.to_le_bytes()).is_err() {
                return;
            }
            completed.push(round);
        }
    }

    /// Goal: a cleared area reads as zeros, survives reopen cleared, and its slots are reused
    /// only after the checkpoint that dropped them.
    #[test]
    fn clear_area_frees_slots_after_checkpoint() {
        let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
        let (mut pages, _) =
            PageStore::open(storage.clone(), "m", PageStoreOptions::default()).unwrap();
        let doomed = pages.area("doomed");
        for page in 0..4 {
            fill(&mut pages, doomed, page, 9);
        }
        pages.checkpoint(b"").unwrap();
        pages.clear_area(doomed).unwrap();
        assert_eq!(pages.read(doomed, 2).unwrap()[0], 0);
        assert_eq!(pages.slot_usage(), (0, 4, 0));
        pages.checkpoint(b"").unwrap();
        assert_eq!(pages.slot_usage(), (0, 4, 4));
        let (mut reopened, _) = PageStore::open(storage, "m", PageStoreOptions::default()).unwrap();
        let doomed = reopened.area("doomed");
        assert_eq!(reopened.page_count(doomed), 0);
        assert_eq!(reopened.slot_usage(), (0, 4, 4));
    }

    /// Goal: record areas address records inside pages without overlap.
    #[test]
    fn record_area_addresses_records() {
        let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
        let (mut pages, _) = PageStore::open(storage, "m", PageStoreOptions::default()).unwrap();
        let records = RecordArea::new(pages.area("r"), 24);
        assert_eq!(records.records_per_page(), 170);
        for index in 0..1000u64 {
            records.get_mut(&mut pages, index).unwrap()[..8].copy_from_slice(&index.to_le_bytes());
        }
        for index in 0..1000u64 {
            let bytes = records.get(&mut pages, index).unwrap();
            assert_eq!(u64::from_le_bytes(bytes[..8].try_into().unwrap()), index);
        }
    }
}
