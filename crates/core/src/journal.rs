//! The journal: a redo log of metadata changes between checkpoints.
//!
//! Owners of a [`PageStore`](crate::pages::PageStore) change pages in memory and append a
//! record describing each change here. [`Journal::sync`] makes the records durable (this is
//! what an NBD FLUSH waits for); a checkpoint makes the pages durable and starts a new journal
//! *generation* in a new file. After a crash the owner reopens the page store (the last
//! checkpoint), [`scan`](Journal::scan)s the generation that checkpoint names and replays its
//! intact records.
//!
//! # Format
//!
//! `journal-<generation as 16 hex digits>` is created at a fixed *capacity* (a sparse file:
//! unwritten bytes read as zeros), so its length never changes while records are appended and
//! a shorter file is a truncation, never a torn tail.
//!
//! ```text
//! file header (64 B)  "OCJRNL03" | generation u64 | capacity u64 | crc32c u32 | zeros
//! record*             header | payload | footer
//!   header (32 B)     payload length u32 | header crc u32 | synced end u64 | tag [16]
//!   footer (32 B)     tag [16] | payload length u32 | footer crc u32 | record crc u32 |
//!                     "OCJ." (the end mark, whose bytes are never zero)
//! zeros               (never written)
//! ```
//!
//! The *tag* is the owner's summary of the record (the block device: volume and block range),
//! kept twice so that one damaged copy leaves the other. The header crc covers the generation
//! and the header's other fields, the footer crc the generation and the footer's tag and
//! length, and the record crc the generation, the header, the payload and the footer before
//! it. Including the generation keeps records of another file from ever being replayed under
//! this one. *Synced end* is the file offset up to which the journal was durable when the
//! record was appended. The end mark makes every record's last byte non-zero, so the last
//! non-zero byte of a journal is the end of its last whole record unless a write was cut.
//!
//! # Torn tails and damage
//!
//! A scan reads intact records from the front. It stops at zeros (the clean end) or at a
//! record that fails its checks, which is one of two things:
//!
//! - a **torn tail**: the last unsynced write reached the media only in part (any 512-byte
//!   sector of it may be missing; a process killed inside the write, or a disk that wrote the
//!   request in order, leaves a prefix of its sectors). Nothing in it was acknowledged as
//!   durable, and the scan drops it and everything after it.
//! - **damage**: bytes that were durable changed. Proof: a later intact record whose synced
//!   end lies past the bad record (the journal was synced after the bad record was written),
//!   or a file shorter than its capacity. Without proof, a bad region is a torn tail when a
//!   sector of it reads as zeros, since a sector that never reached the media reads as zeros
//!   in a file that is only appended to: either a whole sector (at least 8 bytes of it within
//!   the region), or, in the last bad region, the sectors from a sector boundary at or after
//!   the last non-zero byte up to where the bad record must end at least (its header's length
//!   when the header is intact, else a whole header and footer): a whole record ends in its
//!   end mark, so its bytes cannot stop short of that. A bad region without such a sector is
//!   damage (a flipped byte in the last synced records).
//!
//! Damage is never dropped silently: the scan reports where it is and which tag the damaged
//! record carried (from its header or its footer, whichever is intact), and lists the intact
//! records after it so that a repair can salvage them.

use std::sync::Arc;

use crate::bytes::{u32_at, u64_at};
use crate::storage::{join, Storage, StorageFile};
use crate::{Error, Result};

/// Bytes of a record's tag.
pub const TAG_BYTES: usize = 16;
/// The owner's summary of a record, stored in its header and its footer.
pub type RecordTag = [u8; TAG_BYTES];
/// Largest record payload.
pub const RECORD_BYTES_MAX: usize = 16 << 20;

