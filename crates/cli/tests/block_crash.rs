//! Crash tests of the block device's FLUSH contract, against the real `onecopy serve` process.
//!
//! Terms:
//! - *acknowledged*: the client received the write's reply.
//! - *durable write*: an acknowledged write with FUA, or a write acknowledged before the client
//!   sent a FLUSH that then completed (the NBD contract: a FLUSH covers every write completed
//!   before it was sent; the server advertises multi-connection flushes, so this holds across
//!   connections).
//!
//! Method: two connections of a pipelining client (`block_support::nbd_client`) write
//! known contents to a volume — unique sectors, a small pool of repeated 4 KiB patterns that
//! the engine deduplicates, partial-block writes that force read-modify-write, write-zeroes,
//! FUA writes — and FLUSH now and then, while fio writes duplicate and unique data with flushes
//! to a second volume. A shared log orders every send and every reply. At a random moment the
//! server is killed with SIGKILL (or sent SIGTERM and then SIGKILL during its shutdown
//! checkpoint, or killed again during its crash recovery). After a restart every 512-byte
//! sector must hold its last durable write or a later write to it (never older data, never
//! anything else), the fio volume must read without errors, and `onecopy check` must be
//! clean. The verified contents are the starting point of the next round, so later rounds
//! crash on top of recovered state.
//!
//! `ONECOPY_CRASH_ROUNDS` (default 9) and `ONECOPY_CRASH_SEED` (default: the clock; printed)
//! make runs longer or reproducible.

mod block_support;

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use block_support::nbd_client::{
    NbdClient, COMMAND_FLAG_FUA, COMMAND_FLUSH, COMMAND_WRITE, COMMAND_WRITE_ZEROES,
    FLAG_CAN_MULTI_CONN,
};
use block_support::{
    require_tool, run, thread_stacks, ChildGuard, Random, ServeProcess, TestRepository, MIB,
};

const VOLUME: &str = "crash";
const VOLUME_BYTES: u64 = 16 * MIB;
const LOAD_VOLUME: &str = "load";
const LOAD_VOLUME_BYTES: u64 = 64 * MIB;
const SECTOR_BYTES: u64 = 512;
const BLOCK_BYTES: u64 = 4096;
const SECTORS_PER_BLOCK: u64 = BLOCK_BYTES / SECTOR_BYTES;
const SECTORS: u64 = VOLUME_BYTES / SECTOR_BYTES;
const BLOCKS: u64 = VOLUME_BYTES / BLOCK_BYTES;
const CONNECTIONS: usize = 2;
/// Requests each connection keeps in flight.
const QUEUE_DEPTH: usize = 16;
/// Distinct repeated 4 KiB patterns: small, so that writes deduplicate against each other.
const POOL_PATTERNS: u64 = 16;
const ROUNDS_DEFAULT: usize = 9;
/// Longest time the clients write after the first completed FLUSH before the kill.
const WRITE_MILLISECONDS_MAX: u64 = 1500;
/// Longest wait for the first write of a round to become durable.
const PROGRESS_TIMEOUT: Duration = Duration::from_secs(20);
/// Bytes per verification read.
const READ_BYTES: u32 = 1 << 20;

const _: () = assert!(VOLUME_BYTES.is_multiple_of(BLOCK_BYTES));
const _: () = assert!(VOLUME_BYTES.is_multiple_of(READ_BYTES as u64));

/// What one sector holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Content {
    Zero,
    /// Written by the write with this id: different in every sector and every write.
    Unique(u64),
    /// Pool pattern `k`: the same 4 KiB wherever it is written block-aligned.
    Pool(u64),
}

const UNIQUE_TAG: &[u8; 8] = b"OCUNIQUE";
const POOL_TAG: &[u8; 8] = b"OCPOOL00";

/// The 512 bytes `content` puts in `sector`: a tag, the identity, then pseudo-random filler.
fn sector_bytes(content: Content, sector: u64) -> [u8; 512] {
    let mut bytes = [0u8; 512];
    let (tag, position, identity) = match content {
        Content::Zero => return bytes,
        Content::Unique(id) => (UNIQUE_TAG, sector, id),
        Content::Pool(k) => (POOL_TAG, sector % SECTORS_PER_BLOCK, k),
    };
    bytes[..8].copy_from_slice(tag);
    bytes[8..16].copy_from_slice(&position.to_le_bytes());
    bytes[16..24].copy_from_slice(&identity.to_le_bytes());
    let mut random = Random::new(identity.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ position);
    for word in bytes[24..].chunks_mut(8) {
        word.copy_from_slice(&random.next_u64().to_le_bytes()[..word.len()]);
    }
    bytes
}

