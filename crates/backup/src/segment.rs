//! Segments, their two-level reference counts, and container records (paper 2 §2.4.2, §3.1).
//!
//! A **segment** is a run of whole chunks cut by the two-level chunker and the unit of inline
//! deduplication. Each segment lives in exactly one container (or none, when every chunk is
//! null or removed). Its catalog records:
//!
//! - a **head** (`segment_heads`, small, rewritten often): fingerprint, state, and the
//!   *segment reference count* — occurrences of the segment in live recipes;
//! - a **record** (`segments`): fingerprint, state, container, the segment's **frames**, and
//!   one entry per chunk with its fingerprint, size, where it is stored, and its *chunk
//!   reference count* — archival recipes holding a direct reference to it.
//!
//! **Frames.** A segment's stored chunks are not compressed one by one: consecutive stored
//! chunks, up to [`FRAME_RAW_BYTES_MAX`] together, are compressed as one **frame**, one record
//! of the container (the core container format; the record header's fingerprint is the hash
//! of the frame's chunk fingerprints, in order). A chunk is read by decoding its frame and
//! taking its bytes at its offset in the frame (`within`). Compressing 256 KiB instead of
//! 4 KiB finds the redundancy between the small files a segment holds, and one record header
//! per frame instead of per chunk saves its 108 bytes (header and trailer entry) per chunk. A
//! removed chunk's bytes stay in its frame until the segment is repackaged (settling,
//! compaction, repair), which writes frames again from the stored chunks: a frame all of whose
//! bytes are still stored chunks is copied as it is, any other is rebuilt from them and
//! compressed again.
//!
//! States: a **shared** segment is in a shared container (timestamp 0), complete, and in the
//! segment index, so new backups may deduplicate against it. When its reference count drops
//! to zero it is *settled*: chunks with no direct reference are removed, and the others are
//! repackaged into an **archival** container stamped with the time of the backup that released
//! it; an archival segment is out of the index and never gains live references again. A chunk
//! may be removed only when its segment's count is zero and its own count is zero; a segment
//! whose chunks are all removed or null dies (its records are deleted).
//!
//! **Containers.** A container record lists the segments stored in it, its kind and time
//! stamp (also in the container's trailer). A container is removed when its last segment
//! dies or moves out, which is how deleting a backup drops its containers without reading them.
//!
//! A record is stored in parts of at most [`SEGMENT_PART_BYTES`] under the keys
//! `id << SEGMENT_PART_BITS | part` ([`put_segment_record`]): redb gives a value larger than a
//! page a run of pages rounded up to a power of two, so whole records (mostly 15-40 KB) left
//! about a third of their pages empty, where parts of two pages fill them.
//!
//! Formats (all integers little-endian, each record ends with a CRC-32C):
//!
//! ```text
//! head:      fingerprint [32] | state u8 | live references u32
//! record:    "SEG3" | fingerprint [32] | state u8 | container+1 varint (0 = none) |
//!            frame count varint | frame* | chunk count varint | chunk*
//! frame:     offset varint | stored bytes varint | raw bytes varint | flags varint | crc u32
//! chunk:     kind u8 (0 zero, 1 stored next, 2 removed, 3 lost, 4 stored placed,
//!            5 borrowed) | raw bytes varint |
//!            [stored: fingerprint [32] | direct references varint]
//!            [stored placed: frame varint | within varint]
//!            [lost: fingerprint [32] | direct references varint]
//!            [borrowed: fingerprint [32] | direct references varint | segment varint |
//!             index varint]
//! container: "CNT1" | kind u8 (1 shared, 2 archival) | timestamp u64 | bytes u64 |
//!            segment count u32 | segment id u64*
//! ```
//!
//! `varint` is unsigned LEB128 ([`crate::codec`]). A *stored next* chunk lies in the frame of
//! the stored chunk before it, right after it (the common case: no bytes for its place); a
//! *stored placed* chunk names its frame and offset. A zero or removed chunk keeps only its
//! size: nothing looks its fingerprint up (reverse deduplication matches stored chunks, and
//! a removed chunk can never be referenced directly), and after reverse deduplication most
//! chunks of a series are removed ones, so they are most of the catalog: 2-3 bytes each,
//! where fixed-width fields with every chunk's fingerprint and reference count would take 41.
//!
//! A **lost** chunk is one whose stored bytes a repair found damaged with no intact copy
//! anywhere ([`crate::losses`]): it keeps its fingerprint and its references, so that reads of
//! it fail naming the loss, reference counts stay right, and reverse deduplication can still
//! point a backup at an intact copy the successor stores.