const FILE_MAGIC: &[u8; 8] = b"OCJRNL03";
/// Bytes of the file header; the first record starts here.
pub const FILE_HEADER_BYTES: u64 = 64;
const RECORD_HEADER_BYTES: usize = 32;
const RECORD_FOOTER_BYTES: usize = 32;
/// The last bytes of every record; none is zero (see the module documentation).
const RECORD_END_MARK: [u8; 4] = *b"OCJ.";
/// Bytes a record takes besides its payload.
pub const RECORD_OVERHEAD_BYTES: usize = RECORD_HEADER_BYTES + RECORD_FOOTER_BYTES;
const RECORD_TOTAL_MAX: u64 = (RECORD_BYTES_MAX + RECORD_OVERHEAD_BYTES) as u64;
/// Smallest capacity of a new file; records that need more make it grow.
const CAPACITY_MIN_BYTES: u64 = 1 << 20;
/// Buffered bytes that trigger a write to the file even without a sync.
const BUFFER_BYTES_LIMIT: usize = 1 << 20;
/// The unit a disk writes atomically; a torn write misses whole sectors.
const SECTOR_BYTES: u64 = 512;
/// Zero bytes of a sector within a bad region that mark it as never written.
const TORN_SECTOR_BYTES_MIN: u64 = 8;
/// A run of zeros this long, aligned, ends the written part of a file.
const ZERO_RUN_BYTES: u64 = 64 << 10;
/// Bytes read at a time while scanning.
const SCAN_READ_BYTES: u64 = 4 << 20;

const _: () = assert!(RECORD_BYTES_MAX <= u32::MAX as usize);
const _: () = assert!(FILE_HEADER_BYTES as usize >= 8 + 8 + 8 + 4);
const _: () = assert!(BUFFER_BYTES_LIMIT as u64 <= SCAN_READ_BYTES);
const _: () = assert!(RECORD_END_MARK[3] != 0 && RECORD_FOOTER_BYTES == TAG_BYTES + 4 + 4 + 4 + 4);

/// One intact record found by [`Journal::scan`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScannedRecord {
    /// Offset of the record's header in the file.
    pub offset: u64,
    pub tag: RecordTag,
    pub payload_bytes: u32,
    /// The journal's durable end when the record was appended.
    pub synced_end: u64,
}

impl ScannedRecord {
    /// Offset just past the record.
    pub fn end(&self) -> u64 {
        self.offset + (RECORD_OVERHEAD_BYTES + self.payload_bytes as usize) as u64
    }
}

/// Bytes of a journal that failed their checks and were durable; see the module
/// documentation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalDamage {
    /// Where the damaged bytes start.
    pub offset: u64,
    /// Where they end: the next intact record, the end of the written part, or the capacity
    /// (a truncated file).
    pub end: u64,
    /// The damaged record's tag, when its header or footer is intact.
    pub tag: Option<RecordTag>,
    /// The file is truncated within or right after this region: whatever records followed it
    /// are lost too, and what they held is unknown.
    pub cut: bool,
    /// What is wrong, for messages.
    pub detail: String,
}

/// How the intact records of a scanned journal end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JournalEnd {
    /// Zeros follow the last record.
    Clean,
    /// A torn tail of `bytes` bytes at `offset`, never acknowledged, dropped.
    Torn { offset: u64, bytes: u64 },
}

/// What [`Journal::scan`] found in one generation.
#[derive(Debug)]
pub struct JournalScan {
    /// The file's name in its storage.
    pub name: String,
    pub generation: u64,
    /// The file's length.
    pub length: u64,
    /// The file header is damaged (the records are still scanned).
    pub header_damaged: bool,
    /// Intact records in file order: those before the first damage, then those after it.
    pub records: Vec<ScannedRecord>,
    /// How many of `records` come before the first damage: the ones a replay applies.
    pub prefix: usize,
    /// Damaged regions, in file order.
    pub damage: Vec<JournalDamage>,
    /// How the records end, when not at damage.
    pub end: JournalEnd,
    file: Arc<dyn StorageFile>,
}

impl JournalScan {
    /// True when every durable record is intact.
    pub fn is_intact(&self) -> bool {
        self.damage.is_empty() && !self.header_damaged
    }

