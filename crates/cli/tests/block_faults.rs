//! Fault injection into every file of the block device, against the real `onecopy` binary.
//!
//! Terms:
//! - *model*: what each volume must hold (a byte vector per volume), kept by the test.
//! - *lost blocks*: blocks whose data the fault destroyed; computed by the test from what it
//!   damaged (a map page's 512 blocks, the blocks using the chunks of a chunk-table page or of
//!   a container's damaged bytes, the block range of a damaged journal record).
//! - *unknown losses*: writes the fault destroyed without leaving a trace of which blocks
//!   they wrote (a deleted journal, records after a truncation); their blocks may read the
//!   content they had before those writes, and the report must say "blocks unknown".
//!
//! Method: one repository is prepared per test function: two volumes of 8 MiB written through
//! NBD with known data (one volume shares 512 blocks with the other, 512 of its blocks stay
//! zero), stopped cleanly; for journal cases, 8 more writes of 256 KiB, each flushed, then
//! kill -9. Each case copies that repository, damages one file or metadata area (flips a byte,
//! truncates or deletes it) and then checks the contract:
//!
//! 1. `onecopy check --json` (with `--read-data` where only the data shows the damage) exits 1
//!    and names the damaged object, and the blocks it reports lost are exactly the lost blocks;
//! 2. `onecopy serve` refuses to start when the damage loses acknowledged writes (naming the
//!    file), and otherwise serves: every block reads the model's bytes or fails with EIO, and
//!    exactly the lost blocks fail;
//! 3. `onecopy check --repair --read-data --json` exits 3 when blocks are lost (0 when not),
//!    and reports exactly the lost blocks;
//! 4. served again, every block that is not lost equals the model byte for byte and every
//!    lost block fails with EIO; `check` exits 3 naming the recorded losses; writing the lost
//!    blocks again makes `check` clean.
//!
//! Deterministic: the data is seeded, requests are sent one at a time (so chunk ids follow the
//! write order), and the fault offsets are fixed.

mod block_support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use block_support::nbd_client::{NbdClient, COMMAND_FLUSH, COMMAND_READ, COMMAND_WRITE};
use block_support::{pattern, ServeProcess, TestRepository, MIB};
use serde_json::Value;

const BLOCK_BYTES: u64 = 4096;
const VOLUME_BYTES: u64 = 8 * MIB;
const BLOCKS: u64 = VOLUME_BYTES / BLOCK_BYTES;
/// The volumes, in creation order (their ids are 1 and 2).
const VOLUMES: [&str; 2] = ["disk", "other"];
/// Map entries per metadata page: a damaged map page loses this many blocks.
const MAP_ENTRIES_PER_PAGE: u64 = 512;
/// Chunk records per metadata page.
const CHUNK_RECORDS_PER_PAGE: u64 = 64;
const PAGE_BYTES: u64 = 4096;
/// Blocks per verification read; a failed read is retried block by block.
const READ_BLOCKS: u64 = 64;
/// The NBD error of a read that fails.
const EIO: u32 = 5;
/// Flushed writes of the journal cases, and their size.
const JOURNAL_WRITES: usize = 8;
const JOURNAL_WRITE_BLOCKS: u64 = 64;
/// How long a server that must refuse to start may take to exit.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(60);

// Container format (docs/DESIGN.md): header, records of a 52-byte header and the stored bytes,
// then for a sealed container a trailer and a 32-byte footer.
const CONTAINER_HEADER_BYTES: u64 = 64;
const CHUNK_HEADER_BYTES: u64 = 52;
const FOOTER_BYTES: u64 = 32;
// Journal format: a 64-byte file header, records of a 32-byte header, the payload and a
// 32-byte footer; the header holds the payload length and the tag (volume, first block,
// block count).
const JOURNAL_HEADER_BYTES: u64 = 64;
const RECORD_HEADER_BYTES: u64 = 32;
const RECORD_OVERHEAD_BYTES: u64 = 64;

const _: () = assert!(VOLUME_BYTES.is_multiple_of(READ_BLOCKS * BLOCK_BYTES));
const _: () = assert!(BLOCKS.is_multiple_of(MAP_ENTRIES_PER_PAGE));

type Volumes = BTreeMap<String, Vec<u8>>;
/// Blocks by volume name.
type Blocks = BTreeMap<String, BTreeSet<u64>>;

// ---------------------------------------------------------------------------------------------
// Preparation

/// A flushed write made after the last checkpoint (the journal cases).
#[derive(Clone, Debug)]
struct Write {
    volume: &'static str,
    first_block: u64,
    blocks: u64,
}

/// A prepared repository and what it must hold.
struct Prepared {
    repository: TestRepository,
    model: Volumes,
    /// The volumes before `writes`.
    before: Volumes,
    /// Writes acknowledged as durable since the last checkpoint, in journal order.
    writes: Vec<Write>,
}

fn block_of<'a>(volumes: &'a Volumes, volume: &str, block: u64) -> &'a [u8] {
    let start = (block * BLOCK_BYTES) as usize;
    &volumes[volume][start..start + BLOCK_BYTES as usize]
}

/// The data of the stopped repository: `disk` unique everywhere; `other` shares its first 512
/// blocks with `disk`, leaves the next 512 zero, and is unique after.
fn initial_volumes() -> Volumes {
    let disk: Vec<u8> = (0..BLOCKS)
        .flat_map(|block| pattern(BLOCK_BYTES as usize, 1_000_000 + block))
        .collect();
    let mut other = vec![0u8; VOLUME_BYTES as usize];
    other[..(512 * BLOCK_BYTES) as usize].copy_from_slice(&disk[..(512 * BLOCK_BYTES) as usize]);
    for block in 1024..BLOCKS {
        let start = (block * BLOCK_BYTES) as usize;
        other[start..start + BLOCK_BYTES as usize]
            .copy_from_slice(&pattern(BLOCK_BYTES as usize, 2_000_000 + block));
    }
    VOLUMES
        .iter()
        .map(|name| name.to_string())
        .zip([disk, other])
        .collect()
}

