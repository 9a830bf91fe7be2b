//! Containers: append-only files of chunks.
//!
//! New chunks are appended to an *open* container through a [`ContainerWriter`]; when it is
//! full it is *sealed* (a trailer listing every chunk is appended) and never changes again.
//! Each chunk is stored with a header (fingerprint, sizes, flags, CRC-32C), optionally
//! compressed with zstd, so a container can be verified on its own and a sealed container's
//! fingerprints load with one read of its trailer (locality for index caching). [`codec`]
//! turns raw bytes into stored bytes and back for every face. All-zero chunks are never
//! stored: callers check [`is_zero`] first and record a zero reference instead.
//!
//! Each face keeps its containers in its own directory of the repository (for example
//! `block/containers`), named `<directory>/<low byte of id, 2 hex digits>/<id, 16 hex digits>`
//! so no directory grows beyond a few thousand entries. See [`format`] for the byte layout.

pub mod codec;
pub mod format;
mod write_behind;
mod writer;

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

pub use codec::Encoded;
pub use format::{
    ChunkHeader, CHUNK_COMPRESSED, CHUNK_HEADER_BYTES, CHUNK_RECOMPRESSED, CHUNK_UNFINGERPRINTED,
};
pub use write_behind::{WriteBehind, QUEUED_BYTES_MAX};
pub use writer::{ContainerWriter, SealedContainer};

use crate::bytes::{u32_at, u64_at};
use crate::fingerprint::Fingerprint;
use crate::storage::{Storage, StorageFile};
use crate::{Error, Result};
use format::{Footer, FOOTER_BYTES, HEADER_BYTES, TRAILER_ENTRY_BYTES, TRAILER_TAIL_BYTES};

/// Names a container; allocated increasing by the owner of the container set.
pub type ContainerId = u64;

/// Largest container: chunk offsets are 32-bit.
pub const CONTAINER_BYTES_MAX: u64 = 1 << 30;
/// Smallest container worth having.
pub const CONTAINER_BYTES_MIN: u64 = 64 << 10;
/// Largest chunk a container accepts.
pub const CHUNK_BYTES_MAX: u32 = 16 << 20;
/// Open file handles kept for reading.
const OPEN_HANDLES_LIMIT: usize = 512;

/// Where a chunk's bytes are and how to check them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkLocation {
    pub container: ContainerId,
    /// Offset of the stored bytes (after the chunk header) in the container.
    pub offset: u32,
    pub stored_bytes: u32,
    pub raw_bytes: u32,
    /// [`CHUNK_COMPRESSED`], [`CHUNK_UNFINGERPRINTED`], [`CHUNK_RECOMPRESSED`].
    pub flags: u32,
    /// CRC-32C of the stored bytes.
    pub checksum: u32,
}

impl ChunkLocation {
    /// Byte offset of the chunk header in the container.
    pub fn header_offset(&self) -> u64 {
        self.offset as u64 - CHUNK_HEADER_BYTES as u64
    }

    /// Bytes the chunk occupies in its container, header included.
    pub fn footprint_bytes(&self) -> u64 {
        self.stored_bytes as u64 + CHUNK_HEADER_BYTES as u64
    }

    /// True when the stored bytes are a zstd frame of the raw bytes ([`Encoded::Compressed`]).
    pub fn is_compressed(&self) -> bool {
        self.flags & CHUNK_COMPRESSED != 0
    }

    /// The chunk header that describes this chunk, for copying its stored bytes to another
    /// container with [`ContainerWriter::append_stored`].
    pub fn header(&self, fingerprint: Fingerprint) -> ChunkHeader {
        ChunkHeader {
            fingerprint,
            stored_bytes: self.stored_bytes,
            raw_bytes: self.raw_bytes,
            flags: self.flags,
            checksum: self.checksum,
        }
    }
}

/// How containers are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerOptions {
    /// A container is sealed once appending would exceed this size (a single chunk larger than
    /// this still gets a container of its own).
    pub container_bytes: u64,
    /// zstd level for chunk compression; `None` stores chunks as they are. A chunk is stored
    /// compressed only when that saves at least an eighth of its size.
    pub compression_level: Option<i32>,
}

impl Default for ContainerOptions {
    fn default() -> Self {
        ContainerOptions {
            container_bytes: 4 << 20,
            compression_level: None,
        }
    }
}