    /// Calls `visit` with each record of `records` (a sub-slice of [`Self::records`]) and its
    /// payload, in order, until it fails.
    pub fn for_each_payload<E: From<Error>>(
        &self,
        records: &[ScannedRecord],
        mut visit: impl FnMut(&ScannedRecord, &[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut window = Window::new(self.file.as_ref(), self.length);
        for record in records {
            let bytes = window.get(record.offset, record.end() - record.offset)?;
            let payload = &bytes[RECORD_HEADER_BYTES..bytes.len() - RECORD_FOOTER_BYTES];
            visit(record, payload)?;
        }
        Ok(())
    }
}

/// An open journal generation, positioned for appending.
#[derive(Debug)]
pub struct Journal {
    storage: Arc<dyn Storage>,
    directory: String,
    generation: u64,
    file: Arc<dyn StorageFile>,
    capacity: u64,
    /// Records appended but not yet written to the file.
    buffer: Vec<u8>,
    /// Offset just past the records written to the file.
    file_end: u64,
    /// Offset up to which the file is durable.
    synced_end: u64,
}

impl Journal {
    /// The file name of a generation.
    pub fn file_name(directory: &str, generation: u64) -> String {
        join(directory, &format!("journal-{generation:016x}"))
    }

    /// The generations whose files exist in `directory`, ascending.
    pub fn generations(storage: &dyn Storage, directory: &str) -> Result<Vec<u64>> {
        let mut generations: Vec<u64> = storage
            .list(directory)?
            .iter()
            .filter_map(|name| {
                let base = name.rsplit('/').next()?;
                let digits = base.strip_prefix("journal-")?;
                (digits.len() == 16)
                    .then(|| u64::from_str_radix(digits, 16).ok())
                    .flatten()
            })
            .collect();
        generations.sort_unstable();
        Ok(generations)
    }

    /// Creates generation `generation` as a new, durably named, empty file of `capacity`
    /// bytes (more are added if records need them). Fails if the file exists: a generation
    /// is written once.
    pub fn create(
        storage: Arc<dyn Storage>,
        directory: &str,
        generation: u64,
        capacity: u64,
    ) -> Result<Journal> {
        let capacity = capacity.max(FILE_HEADER_BYTES + CAPACITY_MIN_BYTES);
        let name = Self::file_name(directory, generation);
        if storage.exists(&name)? {
            return Err(Error::AlreadyExists(format!("journal {name}")));
        }
        let file = storage.open(&name, true)?;
        file.set_len(capacity)?;
        file.write_at(0, &encode_file_header(generation, capacity))?;
        file.sync_data()?;
        storage.sync_directory(directory)?;
        Ok(Journal {
            storage,
            directory: directory.to_string(),
            generation,
            file,
            capacity,
            buffer: Vec::new(),
            file_end: FILE_HEADER_BYTES,
            synced_end: FILE_HEADER_BYTES,
        })
    }

    /// Reads generation `generation` without changing it; see the module documentation. A
    /// missing file is [`Error::NotFound`].
    pub fn scan(storage: &dyn Storage, directory: &str, generation: u64) -> Result<JournalScan> {
        let name = Self::file_name(directory, generation);
        if !storage.exists(&name)? {
            return Err(Error::NotFound(format!("journal {name}")));
        }
        let file = storage.open(&name, false)?;
        scan_file(file, name, generation)
    }

    /// Removes the file of generation `generation` (after the checkpoints that replaced it).
    pub fn remove(storage: &dyn Storage, directory: &str, generation: u64) -> Result<()> {
        storage.remove(&Self::file_name(directory, generation))
    }

    /// The current generation.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Appends a record (buffered in memory; durable after [`sync`](Journal::sync)).
    pub fn append(&mut self, tag: &RecordTag, payload: &[u8]) -> Result<()> {
        if payload.len() > RECORD_BYTES_MAX {
            return Err(Error::Limit(format!(
                "journal record of {} bytes exceeds the {RECORD_BYTES_MAX}-byte limit",
                payload.len()
            )));
        }
        encode_record(
            self.generation,
            self.synced_end,
            tag,
            payload,
            &mut self.buffer,
        );
        if self.buffer.len() >= BUFFER_BYTES_LIMIT {
            match self.write_buffered() {
                // The record is appended (buffered); the next sync writes it or reports the
                // full disk, and the owner refuses new writes until there is room.
                Err(error) if crate::storage::is_full(&error) => {}
                other => other?,
            }
        }
        Ok(())
    }

    /// Writes buffered records to the file without syncing.
    pub fn write_buffered(&mut self) -> Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let end = self.file_end + self.buffer.len() as u64;
        if end > self.capacity {
            self.grow(end)?;
        }
        self.file.write_at(self.file_end, &self.buffer)?;
        self.file_end = end;
        self.buffer.clear();
        Ok(())
    }

    /// Makes every appended record durable.
    pub fn sync(&mut self) -> Result<()> {
        self.write_buffered()?;
        if self.synced_end != self.file_end {
            self.file.sync_data()?;
            self.synced_end = self.file_end;
        }
        Ok(())
    }

    /// True when records were appended since the last sync.
    pub fn has_unsynced(&self) -> bool {
        !self.buffer.is_empty() || self.synced_end != self.file_end
    }

    /// Bytes of records in this generation, buffered ones included.
    pub fn bytes(&self) -> u64 {
        self.file_end - FILE_HEADER_BYTES + self.buffer.len() as u64
    }

    /// Starts generation `generation` in a new file (see [`create`](Self::create)) and returns
    /// the old generation. Records appended before are dropped from memory: call this only
    /// right before a checkpoint that covers them. The old file stays until its owner removes
    /// it.
    pub fn rotate(&mut self, generation: u64) -> Result<u64> {
        assert!(generation > self.generation, "generations only grow");
        let next = Journal::create(
            self.storage.clone(),
            &self.directory,
            generation,
            self.capacity,
        )?;
        let old = std::mem::replace(self, next);
        Ok(old.generation)
    }

    /// Adds room for records up to `end`: the new length is made durable before anything is
    /// written past the old one, so a file shorter than the capacity its header states is
    /// always a truncation.
    fn grow(&mut self, end: u64) -> Result<()> {
        let capacity = end.max(self.capacity.saturating_mul(2));
        self.file.set_len(capacity)?;
        self.file.sync_data()?;
        self.file
            .write_at(0, &encode_file_header(self.generation, capacity))?;
        self.capacity = capacity;
        Ok(())
    }
}

fn encode_file_header(generation: u64, capacity: u64) -> [u8; FILE_HEADER_BYTES as usize] {
    let mut header = [0u8; FILE_HEADER_BYTES as usize];
    header[..8].copy_from_slice(FILE_MAGIC);
    header[8..16].copy_from_slice(&generation.to_le_bytes());
    header[16..24].copy_from_slice(&capacity.to_le_bytes());
    let crc = crc32c::crc32c(&header[..24]);
    header[24..28].copy_from_slice(&crc.to_le_bytes());
    header
}

/// The capacity a file header states, if the header is intact and names `generation`.
fn decode_file_header(bytes: &[u8], generation: u64) -> Option<u64> {
    if bytes.len() < FILE_HEADER_BYTES as usize || &bytes[..8] != FILE_MAGIC {
        return None;
    }
    let crc = u32_at(bytes, 24);
    if crc32c::crc32c(&bytes[..24]) != crc {
        return None;
    }
    let stated = u64_at(bytes, 8);
    (stated == generation).then(|| u64_at(bytes, 16))
}

fn header_crc(generation: u64, header: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&generation.to_le_bytes());
    let crc = crc32c::crc32c_append(crc, &header[..4]);
    crc32c::crc32c_append(crc, &header[8..RECORD_HEADER_BYTES])
}

