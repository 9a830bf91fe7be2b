//! Frames: a segment's stored chunks compressed together, written and read (the format is in
//! [`crate::segment`]).
//!
//! New segments are cut into frames by [`plan_frames`] and compressed on all cores by the
//! inline phase. Repackaging a segment (settling, compaction, repair) goes through
//! [`FrameWriter`]: a frame whose bytes are all stored chunks is copied as it is, with its
//! checksum checked, and the chunks of any other frame (some of whose chunks were removed or
//! lost, or that a repair put together from intact copies) are written again as new frames,
//! compressed again. A recompression ([`FrameCoding::Recompress`], docs/DESIGN.md,
//! "Recompression") also decodes the whole frames the write path compressed and compresses
//! them again at a stronger level, in parallel, keeping their chunks where they were.

use onecopy_core::container::{
    codec, ChunkHeader, ChunkLocation, ContainerStore, ContainerWriter, CHUNK_COMPRESSED,
    CHUNK_RECOMPRESSED,
};
use onecopy_core::fingerprint::{Fingerprint, Fingerprinter};
use rayon::prelude::*;

use crate::error::Result;
use crate::segment::{ChunkPlace, ChunkStorage, SegmentRecord, FRAME_RAW_BYTES_MAX};

/// Groups chunks, given as (index, raw bytes) in order, into frames of at most
/// [`FRAME_RAW_BYTES_MAX`] raw bytes (a larger chunk is a frame of its own); returns the
/// indexes of each frame's chunks.
pub(crate) fn plan_frames(chunks: impl IntoIterator<Item = (u32, u32)>) -> Vec<Vec<u32>> {
    let mut frames: Vec<Vec<u32>> = Vec::new();
    let mut bytes = 0usize;
    for (index, raw_bytes) in chunks {
        let raw_bytes = raw_bytes as usize;
        match frames.last_mut() {
            Some(frame) if bytes + raw_bytes <= FRAME_RAW_BYTES_MAX => {
                frame.push(index);
                bytes += raw_bytes;
            }
            _ => {
                frames.push(vec![index]);
                bytes = raw_bytes;
            }
        }
    }
    frames
}

/// The fingerprint a frame's container record carries: the hash of its chunks'
/// fingerprints, in the order of their bytes in the frame.
pub(crate) fn frame_fingerprint<'a>(
    fingerprinter: &Fingerprinter,
    fingerprints: impl IntoIterator<Item = &'a Fingerprint>,
) -> Fingerprint {
    let mut bytes = Vec::with_capacity(32 * 32);
    for fingerprint in fingerprints {
        bytes.extend_from_slice(&fingerprint.0);
    }
    fingerprinter.hash(&bytes)
}

/// The raw bytes of the frame at `location`, read, checked against its checksum and
/// decompressed.
pub(crate) fn read_frame(containers: &ContainerStore, location: &ChunkLocation) -> Result<Vec<u8>> {
    let mut raw = vec![0u8; location.raw_bytes as usize];
    containers.read_chunk(location, &mut raw)?;
    Ok(raw)
}

/// The bytes of chunk `index` of `record`, taken from its frame's raw bytes `frame_raw`.
pub(crate) fn chunk_bytes<'a>(record: &SegmentRecord, index: u32, frame_raw: &'a [u8]) -> &'a [u8] {
    let chunk = &record.chunks[index as usize];
    let ChunkStorage::Stored(place) = chunk.storage else {
        panic!("chunk {index} is stored");
    };
    &frame_raw[place.within as usize..(place.within + chunk.raw_bytes) as usize]
}

