//! Segment-level inline deduplication: the write path of `backup create` (paper 2 §2.3).
//!
//! The path, top to bottom:
//!
//! 1. **chunk** (a thread of its own): the two-level chunker cuts the stream into chunks and
//!    segments in one pass and hands over *batches* of whole segments through a bounded queue
//!    ([`QUEUE_BATCHES`] batches of about [`BATCH_BYTES`]). A directory backup's stream comes
//!    in parts ([`StreamPart`]): each file starts a chunk and ends one, files of at least the
//!    minimum segment size have segments of their own and smaller ones share one; runs of
//!    unchanged files arrive as segments of the previous backup, placed as they are;
//! 2. **fingerprint** (the chunker thread, before it hands a batch over): every chunk is
//!    fingerprinted and tested for zeros, so that hashing the next batch overlaps the steps
//!    below on this one, whose one-thread parts would leave a core idle (docs/BENCHMARKS.md,
//!    "Against restic, borg, rustic and bupstash"); a segment's fingerprint is the hash of its
//!    chunk fingerprints;
//! 3. **index lookup**: a segment already stored (the index names it and its catalog head
//!    confirms it is shared) gains a reference; nothing is written;
//! 4. **compress** (all cores): the non-null chunks of new segments are grouped into frames
//!    of up to 256 KiB ([`crate::frames`]), each compressed with zstd (kept as it is unless that
//!    saves an eighth);
//! 5. **container append** (one thread, while the next batch compresses): a new segment's
//!    frames go into the open container, which is sealed (time stamp 0: shared) when the
//!    segment would overflow it; new segments enter the index. Steps 3 and 4 of a batch only
//!    need the ids step 3 allocated for the batches before, so they run ahead of step 5.
//!
//! Nothing becomes reachable here: the caller makes the containers durable (sealing syncs
//! them), checkpoints the index, and only then commits the recipe ([`crate::create`]). In
//! conventional mode the chunker is plain Rabin and every chunk is a one-chunk segment.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::io::Read;
use std::ops::Range;
use std::time::Instant;

use crossbeam_channel::{bounded, Receiver, Sender};
use onecopy_core::chunking::{ChunkerSpec, READ_BUFFER_BYTES_DEFAULT};
use onecopy_core::container::{codec, is_zero, ContainerId, ContainerWriter, CHUNK_HEADER_BYTES};
use onecopy_core::fingerprint::{Fingerprint, Fingerprinter};
use parking_lot::Mutex;
use rayon::prelude::*;
use serde::Serialize;

use crate::config::DedupMode;
use crate::error::{BackupError, Result};
use crate::frames::{frame_fingerprint, plan_frames};
use crate::recipe::SegmentReference;
use crate::segment::{
    ChunkPlace, ChunkStorage, ContainerKind, SegmentChunk, SegmentContainer, SegmentId,
    SegmentRecord, SegmentState,
};
use crate::store::{BackupStore, StoreState};

/// Bytes of segments per batch handed from the chunker thread.
const BATCH_BYTES: usize = 1 << 20;
/// Batches queued between the chunker and the rest of the path. With the batch being filled
/// and those compressing (a batch goes back to the chunker once compressed: its frames hold
/// what the write needs), `BATCHES_LIVE_MAX` batches of `BATCH_BYTES` plus the largest
/// segment each live at once. One queued batch is enough: the chunker cuts the next while the
/// path stores this one, and more queued did not shorten a backup (docs/BENCHMARKS.md,
/// "Against restic, borg, rustic and bupstash").
const QUEUE_BATCHES: usize = 1;
/// Batches compressing on the pool while the oldest compressed one is written: one, so that
/// this one-thread work overlaps compression; more held more memory for no shorter backup
/// (docs/BENCHMARKS.md, "Against restic, borg, rustic and bupstash").
const COMPRESSING_BATCHES: usize = 1;
/// Batches alive at once: the one being filled, the queued ones, and the ones compressing
/// (up to one more than [`COMPRESSING_BATCHES`] while the oldest is waited for).
const BATCHES_LIVE_MAX: usize = QUEUE_BATCHES + COMPRESSING_BATCHES + 2;
/// Most stored chunks a backup lends to later segments (1.75 GiB of 4 KiB chunks): the map of
/// lenders takes memory for every chunk it holds, so it stops growing here and a larger
/// backup's later chunks borrow only from its first ones. The standard hash map fills 7/8 of
/// its power-of-two table before doubling it: 7/8 of 2^19 entries keep the table at 2^19
/// slots of [`Lenders`]' 24-byte entries (about 13 MB), where 2^19 entries took 2^20.
const LENDERS_MAX: usize = (1 << 19) / 8 * 7;

/// Called with the stream bytes processed so far.
pub type Progress<'a> = &'a (dyn Fn(u64) + Sync);

/// Counters and timings of the inline phase.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct InlineReport {
    pub logical_bytes: u64,
    pub chunks: u64,
    pub segments: u64,
    pub segments_new: u64,
    pub segments_duplicate: u64,
    /// Stream bytes in duplicate segments (not written).
    pub duplicate_bytes: u64,
    /// Stream bytes in null chunks (never written).
    pub zero_bytes: u64,
    /// Bytes of the non-null chunks of new segments, before compression.
    pub new_raw_bytes: u64,
    /// Bytes written to containers for them (compressed, headers included).
    pub new_stored_bytes: u64,
    pub containers_written: u64,
    pub index_lookups: u64,
    /// Wall time of the phase (the stages overlap).
    pub seconds: f64,
    /// Time of the chunker thread spent chunking (overlaps the rest).
    pub chunk_seconds: f64,
    pub fingerprint_seconds: f64,
    pub index_seconds: f64,
    /// Wall time of each batch's compression, summed: batches compress while others are
    /// written and while the next one is cut, so this overlaps the other phases.
    pub compress_seconds: f64,
    pub write_seconds: f64,
    /// Sealing (and so syncing) the last container, after the stream ended.
    pub seal_seconds: f64,
    /// Frames the new segments' chunks were compressed in.
    pub frames: u64,
    /// Chunks of new segments that borrow a chunk an earlier new segment of this backup
    /// stores, instead of being stored again.
    pub borrowed_chunks: u64,
    /// Their raw bytes.
    pub borrowed_bytes: u64,
    /// Segments of the series' previous backup placed in the stream as they are, for runs of
    /// files the files cache found unchanged (nothing read, compared or written).
    pub placed_segments: u64,
    /// Their bytes.
    pub placed_bytes: u64,
}

