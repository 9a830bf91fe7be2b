//! Directory backups: a tree's metadata and contents as one byte stream.
//!
//! A directory backup's stream is the contents of its regular files, concatenated in walk
//! order (only the data extents of sparse files), followed by the encoded [`Tree`]: one
//! [`TreeEntry`] per file, directory, symbolic link, hard link, FIFO or device, with its mode,
//! owner, times and extended attributes. Both parts are chunked and deduplicated like any
//! stream, so an unchanged tree costs almost nothing in the next backup. The backup record
//! keeps where the tree starts ([`crate::series::TreeRange`]).
//!
//! - [`capture`] walks a directory ([`capture::walk`]) and reads it as that stream
//!   ([`capture::TreeReader`]).
//! - [`apply`] recreates a tree in a target directory from the entries and the contents.
//!
//! Names are stored as raw bytes (`OsStr` bytes), so names that are not UTF-8 survive. Paths
//! are relative to the backed-up directory, `/`-separated; the empty path is the directory
//! itself, whose metadata a restore applies to the target. Entries are in depth-first order
//! with each directory's children sorted by name bytes, so a parent always precedes its
//! children.
//!
//! Format (little-endian, ends with a CRC-32C):
//!
//! ```text
//! "TRE1" | entry count u32 | entry*
//! entry: path blob | kind u8 | mode u32 | uid u32 | gid u32 | atime s i64 | atime ns u32 |
//!        mtime s i64 | mtime ns u32 | xattr count u32 | (name blob | value blob)* | details
//! details: directory, fifo: nothing;  file: size u64 | stream offset u64 | extent count u32 |
//!          (offset u64 | length u64)*;  symlink: target blob;  hard link: entry index u32;
//!          character or block device: rdev u64
//! ```

pub mod apply;
pub mod capture;

use crate::codec::{Decoder, Encoder};
use crate::error::Result;

/// Entries a tree may hold (a bound on memory while decoding a corrupt count).
pub const TREE_ENTRIES_MAX: usize = 1 << 28;

/// A run of bytes of a file that holds data (sparse files have holes between extents).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub offset: u64,
    pub length: u64,
}

/// What an entry is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryKind {
    Directory,
    /// A regular file whose extents lie in the stream from `stream_offset`, back to back.
    File {
        size: u64,
        stream_offset: u64,
        extents: Vec<Extent>,
    },
    Symlink {
        target: Vec<u8>,
    },
    /// Another name of the regular file at entry `target`.
    HardLink {
        target: u32,
    },
    Fifo,
    CharDevice {
        rdev: u64,
    },
    BlockDevice {
        rdev: u64,
    },
}

/// One name in the tree and its metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeEntry {
    /// Relative path bytes; empty for the backed-up directory itself.
    pub path: Vec<u8>,
    pub kind: EntryKind,
    /// Permission bits, with set-user-id, set-group-id and sticky (`st_mode & 0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub atime: (i64, u32),
    pub mtime: (i64, u32),
    /// Extended attributes (name, value), sorted by name.
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

impl TreeEntry {
    /// Stream bytes of a regular file (the sum of its extents); 0 for other kinds.
    pub fn stream_bytes(&self) -> u64 {
        match &self.kind {
            EntryKind::File { extents, .. } => extents.iter().map(|extent| extent.length).sum(),
            _ => 0,
        }
    }
}

/// The metadata of a directory backup.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tree {
    pub entries: Vec<TreeEntry>,
}

impl Tree {
    /// Encodes the tree.
    pub fn encode(&self) -> Vec<u8> {
        let mut encoder = Encoder::with_capacity(64 + self.entries.len() * 96);
        encoder.bytes.extend_from_slice(b"TRE1");
        encoder.u32(self.entries.len() as u32);
        for entry in &self.entries {
            encoder.blob(&entry.path);
            encoder.u8(match entry.kind {
                EntryKind::Directory => 1,
                EntryKind::File { .. } => 2,
                EntryKind::Symlink { .. } => 3,
                EntryKind::HardLink { .. } => 4,
                EntryKind::Fifo => 5,
                EntryKind::CharDevice { .. } => 6,
                EntryKind::BlockDevice { .. } => 7,
            });
            encoder.u32(entry.mode);
            encoder.u32(entry.uid);
            encoder.u32(entry.gid);
            encoder.i64(entry.atime.0);
            encoder.u32(entry.atime.1);
            encoder.i64(entry.mtime.0);
            encoder.u32(entry.mtime.1);
            encoder.u32(entry.xattrs.len() as u32);
            for (name, value) in &entry.xattrs {
                encoder.blob(name);
                encoder.blob(value);
            }
            match &entry.kind {
                EntryKind::Directory | EntryKind::Fifo => {}
                EntryKind::File {
                    size,
                    stream_offset,
                    extents,
                } => {
                    encoder.u64(*size);
                    encoder.u64(*stream_offset);
                    encoder.u32(extents.len() as u32);
                    for extent in extents {
                        encoder.u64(extent.offset);
                        encoder.u64(extent.length);
                    }
                }
                EntryKind::Symlink { target } => encoder.blob(target),
                EntryKind::HardLink { target } => encoder.u32(*target),
                EntryKind::CharDevice { rdev } | EntryKind::BlockDevice { rdev } => {
                    encoder.u64(*rdev)
                }
            }
        }
        encoder.finish()
    }

