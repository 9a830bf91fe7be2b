//! Reads of a backup's stream by offset, for the mounted view: only the chunks a read
//! overlaps are read, each frame holding them checked against its CRC and decoded, and the
//! last frames decoded are kept.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use onecopy_core::container::ContainerId;
use parking_lot::Mutex;

use crate::error::{BackupError, Result};
use crate::resolve::{locate, resolve, ChunkBytes, ChunkSource, SegmentCache};
use crate::series::{load_series, BackupRecord};
use crate::store::BackupStore;

/// Decoded frames the cache keeps at most, in bytes (a few of the kernel's read-ahead
/// windows; frames are at most 256 KiB, or one larger chunk).
pub const CHUNK_CACHE_BYTES_MAX: usize = 32 << 20;

/// A backup's chunks in stream order, with each chunk's stream offset.
pub struct StreamMap {
    sources: Vec<ChunkSource>,
    /// Stream offset of each chunk; one more entry than `sources`: the stream's end.
    starts: Vec<u64>,
}

impl StreamMap {
    /// Resolves `backup`'s recipe and sizes its chunks (segment records are read once each).
    pub fn load(store: &BackupStore, backup: &BackupRecord) -> Result<StreamMap> {
        let read = store.catalog.read()?;
        let series = load_series(&read, &backup.series)?;
        let (sources, _) = resolve(&read, &series, backup)?;
        let mut segments = SegmentCache::new();
        let mut starts = Vec::with_capacity(sources.len() + 1);
        let mut offset = 0u64;
        for source in &sources {
            starts.push(offset);
            offset += match *source {
                ChunkSource::Zero { raw_bytes } => raw_bytes as u64,
                ChunkSource::Stored { segment, index } => {
                    segments
                        .get(&read, segment)?
                        .chunks
                        .get(index as usize)
                        .ok_or_else(|| {
                            BackupError::corrupt(
                                format!("segment {segment}"),
                                format!("no chunk {index}"),
                            )
                        })?
                        .raw_bytes as u64
                }
            };
        }
        starts.push(offset);
        if offset != backup.logical_bytes {
            return Err(BackupError::corrupt(
                format!("backup {}@{}", backup.series, backup.version),
                format!(
                    "its chunks hold {offset} bytes, its record says {}",
                    backup.logical_bytes
                ),
            ));
        }
        Ok(StreamMap { sources, starts })
    }

    /// Bytes of the stream.
    pub fn bytes(&self) -> u64 {
        *self
            .starts
            .last()
            .expect("starts ends with the stream's end")
    }
}

/// Key of a cached frame: where its stored bytes lie.
type ChunkKey = (ContainerId, u32);

/// Reads stream ranges through a small cache of decoded frames, shared by every request
/// thread.
pub struct ChunkReader {
    cache: Mutex<ChunkCache>,
    /// Segment records of chunks read, so that a chunk's location costs one catalog read
    /// per segment.
    segments: Mutex<SegmentCache>,
}

#[derive(Default)]
struct ChunkCache {
    chunks: HashMap<ChunkKey, Arc<Vec<u8>>>,
    /// Oldest first: the order in which chunks leave.
    order: VecDeque<ChunkKey>,
    bytes: usize,
}

impl ChunkCache {
    fn insert(&mut self, key: ChunkKey, chunk: Arc<Vec<u8>>) {
        if self.chunks.contains_key(&key) || chunk.len() > CHUNK_CACHE_BYTES_MAX {
            return;
        }
        while self.bytes + chunk.len() > CHUNK_CACHE_BYTES_MAX {
            let oldest = self
                .order
                .pop_front()
                .expect("a cache over its size holds chunks");
            self.bytes -= self
                .chunks
                .remove(&oldest)
                .expect("ordered chunks are cached")
                .len();
        }
        self.bytes += chunk.len();
        self.order.push_back(key);
        self.chunks.insert(key, chunk);
        assert_eq!(
            self.order.len(),
            self.chunks.len(),
            "one order entry per chunk"
        );
    }
}

impl Default for ChunkReader {
    fn default() -> Self {
        Self::new()
    }
}

impl ChunkReader {
    pub fn new() -> ChunkReader {
        ChunkReader {
            cache: Mutex::new(ChunkCache::default()),
            segments: Mutex::new(SegmentCache::new()),
        }
    }

    /// Stream bytes `[start, end)` of `stream`, which must lie within it.
    pub fn read(
        &self,
        store: &BackupStore,
        stream: &StreamMap,
        start: u64,
        end: u64,
    ) -> Result<Vec<u8>> {
        assert!(start <= end, "a range starts before it ends");
        assert!(end <= stream.bytes(), "a read stays within the stream");
        let mut data = vec![0u8; (end - start) as usize];
        // The chunk holding `start`: the last whose start is at or before it.
        let mut position = stream.starts.partition_point(|&offset| offset <= start) - 1;
        while position < stream.sources.len() && stream.starts[position] < end {
            let chunk_start = stream.starts[position];
            let chunk_end = stream.starts[position + 1];
            let (from, to) = (start.max(chunk_start), end.min(chunk_end));
            if from < to {
                if let Some((frame, at)) = self.chunk(store, stream.sources[position])? {
                    let within =
                        at + (from - chunk_start) as usize..at + (to - chunk_start) as usize;
                    data[(from - start) as usize..(to - start) as usize]
                        .copy_from_slice(&frame[within]);
                }
            }
            position += 1;
        }
        Ok(data)
    }

    /// The decoded frame holding one chunk and where the chunk starts in it; `None` for a
    /// null chunk (zeros, never stored).
    fn chunk(
        &self,
        store: &BackupStore,
        source: ChunkSource,
    ) -> Result<Option<(Arc<Vec<u8>>, usize)>> {
        let ChunkSource::Stored { segment, index } = source else {
            return Ok(None);
        };
        let (bytes, _) = {
            let read = store.catalog.read()?;
            locate(&read, &mut self.segments.lock(), segment, index)?
        };
        let (location, within) = match bytes {
            ChunkBytes::Zero => return Ok(None),
            ChunkBytes::Frame { frame, within } => (frame, within as usize),
            ChunkBytes::Lost => {
                return Err(BackupError::Lost {
                    what: format!("chunk {index} of segment {segment}"),
                    detail: "its bytes were damaged".to_string(),
                })
            }
        };
        let key = (location.container, location.offset);
        if let Some(cached) = self.cache.lock().chunks.get(&key) {
            return Ok(Some((Arc::clone(cached), within)));
        }
        let raw = Arc::new(crate::frames::read_frame(&store.containers, &location)?);
        self.cache.lock().insert(key, Arc::clone(&raw));
        Ok(Some((raw, within)))
    }
}
