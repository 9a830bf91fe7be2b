//! What `onecopy check --repair` does to the face once it is open ([`OpenMode::Repair`]),
//! in memory, before the checkpoint that makes it durable (a crash meanwhile repairs again
//! from the same files):
//!
//! 1. the salvage's end: lost ranges and extents whose chunks the damage took are marked
//!    lost ([`Salvage::finish`]), each file's loss reported exactly;
//! 2. the namespace, in the manner of fsck: entries naming inodes that are gone are removed,
//!    a lost root directory is made again, every directory's parent is the directory that
//!    names it, inodes no directory reaches (their names were lost) are linked into
//!    `/lost+found` as `#INODE`, and link counts are set from the entries;
//! 3. the chunk store's derived tables (reference counts, free list, container table, index)
//!    are rebuilt from the chunk records and the extent maps.
//!
//! [`OpenMode::Repair`]: super::OpenMode::Repair

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use onecopy_core::check::{Finding, FindingKind};
use onecopy_core::chunk_store::ChunkStore;
use onecopy_core::pages::PageStore;

use super::salvage::{files_of, inode_label, ranges_text, Salvage};
use super::{now_ns, FileSystem};
use crate::changes::FsId;
use crate::error::Result;
use crate::node::{Attributes, Ino, Inode, Kind, ROOT};

/// The directory that holds inodes whose names were lost.
pub const LOST_AND_FOUND: &[u8] = b"lost+found";

/// Runs the repair (see the module documentation); returns the files whose lost ranges it
/// reported, which the check of the same run does not report again.
pub(crate) fn repair_opened(
    pages: &mut PageStore,
    chunks: &mut ChunkStore,
    systems: &mut BTreeMap<FsId, FileSystem>,
    salvage: Salvage,
    findings: &mut Vec<Finding>,
) -> Result<BTreeSet<(FsId, Ino)>> {
    let marked = salvage.finish(pages, chunks, systems);
    for lost in &marked {
        let system = &systems[&lost.fs];
        let object = format!(
            "fs {}: {}",
            system.record.name,
            inode_label(system, lost.ino)
        );
        let mut reasons = Vec::new();
        if !lost.damaged.is_empty() {
            reasons.push(format!(
                "{} were changed by damaged journal records and not written again since",
                ranges_text(&lost.damaged)
            ));
        }
        if !lost.unmapped.is_empty() {
            reasons.push(format!(
                "{} mapped chunks the damaged records held (freed, or stored again for other \
                 data)",
                ranges_text(&lost.unmapped)
            ));
        }
        let mut all: Vec<(u64, u64)> = lost.damaged.clone();
        all.extend(&lost.unmapped);
        all.sort_unstable();
        findings.push(
            Finding::new(FindingKind::Damage, object.clone(), reasons.join("; "))
                .repaired(
                    "marked lost: reads of these bytes fail until they are written again, \
                     punched or truncated away; the rest of the file is usable",
                )
                .with_lost([format!("{object} {}", ranges_text(&merge(all)))]),
        );
    }
    if salvage.skipped_changes > 0 {
        findings.push(
            Finding::new(
                FindingKind::Damage,
                "fs/meta: journal records after damage",
                format!(
                    "{} changes named inodes, directories or file systems that the damaged \
                     records created and were skipped",
                    salvage.skipped_changes
                ),
            )
            .repaired("skipped; the namespace repair below accounts for what they named"),
        );
    }
    for system in systems.values_mut() {
        repair_namespace(system, findings);
    }
    let mut counted: Vec<u32> = Vec::new();
    for system in systems.values() {
        for inode in system.inodes.values() {
            for extent in inode.extents.values().filter(|extent| !extent.is_lost()) {
                let id = extent.chunk as usize;
                if counted.len() <= id {
                    counted.resize(id + 1, 0);
                }
                counted[id] = counted[id].saturating_add(1);
            }
        }
    }
    let rebuilt = chunks.rebuild(pages, &counted)?;
    if rebuilt.references_corrected > 0 || rebuilt.chunks_freed > 0 {
        findings.push(
            Finding::new(
                FindingKind::Derived,
                "fs/meta/pages: chunk table",
                format!(
                    "{} reference counts differed from the extents that map their chunks, {} \
                     chunks in use were mapped by none",
                    rebuilt.references_corrected, rebuilt.chunks_freed
                ),
            )
            .repaired(format!(
                "rebuilt from the extent maps: {} chunks in use, {} index entries",
                rebuilt.chunks_in_use, rebuilt.index_entries
            )),
        );
    }
    Ok(files_of(&marked))
}

