//! `onecopy serve`: serve every volume as an NBD export until interrupted.

use std::ffi::CString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};

use onecopy_block::control::ControlServer;
use onecopy_block::export::EngineExports;
use onecopy_core::repository::Repository;
use onecopy_core::units::parse_duration_ns;
use onecopy_nbd::{
    ListenAddress, Server, ServerConfig, SocketPermissions, TlsCredentials, TlsPolicy,
};

use crate::block_face::{face_directory, open_block_for_serving, EngineArgs};
use crate::Cli;

/// Whether clients may or must use TLS.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TlsMode {
    /// No TLS.
    Off,
    /// Clients may upgrade to TLS; plain clients are served too.
    On,
    /// Clients must upgrade to TLS (NBD_OPT_STARTTLS) before anything else.
    Require,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub repository: crate::RepositoryArgs,
    /// Serve on a unix socket at PATH.
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Permission bits of the unix socket, in octal [default: 0600, or 0660 with
    /// --socket-group]. Connecting needs write permission.
    #[arg(long, value_name = "MODE")]
    pub socket_mode: Option<String>,
    /// Group (name or number) of the unix socket, to let its members connect.
    #[arg(long, value_name = "GROUP")]
    pub socket_group: Option<String>,
    /// Serve on TCP at HOST:PORT [default: 127.0.0.1:10809 when no --socket is given]. An
    /// address other machines can reach needs --tls require (or --insecure).
    #[arg(long, value_name = "HOST:PORT")]
    pub listen: Option<String>,
    /// TLS through NBD's STARTTLS [default: require with --tls-certificates, off without].
    #[arg(long, value_enum, value_name = "MODE")]
    pub tls: Option<TlsMode>,
    /// Directory holding server-cert.pem, server-key.pem and (for --tls-verify-peer)
    /// ca-cert.pem, as qemu-nbd and nbdkit expect.
    #[arg(long, value_name = "DIR")]
    pub tls_certificates: Option<PathBuf>,
    /// Accept only clients with a certificate signed by ca-cert.pem of --tls-certificates.
    #[arg(long)]
    pub tls_verify_peer: bool,
    /// Serve an address other machines can reach without requiring TLS: anyone who reaches
    /// it can read and write every volume.
    #[arg(long)]
    pub insecure: bool,
    /// When every connection slot is taken, a connection idle this long (no request in
    /// flight) gives its slot to a new client; a reply the client does not take for this long
    /// ends its connection. `off`: never.
    #[arg(long, value_name = "DURATION|off", default_value = "300s")]
    pub idle_timeout: String,
    /// Longest time a client may take for the whole handshake, TLS included.
    #[arg(long, value_name = "DURATION", default_value = "30s")]
    pub handshake_timeout: String,
    /// Worker threads per connection [default: the NBD server's default].
    #[arg(long)]
    pub workers: Option<usize>,
    /// Serve connections under the normal scheduling policy instead of SCHED_BATCH (batch
    /// threads do not preempt each other on every request's wake-up; see docs/DESIGN.md).
    #[arg(long)]
    pub no_batch_scheduling: bool,
    #[command(flatten)]
    pub engine: EngineArgs,
}

pub fn run(cli: &Cli, args: &ServeArgs) -> anyhow::Result<()> {
    // Block the stop signals in every thread started from here on, so that only sigwait below
    // sees them and the shutdown runs in order.
    let signals = stop_signals();
    // SAFETY: the set is initialised; blocking signals has no memory effects.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &signals, std::ptr::null_mut()) };

    // Everything the user asked for is checked before the device is opened.
    let mut config = server_config(args)?;
    let addresses = addresses(args)?;
    for address in &addresses {
        if let ListenAddress::Tcp(socket_address) = address {
            let private = socket_address.ip().is_loopback();
            if !private && !config.tls.is_required() && !args.insecure {
                bail!(
                    "{socket_address} can be reached from other machines, and anyone who \
                     reaches it could read and write every volume: give --tls-certificates DIR \
                     (clients must then use TLS), or pass --insecure to serve it without TLS"
                );
            }
        }
    }
    if let Some(workers) = args.workers {
        config.workers_per_connection = workers;
    }
    config.batch_scheduling = !args.no_batch_scheduling;

    // A server lives long and its large tables (filter, index directory, page tables) grow
    // with the stored data: map them, so they are resident only where used (memory.rs).
    onecopy_core::memory::map_large_allocations();
    let block = open_block_for_serving(cli, &args.engine)?;
    let engine = Arc::clone(&block.engine);
    let background = engine.start_background();
    let repository = Repository::open(&cli.repository_path())?;
    let holder = format!("pid {}: serve", std::process::id());
    let control =
        match ControlServer::start(&face_directory(&repository), Arc::clone(&engine), holder) {
            Ok(control) => Some(control),
            Err(error) => {
                eprintln!(
                    "onecopy: warning: {error}; `onecopy volume stats` and `volume list` cannot \
                 reach this server"
                );
                None
            }
        };
    let catalog = Arc::new(EngineExports::new(Arc::clone(&engine)));
    let mut servers = Vec::new();
    for address in &addresses {
        servers.push(Server::start(address, catalog.clone(), config.clone())?);
    }
    let volumes = engine.volumes();
    let tls_note = match &config.tls {
        TlsPolicy::Off => "",
        TlsPolicy::Offered(_) => " (TLS offered)",
        TlsPolicy::Required(_) => " (TLS required)",
    };
    let scheme = if config.tls.is_required() {
        "nbds"
    } else {
        "nbd"
    };
    for server in &servers {
        for volume in &volumes {
            match server.address() {
                ListenAddress::Unix(path) => eprintln!(
                    "serving {} at {scheme}+unix:///{}?socket={}{tls_note}",
                    volume.name,
                    volume.name,
                    path.display()
                ),
                ListenAddress::Tcp(address) => eprintln!(
                    "serving {} at {scheme}://{address}/{}{tls_note}",
                    volume.name, volume.name
                ),
            }
        }
    }
    if volumes.is_empty() {
        eprintln!("no volumes yet: create one with `onecopy volume create NAME --size 10GiB` (stop this server first)");
    }
    eprintln!("press Ctrl-C to stop");
    let mut received = 0;
    // SAFETY: `signals` is initialised and `received` is a valid out-pointer.
    unsafe { libc::sigwait(&signals, &mut received) };
    eprintln!("stopping: finishing requests, then checkpointing");
    for server in servers {
        server.shutdown();
    }
    drop(control);
    drop(background);
    drop(block);
    Ok(())
}

