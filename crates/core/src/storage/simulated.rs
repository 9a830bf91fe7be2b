//! [`SimulatedStorage`]: an in-memory storage that models power loss.
//!
//! Every file keeps a *live* image (what reads see) and a *durable* image (what survives a
//! crash); `sync_data` copies live to durable for one file, `sync_directory` does the same for
//! the names in one directory. A test arms a crash after the Nth sync, runs the engine until it
//! fails, then calls [`SimulatedStorage::crash`] to get the storage as a rebooted machine would
//! find it, reopens the engine on it and compares with a reference model. This is the method
//! of redb's crash tests, extended with torn writes: in [`CrashMode::Torn`] every 512-byte
//! sector of every unsynced write independently may or may not have reached the media.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::sync::Arc;

use parking_lot::Mutex;

use super::{check_name, parent_directory, Storage, StorageFile};
use crate::{Error, Result};

/// The unit a disk writes atomically.
const SECTOR_BYTES: u64 = 512;

/// What survives a simulated crash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashMode {
    /// Exactly the synced state.
    Clean,
    /// The synced state plus a random subset of the sectors written since (seeded, so a failing
    /// case can be replayed).
    Torn { seed: u64 },
}

type FileId = u64;

#[derive(Debug, Clone)]
enum UnsyncedChange {
    Write { offset: u64, data: Vec<u8> },
    SetLength(u64),
}

#[derive(Debug, Default, Clone)]
struct FileState {
    live: Vec<u8>,
    durable: Vec<u8>,
    unsynced: Vec<UnsyncedChange>,
}

#[derive(Debug, Default)]
struct State {
    files: HashMap<FileId, FileState>,
    live_names: BTreeMap<String, FileId>,
    durable_names: BTreeMap<String, FileId>,
    file_id_next: FileId,
    syncs_until_crash: Option<u64>,
    crashed: bool,
    syncs: u64,
    /// Bytes the live files may hold in all; a write past it fails as a full disk.
    capacity: Option<u64>,
}

impl State {
    fn check_running(&self) -> Result<()> {
        if self.crashed {
            Err(Error::io(
                "simulated storage",
                io::Error::other("simulated power loss: the machine is down"),
            ))
        } else {
            Ok(())
        }
    }

    /// Bytes held by the files that have names.
    fn used_bytes(&self) -> u64 {
        self.live_names
            .values()
            .map(|id| self.files[id].live.len() as u64)
            .sum()
    }

    /// Fails as a full disk when growing file `id` to `length` bytes passes the capacity.
    fn check_room(&self, id: FileId, length: u64) -> Result<()> {
        let Some(capacity) = self.capacity else {
            return Ok(());
        };
        let current = self.files[&id].live.len() as u64;
        if length > current && self.used_bytes() + (length - current) > capacity {
            return Err(Error::io(
                "simulated storage",
                io::Error::from_raw_os_error(libc::ENOSPC),
            ));
        }
        Ok(())
    }

    /// Counts a sync; the sync that uses up the budget still completes, then the machine dies.
    fn count_sync(&mut self) {
        self.syncs += 1;
        if let Some(left) = self.syncs_until_crash.as_mut() {
            *left = left.saturating_sub(1);
            if *left == 0 {
                self.crashed = true;
            }
        }
    }
}

/// In-memory storage with a durable image; see the module documentation.
#[derive(Debug, Clone, Default)]
pub struct SimulatedStorage {
    state: Arc<Mutex<State>>,
}

impl SimulatedStorage {
    /// An empty storage that never crashes until armed.
    pub fn new() -> Self {
        Self::default()
    }

    /// Arms a crash: after `syncs` more successful syncs (`sync_data` or `sync_directory`),
    /// every operation fails as if power was lost.
    pub fn crash_after_syncs(&self, syncs: u64) {
        assert!(syncs > 0, "a crash needs at least one sync to follow");
        self.state.lock().syncs_until_crash = Some(syncs);
    }

    /// Limits the bytes all files may hold (`None`: no limit); writes past it fail as a full
    /// disk does.
    pub fn set_capacity(&self, capacity: Option<u64>) {
        self.state.lock().capacity = capacity;
    }

    /// Syncs performed so far (to size the crash points of a test).
    pub fn sync_count(&self) -> u64 {
        self.state.lock().syncs
    }

    /// True once the armed crash has happened.
    pub fn is_crashed(&self) -> bool {
        self.state.lock().crashed
    }

    /// The storage a rebooted machine would find: durable names and contents, plus (in
    /// [`CrashMode::Torn`]) a random subset of unsynced sectors. The result is independent of
    /// `self` and not armed.
    pub fn crash(&self, mode: CrashMode) -> SimulatedStorage {
        let state = self.state.lock();
        let mut random = match mode {
            CrashMode::Clean => None,
            CrashMode::Torn { seed } => Some(SplitMix64(seed)),
        };
        let mut files = HashMap::new();
        for (&id, file) in &state.files {
            let mut image = file.durable.clone();
            if let Some(random) = random.as_mut() {
                for change in &file.unsynced {
                    apply_torn(&mut image, change, random);
                }
            }
            files.insert(
                id,
                FileState {
                    live: image.clone(),
                    durable: image,
                    unsynced: Vec::new(),
                },
            );
        }
        let names = state.durable_names.clone();
        SimulatedStorage {
            state: Arc::new(Mutex::new(State {
                files,
                live_names: names.clone(),
                durable_names: names,
                file_id_next: state.file_id_next,
                syncs_until_crash: None,
                crashed: false,
                syncs: 0,
                capacity: state.capacity,
            })),
        }
    }
}

