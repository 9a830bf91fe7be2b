//! The journal: a redo log of metadata changes between checkpoints.
//!
//! Owners of a [`PageStore`](crate::pages::PageStore) change pages in memory and append a
//! record describing each change here. `sync` makes the records durable (this is what an NBD
//! FLUSH waits for); a checkpoint makes the pages durable and starts a new journal
//! *generation*, after which the old journal file is removed. After a crash the owner reopens
//! the page store (the last checkpoint) and replays the records of the generation that
//! checkpoint names.
//!
//! Format of `journal-<generation as 16 hex digits>`: a sequence of records, each
//! `length: u32 LE | crc: u32 LE | payload[length]`, where `crc` is CRC-32C over the generation
//! (u64 LE), the length and the payload. Replay stops at the first record that is truncated or
//! fails its checksum: that is the torn tail of the last unsynced write, and everything after
//! it was never acknowledged as durable. Including the generation in the checksum keeps
//! records of an older file from ever being replayed under a newer generation.

use std::sync::Arc;

use crate::storage::{join, Storage, StorageFile};
use crate::{Error, Result};

/// Bytes before each payload: length and checksum.
const RECORD_HEADER_BYTES: usize = 8;
/// Largest record payload; larger lengths in a file are treated as a torn tail.
pub const RECORD_BYTES_MAX: usize = 64 << 20;
/// Buffered bytes that trigger a write to the file even without a sync.
const BUFFER_BYTES_LIMIT: usize = 1 << 20;
/// Bytes read at a time during replay.
const REPLAY_READ_BYTES: usize = 1 << 20;

/// What the replay callback wants next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplayControl {
    /// Apply the next record too.
    Continue,
    /// This record must not be applied (for example, data it refers to never reached the
    /// media): treat it and everything after it as the torn tail.
    Stop,
}

/// What a replay found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplaySummary {
    /// Valid records replayed.
    pub records: u64,
    /// Bytes of valid records.
    pub bytes: u64,
    /// Bytes after the last valid record (a torn tail), discarded.
    pub discarded_bytes: u64,
}

/// An open journal generation, positioned for appending.
#[derive(Debug)]
pub struct Journal {
    storage: Arc<dyn Storage>,
    directory: String,
    generation: u64,
    file: Arc<dyn StorageFile>,
    /// Records appended but not yet written to the file.
    buffer: Vec<u8>,
    /// Bytes of valid records in the file.
    file_bytes: u64,
    /// Bytes known durable (synced).
    synced_bytes: u64,
}

impl Journal {
    /// The file name of a generation.
    pub fn file_name(directory: &str, generation: u64) -> String {
        join(directory, &format!("journal-{generation:016x}"))
    }

    /// Opens generation `generation` (creating it if missing), calls `replay` with each valid
    /// record in order until it answers [`ReplayControl::Stop`], discards the rest as a torn
    /// tail, and removes journal files of every other generation in `directory`.
    pub fn open(
        storage: Arc<dyn Storage>,
        directory: &str,
        generation: u64,
        mut replay: impl FnMut(&[u8]) -> Result<ReplayControl>,
    ) -> Result<(Journal, ReplaySummary)> {
        let name = Self::file_name(directory, generation);
        let existed = storage.exists(&name)?;
        let file = storage.open(&name, true)?;
        if !existed {
            storage.sync_directory(directory)?;
        }
        let summary = replay_file(file.as_ref(), generation, &mut replay)?;
        if summary.discarded_bytes > 0 {
            file.set_len(summary.bytes)?;
        }
        for stale in storage.list(directory)? {
            let is_journal = stale
                .rsplit('/')
                .next()
                .is_some_and(|base| base.starts_with("journal-"));
            if is_journal && stale != name {
                storage.remove(&stale)?;
            }
        }
        Ok((
            Journal {
                storage,
                directory: directory.to_string(),
                generation,
                file,
                buffer: Vec::new(),
                file_bytes: summary.bytes,
                synced_bytes: summary.bytes,
            },
            summary,
        ))
    }