impl ContainerOptions {
    /// Checks the documented ranges.
    pub fn validate(&self) -> Result<()> {
        if !(CONTAINER_BYTES_MIN..=CONTAINER_BYTES_MAX).contains(&self.container_bytes) {
            return Err(Error::InvalidArgument(format!(
                "container size {} must be between {} and {}",
                crate::units::format_size(self.container_bytes),
                crate::units::format_size(CONTAINER_BYTES_MIN),
                crate::units::format_size(CONTAINER_BYTES_MAX)
            )));
        }
        if let Some(level) = self.compression_level {
            if !(1..=19).contains(&level) {
                return Err(Error::InvalidArgument(format!(
                    "zstd level {level} must be between 1 and 19"
                )));
            }
        }
        Ok(())
    }
}

/// True when every byte of `data` is zero.
#[inline]
pub fn is_zero(data: &[u8]) -> bool {
    // Compare eight bytes at a time; the compiler vectorises this loop.
    let (head, words, tail) = unsafe { data.align_to::<u64>() };
    head.iter().all(|&b| b == 0) && words.iter().all(|&w| w == 0) && tail.iter().all(|&b| b == 0)
}

/// One chunk found in a container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredChunk {
    pub fingerprint: Fingerprint,
    pub location: ChunkLocation,
}

/// The chunks of a sealed container, from its trailer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerContents {
    /// Owner-defined time stamp given at sealing (backups: the backup's creation time; 0 means
    /// none).
    pub timestamp: u64,
    pub chunks: Vec<StoredChunk>,
}

/// What a front-to-back scan of a container found.
#[derive(Clone, Debug)]
pub struct ScanReport {
    /// Valid chunk records, in order.
    pub chunks: Vec<StoredChunk>,
    /// True when a valid trailer and footer follow the records.
    pub sealed: bool,
    /// Offset where the valid records end (the append position of an unsealed container).
    pub records_end: u64,
    /// Bytes after the valid records that are neither records nor a valid trailer.
    pub garbage_bytes: u64,
}

/// The set of containers in a storage.
#[derive(Debug)]
pub struct ContainerStore {
    storage: Arc<dyn Storage>,
    directory: String,
    options: ContainerOptions,
    handles: Mutex<HashMap<ContainerId, Arc<dyn StorageFile>>>,
    /// Shard directories with removals not yet synced.
    removed_shards: Mutex<std::collections::BTreeSet<String>>,
    /// The last dropped writer's buffer, for the next writer.
    spare_buffer: writer::SpareBuffer,
    /// Set by [`ContainerStore::with_write_behind`]: writers queue full buffers, and
    /// creating and sealing a container defer their syncs to [`ContainerStore::sync_deferred`].
    write_behind: Option<Arc<WriteBehind>>,
}

impl ContainerStore {
    /// Containers under `directory` of `storage`.
    pub fn new(
        storage: Arc<dyn Storage>,
        directory: &str,
        options: ContainerOptions,
    ) -> Result<Self> {
        options.validate()?;
        crate::storage::check_name(directory)?;
        Ok(ContainerStore {
            storage,
            directory: directory.to_string(),
            options,
            handles: Mutex::new(HashMap::new()),
            removed_shards: Mutex::new(Default::default()),
            spare_buffer: Default::default(),
            write_behind: None,
        })
    }

    /// Like [`ContainerStore::new`], with write-behind ([`WriteBehind`]): the owner runs
    /// [`ContainerStore::write_behind`] after each batch of appends, outside its lock, and a
    /// container's bytes, its name and its seal are durable only after
    /// [`ContainerStore::sync_deferred`] (which [`ContainerWriter::sync`] does not do).
    pub fn with_write_behind(
        storage: Arc<dyn Storage>,
        directory: &str,
        options: ContainerOptions,
    ) -> Result<Self> {
        let mut store = ContainerStore::new(storage, directory, options)?;
        store.write_behind = Some(Arc::default());
        Ok(store)
    }

    /// The write-behind queue, if this store has one.
    pub fn write_behind(&self) -> Option<&Arc<WriteBehind>> {
        self.write_behind.as_ref()
    }

    /// Makes durable what write-behind deferred: queued bytes, new container names, sealed
    /// containers. Without write-behind there is nothing to do.
    pub fn sync_deferred(&self) -> Result<()> {
        match &self.write_behind {
            Some(write_behind) => write_behind.sync(self.storage.as_ref()),
            None => Ok(()),
        }
    }

