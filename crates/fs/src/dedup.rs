//! The offline deduplicator (paper 3 §4.1): a pure *plan* (the ranker's decisions, shown by
//! `onecopy fs dedup --dry-run`) and its *execution*.
//!
//! A plan takes the files to cut big first, so that the files cut small after them find
//! data inside their big chunks. Executing a file of rank r:
//!
//! 1. the file is read in batches of [`BATCH_BYTES`] (outside the engine lock), noting its
//!    data version;
//! 2. each batch is cut into chunks — big for rank 1, small for ranks 2 and 3 (fixed at
//!    multiples of the size, or content-defined) — and fingerprinted, outside the lock;
//! 3. a small chunk the fingerprint index does not know is looked up in the piece index
//!    (the pieces of big chunks, [`crate::engine::pieces`]) and a hit is compared byte for
//!    byte with the big chunk's bytes, outside the lock;
//! 4. under the lock, if the file is unchanged, each chunk is looked up in the repository's
//!    fingerprint index: a known chunk gains a reference, a confirmed piece maps the range
//!    to the piece of its big chunk (a reference to that chunk), a new chunk is appended (a
//!    rank-1 file's new chunks in file order, so it stays sequential, and their pieces enter
//!    the piece index); then the plain extents of the range are released (their chunks are
//!    freed when no other extent holds them) and the range is mapped; one journal record
//!    per batch;
//! 5. at the end the file takes its rank and chunking, its read counters are reset, and it
//!    moves to its rank queue.
//!
//! A write to the file while it is deduplicated stops its deduplication (the file is rank 0
//! again and waits for a later run). Between batches the deduplicator yields: when run by
//! idleness it stops as soon as a foreground request arrives, so foreground I/O waits at most
//! for one batch, and it pauses after each batch so that it takes at most
//! `dedup_share_percent` of one core and of the disk's time (reported as `busy_ms` against
//! `elapsed_ms`). Not guaranteed: a rank-1 file's new chunks are contiguous only as long as
//! no foreground write appends between two of its batches.

use std::collections::HashMap;
use std::time::Instant;

use onecopy_core::chunking::fastcdc::FastCdcChunker;
use onecopy_core::chunking::{Chunker, SizeRange};
use onecopy_core::fingerprint::Fingerprint;
use serde::Serialize;

use crate::changes::FsId;
use crate::engine::pieces::{self, piece_ranges, ComparedChunks, PieceMatch};
use crate::engine::{now_ns, FsEngine};
use crate::error::Result;
use crate::node::{Chunking, Ino, Kind, Rank, ROOT};
use crate::options::SmallChunking;
use crate::ranker::{chunking_of, plan_ranks};

/// Bytes of a file read and deduplicated per step (and per journal record).
pub const BATCH_BYTES: u64 = 4 << 20;

/// One file the plan deduplicates.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlannedFile {
    pub ino: Ino,
    /// A path of the file (one of its names), for messages.
    pub path: String,
    pub rank_before: Rank,
    pub rank: Rank,
    /// How the file is chunked now and after.
    pub chunking_before: Option<Chunking>,
    pub chunking: Chunking,
    /// Bytes of the file (holes excluded) and those of it written plainly.
    pub bytes: u64,
    pub plain_bytes: u64,
    /// False when the file already is chunked this way with nothing plain: it only changes
    /// rank queue.
    pub rechunk: bool,
    /// The file's data version when planned: a file written since is skipped (it is rank 0
    /// again).
    #[serde(skip)]
    pub version: u64,
}

/// What a deduplication run will do.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DedupPlan {
    pub file_system: String,
    pub files: Vec<PlannedFile>,
    /// Bytes the run reads (of the files it re-chunks).
    pub read_bytes: u64,
    /// Files left in rank 0 (modified recently or not read enough yet).
    pub files_left_rank_0: u64,
}

