//! `onecopy init`: create a repository.

use clap::Args;
use onecopy_core::repository::Repository;

use crate::Cli;

#[derive(Args, Debug)]
pub struct InitArgs {}

pub fn run(cli: &Cli, _args: &InitArgs) -> anyhow::Result<()> {
    let path = cli.repository_path();
    let repository = Repository::init(&path)?;
    println!(
        "created repository {} at {}",
        repository.config().id,
        path.display()
    );
    Ok(())
}