/// Two volumes written with `initial_volumes` and stopped cleanly (a checkpoint holds it all).
fn prepare_stopped() -> Prepared {
    let repository = TestRepository::new();
    for name in VOLUMES {
        repository.create_volume(name, "8MiB");
    }
    let model = initial_volumes();
    let server = repository.serve(&[]);
    for name in VOLUMES {
        let mut client = connect(&server, name);
        let data = &model[name];
        for offset in (0..VOLUME_BYTES).step_by(MIB as usize) {
            let piece = &data[offset as usize..(offset + MIB) as usize];
            if piece.iter().any(|&byte| byte != 0) {
                write(&mut client, offset, piece);
            }
        }
        flush(&mut client);
    }
    server.stop();
    Prepared {
        repository,
        before: model.clone(),
        model,
        writes: Vec::new(),
    }
}

/// The stopped repository, then `JOURNAL_WRITES` writes of new data, each flushed, then
/// kill -9: the writes live only in the journal.
fn prepare_killed() -> Prepared {
    let mut prepared = prepare_stopped();
    let writes: Vec<Write> = (0..JOURNAL_WRITES as u64)
        .map(|index| Write {
            volume: if index < 6 { "disk" } else { "other" },
            first_block: if index < 6 {
                100 + 200 * index
            } else {
                1100 + 300 * (index - 6)
            },
            blocks: JOURNAL_WRITE_BLOCKS,
        })
        .collect();
    let server = prepared.repository.serve(&[]);
    for (index, planned) in writes.iter().enumerate() {
        let data: Vec<u8> = (0..planned.blocks)
            .flat_map(|block| {
                pattern(
                    BLOCK_BYTES as usize,
                    3_000_000 + 1000 * index as u64 + block,
                )
            })
            .collect();
        let mut client = connect(&server, planned.volume);
        let offset = planned.first_block * BLOCK_BYTES;
        write(&mut client, offset, &data);
        flush(&mut client);
        let model = prepared.model.get_mut(planned.volume).expect("volume");
        model[offset as usize..offset as usize + data.len()].copy_from_slice(&data);
    }
    server.kill();
    prepared.writes = writes;
    prepared
}

// ---------------------------------------------------------------------------------------------
// NBD

fn connect(server: &ServeProcess, volume: &str) -> NbdClient {
    NbdClient::connect(server.socket(), volume)
        .unwrap_or_else(|error| panic!("connecting to volume {volume}: {error}"))
}

fn write(client: &mut NbdClient, offset: u64, data: &[u8]) {
    client
        .send(COMMAND_WRITE, 0, 1, offset, data.len() as u32, data)
        .expect("sending a write");
    let reply = client.receive().expect("write reply");
    assert_eq!(reply.error, 0, "write of {} bytes at {offset}", data.len());
}

fn flush(client: &mut NbdClient) {
    client
        .send(COMMAND_FLUSH, 0, 2, 0, 0, &[])
        .expect("sending a flush");
    let reply = client.receive().expect("flush reply");
    assert_eq!(reply.error, 0, "flush");
}

/// Reads `count` blocks from `first`; `Err(error)` is the NBD error of a failed read.
fn read(client: &mut NbdClient, first: u64, count: u64) -> Result<Vec<u8>, u32> {
    let length = (count * BLOCK_BYTES) as u32;
    client
        .send(COMMAND_READ, 0, 3, first * BLOCK_BYTES, length, &[])
        .expect("sending a read");
    let reply = client.receive().expect("read reply");
    if reply.error == 0 {
        Ok(reply.data)
    } else {
        Err(reply.error)
    }
}

/// Every block of every volume: its bytes, or `None` when the read failed with EIO (any
/// other error fails the test).
fn read_everything(server: &ServeProcess) -> BTreeMap<String, Vec<Option<Vec<u8>>>> {
    let mut volumes = BTreeMap::new();
    for name in VOLUMES {
        let mut client = connect(server, name);
        let mut blocks = Vec::with_capacity(BLOCKS as usize);
        for first in (0..BLOCKS).step_by(READ_BLOCKS as usize) {
            match read(&mut client, first, READ_BLOCKS) {
                Ok(data) => blocks.extend(
                    data.chunks(BLOCK_BYTES as usize)
                        .map(|block| Some(block.to_vec())),
                ),
                Err(_) => {
                    for block in first..first + READ_BLOCKS {
                        blocks.push(match read(&mut client, block, 1) {
                            Ok(data) => Some(data),
                            Err(error) => {
                                assert_eq!(
                                    error, EIO,
                                    "block {block} of volume {name}: a failed read is EIO"
                                );
                                None
                            }
                        });
                    }
                }
            }
        }
        volumes.insert(name.to_string(), blocks);
    }
    volumes
}

/// Asserts that no read returned wrong data with success and that the blocks that failed are
/// exactly `failing`: every other block equals the model, or (for blocks of `may_revert`) the
/// content it had before the writes lost without a trace.
fn verify_reads(
    case: &str,
    prepared: &Prepared,
    read: &BTreeMap<String, Vec<Option<Vec<u8>>>>,
    failing: &Blocks,
    may_revert: &Blocks,
) {
    let mut failed = Blocks::new();
    for (name, blocks) in read {
        for (block, data) in blocks.iter().enumerate() {
            let block = block as u64;
            let Some(data) = data else {
                failed.entry(name.clone()).or_default().insert(block);
                continue;
            };
            let expected = block_of(&prepared.model, name, block);
            let reverted = may_revert.get(name).is_some_and(|set| set.contains(&block))
                && data[..] == *block_of(&prepared.before, name, block);
            assert!(
                data[..] == *expected || reverted,
                "{case}: block {block} of volume {name} read other bytes with success"
            );
        }
    }
    assert_eq!(
        &failed, failing,
        "{case}: the blocks whose reads fail are exactly the lost ones"
    );
}