/// What a deduplication run did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DedupReport {
    pub files_deduplicated: u64,
    /// Files written to while they were deduplicated (left for a later run).
    pub files_skipped: u64,
    pub bytes_read: u64,
    /// Chunks found in the index (their bytes not stored again).
    pub chunks_deduplicated: u64,
    /// Small chunks found inside big chunks through the piece index (mapped to a range of
    /// the big chunk, their bytes not stored again).
    pub pieces_deduplicated: u64,
    pub chunks_stored: u64,
    /// Bytes the face's live chunks occupy in containers before and after the run (plain
    /// copies freed by the run wait in their containers for compaction).
    pub stored_bytes_before: u64,
    pub stored_bytes_after: u64,
    /// Runs stopped to let foreground requests through.
    pub stopped_for_foreground: bool,
    pub elapsed_ms: u64,
    /// Time spent reading, hashing and remapping (the rest of `elapsed_ms` is the pauses of
    /// a run started by idleness; see `FsOptions::dedup_share_percent`).
    pub busy_ms: u64,
}

/// Plans a run over file system `fs` now.
pub fn plan(engine: &FsEngine, fs: FsId) -> Result<DedupPlan> {
    plan_at(engine, fs, now_ns())
}

/// Plans a run over file system `fs` at time `now_ns` (tests compress time with it).
pub fn plan_at(engine: &FsEngine, fs: FsId, now_ns: i64) -> Result<DedupPlan> {
    let state = engine.state.lock();
    let system = state.system(fs)?;
    let options = &system.record.options;
    let queue = |rank: usize| {
        system.queues[rank]
            .values()
            .filter_map(|ino| system.inodes.get(ino).map(|inode| (*ino, inode.monitor)))
            .collect::<Vec<_>>()
    };
    let ranked = plan_ranks([queue(0), queue(1), queue(2)], now_ns, options);
    let paths = paths_of(system);
    let mut plan = DedupPlan {
        file_system: system.record.name.clone(),
        ..DedupPlan::default()
    };
    for decision in &ranked {
        let inode = &system.inodes[&decision.ino];
        let bytes = inode.mapped_bytes();
        let chunking = chunking_of(decision.rank, bytes, options);
        let plain_bytes = inode.plain_bytes();
        let rechunk = inode.monitor.chunking != Some(chunking) || plain_bytes > 0;
        if rechunk {
            plan.read_bytes += bytes;
        }
        plan.files.push(PlannedFile {
            ino: decision.ino,
            path: paths
                .get(&decision.ino)
                .cloned()
                .unwrap_or_else(|| format!("<inode {}>", decision.ino)),
            rank_before: decision.rank_before,
            rank: decision.rank,
            chunking_before: inode.monitor.chunking,
            chunking,
            bytes,
            plain_bytes,
            rechunk,
            version: system.version(decision.ino),
        });
    }
    // Files to cut big first: their new big chunks enter the piece index, so the small
    // chunks of the files after them find their data inside those chunks (and the big
    // chunks stay whole and contiguous instead of being built from pieces stored before).
    plan.files
        .sort_by_key(|file| !(file.rechunk && file.chunking == Chunking::Big));
    plan.files_left_rank_0 = system.queues[0].len() as u64
        - ranked
            .iter()
            .filter(|decision| decision.rank_before == 0)
            .count() as u64;
    Ok(plan)
}

/// One path of every inode (the first found), lossily as UTF-8.
pub(crate) fn paths_of(system: &crate::engine::FileSystem) -> HashMap<Ino, String> {
    let mut paths = HashMap::new();
    let mut pending = vec![(ROOT, String::new())];
    while let Some((ino, path)) = pending.pop() {
        let Some(inode) = system.inodes.get(&ino) else {
            continue;
        };
        for (name, child) in &inode.entries {
            let child_path = format!("{path}/{}", String::from_utf8_lossy(name));
            if paths.contains_key(child) {
                continue;
            }
            paths.insert(*child, child_path.clone());
            if system.inodes[child].attributes.kind == Kind::Directory {
                pending.push((*child, child_path));
            }
        }
    }
    paths
}

/// When to stop a run early.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Yield {
    /// Run to the end (`onecopy fs dedup`).
    Never,
    /// Stop at the first foreground request (runs started by idleness).
    ToForeground,
}