use onecopy_core::catalog::{CatalogView, CatalogWrite, IdTable};
use onecopy_core::container::{ChunkLocation, ContainerId};
use onecopy_core::fingerprint::Fingerprint;

use crate::codec::{Decoder, Encoder};
use crate::error::{BackupError, Result};

/// Names a segment; allocated increasing, never reused while the segment exists.
pub type SegmentId = u64;

pub(crate) const SEGMENT_HEADS: IdTable = IdTable("segment_heads");
/// Segment records, in parts: see [`put_segment_record`].
const SEGMENTS: IdTable = IdTable("segments");
pub(crate) const CONTAINERS: IdTable = IdTable("containers");

/// Most bytes of one part of a segment record: two 4 KiB pages less redb's entry overhead.
const SEGMENT_PART_BYTES: usize = 8000;
/// Bits of a part's key that number the parts of one record.
const SEGMENT_PART_BITS: u32 = 12;
/// Largest segment id the keys of parts hold (the next id's first key still fits).
const SEGMENT_ID_MAX: SegmentId = (u64::MAX >> SEGMENT_PART_BITS) - 1;
/// Largest encoded segment record (32 MB, about 700,000 stored chunks).
const SEGMENT_RECORD_BYTES_MAX: usize = SEGMENT_PART_BYTES << SEGMENT_PART_BITS;

/// The key range `[start, end)` of segment `id`'s parts, starting at part `from` (`None` for
/// an id no record can have, as a damaged recipe may name).
fn part_keys(id: SegmentId, from: usize) -> Option<(u64, u64)> {
    let first = (id <= SEGMENT_ID_MAX).then_some(id << SEGMENT_PART_BITS)?;
    Some((first + from as u64, first + (1 << SEGMENT_PART_BITS)))
}

/// [`part_keys`] of a segment this store allocated.
fn allocated_part_keys(id: SegmentId, from: usize) -> (u64, u64) {
    part_keys(id, from).unwrap_or_else(|| panic!("segment id {id} above {SEGMENT_ID_MAX}"))
}

/// Writes segment `id`'s record in parts, and removes parts an earlier, longer record left.
pub(crate) fn put_segment_record(
    write: &mut CatalogWrite,
    id: SegmentId,
    record: &SegmentRecord,
) -> Result<()> {
    let bytes = record.encode();
    if bytes.len() > SEGMENT_RECORD_BYTES_MAX {
        return Err(BackupError::InvalidArgument(format!(
            "segment {id} has {} chunks, more than a catalog record holds: use larger chunks \
             or smaller segments",
            record.chunks.len()
        )));
    }
    let (first, _) = allocated_part_keys(id, 0);
    for (part, piece) in bytes.chunks(SEGMENT_PART_BYTES).enumerate() {
        write.put_id(SEGMENTS, first + part as u64, piece)?;
    }
    remove_parts(write, id, bytes.len().div_ceil(SEGMENT_PART_BYTES))
}

/// Removes segment `id`'s record.
pub(crate) fn remove_segment_record(write: &mut CatalogWrite, id: SegmentId) -> Result<()> {
    remove_parts(write, id, 0)
}

fn remove_parts(write: &mut CatalogWrite, id: SegmentId, from: usize) -> Result<()> {
    let (start, end) = allocated_part_keys(id, from);
    for (key, _) in write.range_id(SEGMENTS, start, end)? {
        write.remove_id(SEGMENTS, key)?;
    }
    Ok(())
}

/// The encoded record of segment `id`, its parts joined (`None` when it has none).
pub(crate) fn segment_record_bytes(
    view: &impl CatalogView,
    id: SegmentId,
) -> Result<Option<Vec<u8>>> {
    let Some((start, end)) = part_keys(id, 0) else {
        return Ok(None);
    };
    let parts = view.range_id(SEGMENTS, start, end)?;
    if parts.is_empty() {
        return Ok(None);
    }
    join_parts(id, parts).map(Some)
}

/// Every segment's encoded record, in id order.
pub(crate) fn segment_records(view: &impl CatalogView) -> Result<Vec<(SegmentId, Vec<u8>)>> {
    let mut records = Vec::new();
    let mut parts = view.range_id(SEGMENTS, 0, u64::MAX)?.into_iter().peekable();
    while let Some(&(key, _)) = parts.peek() {
        let id = key >> SEGMENT_PART_BITS;
        let mut of_id = Vec::new();
        while let Some(part) = parts.next_if(|(key, _)| key >> SEGMENT_PART_BITS == id) {
            of_id.push(part);
        }
        records.push((id, join_parts(id, of_id)?));
    }
    Ok(records)
}

