//! The manifest: the durable description of a checkpoint.
//!
//! ```text
//! header (32 B)  magic "OCPAGES1" | sequence u64 | body bytes u64 | crc32c(body) u32 | zeros
//! body           slot count u32 | area count u32 | area* | user state bytes u32 | user state
//! area           name bytes u16 | name | page count u64 | entry*
//! entry (8 B)    slot u32 (u32::MAX: never written) | crc32c(page) u32
//! ```
//!
//! All integers are little-endian. A page's checksum stays in the durable manifest file and
//! is read from there when the page is loaded (see the parent module), so a decoded
//! manifest keeps only each area's slots and where its entries start in the file.
//!
//! This module is a codec: it reads and writes bytes and knows nothing of the store.

use crate::bytes::{u32_at, u64_at, ByteReader, ByteWriter};
use crate::storage::StorageFile;
use crate::{Error, Result};

const MANIFEST_MAGIC: &[u8; 8] = b"OCPAGES1";
const MANIFEST_HEADER_BYTES: usize = 32;
/// Largest manifest accepted when reading, so a corrupt length cannot exhaust memory.
const MANIFEST_BYTES_MAX: u64 = 1 << 32;
/// Bytes of one page-table entry in a manifest: slot and CRC-32C, little-endian.
pub(super) const MANIFEST_ENTRY_BYTES: u64 = 8;
/// The slot of a page never written (it reads as zeros).
pub(super) const NO_SLOT: u32 = u32::MAX;

/// Checks the whole contents of manifest file `index` (0 or 1) without opening the store, for
/// a check that must not write: the sequence number of its checkpoint, or what is wrong with
/// it. Checkpoints alternate between the two files, so the sequence number in `manifest.N` is
/// N modulo 2 (the sequence field is outside the checksum). An empty file is one never
/// written yet and is the caller's to judge.
pub fn inspect_manifest(bytes: &[u8], index: usize) -> std::result::Result<u64, &'static str> {
    assert!(index < 2, "a page store has two manifest files");
    if bytes.len() < MANIFEST_HEADER_BYTES || &bytes[..8] != MANIFEST_MAGIC {
        return Err("no manifest header");
    }
    let body = &bytes[MANIFEST_HEADER_BYTES..];
    if u64_at(bytes, 16) != body.len() as u64 {
        return Err("its length disagrees with its header");
    }
    if bytes[28..32] != [0; 4] {
        return Err("bytes its header leaves zero are not");
    }
    if crc32c::crc32c(body) != u32_at(bytes, 24) {
        return Err("its checksum does not match");
    }
    let sequence = u64_at(bytes, 8);
    if sequence % 2 != index as u64 {
        return Err("its sequence number belongs to the other file");
    }
    Ok(sequence)
}

/// One area of a manifest as read from its file.
pub(super) struct ManifestArea {
    pub(super) name: String,
    /// The slot of each page, or [`NO_SLOT`].
    pub(super) table: Vec<u32>,
    /// Byte offset of the area's first page-table entry in the manifest file.
    pub(super) entries_at: u64,
}

/// A manifest as read from its file.
pub(super) struct Manifest {
    /// Which manifest file (0 or 1) it was read from.
    pub(super) file: usize,
    pub(super) sequence: u64,
    pub(super) slot_count: u32,
    pub(super) areas: Vec<ManifestArea>,
    pub(super) user_state: Vec<u8>,
    /// The whole file as read.
    pub(super) bytes: Vec<u8>,
}

/// The manifest in a file; `Err(None)` when the file is empty, `Err(Some(why))` when it
/// fails its checks.
pub(super) type ManifestRead = std::result::Result<Manifest, Option<String>>;

/// Reads and checks manifest file `index` (0 or 1). Only I/O errors, and a body that passes
/// its checksum but does not decode, are errors; a torn or damaged file is `Ok(Err(..))`.
pub(super) fn read(file: &dyn StorageFile, index: usize) -> Result<ManifestRead> {
    let length = file.len()?;
    if length == 0 {
        return Ok(Err(None));
    }
    if length < MANIFEST_HEADER_BYTES as u64 || length > MANIFEST_BYTES_MAX {
        return Ok(Err(Some(format!("{length} bytes long"))));
    }
    // One read of the whole file: on sealed storage every read opens whole blocks.
    let mut bytes = vec![0u8; length as usize];
    file.read_at(0, &mut bytes)?;
    let (header, body) = bytes.split_at(MANIFEST_HEADER_BYTES);
    if &header[..8] != MANIFEST_MAGIC {
        return Ok(Err(Some("no manifest header at offset 0".to_string())));
    }
    let sequence = u64_at(header, 8);
    let body_length = u64_at(header, 16);
    let checksum = u32_at(header, 24);
    if body_length != length - MANIFEST_HEADER_BYTES as u64 {
        return Ok(Err(Some(format!(
            "the header (offset 16) states a body of {body_length} bytes, the file holds {}",
            length - MANIFEST_HEADER_BYTES as u64
        ))));
    }
    if crc32c::crc32c(body) != checksum {
        return Ok(Err(Some(format!(
            "the body (bytes {MANIFEST_HEADER_BYTES}..{length}) fails its checksum"
        ))));
    }
    // The checksum matched, so a decoding failure means a bug or deliberate tampering.
    let decoded = decode_body(index, sequence, body);
    decoded
        .map(|manifest| Ok(Manifest { bytes, ..manifest }))
        .ok_or_else(|| Error::corrupt(format!("manifest {}", file.name()), "malformed body"))
}

