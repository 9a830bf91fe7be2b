//! Opening the block device of a repository from the command line, or asking the `serve`
//! process that has it open.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use serde_json::Value;

use onecopy_block::control::{self, ControlRequest};
use onecopy_block::{BlockConfig, Engine, OpenMode, RuntimeOptions};
use onecopy_core::repository::{FaceLock, LockWait, Repository};
use onecopy_core::units::{parse_duration_ns, parse_size};

use crate::Cli;

/// Options of the block engine that may differ from run to run.
#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    /// Latency injected into every on-disk index lookup, to emulate slower metadata media
    /// (paper 1 §5: 10us to 10ms).
    #[arg(long, value_name = "DURATION", default_value = "0")]
    pub index_latency: String,
    /// Replacement policy of the index entry cache: arc, lru or lfu [default: arc, or lfu
    /// in flash mode].
    #[arg(long, value_name = "POLICY")]
    pub index_cache_policy: Option<String>,
    /// Memory budget of the index entry cache.
    #[arg(long, value_name = "SIZE", default_value = "64MiB")]
    pub index_cache: String,
    /// Target false-positive rate of the fingerprint filter (0 < RATE < 1): lower costs
    /// memory (1.24 bytes per chunk at 0.01, 0.79 at 0.05), higher costs index reads for
    /// new blocks. A change rebuilds the filter once, at the next start.
    #[arg(long, value_name = "RATE", default_value_t = onecopy_block::FILTER_FALSE_POSITIVE_RATE)]
    pub index_filter_false_positives: f64,
    /// Memory of the content-addressed read cache (0 turns it off).
    #[arg(long, value_name = "SIZE", default_value = "64MiB")]
    pub content_cache: String,
    /// Replacement policy of the content cache: arc, lru or lfu.
    #[arg(long, value_name = "POLICY", default_value = "arc")]
    pub content_cache_policy: String,
    /// Device model of dynamic replica retrieval (paper 4): hdd reads the copy of a block's
    /// content nearest the head, ssd the one in the least busy region, none always the
    /// block's own copy.
    #[arg(long, value_name = "PROFILE", default_value = "ssd")]
    pub device_profile: String,
    /// Memory of the copy table of replica retrieval (which chunks hold the same content).
    #[arg(long, value_name = "SIZE", default_value = "4MiB")]
    pub copy_table: String,
    /// Scratch space for selective duplication (paper 4): copies of popular content made in
    /// idle time, spread over the device (0 turns it off).
    #[arg(long, value_name = "SIZE", default_value = "0")]
    pub scratch_space: String,
    /// Copies of each popular content selective duplication makes (scratch regions).
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub duplicate_copies: u32,
    /// Selective duplication runs in idle time at most this often.
    #[arg(long, value_name = "DURATION", default_value = "86400s")]
    pub duplication_interval: String,
}

impl EngineArgs {
    /// The runtime options these arguments describe, for a block device created with
    /// `config`.
    pub fn runtime(&self, config: &BlockConfig) -> anyhow::Result<RuntimeOptions> {
        let mut runtime = RuntimeOptions::for_config(config);
        runtime.index.latency_ns = parse_duration_ns(&self.index_latency)?;
        if let Some(policy) = &self.index_cache_policy {
            runtime.index.cache_policy = policy.parse()?;
        }
        runtime.index.cache_bytes = parse_size(&self.index_cache)?;
        runtime.index.false_positive_rate = self.index_filter_false_positives;
        runtime.content_cache_bytes = parse_size(&self.content_cache)?;
        runtime.content_cache_policy = self.content_cache_policy.clone();
        runtime.replicas.device_profile = self.device_profile.parse()?;
        runtime.replicas.copy_table_bytes = parse_size(&self.copy_table)?;
        runtime.replicas.scratch_bytes = parse_size(&self.scratch_space)?;
        if self.duplicate_copies == 0 {
            anyhow::bail!("--duplicate-copies must be at least 1");
        }
        runtime.replicas.duplicate_copies = self.duplicate_copies;
        runtime.replicas.duplication_interval_seconds =
            parse_duration_ns(&self.duplication_interval)? / 1_000_000_000;
        Ok(runtime)
    }
}

impl Default for EngineArgs {
    fn default() -> Self {
        EngineArgs {
            index_latency: "0".into(),
            index_cache_policy: None,
            index_cache: "64MiB".into(),
            index_filter_false_positives: onecopy_block::FILTER_FALSE_POSITIVE_RATE,
            content_cache: "64MiB".into(),
            content_cache_policy: "arc".into(),
            device_profile: "ssd".into(),
            copy_table: "4MiB".into(),
            scratch_space: "0".into(),
            duplicate_copies: 10,
            duplication_interval: "86400s".into(),
        }
    }
}