fn footer_crc(generation: u64, footer: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&generation.to_le_bytes());
    crc32c::crc32c_append(crc, &footer[..TAG_BYTES + 4])
}

fn encode_record(
    generation: u64,
    synced_end: u64,
    tag: &RecordTag,
    payload: &[u8],
    out: &mut Vec<u8>,
) {
    let start = out.len();
    let length = (payload.len() as u32).to_le_bytes();
    out.extend_from_slice(&length);
    out.extend_from_slice(&[0u8; 4]);
    out.extend_from_slice(&synced_end.to_le_bytes());
    out.extend_from_slice(tag);
    let crc = header_crc(generation, &out[start..]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(payload);
    let footer_start = out.len();
    out.extend_from_slice(tag);
    out.extend_from_slice(&length);
    let crc = footer_crc(generation, &out[footer_start..]);
    out.extend_from_slice(&crc.to_le_bytes());
    let record_crc = crc32c::crc32c_append(
        crc32c::crc32c(&generation.to_le_bytes()),
        &out[start..out.len()],
    );
    out.extend_from_slice(&record_crc.to_le_bytes());
    out.extend_from_slice(&RECORD_END_MARK);
    debug_assert_eq!(out.len() - start, payload.len() + RECORD_OVERHEAD_BYTES);
}

/// A record header that passes its own check: (payload length, synced end, tag).
fn decode_header(generation: u64, at: u64, bytes: &[u8]) -> Option<(u32, u64, RecordTag)> {
    if bytes.len() < RECORD_HEADER_BYTES {
        return None;
    }
    let length = u32_at(bytes, 0);
    let synced_end = u64_at(bytes, 8);
    // Cheap plausibility first: resynchronising tries this at every offset.
    if length as usize > RECORD_BYTES_MAX || synced_end > at || synced_end < FILE_HEADER_BYTES {
        return None;
    }
    let crc = u32_at(bytes, 4);
    if header_crc(generation, &bytes[..RECORD_HEADER_BYTES]) != crc {
        return None;
    }
    Some((
        length,
        synced_end,
        bytes[16..32].try_into().expect("16 bytes"),
    ))
}

/// The tag of a footer that passes its own check, with its stated payload length.
fn decode_footer(generation: u64, footer: &[u8]) -> Option<(RecordTag, u32)> {
    assert_eq!(footer.len(), RECORD_FOOTER_BYTES, "a whole footer");
    let crc = u32_at(footer, 20);
    if footer_crc(generation, footer) != crc {
        return None;
    }
    Some((
        footer[..TAG_BYTES].try_into().expect("16 bytes"),
        u32_at(footer, 16),
    ))
}

/// The whole record at the front of `bytes` (read at `at`), if intact.
fn decode_record(generation: u64, at: u64, bytes: &[u8]) -> Option<ScannedRecord> {
    let (length, synced_end, tag) = decode_header(generation, at, bytes)?;
    let total = RECORD_OVERHEAD_BYTES + length as usize;
    if bytes.len() < total {
        return None;
    }
    let footer = &bytes[RECORD_HEADER_BYTES + length as usize..total];
    let (footer_tag, footer_length) = decode_footer(generation, footer)?;
    let record_crc = u32_at(footer, 24);
    let expected = crc32c::crc32c_append(
        crc32c::crc32c(&generation.to_le_bytes()),
        &bytes[..total - 8],
    );
    let marked = footer[28..] == RECORD_END_MARK;
    (footer_tag == tag && footer_length == length && expected == record_crc && marked).then_some(
        ScannedRecord {
            offset: at,
            tag,
            payload_bytes: length,
            synced_end,
        },
    )
}

/// Reads of a file through a buffer that slides forward.
struct Window<'a> {
    file: &'a dyn StorageFile,
    length: u64,
    start: u64,
    bytes: Vec<u8>,
}