/// The stored chunks of frame `frame` of `record` when they fill it exactly (every byte of the
/// frame is a stored chunk's, in the order of their indexes), as (index, fingerprint): such a
/// frame can be copied as it is.
pub(crate) fn whole_frame(record: &SegmentRecord, frame: u32) -> Option<Vec<(u32, Fingerprint)>> {
    let mut next = 0u32;
    let mut chunks = Vec::new();
    for (index, chunk) in record.chunks.iter().enumerate() {
        if let ChunkStorage::Stored(place) = chunk.storage {
            if place.frame == frame {
                if place.within != next {
                    return None;
                }
                next += chunk.raw_bytes;
                chunks.push((index as u32, chunk.fingerprint));
            }
        }
    }
    (next == record.frames[frame as usize].raw_bytes && !chunks.is_empty()).then_some(chunks)
}

/// How repackaging writes frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FrameCoding {
    /// Whole frames are copied as they are; new frames are compressed at this level (the
    /// repository's; `None`: stored uncompressed).
    Keep(Option<i32>),
    /// Whole frames the write path compressed are compressed again at this level, and new
    /// frames are compressed at it; both are flagged [`CHUNK_RECOMPRESSED`].
    Recompress(i32),
}

impl FrameCoding {
    fn level(self) -> Option<i32> {
        match self {
            FrameCoding::Keep(level) => level,
            FrameCoding::Recompress(level) => Some(level),
        }
    }
}

/// True when a recompression compresses the frame at `location` again: the write path
/// compressed it. Frames stored uncompressed did not shrink by an eighth at the write path's
/// level and are left alone.
pub(crate) fn awaits_recompression(location: &ChunkLocation) -> bool {
    location.flags & (CHUNK_COMPRESSED | CHUNK_RECOMPRESSED) == CHUNK_COMPRESSED
}

thread_local! {
    /// The raw bytes of the frame a thread is compressing again, reused from frame to frame.
    static RAW: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Compresses the frame at `location` again at `level` from its stored bytes `stored`
/// (checksum checked) into `frame`, and gives `location` its new stored size, flags
/// (with [`CHUNK_RECOMPRESSED`]) and checksum; the raw bytes stay the same. A frame that does
/// not shrink keeps its stored bytes, flagged all the same, so that no later recompression
/// tries it again. `frame` comes from the caller's thread with room for the result: buffers
/// allocated on pool threads and freed on the writing one make the allocator keep more
/// memory with every segment.
fn recompress_frame(
    location: &mut ChunkLocation,
    stored: &[u8],
    level: i32,
    frame: &mut Vec<u8>,
) -> Result<()> {
    RAW.with(|raw| {
        let mut raw = raw.borrow_mut();
        raw.resize(location.raw_bytes as usize, 0);
        codec::decode(location, stored, &mut raw)?;
        location.flags |= CHUNK_RECOMPRESSED;
        if codec::compress_into(&raw, level, frame)? && frame.len() < stored.len() {
            location.stored_bytes = frame.len() as u32;
            location.checksum = codec::checksum(frame);
        } else {
            frame.clear();
            frame.extend_from_slice(stored);
        }
        Ok(())
    })
}

/// Writes one segment's stored chunks into a container as frames; see the module
/// documentation. Chunks are given in the order of their indexes.
pub(crate) struct FrameWriter<'a> {
    writer: &'a mut ContainerWriter,
    fingerprinter: &'a Fingerprinter,
    coding: FrameCoding,
    frames: Vec<ChunkLocation>,
    places: Vec<(u32, ChunkPlace)>,
    /// Chunks waiting to be written as a new frame: (index, fingerprint, raw bytes).
    pending: Vec<(u32, Fingerprint, Vec<u8>)>,
    pending_bytes: usize,
    /// Footprint of what was written (headers included).
    written_bytes: u64,
}

impl<'a> FrameWriter<'a> {
    pub(crate) fn new(
        writer: &'a mut ContainerWriter,
        fingerprinter: &'a Fingerprinter,
        coding: FrameCoding,
    ) -> Self {
        FrameWriter {
            writer,
            fingerprinter,
            coding,
            frames: Vec::new(),
            places: Vec::new(),
            pending: Vec::new(),
            pending_bytes: 0,
            written_bytes: 0,
        }
    }

