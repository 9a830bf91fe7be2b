//! The piece index: small-chunk deduplication that finds data inside big chunks.
//!
//! Terms:
//!
//! - A *piece* of a big chunk is one of the ranges fixed small chunks would cut it into:
//!   every `small_chunk_bytes` from the chunk's start, the last one possibly shorter.
//! - The *piece index* (the core's fingerprint index in areas `pieces.*` of the face's page
//!   store) maps a piece's fingerprint to its chunk and offset ([`PieceValue`]). It is
//!   derived data: a missing entry costs a missed deduplication, never data.
//!
//! Storing: a rank-1 file's new big chunk (one the chunk index did not know) enters the
//! piece index with each of its pieces, in the journal record of the batch that stores it
//! ([`index_pieces`]).
//!
//! Finding, for every chunk a deduplication run cuts:
//!
//! 1. under the engine lock, each chunk the chunk index does not know is looked up in the
//!    piece index by its first piece (a small chunk is one piece); a hit names a chunk and
//!    an offset, whose record gives the chunk's location ([`FsEngine::find_pieces`]);
//! 2. outside the lock the chunk's bytes are read (checksum checked) and the whole of the
//!    new chunk is compared byte for byte with the bytes from that offset on;
//! 3. under the lock, in the batch's journal record, a confirmed match whose chunk still is
//!    where it was compared is mapped: the extent names the stored chunk, the offset and the
//!    length, and holds one reference to the chunk ([`map_piece`]).
//!
//! So a small chunk finds its data inside a big chunk, and a big chunk (of a rank-1 file)
//! finds its data where it lies whole inside another stored chunk: read as one chunk, as
//! its own would be, so a sequential read of the file pays nothing for it. A big chunk
//! whose data is spread over several stored chunks is stored whole: mapping it to them
//! would cost a sequential read a seek for each.
//!
//! Why bytes are compared: the index keeps only the first 16 bytes of a fingerprint, and no
//! record holds a piece's whole fingerprint to confirm a hit against (a chunk record holds
//! the big chunk's). Entries are also not removed when their chunk is freed, which would
//! need the pieces' fingerprints, that is a read of the chunk at every last release. A
//! comparison makes a stale or colliding entry cost a missed deduplication, never wrong
//! data; stale entries are removed when a lookup finds them ([`remove_stale`]) and by
//! `onecopy fs compact` ([`sweep_stale`]).
//!
//! Not guaranteed: a big chunk stays stored whole while any extent maps a piece of it; a
//! read of a piece reads the whole chunk (its checksum covers the whole).

use std::collections::VecDeque;
use std::sync::Arc;

use onecopy_core::chunk_store::{ChunkId, ChunkRead, REFERENCES_MAX};
use onecopy_core::container::{ChunkLocation, CHUNK_UNFINGERPRINTED};
use onecopy_core::fingerprint::Fingerprint;

use crate::changes::{FsChange, FsId};
use crate::error::Result;
use crate::node::{Extent, Ino};
use crate::options::{CHUNK_BYTES_MAX, CHUNK_BYTES_MIN};

use super::{data::punch, FsEngine, State};

/// Pieces start at multiples of this within their chunk (small chunks are powers of two
/// of at least this size).
const PIECE_GRID_BYTES: u64 = CHUNK_BYTES_MIN;
/// Bits of a [`PieceValue`] holding the piece's offset in grid units.
const OFFSET_BITS: u32 = 8;
const _: () = assert!(CHUNK_BYTES_MAX / PIECE_GRID_BYTES <= 1 << OFFSET_BITS);
/// Decoded big chunks a deduplication run keeps for comparisons: a copied range of a file
/// brings runs of pieces of the same few chunks.
const COMPARED_CHUNKS_MAX: usize = 16;
/// Bytes of chunks one call reads for comparisons, at most (8 times a deduplication batch
/// of 4 MiB): a batch whose pieces lie in more chunks stores the rest.
const COMPARE_READ_BYTES_MAX: u64 = 32 << 20;

/// A piece index entry's value: the chunk and the piece's offset in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PieceValue {
    pub chunk: ChunkId,
    pub chunk_offset: u32,
}

