//! Journal records of the file system face.
//!
//! One record per request (or deduplication step) holds every change it made, in the order
//! they were made, so a request is replayed entirely or not at all: a chunk stored by a write
//! and the extent that maps it are never separated by a crash. Replay applies the same
//! changes through the same code as the live path ([`crate::engine`]'s `apply`).
//!
//! Encoding: change count u32, then per change a tag byte and its fields, little-endian:
//!
//! ```text
//! 0 chunk      ChunkChange encoding (onecopy_core::chunk_store)
//! 1 fs set     json length u32 | FileSystemRecord as JSON
//! 2 fs removed fs u32
//! 3 inode set  fs u32 | ino u64 | inode head (attributes, monitor, parent, target)
//! 4 inode gone fs u32 | ino u64
//! 5 entry      fs u32 | parent u64 | name (length u32, bytes) | child u64 (0: removed)
//! 6 extent     fs u32 | ino u64 | offset u64 | present u8 | chunk u64 | chunk offset u32 |
//!              length u32 | plain u8
//! 7 xattr      fs u32 | ino u64 | name | present u8 | value
//! 8 piece      fingerprint [32] | present u8 | value u64 (present only)
//! ```

use onecopy_core::bytes::ByteReader;
use onecopy_core::chunk_store::ChunkChange;
use onecopy_core::fingerprint::{Fingerprint, FINGERPRINT_BYTES};
use serde::{Deserialize, Serialize};

use crate::error::{FsError, Result};
use crate::node::{
    put_bytes, put_extent, put_inode_head, put_u32, put_u64, take_bytes, take_extent,
    take_inode_head, Extent, Ino, Inode,
};
use crate::options::FsOptions;

/// Identifies a file system within the face.
pub type FsId = u32;

/// A file system's name and settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileSystemRecord {
    pub id: FsId,
    pub name: String,
    pub options: FsOptions,
    /// When it was created (unix seconds).
    pub created: u64,
    /// Its deletion started: its files are being released; the next open finishes it.
    #[serde(default)]
    pub deleting: bool,
}

/// One change made by a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FsChange {
    Chunk(ChunkChange),
    FileSystemSet(Box<FileSystemRecord>),
    FileSystemRemoved(FsId),
    /// An inode's attributes, monitor record, parent or target changed (or it was created).
    InodeSet {
        fs: FsId,
        ino: Ino,
        inode: Box<Inode>,
    },
    /// An inode is gone; its extents were removed by earlier changes.
    InodeRemoved {
        fs: FsId,
        ino: Ino,
    },
    /// A directory entry was added, replaced (`Some`) or removed (`None`).
    Entry {
        fs: FsId,
        parent: Ino,
        name: Vec<u8>,
        child: Option<Ino>,
    },
    /// The extent starting at `offset` was set or removed.
    Extent {
        fs: FsId,
        ino: Ino,
        offset: u64,
        extent: Option<Extent>,
    },
    Xattr {
        fs: FsId,
        ino: Ino,
        name: Vec<u8>,
        value: Option<Vec<u8>>,
    },
    /// The piece index's entry for `fingerprint` was set to `value` (a piece of a big chunk,
    /// [`crate::engine::pieces`]) or removed (`None`: the entry of the fingerprint's key).
    Piece {
        fingerprint: Fingerprint,
        value: Option<u64>,
    },
}

/// Encodes the changes of one request as a journal record payload.
pub fn encode(changes: &[FsChange], out: &mut Vec<u8>) {
    out.clear();
    put_u32(out, changes.len() as u32);
    for change in changes {
        match change {
            FsChange::Chunk(chunk) => {
                out.push(0);
                chunk.encode(out);
            }
            FsChange::FileSystemSet(record) => {
                out.push(1);
                let json = serde_json::to_vec(record).expect("file system records serialise");
                put_bytes(out, &json);
            }
            FsChange::FileSystemRemoved(fs) => {
                out.push(2);
                put_u32(out, *fs);
            }
            FsChange::InodeSet { fs, ino, inode } => {
                out.push(3);
                put_u32(out, *fs);
                put_u64(out, *ino);
                put_inode_head(out, inode);
            }
            FsChange::InodeRemoved { fs, ino } => {
                out.push(4);
                put_u32(out, *fs);
                put_u64(out, *ino);
            }
            FsChange::Entry {
                fs,
                parent,
                name,
                child,
            } => {
                out.push(5);
                put_u32(out, *fs);
                put_u64(out, *parent);
                put_bytes(out, name);
                put_u64(out, child.unwrap_or(0));
            }
            FsChange::Extent {
                fs,
                ino,
                offset,
                extent,
            } => {
                out.push(6);
                put_u32(out, *fs);
                put_u64(out, *ino);
                match extent {
                    Some(extent) => {
                        out.push(1);
                        put_extent(out, *offset, extent);
                    }
                    None => {
                        out.push(0);
                        put_u64(out, *offset);
                    }
                }
            }
            FsChange::Xattr {
                fs,
                ino,
                name,
                value,
            } => {
                out.push(7);
                put_u32(out, *fs);
                put_u64(out, *ino);
                put_bytes(out, name);
                match value {
                    Some(value) => {
                        out.push(1);
                        put_bytes(out, value);
                    }
                    None => out.push(0),
                }
            }
            FsChange::Piece { fingerprint, value } => {
                out.push(8);
                out.extend_from_slice(&fingerprint.0);
                match value {
                    Some(value) => {
                        out.push(1);
                        put_u64(out, *value);
                    }
                    None => out.push(0),
                }
            }
        }
    }
}

