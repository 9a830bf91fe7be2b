//! [`SealedStorage`]: every file of an inner [`Storage`] encrypted and authenticated, so that
//! whoever holds the media learns nothing from it but file names and sizes, and a changed
//! byte is an error naming the file and the block, never wrong data.
//!
//! Layout of a sealed file (integers little-endian):
//!
//! ```text
//! header (64 B)   magic "OCSEAL01" | layout u32 (1 single, 2 paired, 3 paged) |
//!                 block bytes u32 | file id [16] | nonce [12] | zeros [4] | tag [16]
//! block*          one slot (single layout) or two slots (paired layout) per 4 KiB of content;
//!                 paged layout: two slots for block 0, one for every other block
//! slot (4136 B)   generation u64 | used u32 | nonce [12] | ciphertext [4096] | tag [16]
//! ```
//!
//! - The header's tag authenticates its first 48 bytes under a key derived from the sealing
//!   key; each file's blocks are sealed with AES-256-GCM under a key derived from the sealing
//!   key and the file's random id, so nonces (random, 96 bits) are drawn per file, and a slot
//!   copied into another file or to another block index does not authenticate.
//! - A slot's associated data is the file id, the block index, the generation and `used`
//!   (how many bytes of the block belong to the file): the file's length is the length of its
//!   whole blocks plus the last block's `used`, so it is authenticated too.
//! - **Single layout** (containers, indexes): a block is rewritten in place. A crash during
//!   that write tears the slot, which then fails authentication. The engine writes such files
//!   append-only and references their bytes only after a sync, so a torn slot is always in a
//!   part no commit references.
//! - **Paired layout** (files rewritten in place whose every write must be atomic, such as
//!   the catalog): each block has two slots; a write seals the new content with the next
//!   generation into the slot that does not hold the newest one. A read takes the slot with
//!   the highest generation that authenticates, so a write torn by a crash reads as the
//!   block's previous content. Once a sync has made the new content durable, the older slot
//!   is erased (zeros, durable with the next sync), so damage to a synced block's newest slot
//!   is an error, not its previous content. `verify_file` reports every written slot that
//!   fails. Blocks at the end of a paired file whose slots all fail are an interrupted growth
//!   and are not part of the file.
//! - **Paged layout** (a database that writes whole pages copy-on-write and rewrites only its
//!   first page in place: the catalog): block 0 is paired, every other block single, so the
//!   file takes about its content's size instead of twice. The content is whole blocks (a
//!   length is rounded up to one), so the length is known from the file's size without
//!   reading its last block. A write torn by a crash fails authentication and reads as an
//!   error; the database never reads such a block, because it makes a commit's pages durable
//!   before its header names them (two-phase commit). `verify_file` reports them; the
//!   database's own check tells whether a committed page uses them.
//! - What sealing does not hide or detect: names and approximate sizes of files; a whole file
//!   replaced by an older sealed version of itself (a rollback), which the layers above
//!   detect only where they keep serials.
//!
//! Writes to one file take a lock shared by every handle of that name in this storage, since a
//! partial block write reads, changes and reseals the whole block.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Weak};

use parking_lot::{Mutex, RwLock};
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use zeroize::Zeroizing;

use super::{Storage, StorageFile};
use crate::bytes::{u32_at, u64_at};
use crate::{Error, Result};

/// Bytes of content in one block.
pub const BLOCK_BYTES: usize = 4096;
/// Bytes of the file header.
pub const HEADER_BYTES: usize = 64;
const HEADER_AUTHENTICATED_BYTES: usize = 48;
const MAGIC: &[u8; 8] = b"OCSEAL01";
const FILE_ID_BYTES: usize = 16;
const TAG_BYTES: usize = 16;
/// generation u64 | used u32 | nonce.
const SLOT_PREFIX_BYTES: usize = 8 + 4 + NONCE_LEN;
/// Bytes of one slot on the media.
pub const SLOT_BYTES: usize = SLOT_PREFIX_BYTES + BLOCK_BYTES + TAG_BYTES;
/// Physical writes are coalesced up to this size.
const WRITE_BATCH_BYTES: usize = 1 << 20;

const _: () =
    assert!(HEADER_BYTES == MAGIC.len() + 4 + 4 + FILE_ID_BYTES + NONCE_LEN + 4 + TAG_BYTES);
const _: () = assert!(HEADER_AUTHENTICATED_BYTES + TAG_BYTES == HEADER_BYTES);
const _: () = assert!(BLOCK_BYTES <= u32::MAX as usize);

/// How a file's blocks are kept (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// One slot per block, rewritten in place.
    Single,
    /// Two slots per block, written alternately.
    Paired,
    /// Block 0 paired, every other block single; the content is whole blocks.
    Paged,
}

