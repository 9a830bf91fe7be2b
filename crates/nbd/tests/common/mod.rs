//! Shared test helpers: a server over a temporary unix socket, a minimal raw NBD client that
//! speaks the protocol byte by byte (independent of the server's own encoders where it
//! matters), and helpers to run external NBD tools.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use onecopy_nbd::protocol as p;
use onecopy_nbd::{
    silent_event_sink, Event, Export, ExportCatalog, ExportMap, ListenAddress, MemoryExport,
    Server, ServerConfig,
};

/// A running server on a socket in a temporary directory.
pub struct TestServer {
    pub server: Option<Server>,
    pub socket: PathBuf,
    pub events: Arc<Mutex<Vec<String>>>,
    _directory: tempfile::TempDir,
}

impl TestServer {
    /// Serves `catalog` with `config`; events are recorded in `events` instead of printed.
    pub fn start_with(catalog: Arc<dyn ExportCatalog>, mut config: ServerConfig) -> TestServer {
        let directory = tempfile::tempdir().expect("temporary directory");
        let socket = directory.path().join("nbd.sock");
        let events = Arc::new(Mutex::new(Vec::new()));
        let recorded = Arc::clone(&events);
        config.events = Arc::new(move |event: &Event<'_>| {
            recorded
                .lock()
                .expect("events lock")
                .push(event.to_string());
        });
        let server = Server::start(&ListenAddress::Unix(socket.clone()), catalog, config)
            .expect("server starts");
        TestServer {
            server: Some(server),
            socket,
            events,
            _directory: directory,
        }
    }

    /// Serves one writable memory export named `name` of `size_bytes`.
    pub fn memory(name: &str, size_bytes: u64) -> (TestServer, Arc<MemoryExport>) {
        let export = Arc::new(MemoryExport::new(size_bytes));
        let catalog = ExportMap::single(name, Arc::clone(&export) as Arc<dyn Export>);
        (
            TestServer::start_with(Arc::new(catalog), ServerConfig::default()),
            export,
        )
    }

    pub fn uri(&self, name: &str) -> String {
        format!("nbd+unix:///{name}?socket={}", self.socket.display())
    }

    pub fn connect(&self) -> UnixStream {
        let stream = UnixStream::connect(&self.socket).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        stream
    }

    pub fn events(&self) -> Vec<String> {
        self.events.lock().expect("events lock").clone()
    }

    pub fn shutdown(&mut self) -> onecopy_nbd::ServerStatistics {
        self.server.take().expect("running").shutdown()
    }
}

/// A config whose events are dropped (for tests that start servers by hand).
pub fn quiet_config() -> ServerConfig {
    ServerConfig {
        events: silent_event_sink(),
        ..ServerConfig::default()
    }
}

pub fn read_exact(stream: &mut UnixStream, count: usize) -> Vec<u8> {
    let mut bytes = vec![0; count];
    stream.read_exact(&mut bytes).expect("read from server");
    bytes
}

pub fn be16(bytes: &[u8]) -> u16 {
    u16::from_be_bytes(bytes[..2].try_into().unwrap())
}
pub fn be32(bytes: &[u8]) -> u32 {
    u32::from_be_bytes(bytes[..4].try_into().unwrap())
}
pub fn be64(bytes: &[u8]) -> u64 {
    u64::from_be_bytes(bytes[..8].try_into().unwrap())
}

/// Reads the greeting, checks it, and sends client flags.
pub fn greet(stream: &mut UnixStream, client_flags: u32) {
    let greeting = read_exact(stream, 18);
    assert_eq!(be64(&greeting), p::INIT_MAGIC);
    assert_eq!(be64(&greeting[8..]), p::OPTION_MAGIC);
    assert_eq!(
        be16(&greeting[16..]),
        p::FLAG_FIXED_NEWSTYLE | p::FLAG_NO_ZEROES
    );
    stream.write_all(&client_flags.to_be_bytes()).unwrap();
}

pub fn send_option(stream: &mut UnixStream, option: u32, data: &[u8]) {
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&p::OPTION_MAGIC.to_be_bytes());
    bytes.extend_from_slice(&option.to_be_bytes());
    bytes.extend_from_slice(&(data.len() as u32).to_be_bytes());
    bytes.extend_from_slice(data);
    stream.write_all(&bytes).unwrap();
}

