//! Fuzzes a whole connection: the input is what a client sends (after an optional valid
//! handshake prefix that reaches the transmission phase), served by `serve_connection` over a
//! socket pair against a small memory export. Any panic is a bug.

#![no_main]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use onecopy_nbd::{protocol as p, serve_connection, silent_event_sink, ExportMap, MemoryExport, ServerConfig};

fn option(kind: u32, data: &[u8]) -> Vec<u8> {
    let mut bytes = p::OPTION_MAGIC.to_be_bytes().to_vec();
    bytes.extend_from_slice(&kind.to_be_bytes());
    bytes.extend_from_slice(&(data.len() as u32).to_be_bytes());
    bytes.extend_from_slice(data);
    bytes
}

fn prefix() -> Vec<u8> {
    let mut bytes = 3u32.to_be_bytes().to_vec();
    bytes.extend(option(p::OPT_STRUCTURED_REPLY, &[]));
    let mut meta = 4u32.to_be_bytes().to_vec();
    meta.extend_from_slice(b"disk");
    meta.extend_from_slice(&1u32.to_be_bytes());
    meta.extend_from_slice(&15u32.to_be_bytes());
    meta.extend_from_slice(b"base:allocation");
    bytes.extend(option(p::OPT_SET_META_CONTEXT, &meta));
    let mut go = 4u32.to_be_bytes().to_vec();
    go.extend_from_slice(b"disk");
    go.extend_from_slice(&0u16.to_be_bytes());
    bytes.extend(option(p::OPT_GO, &go));
    bytes
}

fn catalog() -> &'static ExportMap {
    static CATALOG: OnceLock<ExportMap> = OnceLock::new();
    CATALOG.get_or_init(|| ExportMap::single("disk", Arc::new(MemoryExport::new(1 << 20))))
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut input = if mode & 1 == 1 { prefix() } else { Vec::new() };
    input.extend_from_slice(rest);
    let (mut client, server_end) = UnixStream::pair().unwrap();
    let serving = std::thread::spawn(|| {
        let config = ServerConfig {
            workers_per_connection: 2,
            events: silent_event_sink(),
            ..ServerConfig::default()
        };
        let _ = serve_connection(server_end, catalog(), &config);
    });
    let mut sender = client.try_clone().unwrap();
    let sending = std::thread::spawn(move || {
        let _ = sender.write_all(&input);
        let _ = sender.shutdown(std::net::Shutdown::Write);
    });
    let mut sink = Vec::new();
    let _ = client.read_to_end(&mut sink);
    sending.join().unwrap();
    serving.join().expect("serve_connection panicked");
});