impl Layout {
    fn code(self) -> u32 {
        match self {
            Layout::Single => 1,
            Layout::Paired => 2,
            Layout::Paged => 3,
        }
    }

    fn from_code(code: u32) -> Option<Layout> {
        match code {
            1 => Some(Layout::Single),
            2 => Some(Layout::Paired),
            3 => Some(Layout::Paged),
            _ => None,
        }
    }

    /// True when block `index` has two slots.
    fn is_paired(self, index: u64) -> bool {
        match self {
            Layout::Single => false,
            Layout::Paired => true,
            Layout::Paged => index == 0,
        }
    }

    /// Slots of block `index`.
    fn copies(self, index: u64) -> usize {
        if self.is_paired(index) {
            2
        } else {
            1
        }
    }

    /// Physical offset of block `index` from the end of the file header.
    fn block_start(self, index: u64) -> u64 {
        let slot = SLOT_BYTES as u64;
        match self {
            Layout::Single => index * slot,
            Layout::Paired => index * 2 * slot,
            Layout::Paged if index == 0 => 0,
            Layout::Paged => (index + 1) * slot,
        }
    }

    /// Blocks whose slots all fit in `bytes` after the file header.
    fn blocks_in(self, bytes: u64) -> u64 {
        let slot = SLOT_BYTES as u64;
        match self {
            Layout::Single => bytes / slot,
            Layout::Paired => bytes / (2 * slot),
            Layout::Paged => (bytes / slot).saturating_sub(1),
        }
    }

    /// Physical bytes of the largest block.
    fn stride_max(self) -> usize {
        match self {
            Layout::Single => SLOT_BYTES,
            Layout::Paired | Layout::Paged => 2 * SLOT_BYTES,
        }
    }
}

/// The secret that seals a storage; derived from a repository's master key.
pub struct SealingKey {
    root: Zeroizing<[u8; 32]>,
    header: LessSafeKey,
}

impl fmt::Debug for SealingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SealingKey(..)")
    }
}

impl SealingKey {
    /// The key for 32 secret bytes.
    pub fn from_bytes(bytes: &[u8; 32]) -> SealingKey {
        let root = Zeroizing::new(*bytes);
        let header =
            Zeroizing::new(*blake3::keyed_hash(&root, b"onecopy sealed file header").as_bytes());
        SealingKey {
            header: aead_key(&header),
            root,
        }
    }

    /// The key of keyed fingerprints ([`Storage::fingerprint_key`]).
    fn fingerprint_key(&self) -> Zeroizing<[u8; 32]> {
        Zeroizing::new(*blake3::keyed_hash(&self.root, b"onecopy keyed fingerprints").as_bytes())
    }

    fn file_key(&self, file_id: &[u8; FILE_ID_BYTES]) -> LessSafeKey {
        let mut input = [0u8; 4 + FILE_ID_BYTES];
        input[..4].copy_from_slice(b"file");
        input[4..].copy_from_slice(file_id);
        let key = Zeroizing::new(*blake3::keyed_hash(&self.root, &input).as_bytes());
        aead_key(&key)
    }
}

fn aead_key(bytes: &[u8; 32]) -> LessSafeKey {
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, bytes).expect("a 32-byte AES-256 key"))
}

/// Chooses the layout of a new file from its name.
pub type LayoutPolicy = fn(&str) -> Layout;

/// A storage whose files are sealed (see the module documentation).
pub struct SealedStorage {
    inner: Arc<dyn Storage>,
    key: Arc<SealingKey>,
    policy: LayoutPolicy,
    /// The state of every file some handle has open, shared by its handles.
    open_files: Mutex<HashMap<String, Weak<FileState>>>,
}

impl fmt::Debug for SealedStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SealedStorage")
            .field("inner", &self.inner.describe())
            .finish()
    }
}

impl SealedStorage {
    /// Seals the files of `inner` with `key`; new files get the layout `policy` names.
    pub fn new(inner: Arc<dyn Storage>, key: SealingKey, policy: LayoutPolicy) -> SealedStorage {
        SealedStorage {
            inner,
            key: Arc::new(key),
            policy,
            open_files: Mutex::new(HashMap::new()),
        }
    }

    /// Authenticates every slot of `name`: the blocks whose content cannot be read, and (in
    /// the paired layout) the blocks that read but one of whose slots fails, which is damage or
    /// a write a crash interrupted.
    pub fn verify_file(&self, name: &str) -> Result<SealedFileReport> {
        let file = self.open_sealed(name, false)?;
        file.verify()
    }

