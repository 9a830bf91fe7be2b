//! (in progress)
pub mod cache;
pub mod disk;
pub mod filter;