/// What a sector's bytes claim to be (for diagnostics; verification compares whole sectors).
fn identify(bytes: &[u8], sector: u64) -> String {
    if bytes.iter().all(|&byte| byte == 0) {
        return "zeros".into();
    }
    let identity = u64::from_le_bytes(bytes[16..24].try_into().expect("8 bytes"));
    let claimed = if &bytes[..8] == UNIQUE_TAG {
        Content::Unique(identity)
    } else if &bytes[..8] == POOL_TAG {
        Content::Pool(identity)
    } else {
        return "unrecognised bytes".into();
    };
    if sector_bytes(claimed, sector) == bytes {
        format!("{claimed:?}")
    } else {
        format!("damaged {claimed:?}")
    }
}

#[derive(Clone, Copy, Debug)]
enum WriteKind {
    Unique,
    Pool(u64),
    Zeroes,
}

#[derive(Debug)]
struct WriteRecord {
    id: u64,
    first_sector: u64,
    sectors: u64,
    kind: WriteKind,
    fua: bool,
    /// The log event at which the reply arrived.
    acknowledged: Option<u64>,
}

impl WriteRecord {
    fn content(&self) -> Content {
        match self.kind {
            WriteKind::Unique => Content::Unique(self.id),
            WriteKind::Pool(k) => Content::Pool(k),
            WriteKind::Zeroes => Content::Zero,
        }
    }

    /// Whether the contract guarantees this write survives a crash, given the send event of
    /// the latest completed FLUSH.
    fn durable(&self, last_flush_sent: Option<u64>) -> bool {
        match self.acknowledged {
            None => false,
            Some(_) if self.fua => true,
            Some(acknowledged) => last_flush_sent.is_some_and(|sent| acknowledged < sent),
        }
    }
}

/// Everything the clients did, in one order.
struct Log {
    event: u64,
    round: u64,
    writes: Vec<WriteRecord>,
    /// Per sector, indexes into `writes` in the order they were sent. Writes touching a block
    /// are never in flight together, so this is also the order the server saw them in.
    history: Vec<Vec<u32>>,
    busy_blocks: Vec<bool>,
    /// Send event of the latest FLUSH that completed successfully.
    last_flush_sent: Option<u64>,
    flushes_completed: u64,
    /// An error reply that arrived before the crash was started.
    failure: Option<String>,
}

impl Log {
    fn new(round: u64) -> Log {
        Log {
            event: 0,
            round,
            writes: Vec::new(),
            history: vec![Vec::new(); SECTORS as usize],
            busy_blocks: vec![false; BLOCKS as usize],
            last_flush_sent: None,
            flushes_completed: 0,
            failure: None,
        }
    }

    /// Whether some write is already durable (a FLUSH may complete before any write did).
    fn anything_durable(&self) -> bool {
        self.writes
            .iter()
            .any(|write| write.durable(self.last_flush_sent))
    }

    fn tick(&mut self) -> u64 {
        self.event += 1;
        self.event
    }

    /// Chooses and records the next write: a range whose blocks have no write in flight.
    fn plan_write(&mut self, random: &mut Random) -> Option<usize> {
        for _ in 0..8 {
            let choice = random.range(0, 100);
            let (first_sector, sectors) = if choice < 55 {
                (
                    random.range(0, BLOCKS) * SECTORS_PER_BLOCK,
                    SECTORS_PER_BLOCK,
                )
            } else if choice < 75 {
                let blocks = random.range(2, 17);
                (
                    random.range(0, BLOCKS - blocks) * SECTORS_PER_BLOCK,
                    blocks * SECTORS_PER_BLOCK,
                )
            } else {
                let sectors = random.range(1, 33);
                (random.range(0, SECTORS - sectors), sectors)
            };
            let kind = if choice >= 95 {
                WriteKind::Zeroes
            } else if random.chance(2, 5) {
                WriteKind::Pool(random.range(0, POOL_PATTERNS))
            } else {
                WriteKind::Unique
            };
            let blocks = first_sector / SECTORS_PER_BLOCK
                ..(first_sector + sectors).div_ceil(SECTORS_PER_BLOCK);
            if blocks.clone().any(|block| self.busy_blocks[block as usize]) {
                continue;
            }
            for block in blocks {
                self.busy_blocks[block as usize] = true;
            }
            let index = self.writes.len();
            for sector in first_sector..first_sector + sectors {
                self.history[sector as usize].push(index as u32);
            }
            self.writes.push(WriteRecord {
                id: (self.round << 32) | index as u64,
                first_sector,
                sectors,
                kind,
                fua: random.chance(1, 20),
                acknowledged: None,
            });
            return Some(index);
        }
        None
    }