fn apply_torn(image: &mut Vec<u8>, change: &UnsyncedChange, random: &mut SplitMix64) {
    match change {
        UnsyncedChange::SetLength(length) => {
            if random.next().is_multiple_of(2) {
                image.resize(*length as usize, 0);
            }
        }
        UnsyncedChange::Write { offset, data } => {
            let end = offset + data.len() as u64;
            let mut sector_start = offset - offset % SECTOR_BYTES;
            while sector_start < end {
                let from = sector_start.max(*offset);
                let to = (sector_start + SECTOR_BYTES).min(end);
                if random.next().is_multiple_of(2) {
                    if image.len() < to as usize {
                        image.resize(to as usize, 0);
                    }
                    image[from as usize..to as usize]
                        .copy_from_slice(&data[(from - offset) as usize..(to - offset) as usize]);
                }
                sector_start += SECTOR_BYTES;
            }
        }
    }
}

/// A small deterministic generator, so crash images can be replayed from a seed.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

impl Storage for SimulatedStorage {
    fn open(&self, name: &str, create: bool) -> Result<Arc<dyn StorageFile>> {
        check_name(name)?;
        let mut state = self.state.lock();
        state.check_running()?;
        let id = match state.live_names.get(name) {
            Some(&id) => id,
            None if create => {
                let id = state.file_id_next;
                state.file_id_next += 1;
                state.files.insert(id, FileState::default());
                state.live_names.insert(name.to_string(), id);
                id
            }
            None => return Err(Error::NotFound(format!("file {name} (simulated)"))),
        };
        Ok(Arc::new(SimulatedFile {
            state: Arc::clone(&self.state),
            id,
            name: name.to_string(),
        }))
    }

    fn exists(&self, name: &str) -> Result<bool> {
        check_name(name)?;
        Ok(self.state.lock().live_names.contains_key(name))
    }

    fn remove(&self, name: &str) -> Result<()> {
        check_name(name)?;
        let mut state = self.state.lock();
        state.check_running()?;
        state.live_names.remove(name);
        Ok(())
    }

    fn rename(&self, from: &str, to: &str) -> Result<()> {
        check_name(from)?;
        check_name(to)?;
        let mut state = self.state.lock();
        state.check_running()?;
        let id = state
            .live_names
            .remove(from)
            .ok_or_else(|| Error::NotFound(format!("file {from} (simulated)")))?;
        state.live_names.insert(to.to_string(), id);
        Ok(())
    }

    fn list(&self, directory: &str) -> Result<Vec<String>> {
        if !directory.is_empty() {
            check_name(directory)?;
        }
        let state = self.state.lock();
        Ok(state
            .live_names
            .keys()
            .filter(|name| parent_directory(name) == directory)
            .cloned()
            .collect())
    }

    fn sync_directory(&self, directory: &str) -> Result<()> {
        let mut state = self.state.lock();
        state.check_running()?;
        let state = &mut *state;
        state
            .durable_names
            .retain(|name, _| parent_directory(name) != directory);
        for (name, &id) in &state.live_names {
            if parent_directory(name) == directory {
                state.durable_names.insert(name.clone(), id);
            }
        }
        state.count_sync();
        Ok(())
    }

    fn describe(&self) -> String {
        "simulated storage".to_string()
    }

    fn available_bytes(&self) -> Result<Option<u64>> {
        let state = self.state.lock();
        Ok(state
            .capacity
            .map(|capacity| capacity.saturating_sub(state.used_bytes())))
    }
}

#[derive(Debug)]
struct SimulatedFile {
    state: Arc<Mutex<State>>,
    id: FileId,
    name: String,
}

impl SimulatedFile {
    fn with_file<T>(&self, action: impl FnOnce(&mut FileState) -> Result<T>) -> Result<T> {
        let mut state = self.state.lock();
        state.check_running()?;
        let file = state
            .files
            .get_mut(&self.id)
            .expect("open files are never dropped");
        action(file)
    }
}

impl StorageFile for SimulatedFile {
    fn len(&self) -> Result<u64> {
        self.with_file(|file| Ok(file.live.len() as u64))
    }

    fn read_at(&self, offset: u64, buffer: &mut [u8]) -> Result<()> {
        self.with_file(|file| {
            let end = offset
                .checked_add(buffer.len() as u64)
                .filter(|&end| end <= file.live.len() as u64)
                .ok_or_else(|| {
                    Error::corrupt(
                        format!("file {} (simulated)", self.name),
                        format!("{} bytes at offset {offset} lie past its end", buffer.len()),
                    )
                })?;
            buffer.copy_from_slice(&file.live[offset as usize..end as usize]);
            Ok(())
        })
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.state
            .lock()
            .check_room(self.id, offset + data.len() as u64)?;
        self.with_file(|file| {
            let end = (offset + data.len() as u64) as usize;
            if file.live.len() < end {
                file.live.resize(end, 0);
            }
            file.live[offset as usize..end].copy_from_slice(data);
            file.unsynced.push(UnsyncedChange::Write {
                offset,
                data: data.to_vec(),
            });
            Ok(())
        })
    }

    fn set_len(&self, length: u64) -> Result<()> {
        self.state.lock().check_room(self.id, length)?;
        self.with_file(|file| {
            file.live.resize(length as usize, 0);
            file.unsynced.push(UnsyncedChange::SetLength(length));
            Ok(())
        })
    }

    fn sync_data(&self) -> Result<()> {
        let mut state = self.state.lock();
        state.check_running()?;
        let file = state
            .files
            .get_mut(&self.id)
            .expect("open files are never dropped");
        file.durable = file.live.clone();
        file.unsynced.clear();
        state.count_sync();
        Ok(())
    }

    fn name(&self) -> &str {
        &self.name
    }
}