/// Joins the parts of segment `id`'s record, read in key order; a missing part is damage
/// (the record's CRC would find it too, but this names it).
fn join_parts(id: SegmentId, parts: Vec<(u64, Vec<u8>)>) -> Result<Vec<u8>> {
    let mut bytes = Vec::with_capacity(parts.iter().map(|(_, piece)| piece.len()).sum());
    for (expected, (key, piece)) in parts.into_iter().enumerate() {
        let part = key & ((1 << SEGMENT_PART_BITS) - 1);
        if part != expected as u64 {
            return Err(BackupError::corrupt(
                format!("segment {id}"),
                format!("record part {expected} missing"),
            ));
        }
        bytes.extend_from_slice(&piece);
    }
    Ok(bytes)
}

/// Magic of segment records.
const SEGMENT_MAGIC: &[u8; 4] = b"SEG3";
/// Most raw bytes of one frame (a chunk larger than this is a frame of its own).
pub const FRAME_RAW_BYTES_MAX: usize = 256 << 10;
const _: () = assert!(FRAME_RAW_BYTES_MAX <= onecopy_core::container::CHUNK_BYTES_MAX as usize);

/// Whether a segment may still be deduplicated against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentState {
    /// Complete, in a shared container and in the segment index.
    Shared,
    /// Settled: out of the index, possibly with removed chunks.
    Archival,
}

impl SegmentState {
    fn code(self) -> u8 {
        match self {
            SegmentState::Shared => 1,
            SegmentState::Archival => 2,
        }
    }
    fn decode(decoder: &Decoder, code: u8) -> Result<Self> {
        match code {
            1 => Ok(SegmentState::Shared),
            2 => Ok(SegmentState::Archival),
            _ => decoder.invalid(format!("unknown segment state {code}")),
        }
    }
}

/// The small, often-updated part of a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentHead {
    pub fingerprint: Fingerprint,
    pub state: SegmentState,
    /// Occurrences in live recipes.
    pub live_references: u32,
}

impl SegmentHead {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut encoder = Encoder::with_capacity(44);
        encoder.fingerprint(&self.fingerprint);
        encoder.u8(self.state.code());
        encoder.u32(self.live_references);
        encoder.finish()
    }

    pub(crate) fn decode(bytes: &[u8], id: SegmentId) -> Result<Self> {
        let what = format!("head of segment {id}");
        let mut decoder = Decoder::new_checked(bytes, &what)?;
        let fingerprint = decoder.fingerprint()?;
        let code = decoder.u8()?;
        let state = SegmentState::decode(&decoder, code)?;
        let live_references = decoder.u32()?;
        decoder.finish()?;
        Ok(SegmentHead {
            fingerprint,
            state,
            live_references,
        })
    }
}

/// Where a stored chunk's bytes are: in frame `frame` of its segment, from raw byte `within`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkPlace {
    pub frame: u32,
    pub within: u32,
}

/// Where a chunk of a segment is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkStorage {
    /// A null chunk: never stored.
    Zero,
    /// In a frame of the segment's container.
    Stored(ChunkPlace),
    /// Removed by reverse deduplication or deletion; nothing may reference it directly.
    Removed,
    /// Its stored bytes were damaged and no intact copy was found; a repair recorded the loss
    /// ([`crate::losses`]). Referenced like a stored chunk; every read of it fails.
    Lost,
    /// Not stored here: the same bytes are chunk `index` of segment `segment`, a stored (or
    /// lost) chunk of another segment written earlier by the same backup (finer inline
    /// deduplication). That chunk counts this one among its direct references, so it stays
    /// while this one does. Referenced like a stored chunk.
    Borrowed { segment: SegmentId, index: u32 },
}

impl ChunkStorage {
    /// True for a chunk whose bytes can be read (or whose loss is recorded): stored, lost or
    /// borrowed, what a recipe may reference.
    pub fn is_held(&self) -> bool {
        matches!(
            self,
            ChunkStorage::Stored(_) | ChunkStorage::Lost | ChunkStorage::Borrowed { .. }
        )
    }
}

