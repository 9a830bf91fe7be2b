//! The reader thread: reads every source in large blocks, packing small files together, and
//! hands the blocks to the pass through a bounded channel.
//!
//! A **block** is one buffer of up to [`BLOCK_BYTES`] read bytes, preceded by a headroom where
//! the pass copies the uncut tail of the previous block's last file (see `pass.rs`), so that
//! every chunk is contiguous in one buffer. A **piece** is the part of a block that holds bytes
//! of one source; a source larger than a block spans several pieces in consecutive blocks.

use std::fs::File;
use std::io::{ErrorKind, Read};
use std::os::fd::AsRawFd;

use crossbeam_channel::{Receiver, Sender};

use crate::sources::Source;
use crate::AnalyzeError;

/// Bytes read per block: large reads keep system calls and per-block work negligible.
pub const BLOCK_BYTES: usize = 8 << 20;

/// Blocks allocated at most: one being read, one being cut, one being fingerprinted, one
/// queued. This bounds the pass's buffer memory to `BLOCKS_IN_FLIGHT * (headroom + BLOCK_BYTES)`.
pub const BLOCKS_IN_FLIGHT: usize = 4;

/// The bytes of one source within a block.
#[derive(Clone, Copy, Debug)]
pub struct Piece {
    /// Position of the piece's first byte in [`Block::buffer`].
    pub start: usize,
    pub len: usize,
    /// True when the piece begins at the source's first byte.
    pub starts_source: bool,
    /// True when the piece ends at the source's end.
    pub ends_source: bool,
}

/// A buffer of read bytes and the pieces it holds, in stream order.
pub struct Block {
    /// `headroom` bytes reserved for the pass, then the read bytes.
    pub buffer: Vec<u8>,
    pub headroom: usize,
    /// Read bytes after the headroom.
    pub filled: usize,
    pub pieces: Vec<Piece>,
}

impl Block {
    fn new(headroom: usize) -> Block {
        Block {
            buffer: vec![0u8; headroom + BLOCK_BYTES],
            headroom,
            filled: 0,
            pieces: Vec::new(),
        }
    }

    /// Empties the block for reuse.
    pub fn clear(&mut self) {
        self.filled = 0;
        self.pieces.clear();
    }

    fn is_full(&self) -> bool {
        self.filled == BLOCK_BYTES
    }
}

/// What the reader thread sends: a block, or the error that stopped it.
pub type Message = Result<Block, AnalyzeError>;

/// Reads `sources` in order into blocks sent on `blocks`, taking empty blocks back from
/// `recycled`. Returns when every source is read, on the first error (which it sends), or when
/// the receiving side hangs up.
pub fn read_sources(
    sources: &[Source],
    headroom: usize,
    blocks: Sender<Message>,
    recycled: Receiver<Block>,
) {
    let mut allocated = 1;
    let mut block = Block::new(headroom);
    let next_block = |allocated: &mut usize| -> Option<Block> {
        if let Ok(block) = recycled.try_recv() {
            return Some(block);
        }
        if *allocated < BLOCKS_IN_FLIGHT {
            *allocated += 1;
            return Some(Block::new(headroom));
        }
        recycled.recv().ok()
    };
    for source in sources {
        match read_source(source, &mut block, &blocks, &mut || {
            next_block(&mut allocated)
        }) {
            Ok(true) => {}
            Ok(false) => return,
            Err(error) => {
                let _ = blocks.send(Err(error));
                return;
            }
        }
    }
    if !block.pieces.is_empty() {
        let _ = blocks.send(Ok(block));
    }
}

/// Reads one source to its end into `block`, sending full blocks. Returns `Ok(false)` when the
/// receiver hung up.
fn read_source(
    source: &Source,
    block: &mut Block,
    blocks: &Sender<Message>,
    next_block: &mut dyn FnMut() -> Option<Block>,
) -> Result<bool, AnalyzeError> {
    let mut file = File::open(&source.path)
        .map_err(|error| AnalyzeError::io("cannot open", &source.path, error))?;
    advise_sequential(&file);
    let mut starts_source = true;
    loop {
        if block.is_full() {
            let Some(fresh) = next_block() else {
                return Ok(false);
            };
            let full = std::mem::replace(block, fresh);
            if blocks.send(Ok(full)).is_err() {
                return Ok(false);
            }
        }
        let begin = block.headroom + block.filled;
        let piece_start = begin;
        let mut end = begin;
        let limit = block.headroom + BLOCK_BYTES;
        let mut end_of_source = false;
        while end < limit {
            match file.read(&mut block.buffer[end..limit]) {
                Ok(0) => {
                    end_of_source = true;
                    break;
                }
                Ok(read) => end += read,
                Err(error) if error.kind() == ErrorKind::Interrupted => continue,
                Err(error) => return Err(AnalyzeError::io("cannot read", &source.path, error)),
            }
        }
        block.filled = end - block.headroom;
        // An empty file has no chunks; skip its empty piece.
        if !(starts_source && end_of_source && end == piece_start) {
            block.pieces.push(Piece {
                start: piece_start,
                len: end - piece_start,
                starts_source,
                ends_source: end_of_source,
            });
        }
        starts_source = false;
        if end_of_source {
            return Ok(true);
        }
    }
}

/// Tells the kernel to read ahead aggressively; only a hint, so failure is ignored.
fn advise_sequential(file: &File) {
    // SAFETY: the descriptor is open for the duration of the call; the advice changes no memory.
    unsafe {
        libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_SEQUENTIAL);
    }
}