/// What the inline phase produced, not yet committed.
pub(crate) struct InlineOutcome {
    pub segments: Vec<SegmentReference>,
    pub new_segments: Vec<(SegmentId, SegmentRecord)>,
    /// Live references gained, per segment (new and existing).
    pub references: HashMap<SegmentId, u32>,
    pub containers: Vec<(ContainerId, SegmentContainer)>,
    /// The store state with the ids allocated.
    pub state: StoreState,
    pub report: InlineReport,
}

/// A run of whole segments cut by the chunker thread, and segments of the series' previous
/// backup placed between them.
#[derive(Default)]
struct Batch {
    data: Vec<u8>,
    /// Chunk lengths of each segment, in order.
    segments: Vec<Vec<u32>>,
    /// Segments placed as they are (a [`StreamPart::Segments`]), each with the number of cut
    /// segments of the batch that come before it.
    placed: Vec<(usize, SegmentReference)>,
    /// Every chunk of `segments`, in order, fingerprinted by the chunker thread.
    hashed: Vec<HashedChunk>,
}

impl Batch {
    fn clear(&mut self) {
        self.data.clear();
        self.segments.clear();
        self.placed.clear();
        self.hashed.clear();
    }

    /// Where every chunk of `segments` starts in `data`, in order, and where the last ends.
    fn chunk_offsets(&self) -> Vec<usize> {
        let chunks: usize = self.segments.iter().map(Vec::len).sum();
        let mut offsets = Vec::with_capacity(chunks + 1);
        let mut offset = 0usize;
        offsets.push(offset);
        for segment in &self.segments {
            for &length in segment {
                offset += length as usize;
                offsets.push(offset);
            }
        }
        assert_eq!(offset, self.data.len(), "segments cover the batch");
        offsets
    }

    /// The bytes of every chunk of `segments`, in order.
    fn chunks(&self) -> Vec<&[u8]> {
        self.chunk_offsets()
            .windows(2)
            .map(|ends| &self.data[ends[0]..ends[1]])
            .collect()
    }

    /// Fingerprints every chunk into `hashed`. BLAKE3 hashes the batch's chunks across SIMD
    /// lanes, several times faster than one chunk at a time.
    fn fingerprint(&mut self, fingerprinter: &Fingerprinter) {
        let slices = self.chunks();
        let mut fingerprints = vec![Fingerprint::ZERO; slices.len()];
        fingerprinter.hash_batch(&slices, &mut fingerprints);
        self.hashed = fingerprints
            .into_iter()
            .zip(&slices)
            .map(|(fingerprint, chunk)| HashedChunk {
                fingerprint,
                zero: is_zero(chunk),
            })
            .collect();
    }
}

/// One part of a backup stream, as a [`PartedSource`] hands it out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum StreamPart {
    /// Bytes, read from the source until its `read` returns 0. A new chunk starts where the
    /// part starts and one ends where it ends. `alone`: the part starts a new segment and its
    /// last chunk ends one (a whole stream, a large file, a directory tree); otherwise (a
    /// small file) its segment ends with it only once the segment holds at least the minimum
    /// segment size, so that small files share segments.
    Bytes { alone: bool },
    /// Stored segments placed in the stream as they are, without reading anything: a run of
    /// unchanged files whose contents these segments of the previous backup hold exactly
    /// ([`crate::files_cache`]).
    Segments(Vec<SegmentReference>),
}

/// A backup stream handed out in parts; see [`StreamPart`].
pub(crate) trait PartedSource: Send {
    /// Starts the next part (the previous one has been read to its end); `None` at the end of
    /// the stream.
    fn next_part(&mut self) -> std::io::Result<Option<StreamPart>>;
    /// Reads bytes of the current [`StreamPart::Bytes`] part; 0 at its end.
    fn read_part(&mut self, buffer: &mut [u8]) -> std::io::Result<usize>;
}

/// Any reader as a stream of one part, chunked as a whole.
pub(crate) struct WholeStream<R> {
    reader: R,
    started: bool,
}

impl<R> WholeStream<R> {
    pub(crate) fn new(reader: R) -> Self {
        WholeStream {
            reader,
            started: false,
        }
    }
}

impl<R: Read + Send> PartedSource for WholeStream<R> {
    fn next_part(&mut self) -> std::io::Result<Option<StreamPart>> {
        if std::mem::replace(&mut self.started, true) {
            return Ok(None);
        }
        Ok(Some(StreamPart::Bytes { alone: true }))
    }

    fn read_part(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        self.reader.read(buffer)
    }
}

/// The chunker thread's state: it cuts the parts of the source into chunks and segments and
/// sends them on in batches.
struct Cutter {
    spec: ChunkerSpec,
    /// Fingerprints each batch before sending it, so that hashing the next batch overlaps
    /// the path's work on this one (which leaves a core idle between its parallel passes).
    fingerprinter: Fingerprinter,
    every_chunk_is_a_segment: bool,
    sender: Sender<Result<Batch>>,
    recycle: Receiver<Batch>,
    batch: Batch,
    /// Chunk lengths of the open segment.
    segment: Vec<u32>,
    segment_bytes: usize,
    /// Seconds spent cutting.
    busy: f64,
    /// Seconds spent fingerprinting.
    hashing: f64,
}

