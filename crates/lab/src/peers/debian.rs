//! The system-tree dataset: /usr of a Debian root made by debootstrap, after real package
//! changes made by dpkg in a chroot.
//!
//! The steps are in `debian-snapshots.sh` beside this file (the script is built into the
//! binary and run with bash): debootstrap of the suite, then packages installed, the suite's
//! updates applied, packages removed, with a copy of /usr after each step. The snapshots are
//! made once into `<cache>/debian-<suite>/snapshots/` and reused; the script renames them
//! into place only when all are there. Making them needs root, debootstrap, rsync and the
//! Debian mirror; what the mirror serves changes over time, and each snapshot's
//! `.packages` file records which package versions a run got.

use std::fs;
use std::path::Path;
use std::process::Command;

use onecopy_core::error::IoContext;

use super::Snapshot;
use crate::error::{LabError, Result};
use crate::paper2::peers::run_plain;

/// The script that makes the snapshots.
const SCRIPT: &str = include_str!("debian-snapshots.sh");

/// The snapshots the script makes, in order.
pub const SNAPSHOTS: [&str; 4] = ["1-debootstrap", "2-install", "3-upgrade", "4-remove"];

/// The suite and mirror by default.
pub const SUITE_DEFAULT: &str = "bookworm";
pub const MIRROR_DEFAULT: &str = "http://deb.debian.org/debian";

/// Returns the snapshots of `suite`, made under `cache` when missing.
pub fn prepare(
    cache: &Path,
    suite: &str,
    mirror: &str,
    log: &mut dyn FnMut(&str),
) -> Result<Vec<Snapshot>> {
    let directory = cache.join(format!("debian-{suite}"));
    let snapshots = directory.join("snapshots");
    if !snapshots.is_dir() {
        log(&format!(
            "making the Debian snapshots in {} (debootstrap {suite} from {mirror}; minutes)",
            directory.display()
        ));
        fs::create_dir_all(&directory)
            .context_io(|| format!("creating {}", directory.display()))?;
        if run_plain(Command::new("debootstrap").arg("--version"), "debootstrap").is_err() {
            return Err(LabError::Missing(
                "debootstrap is missing: apt-get install debootstrap".into(),
            ));
        }
        run_plain(
            Command::new("bash")
                .arg("-c")
                .arg(SCRIPT)
                .arg("debian-snapshots.sh")
                .arg(&directory)
                .arg(suite)
                .arg(mirror),
            "debian-snapshots.sh",
        )?;
    }
    SNAPSHOTS
        .iter()
        .map(|name| {
            let tree = snapshots.join(name).join("usr");
            if tree.is_dir() {
                let changes = snapshot_changes(&tree).map_or(String::new(), |changes| {
                    format!(
                        "packages: {} added, {} removed, {} upgraded",
                        changes.0, changes.1, changes.2
                    )
                });
                Ok(Snapshot {
                    name: name.to_string(),
                    tree,
                    changes,
                })
            } else {
                Err(LabError::Missing(format!(
                    "{} is missing: remove {} to make the snapshots again",
                    tree.display(),
                    snapshots.display()
                )))
            }
        })
        .collect()
}

/// Packages that differ between two `.packages` lists (`name version` per line): added,
/// removed, and changed in version.
pub fn package_changes(before: &str, after: &str) -> (usize, usize, usize) {
    let parse = |text: &str| -> std::collections::BTreeMap<String, String> {
        text.lines()
            .filter_map(|line| {
                let (name, version) = line.split_once(' ')?;
                Some((name.to_string(), version.to_string()))
            })
            .collect()
    };
    let (before, after) = (parse(before), parse(after));
    let added = after
        .keys()
        .filter(|name| !before.contains_key(*name))
        .count();
    let removed = before
        .keys()
        .filter(|name| !after.contains_key(*name))
        .count();
    let changed = after
        .iter()
        .filter(|(name, version)| before.get(*name).is_some_and(|old| old != *version))
        .count();
    (added, removed, changed)
}

/// The package changes of each snapshot against the one before it (the first against
/// nothing), read from the `.packages` files next to the snapshots.
pub fn snapshot_changes(tree: &Path) -> Option<(usize, usize, usize)> {
    let snapshot = tree.parent()?;
    let name = snapshot.file_name()?.to_str()?;
    let index = SNAPSHOTS.iter().position(|known| *known == name)?;
    let list = |name: &str| fs::read_to_string(snapshot.with_file_name(format!("{name}.packages")));
    let after = list(name).ok()?;
    let before = match index {
        0 => String::new(),
        _ => list(SNAPSHOTS[index - 1]).ok()?,
    };
    Some(package_changes(&before, &after))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: package lists compare into added, removed and upgraded counts; method: two
    /// small lists.
    #[test]
    fn package_changes_count() {
        let before = "bash 5.2.15-2+b7\ngcc 4:12.2.0-3\nlibc6 2.36-9+deb12u4\n";
        let after = "bash 5.2.15-2+b7\nlibc6 2.36-9+deb12u13\npython3 3.11.2-1+b1\n";
        assert_eq!(package_changes(before, after), (1, 1, 1));
        assert_eq!(package_changes("", after), (3, 0, 0));
    }

    /// Goal: snapshots already in the cache are used as they are (nothing is made), with
    /// their package changes, and a missing one is reported; method: a cache of empty
    /// snapshot directories and package lists.
    #[test]
    fn cached_snapshots_are_used() {
        let cache = tempfile::tempdir().expect("temporary directory");
        let snapshots = cache.path().join("debian-test/snapshots");
        for (index, name) in SNAPSHOTS.iter().enumerate() {
            fs::create_dir_all(snapshots.join(name).join("usr")).expect("directory");
            let packages: String = (0..=index)
                .map(|package| format!("p{package} 1\n"))
                .collect();
            fs::write(snapshots.join(format!("{name}.packages")), packages).expect("list");
        }
        let mut log = |_: &str| {};
        let found = prepare(cache.path(), "test", "http://unused.invalid", &mut log)
            .expect("cached snapshots");
        assert_eq!(found.len(), SNAPSHOTS.len());
        assert_eq!(found[0].changes, "packages: 1 added, 0 removed, 0 upgraded");
        assert_eq!(found[3].changes, "packages: 1 added, 0 removed, 0 upgraded");
        fs::remove_dir_all(snapshots.join(SNAPSHOTS[2])).expect("remove");
        assert!(prepare(cache.path(), "test", "http://unused.invalid", &mut log).is_err());
    }

    /// Goal: the script the binary carries is valid bash and makes the snapshots the lab
    /// expects; method: `bash -n` on it, and its snapshot names.
    #[test]
    fn script_is_valid() {
        run_plain(
            Command::new("bash").arg("-n").arg("-c").arg(SCRIPT),
            "bash -n",
        )
        .expect("the script parses");
        for name in SNAPSHOTS {
            assert!(SCRIPT.contains(&format!("snapshot {name}")), "{name}");
        }
    }
}