impl PieceValue {
    /// Chunk id in the high 56 bits, offset in grid units in the low 8.
    pub(crate) fn encode(self) -> u64 {
        assert!(
            self.chunk < 1 << (64 - OFFSET_BITS),
            "chunk ids fit in 56 bits"
        );
        assert_eq!(
            self.chunk_offset as u64 % PIECE_GRID_BYTES,
            0,
            "pieces start on the grid"
        );
        assert!((self.chunk_offset as u64) < CHUNK_BYTES_MAX);
        (self.chunk << OFFSET_BITS) | (self.chunk_offset as u64 / PIECE_GRID_BYTES)
    }

    pub(crate) fn decode(value: u64) -> PieceValue {
        PieceValue {
            chunk: value >> OFFSET_BITS,
            chunk_offset: ((value & ((1 << OFFSET_BITS) - 1)) * PIECE_GRID_BYTES) as u32,
        }
    }
}

/// The pieces of a chunk of `length` bytes at `small_bytes`, as (offset, length); none
/// when the chunk is not longer than one piece (its own fingerprint then is the piece's).
pub(crate) fn piece_ranges(
    length: usize,
    small_bytes: usize,
) -> impl Iterator<Item = (usize, usize)> {
    assert_eq!(
        small_bytes as u64 % PIECE_GRID_BYTES,
        0,
        "pieces start on the grid"
    );
    let count = if length > small_bytes {
        length.div_ceil(small_bytes)
    } else {
        0
    };
    (0..count).map(move |index| {
        let at = index * small_bytes;
        (at, small_bytes.min(length - at))
    })
}

/// A small chunk found inside a stored chunk, compared byte for byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PieceMatch {
    pub chunk: ChunkId,
    pub chunk_offset: u32,
    /// Where the compared bytes were: the match holds only while the chunk is there.
    pub location: ChunkLocation,
}

/// What [`FsEngine::find_pieces`] found.
pub(crate) struct PieceSearch {
    /// Per small chunk, the piece it equals.
    pub matches: Vec<Option<PieceMatch>>,
    /// Entries found stale: fingerprint and the value it held.
    pub stale: Vec<(Fingerprint, u64)>,
}

/// Decoded chunks kept by a deduplication run for comparisons, by location (a location
/// holds one chunk's bytes for ever).
#[derive(Default)]
pub(crate) struct ComparedChunks {
    entries: VecDeque<(ChunkLocation, Arc<Vec<u8>>)>,
}

impl ComparedChunks {
    fn get(&self, location: &ChunkLocation) -> Option<Arc<Vec<u8>>> {
        self.entries
            .iter()
            .find(|(at, _)| at == location)
            .map(|(_, bytes)| Arc::clone(bytes))
    }

    fn put(&mut self, location: ChunkLocation, bytes: Arc<Vec<u8>>) {
        if self.entries.len() >= COMPARED_CHUNKS_MAX {
            self.entries.pop_back();
        }
        self.entries.push_front((location, bytes));
    }
}