/// Writes the model's bytes to `blocks` again and flushes.
fn rewrite(server: &ServeProcess, prepared: &Prepared, blocks: &Blocks) {
    for (name, set) in blocks {
        let mut client = connect(server, name);
        for &block in set {
            write(
                &mut client,
                block * BLOCK_BYTES,
                block_of(&prepared.model, name, block),
            );
        }
        flush(&mut client);
    }
}

// ---------------------------------------------------------------------------------------------
// onecopy commands

struct CheckRun {
    code: i32,
    report: Value,
    text: String,
}

fn check(repository: &TestRepository, arguments: &[&str]) -> CheckRun {
    let mut all = vec!["check", "--json"];
    all.extend_from_slice(arguments);
    let output = repository.onecopy_output(&all);
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let report: Value = serde_json::from_str(&text).unwrap_or_else(|error| {
        panic!(
            "onecopy {all:?} printed no report ({error}): {text}\n{}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    CheckRun {
        code: output.status.code().expect("exit code"),
        report,
        text,
    }
}

impl CheckRun {
    fn findings(&self) -> Vec<&Value> {
        self.report["faces"]
            .as_array()
            .expect("faces")
            .iter()
            .filter(|face| face["face"] == "block")
            .flat_map(|face| face["findings"].as_array().expect("findings"))
            .collect()
    }

    /// The lost blocks the report names ("volume NAME blocks A-B"), and its other lost entries
    /// (losses whose blocks are unknown).
    fn lost(&self) -> (Blocks, Vec<String>) {
        let mut blocks = Blocks::new();
        let mut unknown = Vec::new();
        for finding in self.findings() {
            for entry in finding["lost"].as_array().expect("lost") {
                let entry = entry.as_str().expect("text");
                match parse_range(entry) {
                    Some((volume, range)) => {
                        blocks.entry(volume).or_default().extend(range);
                    }
                    None => unknown.push(entry.to_string()),
                }
            }
        }
        (blocks, unknown)
    }

    fn names(&self, object: &str) -> bool {
        self.findings().iter().any(|finding| {
            finding["kind"] != "leftover"
                && finding["object"]
                    .as_str()
                    .is_some_and(|name| name.contains(object))
        })
    }
}

/// "volume NAME blocks A-B" as (NAME, A..=B).
fn parse_range(entry: &str) -> Option<(String, std::ops::RangeInclusive<u64>)> {
    let rest = entry.strip_prefix("volume ")?;
    let (volume, range) = rest.split_once(" blocks ")?;
    let (first, last) = range.split_once('-')?;
    Some((volume.to_string(), first.parse().ok()?..=last.parse().ok()?))
}

/// Starts `onecopy serve` and expects it to refuse: returns what it printed.
fn serve_refused(repository: &TestRepository) -> String {
    let socket = repository.socket();
    let _ = std::fs::remove_file(&socket);
    let mut child = repository
        .command()
        .arg("serve")
        .arg("--socket")
        .arg(&socket)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting onecopy serve");
    let started = Instant::now();
    loop {
        if child.try_wait().expect("polling the server").is_some() {
            break;
        }
        if started.elapsed() > REFUSAL_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("onecopy serve started on a damaged repository instead of refusing");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output: Output = child.wait_with_output().expect("server output");
    assert!(
        !output.status.success(),
        "onecopy serve refused with exit 0"
    );
    String::from_utf8_lossy(&output.stderr).into_owned()
}

// ---------------------------------------------------------------------------------------------
// The repository's files, read as the format documents them

fn block_directory(repository: &TestRepository) -> PathBuf {
    repository.repository().join("block")
}

/// Every file of the block face (but the lock file, which each command rewrites) with its
/// length and modification time: equal snapshots mean nothing was written.
fn file_states(repository: &TestRepository) -> BTreeMap<PathBuf, (u64, std::time::SystemTime)> {
    let mut states = BTreeMap::new();
    let mut directories = vec![block_directory(repository)];
    while let Some(directory) = directories.pop() {
        for entry in std::fs::read_dir(&directory).expect("block directory") {
            let path = entry.expect("entry").path();
            let metadata = std::fs::metadata(&path).expect("metadata");
            if metadata.is_dir() {
                directories.push(path);
            } else if path.file_name().is_some_and(|name| name != "lock") {
                states.insert(path, (metadata.len(), metadata.modified().expect("mtime")));
            }
        }
    }
    states
}

fn le_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

fn le_u64(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// A manifest: its file, its sequence, and each area's page table (slot per page, `None` for
/// a page never written).
struct Manifest {
    path: PathBuf,
    sequence: u64,
    areas: BTreeMap<String, Vec<Option<u32>>>,
}

/// Both manifests, newest first.
fn manifests(repository: &TestRepository) -> Vec<Manifest> {
    let mut found: Vec<Manifest> = ["manifest.0", "manifest.1"]
        .iter()
        .map(|name| {
            let path = block_directory(repository).join("meta").join(name);
            let bytes = std::fs::read(&path).expect("manifest");
            assert_eq!(&bytes[..8], b"OCPAGES1", "{}", path.display());
            let sequence = le_u64(&bytes, 8);
            let mut at = 32 + 4;
            let area_count = le_u32(&bytes, at);
            at += 4;
            let mut areas = BTreeMap::new();
            for _ in 0..area_count {
                let name_bytes = u16::from_le_bytes([bytes[at], bytes[at + 1]]) as usize;
                let name = String::from_utf8(bytes[at + 2..at + 2 + name_bytes].to_vec())
                    .expect("area name");
                at += 2 + name_bytes;
                let pages = le_u64(&bytes, at);
                at += 8;
                let table = (0..pages)
                    .map(|page| {
                        let slot = le_u32(&bytes, at + 8 * page as usize);
                        (slot != u32::MAX).then_some(slot)
                    })
                    .collect();
                at += 8 * pages as usize;
                areas.insert(name, table);
            }
            Manifest {
                path,
                sequence,
                areas,
            }
        })
        .collect();
    found.sort_by_key(|manifest| std::cmp::Reverse(manifest.sequence));
    found
}

/// The journals, oldest first.
fn journals(repository: &TestRepository) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(block_directory(repository).join("meta"))
        .expect("meta directory")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with("journal-"))
        })
        .collect();
    found.sort();
    found
}

