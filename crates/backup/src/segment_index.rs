//! The persisted segment index: fingerprint -> shared segment, kept in the page store of
//! `backup/meta/`.
//!
//! The index is **derived data**: everything in it is rebuilt from the catalog's segment heads
//! (the shared segments, minus the damaged ones). The catalog is the truth and every hit is
//! confirmed against it ([`crate::store::BackupStore`]), so a stale entry is a miss and a
//! missing entry only a missed deduplication. Hence the policy for damage: an index that does
//! not open or verify is thrown away and rebuilt (or the store runs without one), never an
//! error that stops a backup command.
//!
//! Each checkpoint records, as the page store's user state, the catalog serial the index
//! matches; recovery reconciles the index when that serial or the entry count disagrees with
//! the catalog.

use std::sync::Arc;

use onecopy_core::fingerprint::Fingerprint;
use onecopy_core::index::{FingerprintIndex, IndexKey, IndexOptions};
use onecopy_core::pages::{inspect_manifest, PageStore, PageStoreOptions};
use onecopy_core::storage::{join, Storage};

use crate::error::{BackupError, Result};
use crate::segment::SegmentId;

/// Directory of the index's page store.
pub(crate) const PAGES_DIRECTORY: &str = "meta";
/// Prefix of the index's areas.
const INDEX_NAME: &str = "segments";
/// The page store's files: removing them is how a damaged index is thrown away.
const PAGE_STORE_FILES: [&str; 3] = ["pages", "manifest.0", "manifest.1"];

/// The segment index and the page store it lives in.
pub(crate) struct SegmentIndex {
    pages: PageStore,
    index: FingerprintIndex,
    /// Catalog serial recorded by the last checkpoint (0 for a new index).
    serial: u64,
    /// Entries were added or removed since the last checkpoint (or open).
    changed: bool,
}

impl SegmentIndex {
    /// Opens the index in `storage`, creating it when `meta/` is empty.
    pub(crate) fn open(storage: &Arc<dyn Storage>, options: &IndexOptions) -> Result<Self> {
        let (mut pages, user_state) = PageStore::open(
            Arc::clone(storage),
            PAGES_DIRECTORY,
            PageStoreOptions::default(),
        )?;
        let serial = match user_state.as_slice() {
            [] => 0,
            bytes => u64::from_le_bytes(bytes.try_into().map_err(|_| {
                BackupError::corrupt(
                    "segment index checkpoint",
                    format!("a user state of {} bytes, not 8", bytes.len()),
                )
            })?),
        };
        let index = FingerprintIndex::open(&mut pages, INDEX_NAME, options.clone())?;
        Ok(SegmentIndex {
            pages,
            index,
            serial,
            changed: false,
        })
    }