impl FsEngine {
    /// Steps 1 and 2 of the module documentation for the chunks `cuts` of `data` (each its
    /// start and length in `data`) whose fingerprints are `prints`; `probes` are the
    /// fingerprints of their first pieces and the bytes those cover (a small chunk's own
    /// fingerprint and length), looked up in the piece index. The whole chunk is compared,
    /// so a big chunk is found where it lies inside another stored chunk. With
    /// `skip_indexed`, chunks the chunk index knows are not looked up.
    pub(crate) fn find_pieces(
        &self,
        data: &[u8],
        cuts: &[(usize, usize)],
        prints: &[Fingerprint],
        probes: &[(Fingerprint, usize)],
        skip_indexed: bool,
        compared: &mut ComparedChunks,
    ) -> Result<PieceSearch> {
        assert_eq!(cuts.len(), prints.len(), "one fingerprint per chunk");
        assert_eq!(cuts.len(), probes.len(), "one probe per chunk");
        let mut search = PieceSearch {
            matches: vec![None; cuts.len()],
            stale: Vec::new(),
        };
        // (small chunk, entry value, candidate) for each hit whose chunk is in use.
        let mut candidates: Vec<(usize, u64, PieceMatch)> = Vec::new();
        // The bytes of the candidates' chunks: those kept from earlier batches, then those
        // read outside the lock (location, buffer, how).
        let mut bytes_of: Vec<(ChunkLocation, Arc<Vec<u8>>)> = Vec::new();
        let mut reads: Vec<(ChunkLocation, Vec<u8>, ChunkRead)> = Vec::new();
        let mut read_bytes = 0u64;
        {
            let mut state = self.state.lock();
            self.check_usable(&state)?;
            let state = &mut *state;
            for (index, (&(_, length), print)) in cuts.iter().zip(prints).enumerate() {
                if state.pieces.is_empty() {
                    break;
                }
                // A chunk the chunk index knows is referenced whole by the store itself.
                if skip_indexed && state.chunks.index().get(&mut state.pages, print)?.is_some() {
                    continue;
                }
                let (probe, probe_bytes) = &probes[index];
                assert!(*probe_bytes <= length, "a probe covers the chunk's start");
                let Some(value) = state.pieces.lookup(&mut state.pages, probe)? else {
                    continue;
                };
                let piece = PieceValue::decode(value);
                let record = state.chunks.record(&mut state.pages, piece.chunk)?;
                let end = |bytes: usize| piece.chunk_offset as u64 + bytes as u64;
                let raw_bytes = record.location.raw_bytes as u64;
                // A freed id may be in use again by a plain chunk, which waits for its own
                // deduplication: pieces are taken from deduplicated chunks only.
                let plain = record.location.flags & CHUNK_UNFINGERPRINTED != 0;
                if !record.in_use || plain || end(*probe_bytes) > raw_bytes {
                    search.stale.push((*probe, value));
                    continue;
                }
                if end(length) > raw_bytes {
                    // The piece is there; the rest of this chunk is not in that one.
                    continue;
                }
                let location = record.location;
                let known = bytes_of.iter().any(|(at, _)| *at == location)
                    || reads.iter().any(|(at, _, _)| *at == location);
                if !known {
                    if let Some(bytes) = compared.get(&location) {
                        bytes_of.push((location, bytes));
                    } else if read_bytes + location.raw_bytes as u64 <= COMPARE_READ_BYTES_MAX {
                        read_bytes += location.raw_bytes as u64;
                        let mut raw = vec![0u8; location.raw_bytes as usize];
                        let read =
                            state
                                .chunks
                                .plan_read(&mut state.pages, piece.chunk, &mut raw)?;
                        reads.push((location, raw, read));
                    } else {
                        // A batch whose pieces lie in too many chunks: the rest are stored.
                        continue;
                    }
                }
                candidates.push((
                    index,
                    value,
                    PieceMatch {
                        chunk: piece.chunk,
                        chunk_offset: piece.chunk_offset,
                        location,
                    },
                ));
            }
        }
        for (location, mut raw, read) in reads {
            if let ChunkRead::File { file, location } = read {
                onecopy_core::chunk_store::read_located(file.as_ref(), &location, &mut raw)?;
            }
            bytes_of.push((location, Arc::new(raw)));
        }
        for (index, value, found) in candidates {
            let (at, length) = cuts[index];
            let bytes = &bytes_of
                .iter()
                .find(|(location, _)| *location == found.location)
                .expect("every candidate's chunk was read")
                .1;
            let from = found.chunk_offset as usize;
            let (probe, probe_bytes) = probes[index];
            if bytes[from..from + length] == data[at..at + length] {
                search.matches[index] = Some(found);
            } else if bytes[from..from + probe_bytes] != data[at..at + probe_bytes] {
                // The chunk id was freed and reused, or two fingerprints share a key.
                search.stale.push((probe, value));
            }
        }
        for (location, bytes) in bytes_of.into_iter().rev() {
            if compared.get(&location).is_none() {
                compared.put(location, bytes);
            }
        }
        Ok(search)
    }
}

