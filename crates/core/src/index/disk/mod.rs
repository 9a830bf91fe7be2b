//! The on-disk index: every fingerprint -> value entry, in page-store pages, found with one
//! page read (extendible hashing, Fagin et al., 1979).
//!
//! Terms:
//! - *key*: the first [`KEY_BYTES`] (16) bytes of a fingerprint ([`IndexKey`]). The index
//!   maps keys, not whole fingerprints, to values; its users confirm a found value against
//!   the whole fingerprint they keep elsewhere (the block engine's chunk record, the backup
//!   store's segment head), so two fingerprints sharing a key (about one chance in 2^65 among
//!   2^32 fingerprints) cost a missed deduplication, never wrong data;
//! - *bucket*: one page of the `<prefix>.buckets` area holding up to [`BUCKET_ENTRIES`]
//!   (170) entries of a 16-byte key and an 8-byte value;
//! - *hash*: the first 8 bytes of a fingerprint ([`Fingerprint::prefix_u64`]); fingerprints
//!   are uniform, so no further hashing is needed;
//! - *global depth* `G`: the directory has `2^G` slots, and slot `i` serves the hashes whose
//!   top `G` bits equal `i`;
//! - *local depth* `L` of a bucket: the number of top hash bits all its entries share; `2^(G-L)`
//!   consecutive slots point to it.
//!
//! A lookup takes the top `G` bits of the hash, reads the bucket page the directory names,
//! and scans it: one page read, whatever the size of the index. An insert into a full bucket
//! *splits* it: a new bucket takes the entries whose next hash bit is 1, both get local depth
//! `L + 1`, and the upper half of the bucket's directory slots point to the new one. When
//! `L == G` the directory first doubles. Removal deletes the entry from its bucket; buckets
//! never merge and the directory never shrinks (deduplicated data rarely shrinks for long,
//! and a merge would cost a second page read on removal).
//!
//! Durability: every change is made to page-store pages (`<prefix>.buckets` and
//! `<prefix>.directory`), which the owner of the [`PageStore`] checkpoints atomically; the
//! directory is also kept in memory (4 bytes per slot) and loaded at open.
//!
//! Layouts (little endian). Directory area: page 0 is a header — magic `OCINDEX2` | global
//! depth u32 | 0u32 | entries u64 | bucket pages u64 | change count u64; pages 1.. hold the
//! directory, one u32 bucket page number per slot, 1024 per page. Bucket page: local depth
//! u8 | marker 0xB7 u8 | entry count u16 | 0u32 | the top `L` hash bits shared by its
//! entries, left aligned, u64 | entries (key 16 bytes, value u64).
//!
//! Entries hold keys rather than whole fingerprints so that a page holds 170 entries rather
//! than 102: the index needs 40% fewer bucket pages, and its directory, held in memory, is
//! that much smaller.

use crate::bytes::{u16_at, u32_at, u64_at};
use crate::fingerprint::{Fingerprint, FINGERPRINT_BYTES};
use crate::pages::{AreaId, Page, PageStore, PAGE_BYTES};
use crate::{Error, Result};

/// Bytes of a fingerprint that key an index entry.
pub const KEY_BYTES: usize = 16;
const BUCKET_HEADER_BYTES: usize = 16;
const BUCKET_MARKER: u8 = 0xB7;
/// Largest global depth the format allows: bucket page numbers are u32, and a directory of
/// 2^32 slots takes 16 GiB of memory.
pub const GLOBAL_DEPTH_MAX: u32 = 32;
const DIRECTORY_SLOTS_PER_PAGE: usize = PAGE_BYTES / 4;

/// The part of a fingerprint the index stores and compares: its first [`KEY_BYTES`] bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IndexKey(pub [u8; KEY_BYTES]);

impl IndexKey {
    /// The hash that places the key: its first 8 bytes, as [`Fingerprint::prefix_u64`].
    #[inline]
    fn hash(&self) -> u64 {
        u64_at(&self.0, 0)
    }