    /// True when every file of the index exists, so that opening it creates nothing.
    pub(crate) fn exists(storage: &Arc<dyn Storage>) -> Result<bool> {
        for name in PAGE_STORE_FILES {
            if !storage.exists(&join(PAGES_DIRECTORY, name))? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The manifest files that exist but do not hold a valid manifest, with what is wrong
    /// ([`inspect_manifest`]). An empty file is one never written yet. The two sequence
    /// numbers differ by one: checkpoints alternate between the files.
    pub(crate) fn damaged_manifests(storage: &Arc<dyn Storage>) -> Result<Vec<(String, String)>> {
        let mut damaged = Vec::new();
        let mut sequences = Vec::new();
        for (file_index, name) in ["manifest.0", "manifest.1"].into_iter().enumerate() {
            let name = join(PAGES_DIRECTORY, name);
            if !storage.exists(&name)? {
                continue;
            }
            let file = storage.open(&name, false)?;
            let length = file.len()?;
            if length == 0 {
                continue;
            }
            let mut bytes = vec![0u8; length as usize];
            file.read_at(0, &mut bytes)?;
            match inspect_manifest(&bytes, file_index) {
                Err(problem) => damaged.push((name, problem.to_string())),
                Ok(sequence) => sequences.push(sequence),
            }
        }
        if let [first, second] = sequences[..] {
            if first.abs_diff(second) != 1 {
                damaged.push((
                    format!("{PAGES_DIRECTORY}/manifest.0 and {PAGES_DIRECTORY}/manifest.1"),
                    format!("sequence numbers {first} and {second} are not consecutive"),
                ));
            }
        }
        Ok(damaged)
    }

    /// Throws the index's files away and opens a new, empty index (serial 0, so that recovery
    /// fills it from the catalog).
    pub(crate) fn recreate(storage: &Arc<dyn Storage>, options: &IndexOptions) -> Result<Self> {
        for name in PAGE_STORE_FILES {
            storage.remove(&join(PAGES_DIRECTORY, name))?;
        }
        storage.sync_directory(PAGES_DIRECTORY)?;
        let created = SegmentIndex::open(storage, options)?;
        assert_eq!(created.serial, 0, "a new index matches no catalog");
        Ok(created)
    }

    /// Reads every page (checksums) and checks the index's structure and filter; returns the
    /// number of entries.
    pub(crate) fn verify(&mut self) -> Result<u64> {
        self.pages.verify()?;
        Ok(self.index.verify(&mut self.pages)?)
    }

    /// The catalog serial the index matches.
    pub(crate) fn serial(&self) -> u64 {
        self.serial
    }

    /// True when the index holds what its last checkpoint recorded: no entry was added or
    /// removed since, and no damaged bucket page (read after the open-time verification) was
    /// reset to empty.
    pub(crate) fn as_checkpointed(&self) -> bool {
        !self.changed && self.index.counters().damaged_buckets_reset == 0
    }

    /// Bucket pages found damaged (and emptied) since the index was opened.
    pub(crate) fn damaged_buckets(&self) -> u64 {
        self.index.counters().damaged_buckets_reset
    }

    /// Entries stored.
    pub(crate) fn len(&self) -> u64 {
        self.index.len()
    }

    /// Memory the index holds.
    pub(crate) fn memory_bytes(&self) -> u64 {
        self.index.memory_bytes() + self.pages.memory_bytes()
    }

    pub(crate) fn warm(&self, fingerprints: &[Fingerprint]) {
        self.index.warm(fingerprints);
    }

    pub(crate) fn lookup(&mut self, fingerprint: &Fingerprint) -> Result<Option<SegmentId>> {
        Ok(self.index.lookup(&mut self.pages, fingerprint)?)
    }

    pub(crate) fn insert(&mut self, fingerprint: &Fingerprint, segment: SegmentId) -> Result<()> {
        self.changed = true;
        self.index.insert(&mut self.pages, fingerprint, segment)?;
        Ok(())
    }

    /// Removes the entry of `fingerprint` if it names `segment` (another shared segment may
    /// have the same fingerprint after an index loss; only this segment's entry goes).
    pub(crate) fn remove_if(
        &mut self,
        fingerprint: &Fingerprint,
        segment: SegmentId,
    ) -> Result<()> {
        if self.index.lookup(&mut self.pages, fingerprint)? == Some(segment) {
            self.changed = true;
            self.index.remove(&mut self.pages, fingerprint)?;
        }
        Ok(())
    }

    pub(crate) fn for_each_entry(&mut self, visit: impl FnMut(&IndexKey, u64)) -> Result<()> {
        Ok(self.index.for_each_entry(&mut self.pages, visit)?)
    }

    pub(crate) fn remove_key(&mut self, key: &IndexKey) -> Result<()> {
        self.changed = true;
        self.index.remove_key(&mut self.pages, key)?;
        Ok(())
    }

    /// Makes the index durable, recording `serial`: the catalog serial it matches (the
    /// current one, or the next when the index goes first, as in `create`).
    pub(crate) fn checkpoint(&mut self, serial: u64) -> Result<()> {
        self.index.prepare_checkpoint(&mut self.pages)?;
        self.pages.checkpoint(&serial.to_le_bytes())?;
        self.serial = serial;
        self.changed = false;
        Ok(())
    }
}