/// A journal record: where it is and the blocks its tag names.
#[derive(Debug)]
struct JournalRecord {
    offset: u64,
    payload_bytes: u64,
    volume_id: u32,
    first_block: u64,
    blocks: u64,
}

fn journal_records(path: &Path) -> Vec<JournalRecord> {
    let bytes = std::fs::read(path).expect("journal");
    let mut records = Vec::new();
    let mut at = JOURNAL_HEADER_BYTES as usize;
    while at + RECORD_HEADER_BYTES as usize <= bytes.len()
        && bytes[at..at + RECORD_HEADER_BYTES as usize]
            .iter()
            .any(|&byte| byte != 0)
    {
        let payload_bytes = le_u32(&bytes, at) as u64;
        records.push(JournalRecord {
            offset: at as u64,
            payload_bytes,
            volume_id: le_u32(&bytes, at + 16),
            first_block: le_u64(&bytes, at + 20),
            blocks: le_u32(&bytes, at + 28) as u64,
        });
        at += (RECORD_OVERHEAD_BYTES + payload_bytes) as usize;
    }
    records
}

/// One chunk in a container.
#[derive(Clone, Debug)]
struct StoredChunk {
    /// Offset of its record header.
    header_offset: u64,
    data_offset: u64,
    stored_bytes: u64,
    /// Its bytes (stored uncompressed).
    data: Vec<u8>,
}

/// A container file and its chunks in file order.
struct Container {
    path: PathBuf,
    length: u64,
    /// Where the trailer starts, for a sealed container.
    trailer_offset: Option<u64>,
    chunks: Vec<StoredChunk>,
}

/// Every container, by id.
fn containers(repository: &TestRepository) -> Vec<Container> {
    let mut paths = Vec::new();
    for shard in
        std::fs::read_dir(block_directory(repository).join("containers")).expect("containers")
    {
        for file in std::fs::read_dir(shard.expect("shard").path()).expect("shard") {
            paths.push(file.expect("container").path());
        }
    }
    paths.sort_by_key(|path| path.file_name().map(|name| name.to_owned()));
    paths
        .into_iter()
        .map(|path| {
            let bytes = std::fs::read(&path).expect("container");
            let length = bytes.len() as u64;
            let footer = &bytes[bytes.len() - FOOTER_BYTES as usize..];
            let trailer_offset = (&footer[..8] == b"OCCNTEND").then(|| le_u64(footer, 8));
            let end = trailer_offset.unwrap_or(length);
            let mut chunks = Vec::new();
            let mut at = CONTAINER_HEADER_BYTES;
            while at + CHUNK_HEADER_BYTES <= end {
                let header = &bytes[at as usize..(at + CHUNK_HEADER_BYTES) as usize];
                if header.iter().all(|&byte| byte == 0) {
                    break;
                }
                let stored_bytes = le_u32(header, 32) as u64;
                let data_offset = at + CHUNK_HEADER_BYTES;
                chunks.push(StoredChunk {
                    header_offset: at,
                    data_offset,
                    stored_bytes,
                    data: bytes[data_offset as usize..(data_offset + stored_bytes) as usize]
                        .to_vec(),
                });
                at = data_offset + stored_bytes;
            }
            Container {
                path,
                length,
                trailer_offset,
                chunks,
            }
        })
        .collect()
}

/// The blocks that hold `data` in the model.
fn users(prepared: &Prepared, data: &[u8]) -> Blocks {
    let mut found = Blocks::new();
    for (name, bytes) in &prepared.model {
        for (block, content) in bytes.chunks(BLOCK_BYTES as usize).enumerate() {
            if content == data {
                found.entry(name.clone()).or_default().insert(block as u64);
            }
        }
    }
    found
}

fn merge(into: &mut Blocks, from: Blocks) {
    for (name, blocks) in from {
        into.entry(name).or_default().extend(blocks);
    }
}

/// The chunks in chunk-id order: ids are handed out in write order from 1 and never freed in
/// the stopped repository, and chunks are appended to containers in the same order.
fn chunks_by_id(repository: &TestRepository) -> Vec<StoredChunk> {
    containers(repository)
        .into_iter()
        .flat_map(|container| container.chunks)
        .collect()
}

fn flip(path: &Path, offset: u64) {
    let mut bytes = std::fs::read(path).expect("file to damage");
    assert!(
        (offset as usize) < bytes.len(),
        "{} has no byte {offset}",
        path.display()
    );
    bytes[offset as usize] ^= 0x40;
    std::fs::write(path, bytes).expect("damaged file");
}

fn truncate(path: &Path, length: u64) {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("file to truncate");
    assert!(file.metadata().expect("metadata").len() > length);
    file.set_len(length).expect("truncation");
}

fn delete(path: &Path) {
    std::fs::remove_file(path).expect("file to delete");
}

fn blocks_of(volume: &str, blocks: impl IntoIterator<Item = u64>) -> Blocks {
    let mut found = Blocks::new();
    found.entry(volume.to_string()).or_default().extend(blocks);
    found
}