    /// Copies a whole frame (see [`whole_frame`]) whose stored bytes are `stored`; `chunks`
    /// are its chunks with their raw sizes, in order. The checksum is checked first.
    pub(crate) fn copy(
        &mut self,
        frame: &ChunkLocation,
        stored: &[u8],
        chunks: &[(u32, Fingerprint, u32)],
    ) -> Result<()> {
        self.flush()?;
        let fingerprint = frame_fingerprint(
            self.fingerprinter,
            chunks.iter().map(|(_, fingerprint, _)| fingerprint),
        );
        let location = self
            .writer
            .append_stored(frame.header(fingerprint), stored)?;
        self.written_bytes += location.footprint_bytes();
        let number = self.frames.len() as u32;
        let mut within = 0u32;
        for &(index, _, raw_bytes) in chunks {
            self.places.push((
                index,
                ChunkPlace {
                    frame: number,
                    within,
                },
            ));
            within += raw_bytes;
        }
        assert_eq!(within, location.raw_bytes, "a copied frame is whole");
        self.frames.push(location);
        Ok(())
    }

    /// Adds a chunk to the frame being put together (written once it is full).
    pub(crate) fn push(
        &mut self,
        index: u32,
        fingerprint: Fingerprint,
        raw: Vec<u8>,
    ) -> Result<()> {
        if !self.pending.is_empty() && self.pending_bytes + raw.len() > FRAME_RAW_BYTES_MAX {
            self.flush()?;
        }
        self.pending_bytes += raw.len();
        self.pending.push((index, fingerprint, raw));
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let pending = std::mem::take(&mut self.pending);
        self.pending_bytes = 0;
        let mut raw = Vec::with_capacity(pending.iter().map(|(_, _, bytes)| bytes.len()).sum());
        let number = self.frames.len() as u32;
        for (index, _, bytes) in &pending {
            self.places.push((
                *index,
                ChunkPlace {
                    frame: number,
                    within: raw.len() as u32,
                },
            ));
            raw.extend_from_slice(bytes);
        }
        let fingerprint = frame_fingerprint(
            self.fingerprinter,
            pending.iter().map(|(_, fingerprint, _)| fingerprint),
        );
        let encoded = codec::encode(&raw, self.coding.level())?;
        let location = match (&encoded, self.coding) {
            (codec::Encoded::Compressed(frame), FrameCoding::Recompress(_)) => {
                let header = ChunkHeader {
                    fingerprint,
                    stored_bytes: frame.len() as u32,
                    raw_bytes: raw.len() as u32,
                    flags: CHUNK_COMPRESSED | CHUNK_RECOMPRESSED,
                    checksum: codec::checksum(frame),
                };
                self.writer.append_stored(header, frame)?
            }
            _ => self.writer.append_encoded(&fingerprint, &raw, &encoded)?,
        };
        self.written_bytes += location.footprint_bytes();
        self.frames.push(location);
        Ok(())
    }

    /// Writes what is pending and gives `record` its new frames and places in the writer's
    /// container; chunks that were not given are no longer stored (the caller marks them).
    /// Returns the footprint written (headers included).
    pub(crate) fn finish(mut self, record: &mut SegmentRecord) -> Result<u64> {
        self.flush()?;
        for &(index, place) in &self.places {
            let chunk = &mut record.chunks[index as usize];
            assert!(
                matches!(chunk.storage, ChunkStorage::Stored(_) | ChunkStorage::Lost),
                "only stored chunks (or lost ones found intact elsewhere) are written"
            );
            chunk.storage = ChunkStorage::Stored(place);
        }
        record.frames = self.frames;
        record.container = Some(self.writer.id());
        Ok(self.written_bytes)
    }
}

