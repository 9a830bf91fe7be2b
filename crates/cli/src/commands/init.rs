//! `onecopy init`: create a repository.

use clap::Args;

use crate::Cli;

#[derive(Args, Debug)]
pub struct InitArgs {}

pub fn run(cli: &Cli, _args: &InitArgs) -> anyhow::Result<()> {
    let path = cli.repository_path();
    anyhow::bail!(
        "creating a repository at {} is not available yet",
        path.display()
    )
}