    /// Copies the chunk at `location` into `out` (exactly its raw size) if its bytes are
    /// still queued for writing; false otherwise.
    pub fn read_queued(&self, location: &ChunkLocation, out: &mut [u8]) -> Result<bool> {
        let Some(write_behind) = &self.write_behind else {
            return Ok(false);
        };
        write_behind
            .read_queued(location, |stored| codec::expand(location, stored, out))
            .transpose()
            .map(|copied| copied.is_some())
    }

    /// The options new containers are written with.
    pub fn options(&self) -> ContainerOptions {
        self.options
    }

    /// The storage name of container `id`.
    pub fn name(&self, id: ContainerId) -> String {
        format!("{}/{:02x}/{id:016x}", self.directory, id & 0xff)
    }

    fn shard(&self, id: ContainerId) -> String {
        format!("{}/{:02x}", self.directory, id & 0xff)
    }

    /// Creates container `id` and returns its writer. The container's name is durable when
    /// this returns, so syncing the writer is enough to make appended chunks durable; with
    /// write-behind, only after [`ContainerStore::sync_deferred`].
    pub fn create(&self, id: ContainerId, created_unix_seconds: u64) -> Result<ContainerWriter> {
        let name = self.name(id);
        if self.storage.exists(&name)? {
            return Err(Error::AlreadyExists(format!("container {name}")));
        }
        let file = self.storage.open(&name, true)?;
        match &self.write_behind {
            Some(write_behind) => write_behind.created_in(self.shard(id)),
            None => self.storage.sync_directory(&self.shard(id))?,
        }
        ContainerWriter::new(
            id,
            file,
            self.options,
            created_unix_seconds,
            self.spare_buffer.clone(),
            self.write_behind.clone(),
        )
    }

    /// An open handle to container `id` (cached). Reads through it stay valid even if the
    /// container is removed later.
    pub fn file(&self, id: ContainerId) -> Result<Arc<dyn StorageFile>> {
        if let Some(handle) = self.handles.lock().get(&id) {
            return Ok(Arc::clone(handle));
        }
        let handle = self.storage.open(&self.name(id), false)?;
        let mut handles = self.handles.lock();
        if handles.len() >= OPEN_HANDLES_LIMIT {
            handles.clear();
        }
        handles.insert(id, Arc::clone(&handle));
        Ok(handle)
    }

    /// Reads the stored bytes of a chunk into `out` (resized) and checks their CRC.
    pub fn read_stored(&self, location: &ChunkLocation, out: &mut Vec<u8>) -> Result<()> {
        out.resize(location.stored_bytes as usize, 0);
        let queued = self.write_behind.as_ref().and_then(|write_behind| {
            write_behind.read_queued(location, |stored| out.copy_from_slice(stored))
        });
        if queued.is_none() {
            self.file(location.container)?
                .read_at(location.offset as u64, out)?;
        }
        codec::verify(location, out)
    }

    /// Reads a chunk's raw bytes into `out`, which must be exactly `raw_bytes` long: reads,
    /// checks the CRC and decompresses when needed.
    pub fn read_chunk(&self, location: &ChunkLocation, out: &mut [u8]) -> Result<()> {
        if self.read_queued(location, out)? {
            return Ok(());
        }
        read_chunk_from(self.file(location.container)?.as_ref(), location, out)
    }

    /// Loads the chunk list of a sealed container with one read of its tail (two when the
    /// trailer is larger than the first guess).
    pub fn read_contents(&self, id: ContainerId) -> Result<ContainerContents> {
        let handle = self.file(id)?;
        let length = handle.len()?;
        let what = || format!("container {}", self.name(id));
        if length < (HEADER_BYTES + FOOTER_BYTES + TRAILER_TAIL_BYTES) as u64 {
            return Err(Error::corrupt(what(), "too short to be sealed"));
        }
        // Guess: trailers of containers up to a few MiB of 4 KiB chunks fit in 64 KiB.
        let guess = length.min(64 << 10);
        let mut tail = vec![0u8; guess as usize];
        handle.read_at(length - guess, &mut tail)?;
        let footer = Footer::decode(&tail[tail.len() - FOOTER_BYTES..])
            .ok_or_else(|| Error::corrupt(what(), "no footer: the container is not sealed"))?;
        let trailer_end = footer.trailer_offset + footer.trailer_bytes as u64;
        if trailer_end + FOOTER_BYTES as u64 != length {
            return Err(Error::corrupt(
                what(),
                "footer points outside the container",
            ));
        }
        let trailer = if footer.trailer_offset >= length - guess {
            let start = (footer.trailer_offset - (length - guess)) as usize;
            tail[start..start + footer.trailer_bytes as usize].to_vec()
        } else {
            let mut trailer = vec![0u8; footer.trailer_bytes as usize];
            handle.read_at(footer.trailer_offset, &mut trailer)?;
            trailer
        };
        decode_trailer(id, &footer, &trailer).ok_or_else(|| Error::corrupt(what(), "bad trailer"))
    }