/// Repackages `record` (its frames read from their container: `stored[frame]`, `None` for
/// frames no stored chunk uses) into `writer`: whole frames are copied (or, recompressing,
/// compressed again), the stored chunks of the others are written again as new frames.
/// Returns the footprint written.
pub(crate) fn repack(
    record: &mut SegmentRecord,
    stored: &[Option<Vec<u8>>],
    writer: &mut ContainerWriter,
    fingerprinter: &Fingerprinter,
    coding: FrameCoding,
) -> Result<u64> {
    let by_frame = record.frame_chunks();
    let whole: Vec<Option<Vec<(u32, Fingerprint)>>> = (0..by_frame.len())
        .map(|number| whole_frame(record, number as u32))
        .collect();
    let recompressed: Vec<Option<(ChunkLocation, Vec<u8>)>> = match coding {
        FrameCoding::Keep(_) => vec![None; by_frame.len()],
        FrameCoding::Recompress(level) => {
            let mut recompressed: Vec<_> = (0..by_frame.len())
                .map(|number| {
                    let location = record.frames[number];
                    let waits = stored[number].is_some()
                        && awaits_recompression(&location)
                        && whole[number].is_some();
                    waits.then(|| {
                        let capacity = codec::compressed_bytes_max(location.raw_bytes as usize);
                        (location, Vec::with_capacity(capacity))
                    })
                })
                .collect();
            recompressed
                .par_iter_mut()
                .enumerate()
                .try_for_each(|(number, slot)| match slot {
                    Some((location, frame)) => {
                        let bytes = stored[number].as_deref().expect("checked above");
                        recompress_frame(location, bytes, level, frame)
                    }
                    None => Ok(()),
                })?;
            recompressed
        }
    };
    let mut frames = FrameWriter::new(writer, fingerprinter, coding);
    for ((number, chunks), whole) in by_frame.iter().enumerate().zip(whole) {
        if chunks.is_empty() {
            continue; // Only removed chunks' bytes: dropped.
        }
        let (location, bytes) = match &recompressed[number] {
            Some((location, bytes)) => (*location, bytes.as_slice()),
            None => (
                record.frames[number],
                stored[number]
                    .as_deref()
                    .expect("every frame with a stored chunk is read"),
            ),
        };
        match whole {
            Some(whole) => {
                let chunks: Vec<(u32, Fingerprint, u32)> = whole
                    .into_iter()
                    .map(|(index, fingerprint)| {
                        (index, fingerprint, record.chunks[index as usize].raw_bytes)
                    })
                    .collect();
                frames.copy(&location, bytes, &chunks)?;
            }
            None => {
                let raw = codec::decode_to_vec(&location, bytes)?;
                for &(index, _) in chunks {
                    let chunk = &record.chunks[index as usize];
                    frames.push(
                        index,
                        chunk.fingerprint,
                        chunk_bytes(record, index, &raw).to_vec(),
                    )?;
                }
            }
        }
    }
    frames.finish(record)
}

/// The stored bytes of every frame of `record` that holds a stored chunk (`None` for the
/// others), read from its container with one read per frame.
pub(crate) fn read_stored_frames(
    containers: &ContainerStore,
    record: &SegmentRecord,
) -> Result<Vec<Option<Vec<u8>>>> {
    let used = record.frame_chunks();
    record
        .frames
        .iter()
        .zip(used)
        .map(|(location, chunks)| {
            if chunks.is_empty() {
                return Ok(None);
            }
            let mut stored = Vec::new();
            containers.read_stored(location, &mut stored)?;
            Ok(Some(stored))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: frames hold whole chunks in order and stay within the limit, except a chunk
    /// larger than the limit, which is alone.
    #[test]
    fn frames_are_planned_in_order_within_the_limit() {
        let max = FRAME_RAW_BYTES_MAX as u32;
        let chunks = [
            (0, 4096),
            (1, max - 4096),
            (2, 1),
            (3, max + 5),
            (4, 10),
            (5, 20),
        ];
        assert_eq!(
            plan_frames(chunks),
            vec![vec![0, 1], vec![2], vec![3], vec![4, 5]]
        );
        assert!(plan_frames([]).is_empty());
    }
}
