//! [`ContainerWriter`]: appends chunks to an open container.

use std::sync::Arc;

use super::format::{
    self, ChunkHeader, Footer, CHUNK_COMPRESSED, CHUNK_HEADER_BYTES, HEADER_BYTES,
    TRAILER_ENTRY_BYTES,
};
use super::write_behind::WriteBehind;
use super::{codec, ChunkLocation, ContainerId, ContainerOptions, Encoded, CHUNK_BYTES_MAX};
use crate::fingerprint::Fingerprint;
use crate::storage::StorageFile;
use crate::{Error, Result};
use parking_lot::Mutex;

/// Appended bytes kept in memory before they are written to the file.
const WRITE_BUFFER_BYTES: usize = 1 << 20;

/// What sealing a container produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SealedContainer {
    pub id: ContainerId,
    /// Size of the sealed file.
    pub bytes: u64,
    pub chunk_count: u32,
    pub timestamp: u64,
}

/// A write buffer kept between containers: a writer takes it when it is made and puts it
/// back when it is dropped. A fresh megabyte per container costs a mapping and 256 page
/// faults (allocations this large are mapped, see `memory::map_large_allocations`), at
/// every 4 MiB of data with the block device's containers.
pub(crate) type SpareBuffer = Arc<Mutex<Option<Vec<u8>>>>;

/// Appends chunks to one open container. Appended chunks are readable at once (from the write
/// buffer or the file) and durable after [`sync`](ContainerWriter::sync).
pub struct ContainerWriter {
    id: ContainerId,
    file: Arc<dyn StorageFile>,
    options: ContainerOptions,
    /// Bytes appended but not yet written to the file; they start at file offset `written`.
    buffer: Vec<u8>,
    /// Where `buffer` goes when the writer is dropped.
    spare: SpareBuffer,
    /// Where full buffers are queued instead of written, and seals recorded instead of
    /// synced (see [`WriteBehind`]).
    write_behind: Option<Arc<WriteBehind>>,
    written: u64,
    synced: u64,
    /// End of the bytes handed to [`ContainerWriter::start_writeback`].
    writeback_from: u64,
    entries: Vec<(u32, ChunkHeader)>,
    /// The zstd frame of the chunk being appended, kept to reuse its allocation.
    scratch: Vec<u8>,
}

impl std::fmt::Debug for ContainerWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContainerWriter")
            .field("id", &self.id)
            .field("bytes", &self.bytes())
            .field("chunks", &self.entries.len())
            .finish()
    }
}

impl Drop for ContainerWriter {
    fn drop(&mut self) {
        let mut buffer = std::mem::take(&mut self.buffer);
        // A buffer grown far past its size (a sealed container's trailer) is not kept.
        if buffer.capacity() <= 2 * (WRITE_BUFFER_BYTES + CHUNK_HEADER_BYTES) {
            buffer.clear();
            *self.spare.lock() = Some(buffer);
        }
    }
}

/// An empty write buffer with room for a full buffer's last chunk header.
fn new_buffer() -> Vec<u8> {
    Vec::with_capacity(WRITE_BUFFER_BYTES + CHUNK_HEADER_BYTES)
}

impl ContainerWriter {
    pub(crate) fn new(
        id: ContainerId,
        file: Arc<dyn StorageFile>,
        options: ContainerOptions,
        created_unix_seconds: u64,
        spare: SpareBuffer,
        write_behind: Option<Arc<WriteBehind>>,
    ) -> Result<Self> {
        let mut buffer = spare
            .lock()
            .take()
            .or_else(|| write_behind.as_ref()?.take_spare())
            .unwrap_or_else(new_buffer);
        assert!(buffer.is_empty(), "a spare buffer is handed back empty");
        buffer.extend_from_slice(&format::encode_header(id, created_unix_seconds));
        Ok(ContainerWriter {
            id,
            file,
            options,
            buffer,
            spare,
            write_behind,
            written: 0,
            synced: 0,
            writeback_from: 0,
            entries: Vec::new(),
            scratch: Vec::new(),
        })
    }

    /// The container being written.
    pub fn id(&self) -> ContainerId {
        self.id
    }

    /// Bytes appended so far, header included.
    pub fn bytes(&self) -> u64 {
        self.written + self.buffer.len() as u64
    }

    /// Chunks appended so far.
    pub fn chunk_count(&self) -> usize {
        self.entries.len()
    }

    /// True when a chunk of `raw_bytes` still fits under the container size. An empty
    /// container always has room, so oversized chunks get a container of their own.
    pub fn has_room(&self, raw_bytes: usize) -> bool {
        self.entries.is_empty()
            || self.bytes() + (CHUNK_HEADER_BYTES + raw_bytes) as u64
                <= self.options.container_bytes
    }