    /// The key of `fingerprint`.
    #[inline]
    pub fn of(fingerprint: &Fingerprint) -> Self {
        IndexKey(fingerprint.0[..KEY_BYTES].try_into().expect("16 bytes"))
    }

    /// A fingerprint with this key and zeros after it. The membership filters read only the
    /// first 16 bytes of a fingerprint ([`crate::index::filter`]), so for them it stands for
    /// every fingerprint with this key; a filter can be rebuilt from the on-disk keys.
    pub fn probe(&self) -> Fingerprint {
        let mut bytes = [0u8; FINGERPRINT_BYTES];
        bytes[..KEY_BYTES].copy_from_slice(&self.0);
        Fingerprint(bytes)
    }
}

impl std::fmt::Display for IndexKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

/// Magic of the directory header.
const DIRECTORY_MAGIC: &[u8; 8] = b"OCINDEX2";
/// Bytes of one bucket entry: a key and a u64 value.
const ENTRY_BYTES: usize = KEY_BYTES + 8;
/// Entries in one bucket page.
pub const BUCKET_ENTRIES: usize = (PAGE_BYTES - BUCKET_HEADER_BYTES) / ENTRY_BYTES;

const _: () = assert!(BUCKET_ENTRIES == 170);
const _: () = assert!(BUCKET_ENTRIES <= u16::MAX as usize);

/// Configurable limits of a [`DiskIndex`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiskIndexLimits {
    /// Largest global depth (at most [`GLOBAL_DEPTH_MAX`]); an insert that would need a deeper
    /// directory fails with [`Error::Limit`]. The directory costs `4 * 2^depth` bytes of RAM.
    pub global_depth_max: u32,
}

impl Default for DiskIndexLimits {
    fn default() -> Self {
        DiskIndexLimits {
            global_depth_max: GLOBAL_DEPTH_MAX,
        }
    }
}

/// The on-disk extendible hash index; see the module documentation.
#[derive(Debug)]
pub struct DiskIndex {
    name_prefix: String,
    buckets_area: AreaId,
    directory_area: AreaId,
    directory: Vec<u32>,
    global_depth: u32,
    len: u64,
    bucket_pages: u64,
    change_count: u64,
    limits: DiskIndexLimits,
    bucket_page_reads: u64,
    damaged_buckets_reset: u64,
}

/// A view of a bucket page.
struct Bucket<'a>(&'a Page);

impl Bucket<'_> {
    fn local_depth(&self) -> u32 {
        self.0[0] as u32
    }
    fn count(&self) -> usize {
        u16_at(self.0, 2) as usize
    }
    fn shared_bits(&self) -> u64 {
        u64_at(self.0, 8)
    }
    #[inline]
    fn entry(&self, slot: usize) -> &[u8] {
        let start = BUCKET_HEADER_BYTES + slot * ENTRY_BYTES;
        &self.0[start..start + ENTRY_BYTES]
    }
    /// The slot holding `key` among the first `count` entries.
    #[inline]
    fn find(&self, key: &IndexKey, count: usize) -> Option<usize> {
        (0..count).find(|&slot| {
            let entry = self.entry(slot);
            // The 8-byte hash decides almost every comparison before the rest of the key.
            entry[..8] == key.0[..8] && entry[..KEY_BYTES] == key.0
        })
    }
    /// The key and value in `slot`.
    fn key_value(&self, slot: usize) -> (IndexKey, u64) {
        let entry = self.entry(slot);
        let key = IndexKey(entry[..KEY_BYTES].try_into().expect("16 bytes"));
        (key, entry_value(entry))
    }
}

/// The value of an entry: its last 8 bytes.
fn entry_value(entry: &[u8]) -> u64 {
    u64_at(entry, entry.len() - 8)
}

fn entry_hash(entry: &[u8]) -> u64 {
    u64_at(entry, 0)
}