/// Sent when the receiver is gone: the chunker stops.
struct Stopped;

impl Cutter {
    fn next_batch(&self) -> Batch {
        match self.recycle.try_recv() {
            Ok(mut batch) => {
                batch.clear();
                batch
            }
            // A batch ends with the segment that brings it to `BATCH_BYTES`: sized for that
            // at once, its buffer never grows (growing would double it).
            Err(_) => Batch {
                data: Vec::with_capacity(BATCH_BYTES + self.largest_segment()),
                ..Batch::default()
            },
        }
    }

    /// Bytes of the largest segment the chunker makes (one chunk for chunkers without
    /// segments).
    fn largest_segment(&self) -> usize {
        match self.spec {
            ChunkerSpec::Segment { segment, .. } => segment.bytes_max,
            _ => self.spec.chunk_bytes_max(),
        }
    }

    /// The minimum and maximum segment sizes of the chunker (a one-chunk segment for
    /// chunkers without segments).
    fn segment_limits(&self) -> (usize, usize) {
        match self.spec {
            ChunkerSpec::Segment { segment, .. } => (segment.bytes_min, segment.bytes_max),
            _ => (0, usize::MAX),
        }
    }

    /// Ends the open segment, if it has chunks, and sends the batch once it is large enough.
    fn end_segment(&mut self) -> std::result::Result<(), Stopped> {
        if self.segment.is_empty() {
            return Ok(());
        }
        self.batch.segments.push(std::mem::take(&mut self.segment));
        self.segment_bytes = 0;
        if self.batch.data.len() >= BATCH_BYTES {
            let next = self.next_batch();
            let full = std::mem::replace(&mut self.batch, next);
            self.send(full)?;
        }
        Ok(())
    }

    /// Fingerprints `batch` and sends it.
    fn send(&mut self, mut batch: Batch) -> std::result::Result<(), Stopped> {
        let start = Instant::now();
        batch.fingerprint(&self.fingerprinter);
        self.hashing += start.elapsed().as_secs_f64();
        self.sender.send(Ok(batch)).map_err(|_| Stopped)
    }

    fn cut_parts(&mut self, source: &mut dyn PartedSource) -> Result<()> {
        let mut buffer = vec![0u8; READ_BUFFER_BYTES_DEFAULT.max(2 * self.spec.chunk_bytes_max())];
        let (segment_bytes_min, segment_bytes_max) = self.segment_limits();
        loop {
            let part = source
                .next_part()
                .map_err(|error| BackupError::io("reading the backup source", error))?;
            let Some(part) = part else { return Ok(()) };
            let alone = match part {
                StreamPart::Segments(references) => {
                    if self.end_segment().is_err() {
                        return Ok(());
                    }
                    let position = self.batch.segments.len();
                    self.batch.placed.extend(
                        references
                            .into_iter()
                            .map(|reference| (position, reference)),
                    );
                    continue;
                }
                StreamPart::Bytes { alone } => alone,
            };
            if alone && self.end_segment().is_err() {
                return Ok(());
            }
            // A fresh chunker per part: a part's chunks do not depend on what precedes it.
            let mut chunker = self.spec.build();
            let chunk_bytes_max = chunker.chunk_bytes_max();
            let (mut start, mut end, mut end_of_part) = (0usize, 0usize, false);
            loop {
                if end - start < chunk_bytes_max && !end_of_part {
                    buffer.copy_within(start..end, 0);
                    end -= start;
                    start = 0;
                    while end < buffer.len() {
                        match source.read_part(&mut buffer[end..]) {
                            Ok(0) => {
                                end_of_part = true;
                                break;
                            }
                            Ok(read) => end += read,
                            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                            Err(error) => {
                                return Err(BackupError::io("reading the backup source", error))
                            }
                        }
                    }
                }
                if start == end {
                    break;
                }
                let started = Instant::now();
                let cut = chunker.next_cut(&buffer[start..end], end_of_part);
                assert!(cut.len >= 1 && cut.len <= end - start);
                let last = end_of_part && start + cut.len == end;
                // Small files share segments, which must still stay within the maximum.
                if self.segment_bytes + cut.len > segment_bytes_max && self.end_segment().is_err() {
                    return Ok(());
                }
                self.batch
                    .data
                    .extend_from_slice(&buffer[start..start + cut.len]);
                self.segment.push(cut.len as u32);
                self.segment_bytes += cut.len;
                start += cut.len;
                let ends_segment = self.every_chunk_is_a_segment
                    || if last {
                        alone || self.segment_bytes >= segment_bytes_min
                    } else {
                        cut.ends_segment
                    };
                self.busy += started.elapsed().as_secs_f64();
                if ends_segment && self.end_segment().is_err() {
                    return Ok(());
                }
            }
        }
    }

    /// Sends what is left at the end of the stream.
    fn finish(&mut self) {
        if self.end_segment().is_err() {
            return;
        }
        if !self.batch.segments.is_empty() || !self.batch.placed.is_empty() {
            let last = std::mem::take(&mut self.batch);
            let _ = self.send(last);
        }
    }
}

/// A frame of a new segment, compressed: its chunks (positions in the batch), its length, and
/// where its stored bytes are in its batch's [`CompressedFrames::bytes`].
struct EncodedFrame {
    chunks: Vec<usize>,
    raw_bytes: usize,
    stored: Range<usize>,
    /// The stored bytes are a zstd frame (else the raw bytes).
    compressed: bool,
}

