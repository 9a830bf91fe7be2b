//! Cutting and fingerprinting one stream held in memory on several cores, with exactly the
//! result of doing it on one.
//!
//! Cutting is sequential by nature: each cut is decided from the position of the previous one.
//! But every chunker's next cut depends only on the bytes from its position on and on its
//! [`cut_state`](super::Chunker::cut_state) there (0 for FastCDC, Rabin and fixed chunking;
//! the bytes of the current segment for the two-level chunker). So two runs of the same chunker
//! over the same bytes, started at different positions, cut identically from the first
//! **meeting point** on: a position where both runs start a chunk with equal states.
//! Content-defined chunkers meet within a chunk or two, as after an insertion (see the module
//! documentation of [`super`]); the two-level chunker must also end a segment at the same chunk
//! in both runs, which takes a segment or two.
//!
//! [`chunk_and_fingerprint_parallel`] therefore works in three steps:
//!
//! 1. **Split.** The buffer is split into **pieces**, up to [`PIECES_PER_THREAD`] per thread,
//!    each at least [`PIECE_BYTES_MIN`] long, starting at multiples of the alignment (the fixed
//!    chunk size, the maximum chunk or the maximum segment), so that fixed-size chunking and
//!    runs of maximum-size chunks (zero bytes) meet at once.
//! 2. **Cut in parallel.** On the rayon pool, a fresh chunker cuts each piece from its first
//!    byte until a chunk reaches past the piece's end, and fingerprints the chunks in batches of
//!    [`FINGERPRINT_BATCH_BYTES`] (SIMD lanes across chunks, see
//!    [`FingerprintAlgorithm::hash_batch`]). A chunk near a piece's end sees the bytes after
//!    it, exactly as when the whole buffer is cut at once.
//! 3. **Splice.** The first piece's chunks are those of cutting from byte 0. For every later
//!    piece, the chunker that ended the previous piece keeps cutting serially (the **seam**)
//!    until it reaches a meeting point with the piece's run; the seam's chunks are
//!    fingerprinted, the piece's chunks before the meeting point are discarded and those from
//!    it on are kept as they are. If no meeting point comes before the piece's end (a periodic
//!    buffer can do that), the seam simply covers the whole piece: the result stays exact, only
//!    the time is serial for that piece.
//!
//! The output is identical, chunk for chunk and fingerprint for fingerprint, to
//! [`chunk_and_fingerprint`], which is the same as [`super::SliceChunks`] over the buffer with
//! every chunk fingerprinted by [`FingerprintAlgorithm::hash`].

use rayon::prelude::*;

use super::{Chunker, ChunkerSpec};
use crate::fingerprint::{Fingerprint, FingerprintAlgorithm};

/// The smallest piece cut by one thread. Every piece costs a seam (about one chunk cut twice
/// and fingerprinted serially for content-defined chunking), so pieces must be long against
/// chunks; a buffer shorter than two pieces is cut serially.
pub const PIECE_BYTES_MIN: usize = 8 << 20;

/// Pieces per thread when the buffer is long enough: rayon's work stealing then balances the
/// threads when one core is shared with other work, where one piece per thread would leave the
/// whole result waiting for the slowest thread.
pub const PIECES_PER_THREAD: usize = 4;

/// For the two-level chunker, the smallest piece in maximum segments: its runs meet only at a
/// segment end common to both, which takes a segment or two of serial seam.
pub const PIECE_SEGMENTS_MIN: usize = 4;

/// Chunk bytes fingerprinted per [`FingerprintAlgorithm::hash_batch`] call: enough chunks to
/// fill the SIMD lanes many times over, few enough bytes to be still in the cache after
/// cutting them.
pub const FINGERPRINT_BATCH_BYTES: usize = 1 << 20;

/// A chunk of a buffer cut by [`chunk_and_fingerprint`] or
/// [`chunk_and_fingerprint_parallel`], with its fingerprint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FingerprintedChunk {
    /// Offset of the chunk's first byte in the buffer.
    pub offset: u64,
    /// Length of the chunk in bytes; never 0.
    pub len: usize,
    /// True when this chunk ends a segment (see [`super::Cut::ends_segment`]).
    pub ends_segment: bool,
    /// The fingerprint of the chunk's bytes.
    pub fingerprint: Fingerprint,
}

impl FingerprintedChunk {
    /// The chunk's bytes within `data`, the buffer it was cut from.
    pub fn bytes<'a>(&self, data: &'a [u8]) -> &'a [u8] {
        let start = usize::try_from(self.offset).expect("offsets of an in-memory buffer");
        &data[start..start + self.len]
    }
}

