//! Hints: knowledge about a write that tells the block translation layer how to treat it
//! (paper 1, "context-aware block-layer deduplication").

pub mod fs;
