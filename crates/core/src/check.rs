//! What `onecopy check` reports, for every face of a repository.
//!
//! Each face (block device, backup store, and every face added later) checks its own files
//! and returns a [`FaceReport`]: what it looked at ([`FaceReport::checked`], counts by kind)
//! and what it found ([`Finding`]). `onecopy check` runs every face that exists, prints one
//! report and sets one exit status ([`ExitStatus`]).
//!
//! Terms:
//!
//! - **Primary data** is what users stored and the metadata that alone says where it is
//!   (block maps, the chunk table, journals and manifests, recipes, segment records,
//!   containers). Damage to it is a [`FindingKind::Damage`]: a repair recovers what can be
//!   recovered and lists the rest in [`Finding::lost`], exactly (volume and block ranges,
//!   backups and files).
//! - **Derived data** can be rebuilt from primary data without loss (the fingerprint index and
//!   its filter and directory, the segment index, reference counts, cached tables). Damage to
//!   it, or derived data out of step with the primary data, is a [`FindingKind::Derived`].
//! - **Leftovers** are files nothing refers to, left by an interrupted command
//!   ([`FindingKind::Leftover`]); harmless, removed by the next mutating command or a repair.
//! - A **recorded loss** ([`FindingKind::Lost`]) is data an earlier repair declared lost:
//!   reads of it fail with an error naming it until it is rewritten or its owner deleted.
//!
//! A check without `repair` changes nothing: it reports before anything is rebuilt, so the
//! evidence of damage is never overwritten by a checkpoint.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Findings listed per face before the rest are only counted, so a badly damaged repository
/// still gives a readable report.
pub const FINDINGS_LISTED_MAX: usize = 1000;

/// What to check and whether to repair.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CheckOptions {
    /// Rebuild derived data, remove leftovers, and record what is lost so that the rest is
    /// usable again.
    pub repair: bool,
    /// Read and verify every stored byte (checksums and fingerprints), not only metadata.
    pub read_data: bool,
}

/// How serious a finding is; see the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// Harmless files left by an interrupted command.
    Leftover,
    /// Derived data damaged or out of step; rebuilt by a repair without loss.
    Derived,
    /// Primary data or metadata damaged.
    Damage,
    /// Data an earlier repair recorded as lost.
    Lost,
}

/// One problem a check found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    pub kind: FindingKind,
    /// The damaged object, precisely: a file and byte offset, a page of an area, a container,
    /// a volume and block range, a backup and file.
    pub object: String,
    /// What is wrong with it.
    pub detail: String,
    /// What the repair did about it; `None` when no repair ran (or it could do nothing).
    pub repair: Option<String>,
    /// What is lost for good because of it (volume block ranges, backups, files), when known.
    pub lost: Vec<String>,
}

impl Finding {
    /// A finding of `kind` about `object`, not repaired.
    pub fn new(kind: FindingKind, object: impl Into<String>, detail: impl Into<String>) -> Self {
        Finding {
            kind,
            object: object.into(),
            detail: detail.into(),
            repair: None,
            lost: Vec::new(),
        }
    }

    /// Records what a repair did.
    pub fn repaired(mut self, what: impl Into<String>) -> Self {
        self.repair = Some(what.into());
        self
    }

    /// Records what is lost for good.
    pub fn with_lost(mut self, lost: impl IntoIterator<Item = String>) -> Self {
        self.lost.extend(lost);
        self
    }

    /// True when the finding still needs a repair: unrepaired damage or derived data.
    pub fn needs_repair(&self) -> bool {
        self.repair.is_none() && matches!(self.kind, FindingKind::Damage | FindingKind::Derived)
    }

    /// True when data is lost because of this finding (now or by an earlier repair).
    pub fn loses_data(&self) -> bool {
        self.kind == FindingKind::Lost || !self.lost.is_empty()
    }
}

/// What a check of one face found.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaceReport {
    /// The face: `block`, `backup`, ...
    pub face: String,
    /// What was looked at, by kind (`pages`, `chunks`, `containers`, `backups`, ...).
    pub checked: BTreeMap<String, u64>,
    /// What was found, at most [`FINDINGS_LISTED_MAX`].
    pub findings: Vec<Finding>,
    /// Findings past [`FINDINGS_LISTED_MAX`], counted only.
    pub findings_not_listed: u64,
    /// True when a repair ran.
    pub repaired: bool,
}

