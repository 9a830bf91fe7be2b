//! `onecopy init`: create a repository.

use clap::Args;

use onecopy_block::{BlockConfig, Engine, RuntimeOptions};
use onecopy_core::repository::Repository;

use crate::Cli;

#[derive(Args, Debug)]
pub struct InitArgs {
    /// Flash mode for the block device (paper 5): weak xxh3 fingerprints confirmed by
    /// comparing bytes, which suits media with cheap random reads.
    #[arg(long)]
    pub flash: bool,
}

pub fn run(cli: &Cli, args: &InitArgs) -> anyhow::Result<()> {
    let path = cli.repository_path();
    let repository = Repository::init(&path)?;
    if args.flash {
        let _lock = repository.lock_face("block", "init")?;
        let engine = Engine::open(
            repository.face_storage("block")?,
            Some(BlockConfig::flash()),
            RuntimeOptions::default(),
        )?;
        engine.shutdown()?;
    }
    println!(
        "created repository {} at {}{}",
        repository.config().id,
        path.display(),
        if args.flash { " (flash mode)" } else { "" }
    );
    Ok(())
}