// ---------------------------------------------------------------------------------------------
// Cases

/// What a fault must lead to.
#[derive(Default)]
struct Expected {
    /// Part of the name of the object every check before the repair reports.
    object: String,
    /// Only a check with `--read-data` can see the damage (container bytes).
    needs_read_data: bool,
    /// The damage loses acknowledged writes: `serve` refuses until a repair, naming this.
    serve_refuses_naming: Option<String>,
    /// The blocks the fault destroyed.
    lost: Blocks,
    /// Writes lost without a trace of their blocks (indexes into `Prepared::writes`).
    unknown: Vec<usize>,
    /// Nothing can be rebuilt: check and repair report it and change nothing.
    unrepairable: bool,
}

impl Expected {
    fn damage(object: impl Into<String>) -> Expected {
        Expected {
            object: object.into(),
            ..Expected::default()
        }
    }

    fn losing(mut self, lost: Blocks) -> Expected {
        merge(&mut self.lost, lost);
        self
    }
}

/// Damages a copy of the prepared repository and says what that must lead to.
type Inject = Box<dyn Fn(&Prepared, &TestRepository) -> Expected>;

struct Case {
    name: String,
    inject: Inject,
}

fn case(
    name: impl Into<String>,
    inject: impl Fn(&Prepared, &TestRepository) -> Expected + 'static,
) -> Case {
    Case {
        name: name.into(),
        inject: Box::new(inject),
    }
}

/// Runs each case on a copy of `prepared`, all of them even when some fail (each failure's
/// message is printed as it happens), and returns the names of those that failed.
fn run_cases(prepared: &Prepared, cases: &[Case]) -> Vec<String> {
    let mut failed = Vec::new();
    for case in cases {
        let started = Instant::now();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let repository = TestRepository::copy_of(&prepared.repository);
            let expected = (case.inject)(prepared, &repository);
            run_case(&case.name, prepared, &repository, &expected);
        }));
        match outcome {
            Ok(()) => eprintln!("{}: passed in {:?}", case.name, started.elapsed()),
            Err(_) => failed.push(case.name.clone()),
        }
    }
    failed
}

fn run_case(name: &str, prepared: &Prepared, repository: &TestRepository, expected: &Expected) {
    let read_data: &[&str] = if expected.needs_read_data {
        &["--read-data"]
    } else {
        &[]
    };
    let mut may_revert = Blocks::new();
    for &index in &expected.unknown {
        let write = &prepared.writes[index];
        merge(
            &mut may_revert,
            blocks_of(
                write.volume,
                write.first_block..write.first_block + write.blocks,
            ),
        );
    }

    // 1. A check reports the damage and changes nothing.
    let first = check(repository, read_data);
    assert_eq!(first.code, 1, "{name}: check exits 1: {}", first.text);
    assert!(
        first.names(&expected.object),
        "{name}: check names {}: {}",
        expected.object,
        first.text
    );
    let (lost, unknown) = first.lost();
    assert_eq!(
        lost, expected.lost,
        "{name}: check names the lost blocks: {}",
        first.text
    );
    assert_eq!(
        unknown.is_empty(),
        expected.unknown.is_empty(),
        "{name}: unknown losses: {}",
        first.text
    );
    let again = check(repository, read_data);
    assert_eq!(
        again.report, first.report,
        "{name}: a check changes nothing"
    );
    let evidence = file_states(repository);

    // 2. Serving refuses or serves nothing wrong.
    match &expected.serve_refuses_naming {
        Some(object) => {
            let message = serve_refused(repository);
            assert!(
                message.contains(object.as_str()) && message.contains("onecopy check"),
                "{name}: serve names the damage and the way out: {message}"
            );
            assert!(
                file_states(repository) == evidence,
                "{name}: a refused serve writes nothing over the evidence"
            );
        }
        None if expected.unrepairable => {
            let message = serve_refused(repository);
            assert!(message.contains("onecopy check"), "{name}: {message}");
        }
        None => {
            let server = repository.serve(&[]);
            let read = read_everything(&server);
            verify_reads(name, prepared, &read, &expected.lost, &Blocks::new());
            server.stop();
        }
    }

    // 3. The repair.
    let repair = check(repository, &["--repair", "--read-data"]);
    if expected.unrepairable {
        assert_eq!(
            repair.code, 1,
            "{name}: an impossible repair exits 1: {}",
            repair.text
        );
        assert!(repair.names(&expected.object), "{name}: {}", repair.text);
        assert!(
            file_states(repository) == evidence,
            "{name}: neither serve nor a repair that cannot rebuild changes anything"
        );
        return;
    }
    // Unknown losses are reported by the repair, but nothing can mark their blocks: the
    // checks after it see only the recorded ones.
    let losing = !expected.lost.is_empty();
    assert_eq!(
        repair.code,
        if losing || !expected.unknown.is_empty() {
            3
        } else {
            0
        },
        "{name}: repair exit status: {}",
        repair.text
    );
    let (lost, unknown) = repair.lost();
    assert_eq!(
        lost, expected.lost,
        "{name}: repair names the lost blocks: {}",
        repair.text
    );
    assert_eq!(
        unknown.is_empty(),
        expected.unknown.is_empty(),
        "{name}: unknown losses: {}",
        repair.text
    );

    // 4. Everything intact reads back; lost blocks fail until written again.
    let after = check(repository, &["--read-data"]);
    assert_eq!(
        after.code,
        if losing { 3 } else { 0 },
        "{name}: check after the repair: {}",
        after.text
    );
    assert_eq!(
        after.lost().0,
        expected.lost,
        "{name}: recorded losses: {}",
        after.text
    );
    let server = repository.serve(&[]);
    let read = read_everything(&server);
    verify_reads(name, prepared, &read, &expected.lost, &may_revert);
    let mut rewritten = expected.lost.clone();
    merge(&mut rewritten, may_revert);
    rewrite(&server, prepared, &rewritten);
    server.stop();
    let last = check(repository, &["--read-data"]);
    assert_eq!(
        last.code, 0,
        "{name}: clean once the lost blocks are written: {}",
        last.text
    );
    assert!(last.findings().is_empty(), "{name}: {}", last.text);
}