    fn open_sealed(&self, name: &str, create: bool) -> Result<SealedFile> {
        let inner = self.inner.open(name, create)?;
        let state = {
            let mut open_files = self.open_files.lock();
            open_files.retain(|_, state| state.strong_count() > 0);
            match open_files.get(name).and_then(Weak::upgrade) {
                Some(state) => state,
                None => {
                    let state = Arc::new(FileState {
                        keys: RwLock::new(None),
                        rewritten: Mutex::new(HashMap::new()),
                        length: Mutex::new(None),
                        paired_written: Mutex::new(HashMap::new()),
                    });
                    open_files.insert(name.to_string(), Arc::downgrade(&state));
                    state
                }
            }
        };
        let file = SealedFile {
            inner,
            what: format!("sealed file {name} in {}", self.inner.describe()),
            key: Arc::clone(&self.key),
            new_layout: (self.policy)(name),
            state,
        };
        {
            let mut keys = file.state.keys.write();
            if keys.is_none() {
                *keys = file.read_header()?;
            }
        }
        Ok(file)
    }
}

impl Storage for SealedStorage {
    fn open(&self, name: &str, create: bool) -> Result<Arc<dyn StorageFile>> {
        Ok(Arc::new(self.open_sealed(name, create)?))
    }

    fn exists(&self, name: &str) -> Result<bool> {
        self.inner.exists(name)
    }

    fn remove(&self, name: &str) -> Result<()> {
        self.inner.remove(name)?;
        // Handles still open keep the removed file's state; a file made later under this
        // name is another file, with its own header.
        self.open_files.lock().remove(name);
        Ok(())
    }

    fn rename(&self, from: &str, to: &str) -> Result<()> {
        self.inner.rename(from, to)?;
        let mut open_files = self.open_files.lock();
        open_files.remove(from);
        open_files.remove(to);
        Ok(())
    }

    fn list(&self, directory: &str) -> Result<Vec<String>> {
        self.inner.list(directory)
    }

    fn sync_directory(&self, directory: &str) -> Result<()> {
        self.inner.sync_directory(directory)
    }

    fn describe(&self) -> String {
        format!("{} (encrypted)", self.inner.describe())
    }

    fn available_bytes(&self) -> Result<Option<u64>> {
        // Content takes a little more room sealed: report what content still fits.
        Ok(self
            .inner
            .available_bytes()?
            .map(|bytes| bytes / SLOT_BYTES as u64 * BLOCK_BYTES as u64))
    }

    fn authenticates_reads(&self) -> bool {
        true
    }

    fn fingerprint_key(&self) -> Option<Zeroizing<[u8; 32]>> {
        Some(self.key.fingerprint_key())
    }
}

/// What [`SealedStorage::verify_file`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SealedFileReport {
    /// Blocks of the file.
    pub blocks: u64,
    /// Blocks none of whose slots authenticate.
    pub unreadable_blocks: Vec<u64>,
    /// Paired-layout blocks that read, but one of whose written slots fails.
    pub damaged_copies: Vec<u64>,
}

/// Shared by every handle of one file.
struct FileState {
    /// `None` while the file has no header (it is empty).
    keys: RwLock<Option<FileKeys>>,
    /// Paired layout: the blocks rewritten since the last sync, with the slot that holds their
    /// newest content. Once a sync makes that content durable, the other slot is erased, so
    /// that damage to the newest slot cannot read as the block's previous content.
    rewritten: Mutex<HashMap<u64, usize>>,
    /// The content length (single and paired layouts), once read: it is the last block's
    /// `used`, which costs a read of that block, and every read and write needs it. Writes
    /// through this state keep it; the face's lock keeps other processes from writing the
    /// file meanwhile. `None` until read, and after a failed write.
    length: Mutex<Option<u64>>,
    /// Paired blocks this state wrote, as written: a rewrite of one needs its generation, its
    /// slot and (unless it covers the whole block) its content, which would otherwise cost a
    /// read of both slots (the catalog's header block, rewritten by every commit). Kept like
    /// `length`; emptied after a failed write and by cuts.
    paired_written: Mutex<HashMap<u64, WrittenBlock>>,
}

/// A paired block as last written through a [`FileState`].
struct WrittenBlock {
    generation: u64,
    copy: usize,
    used: usize,
    content: Box<[u8]>,
}

struct FileKeys {
    layout: Layout,
    id: [u8; FILE_ID_BYTES],
    key: LessSafeKey,
}

struct SealedFile {
    inner: Arc<dyn StorageFile>,
    what: String,
    key: Arc<SealingKey>,
    new_layout: Layout,
    state: Arc<FileState>,
}

impl fmt::Debug for SealedFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.what)
    }
}

/// A block read from the media: its newest content that authenticates.
struct OpenedBlock {
    generation: u64,
    used: usize,
    /// The slot that holds it (0 or 1).
    copy: usize,
}