/// One option reply: (option, reply type, data).
pub fn read_option_reply(stream: &mut UnixStream) -> (u32, u32, Vec<u8>) {
    let header = read_exact(stream, 20);
    assert_eq!(be64(&header), p::OPTION_REPLY_MAGIC, "option reply magic");
    let length = be32(&header[16..]) as usize;
    (
        be32(&header[8..]),
        be32(&header[12..]),
        read_exact(stream, length),
    )
}

/// Reads option replies up to and including the final one (ACK or an error).
pub fn read_option_replies(stream: &mut UnixStream) -> Vec<(u32, u32, Vec<u8>)> {
    let mut replies = Vec::new();
    loop {
        let reply = read_option_reply(stream);
        let last = reply.1 == p::REP_ACK || reply.1 & p::REP_FLAG_ERROR != 0;
        replies.push(reply);
        if last {
            return replies;
        }
    }
}

/// Data of OPT_GO / OPT_INFO.
pub fn go_data(name: &str, information: &[u16]) -> Vec<u8> {
    let mut data = (name.len() as u32).to_be_bytes().to_vec();
    data.extend_from_slice(name.as_bytes());
    data.extend_from_slice(&(information.len() as u16).to_be_bytes());
    for item in information {
        data.extend_from_slice(&item.to_be_bytes());
    }
    data
}

/// Data of OPT_SET/LIST_META_CONTEXT.
pub fn meta_data(name: &str, queries: &[&str]) -> Vec<u8> {
    let mut data = (name.len() as u32).to_be_bytes().to_vec();
    data.extend_from_slice(name.as_bytes());
    data.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for query in queries {
        data.extend_from_slice(&(query.len() as u32).to_be_bytes());
        data.extend_from_slice(query.as_bytes());
    }
    data
}

/// A structured reply chunk: (flags, type, payload).
pub type Chunk = (u16, u16, Vec<u8>);

/// A reply to one request.
#[derive(Debug)]
pub enum Reply {
    Simple { error: u32, data: Vec<u8> },
    Structured { chunks: Vec<Chunk> },
}

impl Reply {
    /// The error of the reply (first error chunk for structured replies), or zero.
    pub fn error(&self) -> u32 {
        match self {
            Reply::Simple { error, .. } => *error,
            Reply::Structured { chunks } => chunks
                .iter()
                .find(|(_, chunk_type, _)| chunk_type & 0x8000 != 0)
                .map(|(_, _, payload)| be32(payload))
                .unwrap_or(0),
        }
    }
}

/// A raw NBD client in transmission phase.
pub struct Client {
    pub stream: UnixStream,
    pub size: u64,
    pub flags: u16,
    pub structured: bool,
    next_cookie: u64,
    /// Lengths of reads in flight (needed to parse simple replies).
    reads: HashMap<u64, u32>,
    /// Chunks of structured replies not yet complete.
    partial: HashMap<u64, Vec<Chunk>>,
}

impl Client {
    /// Wraps a stream that is already in transmission phase.
    pub fn from_stream(stream: UnixStream, size: u64, flags: u16, structured: bool) -> Client {
        Client {
            stream,
            size,
            flags,
            structured,
            next_cookie: 1,
            reads: HashMap::new(),
            partial: HashMap::new(),
        }
    }

    /// Connects with fixed newstyle, optionally negotiates structured replies and
    /// base:allocation, then enters transmission with OPT_GO.
    pub fn open(server: &TestServer, name: &str, structured: bool, block_status: bool) -> Client {
        let mut stream = server.connect();
        greet(&mut stream, p::FLAG_C_FIXED_NEWSTYLE | p::FLAG_C_NO_ZEROES);
        if structured {
            send_option(&mut stream, p::OPT_STRUCTURED_REPLY, &[]);
            assert_eq!(read_option_reply(&mut stream).1, p::REP_ACK);
        }
        if block_status {
            send_option(
                &mut stream,
                p::OPT_SET_META_CONTEXT,
                &meta_data(name, &[p::CONTEXT_BASE_ALLOCATION]),
            );
            let replies = read_option_replies(&mut stream);
            assert_eq!(replies.len(), 2, "one context then ACK: {replies:?}");
            assert_eq!(replies[0].1, p::REP_META_CONTEXT);
        }
        send_option(
            &mut stream,
            p::OPT_GO,
            &go_data(name, &[p::INFO_BLOCK_SIZE]),
        );
        let replies = read_option_replies(&mut stream);
        assert_eq!(
            replies.last().unwrap().1,
            p::REP_ACK,
            "GO accepted: {replies:?}"
        );
        let export = replies
            .iter()
            .find(|(_, kind, data)| *kind == p::REP_INFO && be16(data) == p::INFO_EXPORT)
            .expect("INFO_EXPORT sent");
        Client::from_stream(
            stream,
            be64(&export.2[2..]),
            be16(&export.2[10..]),
            structured,
        )
    }

