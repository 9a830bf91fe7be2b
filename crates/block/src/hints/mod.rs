//! Hints (paper 1 §3.2): what to deduplicate, what not to, and when to prefetch.
//!
//! Paper 1 passes hints from a modified file system in request flags. NBD has no room for
//! them, so the block device gathers the same knowledge from three sources, each of which a
//! volume can switch off ([`HintSettings`](crate::config::HintSettings)):
//!
//! 1. *explicit* ranges set with `onecopy volume hint --no-dedup START..END`;
//! 2. the *file system* itself ([`fs`]): metadata and journal ranges derived from the ext2/3/4
//!    or xfs superblock written to the volume, plus metadata blocks recognised by content;
//! 3. *prefetch*: NBD CACHE requests, and a copy detector ([`CopyDetector`]) that notices when
//!    blocks being written were just read, and then preloads the fingerprints of blocks being
//!    read into the index cache so the copy's writes find them without an on-disk lookup.
//!
//! Deferred deduplication (paper 1's "dedup on GC") is the fourth: writes are stored without
//! deduplication and blocks that stayed unchanged long enough are deduplicated later.

pub mod fs;

use std::collections::{HashSet, VecDeque};

use onecopy_core::container::is_zero;
use onecopy_core::fingerprint::Fingerprint;
use onecopy_core::index::FingerprintBuildHasher;

use crate::volume::VolumeRecord;

/// Why a block is stored without deduplication.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoDedupReason {
    /// An explicit no-dedup range.
    Explicit,
    /// A fixed file-system metadata range (superblocks, descriptors, bitmaps, inode tables).
    Metadata,
    /// The file-system journal or log.
    Journal,
    /// Recognised as metadata by its content (extent nodes, directory blocks).
    Classified,
}

/// How one whole block of a write is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteDecision {
    /// All zeros: nothing is stored.
    Zero,
    /// Fingerprint and deduplicate inline.
    Deduplicate,
    /// Store now, deduplicate later if the block stays unchanged.
    Deferred,
    /// Store without fingerprinting, never deduplicate.
    NoDedup(NoDedupReason),
}

/// Decides how the block at volume byte `offset` with `content` is stored. Cheap: a binary
/// search over the explicit ranges and the file-system map, and the content classifier only
/// for volumes that hold a recognised file system.
pub fn decide_write(
    record: &VolumeRecord,
    filesystem: Option<&fs::MetadataMap>,
    offset: u64,
    content: &[u8],
) -> WriteDecision {
    if is_zero(content) {
        return WriteDecision::Zero;
    }
    let end = offset + content.len() as u64;
    if record.hints.explicit && record.in_no_dedup_range(offset, end) {
        return WriteDecision::NoDedup(NoDedupReason::Explicit);
    }
    if record.hints.filesystem {
        if let Some(map) = filesystem {
            if let Some(kind) = map.lookup(offset, content.len() as u64) {
                let reason = if kind.is_journal() {
                    NoDedupReason::Journal
                } else {
                    NoDedupReason::Metadata
                };
                return WriteDecision::NoDedup(reason);
            }
            // The classifier reads one file-system block; an engine block may hold several
            // (a 4 KiB volume block of a 1 KiB ext file system), and is kept whole when any
            // of them is metadata.
            let fs_block = map.block_bytes() as usize;
            if fs_block > 0
                && content.len().is_multiple_of(fs_block)
                && content
                    .chunks_exact(fs_block)
                    .any(|block| map.classify_block(block).is_some())
            {
                return WriteDecision::NoDedup(NoDedupReason::Classified);
            }
        }
    }
    if record.hints.deferred_seconds.is_some() {
        return WriteDecision::Deferred;
    }
    WriteDecision::Deduplicate
}

/// Fingerprints remembered from recent reads.
const RECENT_READS_MAX: usize = 65536;
/// Writes per observation window of the copy detector.
const COPY_WINDOW_WRITES: u64 = 256;
/// Fraction of a window's writes that must repeat recently read content to call it copying.
const COPY_FRACTION_MIN: f64 = 0.25;