fn slot_aad(file_id: &[u8; FILE_ID_BYTES], index: u64, generation: u64, used: u32) -> [u8; 36] {
    let mut aad = [0u8; 36];
    aad[..16].copy_from_slice(file_id);
    aad[16..24].copy_from_slice(&index.to_le_bytes());
    aad[24..32].copy_from_slice(&generation.to_le_bytes());
    aad[32..36].copy_from_slice(&used.to_le_bytes());
    aad
}

fn random_bytes(out: &mut [u8]) -> Result<()> {
    SystemRandom::new().fill(out).map_err(|_| {
        Error::io(
            "drawing random bytes for a nonce",
            std::io::Error::other("the system random number generator failed"),
        )
    })
}

/// Coalesces writes at consecutive physical offsets into one write of the inner file.
struct Coalescer<'a> {
    file: &'a dyn StorageFile,
    offset: u64,
    buffer: Vec<u8>,
}

impl Coalescer<'_> {
    fn push(&mut self, offset: u64, bytes: &[u8]) -> Result<()> {
        if self.buffer.is_empty() || offset != self.offset + self.buffer.len() as u64 {
            self.flush()?;
            self.offset = offset;
        }
        self.buffer.extend_from_slice(bytes);
        if self.buffer.len() >= WRITE_BATCH_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if !self.buffer.is_empty() {
            self.file.write_at(self.offset, &self.buffer)?;
            self.offset += self.buffer.len() as u64;
            self.buffer.clear();
        }
        Ok(())
    }
}

impl SealedFile {
    fn corrupt(&self, detail: impl Into<String>) -> Error {
        Error::corrupt(self.what.clone(), detail)
    }