fn write_bucket_header(page: &mut Page, local_depth: u32, count: usize, shared_bits: u64) {
    assert!(local_depth <= GLOBAL_DEPTH_MAX);
    assert!(count <= BUCKET_ENTRIES);
    page[0] = local_depth as u8;
    page[1] = BUCKET_MARKER;
    page[2..4].copy_from_slice(&(count as u16).to_le_bytes());
    page[4..8].fill(0);
    page[8..16].copy_from_slice(&shared_bits.to_le_bytes());
}

/// The top `depth` bits of `hash`, left aligned.
fn top_bits(hash: u64, depth: u32) -> u64 {
    if depth == 0 {
        0
    } else {
        hash & (u64::MAX << (64 - depth))
    }
}

impl DiskIndex {
    /// Opens the index kept in areas `<name_prefix>.buckets` and `<name_prefix>.directory` of
    /// `pages`, creating an empty one if the areas are empty. The new index becomes durable
    /// with the owner's next checkpoint.
    pub fn open(pages: &mut PageStore, name_prefix: &str, limits: DiskIndexLimits) -> Result<Self> {
        assert!(limits.global_depth_max <= GLOBAL_DEPTH_MAX);
        let buckets_area = pages.area(&format!("{name_prefix}.buckets"));
        let directory_area = pages.area(&format!("{name_prefix}.directory"));
        // Held decoded (`directory`); its pages are read once at open and written at splits.
        pages.set_uncached(directory_area);
        let mut index = DiskIndex {
            name_prefix: name_prefix.to_string(),
            buckets_area,
            directory_area,
            directory: vec![0],
            global_depth: 0,
            len: 0,
            bucket_pages: 1,
            change_count: 0,
            limits,
            bucket_page_reads: 0,
            damaged_buckets_reset: 0,
        };
        let header = pages.read_once(directory_area, 0, |page| *page)?;
        if &header[..8] != DIRECTORY_MAGIC {
            if header.iter().any(|&byte| byte != 0) || pages.page_count(buckets_area) != 0 {
                return Err(index.corrupt("directory header", "bad magic"));
            }
            let page = pages.write(buckets_area, 0)?;
            write_bucket_header(page, 0, 0, 0);
            index.write_directory_slots(pages, 0, 1)?;
            index.write_header(pages)?;
            return Ok(index);
        }
        let field = |offset: usize| u64_at(&header[..], offset);
        index.global_depth = u32_at(&header[..], 8);
        index.len = field(16);
        index.bucket_pages = field(24);
        index.change_count = field(32);
        if index.global_depth > limits.global_depth_max {
            return Err(Error::Limit(format!(
                "index {name_prefix} has global depth {}, above the limit of {}",
                index.global_depth, limits.global_depth_max
            )));
        }
        if index.bucket_pages == 0 || index.bucket_pages > u32::MAX as u64 {
            return Err(index.corrupt("directory header", "bad bucket page count"));
        }
        index.load_directory(pages)?;
        Ok(index)
    }

    fn load_directory(&mut self, pages: &mut PageStore) -> Result<()> {
        let slots = 1usize << self.global_depth;
        let mut directory = Vec::with_capacity(slots);
        let mut page = 1;
        // Read once: the directory is held decoded, so cached pages would be a second copy.
        while directory.len() < slots {
            let take = (slots - directory.len()).min(DIRECTORY_SLOTS_PER_PAGE);
            pages.read_once(self.directory_area, page, |content| {
                for bytes in content[..take * 4].chunks_exact(4) {
                    directory.push(u32_at(bytes, 0));
                }
            })?;
            page += 1;
        }
        if let Some(bad) = directory
            .iter()
            .find(|&&page| page as u64 >= self.bucket_pages)
        {
            return Err(self.corrupt(
                "directory",
                format!("slot names bucket page {bad} of {}", self.bucket_pages),
            ));
        }
        self.directory = directory;
        Ok(())
    }

    /// The prefix of the index's area names.
    pub fn name_prefix(&self) -> &str {
        &self.name_prefix
    }

    /// The area of the bucket pages.
    pub fn buckets_area(&self) -> AreaId {
        self.buckets_area
    }

    /// The area of the directory.
    pub fn directory_area(&self) -> AreaId {
        self.directory_area
    }