    /// Checks that sealed container `id` ends in a readable trailer at `bytes`, the size its
    /// seal recorded: a corruption error otherwise (NotFound when the file is missing).
    pub fn verify_sealed(&self, id: ContainerId, bytes: u64) -> Result<()> {
        self.read_contents(id)?;
        let length = self.container_bytes(id)?;
        if length != bytes {
            return Err(Error::corrupt(
                format!("container {}", self.name(id)),
                format!("{length} bytes where its seal recorded {bytes}"),
            ));
        }
        Ok(())
    }

    /// Reads container `id` from the front, record by record, stopping at the first record
    /// that fails its checks. Used to recover the open container after a crash and by
    /// `onecopy check`; it reads the whole container.
    pub fn scan(&self, id: ContainerId) -> Result<ScanReport> {
        let handle = self.file(id)?;
        let length = handle.len()?;
        let mut data = vec![0u8; length as usize];
        handle.read_at(0, &mut data)?;
        let header: &[u8; HEADER_BYTES] = data
            .get(..HEADER_BYTES)
            .and_then(|bytes| bytes.try_into().ok())
            .ok_or_else(|| Error::corrupt(format!("container {}", self.name(id)), "no header"))?;
        match format::decode_header(header) {
            Some((stored_id, _)) if stored_id == id => {}
            _ => {
                return Err(Error::corrupt(
                    format!("container {}", self.name(id)),
                    "bad header",
                ))
            }
        }
        let mut chunks = Vec::new();
        let mut position = HEADER_BYTES;
        while position + CHUNK_HEADER_BYTES <= data.len() {
            let Some(header) = ChunkHeader::decode(
                &data[position..position + CHUNK_HEADER_BYTES],
                CHUNK_BYTES_MAX,
            ) else {
                break;
            };
            let start = position + CHUNK_HEADER_BYTES;
            let end = start + header.stored_bytes as usize;
            if end > data.len() || codec::checksum(&data[start..end]) != header.checksum {
                break;
            }
            chunks.push(StoredChunk {
                fingerprint: header.fingerprint,
                location: ChunkLocation {
                    container: id,
                    offset: start as u32,
                    stored_bytes: header.stored_bytes,
                    raw_bytes: header.raw_bytes,
                    flags: header.flags,
                    checksum: header.checksum,
                },
            });
            position = end;
        }
        let sealed = length >= FOOTER_BYTES as u64
            && Footer::decode(&data[data.len() - FOOTER_BYTES..]).is_some_and(|footer| {
                footer.trailer_offset == position as u64
                    && footer.trailer_offset + footer.trailer_bytes as u64 + FOOTER_BYTES as u64
                        == length
                    && decode_trailer(
                        id,
                        &footer,
                        &data[position..position + footer.trailer_bytes as usize],
                    )
                    .is_some_and(|contents| contents.chunks == chunks)
            });
        let garbage_bytes = if sealed { 0 } else { length - position as u64 };
        Ok(ScanReport {
            chunks,
            sealed,
            records_end: position as u64,
            garbage_bytes,
        })
    }

    /// Asks the media to read container `id` ahead (restores prefetch the next containers).
    pub fn advise_will_need(&self, id: ContainerId) -> Result<()> {
        let handle = self.file(id)?;
        let length = handle.len()?;
        handle.advise_will_need(0, length)
    }

    /// Removes container `id`. The removal is durable after [`sync_removals`](Self::sync_removals).
    pub fn remove(&self, id: ContainerId) -> Result<()> {
        self.handles.lock().remove(&id);
        self.storage.remove(&self.name(id))?;
        self.removed_shards.lock().insert(self.shard(id));
        Ok(())
    }

    /// Makes earlier removals durable: syncs every shard directory a container was removed
    /// from since the last call, including shards that became empty.
    pub fn sync_removals(&self) -> Result<()> {
        let shards = std::mem::take(&mut *self.removed_shards.lock());
        for directory in &shards {
            if let Err(error) = self.storage.sync_directory(directory) {
                // Keep the shards pending so a retry syncs them.
                self.removed_shards.lock().extend(shards.iter().cloned());
                return Err(error);
            }
        }
        Ok(())
    }