/// Step 3 of the module documentation: maps `[offset, offset + length)` of file `ino` to
/// the piece `found`, unless its chunk moved, was freed or has the most references a chunk
/// takes since it was compared. Returns whether it mapped.
pub(crate) fn map_piece(
    state: &mut State,
    fs: FsId,
    ino: Ino,
    offset: u64,
    length: usize,
    found: &PieceMatch,
) -> Result<bool> {
    let record = state.chunks.record(&mut state.pages, found.chunk)?;
    if !record.in_use || record.location != found.location || record.references >= REFERENCES_MAX {
        return Ok(false);
    }
    assert!(
        found.chunk_offset as u64 + length as u64 <= record.location.raw_bytes as u64,
        "a compared piece lies within its chunk"
    );
    // Referenced before the range is released: the range may map this chunk already.
    state.reference_chunk(found.chunk)?;
    punch(state, fs, ino, offset, offset + length as u64)?;
    state.push(FsChange::Extent {
        fs,
        ino,
        offset,
        extent: Some(Extent {
            chunk: found.chunk,
            chunk_offset: found.chunk_offset,
            length: length as u32,
            plain: false,
        }),
    })?;
    Ok(true)
}

/// Enters the pieces of the new chunk `chunk` into the piece index: `prints` are the
/// fingerprints of its [`piece_ranges`] at `small_bytes`, in order. A piece whose entry
/// names a chunk in use keeps it: data copied again and again then resolves, piece after
/// piece, to the same first chunk, where it lies in order (what rank-1 files reference).
pub(crate) fn index_pieces(
    state: &mut State,
    chunk: ChunkId,
    prints: &[Fingerprint],
    small_bytes: u64,
) -> Result<()> {
    for (index, print) in prints.iter().enumerate() {
        if let Some(value) = state.pieces.get(&mut state.pages, print)? {
            let holder = PieceValue::decode(value).chunk;
            if state.chunks.record(&mut state.pages, holder)?.in_use {
                continue;
            }
        }
        let value = PieceValue {
            chunk,
            chunk_offset: (index as u64 * small_bytes) as u32,
        };
        state.push(FsChange::Piece {
            fingerprint: *print,
            value: Some(value.encode()),
        })?;
    }
    Ok(())
}

/// Removes the entries `stale` found stale, each only if it still holds the value found (a
/// newer chunk's piece may have replaced it since).
pub(crate) fn remove_stale(state: &mut State, stale: &[(Fingerprint, u64)]) -> Result<()> {
    for (print, value) in stale {
        if state.pieces.get(&mut state.pages, print)? == Some(*value) {
            state.push(FsChange::Piece {
                fingerprint: *print,
                value: None,
            })?;
        }
    }
    Ok(())
}

/// Removes every entry whose chunk is not in use (`onecopy fs compact`); returns how many.
/// Entries of a chunk id freed and used again stay until a lookup compares them.
pub(crate) fn sweep_stale(state: &mut State) -> Result<u64> {
    let mut entries = Vec::new();
    let pages = &mut state.pages;
    state
        .pieces
        .for_each_entry(pages, |key, value| entries.push((*key, value)))?;
    let mut removed = 0;
    for (key, value) in entries {
        let piece = PieceValue::decode(value);
        if state.chunks.record(&mut state.pages, piece.chunk)?.in_use {
            continue;
        }
        state.log_if_large()?;
        state.push(FsChange::Piece {
            fingerprint: key.probe(),
            value: None,
        })?;
        removed += 1;
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a piece value keeps chunk and offset through encoding, up to the largest
    /// chunk id and offset. Method: round trips at the limits.
    #[test]
    fn piece_values_round_trip() {
        for (chunk, chunk_offset) in [(1, 0), (7, 4096), ((1 << 56) - 1, 1020 << 10)] {
            let value = PieceValue {
                chunk,
                chunk_offset,
            };
            assert_eq!(PieceValue::decode(value.encode()), value);
        }
    }

    /// Goal: pieces cover a chunk in order, the last one shorter; a chunk of one piece has
    /// none. Method: three lengths.
    #[test]
    fn pieces_cover_the_chunk() {
        let ranges: Vec<_> = piece_ranges(10_000, 4096).collect();
        assert_eq!(ranges, vec![(0, 4096), (4096, 4096), (8192, 1808)]);
        assert_eq!(piece_ranges(4096, 4096).count(), 0);
        assert_eq!(piece_ranges(262_144, 4096).count(), 64);
    }
}