    fn read_header(&self) -> Result<Option<FileKeys>> {
        let physical = self.inner.len()?;
        if physical == 0 {
            return Ok(None);
        }
        if physical < HEADER_BYTES as u64 {
            return Err(self.corrupt(format!(
                "{physical} bytes, shorter than the {HEADER_BYTES}-byte header of a sealed file"
            )));
        }
        let mut header = [0u8; HEADER_BYTES];
        self.inner.read_at(0, &mut header)?;
        if &header[..8] != MAGIC {
            return Err(self.corrupt(
                "no sealed-file header: the file was written without encryption, or damaged",
            ));
        }
        let nonce_at = 16 + FILE_ID_BYTES;
        let nonce: [u8; NONCE_LEN] = header[nonce_at..nonce_at + NONCE_LEN]
            .try_into()
            .expect("nonce bytes");
        let mut tag = header[HEADER_BYTES - TAG_BYTES..].to_vec();
        let authentic = self
            .key
            .header
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&header[..HEADER_AUTHENTICATED_BYTES]),
                &mut tag,
            )
            .is_ok();
        if !authentic {
            return Err(self.corrupt(
                "its header fails authentication: the file was changed or damaged, or it \
                 belongs to another repository",
            ));
        }
        let layout = Layout::from_code(u32_at(&header, 8))
            .ok_or_else(|| self.corrupt("its header names an unknown layout"))?;
        if u32_at(&header, 12) as usize != BLOCK_BYTES {
            return Err(self.corrupt("its header names another block size"));
        }
        let id: [u8; FILE_ID_BYTES] = header[16..16 + FILE_ID_BYTES]
            .try_into()
            .expect("file id bytes");
        Ok(Some(FileKeys {
            layout,
            id,
            key: self.key.file_key(&id),
        }))
    }

    /// Writes the header of an empty file.
    fn create_header(&self) -> Result<FileKeys> {
        let mut header = [0u8; HEADER_BYTES];
        header[..8].copy_from_slice(MAGIC);
        header[8..12].copy_from_slice(&self.new_layout.code().to_le_bytes());
        header[12..16].copy_from_slice(&(BLOCK_BYTES as u32).to_le_bytes());
        let mut id = [0u8; FILE_ID_BYTES];
        random_bytes(&mut id)?;
        header[16..16 + FILE_ID_BYTES].copy_from_slice(&id);
        let nonce_at = 16 + FILE_ID_BYTES;
        random_bytes(&mut header[nonce_at..nonce_at + NONCE_LEN])?;
        let nonce: [u8; NONCE_LEN] = header[nonce_at..nonce_at + NONCE_LEN]
            .try_into()
            .expect("nonce bytes");
        let tag = self
            .key
            .header
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&header[..HEADER_AUTHENTICATED_BYTES]),
                &mut [],
            )
            .expect("sealing an empty message");
        header[HEADER_BYTES - TAG_BYTES..].copy_from_slice(tag.as_ref());
        self.inner.write_at(0, &header)?;
        Ok(FileKeys {
            layout: self.new_layout,
            id,
            key: self.key.file_key(&id),
        })
    }

    fn block_offset(keys: &FileKeys, index: u64) -> u64 {
        HEADER_BYTES as u64 + keys.layout.block_start(index)
    }

    /// Blocks whose slots are all on the media.
    fn blocks_present(&self, keys: &FileKeys) -> Result<u64> {
        let physical = self.inner.len()?;
        Ok(keys
            .layout
            .blocks_in(physical.saturating_sub(HEADER_BYTES as u64)))
    }

    /// Opens the block whose slots are `raw` (all its slots) in place, leaving its content in
    /// the returned copy's ciphertext bytes; `None` when no slot authenticates.
    fn open_block(keys: &FileKeys, index: u64, raw: &mut [u8]) -> Option<OpenedBlock> {
        let mut order: Vec<(u64, usize)> = (0..keys.layout.copies(index))
            .map(|copy| (u64_at(raw, copy * SLOT_BYTES), copy))
            .collect();
        // The claimed generation is authenticated: try the newest claim first.
        order.sort_unstable_by(|a, b| b.cmp(a));
        order
            .into_iter()
            .find_map(|(_, copy)| Self::open_slot(keys, index, raw, copy))
    }

    /// Opens slot `copy` of the block whose slots are `raw`, in place.
    fn open_slot(keys: &FileKeys, index: u64, raw: &mut [u8], copy: usize) -> Option<OpenedBlock> {
        let slot = &mut raw[copy * SLOT_BYTES..(copy + 1) * SLOT_BYTES];
        let generation = u64_at(slot, 0);
        let used = u32_at(slot, 8);
        if used as usize > BLOCK_BYTES {
            return None;
        }
        let nonce: [u8; NONCE_LEN] = slot[12..SLOT_PREFIX_BYTES].try_into().expect("nonce");
        let aad = slot_aad(&keys.id, index, generation, used);
        keys.key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut slot[SLOT_PREFIX_BYTES..],
            )
            .ok()?;
        Some(OpenedBlock {
            generation,
            used: used as usize,
            copy,
        })
    }

    fn content<'a>(raw: &'a [u8], block: &OpenedBlock) -> &'a [u8] {
        let start = block.copy * SLOT_BYTES + SLOT_PREFIX_BYTES;
        &raw[start..start + BLOCK_BYTES]
    }

    /// Reads and opens block `index` (which must be present) into `raw`, which is at least
    /// the layout's largest block.
    fn read_block(&self, keys: &FileKeys, index: u64, raw: &mut [u8]) -> Result<OpenedBlock> {
        let raw = &mut raw[..keys.layout.copies(index) * SLOT_BYTES];
        self.inner.read_at(Self::block_offset(keys, index), raw)?;
        Self::open_block(keys, index, raw).ok_or_else(|| self.unreadable(keys, index))
    }

    fn unreadable(&self, keys: &FileKeys, index: u64) -> Error {
        let start = index * BLOCK_BYTES as u64;
        let physical = Self::block_offset(keys, index);
        self.corrupt(format!(
            "block {index} (content bytes {start}..{}, stored at byte {physical}) fails \
             authentication: it was changed or damaged",
            start + BLOCK_BYTES as u64
        ))
    }

    /// The content length; `keys` is the file's (`None`: no header, empty).
    fn length(&self, keys: Option<&FileKeys>) -> Result<u64> {
        let Some(keys) = keys else { return Ok(0) };
        if keys.layout == Layout::Paged {
            return Ok(self.blocks_present(keys)? * BLOCK_BYTES as u64);
        }
        let mut known = self.state.length.lock();
        if let Some(length) = *known {
            return Ok(length);
        }
        let length = self.length_from_media(keys)?;
        *known = Some(length);
        Ok(length)
    }

    /// The content length of a single or paired file, from its last block that authenticates.
    fn length_from_media(&self, keys: &FileKeys) -> Result<u64> {
        let mut blocks = self.blocks_present(keys)?;
        let mut raw = vec![0u8; keys.layout.stride_max()];
        while blocks > 0 {
            let last = blocks - 1;
            let raw = &mut raw[..keys.layout.copies(last) * SLOT_BYTES];
            self.inner.read_at(Self::block_offset(keys, last), raw)?;
            match Self::open_block(keys, last, raw) {
                Some(block) => return Ok(last * BLOCK_BYTES as u64 + block.used as u64),
                // An interrupted growth of a paired file (see the module documentation).
                None if keys.layout == Layout::Paired => blocks -= 1,
                None => return Err(self.unreadable(keys, last)),
            }
        }
        Ok(0)
    }

    fn past_end(&self, offset: u64, bytes: usize) -> Error {
        self.corrupt(format!("{bytes} bytes at offset {offset} lie past its end"))
    }

    /// Writes `data` at `offset` and zeros from the end of the file up to `offset`; the
    /// caller holds the write lock and has the file's keys.
    fn write_locked(&self, keys: &FileKeys, offset: u64, data: &[u8]) -> Result<()> {
        let written = self.write_blocks(keys, offset, data);
        if written.is_err() {
            self.state.paired_written.lock().clear();
        }
        *self.state.length.lock() = match written {
            Ok(Some(length)) if keys.layout != Layout::Paged => Some(length),
            Ok(None) => return Ok(()),
            _ => None,
        };
        written.map(|_| ())
    }

    /// [`Self::write_locked`]'s work; the new content length, or `None` when nothing changed.
    fn write_blocks(&self, keys: &FileKeys, offset: u64, data: &[u8]) -> Result<Option<u64>> {
        let length = self.length(Some(keys))?;
        let end = offset + data.len() as u64;
        let mut new_length = length.max(end);
        if keys.layout == Layout::Paged {
            new_length = new_length.next_multiple_of(BLOCK_BYTES as u64);
        }
        let start = offset.min(length);
        if start == end {
            return Ok(None);
        }
        let block = BLOCK_BYTES as u64;
        let present = self.blocks_present(keys)?;
        // Blocks past the content but present on the media are leftovers of an interrupted
        // growth: they are written as new blocks.
        let present = present.min(length.div_ceil(block));
        let first = start / block;
        let last = (end - 1) / block;
        let stride = keys.layout.stride_max();
        let mut raw = vec![0u8; stride];
        let mut slot = vec![0u8; SLOT_BYTES];
        let mut nonces = NoncePool::default();
        let mut out = Coalescer {
            file: &*self.inner,
            offset: 0,
            buffer: Vec::with_capacity(WRITE_BATCH_BYTES + stride),
        };
        for index in first..=last {
            let block_start = index * block;
            let used = (new_length - block_start).min(block) as usize;
            let content = &mut slot[SLOT_PREFIX_BYTES..SLOT_PREFIX_BYTES + BLOCK_BYTES];
            content.fill(0);
            let covered_start = start.max(block_start);
            let covered_end = end.min(block_start + block);
            let covers_all =
                covered_start == block_start && covered_end >= block_start + used as u64;
            let paired = keys.layout.is_paired(index);
            let (generation, copy) = if index < present {
                let needs_old = !covers_all || paired;
                let written = paired.then(|| self.state.paired_written.lock().remove(&index));
                if let Some(Some(old)) = written {
                    if !covers_all {
                        content[..old.used].copy_from_slice(&old.content[..old.used]);
                    }
                    (old.generation + 1, 1 - old.copy)
                } else if needs_old {
                    let old = self.read_block(keys, index, &mut raw)?;
                    if !covers_all {
                        content[..old.used].copy_from_slice(&Self::content(&raw, &old)[..old.used]);
                    }
                    (old.generation + 1, 1 - old.copy)
                } else {
                    (0, 0)
                }
            } else {
                (1, 0)
            };
            let copy = if paired { copy } else { 0 };
            // The written part: zeros before `offset` (a gap), then `data`.
            if covered_end > covered_start {
                let within = (covered_start - block_start) as usize;
                let count = (covered_end - covered_start) as usize;
                let target = &mut content[within..within + count];
                if covered_start >= offset {
                    let from = (covered_start - offset) as usize;
                    target.copy_from_slice(&data[from..from + count]);
                } else {
                    let gap = (offset.min(covered_end) - covered_start) as usize;
                    target[..gap].fill(0);
                    if covered_end > offset {
                        target[gap..].copy_from_slice(&data[..count - gap]);
                    }
                }
            }
            content[used..].fill(0);
            let written = paired.then(|| WrittenBlock {
                generation,
                copy,
                used,
                content: content.into(),
            });
            seal_slot(keys, index, generation, used, &mut slot, nonces.next()?);
            let block_offset = Self::block_offset(keys, index);
            out.push(block_offset + (copy * SLOT_BYTES) as u64, &slot)?;
            if index < present && paired {
                self.state.rewritten.lock().insert(index, copy);
            }
            if index >= present && paired {
                // A new paired block's second slot holds nothing yet.
                out.push(block_offset + SLOT_BYTES as u64, &[0u8; SLOT_BYTES])?;
            }
            if let Some(written) = written {
                self.state.paired_written.lock().insert(index, written);
            }
        }
        out.flush()?;
        Ok(Some(new_length))
    }

    fn verify(&self) -> Result<SealedFileReport> {
        let keys_guard = self.state.keys.read();
        let Some(keys) = keys_guard.as_ref() else {
            return Ok(SealedFileReport::default());
        };
        let blocks = self.blocks_present(keys)?;
        let mut report = SealedFileReport {
            blocks,
            ..SealedFileReport::default()
        };
        let mut raw = vec![0u8; keys.layout.stride_max()];
        for index in 0..blocks {
            let raw = &mut raw[..keys.layout.copies(index) * SLOT_BYTES];
            self.inner.read_at(Self::block_offset(keys, index), raw)?;
            match Self::open_block(keys, index, raw) {
                None => report.unreadable_blocks.push(index),
                Some(block) if keys.layout.is_paired(index) => {
                    let other = 1 - block.copy;
                    let written = raw[other * SLOT_BYTES..(other + 1) * SLOT_BYTES]
                        .iter()
                        .any(|&byte| byte != 0);
                    if written && Self::open_slot(keys, index, raw, other).is_none() {
                        report.damaged_copies.push(index);
                    }
                }
                Some(_) => {}
            }
        }
        Ok(report)
    }
}

