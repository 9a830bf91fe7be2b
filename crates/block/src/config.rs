//! Settings of the block device: per repository ([`BlockConfig`], fixed at creation),
//! per process ([`RuntimeOptions`]), and per volume ([`HintSettings`]).

use serde::{Deserialize, Serialize};

use onecopy_core::container::ContainerOptions;
use onecopy_core::fingerprint::FingerprintAlgorithm;
use onecopy_core::index::IndexOptions;

use crate::replicas::ReplicaOptions;

/// Settings chosen when the block face of a repository is first used; they shape what is
/// stored and cannot change afterwards. Saved in `block/config.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BlockConfig {
    /// Fingerprint of blocks. `xxh3` and `crc32c` are paper 5's flash mode: weak hashes whose
    /// matches are confirmed by comparing bytes (`crc32c`, 32 bits, chains the chunks sharing
    /// one).
    pub fingerprint: FingerprintAlgorithm,
    /// Container size and compression of stored blocks.
    pub containers: ContainerOptions,
}

impl Default for BlockConfig {
    fn default() -> Self {
        BlockConfig {
            fingerprint: FingerprintAlgorithm::Blake3,
            containers: ContainerOptions::default(),
        }
    }
}

impl BlockConfig {
    /// Paper 5's flash mode: weak fingerprints confirmed by byte comparison (cheap random
    /// reads make the comparison affordable on flash).
    pub fn flash() -> Self {
        BlockConfig::flash_with(FingerprintAlgorithm::Xxh3)
    }

    /// Flash mode with the weak fingerprint `fingerprint`: `xxh3` (128 bits, collisions
    /// practically never happen) or `crc32c` (paper 5's 32-bit weak hash, collisions expected
    /// and resolved along chains by byte comparison).
    pub fn flash_with(fingerprint: FingerprintAlgorithm) -> Self {
        assert!(fingerprint.is_weak(), "flash mode uses a weak fingerprint");
        BlockConfig {
            fingerprint,
            ..BlockConfig::default()
        }
    }
}

/// Target false-positive rate of the block device's fingerprint filter: 5%, not paper 1's
/// 1%, so that the filter fits the block device's memory budget (docs/DESIGN.md, "Membership
/// filter", gives the reasoning). The lab's paper 1 runs set the paper's 1%.
pub const FILTER_FALSE_POSITIVE_RATE: f64 = 0.05;

/// Settings of one running engine; they can differ between runs.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RuntimeOptions {
    /// The fingerprint index: filter, entry cache policy and budget, injected latency.
    pub index: IndexOptions,
    /// Bytes of the content-addressed read cache (0 turns it off).
    pub content_cache_bytes: u64,
    /// Replacement policy of the content cache: `arc` or `lru`.
    pub content_cache_policy: String,
    /// Clean metadata pages (block maps, chunk table) kept in memory.
    pub metadata_cache_pages: usize,
    /// A checkpoint starts once the journal holds this many bytes.
    pub checkpoint_journal_bytes: u64,
    /// A checkpoint starts once this many metadata pages are dirty.
    pub checkpoint_dirty_pages: usize,
    /// Background work (deferred deduplication, checkpoints, selective duplication) waits
    /// for this many milliseconds without requests before it runs.
    pub idle_milliseconds: u64,
    /// Dynamic replica retrieval and selective duplication (paper 4 §3.3, §3.4).
    #[serde(default)]
    pub replicas: ReplicaOptions,
}

impl RuntimeOptions {
    /// The defaults suited to a block device created with `config`: flash mode (weak
    /// fingerprints) uses paper 5's LFU index cache, everything else ARC.
    pub fn for_config(config: &BlockConfig) -> RuntimeOptions {
        let mut runtime = RuntimeOptions::default();
        if config.fingerprint.is_weak() {
            runtime.index.cache_policy = onecopy_core::index::cache::CachePolicy::Lfu;
        }
        runtime
    }
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        RuntimeOptions {
            index: IndexOptions {
                false_positive_rate: FILTER_FALSE_POSITIVE_RATE,
                ..IndexOptions::default()
            },
            content_cache_bytes: 64 << 20,
            content_cache_policy: "arc".to_string(),
            metadata_cache_pages: 16384,
            checkpoint_journal_bytes: 256 << 20,
            checkpoint_dirty_pages: 32768,
            idle_milliseconds: 2000,
            replicas: ReplicaOptions::default(),
        }
    }
}

/// Which hint sources a volume uses (paper 1 §3.2). Each can be switched off so every
/// experiment runs with and without it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HintSettings {
    /// Honour `onecopy volume hint --no-dedup` ranges.
    pub explicit: bool,
    /// Derive metadata and journal ranges from ext2/3/4 and xfs superblocks written to the
    /// volume, and recognise metadata blocks by content.
    pub filesystem: bool,
    /// Prefetch fingerprints: NBD_CMD_CACHE ranges, and reads that look like copying.
    pub prefetch: bool,
    /// Deferred deduplication ("dedup on GC"): store writes without deduplicating and
    /// deduplicate blocks that stayed unchanged for this many seconds. `None` deduplicates
    /// inline.
    pub deferred_seconds: Option<u64>,
}

impl Default for HintSettings {
    fn default() -> Self {
        HintSettings {
            explicit: true,
            filesystem: true,
            prefetch: true,
            deferred_seconds: None,
        }
    }
}

impl HintSettings {
    /// Every hint source off: plain inline deduplication of every block.
    pub fn none() -> Self {
        HintSettings {
            explicit: false,
            filesystem: false,
            prefetch: false,
            deferred_seconds: None,
        }
    }
}
