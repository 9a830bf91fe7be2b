//! `onecopy check`: verify a repository and repair what can be rebuilt.

use clap::Args;

use onecopy_core::repository::Repository;

use crate::block_face::{open_block, EngineArgs};
use crate::output::print_json;
use crate::Cli;

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// Rebuild what can be rebuilt without losing data: reference counts from the block
    /// maps, the fingerprint index from the chunk table.
    #[arg(long)]
    pub repair: bool,
    #[arg(long)]
    pub json: bool,
}

pub fn run(cli: &Cli, args: &CheckArgs) -> anyhow::Result<()> {
    let repository = Repository::open(&cli.repository_path())?;
    let mut problems = false;
    if repository.path().join("block").join("config.json").exists() {
        let block = open_block(cli, "check", &EngineArgs::default())?;
        let report = block.engine.check(args.repair)?;
        problems |= !report.is_clean() && !report.repaired;
        if args.json {
            print_json(&serde_json::json!({ "block": report }))?;
        } else {
            println!(
                "block device: {} pages, {} chunks checked, {} index entries",
                report.pages_checked, report.chunks_checked, report.index_entries
            );
            if report.is_clean() {
                println!("block device: no problems found");
            } else {
                println!(
                    "block device: {} damaged chunks, {} damaged containers, {} reference \
                     counts wrong, {} dangling references, {} index entries missing, {} stale{}",
                    report.damaged_chunks.len(),
                    report.damaged_containers.len(),
                    report.reference_corrections,
                    report.dangling_references.len(),
                    report.index_missing,
                    report.index_stale,
                    if report.repaired {
                        " (repaired what could be rebuilt)"
                    } else {
                        "; run `onecopy check --repair`"
                    }
                );
            }
        }
    } else if !args.json {
        println!("block device: not used yet");
    }
    if problems {
        anyhow::bail!("the repository has problems");
    }
    Ok(())
}