impl<'a> Window<'a> {
    fn new(file: &'a dyn StorageFile, length: u64) -> Self {
        Window {
            file,
            length,
            start: 0,
            bytes: Vec::new(),
        }
    }

    /// Up to `count` bytes at `offset`; fewer at the end of the file.
    fn get(&mut self, offset: u64, count: u64) -> Result<&[u8]> {
        let end = (offset + count).min(self.length);
        if offset >= end {
            return Ok(&[]);
        }
        let held_end = self.start + self.bytes.len() as u64;
        if offset < self.start || end > held_end {
            let read_end = (offset + count.max(SCAN_READ_BYTES)).min(self.length);
            self.bytes.resize((read_end - offset) as usize, 0);
            self.file.read_at(offset, &mut self.bytes)?;
            self.start = offset;
        }
        let from = (offset - self.start) as usize;
        Ok(&self.bytes[from..from + (end - offset) as usize])
    }
}

/// A region the record chain could not pass: where it starts, where the next intact record
/// starts (if any was found), and the tag of the bad record if its header or footer is
/// intact.
struct BadRegion {
    offset: u64,
    end: u64,
    tag: Option<RecordTag>,
    /// The bad record's header promised more bytes than the file has.
    past_end: bool,
    /// Where the bad record ends at least: as its intact header says, else after a header
    /// and a footer.
    needed_end: u64,
    /// An intact record follows the region.
    resynchronised: bool,
}

