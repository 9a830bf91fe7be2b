//! `onecopy check` of the file system face: the namespace, the extent maps and the reference
//! counts they imply, and (with `read_data`) every chunk's bytes.
//!
//! What is checked:
//!
//! 1. what opening found (journal records dropped after the last fsync, damage);
//! 2. every directory entry names an existing inode, every directory's parent exists, and
//!    link counts match the entries (a file's: its names; a directory's: 2 + its
//!    subdirectories) — primary data ([`FindingKind::Damage`]);
//! 3. every extent maps a chunk in use, within the chunk, without overlapping the next —
//!    primary data;
//! 4. each chunk's reference count equals the extents that map it, over every file system
//!    — derived data, set right by a repair (a mark and sweep, `onecopy_core::gc`); byte
//!    ranges an earlier repair recorded lost ([`crate::node::LOST_CHUNK`]) are reported as
//!    such ([`FindingKind::Lost`], exit status 3) until they are rewritten;
//! 5. with `read_data`, every mapped chunk reads back and passes its checksum.
//!
//! A check without `repair` changes nothing.

use std::collections::HashMap;

use onecopy_core::check::{CheckOptions, FaceReport, Finding, FindingKind};
use onecopy_core::chunk_store::ChunkId;
use onecopy_core::gc;

use crate::error::Result;
use crate::node::{Ino, Kind, ROOT};

use super::salvage::{inode_label, ranges_text};
use super::FsEngine;

/// The face's name in check reports.
pub const FACE_NAME: &str = "fs";