/// The frames of a batch and one buffer holding their stored bytes: the batch goes back to
/// the chunker before its frames are written, and the buffer is reused for a later batch,
/// since a buffer per frame, allocated on one thread and freed on another, leaves the
/// allocator holding more memory with every batch.
struct CompressedFrames {
    frames: Vec<EncodedFrame>,
    bytes: Vec<u8>,
}

/// Runs the inline phase over `source`.
pub(crate) fn run(
    store: &mut BackupStore,
    source: &mut dyn PartedSource,
    progress: Option<Progress>,
) -> Result<InlineOutcome> {
    store.assert_recovered();
    let started = Instant::now();
    let spec = store.state.options.chunker_spec()?;
    let every_chunk_is_a_segment = store.state.options.mode == DedupMode::Conventional;
    let mut writer = PathState {
        outcome: InlineOutcome {
            segments: Vec::new(),
            new_segments: Vec::new(),
            references: HashMap::new(),
            containers: Vec::new(),
            state: store.state.clone(),
            report: InlineReport::default(),
        },
        pending: HashMap::new(),
        open: None,
        lenders: Lenders::default(),
        borrows: HashMap::new(),
    };
    let (sender, receiver) = bounded::<Result<Batch>>(QUEUE_BATCHES);
    // Consumed batches go back to the chunker to be filled again: fresh multi-megabyte
    // buffers would each cost a page fault per page.
    let (recycle_sender, recycle_receiver) = bounded::<Batch>(BATCHES_LIVE_MAX);
    let fingerprinter = store.fingerprinter.clone();
    let result = std::thread::scope(|scope| {
        let chunker = scope.spawn(move || -> (f64, f64) {
            let mut cutter = Cutter {
                spec,
                fingerprinter,
                every_chunk_is_a_segment,
                sender,
                recycle: recycle_receiver,
                batch: Batch::default(),
                segment: Vec::new(),
                segment_bytes: 0,
                busy: 0.0,
                hashing: 0.0,
            };
            cutter.batch = cutter.next_batch();
            match cutter.cut_parts(source) {
                Ok(()) => cutter.finish(),
                Err(error) => {
                    let _ = cutter.sender.send(Err(error));
                }
            }
            (cutter.busy, cutter.hashing)
        });
        // This thread writes the oldest batch while the newer ones compress.
        let mut queue = CompressionQueue {
            batches: VecDeque::new(),
            spare: Vec::new(),
            level: store.state.options.compression_level,
            recycle: recycle_sender,
        };
        let write_oldest =
            |writer: &mut PathState, store: &mut BackupStore, queue: &mut CompressionQueue| {
                let (prepared, frames, seconds) = queue.pop().expect("a batch is compressing");
                writer.outcome.report.compress_seconds += seconds;
                let frames = frames?;
                writer.write(store, prepared, &frames)?;
                queue.reuse(frames.bytes);
                Ok(())
            };
        let mut consumed = Ok(());
        for batch in receiver.iter() {
            let step = batch.and_then(|batch| {
                let prepared = writer.prepare(store, &batch)?;
                queue.push(prepared, batch);
                if queue.batches.len() > COMPRESSING_BATCHES {
                    write_oldest(&mut writer, store, &mut queue)?;
                }
                Ok(())
            });
            if let Err(error) = step {
                consumed = Err(error);
                break;
            }
            if let Some(progress) = progress {
                progress(writer.outcome.report.logical_bytes);
            }
        }
        while consumed.is_ok() && !queue.batches.is_empty() {
            consumed = write_oldest(&mut writer, store, &mut queue);
        }
        // Dropping the receiver stops the chunker at its next send.
        drop(receiver);
        let (chunk_seconds, fingerprint_seconds) =
            chunker.join().expect("the chunker thread does not panic");
        writer.outcome.report.chunk_seconds = chunk_seconds;
        writer.outcome.report.fingerprint_seconds = fingerprint_seconds;
        consumed
    });
    result?;
    let sealed = Instant::now();
    writer.seal_open(store)?;
    writer.outcome.report.seal_seconds = sealed.elapsed().as_secs_f64();
    // A lent chunk counts its borrowers among its direct references.
    let positions: HashMap<SegmentId, usize> = writer
        .outcome
        .new_segments
        .iter()
        .enumerate()
        .map(|(position, (id, _))| (*id, position))
        .collect();
    for ((segment, index), count) in std::mem::take(&mut writer.borrows) {
        let (_, record) = &mut writer.outcome.new_segments[positions[&segment]];
        record.chunks[index as usize].direct_references += count;
    }
    let mut outcome = writer.outcome;
    outcome.report.seconds = started.elapsed().as_secs_f64();
    Ok(outcome)
}

/// A chunk of a batch, hashed.
#[derive(Clone, Copy)]
struct HashedChunk {
    fingerprint: Fingerprint,
    /// All its bytes are zero: stored as nothing.
    zero: bool,
}

/// What the segment index says about one segment of a batch.
struct SegmentDecision {
    /// The segment's chunks, as positions in the batch.
    chunks: Range<usize>,
    fingerprint: Fingerprint,
    /// The existing segment with this fingerprint, or the id allocated for a new one.
    id: SegmentId,
    /// No segment had this fingerprint: its chunks are stored.
    new: bool,
}

struct PathState {
    outcome: InlineOutcome,
    /// New segments of this backup by fingerprint (the index has them too, but the catalog
    /// does not yet, so the usual confirmation would reject them).
    pending: HashMap<Fingerprint, SegmentId>,
    open: Option<(ContainerWriter, Vec<SegmentId>)>,
    /// The stored chunks of this backup's new segments so far: a chunk of a later new segment
    /// with the same fingerprint borrows it instead of being stored again.
    lenders: Lenders,
    /// Borrowers of each lent chunk, added to its direct references at the end.
    borrows: HashMap<(SegmentId, u32), u32>,
}