/// Sorted ranges with overlapping and touching ones joined.
fn merge(ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (start, end) in ranges {
        match merged.last_mut() {
            Some((_, last_end)) if start <= *last_end => *last_end = (*last_end).max(end),
            _ => merged.push((start, end)),
        }
    }
    merged
}

/// Repairs the namespace of `system` (see the module documentation).
fn repair_namespace(system: &mut FileSystem, findings: &mut Vec<Finding>) {
    if system.record.deleting {
        // Its deletion is finished after the repair; nothing of it is kept.
        return;
    }
    let name = system.record.name.clone();
    let object = |label: String| format!("fs {name}: {label}");
    let root_ok = system
        .inodes
        .get(&ROOT)
        .is_some_and(|root| root.attributes.kind == Kind::Directory);
    if !root_ok {
        let entries = system
            .inodes
            .remove(&ROOT)
            .map(|inode| inode.entries)
            .unwrap_or_default();
        let mut root = new_directory(0, 0, ROOT);
        root.entries = entries;
        system.set_inode(ROOT, root);
        findings.push(
            Finding::new(
                FindingKind::Damage,
                object("/ (inode 1)".to_string()),
                "the root directory was lost with a damaged record",
            )
            .repaired("an empty root directory was made; its files are linked into /lost+found")
            .with_lost([object("the attributes of the root directory".to_string())]),
        );
    }

    // Entries naming inodes that are gone, and second names of directories.
    let mut directory_named: HashMap<Ino, Ino> = HashMap::new();
    let directories: Vec<Ino> = system
        .inodes
        .iter()
        .filter(|(_, inode)| inode.attributes.kind == Kind::Directory)
        .map(|(&ino, _)| ino)
        .collect();
    for &directory in &directories {
        let entries: Vec<(Vec<u8>, Ino)> = system.inodes[&directory]
            .entries
            .iter()
            .map(|(name, child)| (name.clone(), *child))
            .collect();
        let directory_label = inode_label(system, directory);
        for (entry, child) in entries {
            let label = || {
                format!(
                    "{directory_label} entry {:?}",
                    String::from_utf8_lossy(&entry)
                )
            };
            let remove = match system.inodes.get(&child) {
                None => Some((
                    format!("names inode {child}, which was lost with a damaged record"),
                    Some(object(format!(
                        "{} (inode {child})",
                        label().replacen(" entry ", "/", 1)
                    ))),
                )),
                Some(target) if target.attributes.kind == Kind::Directory => {
                    match directory_named.get(&child) {
                        _ if child == ROOT => Some(("names the root directory".to_string(), None)),
                        Some(_) => Some((
                            format!("names directory inode {child}, which another entry names"),
                            None,
                        )),
                        None => {
                            directory_named.insert(child, directory);
                            None
                        }
                    }
                }
                Some(_) => None,
            };
            if let Some((detail, lost)) = remove {
                let mut finding = Finding::new(FindingKind::Damage, object(label()), detail)
                    .repaired("the entry was removed");
                if let Some(lost) = lost {
                    finding = finding.with_lost([lost]);
                }
                findings.push(finding);
                let inode = system.inodes.get_mut(&directory).expect("listed above");
                inode.entries.remove(&entry);
            }
        }
    }
    for (&child, &directory) in &directory_named {
        if let Some(inode) = system.inodes.get_mut(&child) {
            inode.parent = directory;
        }
    }

    // Inodes no directory reaches: their names were lost. Files without links are orphans
    // (unlinked while open), which opening removes.
    let reachable = reachable(system);
    let mut unreachable: Vec<Ino> = system
        .inodes
        .iter()
        .filter(|(ino, inode)| {
            !reachable.contains(ino)
                && (inode.attributes.kind == Kind::Directory || inode.attributes.nlink > 0)
        })
        .map(|(&ino, _)| ino)
        .collect();
    // Only the tops of unreachable trees need a name.
    let named_inside: BTreeSet<Ino> = unreachable
        .iter()
        .flat_map(|ino| system.inodes[ino].entries.values().copied())
        .collect();
    let tops: Vec<Ino> = unreachable
        .iter()
        .copied()
        .filter(|ino| !named_inside.contains(ino))
        .collect();
    if !unreachable.is_empty() {
        let lost_and_found = lost_and_found(system);
        for ino in tops {
            link_found(system, lost_and_found, ino, &object, findings);
        }
        // What is still unreachable sits in a cycle of directories: each gets a name.
        let reachable = self::reachable(system);
        unreachable.retain(|ino| !reachable.contains(ino));
        for ino in unreachable {
            for inode in system.inodes.values_mut() {
                inode.entries.retain(|_, child| *child != ino);
            }
            link_found(system, lost_and_found, ino, &object, findings);
        }
    }

    // Link counts from the entries.
    let mut names: HashMap<Ino, u32> = HashMap::new();
    let mut subdirectories: HashMap<Ino, u32> = HashMap::new();
    for (&ino, inode) in &system.inodes {
        for child in inode.entries.values() {
            *names.entry(*child).or_default() += 1;
            if system.inodes[child].attributes.kind == Kind::Directory {
                *subdirectories.entry(ino).or_default() += 1;
            }
        }
    }
    let inos: Vec<Ino> = system.inodes.keys().copied().collect();
    for ino in inos {
        let label = inode_label(system, ino);
        let inode = system.inodes.get_mut(&ino).expect("listed above");
        let expected = match inode.attributes.kind {
            Kind::Directory => 2 + subdirectories.get(&ino).copied().unwrap_or(0),
            _ => names.get(&ino).copied().unwrap_or(0),
        };
        // A file without names keeps its count of 0: an orphan, removed after the repair.
        if inode.attributes.nlink != expected && !(expected == 0 && inode.attributes.nlink == 0) {
            findings.push(
                Finding::new(
                    FindingKind::Damage,
                    object(label),
                    format!(
                        "link count {} but {expected} expected from the entries",
                        inode.attributes.nlink
                    ),
                )
                .repaired(format!("set to {expected}")),
            );
            inode.attributes.nlink = expected;
        }
    }
}