// ---------------------------------------------------------------------------------------------
// Tests

/// Goal: a damaged, truncated or deleted manifest loses nothing: the newest falls back to the
/// older one and the journals a checkpoint keeps (also right after a crash recovery), the
/// older one is reported and rewritten; with both gone the face refuses to open and a repair
/// removes nothing. Method: each fault on a copy of a stopped (and of a killed) repository.
#[test]
fn manifest_faults() {
    let stopped = prepare_stopped();
    let newest = |repository: &TestRepository| manifests(repository)[0].path.clone();
    let older = |repository: &TestRepository| manifests(repository)[1].path.clone();
    let name = |path: &Path| path.file_name().unwrap().to_str().unwrap().to_string();
    let mut failed = run_cases(
        &stopped,
        &[
            case("newest manifest, flipped byte", move |_, repository| {
                let path = newest(repository);
                flip(&path, 100);
                Expected::damage(name(&path))
            }),
            case("newest manifest, truncated", move |_, repository| {
                let path = newest(repository);
                truncate(&path, 200);
                Expected::damage(name(&path))
            }),
            case("newest manifest, deleted", move |_, repository| {
                let path = newest(repository);
                delete(&path);
                Expected::damage(name(&path))
            }),
            case("older manifest, flipped byte", move |_, repository| {
                let path = older(repository);
                flip(&path, 40);
                Expected::damage(name(&path))
            }),
            case("older manifest, truncated", move |_, repository| {
                let path = older(repository);
                truncate(&path, 10);
                Expected::damage(name(&path))
            }),
            case("older manifest, deleted", move |_, repository| {
                let path = older(repository);
                delete(&path);
                Expected::damage(name(&path))
            }),
            case("both manifests, flipped bytes", move |_, repository| {
                flip(&newest(repository), 100);
                flip(&older(repository), 100);
                Expected {
                    unrepairable: true,
                    ..Expected::damage("manifest")
                }
            }),
            case("both manifests, deleted", move |_, repository| {
                let (first, second) = (newest(repository), older(repository));
                delete(&first);
                delete(&second);
                Expected {
                    unrepairable: true,
                    ..Expected::damage("manifest")
                }
            }),
        ],
    );
    let killed = prepare_killed();
    failed.extend(run_cases(
        &killed,
        &[case(
            "newest manifest after a crash recovery, flipped byte",
            move |_, repository| {
                // The open after the crash replays the journal and checkpoints; a damaged
                // manifest of that checkpoint falls back to the one before it.
                let server = repository.serve(&[]);
                server.kill();
                let path = newest(repository);
                flip(&path, 100);
                Expected::damage(name(&path))
            },
        )],
    ));
    assert!(failed.is_empty(), "failed cases: {failed:#?}");
}

/// Goal: journal damage is never silent. A damaged record of the current journal makes
/// `serve` refuse, naming the file and offset; check names exactly the damaged write's blocks;
/// a repair keeps every other write and marks those blocks lost. A truncated or deleted
/// journal reports the writes it lost (their blocks when a record's tag survives, otherwise
/// "blocks unknown"). Damage to the previous journal, kept only for a manifest fallback,
/// loses nothing and is reported. Method: each fault on a copy of a killed repository.
#[test]
fn journal_faults() {
    let killed = prepare_killed();
    let current = |repository: &TestRepository| {
        let found = journals(repository);
        found[found.len() - 1].clone()
    };
    let name = |path: &Path| path.file_name().unwrap().to_str().unwrap().to_string();
    let write_blocks = |prepared: &Prepared, index: usize| {
        let write = &prepared.writes[index];
        blocks_of(
            write.volume,
            write.first_block..write.first_block + write.blocks,
        )
    };
    {
        // The journal holds exactly the writes, one record each, tagged with their blocks.
        let records = journal_records(&current(&killed.repository));
        assert_eq!(records.len(), JOURNAL_WRITES, "{records:?}");
        for (record, write) in records.iter().zip(&killed.writes) {
            let volume = VOLUMES[record.volume_id as usize - 1];
            assert_eq!(
                (volume, record.first_block, record.blocks),
                (write.volume, write.first_block, write.blocks)
            );
        }
    }
    let mut failed = run_cases(
        &killed,
        &[
            case(
                "current journal, flipped byte in a record's payload",
                move |prepared, repository| {
                    let path = current(repository);
                    let record = &journal_records(&path)[3];
                    flip(
                        &path,
                        record.offset + RECORD_HEADER_BYTES + record.payload_bytes / 2,
                    );
                    Expected {
                        serve_refuses_naming: Some(format!(
                            "{} at byte {}",
                            name(&path),
                            record.offset
                        )),
                        ..Expected::damage(name(&path))
                    }
                    .losing(write_blocks(prepared, 3))
                },
            ),
            case(
                "current journal, flipped byte in a record's header",
                move |prepared, repository| {
                    let path = current(repository);
                    let record = &journal_records(&path)[5];
                    flip(&path, record.offset + 18);
                    Expected {
                        serve_refuses_naming: Some(format!(
                            "{} at byte {}",
                            name(&path),
                            record.offset
                        )),
                        ..Expected::damage(name(&path))
                    }
                    .losing(write_blocks(prepared, 5))
                },
            ),
            case(
                "current journal, flipped byte in the file header",
                move |_, repository| {
                    let path = current(repository);
                    flip(&path, 10);
                    Expected::damage(name(&path))
                },
            ),
            case(
                "current journal, truncated inside a record",
                move |prepared, repository| {
                    let path = current(repository);
                    let record = &journal_records(&path)[5];
                    truncate(&path, record.offset + RECORD_HEADER_BYTES + 100);
                    Expected {
                        serve_refuses_naming: Some(name(&path)),
                        unknown: vec![6, 7],
                        ..Expected::damage(name(&path))
                    }
                    .losing(write_blocks(prepared, 5))
                },
            ),
            case("current journal, deleted", move |_, repository| {
                let path = current(repository);
                delete(&path);
                Expected {
                    serve_refuses_naming: Some(name(&path)),
                    unknown: (0..JOURNAL_WRITES).collect(),
                    ..Expected::damage(name(&path))
                }
            }),
        ],
    );

    // The previous journal holds the stopped repository's writes.
    let stopped = prepare_stopped();
    let previous = |repository: &TestRepository| {
        let found = journals(repository);
        found[found.len() - 2].clone()
    };
    assert!(
        journal_records(&previous(&stopped.repository)).len() > 4,
        "the previous journal holds the writes"
    );
    failed.extend(run_cases(
        &stopped,
        &[
            case(
                "previous journal, flipped byte in a record",
                move |_, repository| {
                    let path = previous(repository);
                    let record = &journal_records(&path)[2];
                    flip(&path, record.offset + RECORD_HEADER_BYTES + 7);
                    Expected::damage(name(&path))
                },
            ),
            case("previous journal, truncated", move |_, repository| {
                let path = previous(repository);
                let record = &journal_records(&path)[2];
                truncate(&path, record.offset + 10);
                Expected::damage(name(&path))
            }),
            case("previous journal, deleted", move |_, repository| {
                let path = previous(repository);
                delete(&path);
                Expected::damage(name(&path))
            }),
        ],
    ));
    assert!(failed.is_empty(), "failed cases: {failed:#?}");
}

