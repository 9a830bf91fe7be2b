//! Server behaviour around the protocol: export failures and their reporting, limits on
//! connections and handshakes, clean shutdown with requests in flight, socket handling, TCP.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use onecopy_nbd::protocol as p;
use onecopy_nbd::{
    AllocationExtent, BlockSize, Export, ExportError, ExportMap, ListenAddress, MemoryExport,
    Server, ServerConfig, ZeroOptions,
};

/// Wraps a memory export and fails on purpose: reads at offset 0 fail with an I/O error,
/// writes with a full store, fast zeroing is refused, block status returns no extents, and
/// cache panics. Reads elsewhere sleep `read_delay` first. Every read records the scheduling
/// policy of the thread serving it.
struct FaultyExport {
    inner: MemoryExport,
    read_delay: Duration,
    reads_started: AtomicUsize,
    read_policies: std::sync::Mutex<Vec<i32>>,
}

impl FaultyExport {
    fn new(read_delay: Duration) -> FaultyExport {
        FaultyExport {
            inner: MemoryExport::new(1 << 20),
            read_delay,
            reads_started: AtomicUsize::new(0),
            read_policies: std::sync::Mutex::new(Vec::new()),
        }
    }
}

impl Export for FaultyExport {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn block_size(&self) -> BlockSize {
        self.inner.block_size()
    }
    fn read_only(&self) -> bool {
        false
    }
    fn flush_is_global(&self) -> bool {
        false
    }
    fn read(&self, offset: u64, buffer: &mut [u8]) -> Result<(), ExportError> {
        self.reads_started.fetch_add(1, Ordering::SeqCst);
        // SAFETY: pid 0 names the calling thread.
        let policy = unsafe { libc::sched_getscheduler(0) };
        self.read_policies.lock().unwrap().push(policy);
        if offset == 0 {
            return Err(ExportError::io(
                "reading container 7",
                std::io::Error::from_raw_os_error(libc::EIO),
            ));
        }
        std::thread::sleep(self.read_delay);
        self.inner.read(offset, buffer)
    }
    fn write(&self, _offset: u64, _data: &[u8], _fua: bool) -> Result<(), ExportError> {
        Err(ExportError::io(
            "appending",
            std::io::Error::from_raw_os_error(libc::ENOSPC),
        ))
    }
    fn flush(&self) -> Result<(), ExportError> {
        Err(ExportError::failed("journal is corrupt"))
    }
    fn trim(&self, offset: u64, length: u64, fua: bool) -> Result<(), ExportError> {
        self.inner.trim(offset, length, fua)
    }
    fn write_zeroes(
        &self,
        offset: u64,
        length: u64,
        options: ZeroOptions,
    ) -> Result<(), ExportError> {
        if options.fast_only {
            return Err(ExportError::FastZeroUnsupported);
        }
        self.inner.write_zeroes(offset, length, options)
    }
    fn block_status(
        &self,
        _offset: u64,
        _length: u64,
        _extents: &mut Vec<AllocationExtent>,
    ) -> Result<(), ExportError> {
        Ok(())
    }
    fn cache(&self, _offset: u64, _length: u64) -> Result<(), ExportError> {
        panic!("cache is broken on purpose");
    }
}

fn faulty_server(read_delay: Duration, config: ServerConfig) -> (TestServer, Arc<FaultyExport>) {
    let export = Arc::new(FaultyExport::new(read_delay));
    let catalog = ExportMap::single("faulty", Arc::clone(&export) as Arc<dyn Export>);
    (TestServer::start_with(Arc::new(catalog), config), export)
}

// Goal: export failures become the mapped NBD errors, are logged with context, and the
// connection keeps serving; a broken block status answer and a panic become EIO.
#[test]
fn export_failures_are_reported() {
    let (server, _) = faulty_server(Duration::ZERO, ServerConfig::default());
    let mut client = Client::open(&server, "faulty", true, true);
    assert_eq!(
        client.flags & p::FLAG_CAN_MULTI_CONN,
        0,
        "flush is not global"
    );
    assert_eq!(client.read(0, 4096).unwrap_err(), p::EIO);
    assert_eq!(client.write(0, &[1; 4096], 0), p::ENOSPC);
    assert_eq!(client.command(p::CMD_FLUSH, 0, 0, 0), p::EIO);
    assert_eq!(
        client.command(p::CMD_WRITE_ZEROES, p::CMD_FLAG_FAST_ZERO, 0, 4096),
        p::ENOTSUP
    );
    assert_eq!(client.block_status(0, 4096, 0), Err(p::EIO));
    assert_eq!(
        client.command(p::CMD_CACHE, 0, 0, 4096),
        p::EIO,
        "a panic becomes EIO"
    );
    assert_eq!(client.read(4096, 4096).unwrap(), vec![0; 4096]);
    client.disconnect();
    let events = server.events();
    assert!(
        events
            .iter()
            .any(|event| event.contains("read at offset 0 length 4096")
                && event.contains("reading container 7")),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|event| event.contains("journal is corrupt")),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|event| event.contains("broke its contract")),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|event| event.contains("broken on purpose")),
        "{events:?}"
    );
    assert!(
        !events.iter().any(|event| event.contains("not faster")),
        "a refused fast zero is not logged: {events:?}"
    );
}

