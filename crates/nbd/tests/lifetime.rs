//! How long a connection holds the server's resources: requests queued by a client that has
//! left are dropped, idle connections give their slot to new clients when the server is full,
//! a handshake has one deadline however slowly the client sends, and a client that stops
//! reading replies is disconnected.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use onecopy_nbd::protocol as p;
use onecopy_nbd::{
    AllocationExtent, BlockSize, Export, ExportError, ExportMap, ListenAddress, MemoryExport,
    Server, ServerConfig, ZeroOptions,
};

const MIB: u64 = 1 << 20;
/// Reads queued by the departing client, as in the reported case.
const QUEUED_READS: u64 = 3000;
const READ_BYTES: u32 = 32 << 20;

/// A large export of zeros whose reads take a while and are counted.
struct SlowReads {
    read_delay: Duration,
    reads: AtomicUsize,
}

impl Export for SlowReads {
    fn size(&self) -> u64 {
        1 << 30
    }
    fn block_size(&self) -> BlockSize {
        BlockSize::DEFAULT
    }
    fn read_only(&self) -> bool {
        true
    }
    fn flush_is_global(&self) -> bool {
        true
    }
    fn read(&self, _offset: u64, buffer: &mut [u8]) -> Result<(), ExportError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(self.read_delay);
        buffer.fill(0);
        Ok(())
    }
    fn write(&self, _offset: u64, _data: &[u8], _fua: bool) -> Result<(), ExportError> {
        unreachable!("read-only")
    }
    fn flush(&self) -> Result<(), ExportError> {
        Ok(())
    }
    fn trim(&self, _offset: u64, _length: u64, _fua: bool) -> Result<(), ExportError> {
        unreachable!("read-only")
    }
    fn write_zeroes(
        &self,
        _offset: u64,
        _length: u64,
        _options: ZeroOptions,
    ) -> Result<(), ExportError> {
        unreachable!("read-only")
    }
    fn block_status(
        &self,
        _offset: u64,
        length: u64,
        extents: &mut Vec<AllocationExtent>,
    ) -> Result<(), ExportError> {
        extents.push(AllocationExtent {
            length,
            hole: false,
            zero: false,
        });
        Ok(())
    }
    fn cache(&self, _offset: u64, _length: u64) -> Result<(), ExportError> {
        Ok(())
    }
}