/// The blocks lost when the pages of `damaged` (area, page) are unreadable: every block of a
/// map page, the blocks using the chunks of a chunk-table page, nothing for derived areas.
fn lost_with_pages(prepared: &Prepared, damaged: &[(String, u64)]) -> Blocks {
    let chunks = chunks_by_id(&prepared.repository);
    let mut lost = Blocks::new();
    for (area, page) in damaged {
        if let Some(id) = area
            .strip_prefix("volume.")
            .and_then(|rest| rest.strip_suffix(".map"))
        {
            let volume = VOLUMES[id.parse::<usize>().expect("volume id") - 1];
            let first = page * MAP_ENTRIES_PER_PAGE;
            merge(
                &mut lost,
                blocks_of(volume, first..(first + MAP_ENTRIES_PER_PAGE).min(BLOCKS)),
            );
        } else if area == "chunks" {
            for id in page * CHUNK_RECORDS_PER_PAGE..(page + 1) * CHUNK_RECORDS_PER_PAGE {
                if id >= 1 && id as usize <= chunks.len() {
                    merge(&mut lost, users(prepared, &chunks[id as usize - 1].data));
                }
            }
        }
    }
    lost
}

/// Goal: a damaged metadata page loses exactly what it holds: a map page its 512 blocks, a
/// chunk-table page the blocks using its 64 chunks (in both volumes), derived pages (container
/// table, index buckets, directory and filter) nothing; a truncated or deleted pages file
/// damages every page past the cut. Method: each fault on a copy of a stopped repository, the
/// pages found through the newest manifest.
#[test]
fn page_faults() {
    let stopped = prepare_stopped();
    let manifest = manifests(&stopped.repository).remove(0);
    {
        // A stored chunk per distinct non-zero block, in write order.
        let chunks = chunks_by_id(&stopped.repository);
        assert_eq!(chunks.len(), 3072);
        assert!(
            users(&stopped, &chunks[0].data)
                == blocks_of("disk", [0])
                    .into_iter()
                    .chain(blocks_of("other", [0]))
                    .collect()
        );
    }
    let pages_file =
        |repository: &TestRepository| block_directory(repository).join("meta").join("pages");
    let mut cases = Vec::new();
    let mut covered = BTreeSet::new();
    for (area, page) in [
        ("volume.1.map", 1),
        ("volume.2.map", 3),
        ("chunks", 5),
        ("chunks", 40),
        ("containers", 0),
        ("index.buckets", 0),
        ("index.directory", 0),
        ("index.filter", 0),
    ] {
        covered.insert(area.to_string());
        let slot = manifest.areas[area][page as usize]
            .unwrap_or_else(|| panic!("page {page} of {area} is stored"));
        cases.push(case(
            format!("page {page} of {area}, flipped byte"),
            move |prepared, repository| {
                flip(&pages_file(repository), slot as u64 * PAGE_BYTES + 100);
                Expected::damage(format!("page {page} of area {area}"))
                    .losing(lost_with_pages(prepared, &[(area.to_string(), page)]))
            },
        ));
    }
    assert_eq!(
        covered,
        manifest.areas.keys().cloned().collect::<BTreeSet<_>>(),
        "every area has a case"
    );
    let beyond = |manifest: &Manifest, cut: u64| -> Vec<(String, u64)> {
        manifest
            .areas
            .iter()
            .flat_map(|(area, table)| {
                table.iter().enumerate().filter_map(move |(page, slot)| {
                    slot.filter(|&slot| (slot as u64 + 1) * PAGE_BYTES > cut)
                        .map(|_| (area.clone(), page as u64))
                })
            })
            .collect()
    };
    cases.push(case(
        "pages file, truncated",
        move |prepared, repository| {
            let path = pages_file(repository);
            let length = std::fs::metadata(&path).expect("pages").len();
            // Mid-page: the page the cut runs through is damaged too.
            let cut = length / 2 + 1000;
            truncate(&path, cut);
            let damaged = beyond(&manifests(repository)[0], cut);
            assert!(damaged.iter().any(|(area, _)| area == "chunks"));
            Expected::damage("pages").losing(lost_with_pages(prepared, &damaged))
        },
    ));
    cases.push(case("pages file, deleted", move |prepared, repository| {
        delete(&pages_file(repository));
        let damaged = beyond(&manifests(repository)[0], 0);
        Expected::damage("pages").losing(lost_with_pages(prepared, &damaged))
    }));
    let failed = run_cases(&stopped, &cases);
    assert!(failed.is_empty(), "failed cases: {failed:#?}");
}