// Goal: shutdown lets in-flight requests finish and be answered before closing; method:
// pipeline slow reads, shut down while they run, and count the replies.
#[test]
fn shutdown_finishes_in_flight_requests() {
    let (mut server, export) = faulty_server(Duration::from_millis(300), ServerConfig::default());
    let mut client = Client::open(&server, "faulty", false, false);
    for index in 1..=4u64 {
        client.send(0, p::CMD_READ, index * 4096, 4096, &[]);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while export.reads_started.load(Ordering::SeqCst) < 4 {
        assert!(Instant::now() < deadline, "reads did not start");
        std::thread::sleep(Duration::from_millis(5));
    }
    let statistics = server.shutdown();
    assert_eq!(statistics.connections_active, 0);
    for _ in 0..4 {
        assert_eq!(client.receive().1.error(), 0);
    }
    let mut rest = Vec::new();
    client.stream.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "connection closed after the last reply");
    assert!(!server.socket.exists(), "socket file removed");
}

// Goal: requests are served by threads under SCHED_BATCH unless the config turns it off
// (then they keep the policy of the thread that started the server).
#[test]
fn connection_threads_use_batch_scheduling() {
    for batch_scheduling in [true, false] {
        let config = ServerConfig {
            batch_scheduling,
            ..ServerConfig::default()
        };
        let (server, export) = faulty_server(Duration::ZERO, config);
        let mut client = Client::open(&server, "faulty", false, false);
        for offset in 1..=8 {
            assert_eq!(client.read(offset * 4096, 4096).unwrap(), vec![0; 4096]);
        }
        client.disconnect();
        let policies = export.read_policies.lock().unwrap().clone();
        assert_eq!(policies.len(), 8);
        // SAFETY: pid 0 names the calling thread.
        let starter = unsafe { libc::sched_getscheduler(0) };
        let expected = if batch_scheduling {
            libc::SCHED_BATCH
        } else {
            starter
        };
        assert_ne!(
            starter,
            libc::SCHED_BATCH,
            "the test thread runs under the normal policy"
        );
        assert!(
            policies.iter().all(|&policy| policy == expected),
            "batch_scheduling {batch_scheduling}: policies {policies:?}"
        );
    }
}

// Goal: a client beyond connections_max is disconnected at once while others are served.
#[test]
fn connection_limit() {
    let config = ServerConfig {
        connections_max: 1,
        ..ServerConfig::default()
    };
    let export = Arc::new(MemoryExport::new(1 << 20));
    let catalog = ExportMap::single("disk", export as Arc<dyn Export>);
    let mut server = TestServer::start_with(Arc::new(catalog), config);
    let mut first = Client::open(&server, "disk", false, false);
    let mut second = server.connect();
    let mut received = Vec::new();
    second.read_to_end(&mut received).unwrap();
    assert!(received.is_empty(), "refused connection gets no greeting");
    assert_eq!(first.read(0, 512).unwrap(), vec![0; 512]);
    first.disconnect();
    // The slot frees when the first connection's thread ends.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let statistics = server.server.as_ref().unwrap().statistics();
        if statistics.connections_active == 0 {
            break;
        }
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut third = Client::open(&server, "disk", false, false);
    assert_eq!(third.read(0, 512).unwrap(), vec![0; 512]);
    third.disconnect();
    let statistics = server.shutdown();
    assert_eq!(statistics.connections_refused, 1);
    assert_eq!(statistics.connections_accepted, 2);
    assert!(server
        .events()
        .iter()
        .any(|event| event.contains("refused connection")));
}

// Goal: a client silent during the handshake is dropped after handshake_timeout.
#[test]
fn handshake_timeout() {
    let config = ServerConfig {
        handshake_timeout: Duration::from_millis(200),
        ..ServerConfig::default()
    };
    let export = Arc::new(MemoryExport::new(1 << 20));
    let catalog = ExportMap::single("disk", export as Arc<dyn Export>);
    let server = TestServer::start_with(Arc::new(catalog), config);
    let mut stream = server.connect();
    greet(&mut stream, p::FLAG_C_FIXED_NEWSTYLE);
    let started = Instant::now();
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    assert!(started.elapsed() < Duration::from_secs(10));
    // Transmission has no timeout: an idle client stays connected past it.
    let mut client = Client::open(&server, "disk", false, false);
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(client.read(0, 512).unwrap(), vec![0; 512]);
    client.disconnect();
}