/// Executes `plan` on file system `fs`.
pub fn execute(
    engine: &FsEngine,
    fs: FsId,
    plan: &DedupPlan,
    yielding: Yield,
) -> Result<DedupReport> {
    let started = Instant::now();
    let requests_at_start = engine.request_count();
    let mut report = DedupReport::default();
    let (stored_before, counters_before) = {
        let state = engine.state.lock();
        (
            state.chunks.state().live_stored_bytes,
            state.chunks.counters().clone(),
        )
    };
    for file in &plan.files {
        if yielding == Yield::ToForeground && engine.request_count() != requests_at_start {
            report.stopped_for_foreground = true;
            break;
        }
        let done = dedup_file(engine, fs, file, &mut report, yielding, requests_at_start)?;
        if done {
            report.files_deduplicated += 1;
        } else if report.stopped_for_foreground {
            break;
        } else {
            report.files_skipped += 1;
        }
    }
    let state = engine.state.lock();
    let counters = state.chunks.counters();
    report.chunks_deduplicated = counters.chunks_deduplicated - counters_before.chunks_deduplicated;
    report.chunks_stored = counters.chunks_stored - counters_before.chunks_stored;
    report.stored_bytes_before = stored_before;
    report.stored_bytes_after = state.chunks.state().live_stored_bytes;
    report.elapsed_ms = started.elapsed().as_millis() as u64;
    Ok(report)
}

/// Cuts a stream into chunks: fixed sizes at multiples of the size, or FastCDC.
struct Cutter {
    chunker: Option<FastCdcChunker>,
    fixed_bytes: usize,
    bytes_max: usize,
}

impl Cutter {
    fn new(chunking: Chunking, big: u64, small: u64, small_chunking: SmallChunking) -> Cutter {
        match (chunking, small_chunking) {
            (Chunking::Small, SmallChunking::ContentDefined) => {
                let average = small as usize;
                let sizes = SizeRange {
                    bytes_min: average / 4,
                    bytes_average: average,
                    bytes_max: average * 4,
                };
                Cutter {
                    chunker: Some(FastCdcChunker::new(sizes)),
                    fixed_bytes: 0,
                    bytes_max: average * 4,
                }
            }
            (Chunking::Big, _) => Cutter {
                chunker: None,
                fixed_bytes: big as usize,
                bytes_max: big as usize,
            },
            _ => Cutter {
                chunker: None,
                fixed_bytes: small as usize,
                bytes_max: small as usize,
            },
        }
    }

    /// The length of the next chunk at the start of `data`, or `None` when more data is
    /// needed first (`data` shorter than the largest chunk and not the end).
    fn next(&mut self, data: &[u8], end: bool) -> Option<usize> {
        if data.is_empty() || (!end && data.len() < self.bytes_max) {
            return None;
        }
        let cut = match &mut self.chunker {
            Some(chunker) => chunker.next_cut(data, end).len,
            None => self.fixed_bytes.min(data.len()),
        };
        assert!(cut > 0, "a cut takes at least one byte");
        assert!(
            cut <= data.len().min(self.bytes_max),
            "a cut stays within its limits"
        );
        Some(cut)
    }
}