    /// The current generation.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Appends a record (buffered in memory; durable after [`sync`](Journal::sync)).
    pub fn append(&mut self, payload: &[u8]) -> Result<()> {
        if payload.len() > RECORD_BYTES_MAX {
            return Err(Error::Limit(format!(
                "journal record of {} bytes exceeds the {RECORD_BYTES_MAX}-byte limit",
                payload.len()
            )));
        }
        let length = (payload.len() as u32).to_le_bytes();
        let mut crc = crc32c::crc32c(&self.generation.to_le_bytes());
        crc = crc32c::crc32c_append(crc, &length);
        crc = crc32c::crc32c_append(crc, payload);
        self.buffer.extend_from_slice(&length);
        self.buffer.extend_from_slice(&crc.to_le_bytes());
        self.buffer.extend_from_slice(payload);
        if self.buffer.len() >= BUFFER_BYTES_LIMIT {
            self.write_buffered()?;
        }
        Ok(())
    }

    /// Writes buffered records to the file without syncing.
    pub fn write_buffered(&mut self) -> Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        self.file.write_at(self.file_bytes, &self.buffer)?;
        self.file_bytes += self.buffer.len() as u64;
        self.buffer.clear();
        Ok(())
    }

    /// Makes every appended record durable.
    pub fn sync(&mut self) -> Result<()> {
        self.write_buffered()?;
        if self.synced_bytes != self.file_bytes {
            self.file.sync_data()?;
            self.synced_bytes = self.file_bytes;
        }
        Ok(())
    }

    /// True when records were appended since the last sync.
    pub fn has_unsynced(&self) -> bool {
        !self.buffer.is_empty() || self.synced_bytes != self.file_bytes
    }

    /// Bytes of records in this generation, buffered ones included.
    pub fn bytes(&self) -> u64 {
        self.file_bytes + self.buffer.len() as u64
    }

    /// Starts generation `generation + 1` in a new, durably named, empty file and returns the
    /// old generation. Records appended before are dropped from memory: call this only right
    /// before a checkpoint that covers them, and remove the old file with
    /// [`remove_generation`](Journal::remove_generation) after the checkpoint is durable.
    pub fn rotate(&mut self) -> Result<u64> {
        let old = self.generation;
        let next = old + 1;
        let name = Self::file_name(&self.directory, next);
        self.storage.remove(&name)?;
        let file = self.storage.open(&name, true)?;
        self.storage.sync_directory(&self.directory)?;
        self.file = file;
        self.generation = next;
        self.buffer.clear();
        self.file_bytes = 0;
        self.synced_bytes = 0;
        Ok(old)
    }

    /// Removes the file of an old generation (after the checkpoint that replaced it).
    pub fn remove_generation(&self, generation: u64) -> Result<()> {
        assert_ne!(
            generation, self.generation,
            "the live journal is never removed"
        );
        self.storage
            .remove(&Self::file_name(&self.directory, generation))
    }
}