    /// Sends a request without waiting; returns its cookie.
    pub fn send(&mut self, flags: u16, command: u16, offset: u64, length: u32, data: &[u8]) -> u64 {
        let (cookie, bytes) = self.encode(flags, command, offset, length, data);
        self.stream.write_all(&bytes).unwrap();
        cookie
    }

    /// Encodes a request for sending later (by another thread); returns cookie and bytes.
    pub fn encode(
        &mut self,
        flags: u16,
        command: u16,
        offset: u64,
        length: u32,
        data: &[u8],
    ) -> (u64, Vec<u8>) {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        let mut bytes = Vec::with_capacity(28 + data.len());
        bytes.extend_from_slice(&p::REQUEST_MAGIC.to_be_bytes());
        bytes.extend_from_slice(&flags.to_be_bytes());
        bytes.extend_from_slice(&command.to_be_bytes());
        bytes.extend_from_slice(&cookie.to_be_bytes());
        bytes.extend_from_slice(&offset.to_be_bytes());
        bytes.extend_from_slice(&length.to_be_bytes());
        bytes.extend_from_slice(data);
        if command == p::CMD_READ {
            self.reads.insert(cookie, length);
        }
        (cookie, bytes)
    }

    /// Receives the next complete reply: (cookie, reply).
    pub fn receive(&mut self) -> (u64, Reply) {
        loop {
            let magic = be32(&read_exact(&mut self.stream, 4));
            if magic == p::SIMPLE_REPLY_MAGIC {
                let rest = read_exact(&mut self.stream, 12);
                let error = be32(&rest);
                let cookie = be64(&rest[4..]);
                let read_length = self.reads.remove(&cookie);
                assert!(
                    !self.structured || read_length.is_none(),
                    "simple reply to a read"
                );
                let data = match (error, read_length) {
                    (0, Some(length)) => read_exact(&mut self.stream, length as usize),
                    _ => Vec::new(),
                };
                return (cookie, Reply::Simple { error, data });
            }
            assert_eq!(magic, p::STRUCTURED_REPLY_MAGIC, "reply magic");
            assert!(self.structured, "structured reply without negotiation");
            let rest = read_exact(&mut self.stream, 16);
            let flags = be16(&rest);
            let chunk_type = be16(&rest[2..]);
            let cookie = be64(&rest[4..]);
            let payload = read_exact(&mut self.stream, be32(&rest[12..]) as usize);
            self.partial
                .entry(cookie)
                .or_default()
                .push((flags, chunk_type, payload));
            if flags & p::REPLY_FLAG_DONE != 0 {
                self.reads.remove(&cookie);
                let chunks = self.partial.remove(&cookie).unwrap();
                return (cookie, Reply::Structured { chunks });
            }
        }
    }

    /// Sends one request and waits for its reply.
    pub fn call(
        &mut self,
        flags: u16,
        command: u16,
        offset: u64,
        length: u32,
        data: &[u8],
    ) -> Reply {
        let cookie = self.send(flags, command, offset, length, data);
        let (got, reply) = self.receive();
        assert_eq!(got, cookie);
        reply
    }

    /// Reads `length` bytes at `offset`, reassembling structured chunks.
    pub fn read(&mut self, offset: u64, length: u32) -> Result<Vec<u8>, u32> {
        let reply = self.call(0, p::CMD_READ, offset, length, &[]);
        if reply.error() != 0 {
            return Err(reply.error());
        }
        match reply {
            Reply::Simple { data, .. } => Ok(data),
            Reply::Structured { chunks } => {
                let mut data = vec![0xee; length as usize];
                for (_, chunk_type, payload) in chunks {
                    match chunk_type {
                        p::REPLY_TYPE_OFFSET_DATA => {
                            let at = (be64(&payload) - offset) as usize;
                            data[at..at + payload.len() - 8].copy_from_slice(&payload[8..]);
                        }
                        p::REPLY_TYPE_OFFSET_HOLE => {
                            let at = (be64(&payload) - offset) as usize;
                            let count = be32(&payload[8..]) as usize;
                            data[at..at + count].fill(0);
                        }
                        p::REPLY_TYPE_NONE => {}
                        other => panic!("unexpected chunk type {other}"),
                    }
                }
                Ok(data)
            }
        }
    }