/// The chunks a backup's new segments store, by fingerprint, as (segment, chunk index).
///
/// The map is a large part of a backup's memory, so an entry is 24 bytes: the first half of the
/// fingerprint as key (fingerprints are 256-bit cryptographic hashes: a chunk looked up
/// shares its first 128 bits with a lender it is not with a chance of 2^-128 per pair, below
/// 2^-80 for a backup of 1 TiB against the most lenders held) and the segment as an offset
/// from the backup's first lending segment beside the chunk's index.
#[derive(Default)]
struct Lenders {
    chunks: HashMap<[u8; LENDER_KEY_BYTES], u64>,
    /// The first segment that lent: segments get increasing ids within a backup.
    first: Option<SegmentId>,
}

/// Bytes of a fingerprint that key [`Lenders`].
const LENDER_KEY_BYTES: usize = 16;

impl Lenders {
    fn key(fingerprint: &Fingerprint) -> [u8; LENDER_KEY_BYTES] {
        let mut key = [0u8; LENDER_KEY_BYTES];
        key.copy_from_slice(&fingerprint.0[..LENDER_KEY_BYTES]);
        key
    }

    fn len(&self) -> usize {
        self.chunks.len()
    }

    fn get(&self, fingerprint: &Fingerprint) -> Option<(SegmentId, u32)> {
        let packed = *self.chunks.get(&Self::key(fingerprint))?;
        let first = self.first.expect("a lender was added");
        Some((first + (packed >> 32), packed as u32))
    }

    /// Adds chunk `index` of `segment` unless a chunk with its fingerprint lends already.
    fn insert(&mut self, fingerprint: &Fingerprint, (segment, index): (SegmentId, u32)) {
        let first = *self.first.get_or_insert(segment);
        let offset = segment
            .checked_sub(first)
            .filter(|offset| *offset <= u64::from(u32::MAX))
            .expect("a backup's new segments have increasing ids, fewer than 2^32 of them");
        self.chunks
            .entry(Self::key(fingerprint))
            .or_insert(offset << 32 | u64::from(index));
    }
}

/// A batch whose segments are looked up and whose new chunks are planned into frames, with
/// what writing it needs besides the frames.
struct PreparedBatch {
    decisions: Vec<SegmentDecision>,
    /// Every chunk's length, in order.
    lengths: Vec<u32>,
    /// Every chunk, fingerprinted.
    hashed: Vec<HashedChunk>,
    /// The batch's placed segments (see [`Batch::placed`]).
    placed: Vec<(usize, SegmentReference)>,
    /// Chunks (positions in the batch) that borrow a chunk an earlier new segment stores.
    lent: HashMap<usize, (SegmentId, u32)>,
    /// The frames of the new segments' stored chunks, in order.
    plans: Vec<Vec<usize>>,
}

/// A batch's frames, compressed on the pool (or the panic that stopped it).
struct Compressed {
    frames: std::thread::Result<Result<CompressedFrames>>,
    /// Wall time of the batch's compression.
    seconds: f64,
}

/// Batches prepared and compressing on the pool, oldest first, and frame buffers to reuse.
struct CompressionQueue {
    batches: VecDeque<(PreparedBatch, Receiver<Compressed>)>,
    spare: Vec<Vec<u8>>,
    level: Option<i32>,
    /// Where compressed batches go back to the chunker to be filled again.
    recycle: Sender<Batch>,
}

impl CompressionQueue {
    /// Compresses the planned frames of `batch` on the pool, without waiting.
    fn push(&mut self, mut prepared: PreparedBatch, batch: Batch) {
        let plans = std::mem::take(&mut prepared.plans);
        let bytes = self.spare.pop().unwrap_or_default();
        let level = self.level;
        let recycle = self.recycle.clone();
        let (sender, receiver) = bounded(1);
        rayon::spawn(move || {
            let started = Instant::now();
            // A panic goes to the thread that waits for the frames, as a join would carry
            // it, rather than aborting the process on the pool.
            let frames = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                compress(&batch, plans, level, bytes)
            }));
            let seconds = started.elapsed().as_secs_f64();
            // The frames hold what the write needs: the batch goes back to be filled. A full
            // recycling queue only means the chunker has buffers enough.
            drop(recycle.try_send(batch));
            // The receiver is gone only when the backup failed before writing this batch.
            drop(sender.send(Compressed { frames, seconds }));
        });
        self.batches.push_back((prepared, receiver));
    }

    /// Waits for the oldest batch's frames and the seconds they took; resumes a panic of
    /// their compression.
    fn pop(&mut self) -> Option<(PreparedBatch, Result<CompressedFrames>, f64)> {
        let (prepared, receiver) = self.batches.pop_front()?;
        let Compressed { frames, seconds } =
            receiver.recv().expect("a compression job sends its result");
        let frames = frames.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        Some((prepared, frames, seconds))
    }

    /// Takes back a written batch's frame buffer.
    fn reuse(&mut self, bytes: Vec<u8>) {
        self.spare.push(bytes);
    }
}

