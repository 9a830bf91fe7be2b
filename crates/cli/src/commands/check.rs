//! `onecopy check`: one check of every face of a repository, one report, one exit status.
//!
//! Exit status: 0 when nothing is wrong (leftovers of interrupted commands at most), 1 when
//! damage or derived data needs `--repair`, 3 when the repository is consistent but data is
//! lost (listed in the report). A check without `--repair` changes nothing.

use std::path::Path;
use std::sync::Arc;

use clap::Args;

use onecopy_block::control::{self, ControlRequest};
use onecopy_block::{Engine, OpenMode, RuntimeOptions};
use onecopy_core::check::{CheckOptions, ExitStatus, FaceReport, Finding, FindingKind};
use onecopy_core::repository::{LockWait, Repository};
use onecopy_core::units::format_size;

use crate::block_face::face_directory;
use crate::output::print_json;
use crate::Cli;

#[derive(Args, Debug)]
pub struct CheckArgs {
    #[command(flatten)]
    pub repository: crate::RepositoryArgs,
    #[command(flatten)]
    pub password: crate::keys::PasswordArgs,
    /// Make the repository usable again: rebuild what is derived (indexes, reference counts,
    /// tables), remove leftovers, and record exactly what is lost so the rest works.
    #[arg(long)]
    pub repair: bool,
    /// Read and verify every stored byte (checksums and fingerprints), not only metadata.
    #[arg(long)]
    pub read_data: bool,
    /// Print one JSON report instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(cli: &Cli, args: &CheckArgs) -> anyhow::Result<u8> {
    let options = CheckOptions {
        repair: args.repair,
        read_data: args.read_data,
    };
    if crate::backup_face::object_url(cli)?.is_some() {
        // On object storage a repository holds only a backup store.
        let reports = vec![crate::commands::backup::check_face(cli, options)?];
        return report(args, &cli.repository_path(), &reports, options);
    }
    let repository = Repository::open(&cli.repository_path())?;
    let mut reports = vec![check_privacy(&repository, options)?];
    // A block face exists once its configuration or its metadata does: a check must not
    // skip a face whose config.json is lost.
    let block = repository.path().join("block");
    if block.join("config.json").exists() || block.join("meta").exists() {
        reports.push(check_block(cli, &repository, options)?);
    }
    if repository.path().join("backup").exists() {
        reports.push(crate::commands::backup::check_face(cli, options)?);
    }
    let fs = repository.path().join("fs");
    if fs.join("config.json").exists() || fs.join("meta").exists() {
        reports.push(crate::commands::fs::check_face(cli, &repository, options)?);
    }
    report(args, repository.path(), &reports, options)
}

/// Prints the faces' reports; the exit status of the worst.
fn report(
    args: &CheckArgs,
    location: &std::path::Path,
    reports: &[FaceReport],
    options: CheckOptions,
) -> anyhow::Result<u8> {
    let status = reports
        .iter()
        .map(FaceReport::status)
        .fold(ExitStatus::Clean, ExitStatus::worst);
    if args.json {
        print_json(&serde_json::json!({
            "repository": location,
            "status": status,
            "faces": reports,
        }))?;
    } else {
        print_text(location, reports, status, options);
    }
    Ok(status.code())
}