/// Deduplicates one planned file; returns whether it finished.
fn dedup_file(
    engine: &FsEngine,
    fs: FsId,
    file: &PlannedFile,
    report: &mut DedupReport,
    yielding: Yield,
    requests_at_start: u64,
) -> Result<bool> {
    let (options, version, size, fingerprint) = {
        let state = engine.state.lock();
        let system = state.system(fs)?;
        let Some(inode) = system.inodes.get(&file.ino) else {
            return Ok(false);
        };
        (
            system.record.options.clone(),
            system.version(file.ino),
            inode.attributes.size,
            engine.config().fingerprint,
        )
    };
    if version != file.version {
        return Ok(false);
    }
    if file.rechunk {
        let mut cutter = Cutter::new(
            file.chunking,
            options.big_chunk_bytes,
            options.small_chunk_bytes,
            options.small_chunking,
        );
        let small_bytes = options.small_chunk_bytes;
        // Pieces are indexed where fixed small chunks can find them.
        let index_pieces = file.chunking == Chunking::Big
            && options.small_chunking == SmallChunking::Fixed
            && options.big_chunk_bytes > small_bytes;
        let mut compared = ComparedChunks::default();
        let mut pending: Vec<u8> = Vec::new();
        let mut pending_at = 0u64;
        let mut offset = 0u64;
        while offset < size || !pending.is_empty() {
            if yielding == Yield::ToForeground && engine.request_count() != requests_at_start {
                report.stopped_for_foreground = true;
                return Ok(false);
            }
            let batch_started = Instant::now();
            let length = BATCH_BYTES.min(size - offset);
            let Some((data, read_version)) = engine.read_for_dedup(fs, file.ino, offset, length)?
            else {
                return Ok(false);
            };
            if read_version != version {
                return Ok(false);
            }
            report.bytes_read += data.len() as u64;
            pending.extend_from_slice(&data);
            offset += length;
            let end = offset >= size;
            let mut cuts = Vec::new();
            let mut taken = 0;
            let stale: Vec<(Fingerprint, u64)>;
            let mut region_prints: Vec<Fingerprint> = Vec::new();
            while let Some(cut) = cutter.next(&pending[taken..], end) {
                cuts.push((taken, cut));
                taken += cut;
            }
            let small = small_bytes as usize;
            // The batch's ranges: found inside stored chunks (compared byte for byte), or new.
            let segments: Vec<Segment> = if index_pieces {
                // A rank-1 file: its pieces are looked up, and runs of them lying in order
                // inside one stored chunk are referenced where a sequential read pays
                // little for it (see `big_segments`).
                let pieces: Vec<(usize, usize)> = piece_ranges(taken, small)
                    .chain((taken > 0 && taken <= small).then_some((0, taken)))
                    .collect();
                let prints: Vec<Fingerprint> = pieces
                    .iter()
                    .map(|&(at, length)| fingerprint.hash(&pending[at..at + length]))
                    .collect();
                let probes: Vec<(Fingerprint, usize)> = prints
                    .iter()
                    .zip(&pieces)
                    .map(|(print, &(_, length))| (*print, length))
                    .collect();
                let search = engine.find_pieces(
                    &pending,
                    &pieces,
                    &prints,
                    &probes,
                    false,
                    &mut compared,
                )?;
                stale = search.stale;
                region_prints = prints;
                big_segments(
                    taken,
                    small,
                    options.big_chunk_bytes as usize,
                    &search.matches,
                )
            } else {
                let prints: Vec<Fingerprint> = cuts
                    .iter()
                    .map(|&(at, length)| fingerprint.hash(&pending[at..at + length]))
                    .collect();
                let probes: Vec<(Fingerprint, usize)> = prints
                    .iter()
                    .zip(&cuts)
                    .map(|(print, &(_, length))| (*print, length))
                    .collect();
                let search =
                    engine.find_pieces(&pending, &cuts, &prints, &probes, true, &mut compared)?;
                stale = search.stale;
                cuts.iter()
                    .zip(search.matches)
                    .map(|(&(at, length), found)| match found {
                        Some(found) => Segment::Found { at, length, found },
                        None => Segment::New { at, length },
                    })
                    .collect()
            };
            // Fingerprints of the new ranges, and of their pieces for the piece index.
            let new_prints: Vec<Option<Fingerprint>> = segments
                .iter()
                .map(|segment| match *segment {
                    Segment::New { at, length } => {
                        Some(fingerprint.hash(&pending[at..at + length]))
                    }
                    Segment::Found { .. } => None,
                })
                .collect();
            // The pieces of the new chunk at `at` (on the small grid of the batch).
            let pieces_of = |at: usize, length: usize| -> &[Fingerprint] {
                if !index_pieces || length <= small {
                    return &[];
                }
                &region_prints[at / small..(at + length).div_ceil(small)]
            };
            // The lookups and comparisons took a while: a run started by idleness lets a
            // request that arrived meanwhile go first, before it takes the lock to map.
            if yielding == Yield::ToForeground && engine.request_count() != requests_at_start {
                report.stopped_for_foreground = true;
                return Ok(false);
            }
            let mut pieces_found = 0;
            let unchanged = engine.mutate(|state| {
                if state.system(fs)?.version(file.ino) != version {
                    return Ok(false);
                }
                // New chunks take room before the plain copies are freed: on a full disk the
                // batch is refused before it changes anything.
                engine.admit(state, taken as u64)?;
                pieces::remove_stale(state, &stale)?;
                for (segment, print) in segments.iter().zip(&new_prints) {
                    let (at, length) = match *segment {
                        Segment::Found { at, length, found } => {
                            let file_offset = pending_at + at as u64;
                            if pieces::map_piece(state, fs, file.ino, file_offset, length, &found)?
                            {
                                pieces_found += length.div_ceil(small) as u64;
                                continue;
                            }
                            (at, length)
                        }
                        Segment::New { at, length } => (at, length),
                    };
                    // New, or found but moved or freed since the comparison.
                    let print =
                        print.unwrap_or_else(|| fingerprint.hash(&pending[at..at + length]));
                    let outcome = crate::engine::map_data(
                        state,
                        fs,
                        file.ino,
                        pending_at + at as u64,
                        &pending[at..at + length],
                        Some(&print),
                    )?;
                    let prints = pieces_of(at, length);
                    if let Some(outcome) = outcome {
                        if !outcome.deduplicated && !prints.is_empty() {
                            pieces::index_pieces(state, outcome.id, prints, small_bytes)?;
                        }
                    }
                }
                Ok(true)
            })?;
            if !unchanged {
                return Ok(false);
            }
            report.pieces_deduplicated += pieces_found;
            pending.drain(..taken);
            pending_at += taken as u64;
            let busy = batch_started.elapsed();
            report.busy_ms += busy.as_millis() as u64;
            if yielding == Yield::ToForeground {
                // The share of the machine a run started by idleness takes: a pause after each
                // batch, in proportion to the batch's time.
                let share = options.dedup_share_percent.clamp(1, 100) as u32;
                std::thread::sleep(busy * (100 - share) / share);
            }
            if end && pending.is_empty() {
                break;
            }
        }
    }
    engine.mutate(|state| {
        if state.system(fs)?.version(file.ino) != version {
            return Ok(false);
        }
        let stamp = state.next_stamp();
        crate::engine::update_inode(state, fs, file.ino, |inode| {
            inode.monitor.rank = file.rank;
            inode.monitor.chunking = Some(file.chunking);
            inode.monitor.sequential_reads = 0;
            inode.monitor.random_reads = 0;
            inode.monitor.stamp = stamp;
        })?;
        Ok(true)
    })
}

