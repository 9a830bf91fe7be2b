//! Human-readable output of `onecopy backup` commands.

use onecopy_backup::{CreateReport, DedupMode, DeleteMethod, FaceReport, FindingKind};
use onecopy_core::units::{format_rate, format_size};

pub fn print_create(report: &CreateReport) {
    let inline = &report.inline;
    println!(
        "created {}@{} ({}) in {:.2} s",
        report.series,
        report.version,
        format_size(inline.logical_bytes),
        report.seconds
    );
    println!(
        "  inline   {:.2} s ({}): {} segments, {} new ({} stored, {} borrowed within the \
         backup), {} duplicate ({}), {} null",
        inline.seconds + report.walk_seconds + report.commit_seconds,
        format_rate(
            inline.logical_bytes as f64 / (inline.seconds + report.commit_seconds).max(1e-9)
        ),
        inline.segments,
        inline.segments_new,
        format_size(inline.new_stored_bytes),
        format_size(inline.borrowed_bytes),
        inline.segments_duplicate,
        format_size(inline.duplicate_bytes),
        format_size(inline.zero_bytes)
    );
    if let Some(summary) = &report.summary {
        let against = match summary.previous_version {
            Some(version) => format!("compared with @{version}"),
            None => "first backup of the series".to_string(),
        };
        println!(
            "  files    {} new ({}), {} changed ({}), {} unchanged ({}), {} removed; {against}",
            summary.files_new,
            format_size(summary.bytes_new),
            summary.files_changed,
            format_size(summary.bytes_changed),
            summary.files_unchanged,
            format_size(summary.bytes_unchanged),
            summary.files_removed
        );
    }
    if let Some(files) = &report.files {
        let cache = match files.previous_version {
            Some(version) => format!("unchanged since @{version}"),
            None => "every file read".to_string(),
        };
        println!(
            "  read     {} files ({}); {} files ({}) not read, {cache}",
            files.files_read,
            format_size(files.bytes_read),
            files.files_kept,
            format_size(files.bytes_kept),
        );
    }
    if let Some(error) = &report.files_cache_error {
        println!("  read     every file: the previous backup's tree did not read back: {error}");
    }
    if let Some(error) = &report.summary_error {
        println!("  files    no summary: the previous backup's tree did not read back: {error}");
    }
    for reverse in &report.reverse {
        let plan = &reverse.plan;
        println!(
            "  reverse  {}@{} in {:.2} s ({}): {} indirect, {} direct chunks; {} removed, {} repackaged",
            plan.series,
            plan.version,
            reverse.seconds,
            format_rate(plan.logical_bytes as f64 / reverse.seconds.max(1e-9)),
            plan.indirect_chunks,
            plan.direct_chunks,
            format_size(plan.settlement.removed_bytes),
            format_size(plan.settlement.copy_archival_bytes)
        );
        print_follow_up_compaction(&reverse.compact, &reverse.compact_error);
    }
    for deleted in &report.expire {
        print_delete(deleted);
    }
    if let Some(reason) = &report.reverse_deferred {
        println!("  warning: reverse deduplication left for later: {reason}");
    }
    if let Some(recompression) = &report.recompression {
        println!(
            "  recompress {} containers of earlier backups at zstd {} in {:.2} s: {} freed",
            recompression.containers_rewritten,
            recompression
                .plan
                .recompression
                .map_or(0, |recompression| recompression.level),
            recompression.seconds,
            format_size(recompression.reclaimed_bytes)
        );
    }
    if let Some(error) = &report.recompression_error {
        println!(
            "  warning: earlier backups' frames were not compressed again: {error}; the next \
             backup tries again (when this names damage, run `onecopy check --repair`)"
        );
    }
    for warning in &report.warnings {
        eprintln!("warning: {}: {}", warning.path, warning.message);
    }
}

/// The containers a deletion or reverse deduplication rewrote because it left them with
/// garbage, or why that stopped.
fn print_follow_up_compaction(
    report: &Option<onecopy_backup::CompactReport>,
    error: &Option<String>,
) {
    if let Some(report) = report {
        println!(
            "  compact  {} containers rewritten, {} removed in {:.2} s: {} freed",
            report.containers_rewritten,
            report.containers_removed,
            report.seconds,
            format_size(report.reclaimed_bytes)
        );
    }
    if let Some(error) = error {
        println!(
            "  warning: containers with removed chunks were not rewritten ({error}); \
             `onecopy backup compact` frees their space later"
        );
    }
}

/// The name of a deletion method as `--delete-method` spells it.
pub fn delete_method_name(method: DeleteMethod) -> &'static str {
    match method {
        DeleteMethod::Timestamp => "timestamp",
        DeleteMethod::MarkAndSweep => "mark-and-sweep",
    }
}