/// Cuts `data` (the whole stream) with a fresh chunker of `spec` and fingerprints every chunk
/// with `algorithm`, on the calling thread. The chunks tile `data` in order.
pub fn chunk_and_fingerprint(
    spec: &ChunkerSpec,
    data: &[u8],
    algorithm: FingerprintAlgorithm,
) -> Vec<FingerprintedChunk> {
    let mut chunker = spec.build();
    let mut chunks = Vec::new();
    let mut fingerprinter = Fingerprinter::new(data, algorithm);
    let end = cut_and_fingerprint(
        data,
        &mut chunker,
        0,
        &mut chunks,
        &mut fingerprinter,
        |_, _| false,
    );
    assert_eq!(end, data.len());
    chunks
}

/// Like [`chunk_and_fingerprint`], with the same result, in up to `threads` times
/// [`PIECES_PER_THREAD`] pieces cut on the current rayon pool (give
/// [`rayon::current_num_threads`] to use it all). Pieces are at least [`PIECE_BYTES_MIN`] long
/// (for the two-level chunker, also [`PIECE_SEGMENTS_MIN`] maximum segments), so a buffer
/// shorter than two is cut serially on the calling thread; see the module documentation.
pub fn chunk_and_fingerprint_parallel(
    spec: &ChunkerSpec,
    data: &[u8],
    algorithm: FingerprintAlgorithm,
    threads: usize,
) -> Vec<FingerprintedChunk> {
    let starts = piece_starts(spec, data.len(), threads);
    if starts.len() < 2 {
        return chunk_and_fingerprint(spec, data, algorithm);
    }
    chunk_and_fingerprint_in_pieces(spec, data, algorithm, &starts).chunks
}

/// The bytes piece boundaries are multiples of: runs of maximum-size chunks (or segments, or
/// fixed-size chunks) started at such boundaries meet the serial run at once.
fn piece_alignment_bytes(spec: &ChunkerSpec) -> usize {
    match *spec {
        ChunkerSpec::Segment { segment, .. } => segment.bytes_max,
        _ => spec.chunk_bytes_max(),
    }
}

/// The first byte of every piece (the first is 0): up to `threads * PIECES_PER_THREAD` pieces
/// of equal length rounded down to the alignment, none shorter than the minimum piece.
fn piece_starts(spec: &ChunkerSpec, len: usize, threads: usize) -> Vec<usize> {
    let alignment = piece_alignment_bytes(spec);
    let piece_bytes_min = match *spec {
        ChunkerSpec::Segment { segment, .. } => {
            PIECE_BYTES_MIN.max(PIECE_SEGMENTS_MIN * segment.bytes_max)
        }
        _ => PIECE_BYTES_MIN,
    };
    assert!(piece_bytes_min >= alignment);
    // One thread gains nothing from pieces: cut serially without seams.
    let count = if threads < 2 {
        1
    } else {
        threads
            .saturating_mul(PIECES_PER_THREAD)
            .min(len / piece_bytes_min)
            .max(1)
    };
    let piece_bytes = len / count / alignment * alignment;
    let starts: Vec<usize> = (0..count).map(|index| index * piece_bytes).collect();
    assert!(starts.windows(2).all(|pair| pair[1] - pair[0] >= alignment));
    starts
}

/// The result of cutting a buffer in pieces.
struct Spliced {
    chunks: Vec<FingerprintedChunk>,
    /// Chunks cut serially in seams: tests check that pieces meet soon.
    #[cfg_attr(not(test), allow(dead_code))]
    seam_chunks: usize,
}