impl StorageFile for SealedFile {
    fn len(&self) -> Result<u64> {
        let keys = self.state.keys.read();
        self.length(keys.as_ref())
    }

    fn read_at(&self, offset: u64, buffer: &mut [u8]) -> Result<()> {
        if buffer.is_empty() {
            return Ok(());
        }
        let keys_guard = self.state.keys.read();
        let Some(keys) = keys_guard.as_ref() else {
            return Err(self.past_end(offset, buffer.len()));
        };
        let end = offset + buffer.len() as u64;
        if end > self.length(Some(keys))? {
            return Err(self.past_end(offset, buffer.len()));
        }
        let block = BLOCK_BYTES as u64;
        let first = offset / block;
        let last = (end - 1) / block;
        let physical_start = Self::block_offset(keys, first);
        let mut raw = vec![0u8; (Self::block_offset(keys, last + 1) - physical_start) as usize];
        self.inner.read_at(physical_start, &mut raw)?;
        for index in first..=last {
            let at = (Self::block_offset(keys, index) - physical_start) as usize;
            let block_raw = &mut raw[at..at + keys.layout.copies(index) * SLOT_BYTES];
            let opened = Self::open_block(keys, index, block_raw)
                .ok_or_else(|| self.unreadable(keys, index))?;
            let content = Self::content(block_raw, &opened);
            let block_start = index * block;
            let from = offset.max(block_start);
            let to = end.min(block_start + block);
            let target = &mut buffer[(from - offset) as usize..(to - offset) as usize];
            target.copy_from_slice(
                &content[(from - block_start) as usize..(to - block_start) as usize],
            );
        }
        Ok(())
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        let mut keys = self.state.keys.write();
        if keys.is_none() {
            // Another storage handle of this process may have written it since.
            *keys = match self.read_header()? {
                Some(existing) => Some(existing),
                None => Some(self.create_header()?),
            };
        }
        self.write_locked(keys.as_ref().expect("keys"), offset, data)
    }