    /// Appends a chunk, compressing it when the container is configured to and it pays off.
    /// `flags` may carry [`CHUNK_UNFINGERPRINTED`](super::CHUNK_UNFINGERPRINTED).
    pub fn append(
        &mut self,
        fingerprint: &Fingerprint,
        data: &[u8],
        flags: u32,
    ) -> Result<ChunkLocation> {
        self.append_checked(fingerprint, data, flags, None)
    }

    /// Like [`append`](Self::append), with the CRC-32C of `data` when the caller has it: a
    /// block device computes it with the fingerprint, outside its lock. It is used when the
    /// chunk is stored as it is (uncompressed), and checked in debug builds.
    pub fn append_checked(
        &mut self,
        fingerprint: &Fingerprint,
        data: &[u8],
        flags: u32,
        checksum: Option<u32>,
    ) -> Result<ChunkLocation> {
        assert!(!data.is_empty(), "empty chunks are never stored");
        assert_eq!(flags & CHUNK_COMPRESSED, 0, "compression is decided here");
        self.check_chunk_size(data.len())?;
        let compressed = match self.options.compression_level {
            Some(level) => codec::compress_into(data, level, &mut self.scratch)?,
            None => false,
        };
        let (stored, flags) = if compressed {
            (std::mem::take(&mut self.scratch), flags | CHUNK_COMPRESSED)
        } else {
            (Vec::new(), flags)
        };
        let stored_bytes: &[u8] = if compressed { &stored } else { data };
        let header = ChunkHeader {
            fingerprint: *fingerprint,
            stored_bytes: stored_bytes.len() as u32,
            raw_bytes: data.len() as u32,
            flags,
            checksum: match checksum {
                Some(checksum) if !compressed => {
                    debug_assert_eq!(checksum, codec::checksum(data), "the caller's checksum");
                    checksum
                }
                _ => codec::checksum(stored_bytes),
            },
        };
        let location = self.append_record(header, stored_bytes)?;
        if compressed {
            self.scratch = stored;
        }
        Ok(location)
    }

    /// Appends a chunk whose stored form the caller decided with [`codec::encode`] (or reused
    /// from a chunk stored before): `raw` is the chunk, `encoded` says how it is stored.
    pub fn append_encoded(
        &mut self,
        fingerprint: &Fingerprint,
        raw: &[u8],
        encoded: &Encoded,
    ) -> Result<ChunkLocation> {
        let compressed = matches!(encoded, Encoded::Compressed(_));
        self.append_stored_form(fingerprint, raw.len(), encoded.stored(raw), compressed)
    }

    /// Appends a chunk of `raw_bytes` bytes whose stored bytes are `stored`: a zstd frame of
    /// them when `compressed` (as [`codec::compress_into`] makes), else the raw bytes.
    pub fn append_stored_form(
        &mut self,
        fingerprint: &Fingerprint,
        raw_bytes: usize,
        stored: &[u8],
        compressed: bool,
    ) -> Result<ChunkLocation> {
        assert!(raw_bytes > 0, "empty chunks are never stored");
        if !compressed {
            assert_eq!(stored.len(), raw_bytes, "a raw chunk is stored as it is");
        }
        self.check_chunk_size(raw_bytes)?;
        let header = ChunkHeader {
            fingerprint: *fingerprint,
            stored_bytes: stored.len() as u32,
            raw_bytes: raw_bytes as u32,
            flags: if compressed { CHUNK_COMPRESSED } else { 0 },
            checksum: codec::checksum(stored),
        };
        self.append_record(header, stored)
    }

    /// Appends a chunk already in stored form (compaction and repackaging copy chunks between
    /// containers without recompressing). The bytes are checked against the header's CRC.
    pub fn append_stored(&mut self, header: ChunkHeader, stored: &[u8]) -> Result<ChunkLocation> {
        assert_eq!(header.stored_bytes as usize, stored.len());
        if codec::checksum(stored) != header.checksum {
            return Err(Error::corrupt(
                format!("chunk {} being copied", header.fingerprint),
                "stored bytes do not match their checksum",
            ));
        }
        self.append_record(header, stored)
    }

    fn check_chunk_size(&self, raw_bytes: usize) -> Result<()> {
        if raw_bytes > CHUNK_BYTES_MAX as usize {
            return Err(Error::Limit(format!(
                "a chunk of {raw_bytes} bytes exceeds the {CHUNK_BYTES_MAX}-byte limit"
            )));
        }
        Ok(())
    }

