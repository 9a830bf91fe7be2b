//! `onecopy volume ...`: create, list, delete, resize, inspect and tune volumes.
//!
//! `list` and `stats` only read: while `onecopy serve` has the device open they ask the
//! server (its control socket) and show its live figures; every other subcommand changes the
//! device and needs it to itself.

use clap::{Args, Subcommand};
use serde_json::Value;

use onecopy_block::control::ControlRequest;
use onecopy_block::volume::check_volume_geometry;
use onecopy_block::{ByteRange, HintSettings, VolumeRecord};
use onecopy_core::units::{format_size, parse_size};

use crate::block_face::{open_block, open_or_ask_server, Answer, EngineArgs};
use crate::output::print_json;
use crate::Cli;
use onecopy_block::OpenMode;

#[derive(Args, Debug)]
pub struct VolumeArgs {
    #[command(flatten)]
    pub repository: crate::RepositoryArgs,
    #[command(subcommand)]
    pub command: VolumeCommand,
}

#[derive(Subcommand, Debug)]
pub enum VolumeCommand {
    /// Create a volume; a volume of that name, size and block size already there is kept
    /// as it is.
    Create {
        /// Name of the volume: the NBD export name clients ask for.
        name: String,
        /// Size with a unit: 10GiB (powers of 1024) or 10GB (powers of 1000); a bare number
        /// is bytes.
        #[arg(long)]
        size: String,
        /// Block size in bytes: the deduplication unit.
        #[arg(long, default_value_t = 4096)]
        block_size: u32,
        /// Turn every hint source off (plain inline deduplication).
        #[arg(long)]
        no_hints: bool,
        /// Deduplicate later: blocks that stay unchanged for this many seconds.
        #[arg(long, value_name = "SECONDS")]
        deferred: Option<u64>,
    },
    /// List volumes (also while `serve` runs).
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Delete a volume and release its blocks.
    Delete {
        /// Name of the volume.
        name: String,
    },
    /// Change a volume's size; making it smaller discards its end and needs --shrink.
    Resize {
        /// Name of the volume.
        name: String,
        /// New size with a unit (10GiB, 10GB; a bare number is bytes).
        #[arg(long)]
        size: String,
        /// Allow a size smaller than the current one: the blocks beyond it are discarded.
        #[arg(long)]
        shrink: bool,
    },
    /// Show sizes, deduplication and cache figures of a volume (while `serve` runs: the
    /// server's live figures).
    Stats {
        /// Name of the volume.
        name: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Set hints: ranges not to deduplicate, and which hint sources to use; then show the
    /// volume's hint settings.
    Hint {
        /// Name of the volume.
        name: String,
        /// Store START..END without deduplication (sizes with units, e.g. 0..1GiB).
        #[arg(long, value_name = "START..END")]
        no_dedup: Vec<String>,
        /// Deduplicate START..END again.
        #[arg(long, value_name = "START..END")]
        dedup: Vec<String>,
        /// Hint sources to use, comma separated from explicit, filesystem, prefetch; or none.
        #[arg(long, value_name = "SOURCES")]
        sources: Option<String>,
        /// Deferred deduplication after SECONDS unchanged, or `off`.
        #[arg(long, value_name = "SECONDS|off")]
        deferred: Option<String>,
        /// Print the volume's record as JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Deduplicate now the blocks written for deferred deduplication.
    Dedup {
        /// Name of the volume.
        name: String,
        /// Only blocks unchanged for at least this many seconds [default: the volume's setting].
        #[arg(long, value_name = "SECONDS")]
        min_age: Option<u64>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Reclaim space of overwritten blocks by compacting containers.
    Compact {
        /// Show the plan without changing anything.
        #[arg(long)]
        dry_run: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(cli: &Cli, args: &VolumeArgs) -> anyhow::Result<()> {
    match &args.command {
        VolumeCommand::List { json } => return list(cli, *json),
        VolumeCommand::Stats { name, json } => return stats(cli, name, *json),
        _ => {}
    }
    let block = open_block(cli, "volume", &EngineArgs::default(), OpenMode::ReadWrite)?;
    let engine = &block.engine;
    match &args.command {
        VolumeCommand::Create {
            name,
            size,
            block_size,
            no_hints,
            deferred,
        } => {
            let size_bytes = volume_size(size, *block_size)?;
            let mut hints = if *no_hints {
                HintSettings::none()
            } else {
                HintSettings::default()
            };
            hints.deferred_seconds = *deferred;
            let hints_given = *no_hints || deferred.is_some();
            if let Some(existing) = existing_volume(engine, name)? {
                return keep_existing(
                    &existing,
                    size_bytes,
                    *block_size,
                    hints_given.then_some(&hints),
                );
            }
            let record = engine.create_volume(name, size_bytes, *block_size, hints)?;
            println!(
                "created volume {} ({}, {}-byte blocks)",
                record.name,
                format_size(record.size_bytes),
                record.block_bytes
            );
        }
        VolumeCommand::List { .. } | VolumeCommand::Stats { .. } => {
            unreachable!("read-only subcommands are handled above")
        }
        VolumeCommand::Delete { name } => {
            let deletion = engine.delete_volume(name)?;
            println!(
                "deleted volume {name}: {} freed",
                format_size(deletion.freed_bytes)
            );
            if deletion.compactable_bytes > 0 {
                println!(
                    "`onecopy volume compact` would free {} more (containers that still hold                      chunks of other volumes)",
                    format_size(deletion.compactable_bytes)
                );
            }
        }
        VolumeCommand::Resize { name, size, shrink } => {
            let current = engine.volume(name)?;
            let size_bytes = volume_size(size, current.block_bytes)?;
            if size_bytes < current.size_bytes && !shrink {
                anyhow::bail!(
                    "volume {name} is {}; resizing it to {} discards the data beyond that \
                     size: pass --shrink to do so",
                    format_size(current.size_bytes),
                    format_size(size_bytes)
                );
            }
            let record = engine.resize_volume(name, size_bytes)?;
            println!("volume {name} is now {}", format_size(record.size_bytes));
        }
        VolumeCommand::Hint {
            name,
            no_dedup,
            dedup,
            sources,
            deferred,
            json,
        } => {
            for range in no_dedup {
                engine.set_no_dedup(name, ByteRange::parse(range)?, true)?;
            }
            for range in dedup {
                engine.set_no_dedup(name, ByteRange::parse(range)?, false)?;
            }
            let mut hints = engine.volume(name)?.hints;
            if let Some(sources) = sources {
                hints.explicit = false;
                hints.filesystem = false;
                hints.prefetch = false;
                for source in sources.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                    match source {
                        "explicit" => hints.explicit = true,
                        "filesystem" => hints.filesystem = true,
                        "prefetch" => hints.prefetch = true,
                        "none" => {}
                        other => anyhow::bail!(
                            "unknown hint source {other:?}; use explicit, filesystem, prefetch or none"
                        ),
                    }
                }
            }
            if let Some(deferred) = deferred {
                hints.deferred_seconds = match deferred.as_str() {
                    "off" => None,
                    seconds => Some(seconds.parse().map_err(|_| {
                        anyhow::anyhow!("--deferred takes a number of seconds or `off`")
                    })?),
                };
            }
            let record = engine.set_hint_settings(name, hints)?;
            if *json {
                print_json(&record)?;
            } else {
                print_hints(&record);
            }
        }
        VolumeCommand::Dedup {
            name,
            min_age,
            json,
        } => {
            let id = engine.volume_id(name)?;
            let report = engine.deduplicate_deferred(Some(id), *min_age)?;
            if *json {
                print_json(&report)?;
            } else {
                println!(
                    "examined {} blocks: {} deduplicated, {} unique (indexed), {} changed too recently",
                    report.examined, report.deduplicated, report.indexed, report.too_recent
                );
            }
        }
        VolumeCommand::Compact { dry_run, json } => {
            let (plan, report) =
                engine.compact(&onecopy_core::gc::CompactionOptions::default(), *dry_run)?;
            if *json {
                print_json(&serde_json::json!({"plan": plan, "report": report}))?;
            } else {
                println!(
                    "{} containers to compact: copy {}, reclaim {}",
                    plan.containers.len(),
                    format_size(plan.copy_bytes),
                    format_size(plan.reclaim_bytes)
                );
                if let Some(report) = report {
                    println!(
                        "moved {} chunks ({}), retired {} containers",
                        report.chunks_moved,
                        format_size(report.bytes_moved),
                        report.containers_retired
                    );
                }
            }
        }
    }
    Ok(())
}

/// Parses a volume size and checks it against the block size; a bare number that does not
/// make a volume is most likely a size without its unit, and the message says so.
fn volume_size(text: &str, block_bytes: u32) -> anyhow::Result<u64> {
    let size_bytes = parse_size(text)?;
    match check_volume_geometry(size_bytes, block_bytes) {
        Ok(()) => Ok(size_bytes),
        Err(error) if text.trim().bytes().all(|byte| byte.is_ascii_digit()) => {
            let number = text.trim();
            anyhow::bail!(
                "{error}; --size {number} has no unit, so it means {number} bytes: did you \
                 mean {number}GiB?"
            )
        }
        Err(error) => Err(error.into()),
    }
}

/// The volume called `name`, if there is one.
fn existing_volume(
    engine: &onecopy_block::Engine,
    name: &str,
) -> anyhow::Result<Option<VolumeRecord>> {
    match engine.volume(name) {
        Ok(record) => Ok(Some(record)),
        Err(onecopy_block::BlockError::Core(onecopy_core::Error::NotFound(_))) => Ok(None),
        Err(error) => Err(error.into()),
    }
}

/// `volume create` of a volume that exists: success when it already is what was asked for
/// (so that setup scripts can run twice), an error naming the difference otherwise.
/// `hints` are compared only when the command gave hint options.
fn keep_existing(
    existing: &VolumeRecord,
    size_bytes: u64,
    block_bytes: u32,
    hints: Option<&HintSettings>,
) -> anyhow::Result<()> {
    let name = &existing.name;
    if existing.block_bytes != block_bytes {
        anyhow::bail!(
            "volume {name} already exists with {}-byte blocks; a block size cannot change \
             (delete the volume and create it again, or choose another name)",
            existing.block_bytes
        );
    }
    if existing.size_bytes != size_bytes {
        anyhow::bail!(
            "volume {name} already exists with a size of {}; change it with `onecopy volume \
             resize {name} --size {}`",
            format_size(existing.size_bytes),
            format_size(size_bytes).replace(' ', "")
        );
    }
    if hints.is_some_and(|hints| *hints != existing.hints) {
        anyhow::bail!(
            "volume {name} already exists with other hint settings; change them with \
             `onecopy volume hint {name}`"
        );
    }
    println!(
        "volume {name} already exists ({}, {}-byte blocks); nothing changed",
        format_size(existing.size_bytes),
        existing.block_bytes
    );
    Ok(())
}

/// `volume hint`: the settings a volume now has.
fn print_hints(record: &VolumeRecord) {
    let hints = &record.hints;
    let sources: Vec<&str> = [
        (hints.explicit, "explicit"),
        (hints.filesystem, "filesystem"),
        (hints.prefetch, "prefetch"),
    ]
    .into_iter()
    .filter_map(|(on, name)| on.then_some(name))
    .collect();
    println!("volume            {}", record.name);
    println!(
        "hint sources      {}",
        if sources.is_empty() {
            "none".to_string()
        } else {
            sources.join(", ")
        }
    );
    match hints.deferred_seconds {
        Some(seconds) => println!("deduplication     deferred: blocks unchanged for {seconds} s"),
        None => println!("deduplication     inline"),
    }
    if record.no_dedup_ranges.is_empty() {
        println!("no-dedup ranges   none");
    }
    for range in &record.no_dedup_ranges {
        println!(
            "no-dedup range    {}..{} (bytes {}..{})",
            format_size(range.start),
            format_size(range.end),
            range.start,
            range.end
        );
    }
}

/// `volume list`: the volumes of the device, from the running server if there is one.
fn list(cli: &Cli, json: bool) -> anyhow::Result<()> {
    let volumes = match open_or_ask_server(cli, "volume list", &ControlRequest::Volumes) {
        Ok(Answer::Served(value)) => value,
        Ok(Answer::Local(block)) => serde_json::to_value(block.engine.volumes())?,
        // A block device never used has no volumes (a read-only open creates nothing).
        Err(error)
            if matches!(
                crate::output::core_error(&error),
                Some(onecopy_core::Error::NotFound(_))
            ) =>
        {
            serde_json::json!([])
        }
        Err(error) => return Err(error),
    };
    if json {
        return print_json(&volumes);
    }
    let volumes = volumes.as_array().map(Vec::as_slice).unwrap_or_default();
    if volumes.is_empty() {
        println!("no volumes; create one with `onecopy volume create NAME --size 10GiB`");
        return Ok(());
    }
    println!("{:<24} {:>12} {:>6}", "NAME", "SIZE", "BLOCK");
    for volume in volumes {
        println!(
            "{:<24} {:>12} {:>6}",
            text(&volume["name"]),
            format_size(number(&volume["size_bytes"])),
            number(&volume["block_bytes"])
        );
    }
    Ok(())
}

/// `volume stats NAME`: from the running server if there is one, so that the request
/// counters are the live ones.
fn stats(cli: &Cli, name: &str, json: bool) -> anyhow::Result<()> {
    let request = ControlRequest::VolumeStats {
        name: name.to_string(),
    };
    let stats = match open_or_ask_server(cli, "volume stats", &request)? {
        Answer::Served(value) => value,
        Answer::Local(block) => serde_json::to_value(block.engine.volume_stats(name)?)?,
    };
    if json {
        return print_json(&stats);
    }
    println!("volume            {}", text(&stats["name"]));
    println!(
        "size              {}",
        format_size(number(&stats["size_bytes"]))
    );
    println!(
        "mapped (non-zero) {}",
        format_size(number(&stats["mapped_bytes"]))
    );
    println!(
        "stored            {}",
        format_size(number(&stats["stored_bytes"]))
    );
    println!(
        "dedup ratio       {:.2}",
        stats["dedup_ratio"].as_f64().unwrap_or_default()
    );
    if let Some(file_system) = stats["file_system"].as_str() {
        println!(
            "file system       {file_system} ({} of metadata and journal)",
            format_size(number(&stats["file_system_metadata_bytes"]))
        );
    }
    let requests = &stats["engine"]["requests"];
    println!(
        "requests          {} reads, {} writes, {} flushes, {} trims",
        number(&requests["reads"]),
        number(&requests["writes"]),
        number(&requests["flushes"]),
        number(&requests["trims"])
    );
    let index = &stats["engine"]["index"];
    println!(
        "index             {} lookups, {} filter negatives, {} cache hits, {} disk lookups",
        number(&index["lookups"]),
        number(&index["filter_negatives"]),
        number(&index["cache_hits"]),
        number(&index["disk_lookups"])
    );
    let memory = &stats["engine"]["memory"];
    println!(
        "memory            {} ({:.2} bytes per stored chunk grow with the data)",
        format_size(number(&memory["total_bytes"])),
        memory["proportional_bytes_per_chunk"]
            .as_f64()
            .unwrap_or_default()
    );
    Ok(())
}

fn number(value: &Value) -> u64 {
    value.as_u64().unwrap_or_default()
}

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}
