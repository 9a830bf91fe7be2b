//! One pass: every source read once, cut with one chunker, every chunk fingerprinted and
//! counted.
//!
//! The pass is a three-stage pipeline over blocks (see `reader.rs`):
//!
//! 1. The reader thread fills block `k + 1` (and queues one more).
//! 2. Meanwhile one rayon task cuts block `k + 1` into chunks. Cutting is sequential within a
//!    source (a content-defined cut depends on the previous one).
//! 3. Meanwhile the other rayon workers fingerprint the chunks of block `k` in parallel
//!    groups and then count them in the [`SeenSet`].
//!
//! So a single large file keeps both cores busy: one cuts while both fingerprint. The uncut
//! tail of a block's last source (shorter than one maximum chunk) is copied into the headroom
//! in front of the next block, so a chunk is always contiguous in one buffer.

use std::time::Instant;

use crossbeam_channel::{bounded, Receiver};
use onecopy_core::chunking::{Chunker, ChunkerSpec};
use onecopy_core::fingerprint::{Fingerprint, FingerprintAlgorithm};
use rayon::prelude::*;

use crate::reader::{read_sources, Block, Message, BLOCKS_IN_FLIGHT};
use crate::seen::SeenSet;
use crate::sources::SourceList;
use crate::{AnalyzeError, ChunkerReport, Progress};

/// Chunks fingerprinted per parallel task: enough work (about 256 KiB at 4 KiB chunks) that
/// scheduling costs little, small enough that both workers get many tasks per block.
const CHUNKS_PER_TASK: usize = 64;

/// A chunk within its block's buffer.
#[derive(Clone, Copy, Debug)]
struct ChunkRef {
    start: u32,
    len: u32,
}

/// The cuts of one block, and where its uncut tail is.
struct CutBlock {
    block: Block,
    chunks: Vec<ChunkRef>,
    /// Bytes at the end of the buffer that belong to the next block's first chunk.
    carry: std::ops::Range<usize>,
}

/// Per-pass counters.
#[derive(Default)]
struct Counts {
    total_bytes: u64,
    zero_bytes: u64,
    unique_bytes: u64,
    chunks: u64,
    unique_chunks: u64,
}

/// Runs one pass of `spec` over `list`.
pub fn run_pass(
    spec: &ChunkerSpec,
    list: &SourceList,
    progress: &dyn Progress,
) -> Result<ChunkerReport, AnalyzeError> {
    let started = Instant::now();
    let headroom = spec.chunk_bytes_max();
    let (block_sender, block_receiver) = bounded::<Message>(BLOCKS_IN_FLIGHT);
    let (recycle_sender, recycle_receiver) = bounded::<Block>(BLOCKS_IN_FLIGHT);
    let mut seen = SeenSet::new();
    let mut counts = Counts::default();
    std::thread::scope(|scope| {
        let reader = std::thread::Builder::new()
            .name("analyze-reader".to_string())
            .spawn_scoped(scope, || {
                read_sources(&list.sources, headroom, block_sender, recycle_receiver)
            })
            .expect("spawn the reader thread");
        let result = pipeline(
            spec,
            &block_receiver,
            &recycle_sender,
            &mut seen,
            &mut counts,
            progress,
        );
        // Hang up so that a reader blocked on a full channel stops, then wait for it.
        drop(block_receiver);
        drop(recycle_sender);
        reader.join().expect("the reader thread does not panic");
        result
    })?;
    Ok(ChunkerReport {
        chunker: *spec,
        total_bytes: counts.total_bytes,
        zero_bytes: counts.zero_bytes,
        unique_bytes: counts.unique_bytes,
        chunks: counts.chunks,
        unique_chunks: counts.unique_chunks,
        seconds: started.elapsed().as_secs_f64(),
        index_bytes: seen.memory_bytes() as u64,
    })
}

fn pipeline(
    spec: &ChunkerSpec,
    blocks: &Receiver<Message>,
    recycle: &crossbeam_channel::Sender<Block>,
    seen: &mut SeenSet,
    counts: &mut Counts,
    progress: &dyn Progress,
) -> Result<(), AnalyzeError> {
    let mut chunker = spec.build();
    let mut previous: Option<CutBlock> = None;
    loop {
        let next = blocks.recv().ok().transpose()?;
        let Some(mut block) = next else {
            if let Some(last) = previous.take() {
                assert!(
                    last.carry.is_empty(),
                    "the last source ends in the last block"
                );
                count_block(&last, seen, counts);
                progress.advance(last.block.filled as u64);
            }
            return Ok(());
        };
        if let Some(previous) = &previous {
            attach_carry(&previous.block.buffer[previous.carry.clone()], &mut block);
        }
        let (cut, ()) = rayon::join(
            || cut_block(spec, &mut chunker, block),
            || {
                if let Some(previous) = &previous {
                    count_block(previous, seen, counts);
                }
            },
        );
        if let Some(done) = previous.replace(cut) {
            progress.advance(done.block.filled as u64);
            let mut buffer = done.block;
            buffer.clear();
            // The reader may have finished and hung up; then the buffer is simply dropped.
            let _ = recycle.try_send(buffer);
        }
    }
}

