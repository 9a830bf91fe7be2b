//! (in progress)
pub mod cache;