/// A range of a batch (its start in the batch and its length) and how it is mapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Segment {
    /// Bytes found inside a stored chunk (compared): mapped to that range of the chunk.
    Found {
        at: usize,
        length: usize,
        found: PieceMatch,
    },
    /// Stored as a new chunk (or referenced whole through the fingerprint index).
    New { at: usize, length: usize },
}

/// Times a batch must hold one piece for its copies to be referenced whatever their runs'
/// lengths ([`big_segments`]).
const REPEATED_PIECE_COPIES: usize = 4;

/// The ranges of a batch of `length` bytes of a rank-1 file, given what each of its pieces
/// (`small` bytes each, the last possibly shorter) was found to equal. A *run* is a
/// sequence of pieces lying in order inside one stored chunk; it is referenced when a
/// sequential read of the file pays little for it: when it is at least half a big chunk
/// (the read reads its chunk, at most twice its bytes, in one request), covers a whole big
/// chunk's range of the file (read as one chunk, as the file's own would be), or starts with
/// a piece the batch holds at least [`REPEATED_PIECE_COPIES`] times (a block repeated through
/// the file, such as a common header or a filler: the read fetches its chunk once for all the
/// copies, which the chunk cache then serves). Every other range is stored in chunks cut at
/// multiples of `big` from the batch's start (a multiple of `big` in the file) and at the
/// ends of runs, so copies cut alike.
fn big_segments(
    length: usize,
    small: usize,
    big: usize,
    matches: &[Option<PieceMatch>],
) -> Vec<Segment> {
    assert_eq!(big % small, 0, "big chunks hold whole pieces");
    assert_eq!(matches.len(), length.div_ceil(small), "one match per piece");
    let covers_a_cut = |start: usize, end: usize| {
        let cut = start.div_ceil(big) * big;
        cut < length && (cut + big).min(length) <= end
    };
    let mut copies: HashMap<(onecopy_core::chunk_store::ChunkId, u32), usize> = HashMap::new();
    for found in matches.iter().flatten() {
        *copies.entry((found.chunk, found.chunk_offset)).or_default() += 1;
    }
    let mut segments = Vec::new();
    let mut stored_from = 0;
    let new = |segments: &mut Vec<Segment>, mut from: usize, to: usize| {
        while from < to {
            let cut_end = ((from / big + 1) * big).min(to);
            segments.push(Segment::New {
                at: from,
                length: cut_end - from,
            });
            from = cut_end;
        }
    };
    let mut piece = 0;
    while piece < matches.len() {
        let Some(first) = matches[piece] else {
            piece += 1;
            continue;
        };
        let mut next = piece + 1;
        while let Some(Some(found)) = matches.get(next) {
            let in_order = found.chunk == first.chunk
                && found.location == first.location
                && found.chunk_offset as usize
                    == first.chunk_offset as usize + (next - piece) * small;
            if !in_order {
                break;
            }
            next += 1;
        }
        let (start, end) = (piece * small, (next * small).min(length));
        let repeated = copies[&(first.chunk, first.chunk_offset)] >= REPEATED_PIECE_COPIES;
        if end - start >= big / 2 || covers_a_cut(start, end) || repeated {
            new(&mut segments, stored_from, start);
            segments.push(Segment::Found {
                at: start,
                length: end - start,
                found: first,
            });
            stored_from = end;
        }
        piece = next;
    }
    new(&mut segments, stored_from, length);
    segments
}