/// Compresses the planned frames of `batch` on all cores into `bytes` (cleared first).
fn compress(
    batch: &Batch,
    plans: Vec<Vec<usize>>,
    level: Option<i32>,
    mut bytes: Vec<u8>,
) -> Result<CompressedFrames> {
    let offsets = batch.chunk_offsets();
    bytes.clear();
    // Frames are appended as they finish, in any order: the buffer grows only by what is
    // stored, where a slot per frame would touch room for its largest stored form.
    let buffer = Mutex::new(bytes);
    let stored: Vec<(usize, Range<usize>, bool)> = plans
        .par_iter()
        .map(|chunks| {
            FRAME_SCRATCH.with(|scratch| {
                let (raw, compressed) = &mut *scratch.borrow_mut();
                // A frame's chunks are most often one run of the batch's bytes.
                let contiguous = chunks.windows(2).all(|pair| pair[1] == pair[0] + 1);
                let raw: &[u8] = if contiguous {
                    let first = *chunks.first().expect("a frame has chunks");
                    let last = *chunks.last().expect("a frame has chunks");
                    &batch.data[offsets[first]..offsets[last + 1]]
                } else {
                    raw.clear();
                    for &chunk in chunks {
                        raw.extend_from_slice(&batch.data[offsets[chunk]..offsets[chunk + 1]]);
                    }
                    raw
                };
                let pays = match level {
                    Some(level) => codec::compress_into(raw, level, compressed)?,
                    None => false,
                };
                let stored = if pays { &compressed[..] } else { raw };
                let mut buffer = buffer.lock();
                let start = buffer.len();
                buffer.extend_from_slice(stored);
                Ok((raw.len(), start..buffer.len(), pays))
            })
        })
        .collect::<Result<_>>()?;
    let frames = plans
        .into_iter()
        .zip(stored)
        .map(|(chunks, (raw_bytes, stored, compressed))| EncodedFrame {
            chunks,
            raw_bytes,
            stored,
            compressed,
        })
        .collect();
    Ok(CompressedFrames {
        frames,
        bytes: buffer.into_inner(),
    })
}