/// Enters transmission on `name` with `OPT_EXPORT_NAME` (simple replies) over any stream.
fn enter_transmission(stream: &mut impl ReadWrite, name: &str) {
    let mut greeting = [0; 18];
    stream.read_exact(&mut greeting).unwrap();
    assert_eq!(be64(&greeting), p::INIT_MAGIC);
    let mut bytes = (p::FLAG_C_FIXED_NEWSTYLE | p::FLAG_C_NO_ZEROES)
        .to_be_bytes()
        .to_vec();
    bytes.extend_from_slice(&p::OPTION_MAGIC.to_be_bytes());
    bytes.extend_from_slice(&p::OPT_EXPORT_NAME.to_be_bytes());
    bytes.extend_from_slice(&(name.len() as u32).to_be_bytes());
    bytes.extend_from_slice(name.as_bytes());
    stream.write_all(&bytes).unwrap();
    let mut export = [0; 10];
    stream.read_exact(&mut export).unwrap();
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

fn read_request(cookie: u64, offset: u64, length: u32) -> Vec<u8> {
    onecopy_nbd::codec::RequestHeader {
        flags: 0,
        command: p::CMD_READ,
        cookie,
        offset,
        length,
    }
    .encode()
    .to_vec()
}

/// Waits until the server serves no connection; returns how long that took.
fn wait_until_idle(server: &Server, limit: Duration) -> Duration {
    let started = Instant::now();
    while server.statistics().connections_active > 0 {
        assert!(
            started.elapsed() < limit,
            "the connection still runs after {limit:?}: {:?}",
            server.statistics()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    started.elapsed()
}

/// Goal: a client that queues thousands of 32 MiB reads and disconnects costs the server
/// only the reads already running, over a unix socket and over TCP. Method: an export whose
/// reads take 20 ms and are counted (executing all 3,000 would take a minute); queue the
/// reads, close the socket, and require the connection to end within seconds having executed
/// a handful of reads.
#[test]
fn requests_queued_by_a_departed_client_are_dropped() {
    for transport in ["unix", "tcp"] {
        let export = Arc::new(SlowReads {
            read_delay: Duration::from_millis(20),
            reads: AtomicUsize::new(0),
        });
        let catalog = Arc::new(ExportMap::single(
            "slow",
            Arc::clone(&export) as Arc<dyn Export>,
        ));
        let directory = tempfile::tempdir().unwrap();
        let address = match transport {
            "unix" => ListenAddress::Unix(directory.path().join("nbd.sock")),
            _ => ListenAddress::tcp("127.0.0.1:0").unwrap(),
        };
        let server = Server::start(&address, catalog, quiet_config()).unwrap();
        let mut stream: Box<dyn ReadWrite> = match server.address() {
            ListenAddress::Unix(path) => Box::new(UnixStream::connect(path).unwrap()),
            ListenAddress::Tcp(address) => Box::new(TcpStream::connect(address).unwrap()),
        };
        enter_transmission(&mut stream, "slow");
        let mut requests = Vec::new();
        for index in 0..QUEUED_READS {
            let offset = (index * u64::from(READ_BYTES)) % (1 << 30);
            requests.extend(read_request(index, offset, READ_BYTES));
        }
        stream.write_all(&requests).unwrap();
        drop(stream);
        let took = wait_until_idle(&server, Duration::from_secs(10));
        let executed = export.reads.load(Ordering::SeqCst);
        assert!(
            executed <= 8,
            "{transport}: {executed} of {QUEUED_READS} queued reads executed after the client left"
        );
        eprintln!("{transport}: connection ended {took:?} after the client left, {executed} reads executed");
        server.shutdown();
    }
}

/// Goal: when every slot is taken, a new client gets the slot of the connection idle longest
/// if it has been idle for the idle timeout, and is refused while none has; a connection that
/// was just used keeps its slot. Method: two slots, two clients, a third client before and
/// after the timeout, with the first client active just before.
#[test]
fn idle_connections_give_their_slot_to_new_clients() {
    let config = ServerConfig {
        connections_max: 2,
        idle_timeout: Some(Duration::from_millis(300)),
        ..ServerConfig::default()
    };
    let export = Arc::new(MemoryExport::new(MIB));
    let catalog = ExportMap::single("disk", export as Arc<dyn Export>);
    let mut server = TestServer::start_with(Arc::new(catalog), config);
    let mut first = Client::open(&server, "disk", false, false);
    let mut second = Client::open(&server, "disk", false, false);

    let mut early = server.connect();
    let mut received = Vec::new();
    early.read_to_end(&mut received).unwrap();
    assert!(received.is_empty(), "no slot is idle long enough yet");

    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(first.read(0, 512).unwrap(), vec![0; 512]);
    let mut third = Client::open(&server, "disk", false, false);
    assert_eq!(third.read(0, 512).unwrap(), vec![0; 512]);
    let mut rest = Vec::new();
    let _ = second.stream.read_to_end(&mut rest);
    assert!(rest.is_empty(), "the idle connection was closed");
    assert_eq!(
        first.read(512, 512).unwrap(),
        vec![0; 512],
        "the active one kept its slot"
    );
    first.disconnect();
    third.disconnect();
    let statistics = server.shutdown();
    assert_eq!(statistics.connections_refused, 1);
    assert_eq!(statistics.connections_evicted, 1);
    assert!(
        server
            .events()
            .iter()
            .any(|event| event.contains("every connection slot was taken")),
        "{:?}",
        server.events()
    );
}

/// Goal: the handshake timeout bounds the whole handshake, not each read: a client that
/// sends one byte every 100 ms is dropped once the timeout has passed. Method: a 300 ms
/// timeout, an option sent byte by byte for up to 5 s; the server must close within 2 s.
#[test]
fn handshake_timeout_bounds_the_whole_handshake() {
    let config = ServerConfig {
        handshake_timeout: Duration::from_millis(300),
        ..ServerConfig::default()
    };
    let export = Arc::new(MemoryExport::new(MIB));
    let catalog = ExportMap::single("disk", export as Arc<dyn Export>);
    let server = TestServer::start_with(Arc::new(catalog), config);
    let mut stream = server.connect();
    greet(&mut stream, p::FLAG_C_FIXED_NEWSTYLE);
    let started = Instant::now();
    let mut sender = stream.try_clone().unwrap();
    let dribbling = std::thread::spawn(move || {
        let mut option = p::OPTION_MAGIC.to_be_bytes().to_vec();
        option.extend_from_slice(&p::OPT_INFO.to_be_bytes());
        option.extend_from_slice(&1000u32.to_be_bytes());
        option.extend(std::iter::repeat_n(0u8, 1000));
        for byte in option.into_iter().take(50) {
            if sender.write_all(&[byte]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let mut rest = Vec::new();
    let _ = stream.read_to_end(&mut rest);
    let took = started.elapsed();
    dribbling.join().unwrap();
    assert!(rest.is_empty());
    assert!(
        took < Duration::from_secs(2),
        "a dribbling client kept its handshake open for {took:?}"
    );
}

/// Goal: a client that stops reading replies is disconnected once a reply has made no
/// progress for the idle timeout, so it cannot hold its slot and buffers forever. Method: a
/// 300 ms idle timeout; queue large reads without reading anything; the connection must end
/// within seconds while the client keeps its socket open.
#[test]
fn a_client_that_stops_reading_is_disconnected() {
    let config = ServerConfig {
        idle_timeout: Some(Duration::from_millis(300)),
        ..quiet_config()
    };
    let export = Arc::new(SlowReads {
        read_delay: Duration::ZERO,
        reads: AtomicUsize::new(0),
    });
    let catalog = Arc::new(ExportMap::single("zeros", export as Arc<dyn Export>));
    let directory = tempfile::tempdir().unwrap();
    let address = ListenAddress::Unix(directory.path().join("nbd.sock"));
    let server = Server::start(&address, catalog, config).unwrap();
    let mut stream = UnixStream::connect(directory.path().join("nbd.sock")).unwrap();
    enter_transmission(&mut stream, "zeros");
    let mut requests = Vec::new();
    for index in 0..8 {
        requests.extend(read_request(index, 0, READ_BYTES));
    }
    stream.write_all(&requests).unwrap();
    wait_until_idle(&server, Duration::from_secs(10));
    drop(stream);
    server.shutdown();
}