    fn acknowledge(&mut self, index: usize) {
        let event = self.tick();
        let write = &mut self.writes[index];
        write.acknowledged = Some(event);
        let blocks = write.first_sector / SECTORS_PER_BLOCK
            ..(write.first_sector + write.sectors).div_ceil(SECTORS_PER_BLOCK);
        for block in blocks {
            self.busy_blocks[block as usize] = false;
        }
    }
}

enum Pending {
    Write(usize),
    /// A FLUSH and the event at which it was sent.
    Flush(u64),
}

/// One connection's loop: keeps `QUEUE_DEPTH` requests in flight until the server goes away.
fn drive_connection(server: &ServeProcess, log: &Mutex<Log>, seed: u64, crashing: &AtomicBool) {
    let mut client = match NbdClient::connect(server.socket(), VOLUME) {
        Ok(client) => client,
        // The crash came before this connection's handshake finished (another connection
        // made something durable first): it has sent nothing, so there is nothing to check.
        Err(_) if crashing.load(Ordering::SeqCst) => return,
        Err(error) => panic!("connect before the crash: {error}"),
    };
    assert_ne!(
        client.transmission_flags & FLAG_CAN_MULTI_CONN,
        0,
        "the accounting relies on flushes covering every connection"
    );
    let mut random = Random::new(seed);
    let mut pending: HashMap<u64, Pending> = HashMap::new();
    let mut cookie = 0u64;
    loop {
        while pending.len() < QUEUE_DEPTH {
            cookie += 1;
            let sent = if random.chance(1, 30) {
                let sent_event = log.lock().expect("log").tick();
                pending.insert(cookie, Pending::Flush(sent_event));
                client.send(COMMAND_FLUSH, 0, cookie, 0, 0, &[])
            } else {
                let planned = {
                    let mut log = log.lock().expect("log");
                    log.plan_write(&mut random).map(|index| {
                        let write = &log.writes[index];
                        (
                            index,
                            write.first_sector,
                            write.sectors,
                            write.kind,
                            write.fua,
                            write.content(),
                        )
                    })
                };
                let Some((index, first_sector, sectors, kind, fua, content)) = planned else {
                    break;
                };
                pending.insert(cookie, Pending::Write(index));
                let flags = if fua { COMMAND_FLAG_FUA } else { 0 };
                let offset = first_sector * SECTOR_BYTES;
                let length = (sectors * SECTOR_BYTES) as u32;
                match kind {
                    WriteKind::Zeroes => {
                        client.send(COMMAND_WRITE_ZEROES, flags, cookie, offset, length, &[])
                    }
                    WriteKind::Unique | WriteKind::Pool(_) => {
                        let mut payload = Vec::with_capacity(length as usize);
                        for sector in first_sector..first_sector + sectors {
                            payload.extend_from_slice(&sector_bytes(content, sector));
                        }
                        client.send(COMMAND_WRITE, flags, cookie, offset, length, &payload)
                    }
                }
            };
            if sent.is_err() {
                return;
            }
        }
        if pending.is_empty() {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        let Ok(reply) = client.receive() else {
            return;
        };
        let request = pending
            .remove(&reply.cookie)
            .unwrap_or_else(|| panic!("reply to unknown cookie {}", reply.cookie));
        let mut log = log.lock().expect("log");
        if reply.error != 0 {
            // A server shutting down may refuse requests; before that, errors are bugs.
            if !crashing.load(Ordering::SeqCst) {
                log.failure = Some(format!("NBD error {} before the crash", reply.error));
            }
            return;
        }
        match request {
            Pending::Write(index) => log.acknowledge(index),
            Pending::Flush(sent_event) => {
                log.tick();
                log.flushes_completed += 1;
                log.last_flush_sent = Some(
                    log.last_flush_sent
                        .map_or(sent_event, |last| last.max(sent_event)),
                );
            }
        }
    }
}

/// How the server dies in a round.
#[derive(Clone, Copy, Debug)]
enum KillMoment {
    /// SIGKILL while the clients write.
    Writing,
    /// SIGTERM, then SIGKILL a few milliseconds later, during the shutdown checkpoint.
    ShuttingDown,
    /// SIGKILL while the clients write, then SIGKILL again during crash recovery.
    Recovering,
}

/// Figures of one round, printed so a run shows what it exercised.
#[derive(Debug, Default)]
struct RoundSummary {
    writes_sent: usize,
    writes_acknowledged: usize,
    writes_durable: usize,
    flushes_completed: u64,
    /// Sectors whose content is a write newer than their last durable one (or than the
    /// previous round's content): acknowledged-but-not-durable or unacknowledged writes that
    /// survived.
    sectors_newer_than_durable: usize,
    /// Sectors holding exactly their last durable write, older than some later write.
    sectors_durable_with_later_writes: usize,
}

/// Checks every sector against the log; returns the contents found (the next round's base).
fn verify(log: &Log, base: &[Content], volume: &[u8], summary: &mut RoundSummary) -> Vec<Content> {
    let mut found_contents = Vec::with_capacity(SECTORS as usize);
    let mut failures = Vec::new();
    for sector in 0..SECTORS {
        let history = &log.history[sector as usize];
        let durable_position = history
            .iter()
            .rposition(|&index| log.writes[index as usize].durable(log.last_flush_sent));
        let allowed: Vec<Content> = match durable_position {
            Some(position) => history[position..]
                .iter()
                .map(|&index| log.writes[index as usize].content())
                .collect(),
            None => std::iter::once(base[sector as usize])
                .chain(
                    history
                        .iter()
                        .map(|&index| log.writes[index as usize].content()),
                )
                .collect(),
        };
        let bytes = &volume[(sector * SECTOR_BYTES) as usize..][..SECTOR_BYTES as usize];
        match allowed
            .iter()
            .position(|content| sector_bytes(*content, sector) == bytes)
        {
            Some(position) => {
                found_contents.push(allowed[position]);
                if position > 0 {
                    summary.sectors_newer_than_durable += 1;
                } else if allowed.len() > 1 {
                    summary.sectors_durable_with_later_writes += 1;
                }
            }
            None => {
                found_contents.push(Content::Zero);
                if failures.len() < 10 {
                    let writes: Vec<String> = history
                        .iter()
                        .map(|&index| {
                            let write = &log.writes[index as usize];
                            format!(
                                "{:?} fua={} acknowledged={:?} durable={}",
                                write.content(),
                                write.fua,
                                write.acknowledged,
                                write.durable(log.last_flush_sent)
                            )
                        })
                        .collect();
                    failures.push(format!(
                        "sector {sector}: found {}, allowed {allowed:?}; base {:?}; writes {writes:?}",
                        identify(bytes, sector),
                        base[sector as usize]
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} (last completed flush sent at event {:?})",
        failures.join("\n"),
        log.last_flush_sent
    );
    found_contents
}

fn read_volume(server: &ServeProcess) -> Vec<u8> {
    let mut client = NbdClient::connect(server.socket(), VOLUME).expect("connect after restart");
    assert_eq!(client.size_bytes, VOLUME_BYTES);
    let mut volume = Vec::with_capacity(VOLUME_BYTES as usize);
    for offset in (0..VOLUME_BYTES).step_by(READ_BYTES as usize) {
        volume.extend_from_slice(&client.read(offset, READ_BYTES).expect("read after restart"));
    }
    client.disconnect().expect("disconnect");
    volume
}

/// fio writing duplicate and unique 4 KiB blocks with a flush every 16 writes, until killed.
fn start_fio_load(server: &ServeProcess, seed: u64) -> ChildGuard {
    require_tool("fio");
    let child = Command::new("fio")
        .args([
            // Jobs as threads of one process, so killing the process stops every job (a
            // forked job process would outlive its killed parent).
            "--thread",
            "--name=load",
            "--ioengine=nbd",
            &format!("--uri={}", server.uri(LOAD_VOLUME)),
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=16",
            "--size=64M",
            "--time_based",
            "--runtime=120",
            "--fsync=16",
            "--dedupe_percentage=50",
            &format!("--randseed={seed}"),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting fio");
    ChildGuard(Some(child))
}

fn environment_number(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|text| {
        text.parse()
            .unwrap_or_else(|_| panic!("{name} must be a number, not {text:?}"))
    })
}

// Goal: every write acknowledged before the last completed FLUSH (or with FUA) survives a
// SIGKILL of the server at random moments, with fio writing concurrently, and `onecopy check`
// stays clean; method: the module documentation's logged client, verified sector by sector
// after each restart, several rounds on one repository.
#[test]
fn kill_during_writes_keeps_flushed_writes() {
    let rounds = environment_number("ONECOPY_CRASH_ROUNDS").unwrap_or(ROUNDS_DEFAULT as u64);
    let seed = environment_number("ONECOPY_CRASH_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_nanos() as u64
    });
    eprintln!("crash test: {rounds} rounds, ONECOPY_CRASH_SEED={seed}");
    let mut random = Random::new(seed);
    let repository = TestRepository::new();
    repository.create_volume(VOLUME, &format!("{VOLUME_BYTES}"));
    repository.create_volume(LOAD_VOLUME, &format!("{LOAD_VOLUME_BYTES}"));
    let mut base = vec![Content::Zero; SECTORS as usize];
    let mut totals = RoundSummary::default();

    for round in 0..rounds {
        let mode = match round % 3 {
            0 => KillMoment::Writing,
            1 => KillMoment::ShuttingDown,
            _ => KillMoment::Recovering,
        };
        let server = repository.serve(&[]);
        let fio = start_fio_load(&server, random.next_u64());
        let log = Mutex::new(Log::new(round));
        let crashing = AtomicBool::new(false);
        let write_milliseconds = random.range(0, WRITE_MILLISECONDS_MAX);
        let seeds: Vec<u64> = (0..CONNECTIONS).map(|_| random.next_u64()).collect();
        std::thread::scope(|scope| {
            for seed in &seeds {
                let (server, log, crashing) = (&server, &log, &crashing);
                scope.spawn(move || drive_connection(server, log, *seed, crashing));
            }
            // Crash only once something is durable, so every round tests the contract.
            let started = Instant::now();
            while !log.lock().expect("log").anything_durable() {
                let failure = log.lock().expect("log").failure.clone();
                if let Some(failure) = failure {
                    server.kill_now();
                    panic!(
                        "round {round}: {failure}; server log:\n{}",
                        server.log_text()
                    );
                }
                if started.elapsed() > PROGRESS_TIMEOUT {
                    let stacks = thread_stacks(server.pid());
                    server.kill_now();
                    let log = log.lock().expect("log");
                    let acknowledged = log.writes.iter().filter(|w| w.acknowledged.is_some());
                    panic!(
                        "round {round}: no write durable in {PROGRESS_TIMEOUT:?}; {} writes \
                         sent, {} acknowledged; server log:\n{}\nserver threads:\n{stacks}",
                        log.writes.len(),
                        acknowledged.count(),
                        server.log_text()
                    );
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(write_milliseconds));
            crashing.store(true, Ordering::SeqCst);
            match mode {
                KillMoment::Writing | KillMoment::Recovering => server.kill_now(),
                KillMoment::ShuttingDown => {
                    server.terminate();
                    std::thread::sleep(Duration::from_millis(random.range(0, 50)));
                    server.kill_now();
                }
            }
        });
        drop(server);
        drop(fio);
        let log = log.into_inner().expect("log");
        if let Some(failure) = &log.failure {
            panic!("round {round}: {failure}");
        }
        if let KillMoment::Recovering = mode {
            let recovering = ServeProcess::start_unready(&repository);
            std::thread::sleep(Duration::from_millis(random.range(0, 40)));
            recovering.kill();
        }

        let server = repository.serve(&[]);
        let volume = read_volume(&server);
        // The fio volume holds no known contents, but every block must read back.
        run("nbdcopy", &[&server.uri(LOAD_VOLUME), "null:"]);
        server.stop();
        repository.check_clean();

        let mut summary = RoundSummary {
            writes_sent: log.writes.len(),
            writes_acknowledged: log
                .writes
                .iter()
                .filter(|w| w.acknowledged.is_some())
                .count(),
            writes_durable: log
                .writes
                .iter()
                .filter(|w| w.durable(log.last_flush_sent))
                .count(),
            flushes_completed: log.flushes_completed,
            ..RoundSummary::default()
        };
        base = verify(&log, &base, &volume, &mut summary);
        eprintln!("round {round} ({mode:?} after {write_milliseconds} ms): {summary:?}");
        assert!(
            summary.writes_durable > 0,
            "round {round} made nothing durable"
        );
        totals.writes_sent += summary.writes_sent;
        totals.writes_acknowledged += summary.writes_acknowledged;
        totals.writes_durable += summary.writes_durable;
        totals.flushes_completed += summary.flushes_completed;
        totals.sectors_newer_than_durable += summary.sectors_newer_than_durable;
        totals.sectors_durable_with_later_writes += summary.sectors_durable_with_later_writes;
    }
    eprintln!("crash test totals: {totals:?}");
    // Some acknowledged writes were not yet durable at a crash (unless every round ended
    // right after a flush), so the rounds did test what a crash may drop.
    assert!(
        totals.writes_acknowledged > totals.writes_durable,
        "{totals:?}"
    );
}