    /// Decodes a tree, checking its checksum, hard link targets and file extents.
    pub fn decode(bytes: &[u8]) -> Result<Tree> {
        let mut decoder = Decoder::new_checked(bytes, "directory tree")?;
        if [decoder.u8()?, decoder.u8()?, decoder.u8()?, decoder.u8()?] != *b"TRE1" {
            return decoder.invalid("bad magic");
        }
        let count = decoder.u32()? as usize;
        if count > TREE_ENTRIES_MAX {
            return decoder.invalid(format!("{count} entries exceed the limit"));
        }
        let mut entries = Vec::with_capacity(count);
        for _ in 0..count {
            let path = decoder.blob()?.to_vec();
            let kind_code = decoder.u8()?;
            let mode = decoder.u32()?;
            let uid = decoder.u32()?;
            let gid = decoder.u32()?;
            let atime = (decoder.i64()?, decoder.u32()?);
            let mtime = (decoder.i64()?, decoder.u32()?);
            let xattr_count = decoder.u32()? as usize;
            let mut xattrs = Vec::with_capacity(xattr_count.min(1024));
            for _ in 0..xattr_count {
                xattrs.push((decoder.blob()?.to_vec(), decoder.blob()?.to_vec()));
            }
            let kind = match kind_code {
                1 => EntryKind::Directory,
                2 => {
                    let size = decoder.u64()?;
                    let stream_offset = decoder.u64()?;
                    let extent_count = decoder.u32()? as usize;
                    let mut extents = Vec::with_capacity(extent_count.min(1 << 16));
                    for _ in 0..extent_count {
                        let extent = Extent {
                            offset: decoder.u64()?,
                            length: decoder.u64()?,
                        };
                        if extent
                            .offset
                            .checked_add(extent.length)
                            .is_none_or(|end| end > size)
                        {
                            return decoder.invalid("a file extent lies past the file's end");
                        }
                        extents.push(extent);
                    }
                    EntryKind::File {
                        size,
                        stream_offset,
                        extents,
                    }
                }
                3 => EntryKind::Symlink {
                    target: decoder.blob()?.to_vec(),
                },
                4 => {
                    let target = decoder.u32()?;
                    let valid = entries
                        .get(target as usize)
                        .is_some_and(|entry: &TreeEntry| {
                            matches!(entry.kind, EntryKind::File { .. })
                        });
                    if !valid {
                        return decoder
                            .invalid(format!("hard link to entry {target}, not an earlier file"));
                    }
                    EntryKind::HardLink { target }
                }
                5 => EntryKind::Fifo,
                6 => EntryKind::CharDevice {
                    rdev: decoder.u64()?,
                },
                7 => EntryKind::BlockDevice {
                    rdev: decoder.u64()?,
                },
                other => return decoder.invalid(format!("unknown entry kind {other}")),
            };
            entries.push(TreeEntry {
                path,
                kind,
                mode,
                uid,
                gid,
                atime,
                mtime,
                xattrs,
            });
        }
        decoder.finish()?;
        Ok(Tree { entries })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: every entry kind round-trips; a hard link to a non-file is rejected.
    #[test]
    fn tree_round_trip() {
        let base = TreeEntry {
            path: b"d/\xffname".to_vec(),
            kind: EntryKind::Directory,
            mode: 0o4755,
            uid: 1000,
            gid: 100,
            atime: (-5, 7),
            mtime: (1_700_000_000, 999_999_999),
            xattrs: vec![(b"user.a".to_vec(), b"\x00\x01".to_vec())],
        };
        let kinds = [
            EntryKind::Directory,
            EntryKind::File {
                size: 100,
                stream_offset: 7,
                extents: vec![Extent {
                    offset: 10,
                    length: 20,
                }],
            },
            EntryKind::Symlink {
                target: b"../x".to_vec(),
            },
            EntryKind::HardLink { target: 1 },
            EntryKind::Fifo,
            EntryKind::CharDevice { rdev: 0x0501 },
            EntryKind::BlockDevice { rdev: 0x0801 },
        ];
        let tree = Tree {
            entries: kinds
                .into_iter()
                .map(|kind| TreeEntry {
                    kind,
                    ..base.clone()
                })
                .collect(),
        };
        assert_eq!(Tree::decode(&tree.encode()).unwrap(), tree);
        let mut broken = tree.clone();
        broken.entries[3].kind = EntryKind::HardLink { target: 0 };
        assert!(Tree::decode(&broken.encode()).is_err());
    }
}