/// Where to listen: the unix socket, the TCP address, or the default TCP address.
fn addresses(args: &ServeArgs) -> anyhow::Result<Vec<ListenAddress>> {
    let mut addresses = Vec::new();
    if let Some(path) = &args.socket {
        addresses.push(ListenAddress::Unix(path.clone()));
    }
    match &args.listen {
        Some(text) => addresses.push(ListenAddress::tcp(text)?),
        None if args.socket.is_none() => addresses.push(ListenAddress::default_tcp()),
        None => {}
    }
    Ok(addresses)
}

/// The server's configuration from the command line: timeouts, socket permissions, TLS.
fn server_config(args: &ServeArgs) -> anyhow::Result<ServerConfig> {
    let mut config = ServerConfig {
        handshake_timeout: duration(&args.handshake_timeout, "--handshake-timeout")?,
        idle_timeout: match args.idle_timeout.as_str() {
            "off" => None,
            text => Some(duration(text, "--idle-timeout")?),
        },
        ..ServerConfig::default()
    };
    let group = args.socket_group.as_deref().map(group_id).transpose()?;
    let mode = match &args.socket_mode {
        Some(text) => parse_mode(text)?,
        None if group.is_some() => 0o660,
        None => SocketPermissions::default().mode,
    };
    config.unix_socket = SocketPermissions { mode, group };

    let mode = args.tls.unwrap_or(if args.tls_certificates.is_some() {
        TlsMode::Require
    } else {
        TlsMode::Off
    });
    config.tls = match (mode, &args.tls_certificates) {
        (TlsMode::Off, _) => TlsPolicy::Off,
        (_, None) => bail!("--tls on and --tls require need --tls-certificates DIR"),
        (mode, Some(directory)) => {
            let credentials = TlsCredentials::from_directory(directory, args.tls_verify_peer)?;
            if mode == TlsMode::Require {
                TlsPolicy::Required(credentials)
            } else {
                TlsPolicy::Offered(credentials)
            }
        }
    };
    if args.tls_verify_peer && config.tls.credentials().is_none() {
        bail!("--tls-verify-peer needs TLS: give --tls-certificates DIR");
    }
    Ok(config)
}

fn duration(text: &str, option: &str) -> anyhow::Result<Duration> {
    let duration =
        Duration::from_nanos(parse_duration_ns(text).with_context(|| option.to_string())?);
    if duration.is_zero() {
        bail!("{option} must be longer than zero");
    }
    Ok(duration)
}

/// Parses permission bits given in octal (`600`, `0660`, `0o660`).
fn parse_mode(text: &str) -> anyhow::Result<u32> {
    let digits = text.trim_start_matches("0o");
    let mode = u32::from_str_radix(digits, 8)
        .ok()
        .filter(|mode| *mode <= 0o777)
        .with_context(|| {
            format!("--socket-mode {text:?}: give octal permission bits such as 0660")
        })?;
    Ok(mode)
}

/// The id of a group given by name or number.
fn group_id(text: &str) -> anyhow::Result<u32> {
    if let Ok(id) = text.parse() {
        return Ok(id);
    }
    let name = CString::new(text).context("--socket-group: a group name has no NUL bytes")?;
    // SAFETY: a group record is plain data; all zeroes is a valid (empty) value.
    let mut group: libc::group = unsafe { std::mem::zeroed() };
    let mut buffer = vec![0 as libc::c_char; 16 << 10];
    let mut found: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; getgrnam_r writes only into `group`,
    // `buffer` (of the length given) and `found`.
    let result = unsafe {
        libc::getgrnam_r(
            name.as_ptr(),
            &mut group,
            buffer.as_mut_ptr(),
            buffer.len(),
            &mut found,
        )
    };
    if result != 0 || found.is_null() {
        bail!("--socket-group {text:?}: no such group");
    }
    Ok(group.gr_gid)
}

fn stop_signals() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise and fill the set we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        set
    }
}