    fn set_len(&self, length: u64) -> Result<()> {
        let mut keys_guard = self.state.keys.write();
        let current = self.length(keys_guard.as_ref())?;
        if length == current {
            return Ok(());
        }
        if length > current {
            if keys_guard.is_none() {
                *keys_guard = Some(self.create_header()?);
            }
            let keys = keys_guard.as_ref().expect("keys");
            return self.write_locked(keys, length, &[]);
        }
        let keys = keys_guard.as_ref().expect("a longer file has keys");
        // Unknown until the cut is done: a failure part way leaves it to be read again.
        *self.state.length.lock() = None;
        self.state.paired_written.lock().clear();
        let block = BLOCK_BYTES as u64;
        let blocks = length.div_ceil(block);
        if !length.is_multiple_of(block) {
            // The new last block is resealed with its shorter length (paged layout: with zeros
            // after it) before the rest is cut.
            let last = blocks - 1;
            let mut raw = vec![0u8; keys.layout.stride_max()];
            let old = self.read_block(keys, last, &mut raw)?;
            let keep = (length - last * block) as usize;
            let (generation, copy) = if keys.layout.is_paired(last) {
                (old.generation + 1, 1 - old.copy)
            } else {
                (0, 0)
            };
            let mut slot = vec![0u8; SLOT_BYTES];
            slot[SLOT_PREFIX_BYTES..SLOT_PREFIX_BYTES + keep]
                .copy_from_slice(&Self::content(&raw, &old)[..keep]);
            let used = if keys.layout == Layout::Paged {
                BLOCK_BYTES
            } else {
                keep
            };
            seal_slot(
                keys,
                last,
                generation,
                used,
                &mut slot,
                NoncePool::default().next()?,
            );
            self.inner.write_at(
                Self::block_offset(keys, last) + (copy * SLOT_BYTES) as u64,
                &slot,
            )?;
            if keys.layout.is_paired(last) {
                self.state.rewritten.lock().insert(last, copy);
            }
        }
        self.state
            .rewritten
            .lock()
            .retain(|&index, _| index < blocks);
        let cut = self.inner.set_len(Self::block_offset(keys, blocks));
        *self.state.length.lock() = match cut {
            Ok(()) if keys.layout != Layout::Paged => Some(length),
            _ => None,
        };
        cut
    }