/// One chunk of a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentChunk {
    /// The fingerprint of a stored or lost chunk. Zero and removed chunks do not keep theirs:
    /// read back from the catalog, it is all zeros.
    pub fingerprint: Fingerprint,
    pub raw_bytes: u32,
    pub storage: ChunkStorage,
    /// Archival recipes holding a direct reference to this chunk.
    pub direct_references: u32,
}

/// The full record of a segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentRecord {
    pub fingerprint: Fingerprint,
    pub state: SegmentState,
    pub container: Option<ContainerId>,
    /// The frames of the segment in `container`: each a container record whose raw bytes
    /// hold stored chunks (and, until the segment is repackaged, removed ones).
    pub frames: Vec<ChunkLocation>,
    pub chunks: Vec<SegmentChunk>,
}

impl SegmentRecord {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut encoder =
            Encoder::with_capacity(64 + self.frames.len() * 16 + self.chunks.len() * 36);
        encoder.raw(SEGMENT_MAGIC);
        encoder.fingerprint(&self.fingerprint);
        encoder.u8(self.state.code());
        encoder.varint(self.container.map_or(0, |id| id + 1));
        encoder.varint(self.frames.len() as u64);
        for frame in &self.frames {
            assert_eq!(Some(frame.container), self.container);
            encoder.varint(frame.offset.into());
            encoder.varint(frame.stored_bytes.into());
            encoder.varint(frame.raw_bytes.into());
            encoder.varint(frame.flags.into());
            encoder.u32(frame.checksum);
        }
        encoder.varint(self.chunks.len() as u64);
        // Where a stored chunk lies when it follows the previous stored chunk in its frame.
        let mut next_place: Option<ChunkPlace> = None;
        for chunk in &self.chunks {
            match chunk.storage {
                ChunkStorage::Zero | ChunkStorage::Removed => {
                    assert_eq!(
                        chunk.direct_references, 0,
                        "only stored chunks are referenced directly"
                    );
                    encoder.u8(if chunk.storage == ChunkStorage::Zero {
                        0
                    } else {
                        2
                    });
                    encoder.varint(chunk.raw_bytes.into());
                }
                ChunkStorage::Stored(place) => {
                    let frame = &self.frames[place.frame as usize];
                    assert!(
                        place.within as u64 + chunk.raw_bytes as u64 <= frame.raw_bytes as u64,
                        "a chunk lies inside its frame"
                    );
                    let follows = next_place == Some(place);
                    encoder.u8(if follows { 1 } else { 4 });
                    encoder.varint(chunk.raw_bytes.into());
                    encoder.fingerprint(&chunk.fingerprint);
                    encoder.varint(chunk.direct_references.into());
                    if !follows {
                        encoder.varint(place.frame.into());
                        encoder.varint(place.within.into());
                    }
                    next_place = Some(ChunkPlace {
                        frame: place.frame,
                        within: place.within + chunk.raw_bytes,
                    });
                }
                ChunkStorage::Lost => {
                    encoder.u8(3);
                    encoder.varint(chunk.raw_bytes.into());
                    encoder.fingerprint(&chunk.fingerprint);
                    encoder.varint(chunk.direct_references.into());
                }
                ChunkStorage::Borrowed { segment, index } => {
                    encoder.u8(5);
                    encoder.varint(chunk.raw_bytes.into());
                    encoder.fingerprint(&chunk.fingerprint);
                    encoder.varint(chunk.direct_references.into());
                    encoder.varint(segment);
                    encoder.varint(index.into());
                }
            }
        }
        encoder.finish()
    }

    pub(crate) fn decode(bytes: &[u8], id: SegmentId) -> Result<Self> {
        let what = format!("record of segment {id}");
        let mut decoder = Decoder::new_checked(bytes, &what)?;
        let magic = [decoder.u8()?, decoder.u8()?, decoder.u8()?, decoder.u8()?];
        if &magic != SEGMENT_MAGIC {
            return decoder.invalid("bad magic");
        }
        let fingerprint = decoder.fingerprint()?;
        let code = decoder.u8()?;
        let state = SegmentState::decode(&decoder, code)?;
        let container = decoder.varint()?.checked_sub(1);
        let frame_count = decoder.varint()?;
        if frame_count > 0 && container.is_none() {
            return decoder.invalid("frames without a container");
        }
        let mut frames = Vec::with_capacity(frame_count.min(1 << 16) as usize);
        for _ in 0..frame_count {
            frames.push(ChunkLocation {
                container: container.unwrap_or_default(),
                offset: decoder.varint_u32()?,
                stored_bytes: decoder.varint_u32()?,
                raw_bytes: decoder.varint_u32()?,
                flags: decoder.varint_u32()?,
                checksum: decoder.u32()?,
            });
        }
        let count = decoder.varint()?;
        let mut chunks = Vec::with_capacity(count.min(1 << 20) as usize);
        let mut next_place: Option<ChunkPlace> = None;
        for _ in 0..count {
            let kind = decoder.u8()?;
            let raw_bytes = decoder.varint_u32()?;
            let (storage, fingerprint, direct_references) = match kind {
                0 => (ChunkStorage::Zero, Fingerprint::ZERO, 0),
                2 => (ChunkStorage::Removed, Fingerprint::ZERO, 0),
                1 | 4 => {
                    let fingerprint = decoder.fingerprint()?;
                    let direct_references = decoder.varint_u32()?;
                    let place = if kind == 4 {
                        ChunkPlace {
                            frame: decoder.varint_u32()?,
                            within: decoder.varint_u32()?,
                        }
                    } else {
                        match next_place {
                            Some(place) => place,
                            None => {
                                return decoder.invalid("a stored chunk with no frame before it")
                            }
                        }
                    };
                    let fits = frames.get(place.frame as usize).is_some_and(|frame| {
                        place.within as u64 + raw_bytes as u64 <= frame.raw_bytes as u64
                    });
                    if !fits {
                        return decoder.invalid(format!(
                            "a stored chunk at {} of frame {} does not lie inside a frame",
                            place.within, place.frame
                        ));
                    }
                    next_place = Some(ChunkPlace {
                        frame: place.frame,
                        within: place.within + raw_bytes,
                    });
                    (ChunkStorage::Stored(place), fingerprint, direct_references)
                }
                3 => {
                    let fingerprint = decoder.fingerprint()?;
                    (ChunkStorage::Lost, fingerprint, decoder.varint_u32()?)
                }
                5 => {
                    let fingerprint = decoder.fingerprint()?;
                    let direct_references = decoder.varint_u32()?;
                    let storage = ChunkStorage::Borrowed {
                        segment: decoder.varint()?,
                        index: decoder.varint_u32()?,
                    };
                    (storage, fingerprint, direct_references)
                }
                _ => return decoder.invalid(format!("unknown chunk kind {kind}")),
            };
            chunks.push(SegmentChunk {
                fingerprint,
                raw_bytes,
                storage,
                direct_references,
            });
        }
        decoder.finish()?;
        Ok(SegmentRecord {
            fingerprint,
            state,
            container,
            frames,
            chunks,
        })
    }

    /// The frame holding a stored chunk at `place`.
    pub fn frame(&self, place: ChunkPlace) -> &ChunkLocation {
        &self.frames[place.frame as usize]
    }

    /// The stored chunks of each frame, as (chunk index, place), in frame order.
    pub fn frame_chunks(&self) -> Vec<Vec<(u32, ChunkPlace)>> {
        let mut by_frame = vec![Vec::new(); self.frames.len()];
        for (index, chunk) in self.chunks.iter().enumerate() {
            if let ChunkStorage::Stored(place) = chunk.storage {
                by_frame[place.frame as usize].push((index as u32, place));
            }
        }
        by_frame
    }

    /// Bytes of the segment's stream.
    pub fn raw_bytes(&self) -> u64 {
        self.chunks.iter().map(|chunk| chunk.raw_bytes as u64).sum()
    }

    /// Bytes the segment occupies in its container (its frames, headers included).
    pub fn stored_bytes(&self) -> u64 {
        self.frames.iter().map(ChunkLocation::footprint_bytes).sum()
    }

    /// Raw bytes of stored chunks in the segment's frames: with [`SegmentRecord::stored_bytes`],
    /// what repackaging the segment keeps.
    pub fn stored_raw_bytes(&self) -> u64 {
        self.chunks
            .iter()
            .filter(|chunk| matches!(chunk.storage, ChunkStorage::Stored(_)))
            .map(|chunk| chunk.raw_bytes as u64)
            .sum()
    }

    /// The container bytes chunk `index` takes: its share of its frame's footprint (frames
    /// compress their chunks together, so a chunk's own stored size is not known). Zero for a
    /// chunk that is not stored.
    pub fn chunk_footprint(&self, index: usize) -> u64 {
        let chunk = &self.chunks[index];
        let ChunkStorage::Stored(place) = chunk.storage else {
            return 0;
        };
        let frame = self.frame(place);
        frame.footprint_bytes() * chunk.raw_bytes as u64 / (frame.raw_bytes as u64).max(1)
    }

    /// True when some frame holds bytes of chunks that are no longer stored (removed or lost
    /// since it was written): repackaging the segment rebuilds it.
    pub fn has_garbage(&self) -> bool {
        let frames_raw: u64 = self.frames.iter().map(|frame| frame.raw_bytes as u64).sum();
        frames_raw != self.stored_raw_bytes()
    }

    /// True when no chunk is stored, lost or borrowed any more: nothing can reference the
    /// segment.
    pub fn is_empty(&self) -> bool {
        !self.chunks.iter().any(|chunk| chunk.storage.is_held())
    }

    /// The chunks this segment borrows, as (target segment, target index).
    pub fn borrowed(&self) -> impl Iterator<Item = (SegmentId, u32)> + '_ {
        self.chunks.iter().filter_map(|chunk| match chunk.storage {
            ChunkStorage::Borrowed { segment, index } => Some((segment, index)),
            _ => None,
        })
    }

    /// True when some chunk is stored (the segment needs a container).
    pub fn has_stored(&self) -> bool {
        self.chunks
            .iter()
            .any(|chunk| matches!(chunk.storage, ChunkStorage::Stored(_)))
    }

    /// True when some chunk is lost.
    pub fn has_lost(&self) -> bool {
        self.chunks
            .iter()
            .any(|chunk| chunk.storage == ChunkStorage::Lost)
    }
}