/// Checks the block device; opening it is part of the check, so a failure to open is
/// reported as a finding, not as an error of the command. A check without repair only reads,
/// so a running server runs it on its live state; a repair needs the device to itself.
fn check_block(
    cli: &Cli,
    repository: &Repository,
    options: CheckOptions,
) -> anyhow::Result<FaceReport> {
    let command = if options.repair {
        "onecopy check --repair"
    } else {
        "onecopy check"
    };
    let lock = if options.repair {
        repository.lock_face_waiting("block", command, cli.lock_wait()?)?
    } else {
        match repository.lock_face("block", command) {
            Ok(lock) => lock,
            Err(locked @ onecopy_core::Error::Locked { .. }) => {
                let request = ControlRequest::Check {
                    read_data: options.read_data,
                };
                match control::request(&face_directory(repository), &request)? {
                    Some(Ok(report)) => return Ok(serde_json::from_value(report)?),
                    Some(Err(message)) => anyhow::bail!(message),
                    None if cli.lock_wait()? == LockWait::No => return Err(locked.into()),
                    None => repository.lock_face_waiting("block", command, cli.lock_wait()?)?,
                }
            }
            Err(error) => return Err(error.into()),
        }
    };
    let storage = repository.face_storage("block")?;
    // Only runtime defaults depend on the configuration; a damaged one is reported by the
    // check itself.
    let stored = onecopy_block::engine::stored_config(storage.as_ref())
        .ok()
        .flatten()
        .unwrap_or_default();
    let mode = if options.repair {
        OpenMode::Repair
    } else {
        OpenMode::ReadOnly
    };
    let opened = Engine::open_with(
        Arc::clone(&storage),
        None,
        RuntimeOptions::for_config(&stored),
        mode,
    );
    let report = match opened {
        Ok(engine) => engine.check(options)?,
        Err(error) => {
            let mut report = FaceReport::new("block");
            let object = match &error {
                onecopy_block::BlockError::Core(onecopy_core::Error::Corrupt { what, .. }) => {
                    what.clone()
                }
                _ => "block".to_string(),
            };
            report.push(Finding::new(
                FindingKind::Damage,
                object,
                format!("the block device cannot be opened: {error}"),
            ));
            report
        }
    };
    drop(lock);
    Ok(report)
}

/// Files and directories of the repository that other users may read or change (a
/// repository made under a permissive umask, or by an older onecopy).
fn check_privacy(repository: &Repository, options: CheckOptions) -> anyhow::Result<FaceReport> {
    let mut report = FaceReport::new("repository");
    let findings = onecopy_core::repository::check_privacy(repository.path(), options.repair)?;
    for finding in findings {
        report.push(finding);
    }
    report.repaired = options.repair;
    Ok(report)
}

fn print_text(path: &Path, reports: &[FaceReport], status: ExitStatus, options: CheckOptions) {
    println!("repository {}", path.display());
    if reports.iter().all(|report| report.checked.is_empty()) {
        println!("nothing stored yet");
    }
    for report in reports {
        if report.checked.is_empty() && report.findings.is_empty() {
            continue;
        }
        let checked: Vec<String> = report
            .checked
            .iter()
            .map(|(kind, count)| {
                if kind.ends_with("_bytes") {
                    format!(
                        "{} of {}",
                        format_size(*count),
                        kind.trim_end_matches("_bytes").replace('_', " ")
                    )
                } else {
                    format!("{count} {}", kind.replace('_', " "))
                }
            })
            .collect();
        println!(
            "{}: checked {}",
            face_name(&report.face),
            checked.join(", ")
        );
        for finding in &report.findings {
            let label = match finding.kind {
                FindingKind::Leftover => "leftover",
                FindingKind::Derived => "derived",
                FindingKind::Damage => "DAMAGE",
                FindingKind::Lost => "LOST",
            };
            println!("  {label:<8} {}: {}", finding.object, finding.detail);
            for lost in &finding.lost {
                println!("           lost: {lost}");
            }
            if let Some(repair) = &finding.repair {
                println!("           repaired: {repair}");
            }
        }
        if report.findings_not_listed > 0 {
            println!("  ... and {} more findings", report.findings_not_listed);
        }
    }
    match status {
        ExitStatus::Clean => println!("no problems found"),
        ExitStatus::Problems if options.repair => println!(
            "problems remain after the repair (see above); please report them with this output"
        ),
        ExitStatus::Problems => println!(
            "problems found: run `onecopy check --repair` to rebuild what is derived and record \
             what is lost{}",
            if options.read_data {
                ""
            } else {
                " (`--read-data` also verifies every stored byte)"
            }
        ),
        ExitStatus::DataLost => println!(
            "the repository is consistent, but the data listed as lost cannot be read: \
             restore it from a backup, or overwrite it (blocks) or delete it (backups)"
        ),
    }
}

fn face_name(face: &str) -> &str {
    match face {
        "repository" => "repository files",
        "block" => "block device",
        "backup" => "backup store",
        "fs" => "file systems",
        other => other,
    }
}