/// Decodes a journal record payload.
pub fn decode(payload: &[u8]) -> Result<Vec<FsChange>> {
    let malformed = || {
        FsError::Core(onecopy_core::Error::corrupt(
            "fs journal record",
            "malformed",
        ))
    };
    let mut reader = ByteReader::new(payload);
    let count = reader.u32().ok_or_else(malformed)? as usize;
    // Each change takes at least 5 bytes, which bounds the allocation for corrupt counts.
    if count > payload.len() / 5 {
        return Err(malformed());
    }
    let mut changes = Vec::with_capacity(count);
    for _ in 0..count {
        let tag = reader.take(1).ok_or_else(malformed)?[0];
        let change = match tag {
            0 => FsChange::Chunk(ChunkChange::decode(&mut reader)?),
            1 => {
                let json = take_bytes(&mut reader).ok_or_else(malformed)?;
                let record = serde_json::from_slice(&json).map_err(|_| malformed())?;
                FsChange::FileSystemSet(Box::new(record))
            }
            2 => FsChange::FileSystemRemoved(reader.u32().ok_or_else(malformed)?),
            3 => decode_inode_set(&mut reader).ok_or_else(malformed)?,
            4 => FsChange::InodeRemoved {
                fs: reader.u32().ok_or_else(malformed)?,
                ino: reader.u64().ok_or_else(malformed)?,
            },
            5 => decode_entry(&mut reader).ok_or_else(malformed)?,
            6 => decode_extent(&mut reader).ok_or_else(malformed)?,
            7 => decode_xattr(&mut reader).ok_or_else(malformed)?,
            8 => decode_piece(&mut reader).ok_or_else(malformed)?,
            _ => return Err(malformed()),
        };
        changes.push(change);
    }
    if !reader.is_empty() {
        return Err(malformed());
    }
    Ok(changes)
}

fn decode_inode_set(reader: &mut ByteReader<'_>) -> Option<FsChange> {
    let fs = reader.u32()?;
    let ino = reader.u64()?;
    let inode = take_inode_head(reader)?;
    Some(FsChange::InodeSet {
        fs,
        ino,
        inode: Box::new(inode),
    })
}

fn decode_entry(reader: &mut ByteReader<'_>) -> Option<FsChange> {
    let fs = reader.u32()?;
    let parent = reader.u64()?;
    let name = take_bytes(reader)?;
    let child = reader.u64()?;
    Some(FsChange::Entry {
        fs,
        parent,
        name,
        child: (child != 0).then_some(child),
    })
}

fn decode_extent(reader: &mut ByteReader<'_>) -> Option<FsChange> {
    let fs = reader.u32()?;
    let ino = reader.u64()?;
    let (offset, extent) = match reader.take(1)?[0] {
        1 => {
            let (offset, extent) = take_extent(reader)?;
            (offset, Some(extent))
        }
        0 => (reader.u64()?, None),
        _ => return None,
    };
    Some(FsChange::Extent {
        fs,
        ino,
        offset,
        extent,
    })
}

fn decode_xattr(reader: &mut ByteReader<'_>) -> Option<FsChange> {
    let fs = reader.u32()?;
    let ino = reader.u64()?;
    let name = take_bytes(reader)?;
    let value = match reader.take(1)?[0] {
        1 => Some(take_bytes(reader)?),
        0 => None,
        _ => return None,
    };
    Some(FsChange::Xattr {
        fs,
        ino,
        name,
        value,
    })
}

fn decode_piece(reader: &mut ByteReader<'_>) -> Option<FsChange> {
    let fingerprint = Fingerprint(reader.take(FINGERPRINT_BYTES)?.try_into().ok()?);
    let value = match reader.take(1)?[0] {
        1 => Some(reader.u64()?),
        0 => None,
        _ => return None,
    };
    Some(FsChange::Piece { fingerprint, value })
}
