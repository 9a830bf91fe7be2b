//! Opening the block device of a repository from the command line.

use std::sync::Arc;

use anyhow::Context;
use clap::Args;

use onecopy_block::{BlockConfig, Engine, RuntimeOptions};
use onecopy_core::repository::{FaceLock, Repository};
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
        if let Err(error) = self.engine.shutdown() {
            eprintln!("onecopy: closing the block device failed: {error}");
        }
    }
}

/// Opens the repository's block device for `command` (shown to others who find it locked).
pub fn open_block(cli: &Cli, command: &str, args: &EngineArgs) -> anyhow::Result<OpenBlock> {
    let path = cli.repository_path();
    let repository = Repository::open(&path)?;
    let lock = repository.lock_face("block", command)?;
    let storage = repository.face_storage("block")?;
    // Only runtime defaults depend on the configuration; opening the engine reports a
    // damaged one (and uses the copy its checkpoint keeps).
    let stored = onecopy_block::engine::stored_config(storage.as_ref())
        .ok()
        .flatten();
    let runtime = args.runtime(stored.as_ref().unwrap_or(&BlockConfig::default()))?;
    let engine = Engine::open(storage, None, runtime)
        .with_context(|| format!("opening the block device of {}", path.display()))?;
    Ok(OpenBlock {
        engine,
        _lock: lock,
    })
}