/// An open block engine and the lock that keeps other processes out while it is open.
pub struct OpenBlock {
    pub engine: Arc<Engine>,
    _lock: FaceLock,
}

impl Drop for OpenBlock {
    fn drop(&mut self) {
        // A clean close leaves nothing to replay.
        if self.engine.mode() == OpenMode::ReadOnly {
            return;
        }
        if let Err(error) = self.engine.shutdown() {
            eprintln!("onecopy: closing the block device failed: {error}");
        }
    }
}

/// Opens the repository's block device for `command` (shown to others who find it locked)
/// in `mode`, waiting for another process that has it as `--wait` says. Damage that opening
/// recovered from without loss is printed as a warning.
pub fn open_block(
    cli: &Cli,
    command: &str,
    args: &EngineArgs,
    mode: OpenMode,
) -> anyhow::Result<OpenBlock> {
    let repository = Repository::open(&cli.repository_path())?;
    let lock = repository.lock_face_waiting("block", command, cli.lock_wait()?)?;
    open_locked(&repository, lock, args, mode)
}

/// Opens the block device for serving; on a disk too full for crash recovery to commit,
/// opens it read-only instead and says so (writes then fail until it is served again with
/// room).
pub fn open_block_for_serving(cli: &Cli, args: &EngineArgs) -> anyhow::Result<OpenBlock> {
    match open_block(cli, "serve", args, OpenMode::ReadWrite) {
        Err(error)
            if crate::output::core_error(&error).is_some_and(onecopy_core::storage::is_full) =>
        {
            eprintln!(
                "onecopy: warning: {}; serving read-only: free some space and restart the \
                 server to write again",
                crate::output::error_message(&error)
            );
            open_block(
                cli,
                "serve (read-only, disk full)",
                args,
                OpenMode::ReadOnly,
            )
        }
        other => other,
    }
}

/// The answer to a read-only request about the block device.
pub enum Answer {
    /// The running server answered.
    Served(Value),
    /// Nobody else had the device: it is open here, read-only.
    Local(OpenBlock),
}

/// For read-only commands: opens the block device read-only (nothing is written, so this
/// works on a full disk too), or, when a `serve` process has it open, asks that server
/// `request` through its control socket so that the answer shows the live device. When
/// another kind of process holds the device, waits for it as `--wait` says, or fails with
/// the lock error (exit status 4).
pub fn open_or_ask_server(
    cli: &Cli,
    command: &str,
    request: &ControlRequest,
) -> anyhow::Result<Answer> {
    let repository = Repository::open(&cli.repository_path())?;
    let locked = match repository.lock_face("block", command) {
        Ok(lock) => {
            return Ok(Answer::Local(open_locked(
                &repository,
                lock,
                &EngineArgs::default(),
                OpenMode::ReadOnly,
            )?))
        }
        Err(error @ onecopy_core::Error::Locked { .. }) => error,
        Err(error) => return Err(error.into()),
    };
    match control::request(&face_directory(&repository), request)? {
        Some(Ok(value)) => Ok(Answer::Served(value)),
        Some(Err(message)) => Err(anyhow::anyhow!(message)),
        None if cli.lock_wait()? == LockWait::No => Err(locked.into()),
        None => Ok(Answer::Local(open_block(
            cli,
            command,
            &EngineArgs::default(),
            OpenMode::ReadOnly,
        )?)),
    }
}

/// The directory of the block face of `repository`.
pub fn face_directory(repository: &Repository) -> PathBuf {
    repository.path().join("block")
}

fn open_locked(
    repository: &Repository,
    lock: FaceLock,
    args: &EngineArgs,
    mode: OpenMode,
) -> anyhow::Result<OpenBlock> {
    let path = repository.path();
    let storage = repository.face_storage("block")?;
    // Only runtime defaults depend on the configuration; opening the engine reports a
    // damaged one (and uses the copy its checkpoint keeps).
    let stored = onecopy_block::engine::stored_config(storage.as_ref())
        .ok()
        .flatten();
    let runtime = args.runtime(stored.as_ref().unwrap_or(&BlockConfig::default()))?;
    let engine = Engine::open_with(storage, None, runtime, mode)
        .with_context(|| format!("opening the block device of {}", path.display()))?;
    for finding in engine.open_findings() {
        eprintln!(
            "onecopy: warning: {}: {}{}",
            finding.object,
            finding.detail,
            finding
                .repair
                .as_ref()
                .map(|repair| format!(" ({repair})"))
                .unwrap_or_default()
        );
    }
    Ok(OpenBlock {
        engine,
        _lock: lock,
    })
}