/// Goal: damaged container bytes lose exactly the blocks whose chunks they hold, and damaged
/// container metadata (record headers, trailer, footer, file header) loses nothing and is
/// repaired by moving the live chunks; a truncated or deleted container loses the blocks of
/// its chunks past the cut. Method: each fault on a copy of a stopped repository (three
/// containers: two sealed, one left open by the stop).
#[test]
fn container_faults() {
    let stopped = prepare_stopped();
    let layout = containers(&stopped.repository);
    assert!(layout.len() >= 3, "several containers");
    assert!(layout[0].trailer_offset.is_some() && layout[1].trailer_offset.is_some());
    assert!(
        layout[layout.len() - 1].trailer_offset.is_none(),
        "the last one is open"
    );
    let container =
        |repository: &TestRepository, index: usize| containers(repository).remove(index);
    let file = |path: &Path| path.file_name().unwrap().to_str().unwrap().to_string();
    let last = layout.len() - 1;
    let lost_past = move |prepared: &Prepared, chunks: &[StoredChunk], cut: u64| {
        let mut lost = Blocks::new();
        for chunk in chunks {
            if chunk.data_offset + chunk.stored_bytes > cut {
                merge(&mut lost, users(prepared, &chunk.data));
            }
        }
        lost
    };
    let failed = run_cases(
        &stopped,
        &[
            case(
                "sealed container, flipped byte in a chunk",
                move |prepared, repository| {
                    let target = container(repository, 1);
                    let chunk = &target.chunks[10];
                    flip(&target.path, chunk.data_offset + 100);
                    Expected {
                        needs_read_data: true,
                        ..Expected::damage("chunk ")
                    }
                    .losing(users(prepared, &chunk.data))
                },
            ),
            case(
                "open container, flipped byte in a chunk",
                move |prepared, repository| {
                    let target = container(repository, last);
                    let chunk = &target.chunks[3];
                    flip(&target.path, chunk.data_offset + 5);
                    Expected {
                        needs_read_data: true,
                        ..Expected::damage("chunk ")
                    }
                    .losing(users(prepared, &chunk.data))
                },
            ),
            case(
                "sealed container, flipped byte in a record header",
                move |_, repository| {
                    let target = container(repository, 1);
                    flip(&target.path, target.chunks[10].header_offset + 5);
                    Expected {
                        needs_read_data: true,
                        ..Expected::damage(file(&target.path))
                    }
                },
            ),
            case(
                "sealed container, flipped byte in the file header",
                move |_, repository| {
                    let target = container(repository, 0);
                    flip(&target.path, 17);
                    Expected::damage(file(&target.path))
                },
            ),
            case(
                "sealed container, flipped byte in the trailer",
                move |_, repository| {
                    let target = container(repository, 0);
                    flip(&target.path, target.trailer_offset.unwrap() + 30);
                    Expected::damage(file(&target.path))
                },
            ),
            case(
                "sealed container, flipped byte in the footer",
                move |_, repository| {
                    let target = container(repository, 1);
                    flip(&target.path, target.length - FOOTER_BYTES + 2);
                    Expected::damage(file(&target.path))
                },
            ),
            case(
                "sealed container, truncated",
                move |prepared, repository| {
                    let target = container(repository, 1);
                    let cut = target.length / 2;
                    truncate(&target.path, cut);
                    Expected::damage(file(&target.path)).losing(lost_past(
                        prepared,
                        &target.chunks,
                        cut,
                    ))
                },
            ),
            case("sealed container, deleted", move |prepared, repository| {
                let target = container(repository, 0);
                delete(&target.path);
                Expected::damage(file(&target.path)).losing(lost_past(prepared, &target.chunks, 0))
            }),
            case("open container, truncated", move |prepared, repository| {
                let target = container(repository, last);
                let cut = target.chunks[5].data_offset + 10;
                truncate(&target.path, cut);
                Expected::damage(file(&target.path)).losing(lost_past(
                    prepared,
                    &target.chunks,
                    cut,
                ))
            }),
            case("open container, deleted", move |prepared, repository| {
                let target = container(repository, last);
                delete(&target.path);
                Expected::damage(file(&target.path)).losing(lost_past(prepared, &target.chunks, 0))
            }),
        ],
    );
    assert!(failed.is_empty(), "failed cases: {failed:#?}");
}

/// Goal: a damaged, truncated or deleted block/config.json loses nothing: the copy every
/// checkpoint keeps is used, the damage reported, and the file rewritten by a repair. Method:
/// each fault on a copy of a stopped repository.
#[test]
fn config_faults() {
    let stopped = prepare_stopped();
    let config = |repository: &TestRepository| block_directory(repository).join("config.json");
    let failed = run_cases(
        &stopped,
        &[
            case("config, flipped byte", move |_, repository| {
                flip(&config(repository), 3);
                Expected::damage("config.json")
            }),
            case("config, truncated", move |_, repository| {
                truncate(&config(repository), 20);
                Expected::damage("config.json")
            }),
            case("config, deleted", move |_, repository| {
                delete(&config(repository));
                Expected::damage("config.json")
            }),
        ],
    );
    assert!(failed.is_empty(), "failed cases: {failed:#?}");
}
