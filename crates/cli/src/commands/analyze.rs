//! `onecopy analyze PATH...`: how much would deduplication save?

use std::path::PathBuf;

use clap::Args;

use crate::Cli;

#[derive(Args, Debug)]
pub struct AnalyzeArgs {
    /// Files, directories, disk images or block devices to analyze.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
}

pub fn run(_cli: &Cli, _args: &AnalyzeArgs) -> anyhow::Result<()> {
    anyhow::bail!("analyze is not available yet")
}