    fn append_record(&mut self, header: ChunkHeader, stored: &[u8]) -> Result<ChunkLocation> {
        let header_offset = self.bytes();
        let data_offset = header_offset + CHUNK_HEADER_BYTES as u64;
        if data_offset + stored.len() as u64 > super::CONTAINER_BYTES_MAX {
            return Err(Error::Limit(format!(
                "container {} would exceed {} bytes",
                self.id,
                super::CONTAINER_BYTES_MAX
            )));
        }
        header.encode(&mut self.buffer);
        self.buffer.extend_from_slice(stored);
        self.entries.push((data_offset as u32, header));
        if self.buffer.len() >= WRITE_BUFFER_BYTES {
            self.write_out()?;
        }
        Ok(ChunkLocation {
            container: self.id,
            offset: data_offset as u32,
            stored_bytes: header.stored_bytes,
            raw_bytes: header.raw_bytes,
            flags: header.flags,
            checksum: header.checksum,
        })
    }

    /// Copies a chunk appended to this container into `out` (exactly raw size) if its bytes
    /// are still in the write buffer; returns false when they are in the file already.
    pub fn read_buffered(&self, location: &ChunkLocation, out: &mut [u8]) -> Result<bool> {
        assert_eq!(location.container, self.id);
        if (location.offset as u64) < self.written {
            return Ok(false);
        }
        let start = (location.offset as u64 - self.written) as usize;
        let stored = &self.buffer[start..start + location.stored_bytes as usize];
        codec::expand(location, stored, out)?;
        Ok(true)
    }

    /// Hands buffered bytes over to the file (not durable yet): queues them with
    /// write-behind, unless the queue is full, and writes them otherwise.
    pub fn write_out(&mut self) -> Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        if let Some(write_behind) = &self.write_behind {
            let next = write_behind.take_spare().unwrap_or_else(new_buffer);
            let full = std::mem::replace(&mut self.buffer, next);
            let length = full.len() as u64;
            match write_behind.submit(self.id, &self.file, self.written, full) {
                None => {
                    self.written += length;
                    return Ok(());
                }
                // The queue is full: write it now, as without write-behind.
                Some(full) => self.buffer = full,
            }
        }
        self.write_buffer()
    }

    /// Writes the buffer to the file now.
    fn write_buffer(&mut self) -> Result<()> {
        if !self.buffer.is_empty() {
            self.file.write_at(self.written, &self.buffer)?;
            self.written += self.buffer.len() as u64;
            self.buffer.clear();
        }
        Ok(())
    }

    /// Makes every appended chunk durable: writes the buffer, waits for this container's
    /// queued writes, syncs the file. With write-behind the container's name is durable
    /// only after [`ContainerStore::sync_deferred`](super::ContainerStore::sync_deferred).
    pub fn sync(&mut self) -> Result<()> {
        self.write_buffer()?;
        if let Some(write_behind) = &self.write_behind {
            write_behind.wait(Some(self.id))?;
        }
        if self.synced != self.written {
            self.file.sync_data()?;
            self.synced = self.written;
        }
        Ok(())
    }

    /// Asks the storage to start writing what was written out since the last call, without
    /// waiting: the sync at the seal then waits only for the rest. Best effort (a failure
    /// changes only speed); for writers that seal soon after, such as a backup's.
    pub fn start_writeback(&mut self) {
        if self.writeback_from < self.written {
            let _ = self
                .file
                .start_writeback(self.writeback_from, self.written - self.writeback_from);
            self.writeback_from = self.written;
        }
    }

    /// True when chunks were appended since the last sync.
    pub fn has_unsynced(&self) -> bool {
        !self.buffer.is_empty() || self.synced != self.written
    }

    /// Appends the trailer and footer, and syncs: the container is immutable from now on.
    /// With write-behind the trailer is queued and the sync deferred (see [`WriteBehind`]).
    pub fn seal(mut self, timestamp: u64) -> Result<SealedContainer> {
        let trailer_offset = self.bytes();
        let mut trailer = Vec::with_capacity(
            self.entries.len() * TRAILER_ENTRY_BYTES + super::format::TRAILER_TAIL_BYTES,
        );
        for (offset, header) in &self.entries {
            trailer.extend_from_slice(&offset.to_le_bytes());
            header.encode(&mut trailer);
        }
        trailer.extend_from_slice(&timestamp.to_le_bytes());
        trailer.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        trailer.extend_from_slice(&[0u8; 4]);
        let footer = Footer {
            trailer_offset,
            trailer_bytes: trailer.len() as u32,
            trailer_checksum: codec::checksum(&trailer),
            chunk_count: self.entries.len() as u32,
        };
        self.buffer.extend_from_slice(&trailer);
        self.buffer.extend_from_slice(&footer.encode());
        match self.write_behind.clone() {
            Some(write_behind) => {
                self.write_out()?;
                write_behind.sealed_unsynced(self.id, Arc::clone(&self.file));
            }
            None => self.sync()?,
        }
        debug_assert!(self.written >= HEADER_BYTES as u64);
        Ok(SealedContainer {
            id: self.id,
            bytes: self.written,
            chunk_count: self.entries.len() as u32,
            timestamp,
        })
    }
}
