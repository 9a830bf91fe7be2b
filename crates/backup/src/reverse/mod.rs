//! Reverse deduplication (paper 2 §2.4): when a backup leaves the live window, its chunks
//! found in the following backup of its series become indirect references to that backup,
//! and chunks no backup references directly any more are removed.
//!
//! Split as an offline engine should be: [`plan`] reads the catalog and computes the new
//! archival recipe, the reference count changes and the [`Settlement`](crate::settle) (which
//! segments are repackaged, which containers are rewritten or dropped) without changing
//! anything, so `onecopy backup reverse --dry-run` can show it; [`execute`] copies data,
//! commits the catalog, updates the index and removes containers, in that order.
//!
//! Memory: the chunk fingerprints of the following backup are held in a hash map while a plan
//! is made (about 50 bytes per chunk: 13 MiB per GiB of backup at 4 KiB chunks), as in the
//! paper's §2.4.1.

pub mod execute;
pub mod plan;

pub use execute::ReverseReport;
pub use plan::ReversePlan;
