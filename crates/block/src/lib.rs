//! onecopy's deduplicating block device.
//!
//! Volumes are virtual disks whose blocks are deduplicated inline into one chunk store shared
//! by every volume of a repository (paper 1 §3.3): the block translation layer maps each
//! volume block to a chunk id, the chunk store maps ids to stored chunks with reference
//! counts, and the fingerprint index finds duplicates. Reads go through a content-addressed
//! cache (paper 4 §3.2), and a block missing from it is read from the copy of its content that
//! costs least under a device model, among them duplicates of popular content made in idle
//! time ([`replicas`], paper 4 §3.3 and §3.4). Hints (paper 1 §3.2) decide which writes are deduplicated inline,
//! stored without deduplication, or deduplicated later. The [`Engine`] serves all volumes;
//! [`export`] puts them on the network as NBD exports, and [`control`] lets other processes
//! read a running device's live state.

pub mod cache;
pub mod changes;
pub mod config;
pub mod control;
pub mod engine;
pub mod error;
pub mod export;
pub mod hints;
pub mod replicas;
pub mod volume;

pub use config::{BlockConfig, HintSettings, RuntimeOptions, FILTER_FALSE_POSITIVE_RATE};
pub use engine::{Engine, EngineStats, OpenMode, VolumeStats};
pub use error::{BlockError, Result};
/// A run of bytes with one allocation state ([`Engine::block_status`]), and one write of a
/// batch ([`Engine::write_batch`]): the NBD crate's types, which the export passes through.
pub use onecopy_nbd::{AllocationExtent, WriteRequest};
pub use volume::{ByteRange, VolumeId, VolumeRecord};
