//! The onecopy engine core.
//!
//! Every face of onecopy (the NBD block device, the backup store, `analyze`, the lab) is built
//! from the parts in this crate, so that there is one chunker, one fingerprint index and one
//! container format. The write path reads top to bottom through the modules:
//!
//! 1. [`chunking`] cuts a byte stream into chunks (fixed, FastCDC, Rabin, two-level segments).
//! 2. [`fingerprint`] names each chunk by its content (BLAKE3 by default).
//! 3. [`index`] answers "have we stored this fingerprint?" through a filter, a bounded cache
//!    and an on-disk hash index.
//! 4. [`container`] appends new chunks to append-only containers kept in a [`storage`] backend.
//! 5. [`chunk_store`] ties 3 and 4 together with reference counts, and [`gc`] reclaims space.
//! 6. [`pages`] and [`journal`] make the metadata crash-safe; [`catalog`] keeps named objects
//!    (volumes, series, recipes) in an embedded transactional store.
//!
//! [`bytes`] reads and writes the little-endian fields of every on-disk format.
//!
//! `docs/DESIGN.md` at the top of the repository gives the on-disk formats and write ordering.

pub mod bytes;
pub mod catalog;
pub mod check;
pub mod chunk_store;
pub mod chunking;
pub mod container;
pub mod error;
pub mod fingerprint;
pub mod gc;
pub mod index;
pub mod integer_hash;
pub mod journal;
pub mod keys;
pub mod memory;
pub mod pages;
pub mod repository;
pub mod storage;
pub mod units;

pub use error::{Error, Result};