    pub fn write(&mut self, offset: u64, data: &[u8], flags: u16) -> u32 {
        self.call(flags, p::CMD_WRITE, offset, data.len() as u32, data)
            .error()
    }

    /// A command without payload; returns its error (0 on success).
    pub fn command(&mut self, command: u16, flags: u16, offset: u64, length: u32) -> u32 {
        self.call(flags, command, offset, length, &[]).error()
    }

    /// Block status descriptors (length, flags) of base:allocation.
    pub fn block_status(
        &mut self,
        offset: u64,
        length: u32,
        flags: u16,
    ) -> Result<Vec<(u32, u32)>, u32> {
        let reply = self.call(flags, p::CMD_BLOCK_STATUS, offset, length, &[]);
        if reply.error() != 0 {
            return Err(reply.error());
        }
        let Reply::Structured { chunks } = reply else {
            panic!("block status needs a structured reply")
        };
        let (_, _, payload) = chunks
            .iter()
            .find(|(_, kind, _)| *kind == p::REPLY_TYPE_BLOCK_STATUS)
            .expect("a block status chunk");
        assert_eq!(be32(payload), onecopy_nbd::BASE_ALLOCATION_CONTEXT_ID);
        Ok(payload[4..]
            .chunks(8)
            .map(|descriptor| (be32(descriptor), be32(&descriptor[4..])))
            .collect())
    }

    /// Sends CMD_DISC and waits for the server to close the connection.
    pub fn disconnect(mut self) {
        self.send(0, p::CMD_DISC, 0, 0, &[]);
        let mut rest = Vec::new();
        self.stream.read_to_end(&mut rest).expect("server closes");
        assert!(rest.is_empty(), "no reply to disconnect");
    }
}

/// Fails with a hint if an external tool is missing (scripts/setup.sh installs them all).
pub fn require_tool(tool: &str) {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .map(|output| output.status.success())
        .unwrap_or(false);
    assert!(found, "{tool} is not installed: run scripts/setup.sh");
}

/// Runs a command and asserts it succeeds; returns its output.
pub fn run(program: &str, arguments: &[&str]) -> Output {
    require_tool(program);
    let output = Command::new(program)
        .args(arguments)
        .output()
        .unwrap_or_else(|error| panic!("running {program}: {error}"));
    assert!(
        output.status.success(),
        "{program} {arguments:?} failed: {}\nstdout: {}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// Deterministic pseudo-random bytes.
pub fn pattern(bytes: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..bytes)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

pub fn write_file(path: &Path, data: &[u8]) {
    std::fs::write(path, data).expect("write file");
}

/// Directories of X.509 credentials made by [`make_certificates`], in the layout qemu
/// (`tls-creds-x509,dir=`), nbdkit and libnbd (`tls-certificates=`) expect.
pub struct Certificates {
    /// `ca-cert.pem`, `server-cert.pem`, `server-key.pem`.
    pub server: PathBuf,
    /// `ca-cert.pem`, `client-cert.pem`, `client-key.pem`.
    pub client: PathBuf,
    /// `ca-cert.pem` only: a client that verifies the server but has no certificate.
    pub anonymous_client: PathBuf,
}

/// Makes a certificate authority, a server certificate for `localhost` and 127.0.0.1 and a
/// client certificate, all signed by it (scripts/test-certificates.sh, with openssl).
pub fn make_certificates(directory: &Path) -> Certificates {
    require_tool("openssl");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/test-certificates.sh"
    );
    let credentials = directory.join("credentials");
    run("bash", &[script, credentials.to_str().expect("UTF-8 path")]);
    Certificates {
        server: credentials.join("server"),
        client: credentials.join("client"),
        anonymous_client: credentials.join("anonymous"),
    }
}
