//! Reusing the stored form of chunks that the series' newest backup already holds.
//!
//! RevDedup writes every chunk of a new segment, including the many that the previous backup
//! of the series holds as well: reverse deduplication later removes them from the *older*
//! backup, so the newest one stays contiguous. Those chunks need not be compressed again,
//! though: their compressed bytes already lie in the previous backup's containers. Before
//! compressing the new segments of a batch, the inline phase looks each chunk fingerprint up
//! in the **predecessor map** (fingerprint to location, built from the newest backup's segment
//! records) and, for chunks found, reads the stored bytes (coalesced reads, CRC-checked)
//! instead of calling zstd. A chunk stored raw in the predecessor is stored raw again without
//! trying to compress it. What is written is what compression would have written (same input,
//! same level), so storage and restores are unchanged; only the CPU time of compression is
//! traded for reads of compressed bytes, a fraction of the raw size.
//!
//! Not guaranteed: a read that fails or a checksum that does not match only makes the chunk
//! fall back to compression (a damaged old container must not spread into a new backup). The
//! map is built only when chunks are compressed, and holds at most
//! [`PREDECESSOR_CHUNKS_MAX`] chunks (the first ones of the backup).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use onecopy_core::catalog::CatalogView;
use onecopy_core::container::{codec, ChunkLocation, ContainerId, ContainerStore, Encoded};
use onecopy_core::fingerprint::Fingerprint;
use rayon::prelude::*;

use crate::error::Result;
use crate::recipe::Recipe;
use crate::segment::ChunkStorage;
use crate::series::{load_backup, SeriesRecord};
use crate::store::load_segment;

/// Most chunks the predecessor map holds (about 70 bytes each: 70 MiB, a 4 GiB backup of
/// 4 KiB chunks).
pub const PREDECESSOR_CHUNKS_MAX: usize = 1 << 20;
/// Bytes of the predecessor's containers read ahead by [`PredecessorChunks::advise`], at most.
const ADVISE_BYTES_MAX: u64 = 64 << 20;
/// Two wanted chunks of one container are read together when at most this many bytes lie
/// between them.
const READ_GAP_BYTES_MAX: u64 = 64 << 10;
/// Largest single read.
const READ_BYTES_MAX: u64 = 16 << 20;

/// One coalesced read of a container, and the wanted chunks in it.
struct Span {
    container: ContainerId,
    start: u64,
    end: u64,
    chunks: Vec<(usize, ChunkLocation)>,
}

/// The answers of one span and the bytes it read.
type SpanAnswers = (Vec<(usize, Option<Encoded>)>, u64);

/// Locations of the stored chunks of a series' newest backup, by fingerprint.
pub(crate) struct PredecessorChunks {
    locations: HashMap<Fingerprint, ChunkLocation>,
}