/// Copies the previous block's uncut tail into the headroom before `block`'s first piece,
/// which continues the same source.
fn attach_carry(carry: &[u8], block: &mut Block) {
    if carry.is_empty() {
        return;
    }
    assert!(
        carry.len() <= block.headroom,
        "the headroom holds a maximum-size chunk"
    );
    let first = block
        .pieces
        .first_mut()
        .expect("a continued source has a piece in the next block");
    assert!(
        !first.starts_source,
        "the carry continues the previous block's last source"
    );
    assert_eq!(first.start, block.headroom);
    let start = block.headroom - carry.len();
    block.buffer[start..block.headroom].copy_from_slice(carry);
    first.start = start;
    first.len += carry.len();
}

/// Cuts every piece of `block`; a new chunker starts at every source's first byte.
fn cut_block(spec: &ChunkerSpec, chunker: &mut Box<dyn Chunker>, block: Block) -> CutBlock {
    let max = spec.chunk_bytes_max();
    let mut chunks = Vec::with_capacity(block.filled / 2048 + 16);
    let mut carry = 0..0;
    let piece_count = block.pieces.len();
    for (index, piece) in block.pieces.iter().enumerate() {
        if piece.starts_source {
            *chunker = spec.build();
        }
        let end = piece.start + piece.len;
        let mut position = piece.start;
        while position < end {
            if end - position < max && !piece.ends_source {
                assert_eq!(
                    index + 1,
                    piece_count,
                    "only the block's last piece continues"
                );
                carry = position..end;
                break;
            }
            let cut = chunker.next_cut(&block.buffer[position..end], piece.ends_source);
            chunks.push(ChunkRef {
                start: position as u32,
                len: cut.len as u32,
            });
            position += cut.len;
        }
    }
    CutBlock {
        block,
        chunks,
        carry,
    }
}

/// True when every byte of `data` is zero; checks 64 bytes at a time so that the common
/// non-zero case exits early and the zero case runs at memory speed.
fn is_zero(data: &[u8]) -> bool {
    let mut lines = data.chunks_exact(64);
    for line in &mut lines {
        let mut any = 0u64;
        for word in line.chunks_exact(8) {
            any |= u64::from_ne_bytes(word.try_into().expect("8 bytes"));
        }
        if any != 0 {
            return false;
        }
    }
    lines.remainder().iter().all(|&byte| byte == 0)
}

/// The key of each chunk in the [`SeenSet`], or `None` for an all-zero chunk (never stored).
fn chunk_keys(block: &Block, chunks: &[ChunkRef], keys: &mut [Option<u128>]) {
    let mut nonzero: Vec<&[u8]> = Vec::with_capacity(chunks.len());
    let mut nonzero_slots = Vec::with_capacity(chunks.len());
    for (slot, chunk) in chunks.iter().enumerate() {
        let data = &block.buffer[chunk.start as usize..(chunk.start + chunk.len) as usize];
        keys[slot] = None;
        if !is_zero(data) {
            nonzero.push(data);
            nonzero_slots.push(slot);
        }
    }
    let mut fingerprints = vec![Fingerprint::ZERO; nonzero.len()];
    FingerprintAlgorithm::Blake3.hash_batch(&nonzero, &mut fingerprints);
    for (slot, fingerprint) in nonzero_slots.into_iter().zip(&fingerprints) {
        keys[slot] = Some(SeenSet::key(fingerprint));
    }
}

/// Fingerprints the chunks of a cut block on all workers, then counts them.
fn count_block(cut: &CutBlock, seen: &mut SeenSet, counts: &mut Counts) {
    let mut keys = vec![None; cut.chunks.len()];
    cut.chunks
        .par_chunks(CHUNKS_PER_TASK)
        .zip(keys.par_chunks_mut(CHUNKS_PER_TASK))
        .for_each(|(chunks, keys)| chunk_keys(&cut.block, chunks, keys));
    for (chunk, key) in cut.chunks.iter().zip(&keys) {
        let len = chunk.len as u64;
        counts.total_bytes += len;
        counts.chunks += 1;
        match key {
            None => counts.zero_bytes += len,
            Some(key) => {
                if seen.insert(*key) {
                    counts.unique_bytes += len;
                    counts.unique_chunks += 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the zero test agrees with the obvious one at every length and position of a
    /// single non-zero byte.
    #[test]
    fn is_zero_finds_any_nonzero_byte() {
        for len in [0usize, 1, 63, 64, 65, 200] {
            let mut data = vec![0u8; len];
            assert!(is_zero(&data));
            for position in 0..len {
                data[position] = 1;
                assert!(!is_zero(&data), "len {len}, position {position}");
                data[position] = 0;
            }
        }
    }
}