/// Cuts `data` in pieces starting at `starts` (ascending, the first 0, all below `data.len()`)
/// and splices them; see the module documentation. The chunks do not depend on `starts`.
fn chunk_and_fingerprint_in_pieces(
    spec: &ChunkerSpec,
    data: &[u8],
    algorithm: FingerprintAlgorithm,
    starts: &[usize],
) -> Spliced {
    assert_eq!(
        starts.first(),
        Some(&0),
        "the first piece starts the buffer"
    );
    assert!(starts.windows(2).all(|pair| pair[0] < pair[1]));
    assert!(starts.iter().all(|&start| start < data.len()));
    let runs: Vec<PieceRun> = (0..starts.len())
        .into_par_iter()
        .map(|index| {
            let end = starts.get(index + 1).copied().unwrap_or(data.len());
            PieceRun::cut(spec, data, algorithm, starts[index], end)
        })
        .collect();
    let mut runs = runs.into_iter();
    let first = runs.next().expect("at least one piece");
    let mut chunks = first.chunks;
    chunks.reserve(runs.as_slice().iter().map(|run| run.chunks.len()).sum());
    let mut chunker = first.chunker;
    let mut position = first.chunks_end;
    let mut fingerprinter = Fingerprinter::new(data, algorithm);
    let mut seam_chunks = 0;
    for run in runs {
        let seam_index = chunks.len();
        let mut meeting = None;
        let mut next_start_index = 0;
        position = cut_and_fingerprint(
            data,
            &mut chunker,
            position,
            &mut chunks,
            &mut fingerprinter,
            |position, state| {
                if position >= run.end {
                    return true;
                }
                meeting = run.find_start(&mut next_start_index, position, state);
                meeting.is_some()
            },
        );
        seam_chunks += chunks.len() - seam_index;
        let Some(index) = meeting else {
            // The seam covered the whole piece: `chunker` goes on from `position`, past the
            // piece's end.
            continue;
        };
        chunks.extend_from_slice(&run.chunks[index..]);
        // From the meeting point on, the piece's chunker is in the serial chunker's state.
        chunker = run.chunker;
        position = run.chunks_end;
    }
    assert_eq!(
        chunks
            .last()
            .map_or(0, |chunk| chunk.offset + chunk.len as u64),
        data.len() as u64,
        "the chunks tile the buffer"
    );
    Spliced {
        chunks,
        seam_chunks,
    }
}

/// The chunks one thread cut and fingerprinted from the first byte of a piece.
struct PieceRun {
    /// The piece's end: the run's last chunk starts before it and may end past it.
    end: usize,
    /// The end of the run's last chunk.
    chunks_end: usize,
    chunks: Vec<FingerprintedChunk>,
    /// The chunker's [`Chunker::cut_state`] before cutting each chunk of `chunks`.
    states: Vec<u64>,
    /// The chunker after the run's last chunk.
    chunker: Box<dyn Chunker>,
}

impl PieceRun {
    fn cut(
        spec: &ChunkerSpec,
        data: &[u8],
        algorithm: FingerprintAlgorithm,
        start: usize,
        end: usize,
    ) -> PieceRun {
        assert!(start < end && end <= data.len());
        let mut chunker = spec.build();
        let mut chunks = Vec::new();
        let mut states = Vec::new();
        let mut fingerprinter = Fingerprinter::new(data, algorithm);
        // Stops before the first chunk starting at or past the piece's end; the chunks see the
        // whole rest of the buffer, as in a serial run.
        let chunks_end = cut_and_fingerprint(
            data,
            &mut chunker,
            start,
            &mut chunks,
            &mut fingerprinter,
            |position, state| {
                if position >= end {
                    return true;
                }
                states.push(state);
                false
            },
        );
        assert_eq!(chunks.len(), states.len());
        PieceRun {
            end,
            chunks_end,
            chunks,
            states,
            chunker,
        }
    }

    /// The index of this run's chunk starting at `position` with the chunker in `state`, if
    /// any. Successive calls must give ascending positions; `next_index` carries the search
    /// between them (it starts at 0).
    fn find_start(&self, next_index: &mut usize, position: usize, state: u64) -> Option<usize> {
        while *next_index < self.chunks.len() && self.chunks[*next_index].offset < position as u64 {
            *next_index += 1;
        }
        let index = *next_index;
        let meets = index < self.chunks.len()
            && self.chunks[index].offset == position as u64
            && self.states[index] == state;
        meets.then_some(index)
    }
}

/// Cuts `data` from `position` with `chunker` and appends the fingerprinted chunks to `chunks`,
/// until the end of `data` or until `stop(position, state)` returns true before a cut (given
/// the position of the next chunk and the chunker's [`Chunker::cut_state`] there). `data` is
/// the whole stream. Returns the position where cutting stopped.
fn cut_and_fingerprint<'a>(
    data: &'a [u8],
    chunker: &mut Box<dyn Chunker>,
    mut position: usize,
    chunks: &mut Vec<FingerprintedChunk>,
    fingerprinter: &mut Fingerprinter<'a>,
    mut stop: impl FnMut(usize, u64) -> bool,
) -> usize {
    let mut batch_index = chunks.len();
    let mut batch_bytes = 0;
    while position < data.len() && !stop(position, chunker.cut_state()) {
        let cut = chunker.next_cut(&data[position..], true);
        assert!(cut.len >= 1 && cut.len <= data.len() - position);
        chunks.push(FingerprintedChunk {
            offset: position as u64,
            len: cut.len,
            ends_segment: cut.ends_segment,
            fingerprint: Fingerprint::ZERO,
        });
        position += cut.len;
        batch_bytes += cut.len;
        if batch_bytes >= FINGERPRINT_BATCH_BYTES {
            fingerprinter.fill(&mut chunks[batch_index..]);
            batch_index = chunks.len();
            batch_bytes = 0;
        }
    }
    fingerprinter.fill(&mut chunks[batch_index..]);
    position
}