fn decode_body(file: usize, sequence: u64, body: &[u8]) -> Option<Manifest> {
    let mut reader = ByteReader::new(body);
    let slot_count = reader.u32()?;
    let area_count = reader.u32()?;
    let mut areas = Vec::new();
    for _ in 0..area_count {
        let name_length = reader.u16()? as usize;
        let name = String::from_utf8(reader.take(name_length)?.to_vec()).ok()?;
        let page_count = reader.u64()?;
        if page_count > reader.remaining() as u64 / MANIFEST_ENTRY_BYTES {
            return None;
        }
        let entries_at = (MANIFEST_HEADER_BYTES + body.len() - reader.remaining()) as u64;
        let mut table = Vec::with_capacity(page_count as usize);
        for _ in 0..page_count {
            table.push(reader.u32()?);
            // The checksum stays in the file (see the module documentation).
            reader.u32()?;
        }
        areas.push(ManifestArea {
            name,
            table,
            entries_at,
        });
    }
    let user_length = reader.u32()? as usize;
    let user_state = reader.take(user_length)?.to_vec();
    if !reader.is_empty() {
        return None;
    }
    Some(Manifest {
        file,
        sequence,
        slot_count,
        areas,
        user_state,
        bytes: Vec::new(),
    })
}

/// The slot and the checksum of one page-table entry ([`MANIFEST_ENTRY_BYTES`] bytes).
pub(super) fn entry_fields(entry: &[u8]) -> (u32, u32) {
    assert_eq!(entry.len() as u64, MANIFEST_ENTRY_BYTES, "one whole entry");
    (u32_at(entry, 0), u32_at(entry, 4))
}

/// Writes a manifest: [`new`](Self::new), then per area [`area`](Self::area) followed by
/// one [`entry`](Self::entry) per page, then [`finish`](Self::finish).
pub(super) struct ManifestEncoder {
    body: ByteWriter,
    /// Per area, the byte offset of its first entry in the manifest file.
    entries_at: Vec<u64>,
    areas_left: u32,
    entries_left: u64,
}

impl ManifestEncoder {
    pub(super) fn new(slot_count: u32, area_count: usize) -> ManifestEncoder {
        let area_count = u32::try_from(area_count).expect("areas are few");
        let mut body = ByteWriter::default();
        body.u32(slot_count);
        body.u32(area_count);
        ManifestEncoder {
            body,
            entries_at: Vec::with_capacity(area_count as usize),
            areas_left: area_count,
            entries_left: 0,
        }
    }

    /// Starts the next area, whose `page_count` entries follow.
    pub(super) fn area(&mut self, name: &str, page_count: u64) {
        assert!(self.areas_left > 0, "more areas than announced");
        assert_eq!(self.entries_left, 0, "the previous area is complete");
        self.areas_left -= 1;
        self.entries_left = page_count;
        self.body
            .u16(u16::try_from(name.len()).expect("area names are short"));
        self.body.bytes(name.as_bytes());
        self.body.u64(page_count);
        self.entries_at
            .push((MANIFEST_HEADER_BYTES + self.body.len()) as u64);
    }

    /// The entry of the next page of the current area.
    pub(super) fn entry(&mut self, slot: u32, checksum: u32) {
        assert!(
            self.entries_left > 0,
            "more entries than the area has pages"
        );
        self.entries_left -= 1;
        self.body.u32(slot);
        self.body.u32(checksum);
    }

    /// The manifest file's bytes for checkpoint `sequence`, and per area the offset of its
    /// first entry in them.
    pub(super) fn finish(mut self, sequence: u64, user_state: &[u8]) -> (Vec<u8>, Vec<u64>) {
        assert_eq!(self.areas_left, 0, "every announced area was written");
        assert_eq!(self.entries_left, 0, "the last area is complete");
        self.body
            .u32(u32::try_from(user_state.len()).expect("user state under 4 GiB"));
        self.body.bytes(user_state);
        let body = self.body.into_bytes();
        let mut manifest = ByteWriter::with_capacity(MANIFEST_HEADER_BYTES + body.len());
        manifest.bytes(MANIFEST_MAGIC);
        manifest.u64(sequence);
        manifest.u64(body.len() as u64);
        manifest.u32(crc32c::crc32c(&body));
        manifest.u32(0);
        assert_eq!(manifest.len(), MANIFEST_HEADER_BYTES);
        manifest.bytes(&body);
        (manifest.into_bytes(), self.entries_at)
    }
}
