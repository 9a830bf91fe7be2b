//! Serves one sparse in-memory export over NBD until SIGINT or SIGTERM, for benchmarks and
//! manual testing with NBD clients.
//!
//! Usage: memory_server [--socket PATH | --listen HOST:PORT] [--size BYTES[K|M|G]]
//!                      [--name NAME] [--workers N] [--minimum-block BYTES]
//!
//! Prints `ready` on standard output once the socket accepts connections.

use std::process::ExitCode;
use std::sync::Arc;

use onecopy_nbd::{BlockSize, ExportMap, ListenAddress, MemoryExport, Server, ServerConfig};

struct Options {
    address: ListenAddress,
    size_bytes: u64,
    name: String,
    workers: usize,
    minimum_block_bytes: u32,
}

fn parse_size(text: &str) -> Result<u64, String> {
    let (digits, multiplier) = match text.chars().last() {
        Some('K') | Some('k') => (&text[..text.len() - 1], 1u64 << 10),
        Some('M') | Some('m') => (&text[..text.len() - 1], 1 << 20),
        Some('G') | Some('g') => (&text[..text.len() - 1], 1 << 30),
        _ => (text, 1),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|value| value.checked_mul(multiplier))
        .ok_or_else(|| format!("invalid size {text:?}"))
}

fn parse(arguments: &[String]) -> Result<Options, String> {
    let mut options = Options {
        address: ListenAddress::default_tcp(),
        size_bytes: 1 << 30,
        name: "memory".to_owned(),
        workers: ServerConfig::default().workers_per_connection,
        minimum_block_bytes: 1,
    };
    let mut rest = arguments.iter();
    while let Some(flag) = rest.next() {
        let mut value = || rest.next().cloned().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--socket" => options.address = ListenAddress::Unix(value()?.into()),
            "--listen" => {
                options.address = ListenAddress::tcp(&value()?).map_err(|e| e.to_string())?
            }
            "--size" => options.size_bytes = parse_size(&value()?)?,
            "--name" => options.name = value()?,
            "--workers" => options.workers = value()?.parse().map_err(|_| "invalid --workers")?,
            "--minimum-block" => {
                options.minimum_block_bytes =
                    value()?.parse().map_err(|_| "invalid --minimum-block")?
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(options)
}

/// Blocks SIGINT and SIGTERM in every thread (call before starting any) and returns the set
/// to wait on.
fn block_termination_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data initialised by sigemptyset before use, and
    // pthread_sigmask only reads it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

fn main() -> ExitCode {
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    let options = match parse(&arguments) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("memory_server: {message}");
            return ExitCode::from(2);
        }
    };
    let minimum = options.minimum_block_bytes;
    let block_size = match BlockSize::new(minimum, minimum.max(4096), 1 << 25) {
        Ok(block_size) => block_size,
        Err(error) => {
            eprintln!("memory_server: {error}");
            return ExitCode::from(2);
        }
    };
    let export = MemoryExport::new(options.size_bytes).with_block_size(block_size);
    let catalog = ExportMap::single(options.name.clone(), Arc::new(export));
    let config = ServerConfig {
        workers_per_connection: options.workers,
        ..ServerConfig::default()
    };
    let signals = block_termination_signals();
    let server = match Server::start(&options.address, Arc::new(catalog), config) {
        Ok(server) => server,
        Err(error) => {
            eprintln!("memory_server: {error}");
            return ExitCode::FAILURE;
        }
    };
    println!("ready {}", server.address());
    let mut signal = 0;
    // SAFETY: waits on a valid, initialised signal set.
    unsafe { libc::sigwait(&signals, &mut signal) };
    let statistics = server.shutdown();
    eprintln!("memory_server: stopped after {statistics:?}");
    ExitCode::SUCCESS
}
