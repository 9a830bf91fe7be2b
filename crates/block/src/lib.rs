//! The deduplicating block device: volumes, the block translation layer, hints. (in progress)

pub mod hints;
