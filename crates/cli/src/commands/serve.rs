//! `onecopy serve`: serve every volume as an NBD export until interrupted.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;

use onecopy_block::export::EngineExports;
use onecopy_nbd::{ListenAddress, Server, ServerConfig};

use crate::block_face::{open_block_for_serving, EngineArgs};
use crate::Cli;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Serve on a unix socket at PATH.
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Serve on TCP at HOST:PORT [default: 127.0.0.1:10809 when no --socket is given].
    #[arg(long, value_name = "HOST:PORT")]
    pub listen: Option<String>,
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

    // A server lives long and its large tables (filter, index directory, page tables) grow
    // with the stored data: map them, so they are resident only where used (memory.rs).
    onecopy_core::memory::map_large_allocations();
    let block = open_block_for_serving(cli, &args.engine)?;
    let engine = Arc::clone(&block.engine);
    let background = engine.start_background();
    let catalog = Arc::new(EngineExports::new(Arc::clone(&engine)));
    let mut config = ServerConfig::default();
    if let Some(workers) = args.workers {
        config.workers_per_connection = workers;
    }
    config.batch_scheduling = !args.no_batch_scheduling;
    let mut addresses = Vec::new();
    if let Some(path) = &args.socket {
        addresses.push(ListenAddress::Unix(path.clone()));
    }
    match &args.listen {
        Some(text) => addresses.push(ListenAddress::tcp(text)?),
        None if args.socket.is_none() => addresses.push(ListenAddress::default_tcp()),
        None => {}
    }
    let mut servers = Vec::new();
    for address in &addresses {
        servers.push(Server::start(address, catalog.clone(), config.clone())?);
    }
    let volumes = engine.volumes();
    for server in &servers {
        for volume in &volumes {
            match server.address() {
                ListenAddress::Unix(path) => eprintln!(
                    "serving {} at nbd+unix:///{}?socket={}",
                    volume.name,
                    volume.name,
                    path.display()
                ),
                ListenAddress::Tcp(address) => {
                    eprintln!("serving {} at nbd://{address}/{}", volume.name, volume.name)
                }
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
    drop(background);
    drop(block);
    Ok(())
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