fn replay_file(
    file: &dyn StorageFile,
    generation: u64,
    replay: &mut dyn FnMut(&[u8]) -> Result<ReplayControl>,
) -> Result<ReplaySummary> {
    let file_length = file.len()?;
    let mut summary = ReplaySummary::default();
    let mut offset = 0u64;
    let mut window: Vec<u8> = Vec::new();
    let mut window_start = 0u64;
    // Reads [start, start + length) through a sliding window so large journals stream.
    let fetch = |start: u64, length: usize, window: &mut Vec<u8>, window_start: &mut u64| {
        let have_end = *window_start + window.len() as u64;
        if start >= *window_start && start + length as u64 <= have_end {
            return Ok::<bool, Error>(true);
        }
        if start + length as u64 > file_length {
            return Ok(false);
        }
        let read_length = (length.max(REPLAY_READ_BYTES) as u64).min(file_length - start);
        window.resize(read_length as usize, 0);
        file.read_at(start, window)?;
        *window_start = start;
        Ok(true)
    };
    loop {
        if !fetch(offset, RECORD_HEADER_BYTES, &mut window, &mut window_start)? {
            break;
        }
        let at = (offset - window_start) as usize;
        let length_bytes: [u8; 4] = window[at..at + 4].try_into().expect("4 bytes");
        let length = u32::from_le_bytes(length_bytes) as usize;
        let crc = u32::from_le_bytes(window[at + 4..at + 8].try_into().expect("4 bytes"));
        if length > RECORD_BYTES_MAX {
            break;
        }
        let total = RECORD_HEADER_BYTES + length;
        if !fetch(offset, total, &mut window, &mut window_start)? {
            break;
        }
        let at = (offset - window_start) as usize;
        let payload = &window[at + RECORD_HEADER_BYTES..at + total];
        let mut expected = crc32c::crc32c(&generation.to_le_bytes());
        expected = crc32c::crc32c_append(expected, &length_bytes);
        expected = crc32c::crc32c_append(expected, payload);
        if expected != crc {
            break;
        }
        if replay(payload)? == ReplayControl::Stop {
            break;
        }
        summary.records += 1;
        offset += total as u64;
    }
    summary.bytes = offset;
    summary.discarded_bytes = file_length - offset;
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{CrashMode, SimulatedStorage};

    fn records(storage: &Arc<dyn Storage>, generation: u64) -> (Vec<Vec<u8>>, ReplaySummary) {
        let mut seen = Vec::new();
        let (_, summary) = Journal::open(storage.clone(), "j", generation, |payload| {
            seen.push(payload.to_vec());
            Ok(ReplayControl::Continue)
        })
        .unwrap();
        (seen, summary)
    }

    /// Goal: synced records replay in order, across reopen and rotation.
    #[test]
    fn records_replay_in_order() {
        let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
        let (mut journal, _) =
            Journal::open(storage.clone(), "j", 7, |_| Ok(ReplayControl::Continue)).unwrap();
        for index in 0..100u32 {
            journal
                .append(&index.to_le_bytes().repeat(index as usize))
                .unwrap();
        }
        journal.sync().unwrap();
        let (seen, summary) = records(&storage, 7);
        assert_eq!(seen.len(), 100);
        assert_eq!(summary.discarded_bytes, 0);
        assert_eq!(seen[3], 3u32.to_le_bytes().repeat(3));

        let (mut journal, _) =
            Journal::open(storage.clone(), "j", 7, |_| Ok(ReplayControl::Continue)).unwrap();
        let old = journal.rotate().unwrap();
        journal.append(b"next").unwrap();
        journal.sync().unwrap();
        journal.remove_generation(old).unwrap();
        let (seen, _) = records(&storage, 8);
        assert_eq!(seen, vec![b"next".to_vec()]);
        assert_eq!(storage.list("j").unwrap(), vec![Journal::file_name("j", 8)]);
    }

    /// Goal: after torn crashes the replay is always a prefix of the appended records that
    /// includes every record synced before the crash.
    #[test]
    fn torn_tail_is_a_prefix_and_keeps_synced_records() {
        for seed in 0..50 {
            let storage = SimulatedStorage::new();
            let shared: Arc<dyn Storage> = Arc::new(storage.clone());
            let (mut journal, _) =
                Journal::open(shared, "j", 1, |_| Ok(ReplayControl::Continue)).unwrap();
            let mut appended = Vec::new();
            for index in 0..40u64 {
                let payload = vec![index as u8; 300 + (index as usize * 37) % 900];
                journal.append(&payload).unwrap();
                appended.push(payload);
                if index == 19 {
                    journal.sync().unwrap();
                }
            }
            journal.write_buffered().unwrap();
            let after: Arc<dyn Storage> = Arc::new(storage.crash(CrashMode::Torn { seed }));
            let (seen, summary) = records(&after, 1);
            assert!(seen.len() >= 20, "synced records survive");
            assert_eq!(seen[..], appended[..seen.len()], "replay is a prefix");
            // Replay truncated the torn tail; reopening again finds the same records, clean.
            let (again, summary_again) = records(&after, 1);
            assert_eq!(again.len(), seen.len());
            assert_eq!(summary_again.discarded_bytes, 0);
            assert_eq!(summary_again.bytes, summary.bytes);
        }
    }

    /// Goal: records of one generation never replay under another.
    #[test]
    fn generation_is_part_of_the_checksum() {
        let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
        let (mut journal, _) =
            Journal::open(storage.clone(), "j", 1, |_| Ok(ReplayControl::Continue)).unwrap();
        journal.append(b"old").unwrap();
        journal.sync().unwrap();
        storage
            .rename(&Journal::file_name("j", 1), &Journal::file_name("j", 2))
            .unwrap();
        let (seen, summary) = records(&storage, 2);
        assert!(seen.is_empty());
        assert!(summary.discarded_bytes > 0);
    }
}
