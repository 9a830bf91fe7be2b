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
//! manifest file) and which was verified whole when it was read at open or written. The
//! store keeps each area's last 4 KiB run of entries (512 pages' checksums), so loading pages
//! in order costs one read of the manifest per run; in exchange the page tables, which grow
//! with the stored data, are half the size.
//!
//! One module per job: `store` is the shadow-paged store and its checkpoint; `manifest`
//! encodes and decodes the manifest (a codec that knows nothing of the store); `free_slots`
//! is the bitmap of free slots; `cache` holds clean pages; `records` lays fixed-size
//! records over an area. The types every part shares ([`Page`], [`AreaId`]) are defined
//! here.

mod absent_file;
mod cache;
mod free_slots;
mod manifest;
mod records;
mod store;

pub use manifest::inspect_manifest;
pub use records::RecordArea;
pub use store::{AreaUsage, DamagedPage, ManifestState, PageStore, PageStoreOptions};

/// Bytes in a page (and in a slot of the `pages` file).
pub const PAGE_BYTES: usize = 4096;

/// One page of metadata.
pub type Page = [u8; PAGE_BYTES];

/// Identifies an area within a [`PageStore`]; returned by [`PageStore::area`].
pub type AreaId = usize;

#[cfg(test)]
mod tests;