impl PredecessorChunks {
    /// The map of `series`' newest backup, if it has one and it is live.
    pub(crate) fn load(view: &impl CatalogView, series: &SeriesRecord) -> Result<Option<Self>> {
        let Some((_, &newest)) = series.versions.iter().next_back() else {
            return Ok(None);
        };
        let backup = load_backup(view, newest)?;
        let Recipe::Live(references) = Recipe::load(view, backup.id, backup.recipe_parts)? else {
            return Ok(None);
        };
        let segments: BTreeSet<_> = references
            .iter()
            .map(|reference| reference.segment)
            .collect();
        let mut locations = HashMap::new();
        'segments: for segment in segments {
            for chunk in load_segment(view, segment)?.chunks {
                if let ChunkStorage::Stored(location) = chunk.storage {
                    if locations.len() >= PREDECESSOR_CHUNKS_MAX {
                        break 'segments;
                    }
                    locations.insert(chunk.fingerprint, location);
                }
            }
        }
        Ok(Some(PredecessorChunks { locations }))
    }

    /// Asks the disk to read the predecessor's stored chunks ahead, container by container
    /// (the range from its first to its last chunk there), up to [`ADVISE_BYTES_MAX`]: the
    /// reads of [`PredecessorChunks::read`] then find them in memory instead of waiting for
    /// the disk in the middle of the inline phase. Best effort: failures change only speed.
    pub(crate) fn advise(&self, containers: &ContainerStore) {
        let mut ranges: BTreeMap<ContainerId, (u64, u64)> = BTreeMap::new();
        for location in self.locations.values() {
            let start = location.offset as u64;
            let end = start + location.stored_bytes as u64;
            let range = ranges.entry(location.container).or_insert((start, end));
            range.0 = range.0.min(start);
            range.1 = range.1.max(end);
        }
        let mut budget = ADVISE_BYTES_MAX;
        for (container, (start, end)) in ranges {
            let length = (end - start).min(budget);
            if length == 0 {
                break;
            }
            budget -= length;
            if let Ok(file) = containers.file(container) {
                let _ = file.advise_will_need(start, length);
            }
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.locations.len()
    }

    /// Where the predecessor stores a chunk of `raw_bytes` with this fingerprint.
    pub(crate) fn get(&self, fingerprint: &Fingerprint, raw_bytes: usize) -> Option<ChunkLocation> {
        self.locations
            .get(fingerprint)
            .filter(|location| location.raw_bytes as usize == raw_bytes)
            .copied()
    }

    /// Reads the stored form of `wanted` chunks (caller's index, location); returns the index
    /// with its stored form to store again, or `None` when the read or the checksum failed.
    /// A chunk the predecessor stores raw (compression did not pay) is stored raw again,
    /// untried and unread; a compressed one comes with its frame, read back and checked. Also
    /// returns the bytes read.
    pub(crate) fn read(
        containers: &ContainerStore,
        wanted: &[(usize, ChunkLocation)],
    ) -> (Vec<(usize, Option<Encoded>)>, u64) {
        let mut results = Vec::with_capacity(wanted.len());
        let mut by_container: HashMap<ContainerId, Vec<(usize, ChunkLocation)>> = HashMap::new();
        for &(index, location) in wanted {
            if !location.is_compressed() {
                results.push((index, Some(Encoded::Raw)));
            } else {
                by_container
                    .entry(location.container)
                    .or_default()
                    .push((index, location));
            }
        }
        let mut spans: Vec<Span> = Vec::new();
        for (container, mut chunks) in by_container {
            chunks.sort_unstable_by_key(|(_, location)| location.offset);
            for (index, location) in chunks {
                let start = location.offset as u64;
                let end = start + location.stored_bytes as u64;
                if let Some(span) = spans.last_mut().filter(|span| {
                    span.container == container
                        && start <= span.end + READ_GAP_BYTES_MAX
                        && end - span.start <= READ_BYTES_MAX
                }) {
                    span.end = span.end.max(end);
                    span.chunks.push((index, location));
                    continue;
                }
                spans.push(Span {
                    container,
                    start,
                    end,
                    chunks: vec![(index, location)],
                });
            }
        }
        let read: Vec<SpanAnswers> = spans
            .par_iter()
            .map(|span| {
                let (start, end) = (span.start, span.end);
                let mut bytes = vec![0u8; (end - start) as usize];
                let ok = containers
                    .file(span.container)
                    .and_then(|file| file.read_at(start, &mut bytes))
                    .is_ok();
                let decoded = span
                    .chunks
                    .iter()
                    .map(|&(index, location)| {
                        if !ok {
                            return (index, None);
                        }
                        let from = (location.offset as u64 - start) as usize;
                        let stored = &bytes[from..from + location.stored_bytes as usize];
                        let intact = codec::verify(&location, stored).is_ok();
                        (index, intact.then(|| Encoded::Compressed(stored.to_vec())))
                    })
                    .collect();
                (decoded, if ok { end - start } else { 0 })
            })
            .collect();
        let mut read_bytes = 0;
        for (decoded, bytes) in read {
            results.extend(decoded);
            read_bytes += bytes;
        }
        assert_eq!(
            results.len(),
            wanted.len(),
            "every wanted chunk has an answer"
        );
        (results, read_bytes)
    }
}