impl FsEngine {
    /// Checks the face (see the module documentation); repairs reference counts with
    /// `options.repair`.
    pub fn check(&self, options: CheckOptions) -> Result<FaceReport> {
        let mut report = FaceReport::new(FACE_NAME);
        for finding in self.open_findings() {
            report.push(finding.clone());
        }
        let mut counted: Vec<u32> = Vec::new();
        let mut mapped: Vec<(String, ChunkId)> = Vec::new();
        {
            let mut state = self.state.lock();
            let state = &mut *state;
            for system in state.systems.values() {
                let name = &system.record.name;
                report.count("file systems", 1);
                // A deletion a crash interrupted: its entries may name inodes already gone,
                // and the next writable open finishes it. Its extents still hold references.
                let deleting = system.record.deleting;
                if deleting {
                    report.push(Finding::new(
                        FindingKind::Leftover,
                        format!("fs {name}"),
                        "a deletion was interrupted; the next writable open finishes it",
                    ));
                }
                let mut names: HashMap<Ino, u32> = HashMap::new();
                let mut subdirectories: HashMap<Ino, u32> = HashMap::new();
                if !system.inodes.contains_key(&ROOT) {
                    report.push(Finding::new(
                        FindingKind::Damage,
                        format!("fs {name}"),
                        "the root directory is missing",
                    ));
                }
                for (ino, inode) in &system.inodes {
                    report.count("inodes", 1);
                    for (entry, child) in &inode.entries {
                        match system.inodes.get(child) {
                            Some(target) => {
                                *names.entry(*child).or_default() += 1;
                                if target.attributes.kind == Kind::Directory {
                                    *subdirectories.entry(*ino).or_default() += 1;
                                }
                            }
                            None if deleting => {}
                            None => report.push(Finding::new(
                                FindingKind::Damage,
                                format!("fs {name}: inode {ino}"),
                                format!(
                                    "entry {:?} names inode {child}, which does not exist",
                                    String::from_utf8_lossy(entry)
                                ),
                            )),
                        }
                    }
                    let mut end = 0u64;
                    let mut lost: Vec<(u64, u64)> = Vec::new();
                    for (offset, extent) in &inode.extents {
                        report.count("extents", 1);
                        if *offset < end {
                            report.push(Finding::new(
                                FindingKind::Damage,
                                format!("fs {name}: inode {ino}"),
                                format!("the extent at byte {offset} overlaps the one before"),
                            ));
                        }
                        end = offset + extent.length as u64;
                        if extent.is_lost() {
                            match lost.last_mut() {
                                Some((_, last_end)) if *last_end == *offset => *last_end = end,
                                _ => lost.push((*offset, end)),
                            }
                            continue;
                        }
                        let id = extent.chunk as usize;
                        if counted.len() <= id {
                            counted.resize(id + 1, 0);
                        }
                        counted[id] = counted[id].saturating_add(1);
                        mapped.push((
                            format!("fs {name}: inode {ino} byte {offset}"),
                            extent.chunk,
                        ));
                        match state.chunks.record(&mut state.pages, extent.chunk) {
                            Ok(record)
                                if record.in_use
                                    && extent.chunk_offset as u64 + extent.length as u64
                                        <= record.location.raw_bytes as u64 => {}
                            Ok(record) if record.in_use => report.push(Finding::new(
                                FindingKind::Damage,
                                format!("fs {name}: inode {ino}"),
                                format!(
                                    "the extent at byte {offset} reaches past the end of chunk {}",
                                    extent.chunk
                                ),
                            )),
                            Ok(_) => report.push(
                                Finding::new(
                                    FindingKind::Damage,
                                    format!("fs {name}: inode {ino}"),
                                    format!(
                                        "the extent at byte {offset} maps chunk {}, which is not \
                                         in use",
                                        extent.chunk
                                    ),
                                )
                                .with_lost([format!(
                                    "fs {name}: inode {ino} bytes {offset}..{end}"
                                )]),
                            ),
                            Err(error) => report.push(Finding::new(
                                FindingKind::Damage,
                                format!("fs {name}: chunk {}", extent.chunk),
                                error.to_string(),
                            )),
                        }
                    }
                    if !lost.is_empty() && !self.salvaged_files.contains(&(system.record.id, *ino))
                    {
                        let object = format!("fs {name}: {}", inode_label(system, *ino));
                        report.push(
                            Finding::new(
                                FindingKind::Lost,
                                object.clone(),
                                "a repair recorded these bytes lost (damage took them); reads \
                                 of them fail until they are written again, punched or \
                                 truncated away, or the file is removed",
                            )
                            .with_lost([format!("{object} {}", ranges_text(&lost))]),
                        );
                    }
                }
                for (ino, inode) in system.inodes.iter().filter(|_| !deleting) {
                    let expected = match inode.attributes.kind {
                        Kind::Directory => 2 + subdirectories.get(ino).copied().unwrap_or(0),
                        _ => names.get(ino).copied().unwrap_or(0),
                    };
                    let reachable = *ino == ROOT || names.contains_key(ino);
                    let open = system.open_handles.contains_key(ino);
                    if inode.attributes.nlink != expected && reachable {
                        report.push(Finding::new(
                            FindingKind::Damage,
                            format!("fs {name}: inode {ino}"),
                            format!(
                                "link count {} but {expected} expected from the entries",
                                inode.attributes.nlink
                            ),
                        ));
                    }
                    if !reachable && !open {
                        report.push(Finding::new(
                            FindingKind::Damage,
                            format!("fs {name}: inode {ino}"),
                            "no directory entry names it",
                        ));
                    }
                }
            }
            let plan = gc::plan_sweep(&state.chunks, &mut state.pages, &counted)?;
            report.count("chunks", plan.chunks_in_use);
            for correction in &plan.corrections {
                let mut finding = Finding::new(
                    FindingKind::Derived,
                    format!("fs: chunk {}", correction.id),
                    format!(
                        "reference count {} but {} extents map it",
                        correction.stored, correction.counted
                    ),
                );
                if options.repair && state.journal.is_some() {
                    finding = finding.repaired(format!("set to {}", correction.counted));
                }
                report.push(finding);
            }
            if options.repair && state.journal.is_some() && !plan.corrections.is_empty() {
                let mut changes = Vec::new();
                let swept =
                    gc::execute_sweep(&mut state.chunks, &mut state.pages, &plan, &mut changes);
                state.push_chunk_changes(changes);
                let logged = swept
                    .map_err(Into::into)
                    .and_then(|_| self.log_changes(state));
                if let Err(error) = logged {
                    state.failure = Some(error.to_string());
                    return Err(error);
                }
                report.repaired = true;
            }
        }
        if options.read_data {
            for (object, chunk) in mapped {
                let mut state = self.state.lock();
                let state = &mut *state;
                let Ok(record) = state.chunks.record(&mut state.pages, chunk) else {
                    continue;
                };
                if !record.in_use {
                    continue;
                }
                let mut bytes = vec![0u8; record.location.raw_bytes as usize];
                report.count("chunks read", 1);
                if let Err(error) = state.chunks.read_into(&mut state.pages, chunk, &mut bytes) {
                    report.push(Finding::new(
                        FindingKind::Damage,
                        object,
                        format!("chunk {chunk} does not read back: {error}"),
                    ));
                }
            }
        }
        if report.repaired {
            self.checkpoint()?;
        }
        Ok(report)
    }
}