/// Inodes reachable from the root through entries.
fn reachable(system: &FileSystem) -> BTreeSet<Ino> {
    let mut seen = BTreeSet::from([ROOT]);
    let mut pending = VecDeque::from([ROOT]);
    while let Some(ino) = pending.pop_front() {
        let Some(inode) = system.inodes.get(&ino) else {
            continue;
        };
        for child in inode.entries.values() {
            if seen.insert(*child) {
                pending.push_back(*child);
            }
        }
    }
    seen
}

/// A new, empty directory (link count 2) owned by `uid` and `gid` under `parent`.
fn new_directory(uid: u32, gid: u32, parent: Ino) -> Inode {
    let now = now_ns();
    Inode::new(
        Attributes {
            kind: Kind::Directory,
            mode: 0o700,
            uid,
            gid,
            nlink: 2,
            size: 0,
            rdev: 0,
            atime_ns: now,
            mtime_ns: now,
            ctime_ns: now,
            birth_ns: now,
        },
        parent,
    )
}

/// The inode of `/lost+found`, made when it does not exist as a directory.
fn lost_and_found(system: &mut FileSystem) -> Ino {
    let root = &system.inodes[&ROOT];
    if let Some(&ino) = root.entries.get(LOST_AND_FOUND) {
        if system.inodes[&ino].attributes.kind == Kind::Directory {
            return ino;
        }
    }
    let (uid, gid) = (root.attributes.uid, root.attributes.gid);
    let mut name = LOST_AND_FOUND.to_vec();
    while system.inodes[&ROOT].entries.contains_key(&name) {
        name.push(b'_');
    }
    let ino = system.next_ino;
    system.set_inode(ino, new_directory(uid, gid, ROOT));
    let root = system.inodes.get_mut(&ROOT).expect("made above");
    root.entries.insert(name, ino);
    root.attributes.nlink += 1;
    ino
}

/// Names inode `ino` `#INO` in directory `lost_and_found`.
fn link_found(
    system: &mut FileSystem,
    lost_and_found: Ino,
    ino: Ino,
    object: &dyn Fn(String) -> String,
    findings: &mut Vec<Finding>,
) {
    let name = format!("#{ino}");
    let directory = system
        .inodes
        .get_mut(&lost_and_found)
        .expect("lost+found exists");
    directory.entries.insert(name.clone().into_bytes(), ino);
    let inode = system.inodes.get_mut(&ino).expect("an unreachable inode");
    if inode.attributes.kind == Kind::Directory {
        inode.parent = lost_and_found;
    }
    let directory_name = system.inodes[&ROOT]
        .entries
        .iter()
        .find(|(_, child)| **child == lost_and_found)
        .map_or(LOST_AND_FOUND.to_vec(), |(name, _)| name.clone());
    let path = format!("/{}/{name}", String::from_utf8_lossy(&directory_name));
    findings.push(
        Finding::new(
            FindingKind::Damage,
            object(format!("inode {ino}")),
            "no directory names it: its name was lost with a damaged record",
        )
        .repaired(format!("linked as {path}"))
        .with_lost([object(format!("the name of inode {ino} (now {path})"))]),
    );
}
