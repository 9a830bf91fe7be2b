//! The shadow-paged store: areas of pages, dirty pages held until a checkpoint, and the
//! checkpoint that writes them to free slots and then the other manifest file (the steps are
//! in the [parent module](super)).

use std::collections::HashMap;
use std::sync::Arc;

use super::absent_file::AbsentFile;
use super::cache::PageCache;
use super::free_slots::FreeSlots;
use super::manifest::{
    self, Manifest, ManifestArea, ManifestEncoder, ManifestRead, MANIFEST_ENTRY_BYTES, NO_SLOT,
};
use super::{AreaId, Page, PAGE_BYTES};
use crate::integer_hash::IntegerBuildHasher;
use crate::storage::{join, Storage, StorageFile};
use crate::{Error, Result};

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

    /// An area as the durable manifest describes it: every page clean.
    fn from_manifest(durable: ManifestArea) -> Area {
        let manifest_pages = durable.table.len() as u64;
        Area {
            manifest_entries_at: durable.entries_at,
            manifest_pages,
            ..Area::new(durable.name, durable.table)
        }
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

/// Shadow-paged metadata pages; see the parent module.
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
    /// Per area, the run of durable manifest entries read last ([`ENTRY_RUN_PAGES`]): pages
    /// loaded in order find their checksums in it, one read per run rather than one per page.
    /// On a sealed storage every read of the file opens a whole 4 KiB block.
    entry_runs: parking_lot::Mutex<HashMap<AreaId, EntryRun, IntegerBuildHasher>>,
    /// The durable manifest's bytes when it is at most [`KEPT_MANIFEST_BYTES_MAX`] long: page
    /// loads and checkpoints take durable entries from here instead of reading the file.
    kept_manifest: Option<Vec<u8>>,
}

/// Largest durable manifest kept in memory (the entries of 8,192 pages, 32 MiB of them).
pub(super) const KEPT_MANIFEST_BYTES_MAX: usize = 64 << 10;

/// Pages whose manifest entries are read at once for page loads: 4 KiB of entries, about one
/// block of a sealed file.
const ENTRY_RUN_PAGES: u64 = 4096 / MANIFEST_ENTRY_BYTES;

/// Durable manifest entries held for page loads.
#[derive(Debug)]
struct EntryRun {
    /// The checkpoint whose manifest they come from (a manifest file is immutable while it is
    /// the durable one).
    sequence: u64,
    /// Their offset in the manifest file.
    start: u64,
    bytes: Vec<u8>,
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
            entry_runs: parking_lot::Mutex::new(HashMap::default()),
            kept_manifest: None,
        };
        let user_state = match store.read_newest_manifest([missing_0, missing_1])? {
            Some(manifest) => {
                store.sequence = manifest.sequence;
                store.current_manifest = manifest.file;
                store.kept_manifest =
                    (manifest.bytes.len() <= KEPT_MANIFEST_BYTES_MAX).then_some(manifest.bytes);
                store.slot_count = manifest.slot_count;
                store.areas = manifest
                    .areas
                    .into_iter()
                    .map(Area::from_manifest)
                    .collect();
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
    /// would be a second copy, and the pages a checkpoint writes would stay cached beside
    /// the decoded area.
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
    /// and dropped, not kept in the clean cache, which would otherwise hold a second copy of
    /// everything the owner decodes (a saved filter, an index directory).
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
        self.kept_manifest = (manifest.len() <= KEPT_MANIFEST_BYTES_MAX).then_some(manifest);
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

    /// The checksum of clean page `page` of `area`, stored in `slot`, from its entry in the
    /// durable manifest (see the parent module).
    fn durable_checksum(&self, area: AreaId, page: u64, slot: u32) -> Result<u32> {
        let held = &self.areas[area];
        // Clean pages with a slot got it at a checkpoint, so the durable manifest lists them.
        assert!(
            page < held.manifest_pages,
            "page {page} of area {} has slot {slot} but is not in the durable manifest",
            held.name
        );
        let at = held.manifest_entries_at + page * MANIFEST_ENTRY_BYTES;
        if let Some(kept) = &self.kept_manifest {
            let entry = &kept[at as usize..(at + MANIFEST_ENTRY_BYTES) as usize];
            return self.durable_entry_checksum(area, page, slot, entry);
        }
        let mut runs = self.entry_runs.lock();
        let held_run = runs.get(&area).filter(|run| {
            run.sequence == self.sequence
                && at >= run.start
                && at + MANIFEST_ENTRY_BYTES <= run.start + run.bytes.len() as u64
        });
        if held_run.is_none() {
            // The run of whole entries holding this one: the area's pages in groups of
            // ENTRY_RUN_PAGES, within its entries (which lie inside the file).
            let first = page / ENTRY_RUN_PAGES * ENTRY_RUN_PAGES;
            let start = held.manifest_entries_at + first * MANIFEST_ENTRY_BYTES;
            let end = held.manifest_entries_at
                + (first + ENTRY_RUN_PAGES).min(held.manifest_pages) * MANIFEST_ENTRY_BYTES;
            let mut bytes = vec![0u8; (end - start) as usize];
            self.manifests[self.current_manifest].read_at(start, &mut bytes)?;
            runs.insert(
                area,
                EntryRun {
                    sequence: self.sequence,
                    start,
                    bytes,
                },
            );
        }
        let run = &runs[&area];
        let offset = (at - run.start) as usize;
        let entry = &run.bytes[offset..offset + MANIFEST_ENTRY_BYTES as usize];
        self.durable_entry_checksum(area, page, slot, entry)
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
        let (listed, checksum) = manifest::entry_fields(entry);
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
        Ok(checksum)
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
        let mut encoder = ManifestEncoder::new(self.slot_count, self.areas.len());
        for (area_id, area) in self.areas.iter().enumerate() {
            encoder.area(&area.name, area.table.len() as u64);
            // The durable entries of this area: the checksums of its unchanged pages.
            let durable_pages = area.manifest_pages.min(area.table.len() as u64);
            let mut durable = vec![0u8; (durable_pages * MANIFEST_ENTRY_BYTES) as usize];
            if durable_pages > 0 {
                match &self.kept_manifest {
                    Some(kept) => {
                        let count = durable.len();
                        durable.copy_from_slice(&kept[area.manifest_entries_at as usize..][..count])
                    }
                    None => self.manifests[self.current_manifest]
                        .read_at(area.manifest_entries_at, &mut durable)?,
                }
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
                encoder.entry(slot, checksum);
            }
        }
        Ok(encoder.finish(sequence, user_state))
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
            let read: ManifestRead = manifest::read(file.as_ref(), index)?;
            self.manifest_states[index] = match read {
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

    /// Clean pages in the cache.
    #[cfg(test)]
    pub(super) fn cached_page_count(&self) -> usize {
        self.cache.len()
    }

    /// Where the entries of `area` start in the durable manifest file.
    #[cfg(test)]
    pub(super) fn manifest_entries_at(&self, area: AreaId) -> u64 {
        self.areas[area].manifest_entries_at
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