    fn sync_data(&self) -> Result<()> {
        // Writes wait until the older slots are erased: a block rewritten meanwhile would
        // have its new content erased.
        let keys = self.state.keys.write();
        self.inner.sync_data()?;
        let rewritten = std::mem::take(&mut *self.state.rewritten.lock());
        let Some(keys) = keys.as_ref() else {
            return Ok(());
        };
        let mut blocks: Vec<(u64, usize)> = rewritten.into_iter().collect();
        blocks.sort_unstable();
        let mut out = Coalescer {
            file: &*self.inner,
            offset: 0,
            buffer: Vec::new(),
        };
        let erased = [0u8; SLOT_BYTES];
        for (index, newest) in blocks {
            let older = 1 - newest;
            out.push(
                Self::block_offset(keys, index) + (older * SLOT_BYTES) as u64,
                &erased,
            )?;
        }
        // Durable with the next sync; until then a crash leaves the older slot, which only
        // matters if the newest is damaged in that window.
        out.flush()
    }

    fn advise_will_need(&self, offset: u64, length: u64) -> Result<()> {
        let keys = self.state.keys.read();
        match keys.as_ref() {
            Some(keys) => {
                let (start, bytes) = physical_range(keys, offset, length);
                self.inner.advise_will_need(start, bytes)
            }
            None => Ok(()),
        }
    }

    fn start_writeback(&self, offset: u64, length: u64) -> Result<()> {
        let keys = self.state.keys.read();
        match keys.as_ref() {
            Some(keys) => {
                let (start, bytes) = physical_range(keys, offset, length);
                self.inner.start_writeback(start, bytes)
            }
            None => Ok(()),
        }
    }

    fn name(&self) -> &str {
        self.inner.name()
    }
}

/// Random nonces drawn from the system in batches (one system call per 256 slots).
#[derive(Default)]
struct NoncePool {
    bytes: Vec<u8>,
}

impl NoncePool {
    fn next(&mut self) -> Result<[u8; NONCE_LEN]> {
        if self.bytes.is_empty() {
            self.bytes = vec![0u8; NONCE_LEN * 256];
            random_bytes(&mut self.bytes)?;
        }
        let at = self.bytes.len() - NONCE_LEN;
        let nonce = self.bytes[at..].try_into().expect("nonce bytes");
        self.bytes.truncate(at);
        Ok(nonce)
    }
}

/// Seals `slot`, whose content bytes hold the block's content (zeros past `used`): writes the
/// slot prefix and encrypts the content in place, then the tag.
fn seal_slot(
    keys: &FileKeys,
    index: u64,
    generation: u64,
    used: usize,
    slot: &mut [u8],
    nonce: [u8; NONCE_LEN],
) {
    debug_assert!(used <= BLOCK_BYTES);
    debug_assert!(
        slot[SLOT_PREFIX_BYTES + used..SLOT_PREFIX_BYTES + BLOCK_BYTES]
            .iter()
            .all(|&byte| byte == 0)
    );
    slot[..8].copy_from_slice(&generation.to_le_bytes());
    slot[8..12].copy_from_slice(&(used as u32).to_le_bytes());
    slot[12..SLOT_PREFIX_BYTES].copy_from_slice(&nonce);
    let aad = slot_aad(&keys.id, index, generation, used as u32);
    let (body, tag_bytes) = slot[SLOT_PREFIX_BYTES..].split_at_mut(BLOCK_BYTES);
    let tag = keys
        .key
        .seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::from(aad), body)
        .expect("sealing a block");
    tag_bytes.copy_from_slice(tag.as_ref());
}

/// The physical range holding content bytes `offset..offset + length`.
fn physical_range(keys: &FileKeys, offset: u64, length: u64) -> (u64, u64) {
    let block = BLOCK_BYTES as u64;
    let first = offset / block;
    let last = (offset + length).div_ceil(block);
    let start = SealedFile::block_offset(keys, first);
    (start, SealedFile::block_offset(keys, last) - start)
}

#[cfg(test)]
mod tests;