    fn corrupt(&self, what: &str, detail: impl Into<String>) -> Error {
        Error::corrupt(
            format!("{what} of fingerprint index {}", self.name_prefix),
            detail,
        )
    }

    fn write_header(&self, pages: &mut PageStore) -> Result<()> {
        let page = pages.write(self.directory_area, 0)?;
        page[..8].copy_from_slice(DIRECTORY_MAGIC);
        page[8..12].copy_from_slice(&self.global_depth.to_le_bytes());
        page[12..16].fill(0);
        page[16..24].copy_from_slice(&self.len.to_le_bytes());
        page[24..32].copy_from_slice(&self.bucket_pages.to_le_bytes());
        page[32..40].copy_from_slice(&self.change_count.to_le_bytes());
        Ok(())
    }

    /// Copies directory slots `start..end` to their pages.
    fn write_directory_slots(&self, pages: &mut PageStore, start: usize, end: usize) -> Result<()> {
        let mut slot = start;
        while slot < end {
            let page_number = 1 + (slot / DIRECTORY_SLOTS_PER_PAGE) as u64;
            let page_end = ((slot / DIRECTORY_SLOTS_PER_PAGE) + 1) * DIRECTORY_SLOTS_PER_PAGE;
            let stop = end.min(page_end);
            let page = pages.write(self.directory_area, page_number)?;
            for current in slot..stop {
                let offset = (current % DIRECTORY_SLOTS_PER_PAGE) * 4;
                page[offset..offset + 4].copy_from_slice(&self.directory[current].to_le_bytes());
            }
            slot = stop;
        }
        Ok(())
    }

    #[inline]
    fn slot_of(&self, hash: u64) -> usize {
        if self.global_depth == 0 {
            0
        } else {
            (hash >> (64 - self.global_depth)) as usize
        }
    }

    /// Reads the bucket page serving `fingerprint` and checks its header.
    #[inline]
    /// Warms the bucket page `fingerprint`'s key belongs to, if it is in memory: its header
    /// line, or with `append`, the line an insert would append to (read from the header,
    /// which should have been warmed by an earlier pass). Changes nothing.
    pub fn warm(&self, pages: &PageStore, fingerprint: &Fingerprint, append: bool) {
        let key = IndexKey::of(fingerprint);
        let page_number = self.directory[self.slot_of(key.hash())] as u64;
        if let Some(page) = pages.resident(self.buckets_area, page_number) {
            if append {
                let count = Bucket(page).count().min(BUCKET_ENTRIES - 1);
                crate::index::warm::warm(&page[BUCKET_HEADER_BYTES + count * ENTRY_BYTES]);
            } else {
                crate::index::warm::warm(&page[0]);
            }
        }
    }