// Goal: a stale socket file is replaced, but a live server's socket is not stolen.
#[test]
fn socket_file_handling() {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("nbd.sock");
    drop(UnixListener::bind(&path).unwrap()); // leaves a socket file nobody listens on
    assert!(path.exists());
    let catalog = Arc::new(ExportMap::single("disk", Arc::new(MemoryExport::new(4096))));
    let address = ListenAddress::Unix(path.clone());
    let server = Server::start(&address, catalog.clone(), quiet_config()).expect("replaces stale");
    assert!(Server::start(&address, catalog.clone(), quiet_config()).is_err());
    assert!(
        UnixStream::connect(&path).is_ok(),
        "first server still reachable"
    );
    server.shutdown();
    assert!(!path.exists());
    std::fs::write(&path, b"not a socket").unwrap();
    assert!(
        Server::start(&address, catalog, quiet_config()).is_err(),
        "regular file kept"
    );
}

// Goal: the TCP transport serves the same protocol; method: handshake and I/O over a TCP
// connection to an ephemeral loopback port.
#[test]
fn tcp_transport() {
    let catalog = Arc::new(ExportMap::single(
        "disk",
        Arc::new(MemoryExport::new(1 << 20)),
    ));
    let address = ListenAddress::tcp("127.0.0.1:0").unwrap();
    let server = Server::start(&address, catalog, quiet_config()).unwrap();
    let ListenAddress::Tcp(bound) = server.address().clone() else {
        panic!("tcp address expected")
    };
    assert_ne!(bound.port(), 0);
    let mut stream = TcpStream::connect(bound).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut greeting = [0; 18];
    stream.read_exact(&mut greeting).unwrap();
    assert_eq!(be64(&greeting[8..]), p::OPTION_MAGIC);
    let mut bytes = (p::FLAG_C_FIXED_NEWSTYLE | p::FLAG_C_NO_ZEROES)
        .to_be_bytes()
        .to_vec();
    bytes.extend_from_slice(&p::OPTION_MAGIC.to_be_bytes());
    bytes.extend_from_slice(&p::OPT_EXPORT_NAME.to_be_bytes());
    bytes.extend_from_slice(&4u32.to_be_bytes());
    bytes.extend_from_slice(b"disk");
    stream.write_all(&bytes).unwrap();
    let mut export = [0; 10];
    stream.read_exact(&mut export).unwrap();
    assert_eq!(be64(&export), 1 << 20);
    let header = onecopy_nbd::codec::RequestHeader {
        flags: 0,
        command: p::CMD_WRITE,
        cookie: 3,
        offset: 512,
        length: 4,
    };
    stream.write_all(&header.encode()).unwrap();
    stream.write_all(b"data").unwrap();
    // Requests in flight together are unordered, so the read waits for the write's reply.
    let mut reply = [0; 16];
    stream.read_exact(&mut reply).unwrap();
    assert_eq!(
        (be32(&reply), be32(&reply[4..]), be64(&reply[8..])),
        (p::SIMPLE_REPLY_MAGIC, 0, 3)
    );
    let read = onecopy_nbd::codec::RequestHeader {
        command: p::CMD_READ,
        cookie: 4,
        ..header
    };
    stream.write_all(&read.encode()).unwrap();
    let mut reply = [0; 16 + 4];
    stream.read_exact(&mut reply).unwrap();
    assert_eq!((be32(&reply[4..]), be64(&reply[8..])), (0, 4));
    assert_eq!(&reply[16..], b"data");
    server.shutdown();
}

// Goal: an invalid configuration is refused with a message instead of misbehaving later.
#[test]
fn invalid_configuration() {
    let catalog = Arc::new(ExportMap::new());
    let directory = tempfile::tempdir().unwrap();
    let address = ListenAddress::Unix(directory.path().join("s"));
    for config in [
        ServerConfig {
            workers_per_connection: 0,
            ..quiet_config()
        },
        ServerConfig {
            requests_in_flight_max: 0,
            ..quiet_config()
        },
        ServerConfig {
            in_flight_payload_bytes_max: 1 << 20,
            ..quiet_config()
        },
        ServerConfig {
            connections_max: 0,
            ..quiet_config()
        },
        ServerConfig {
            handshake_timeout: Duration::ZERO,
            ..quiet_config()
        },
    ] {
        let error = Server::start(&address, catalog.clone(), config)
            .err()
            .expect("refused");
        assert!(
            error.to_string().contains("invalid server configuration"),
            "{error}"
        );
    }
}