impl FaceReport {
    /// An empty report of `face`.
    pub fn new(face: impl Into<String>) -> Self {
        FaceReport {
            face: face.into(),
            ..FaceReport::default()
        }
    }

    /// Adds `count` to what was checked of `kind`.
    pub fn count(&mut self, kind: &str, count: u64) {
        *self.checked.entry(kind.to_string()).or_default() += count;
    }

    /// Adds a finding (counted only past [`FINDINGS_LISTED_MAX`]).
    pub fn push(&mut self, finding: Finding) {
        if self.findings.len() < FINDINGS_LISTED_MAX {
            self.findings.push(finding);
        } else {
            self.findings_not_listed += 1;
        }
    }

    /// True when nothing but leftovers was found.
    pub fn is_clean(&self) -> bool {
        self.findings_not_listed == 0
            && self
                .findings
                .iter()
                .all(|finding| finding.kind == FindingKind::Leftover)
    }

    /// The exit status this report calls for.
    pub fn status(&self) -> ExitStatus {
        let needs_repair =
            self.findings_not_listed > 0 || self.findings.iter().any(Finding::needs_repair);
        if needs_repair {
            ExitStatus::Problems
        } else if self.findings.iter().any(Finding::loses_data) {
            ExitStatus::DataLost
        } else {
            ExitStatus::Clean
        }
    }
}

/// The outcome of `onecopy check`, as a process exit code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitStatus {
    /// Nothing wrong (leftovers at most): exit 0.
    Clean,
    /// Damage or derived data that `--repair` has not handled yet: exit 1.
    Problems,
    /// Consistent, but some data is lost (listed): exit 3.
    DataLost,
}

impl ExitStatus {
    /// The process exit code.
    pub fn code(self) -> u8 {
        match self {
            ExitStatus::Clean => 0,
            ExitStatus::Problems => 1,
            ExitStatus::DataLost => 3,
        }
    }

    /// The worse of two outcomes: unrepaired problems outrank recorded losses.
    pub fn worst(self, other: ExitStatus) -> ExitStatus {
        match (self, other) {
            (ExitStatus::Problems, _) | (_, ExitStatus::Problems) => ExitStatus::Problems,
            (ExitStatus::DataLost, _) | (_, ExitStatus::DataLost) => ExitStatus::DataLost,
            _ => ExitStatus::Clean,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the exit status follows the findings: leftovers are clean, unrepaired damage and
    /// derived data are problems, repaired damage with losses and recorded losses are data
    /// lost, and problems outrank losses.
    #[test]
    fn status_follows_findings() {
        let mut report = FaceReport::new("block");
        report.push(Finding::new(
            FindingKind::Leftover,
            "container 9",
            "no record",
        ));
        assert!(report.is_clean());
        assert_eq!(report.status(), ExitStatus::Clean);

        report.push(Finding::new(
            FindingKind::Derived,
            "index",
            "3 entries missing",
        ));
        assert_eq!(report.status(), ExitStatus::Problems);
        report.findings[1] = report.findings[1].clone().repaired("re-inserted 3 entries");
        assert_eq!(report.status(), ExitStatus::Clean);

        report.push(
            Finding::new(FindingKind::Damage, "page 3 of volume.1.map", "checksum")
                .repaired("blocks marked lost")
                .with_lost(["volume disk blocks 1536-2047".to_string()]),
        );
        assert_eq!(report.status(), ExitStatus::DataLost);
        report.push(Finding::new(FindingKind::Damage, "chunk 7", "checksum"));
        assert_eq!(report.status(), ExitStatus::Problems);
        assert_eq!(
            ExitStatus::DataLost.worst(ExitStatus::Clean),
            ExitStatus::DataLost
        );
        assert_eq!(
            ExitStatus::DataLost.worst(ExitStatus::Problems),
            ExitStatus::Problems
        );
    }

    /// Goal: a report lists at most FINDINGS_LISTED_MAX findings and counts the rest, which
    /// still make it unclean.
    #[test]
    fn findings_past_the_limit_are_counted() {
        let mut report = FaceReport::new("backup");
        for index in 0..FINDINGS_LISTED_MAX + 5 {
            report.push(Finding::new(
                FindingKind::Leftover,
                format!("c{index}"),
                "x",
            ));
        }
        assert_eq!(report.findings.len(), FINDINGS_LISTED_MAX);
        assert_eq!(report.findings_not_listed, 5);
        assert!(!report.is_clean());
        assert_eq!(report.status(), ExitStatus::Problems);
    }
}