/// What a container holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ContainerKind {
    /// Segments with live references (time stamp 0: undefined).
    Shared,
    /// Settled segments, stamped with the time of the backup that released them.
    Archival,
}

/// The catalog's record of a container of the backup store: its kind, its time stamp and the
/// segments it holds (the core's chunk store keeps a different, fixed-size
/// `chunk_store::records::ContainerRecord` for the block device's containers).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentContainer {
    pub kind: ContainerKind,
    /// Paper 2's container time stamp (unix nanoseconds; 0 for shared containers).
    pub timestamp: u64,
    /// Size of the container file.
    pub bytes: u64,
    /// Segments stored in it, ascending.
    pub segments: Vec<SegmentId>,
}

impl SegmentContainer {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut encoder = Encoder::with_capacity(32 + self.segments.len() * 8);
        encoder.raw(b"CNT1");
        encoder.u8(match self.kind {
            ContainerKind::Shared => 1,
            ContainerKind::Archival => 2,
        });
        encoder.u64(self.timestamp);
        encoder.u64(self.bytes);
        encoder.u32(self.segments.len() as u32);
        for &segment in &self.segments {
            encoder.u64(segment);
        }
        encoder.finish()
    }

    pub(crate) fn decode(bytes: &[u8], id: ContainerId) -> Result<Self> {
        let what = format!("record of container {id:016x}");
        let mut decoder = Decoder::new_checked(bytes, &what)?;
        if [decoder.u8()?, decoder.u8()?, decoder.u8()?, decoder.u8()?] != *b"CNT1" {
            return decoder.invalid("bad magic");
        }
        let kind = match decoder.u8()? {
            1 => ContainerKind::Shared,
            2 => ContainerKind::Archival,
            other => return decoder.invalid(format!("unknown container kind {other}")),
        };
        let timestamp = decoder.u64()?;
        let bytes = decoder.u64()?;
        let count = decoder.u32()? as usize;
        let mut segments = Vec::with_capacity(count.min(1 << 20));
        for _ in 0..count {
            segments.push(decoder.u64()?);
        }
        decoder.finish()?;
        Ok(SegmentContainer {
            kind,
            timestamp,
            bytes,
            segments,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: records of every chunk kind round-trip, stored chunks that follow each other in
    /// a frame and ones placed anywhere; heads and containers too.
    #[test]
    fn records_round_trip() {
        let frame = |offset: u32, raw_bytes: u32| ChunkLocation {
            container: 5,
            offset,
            stored_bytes: 900,
            raw_bytes,
            flags: 1,
            checksum: 0xdead,
        };
        let stored = |byte: u8, raw_bytes: u32, frame: u32, within: u32| SegmentChunk {
            fingerprint: Fingerprint([byte; 32]),
            raw_bytes,
            storage: ChunkStorage::Stored(ChunkPlace { frame, within }),
            direct_references: byte as u32,
        };
        let record = SegmentRecord {
            fingerprint: Fingerprint([3; 32]),
            state: SegmentState::Archival,
            container: Some(5),
            frames: vec![frame(112, 9000), frame(2000, 5000)],
            chunks: vec![
                stored(1, 4000, 0, 0),
                stored(7, 3000, 0, 4000),
                // A removed chunk's bytes (2000 at 7000) are still in frame 0.
                SegmentChunk {
                    fingerprint: Fingerprint::ZERO,
                    raw_bytes: 2000,
                    storage: ChunkStorage::Removed,
                    direct_references: 0,
                },
                stored(8, 5000, 1, 0),
                SegmentChunk {
                    fingerprint: Fingerprint([9; 32]),
                    raw_bytes: 600,
                    storage: ChunkStorage::Borrowed {
                        segment: 77,
                        index: 3,
                    },
                    direct_references: 1,
                },
                SegmentChunk {
                    fingerprint: Fingerprint::ZERO,
                    raw_bytes: 8192,
                    storage: ChunkStorage::Zero,
                    direct_references: 0,
                },
                SegmentChunk {
                    fingerprint: Fingerprint::ZERO,
                    raw_bytes: 100,
                    storage: ChunkStorage::Removed,
                    direct_references: 0,
                },
                SegmentChunk {
                    fingerprint: Fingerprint([6; 32]),
                    raw_bytes: 3000,
                    storage: ChunkStorage::Lost,
                    direct_references: 4,
                },
            ],
        };
        let encoded = record.encode();
        assert_eq!(&encoded[..4], SEGMENT_MAGIC);
        assert_eq!(SegmentRecord::decode(&encoded, 1).unwrap(), record);
        assert_eq!(record.frame_chunks()[0].len(), 2);
        assert!(record.has_garbage());
        assert_eq!(record.borrowed().collect::<Vec<_>>(), vec![(77, 3)]);
        // A zero or removed chunk's fingerprint is not kept.
        let mut forgetful = record.clone();
        forgetful.chunks[5].fingerprint = Fingerprint([2; 32]);
        forgetful.chunks[2].fingerprint = Fingerprint([4; 32]);
        assert_eq!(forgetful.encode(), encoded);
        // A chunk that does not lie inside its frame is refused.
        for (raw_bytes, within) in [(20u64, 0u64), (10, 1)] {
            let mut outside = Encoder::default();
            outside.raw(SEGMENT_MAGIC);
            outside.fingerprint(&Fingerprint([3; 32]));
            outside.u8(SegmentState::Shared.code());
            outside.varint(6);
            outside.varint(1);
            for field in [112, 900, 10, 1] {
                outside.varint(field);
            }
            outside.u32(0xdead);
            outside.varint(1);
            outside.u8(4);
            outside.varint(raw_bytes);
            outside.fingerprint(&Fingerprint([1; 32]));
            outside.varint(0);
            outside.varint(0);
            outside.varint(within);
            assert!(SegmentRecord::decode(&outside.finish(), 1).is_err());
        }
        // Only `SEG2` records are read: a record under another magic (`SEG1`, a format that
        // was never released) is refused, checksum intact or not.
        // Here: a well-formed `SEG1` record of no chunks and no container.
        let mut other_magic = Encoder::default();
        other_magic.raw(b"SEG1");
        other_magic.fingerprint(&Fingerprint([5; 32]));
        other_magic.u8(SegmentState::Archival.code());
        other_magic.u64(u64::MAX);
        other_magic.u32(0);
        assert!(SegmentRecord::decode(&other_magic.finish(), 1).is_err());
        let empty = SegmentRecord {
            fingerprint: Fingerprint([5; 32]),
            state: SegmentState::Archival,
            container: None,
            frames: Vec::new(),
            chunks: vec![record.chunks[2]],
        };
        assert_eq!(SegmentRecord::decode(&empty.encode(), 2).unwrap(), empty);
        // Damage inside the checksum is caught; a record that lies about its chunks is an
        // error, not a wrong record.
        let mut damaged = encoded.clone();
        damaged[40] ^= 1;
        assert!(SegmentRecord::decode(&damaged, 1).is_err());
        let mut encoder = Encoder::default();
        encoder.raw(&encoded[..encoded.len() - 4]);
        encoder.u8(0); // a chunk more than the count says
        assert!(SegmentRecord::decode(&encoder.finish(), 1).is_err());
        let head = SegmentHead {
            fingerprint: Fingerprint([9; 32]),
            state: SegmentState::Shared,
            live_references: 7,
        };
        assert_eq!(SegmentHead::decode(&head.encode(), 1).unwrap(), head);
        let container = SegmentContainer {
            kind: ContainerKind::Archival,
            timestamp: 123,
            bytes: 4096,
            segments: vec![1, 5, 9],
        };
        assert_eq!(
            SegmentContainer::decode(&container.encode(), 1).unwrap(),
            container
        );
    }

    /// A record of `stored` stored chunks (36 bytes each) in one frame.
    fn record_of(stored: u32) -> SegmentRecord {
        SegmentRecord {
            fingerprint: Fingerprint([1; 32]),
            state: SegmentState::Shared,
            container: Some(2),
            frames: vec![ChunkLocation {
                container: 2,
                offset: 112,
                stored_bytes: 100,
                raw_bytes: stored * 4096,
                flags: 1,
                checksum: 7,
            }],
            chunks: (0..stored)
                .map(|index| SegmentChunk {
                    fingerprint: Fingerprint([(index % 251) as u8; 32]),
                    raw_bytes: 4096,
                    storage: ChunkStorage::Stored(ChunkPlace {
                        frame: 0,
                        within: index * 4096,
                    }),
                    direct_references: 0,
                })
                .collect(),
        }
    }

    /// Goal: a record larger than a part is stored in parts and read back whole; rewritten
    /// shorter it leaves no stale part; records of neighbouring ids stay apart; a missing part
    /// is damage naming the segment, and an id no record can have reads as missing. Method: a
    /// catalog on simulated storage.
    #[test]
    fn records_are_stored_in_parts() {
        use std::sync::Arc;

        use onecopy_core::catalog::Catalog;
        use onecopy_core::storage::{SimulatedStorage, Storage};

        let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
        let catalog = Catalog::open(&storage, "catalog.redb").unwrap();
        let (long, short) = (record_of(1000), record_of(10));
        assert!(long.encode().len() > 4 * SEGMENT_PART_BYTES);
        let mut write = catalog.write().unwrap();
        put_segment_record(&mut write, 5, &long).unwrap();
        put_segment_record(&mut write, 4, &short).unwrap();
        put_segment_record(&mut write, 6, &short).unwrap();
        write.commit().unwrap();
        let read = catalog.read().unwrap();
        let parts = |view: &dyn Fn(u64, u64) -> usize, id: u64| {
            view(id << SEGMENT_PART_BITS, (id + 1) << SEGMENT_PART_BITS)
        };
        let count = |start, end| read.range_id(SEGMENTS, start, end).unwrap().len();
        assert_eq!(
            parts(&count, 5),
            long.encode().len().div_ceil(SEGMENT_PART_BYTES)
        );
        assert_eq!(
            segment_record_bytes(&read, 5).unwrap().unwrap(),
            long.encode()
        );
        let all = segment_records(&read).unwrap();
        let ids: Vec<u64> = all.iter().map(|(id, _)| *id).collect();
        assert_eq!(ids, [4, 5, 6]);
        assert_eq!(all[1].1, long.encode());
        assert_eq!(all[2].1, short.encode());
        drop(read);

        let mut write = catalog.write().unwrap();
        put_segment_record(&mut write, 5, &short).unwrap();
        write.commit().unwrap();
        let read = catalog.read().unwrap();
        let count = |start, end| read.range_id(SEGMENTS, start, end).unwrap().len();
        assert_eq!(parts(&count, 5), 1);
        assert_eq!(
            segment_record_bytes(&read, 5).unwrap().unwrap(),
            short.encode()
        );
        drop(read);

        let mut write = catalog.write().unwrap();
        put_segment_record(&mut write, 5, &long).unwrap();
        write
            .remove_id(SEGMENTS, (5 << SEGMENT_PART_BITS) | 2)
            .unwrap();
        remove_segment_record(&mut write, 6).unwrap();
        write.commit().unwrap();
        let read = catalog.read().unwrap();
        let error = segment_record_bytes(&read, 5).unwrap_err().to_string();
        assert!(
            error.contains("segment 5") && error.contains("part 2"),
            "{error}"
        );
        assert!(segment_records(&read).is_err());
        assert_eq!(segment_record_bytes(&read, 6).unwrap(), None);
        assert_eq!(segment_record_bytes(&read, u64::MAX).unwrap(), None);
    }
}