    /// Every container id present, ascending.
    pub fn list(&self) -> Result<Vec<ContainerId>> {
        let mut ids = Vec::new();
        for shard in 0..=0xffu64 {
            for name in self.storage.list(&self.shard(shard))? {
                let base = name.rsplit('/').next().unwrap_or_default();
                if let Ok(id) = u64::from_str_radix(base, 16) {
                    if base.len() == 16 && self.name(id) == name {
                        ids.push(id);
                    }
                }
            }
        }
        ids.sort_unstable();
        Ok(ids)
    }

    /// The chunk whose record header starts at `header_offset` of container `id`, as the
    /// header describes it; `None` when no intact header is there.
    pub fn chunk_at(&self, id: ContainerId, header_offset: u64) -> Result<Option<StoredChunk>> {
        let handle = self.file(id)?;
        if header_offset + CHUNK_HEADER_BYTES as u64 > handle.len()? {
            return Ok(None);
        }
        let mut bytes = [0u8; CHUNK_HEADER_BYTES];
        handle.read_at(header_offset, &mut bytes)?;
        Ok(
            ChunkHeader::decode(&bytes, CHUNK_BYTES_MAX).map(|header| StoredChunk {
                fingerprint: header.fingerprint,
                location: ChunkLocation {
                    container: id,
                    offset: (header_offset + CHUNK_HEADER_BYTES as u64) as u32,
                    stored_bytes: header.stored_bytes,
                    raw_bytes: header.raw_bytes,
                    flags: header.flags,
                    checksum: header.checksum,
                },
            }),
        )
    }

    /// When container `id` was created, from its header; `None` when the header is damaged.
    pub fn created_at(&self, id: ContainerId) -> Result<Option<u64>> {
        let handle = self.file(id)?;
        if handle.len()? < HEADER_BYTES as u64 {
            return Ok(None);
        }
        let mut header = [0u8; HEADER_BYTES];
        handle.read_at(0, &mut header)?;
        Ok(format::decode_header(&header)
            .filter(|(stored_id, _)| *stored_id == id)
            .map(|(_, created)| created))
    }

    /// Bytes of container `id` on the media.
    pub fn container_bytes(&self, id: ContainerId) -> Result<u64> {
        self.file(id)?.len()
    }
}

/// Reads a chunk's raw bytes from an open container file into `out` (exactly `raw_bytes`):
/// reads, checks the CRC and decompresses when needed.
pub fn read_chunk_from(
    file: &dyn StorageFile,
    location: &ChunkLocation,
    out: &mut [u8],
) -> Result<()> {
    assert_eq!(
        out.len(),
        location.raw_bytes as usize,
        "buffer fits the chunk"
    );
    if !location.is_compressed() {
        file.read_at(location.offset as u64, out)?;
        return codec::verify(location, out);
    }
    let mut stored = vec![0u8; location.stored_bytes as usize];
    file.read_at(location.offset as u64, &mut stored)?;
    codec::decode(location, &stored, out)
}

fn decode_trailer(id: ContainerId, footer: &Footer, trailer: &[u8]) -> Option<ContainerContents> {
    if crc32c::crc32c(trailer) != footer.trailer_checksum {
        return None;
    }
    let count = footer.chunk_count as usize;
    if trailer.len() != count * TRAILER_ENTRY_BYTES + TRAILER_TAIL_BYTES {
        return None;
    }
    let mut chunks = Vec::with_capacity(count);
    for entry in trailer[..count * TRAILER_ENTRY_BYTES].chunks_exact(TRAILER_ENTRY_BYTES) {
        let offset = u32_at(entry, 0);
        let header = ChunkHeader::decode(&entry[4..], CHUNK_BYTES_MAX)?;
        chunks.push(StoredChunk {
            fingerprint: header.fingerprint,
            location: ChunkLocation {
                container: id,
                offset,
                stored_bytes: header.stored_bytes,
                raw_bytes: header.raw_bytes,
                flags: header.flags,
                checksum: header.checksum,
            },
        });
    }
    let tail = &trailer[count * TRAILER_ENTRY_BYTES..];
    let timestamp = u64_at(tail, 0);
    let stored_count = u32_at(tail, 8);
    (stored_count == footer.chunk_count).then_some(ContainerContents { timestamp, chunks })
}

#[cfg(test)]
mod tests;