thread_local! {
    /// A pool thread's buffers: a frame's raw bytes when its chunks are not one run of the
    /// batch, and its compressed bytes.
    static FRAME_SCRATCH: RefCell<(Vec<u8>, Vec<u8>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

impl PathState {
    /// Looks every segment of `batch` up (new ones get their ids), lends and borrows the new
    /// segments' chunks, and plans their frames.
    fn prepare(&mut self, store: &mut BackupStore, batch: &Batch) -> Result<PreparedBatch> {
        let fingerprinter = &store.fingerprinter;
        let slices = batch.chunks();
        let hashed = &batch.hashed;
        assert_eq!(
            hashed.len(),
            slices.len(),
            "the chunker fingerprinted every chunk"
        );

        // Look every segment up first, so that compression of the new ones runs in one
        // parallel pass.
        let start = Instant::now();
        let read = store.catalog.read()?;
        // Every segment's fingerprint first, so the index can warm the batch's lookups.
        let mut first = 0usize;
        let ranges: Vec<Range<usize>> = batch
            .segments
            .iter()
            .map(|segment| {
                first += segment.len();
                first - segment.len()..first
            })
            .collect();
        let mut fingerprint_bytes = Vec::new();
        let fingerprints: Vec<Fingerprint> = ranges
            .iter()
            .map(|range| {
                fingerprint_bytes.clear();
                for chunk in &hashed[range.clone()] {
                    fingerprint_bytes.extend_from_slice(&chunk.fingerprint.0);
                }
                fingerprinter.hash(&fingerprint_bytes)
            })
            .collect();
        if let Some(index) = &store.index {
            index.warm(&fingerprints);
        }
        let rebuilds = store.index_rebuilds;
        let mut decisions = Vec::with_capacity(ranges.len());
        for (range, fingerprint) in ranges.into_iter().zip(fingerprints) {
            self.outcome.report.index_lookups += 1;
            let existing = match self.pending.get(&fingerprint) {
                Some(&id) => Some(id),
                None => store.lookup_segment(&read, &fingerprint)?,
            };
            let (id, new) = match existing {
                Some(id) => (id, false),
                None => {
                    // Allocate the id now so that repeats later in the backup find it.
                    let id = self.outcome.state.segment_id_next;
                    self.outcome.state.segment_id_next += 1;
                    self.pending.insert(fingerprint, id);
                    (id, true)
                }
            };
            decisions.push(SegmentDecision {
                chunks: range,
                fingerprint,
                id,
                new,
            });
        }
        drop(read);
        if store.index_rebuilds != rebuilds {
            // A lookup found the index damaged and the store rebuilt it from the catalog,
            // which does not have this backup's segments yet: the ones written so far go
            // into it again (those still being compressed are added when written).
            for (id, record) in &self.outcome.new_segments {
                store.index_insert(&record.fingerprint, *id);
            }
        }
        self.outcome.report.index_seconds += start.elapsed().as_secs_f64();

        // Chunks of new segments that an earlier new segment of this backup stores borrow it
        // (finer inline deduplication); the others are stored, in frames. All frames of the
        // batch are compressed in one parallel pass.
        let mut lent: HashMap<usize, (SegmentId, u32)> = HashMap::new();
        for decision in decisions.iter().filter(|decision| decision.new) {
            let mut own = Vec::new();
            for chunk in decision.chunks.clone() {
                if hashed[chunk].zero {
                    continue;
                }
                match self.lenders.get(&hashed[chunk].fingerprint) {
                    Some(lender) => {
                        lent.insert(chunk, lender);
                        *self.borrows.entry(lender).or_insert(0) += 1;
                    }
                    None => own.push(chunk),
                }
            }
            // Only earlier segments lend: a repeat inside one segment is compressed in its
            // frame instead.
            for chunk in own {
                if self.lenders.len() >= LENDERS_MAX {
                    break;
                }
                self.lenders.insert(
                    &hashed[chunk].fingerprint,
                    (decision.id, (chunk - decision.chunks.start) as u32),
                );
            }
        }
        let plans: Vec<Vec<usize>> = decisions
            .iter()
            .filter(|decision| decision.new)
            .flat_map(|decision| {
                let stored = decision
                    .chunks
                    .clone()
                    .filter(|&chunk| !hashed[chunk].zero && !lent.contains_key(&chunk))
                    .map(|chunk| (chunk as u32, slices[chunk].len() as u32));
                plan_frames(stored)
                    .into_iter()
                    .map(|frame| frame.into_iter().map(|chunk| chunk as usize).collect())
            })
            .collect();
        Ok(PreparedBatch {
            decisions,
            lengths: batch.segments.concat(),
            hashed: hashed.clone(),
            placed: batch.placed.clone(),
            lent,
            plans,
        })
    }

    /// Writes the new segments of `batch` (its frames compressed) into containers and adds
    /// every segment to the outcome, in order.
    fn write(
        &mut self,
        store: &mut BackupStore,
        prepared: PreparedBatch,
        compressed: &CompressedFrames,
    ) -> Result<()> {
        let start = Instant::now();
        let PreparedBatch {
            decisions,
            lengths,
            hashed,
            placed,
            lent,
            ..
        } = prepared;
        let hashed = &hashed;
        let mut frames = compressed.frames.iter().peekable();
        let mut placed = placed.iter().peekable();
        for (position, decision) in decisions.into_iter().enumerate() {
            while let Some((_, reference)) = placed.next_if(|(before, _)| *before == position) {
                self.place(reference);
            }
            let SegmentDecision {
                chunks: range,
                fingerprint,
                id,
                new,
            } = decision;
            let raw_bytes: u64 = lengths[range.clone()]
                .iter()
                .map(|&length| length as u64)
                .sum();
            let report = &mut self.outcome.report;
            report.logical_bytes += raw_bytes;
            report.chunks += range.len() as u64;
            report.segments += 1;
            *self.outcome.references.entry(id).or_insert(0) += 1;
            self.outcome.segments.push(SegmentReference {
                segment: id,
                chunk_count: range.len() as u32,
                raw_bytes,
            });
            let zero_bytes: u64 = range
                .clone()
                .filter(|&chunk| hashed[chunk].zero)
                .map(|chunk| lengths[chunk] as u64)
                .sum();
            report.zero_bytes += zero_bytes;
            if !new {
                report.segments_duplicate += 1;
                report.duplicate_bytes += raw_bytes - zero_bytes;
                continue;
            }
            report.segments_new += 1;
            let mut segment_frames = Vec::new();
            while let Some(frame) = frames.next_if(|frame| range.contains(&frame.chunks[0])) {
                segment_frames.push(frame);
            }
            let record = self.store_segment(
                store,
                &lengths,
                hashed,
                range,
                &segment_frames,
                &compressed.bytes,
                &lent,
                fingerprint,
                id,
            )?;
            store.index_insert(&fingerprint, id);
            self.outcome.new_segments.push((id, record));
        }
        for (_, reference) in placed {
            self.place(reference);
        }
        // The disk writes the batch while the next one is prepared, not all at the seal.
        if let Some((writer, _)) = self.open.as_mut() {
            writer.start_writeback();
        }
        self.outcome.report.write_seconds += start.elapsed().as_secs_f64();
        Ok(())
    }

    /// Adds a segment placed as it is (see [`StreamPart::Segments`]): a reference, nothing
    /// written.
    fn place(&mut self, reference: &SegmentReference) {
        let report = &mut self.outcome.report;
        report.logical_bytes += reference.raw_bytes;
        report.chunks += reference.chunk_count as u64;
        report.segments += 1;
        report.placed_segments += 1;
        report.placed_bytes += reference.raw_bytes;
        *self
            .outcome
            .references
            .entry(reference.segment)
            .or_insert(0) += 1;
        self.outcome.segments.push(*reference);
    }

    #[allow(clippy::too_many_arguments)]
    fn store_segment(
        &mut self,
        store: &mut BackupStore,
        lengths: &[u32],
        hashed: &[HashedChunk],
        range: std::ops::Range<usize>,
        frames: &[&EncodedFrame],
        frame_bytes: &[u8],
        lent: &HashMap<usize, (SegmentId, u32)>,
        fingerprint: Fingerprint,
        id: SegmentId,
    ) -> Result<SegmentRecord> {
        let footprint: u64 = frames
            .iter()
            .map(|frame| (frame.stored.len() + CHUNK_HEADER_BYTES) as u64)
            .sum();
        let mut container = None;
        if footprint > 0 {
            container = Some(self.room_for(store, footprint)?);
        }
        let mut chunks: Vec<SegmentChunk> = range
            .clone()
            .map(|chunk| SegmentChunk {
                fingerprint: hashed[chunk].fingerprint,
                raw_bytes: lengths[chunk],
                storage: match lent.get(&chunk) {
                    Some(&(segment, index)) => {
                        self.outcome.report.borrowed_chunks += 1;
                        self.outcome.report.borrowed_bytes += lengths[chunk] as u64;
                        ChunkStorage::Borrowed { segment, index }
                    }
                    None => ChunkStorage::Zero,
                },
                direct_references: 0,
            })
            .collect();
        let fingerprinter = &store.fingerprinter;
        let mut locations = Vec::with_capacity(frames.len());
        for frame in frames {
            let (writer, _) = self.open.as_mut().expect("room_for opened a container");
            let frame_print = frame_fingerprint(
                fingerprinter,
                frame.chunks.iter().map(|&chunk| &hashed[chunk].fingerprint),
            );
            let location = writer.append_stored_form(
                &frame_print,
                frame.raw_bytes,
                &frame_bytes[frame.stored.clone()],
                frame.compressed,
            )?;
            self.outcome.report.frames += 1;
            self.outcome.report.new_raw_bytes += frame.raw_bytes as u64;
            self.outcome.report.new_stored_bytes += location.footprint_bytes();
            let mut within = 0u32;
            for &chunk in &frame.chunks {
                assert!(!hashed[chunk].zero, "null chunks are not stored");
                chunks[chunk - range.start].storage = ChunkStorage::Stored(ChunkPlace {
                    frame: locations.len() as u32,
                    within,
                });
                within += lengths[chunk];
            }
            locations.push(location);
        }
        assert!(
            range.clone().all(|chunk| hashed[chunk].zero
                || matches!(
                    chunks[chunk - range.start].storage,
                    ChunkStorage::Stored(_) | ChunkStorage::Borrowed { .. }
                )),
            "every non-null chunk is in a frame or borrowed"
        );
        if container.is_some() {
            self.open.as_mut().expect("open").1.push(id);
        }
        Ok(SegmentRecord {
            fingerprint,
            state: SegmentState::Shared,
            container,
            frames: locations,
            chunks,
        })
    }

    /// The open container, sealing the current one first when `footprint` more bytes would
    /// overflow it (a segment never spans containers; an oversized one gets its own).
    fn room_for(&mut self, store: &mut BackupStore, footprint: u64) -> Result<ContainerId> {
        if let Some((writer, _)) = &self.open {
            if writer.chunk_count() > 0
                && writer.bytes() + footprint > store.state.options.container_bytes
            {
                self.seal_open(store)?;
            }
        }
        if self.open.is_none() {
            let id = self.outcome.state.container_id_next;
            self.outcome.state.container_id_next += 1;
            let writer = store
                .containers
                .create(id, crate::store::now_unix_ns() / 1_000_000_000)?;
            self.open = Some((writer, Vec::new()));
        }
        Ok(self.open.as_ref().expect("opened").0.id())
    }

    fn seal_open(&mut self, _store: &mut BackupStore) -> Result<()> {
        if let Some((writer, segments)) = self.open.take() {
            let id = writer.id();
            let sealed = writer.seal(0)?;
            self.outcome.report.containers_written += 1;
            self.outcome.containers.push((
                id,
                SegmentContainer {
                    kind: ContainerKind::Shared,
                    timestamp: 0,
                    bytes: sealed.bytes,
                    segments,
                },
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch of one segment holding `chunks`.
    fn batch_of(chunks: &[Vec<u8>]) -> Batch {
        let mut batch = Batch::default();
        for chunk in chunks {
            batch.data.extend_from_slice(chunk);
        }
        batch
            .segments
            .push(chunks.iter().map(|chunk| chunk.len() as u32).collect());
        batch.hashed = vec![
            HashedChunk {
                fingerprint: Fingerprint::ZERO,
                zero: false,
            };
            chunks.len()
        ];
        batch
    }

    fn noise(bytes: usize) -> Vec<u8> {
        use proptest::strategy::{Strategy, ValueTree};
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        proptest::collection::vec(proptest::num::u8::ANY, bytes)
            .new_tree(&mut runner)
            .expect("a vector of bytes")
            .current()
    }

    fn text(bytes: usize) -> Vec<u8> {
        b"a frame of chunks compresses together. "
            .iter()
            .copied()
            .cycle()
            .take(bytes)
            .collect()
    }

    /// Goal: a lender is found by its chunk's fingerprint with the segment and index it was
    /// added with, the first chunk added for a fingerprint stays its lender, and a chunk no
    /// segment lends is not found.
    /// Method: lenders of segments far apart after the first, one fingerprint added twice.
    #[test]
    fn lenders_give_back_what_they_were_given() {
        let fingerprint = |byte: u8| {
            let mut bytes = [byte; 32];
            bytes[31] = !byte;
            Fingerprint(bytes)
        };
        let mut lenders = Lenders::default();
        assert_eq!(lenders.get(&fingerprint(1)), None);
        lenders.insert(&fingerprint(1), (1_000, 0));
        lenders.insert(&fingerprint(2), (1_000, 4_095));
        lenders.insert(&fingerprint(3), (1_000 + u64::from(u32::MAX), u32::MAX));
        lenders.insert(&fingerprint(1), (1_001, 7));
        assert_eq!(lenders.len(), 3);
        assert_eq!(lenders.get(&fingerprint(1)), Some((1_000, 0)));
        assert_eq!(lenders.get(&fingerprint(2)), Some((1_000, 4_095)));
        assert_eq!(
            lenders.get(&fingerprint(3)),
            Some((1_000 + u64::from(u32::MAX), u32::MAX))
        );
        assert_eq!(lenders.get(&fingerprint(4)), None);
    }

    /// Goal: every frame's stored bytes are its chunks in order, compressed when that pays,
    /// whether the chunks are one run of the batch or not, whatever a reused buffer held.
    /// Method: frames of a run, of chunks around a skipped one (as a lent chunk is skipped)
    /// and of noise, at two levels and none, into a buffer full of stale bytes.
    #[test]
    fn frames_hold_their_chunks() {
        let chunks = vec![text(5000), noise(3000), text(7000), noise(4000), text(100)];
        let batch = batch_of(&chunks);
        let plans = vec![vec![0, 2], vec![1], vec![3, 4]];
        for level in [Some(1), Some(3), None] {
            let compressed = compress(&batch, plans.clone(), level, vec![0xab; 1 << 20]).unwrap();
            assert_eq!(compressed.frames.len(), plans.len());
            for (frame, plan) in compressed.frames.iter().zip(&plans) {
                let raw: Vec<u8> = plan
                    .iter()
                    .flat_map(|&chunk| chunks[chunk].clone())
                    .collect();
                assert_eq!(&frame.chunks, plan);
                assert_eq!(frame.raw_bytes, raw.len());
                let stored = &compressed.bytes[frame.stored.clone()];
                if frame.compressed {
                    assert!(stored.len() < raw.len());
                    assert_eq!(zstd::bulk::decompress(stored, raw.len()).unwrap(), raw);
                } else {
                    assert_eq!(stored, &raw[..]);
                }
            }
            assert_eq!(
                compressed.frames[0].compressed,
                level.is_some(),
                "{level:?}"
            );
            assert!(!compressed.frames[1].compressed, "noise is stored as it is");
        }
    }
}