impl BadRegion {
    /// The region is the last written bytes and stops short of the end the bad record
    /// needs, at or before a sector boundary: the sectors from there on never reached the
    /// media (the record's end mark is never zero, so a whole record cannot end early).
    fn cut_short(&self) -> bool {
        !self.resynchronised
            && !self.past_end
            && self.end.next_multiple_of(SECTOR_BYTES) < self.needed_end
    }
}

fn scan_file(file: Arc<dyn StorageFile>, name: String, generation: u64) -> Result<JournalScan> {
    let length = file.len()?;
    let mut window = Window::new(file.as_ref(), length);
    let header = window.get(0, FILE_HEADER_BYTES)?.to_vec();
    let capacity = decode_file_header(&header, generation);
    let mut records = Vec::new();
    let mut bad = Vec::new();
    let mut offset = FILE_HEADER_BYTES;
    // Walk the record chain; at a bad record, resynchronise on the next intact one.
    while offset < length {
        let bytes = window.get(offset, RECORD_HEADER_BYTES as u64)?;
        if bytes.iter().all(|&byte| byte == 0) {
            break;
        }
        let claimed = decode_header(generation, offset, bytes)
            .map(|(length, _, _)| (RECORD_OVERHEAD_BYTES + length as usize) as u64);
        if let Some(record) = read_record(&mut window, generation, offset)? {
            offset = record.end();
            records.push(record);
            continue;
        }
        let region = bad_region(&mut window, generation, offset, claimed)?;
        offset = region.end;
        let resynchronised = region.resynchronised;
        bad.push((records.len(), region));
        if !resynchronised {
            break;
        }
    }
    let written_end = offset;
    let truncated = capacity.is_some_and(|capacity| length < capacity);

    // Classify the bad regions, the first one without proof first.
    let mut damage = Vec::new();
    let mut prefix = records.len();
    let mut end = JournalEnd::Clean;
    for (index, (records_before, region)) in bad.iter().enumerate() {
        // The file ends inside this region: a header that promises more bytes than the file
        // has, or bad bytes up to the end (zeros at the cut do not count as written).
        let cut = truncated && (region.past_end || region.end >= length);
        let proven = records[*records_before..]
            .iter()
            .any(|record| record.synced_end > region.offset)
            || cut;
        let torn = region.past_end || region.cut_short() || has_zero_sector(&mut window, region)?;
        let damaged = proven || !torn;
        if index == 0 {
            prefix = *records_before;
        }
        if damaged {
            damage.push(JournalDamage {
                offset: region.offset,
                end: region.end,
                tag: region.tag,
                cut,
                detail: if cut {
                    format!("the file is truncated to {length} bytes of {} and the record at {} is cut", capacity.unwrap_or(0), region.offset)
                } else if proven {
                    format!(
                        "a record at offset {} fails its checksum and the journal was synced after it",
                        region.offset
                    )
                } else {
                    format!(
                        "a record at offset {} fails its checksum and is not a torn write (no \
                         sector of it reads as zeros)",
                        region.offset
                    )
                },
            });
        } else {
            // A torn tail: it and everything after it were never acknowledged.
            end = JournalEnd::Torn {
                offset: region.offset,
                bytes: written_end.max(region.end) - region.offset,
            };
            records.truncate(*records_before);
            break;
        }
    }
    if truncated && !damage.iter().any(|damage| damage.cut) {
        damage.push(JournalDamage {
            offset: written_end.min(length),
            end: capacity.unwrap_or(length),
            tag: None,
            cut: true,
            detail: format!(
                "the file is truncated to {length} bytes of {}; records after offset {} may be \
                 lost",
                capacity.unwrap_or(0),
                written_end.min(length)
            ),
        });
    }
    if !damage.is_empty() && prefix > records.len() {
        prefix = records.len();
    }
    Ok(JournalScan {
        name,
        generation,
        length,
        header_damaged: capacity.is_none(),
        records,
        prefix,
        damage,
        end,
        file,
    })
}