/// Notices copying: writes whose content was read shortly before (paper 1 §3.2.3 ties its
/// prefetch hint to `cp`; we infer the same context from the request stream). While copying is
/// detected, reads prefetch the fingerprints of the blocks they return.
#[derive(Debug, Default)]
pub struct CopyDetector {
    /// Every read and every deduplicated write probes this set: hashed by the fingerprint's
    /// own first bytes, not SipHash, which would be a visible share of a unique overwrite's
    /// server time.
    recent: HashSet<Fingerprint, FingerprintBuildHasher>,
    order: VecDeque<Fingerprint>,
    window_writes: u64,
    window_copies: u64,
    active: bool,
}

impl CopyDetector {
    /// Remembers that a block with this fingerprint was read.
    pub fn observe_read(&mut self, fingerprint: &Fingerprint) {
        if self.recent.insert(*fingerprint) {
            self.order.push_back(*fingerprint);
            if self.order.len() > RECENT_READS_MAX {
                let oldest = self.order.pop_front().expect("non-empty");
                self.recent.remove(&oldest);
            }
        }
    }

    /// Counts a deduplicable write and updates the copying verdict at the end of a window.
    pub fn observe_write(&mut self, fingerprint: &Fingerprint) {
        self.window_writes += 1;
        if self.recent.contains(fingerprint) {
            self.window_copies += 1;
        }
        if self.window_writes >= COPY_WINDOW_WRITES {
            self.active =
                self.window_copies as f64 >= COPY_FRACTION_MIN * self.window_writes as f64;
            self.window_writes = 0;
            self.window_copies = 0;
        }
    }

    /// True while the recent writes look like copying.
    pub fn prefetch_active(&self) -> bool {
        self.active
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HintSettings;
    use crate::volume::ByteRange;
    use onecopy_core::fingerprint::FingerprintAlgorithm;

    fn record(hints: HintSettings) -> VolumeRecord {
        VolumeRecord {
            id: 1,
            name: "v".into(),
            size_bytes: 1 << 20,
            block_bytes: 4096,
            created: 0,
            hints,
            no_dedup_ranges: vec![ByteRange {
                start: 8192,
                end: 12288,
            }],
            deleting: false,
        }
    }

    /// Goal: zeros win, explicit ranges apply only when switched on, deferral applies last.
    #[test]
    fn decisions_follow_the_settings() {
        let data = vec![7u8; 4096];
        let on = record(HintSettings::default());
        assert_eq!(
            decide_write(&on, None, 0, &[0u8; 4096]),
            WriteDecision::Zero
        );
        assert_eq!(
            decide_write(&on, None, 8192, &data),
            WriteDecision::NoDedup(NoDedupReason::Explicit)
        );
        assert_eq!(
            decide_write(&on, None, 0, &data),
            WriteDecision::Deduplicate
        );
        let off = record(HintSettings::none());
        assert_eq!(
            decide_write(&off, None, 8192, &data),
            WriteDecision::Deduplicate
        );
        let deferred = record(HintSettings {
            deferred_seconds: Some(60),
            ..HintSettings::default()
        });
        assert_eq!(
            decide_write(&deferred, None, 0, &data),
            WriteDecision::Deferred
        );
    }

    /// Goal: the copy detector turns on for read-then-write-same-content streams and off for
    /// fresh data.
    #[test]
    fn copy_detector_follows_the_stream() {
        let mut detector = CopyDetector::default();
        let fingerprints: Vec<Fingerprint> = (0..1000u32)
            .map(|i| FingerprintAlgorithm::Blake3.hash(&i.to_le_bytes()))
            .collect();
        for fingerprint in &fingerprints[..COPY_WINDOW_WRITES as usize] {
            detector.observe_read(fingerprint);
            detector.observe_write(fingerprint);
        }
        assert!(detector.prefetch_active());
        for fingerprint in &fingerprints[500..500 + COPY_WINDOW_WRITES as usize] {
            detector.observe_write(fingerprint);
        }
        assert!(!detector.prefetch_active());
    }
}