/// The name of a deduplication mode as `--mode` spells it.
pub fn dedup_mode_name(mode: DedupMode) -> &'static str {
    match mode {
        DedupMode::Revdedup => "revdedup",
        DedupMode::Conventional => "conventional",
    }
}

/// An expiry plan: what stays and why, then what goes (`would` for a dry run).
pub fn print_expire_plan(plan: &onecopy_backup::ExpirePlan, dry_run: bool) {
    for kept in &plan.kept {
        println!(
            "keep   {}@{}  {}  {}",
            plan.series,
            kept.version,
            format_time(kept.created_unix_ns),
            kept.reasons.join(", ")
        );
    }
    let verb = if dry_run { "would delete" } else { "delete" };
    if plan.versions.is_empty() {
        println!("nothing to expire in {}", plan.series);
    } else {
        let versions: Vec<String> = plan
            .versions
            .iter()
            .map(|version| format!("{}@{version}", plan.series))
            .collect();
        println!("{verb} {}", versions.join(", "));
    }
}

pub fn print_delete_plan(plan: &onecopy_backup::DeletePlan) -> anyhow::Result<()> {
    println!(
        "would delete {}@{} ({}): {} containers dropped, {} segments released, {} repackaged",
        plan.series,
        plan.version,
        format_size(plan.logical_bytes),
        plan.settlement.dropped_containers.len(),
        plan.settlement.segments_died,
        plan.settlement.moves.len()
    );
    Ok(())
}

pub fn print_delete(report: &onecopy_backup::DeleteReport) {
    let plan = &report.plan;
    print!(
        "deleted {}@{} in {:.3} s ({}): {} containers dropped",
        plan.series,
        plan.version,
        report.seconds,
        delete_method_name(report.method),
        plan.settlement.dropped_containers.len()
    );
    if let Some(sweep) = &report.sweep {
        print!(
            "; sweep read {} containers ({}) in {:.2} s, rewrote {}",
            sweep.containers_scanned,
            format_size(sweep.scanned_bytes),
            sweep.seconds,
            sweep.containers_rewritten
        );
    }
    println!("; freed {}", format_size(report.freed_bytes));
    print_follow_up_compaction(&report.compact, &report.compact_error);
    if report.compactable_bytes > 0 {
        println!(
            "  {} of removed chunks stay in {} containers still in use; \
             `onecopy backup compact` frees it",
            format_size(report.compactable_bytes),
            report.compactable_containers
        );
    }
}

/// A check's findings, one per line with what the repair did and what is lost, then a
/// summary.
pub fn print_face_report(report: &FaceReport) {
    let checked: Vec<String> = report
        .checked
        .iter()
        .map(|(kind, count)| format!("{count} {}", kind.replace('_', " ")))
        .collect();
    println!("{}: checked {}", report.face, checked.join(", "));
    for finding in &report.findings {
        let kind = match finding.kind {
            FindingKind::Leftover => "leftover",
            FindingKind::Derived => "derived data",
            FindingKind::Damage => "damage",
            FindingKind::Lost => "lost",
        };
        println!("{kind}: {}: {}", finding.object, finding.detail);
        if let Some(repair) = &finding.repair {
            println!("  repaired: {repair}");
        }
        for lost in &finding.lost {
            println!("  lost: {lost}");
        }
    }
    if report.findings_not_listed > 0 {
        println!("... and {} more findings", report.findings_not_listed);
    }
    match report.status() {
        onecopy_backup::ExitStatus::Clean if report.findings.is_empty() => {
            println!("{}: no problems found", report.face)
        }
        onecopy_backup::ExitStatus::Clean => println!(
            "{}: consistent ({})",
            report.face,
            if report.repaired {
                "repaired"
            } else {
                "leftovers of interrupted commands only; the next change removes them"
            }
        ),
        onecopy_backup::ExitStatus::Problems => println!(
            "{}: problems found; run `onecopy backup check --repair`",
            report.face
        ),
        onecopy_backup::ExitStatus::DataLost => println!(
            "{}: consistent, but some data is lost (listed above)",
            report.face
        ),
    }
}

pub use onecopy_core::units::format_time;

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the date formatter matches known instants.
    #[test]
    fn formats_utc_times() {
        assert_eq!(format_time(0), "1970-01-01 00:00:00");
        assert_eq!(format_time(951_782_400_000_000_000), "2000-02-29 00:00:00");
        assert_eq!(
            format_time(1_700_000_000_000_000_000),
            "2023-11-14 22:13:20"
        );
    }
}