/// Fingerprints chunks of one buffer in batches, reusing its scratch vectors.
struct Fingerprinter<'a> {
    data: &'a [u8],
    algorithm: FingerprintAlgorithm,
    inputs: Vec<&'a [u8]>,
    outputs: Vec<Fingerprint>,
}

impl<'a> Fingerprinter<'a> {
    fn new(data: &'a [u8], algorithm: FingerprintAlgorithm) -> Self {
        Fingerprinter {
            data,
            algorithm,
            inputs: Vec::new(),
            outputs: Vec::new(),
        }
    }

    /// Sets the fingerprint of every chunk in `chunks` with one batch call.
    fn fill(&mut self, chunks: &mut [FingerprintedChunk]) {
        if chunks.is_empty() {
            return;
        }
        self.inputs.clear();
        self.inputs
            .extend(chunks.iter().map(|chunk| chunk.bytes(self.data)));
        self.outputs.clear();
        self.outputs.resize(chunks.len(), Fingerprint::ZERO);
        self.algorithm.hash_batch(&self.inputs, &mut self.outputs);
        for (chunk, fingerprint) in chunks.iter_mut().zip(&self.outputs) {
            chunk.fingerprint = *fingerprint;
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::chunking::tests::random_bytes;
    use crate::chunking::SliceChunks;

    /// The reference result: the slice chunker, every chunk fingerprinted on its own.
    fn reference(
        spec: &ChunkerSpec,
        data: &[u8],
        algorithm: FingerprintAlgorithm,
    ) -> Vec<FingerprintedChunk> {
        SliceChunks::new(spec.build(), data)
            .map(|chunk| FingerprintedChunk {
                offset: chunk.offset,
                len: chunk.data.len(),
                ends_segment: chunk.ends_segment,
                fingerprint: algorithm.hash(chunk.data),
            })
            .collect()
    }

    /// Buffer contents that challenge the splice: periodic and low-entropy data make runs
    /// started at different positions meet late or never; zero data gives maximum-size chunks
    /// (and segments).
    fn content(kind: usize, seed: u64, len: usize) -> Vec<u8> {
        let random = random_bytes(seed, len);
        match kind {
            // Random bytes.
            0 => random,
            // A random pattern repeated: every piece sees the same cut candidates, shifted.
            1 => {
                let period = 1 + (seed % 20_000) as usize;
                (0..len).map(|index| random[index % period]).collect()
            }
            // Two symbols only.
            2 => random.iter().map(|byte| byte & 1).collect(),
            // Runs of one byte value, up to 50 000 bytes long.
            3 => {
                let mut data = Vec::with_capacity(len);
                let mut index = 0;
                while data.len() < len {
                    let run = 1
                        + (u32::from_le_bytes([
                            random[index % len],
                            random[(index + 1) % len],
                            random[(index + 2) % len],
                            0,
                        ]) % 50_000) as usize;
                    data.extend(std::iter::repeat_n(
                        random[index % len],
                        run.min(len - data.len()),
                    ));
                    index += 3;
                }
                data
            }
            // Zeros.
            4 => vec![0; len],
            // Random bytes with regions copied elsewhere, as in data worth deduplicating.
            _ => {
                let mut data = random;
                for copy in 0..8usize {
                    let source = (seed as usize).wrapping_mul(copy + 7) % len;
                    let target = (seed as usize).wrapping_mul(copy + 13) % len;
                    let bytes = (len - source.max(target)).min(40_000);
                    data.copy_within(source..source + bytes, target);
                }
                data
            }
        }
    }

    const SPECS: [&str; 9] = [
        "fixed:512",
        "fixed:4096",
        "fastcdc:1024",
        "fastcdc:8192",
        "fastcdc:256/1024/65536",
        "rabin:1024",
        "rabin:256/1024/2048",
        "segment:16KiB/1KiB",
        "segment-gear:16KiB/1KiB",
    ];

    /// Goal: Serial fingerprinting matches the slice chunker with one hash per chunk.
    /// Method: compare them on random data for every chunker.
    #[test]
    fn serial_equals_reference() {
        let data = random_bytes(9, 3 << 20);
        for text in SPECS {
            let spec: ChunkerSpec = text.parse().unwrap();
            let expected = reference(&spec, &data, FingerprintAlgorithm::Blake3);
            let chunks = chunk_and_fingerprint(&spec, &data, FingerprintAlgorithm::Blake3);
            assert_eq!(chunks, expected, "{text}");
            assert!(chunk_and_fingerprint(&spec, &[], FingerprintAlgorithm::Blake3).is_empty());
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Goal: splicing pieces gives exactly the serial chunks and fingerprints, wherever
        /// the pieces start. Method: random contents (periodic, low-entropy, zero, ...),
        /// lengths and piece starts (aligned to the chunker or not) for every chunker,
        /// compared with the reference.
        #[test]
        fn pieces_equal_serial(
            seed in any::<u64>(),
            len in 1usize..400_000,
            kind in 0usize..6,
            spec_index in 0..SPECS.len(),
            fractions in prop::collection::vec(any::<u32>(), 0..8),
            aligned in any::<bool>(),
            xxh3 in any::<bool>(),
        ) {
            let spec: ChunkerSpec = SPECS[spec_index].parse().unwrap();
            let algorithm = if xxh3 { FingerprintAlgorithm::Xxh3 } else { FingerprintAlgorithm::Blake3 };
            let data = content(kind, seed, len);
            let alignment = if aligned { piece_alignment_bytes(&spec) } else { 1 };
            let mut starts: Vec<usize> = fractions
                .iter()
                .map(|&fraction| ((fraction as u64 * len as u64) >> 32) as usize / alignment * alignment)
                .collect();
            starts.push(0);
            starts.sort_unstable();
            starts.dedup();
            let spliced = chunk_and_fingerprint_in_pieces(&spec, &data, algorithm, &starts);
            prop_assert_eq!(spliced.chunks, reference(&spec, &data, algorithm));
        }
    }

    /// Goal: the public function splits large buffers, gives the serial result, and its pieces
    /// meet the serial run within a few chunks on random and zero data. Method: buffers of
    /// 8 minimum pieces on 2 threads, counting the chunks cut in seams.
    #[test]
    fn large_buffers_meet_soon() {
        let len = 2 * PIECES_PER_THREAD * PIECE_BYTES_MIN;
        let random = random_bytes(11, len);
        let zeros = vec![0u8; len];
        for (text, seam_chunks_limit) in [
            ("fastcdc:8192", 8),
            ("rabin:8192", 8),
            ("fixed:4096", 0),
            ("segment-gear:1MiB/4KiB", 1024),
        ] {
            let spec: ChunkerSpec = text.parse().unwrap();
            for data in [&random, &zeros] {
                let expected = chunk_and_fingerprint(&spec, data, FingerprintAlgorithm::Blake3);
                let threads = 2;
                let starts = piece_starts(&spec, data.len(), threads);
                assert_eq!(starts.len(), threads * PIECES_PER_THREAD, "{text}");
                let spliced = chunk_and_fingerprint_in_pieces(
                    &spec,
                    data,
                    FingerprintAlgorithm::Blake3,
                    &starts,
                );
                assert_eq!(spliced.chunks, expected, "{text}");
                let seams = starts.len() - 1;
                assert!(
                    spliced.seam_chunks <= seam_chunks_limit * seams,
                    "{text}: {} chunks in {seams} seams",
                    spliced.seam_chunks,
                );
                let public = chunk_and_fingerprint_parallel(
                    &spec,
                    data,
                    FingerprintAlgorithm::Blake3,
                    threads,
                );
                assert_eq!(public, expected, "{text}");
            }
        }
    }

    /// Goal: one thread or a buffer too short for two pieces gives one piece, longer buffers
    /// up to `PIECES_PER_THREAD` pieces per thread. Method: piece starts for lengths around the
    /// minimum.
    #[test]
    fn short_buffers_stay_serial() {
        let spec: ChunkerSpec = "fastcdc:8192".parse().unwrap();
        assert_eq!(piece_starts(&spec, 0, 2), vec![0]);
        assert_eq!(piece_starts(&spec, 2 * PIECE_BYTES_MIN - 1, 2), vec![0]);
        assert_eq!(piece_starts(&spec, 2 * PIECE_BYTES_MIN, 1), vec![0]);
        assert_eq!(
            piece_starts(&spec, 2 * PIECE_BYTES_MIN, 2),
            vec![0, PIECE_BYTES_MIN]
        );
        let segment: ChunkerSpec = "segment:4MiB/4KiB".parse().unwrap();
        assert_eq!(piece_starts(&segment, 63 << 20, 2), vec![0]);
        assert_eq!(piece_starts(&segment, 64 << 20, 2), vec![0, 32 << 20]);
    }
}
