//! Chunking streams through a bounded buffer ([`ChunkReader`]) and slices in memory
//! ([`SliceChunks`]).

use std::io::{self, Read};

use super::{Chunk, Chunker};

/// Default buffer of a [`ChunkReader`] (grown to twice the chunker's maximum chunk if that is
/// larger). Large reads amortise system calls; the buffer is the reader's only allocation.
pub const READ_BUFFER_BYTES_DEFAULT: usize = 4 << 20;

/// Chunks a byte stream of any length while holding at most one buffer of it in memory.
///
/// Chunks are slices into the internal buffer, valid until the next call, so this is a lending
/// iterator: `while let Some(chunk) = reader.next_chunk()? { ... }`. The chunks are exactly
/// those [`SliceChunks`] gives for the whole stream in memory, whatever sizes the underlying
/// reads return.
pub struct ChunkReader<R> {
    reader: R,
    chunker: Box<dyn Chunker>,
    buffer: Box<[u8]>,
    /// Unconsumed bytes are `buffer[start..end]`.
    start: usize,
    end: usize,
    /// Stream offset of `buffer[start]`.
    offset: u64,
    end_of_stream: bool,
}

impl<R: Read> ChunkReader<R> {
    /// A reader with the default buffer size (see [`READ_BUFFER_BYTES_DEFAULT`]).
    pub fn new(reader: R, chunker: Box<dyn Chunker>) -> Self {
        let buffer_bytes = READ_BUFFER_BYTES_DEFAULT.max(2 * chunker.chunk_bytes_max());
        Self::with_buffer_bytes(reader, chunker, buffer_bytes)
    }

    /// A reader with a buffer of `buffer_bytes`, which must hold at least one maximum-size
    /// chunk (twice that or more avoids many small refills).
    pub fn with_buffer_bytes(reader: R, chunker: Box<dyn Chunker>, buffer_bytes: usize) -> Self {
        assert!(
            buffer_bytes >= chunker.chunk_bytes_max(),
            "the buffer must hold a maximum-size chunk"
        );
        ChunkReader {
            reader,
            chunker,
            buffer: vec![0u8; buffer_bytes].into_boxed_slice(),
            start: 0,
            end: 0,
            offset: 0,
            end_of_stream: false,
        }
    }

    /// The next chunk, or `None` at the end of the stream. Read errors are returned as they
    /// come (interrupted reads are retried); after an error the reader should be dropped.
    pub fn next_chunk(&mut self) -> io::Result<Option<Chunk<'_>>> {
        if self.end - self.start < self.chunker.chunk_bytes_max() && !self.end_of_stream {
            self.fill()?;
        }
        if self.start == self.end {
            assert!(self.end_of_stream);
            return Ok(None);
        }
        let cut = self
            .chunker
            .next_cut(&self.buffer[self.start..self.end], self.end_of_stream);
        assert!(cut.len >= 1 && cut.len <= self.end - self.start);
        let chunk = Chunk {
            offset: self.offset,
            data: &self.buffer[self.start..self.start + cut.len],
            ends_segment: cut.ends_segment,
        };
        self.start += cut.len;
        self.offset += cut.len as u64;
        Ok(Some(chunk))
    }

    /// Moves the unconsumed bytes to the front and reads until the buffer is full or the
    /// stream ends.
    fn fill(&mut self) -> io::Result<()> {
        self.buffer.copy_within(self.start..self.end, 0);
        self.end -= self.start;
        self.start = 0;
        while self.end < self.buffer.len() {
            match self.reader.read(&mut self.buffer[self.end..]) {
                Ok(0) => {
                    self.end_of_stream = true;
                    break;
                }
                Ok(read) => self.end += read,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// Gives back the underlying reader.
    pub fn into_inner(self) -> R {
        self.reader
    }
}

/// Chunks a slice held in memory: an iterator of [`Chunk`]s borrowing from the slice.
pub struct SliceChunks<'a> {
    chunker: Box<dyn Chunker>,
    data: &'a [u8],
    position: usize,
}

impl<'a> SliceChunks<'a> {
    /// Chunks `data` from its first byte with `chunker` (a fresh one: see [`Chunker`]).
    pub fn new(chunker: Box<dyn Chunker>, data: &'a [u8]) -> Self {
        SliceChunks {
            chunker,
            data,
            position: 0,
        }
    }
}

impl<'a> Iterator for SliceChunks<'a> {
    type Item = Chunk<'a>;

    fn next(&mut self) -> Option<Chunk<'a>> {
        let rest = &self.data[self.position..];
        if rest.is_empty() {
            return None;
        }
        // The slice is the whole stream, so what is left is always its end.
        let cut = self.chunker.next_cut(rest, true);
        assert!(cut.len >= 1 && cut.len <= rest.len());
        let chunk = Chunk {
            offset: self.position as u64,
            data: &rest[..cut.len],
            ends_segment: cut.ends_segment,
        };
        self.position += cut.len;
        Some(chunk)
    }
}