    fn read_bucket<'a>(&mut self, pages: &'a mut PageStore, page: u64) -> Result<&'a Page> {
        self.bucket_page_reads += 1;
        let damaged = match pages.read(self.buckets_area, page) {
            Ok(content) => self.check_bucket(page, content).err(),
            Err(error) if error.is_corrupt() => Some(error),
            Err(error) => return Err(error),
        };
        if damaged.is_some() {
            self.reset_bucket(pages, page)?;
        }
        pages.read(self.buckets_area, page)
    }

    /// Replaces damaged bucket page `page` with an empty bucket serving the same hashes:
    /// the index is derived data, so its entries are only missing (lookups miss, a
    /// duplicate is stored again) until the owner's repair rebuilds the index.
    fn reset_bucket(&mut self, pages: &mut PageStore, page: u64) -> Result<()> {
        let first = self
            .directory
            .iter()
            .position(|&named| named as u64 == page);
        let (local_depth, shared_bits) = match first {
            Some(first) => {
                let slots = self.directory[first..]
                    .iter()
                    .take_while(|&&named| named as u64 == page)
                    .count() as u64;
                let depth = self.global_depth - slots.trailing_zeros();
                let slot_bits = if self.global_depth == 0 {
                    0
                } else {
                    (first as u64) << (64 - self.global_depth)
                };
                (depth, top_bits(slot_bits, depth))
            }
            None => (self.global_depth, 0),
        };
        let content = pages.overwrite(self.buckets_area, page)?;
        write_bucket_header(content, local_depth, 0, 0);
        content[8..16].copy_from_slice(&shared_bits.to_le_bytes());
        self.damaged_buckets_reset += 1;
        Ok(())
    }

    /// Bucket pages found damaged and reset to empty since open.
    pub fn damaged_buckets_reset(&self) -> u64 {
        self.damaged_buckets_reset
    }

    /// Checks a bucket page's header.
    fn check_bucket(&self, page: u64, content: &Page) -> Result<()> {
        if content[1] != BUCKET_MARKER || Bucket(content).count() > BUCKET_ENTRIES {
            return Err(Error::corrupt(
                format!(
                    "bucket page {page} of fingerprint index {}",
                    self.name_prefix
                ),
                "bad marker or entry count",
            ));
        }
        Ok(())
    }

    /// The value stored for `fingerprint`'s key, reading exactly one page.
    #[inline]
    pub fn lookup(
        &mut self,
        pages: &mut PageStore,
        fingerprint: &Fingerprint,
    ) -> Result<Option<u64>> {
        let key = IndexKey::of(fingerprint);
        let page = self.directory[self.slot_of(key.hash())] as u64;
        let bucket = Bucket(self.read_bucket(pages, page)?);
        Ok(bucket
            .find(&key, bucket.count())
            .map(|slot| entry_value(bucket.entry(slot))))
    }

    /// Stores `value` for `fingerprint`'s key; returns the value it replaces, if any. Fails
    /// with [`Error::Limit`] when the bucket is full and the directory is at its depth limit.
    pub fn insert(
        &mut self,
        pages: &mut PageStore,
        fingerprint: &Fingerprint,
        value: u64,
    ) -> Result<Option<u64>> {
        self.insert_searching(pages, fingerprint, value, true)
    }

    /// Inserts the key of `fingerprint`, which the caller knows is absent (its membership
    /// filter excludes it), without searching the bucket for it first. The search reads the
    /// whole 4 KiB bucket page, 64 cache lines; appending reads two.
    pub fn insert_absent(
        &mut self,
        pages: &mut PageStore,
        fingerprint: &Fingerprint,
        value: u64,
    ) -> Result<()> {
        let previous = self.insert_searching(pages, fingerprint, value, false)?;
        assert!(previous.is_none(), "an append replaced nothing");
        Ok(())
    }

    fn insert_searching(
        &mut self,
        pages: &mut PageStore,
        fingerprint: &Fingerprint,
        value: u64,
        search: bool,
    ) -> Result<Option<u64>> {
        let key = IndexKey::of(fingerprint);
        loop {
            let page_number = self.directory[self.slot_of(key.hash())] as u64;
            let bucket = Bucket(self.read_bucket(pages, page_number)?);
            let count = bucket.count();
            if let Some(slot) = search.then(|| bucket.find(&key, count)).flatten() {
                let previous = entry_value(bucket.entry(slot));
                let page = pages.write(self.buckets_area, page_number)?;
                let start = BUCKET_HEADER_BYTES + (slot + 1) * ENTRY_BYTES - 8;
                page[start..start + 8].copy_from_slice(&value.to_le_bytes());
                self.change_count += 1;
                self.write_header(pages)?;
                return Ok(Some(previous));
            }
            if count < BUCKET_ENTRIES {
                let page = pages.write(self.buckets_area, page_number)?;
                let start = BUCKET_HEADER_BYTES + count * ENTRY_BYTES;
                page[start..start + KEY_BYTES].copy_from_slice(&key.0);
                page[start + KEY_BYTES..start + ENTRY_BYTES].copy_from_slice(&value.to_le_bytes());
                page[2..4].copy_from_slice(&(count as u16 + 1).to_le_bytes());
                self.len += 1;
                self.change_count += 1;
                self.write_header(pages)?;
                return Ok(None);
            }
            self.split(pages, page_number)?;
        }
    }

    /// Splits the full bucket in page `page_number` in two, doubling the directory first if
    /// the bucket's local depth equals the global depth.
    fn split(&mut self, pages: &mut PageStore, page_number: u64) -> Result<()> {
        let old = *self.read_bucket(pages, page_number)?;
        let bucket = Bucket(&old);
        let local_depth = bucket.local_depth();
        let shared_bits = bucket.shared_bits();
        assert!(local_depth <= self.global_depth);
        if local_depth == self.global_depth {
            if self.global_depth >= self.limits.global_depth_max {
                return Err(Error::Limit(format!(
                    "fingerprint index {}: a full bucket needs a directory deeper than the \
                     limit of {} bits ({} entries stored)",
                    self.name_prefix, self.limits.global_depth_max, self.len
                )));
            }
            let doubled: Vec<u32> = (0..self.directory.len() * 2)
                .map(|slot| self.directory[slot >> 1])
                .collect();
            self.directory = doubled;
            self.global_depth += 1;
            self.write_directory_slots(pages, 0, self.directory.len())?;
        }
        if self.bucket_pages >= u32::MAX as u64 {
            return Err(Error::Limit(format!(
                "fingerprint index {} holds the maximum of {} bucket pages",
                self.name_prefix,
                u32::MAX
            )));
        }
        let new_page_number = self.bucket_pages;
        self.bucket_pages += 1;

        let split_bit = 1u64 << (63 - local_depth);
        let (mut stay, mut moved) = (Vec::new(), Vec::new());
        for slot in 0..bucket.count() {
            let entry = bucket.entry(slot);
            if entry_hash(entry) & split_bit == 0 {
                stay.push(entry);
            } else {
                moved.push(entry);
            }
        }
        let entry_bytes = ENTRY_BYTES;
        for (number, entries, bits) in [
            (page_number, &stay, shared_bits),
            (new_page_number, &moved, shared_bits | split_bit),
        ] {
            let page = pages.write(self.buckets_area, number)?;
            write_bucket_header(page, local_depth + 1, entries.len(), bits);
            for (slot, entry) in entries.iter().enumerate() {
                let start = BUCKET_HEADER_BYTES + slot * entry_bytes;
                page[start..start + entry_bytes].copy_from_slice(entry);
            }
        }
        // The bucket's slots are 2^(G-L) consecutive ones; the upper half now serve the new page.
        let span = 1usize << (self.global_depth - local_depth);
        let first = self.slot_of(shared_bits);
        assert!(self.directory[first..first + span]
            .iter()
            .all(|&page| page as u64 == page_number));
        for slot in first + span / 2..first + span {
            self.directory[slot] = new_page_number as u32;
        }
        self.write_directory_slots(pages, first + span / 2, first + span)?;
        self.write_header(pages)
    }

    /// Removes `fingerprint`'s key; returns its value if it was stored.
    pub fn remove(
        &mut self,
        pages: &mut PageStore,
        fingerprint: &Fingerprint,
    ) -> Result<Option<u64>> {
        self.remove_key(pages, &IndexKey::of(fingerprint))
    }

    /// Removes `key`; returns its value if it was stored.
    pub fn remove_key(&mut self, pages: &mut PageStore, key: &IndexKey) -> Result<Option<u64>> {
        let page_number = self.directory[self.slot_of(key.hash())] as u64;
        let bucket = Bucket(self.read_bucket(pages, page_number)?);
        let count = bucket.count();
        let Some(slot) = bucket.find(key, count) else {
            return Ok(None);
        };
        let value = entry_value(bucket.entry(slot));
        let entry_bytes = ENTRY_BYTES;
        let page = pages.write(self.buckets_area, page_number)?;
        // The last entry fills the hole, keeping entries contiguous.
        let last = BUCKET_HEADER_BYTES + (count - 1) * entry_bytes;
        let hole = BUCKET_HEADER_BYTES + slot * entry_bytes;
        page.copy_within(last..last + entry_bytes, hole);
        page[last..last + entry_bytes].fill(0);
        page[2..4].copy_from_slice(&(count as u16 - 1).to_le_bytes());
        self.len -= 1;
        self.change_count += 1;
        self.write_header(pages)?;
        Ok(Some(value))
    }

    /// Calls `visit` for every entry's key and value, bucket page by bucket page (in no
    /// meaningful order).
    pub fn for_each_entry(
        &mut self,
        pages: &mut PageStore,
        mut visit: impl FnMut(&IndexKey, u64),
    ) -> Result<()> {
        // Every page once: through the clean cache, a scan would evict what lookups reuse.
        for page_number in 0..self.bucket_pages {
            self.bucket_page_reads += 1;
            let read = pages.read_once(self.buckets_area, page_number, |content| {
                self.check_bucket(page_number, content)?;
                let bucket = Bucket(content);
                for slot in 0..bucket.count() {
                    let (key, value) = bucket.key_value(slot);
                    visit(&key, value);
                }
                Ok(())
            });
            match read.and_then(|checked| checked) {
                Ok(()) => {}
                // Its entries are missing from now on; see `reset_bucket`.
                Err(error) if error.is_corrupt() => self.reset_bucket(pages, page_number)?,
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// Checks every structural rule (for `onecopy check`): each bucket's entries share its
    /// top hash bits, each bucket is named by exactly its `2^(G-L)` directory slots, and the
    /// entry count matches. Returns the number of entries.
    pub fn verify(&mut self, pages: &mut PageStore) -> Result<u64> {
        let mut slots_naming = vec![0u64; self.bucket_pages as usize];
        for slot in 0..self.directory.len() {
            let page = self.directory[slot];
            let bucket = Bucket(self.read_bucket(pages, page as u64)?);
            let depth = bucket.local_depth();
            let slot_bits = if self.global_depth == 0 {
                0
            } else {
                (slot as u64) << (64 - self.global_depth)
            };
            if depth > self.global_depth || top_bits(slot_bits, depth) != bucket.shared_bits() {
                return Err(self.corrupt(
                    "directory",
                    format!("slot {slot} names bucket page {page}, which serves other hashes"),
                ));
            }
            slots_naming[page as usize] += 1;
        }
        let mut entries = 0;
        for page_number in 0..self.bucket_pages {
            let bucket = Bucket(self.read_bucket(pages, page_number)?);
            let depth = bucket.local_depth();
            if slots_naming[page_number as usize]
                != 1 << (self.global_depth - depth.min(self.global_depth))
            {
                return Err(self.corrupt(
                    "directory",
                    format!("bucket page {page_number} is named by the wrong number of slots"),
                ));
            }
            for slot in 0..bucket.count() {
                if top_bits(entry_hash(bucket.entry(slot)), depth) != bucket.shared_bits() {
                    return Err(self.corrupt(
                        &format!("bucket page {page_number}"),
                        format!("entry {slot} does not belong to this bucket"),
                    ));
                }
            }
            entries += bucket.count() as u64;
        }
        if entries != self.len {
            return Err(self.corrupt(
                "directory header",
                format!("{entries} entries found, {} recorded", self.len),
            ));
        }
        Ok(entries)
    }

    /// Entries stored.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when no entry is stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Counts every insert, replacement and removal since the index was created (durable with
    /// the pages). A saved filter records it to know whether it still matches.
    pub fn change_count(&self) -> u64 {
        self.change_count
    }

    /// The directory's depth: it has `2^depth` slots.
    pub fn global_depth(&self) -> u32 {
        self.global_depth
    }

    /// Bucket pages in use.
    pub fn bucket_pages(&self) -> u64 {
        self.bucket_pages
    }

    /// Bucket pages read through the page store since open (lookups read exactly one each).
    pub fn bucket_page_reads(&self) -> u64 {
        self.bucket_page_reads
    }

    /// Bytes of memory held: the in-memory directory.
    pub fn memory_bytes(&self) -> usize {
        self.directory.capacity() * std::mem::size_of::<u32>()
    }
}

#[cfg(test)]
mod tests;