/// The intact record at `at`, if there is one: its header is checked before the rest is read.
fn read_record(window: &mut Window<'_>, generation: u64, at: u64) -> Result<Option<ScannedRecord>> {
    if at >= window.length {
        return Ok(None);
    }
    let Some((length, _, _)) =
        decode_header(generation, at, window.get(at, RECORD_HEADER_BYTES as u64)?)
    else {
        return Ok(None);
    };
    let total = (RECORD_OVERHEAD_BYTES + length as usize) as u64;
    Ok(decode_record(generation, at, window.get(at, total)?))
}

/// Finds where a bad record at `offset` ends: the next intact record within reach, or the end
/// of the written part; and its tag from whichever of its header and footer is intact.
fn bad_region(
    window: &mut Window<'_>,
    generation: u64,
    offset: u64,
    claimed: Option<u64>,
) -> Result<BadRegion> {
    let length = window.length;
    let header_tag =
        decode_header(generation, offset, window.get(offset, 32)?).map(|(_, _, tag)| tag);
    let past_end = claimed.is_some_and(|bytes| offset + bytes > length);
    // The next intact record: where the claimed length says, else the first offset that
    // holds one.
    let mut next = None;
    if let Some(bytes) = claimed.filter(|_| !past_end) {
        if read_record(window, generation, offset + bytes)?.is_some() {
            next = Some(offset + bytes);
        }
    }
    if next.is_none() {
        let limit = (offset + RECORD_TOTAL_MAX).min(length);
        let mut candidate = offset + 1;
        while candidate + RECORD_OVERHEAD_BYTES as u64 <= limit {
            if read_record(window, generation, candidate)?.is_some() {
                next = Some(candidate);
                break;
            }
            candidate += 1;
        }
    }
    let end = match next {
        Some(next) => next,
        None => written_end(window, offset)?,
    };
    let needed_end = offset + claimed.unwrap_or(RECORD_OVERHEAD_BYTES as u64);
    // The footer sits right before the next record when the damage is inside one record.
    let footer_tag = (end >= offset + RECORD_OVERHEAD_BYTES as u64)
        .then(|| -> Result<Option<RecordTag>> {
            let footer =
                window.get(end - RECORD_FOOTER_BYTES as u64, RECORD_FOOTER_BYTES as u64)?;
            Ok(decode_footer(generation, footer).map(|(tag, _)| tag))
        })
        .transpose()?
        .flatten();
    Ok(BadRegion {
        offset,
        end,
        tag: header_tag.or(footer_tag),
        past_end,
        needed_end,
        resynchronised: next.is_some(),
    })
}

/// The end of the written part from `offset`: just past the last non-zero byte before an
/// aligned run of [`ZERO_RUN_BYTES`] zeros (or the end of the file).
fn written_end(window: &mut Window<'_>, offset: u64) -> Result<u64> {
    let length = window.length;
    let mut last_nonzero = offset;
    let mut position = offset;
    while position < length {
        let run_end = ((position / ZERO_RUN_BYTES) + 1) * ZERO_RUN_BYTES;
        let bytes = window.get(position, run_end - position)?;
        match bytes.iter().rposition(|&byte| byte != 0) {
            Some(at) => last_nonzero = position + at as u64 + 1,
            None if position > offset => break,
            None => {}
        }
        position = run_end.min(length);
    }
    Ok(last_nonzero)
}

/// True when some 512-byte sector overlapping the region reads as zeros within it (at least
/// [`TORN_SECTOR_BYTES_MIN`] bytes of it): a sector of an unsynced write that never reached
/// the media.
fn has_zero_sector(window: &mut Window<'_>, region: &BadRegion) -> Result<bool> {
    let mut sector = region.offset - region.offset % SECTOR_BYTES;
    while sector < region.end {
        let from = sector.max(region.offset);
        let to = (sector + SECTOR_BYTES).min(region.end);
        if to - from >= TORN_SECTOR_BYTES_MIN
            && window.get(from, to - from)?.iter().all(|&byte| byte == 0)
        {
            return Ok(true);
        }
        sector += SECTOR_BYTES;
    }
    Ok(false)
}

#[cfg(test)]
mod tests;
