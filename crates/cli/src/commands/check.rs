//! `onecopy check`: verify a repository and repair what can be rebuilt.

use clap::Args;
use serde_json::Value;

use onecopy_block::control::ControlRequest;
use onecopy_core::repository::Repository;

use crate::block_face::{open_block, open_or_ask_server, Answer, EngineArgs};
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
        // A check without repair only reads, so a running server runs it for us; a repair
        // needs the device to itself.
        let (report, served) = if args.repair {
            let block = open_block(cli, "check", &EngineArgs::default())?;
            (serde_json::to_value(block.engine.check(true)?)?, false)
        } else {
            match open_or_ask_server(cli, "check", &ControlRequest::Check)? {
                Answer::Served(report) => (report, true),
                Answer::Local(block) => (serde_json::to_value(block.engine.check(false)?)?, false),
            }
        };
        let count = |field: &str| match &report[field] {
            Value::Array(items) => items.len() as u64,
            value => value.as_u64().unwrap_or_default(),
        };
        let clean = [
            "damaged_chunks",
            "damaged_containers",
            "reference_corrections",
            "dangling_references",
            "index_missing",
            "index_stale",
        ]
        .iter()
        .all(|field| count(field) == 0);
        let repaired = report["repaired"].as_bool().unwrap_or_default();
        problems |= !clean && !repaired;
        if args.json {
            print_json(&serde_json::json!({ "block": report }))?;
        } else {
            println!(
                "block device{}: {} pages, {} chunks checked, {} index entries",
                if served {
                    " (checked by the running server)"
                } else {
                    ""
                },
                count("pages_checked"),
                count("chunks_checked"),
                count("index_entries")
            );
            if clean {
                println!("block device: no problems found");
            } else {
                println!(
                    "block device: {} damaged chunks, {} damaged containers, {} reference \
                     counts wrong, {} dangling references, {} index entries missing, {} stale{}",
                    count("damaged_chunks"),
                    count("damaged_containers"),
                    count("reference_corrections"),
                    count("dangling_references"),
                    count("index_missing"),
                    count("index_stale"),
                    if repaired {
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