#[cfg(test)]
mod tests {
    use super::*;
    use onecopy_core::container::ChunkLocation;

    fn found(chunk: u64, chunk_offset: u32) -> Option<PieceMatch> {
        Some(PieceMatch {
            chunk,
            chunk_offset,
            location: ChunkLocation {
                container: chunk,
                ..ChunkLocation::default()
            },
        })
    }

    /// Goal: a rank-1 batch references runs of at least half a big chunk and runs covering
    /// a whole big chunk's range, stores the rest cut at the big grid and at run ends, and
    /// breaks runs where the pieces leave their chunk's order. Method: hand-made matches
    /// for 16 pieces of 1 KiB with big chunks of 4 KiB (a 16 KiB batch).
    #[test]
    fn big_segments_reference_long_runs_only() {
        let mut matches = vec![None; 16];
        // Pieces 1..4 in order in chunk 7 (3 KiB: referenced, at least half of 4 KiB).
        for (index, piece) in (1..4).enumerate() {
            matches[piece] = found(7, index as u32 * 1024);
        }
        // Pieces 5 and 6 in chunk 8 (2 KiB: referenced, exactly half).
        matches[5] = found(8, 0);
        matches[6] = found(8, 1024);
        // Piece 9 alone in chunk 9 (1 KiB: stored), piece 10 out of order in chunk 7.
        matches[9] = found(9, 0);
        matches[10] = found(7, 0);
        matches[11] = found(7, 0);
        let segments = big_segments(16 * 1024, 1024, 4096, &matches);
        let shape: Vec<(bool, usize, usize)> = segments
            .iter()
            .map(|segment| match *segment {
                Segment::Found { at, length, .. } => (true, at, length),
                Segment::New { at, length } => (false, at, length),
            })
            .collect();
        assert_eq!(
            shape,
            vec![
                (false, 0, 1024),
                (true, 1024, 3072),
                (false, 4096, 1024),
                (true, 5120, 2048),
                (false, 7168, 1024),
                (false, 8192, 4096),
                (false, 12288, 4096),
            ]
        );
        // A piece the batch holds four times is referenced at each copy, alone.
        let mut repeated = vec![None; 16];
        for piece in [1, 5, 9, 13] {
            repeated[piece] = found(9, 1024);
        }
        let segments = big_segments(16 * 1024, 1024, 4096, &repeated);
        let found_at: Vec<usize> = segments
            .iter()
            .filter_map(|segment| match *segment {
                Segment::Found { at, length, .. } => Some((at, length)),
                Segment::New { .. } => None,
            })
            .map(|(at, length)| {
                assert_eq!(length, 1024);
                at
            })
            .collect();
        assert_eq!(found_at, vec![1024, 5 * 1024, 9 * 1024, 13 * 1024]);
        // Three copies are not enough.
        repeated[13] = None;
        let segments = big_segments(16 * 1024, 1024, 4096, &repeated);
        assert!(segments
            .iter()
            .all(|segment| matches!(segment, Segment::New { .. })));
        // A short run that covers a whole big chunk's range (the batch's last, 1 KiB).
        let mut tail = vec![None; 5];
        tail[4] = found(3, 2048);
        let segments = big_segments(4096 + 1024, 1024, 4096, &tail);
        assert_eq!(segments.len(), 2);
        assert!(matches!(
            segments[1],
            Segment::Found {
                at: 4096,
                length: 1024,
                ..
            }
        ));
    }
}
