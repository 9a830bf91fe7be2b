//! Inodes: attributes, the extent map of a file, the entries of a directory, xattrs, and the
//! I/O monitor's record (paper 3, Table 3), with their binary encoding (shared by journal
//! records and checkpoints).
//!
//! An *extent* maps a byte range of a file to a byte range of one stored chunk. Ranges of a
//! file without an extent are holes and read as zeros. Every extent holds one reference to its
//! chunk, so an extent split in two (a write into the middle of a deduplicated chunk: the
//! paper's map replication) takes one more reference and the shared chunk itself never
//! changes.

use std::collections::BTreeMap;

use onecopy_core::bytes::ByteReader;
use onecopy_core::chunk_store::ChunkId;
use serde::{Deserialize, Serialize};

/// Inode number within one file system; 1 is the root directory. Never reused.
pub type Ino = u64;
/// The root directory's inode.
pub const ROOT: Ino = 1;

/// What an inode is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    File,
    Directory,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

impl Kind {
    fn code(self) -> u8 {
        self as u8
    }

    fn from_code(code: u8) -> Option<Kind> {
        Some(match code {
            0 => Kind::File,
            1 => Kind::Directory,
            2 => Kind::Symlink,
            3 => Kind::Fifo,
            4 => Kind::Socket,
            5 => Kind::CharDevice,
            6 => Kind::BlockDevice,
            _ => return None,
        })
    }

    /// The kind of a `mknod` mode's file-type bits.
    pub fn from_mode(mode: u32) -> Option<Kind> {
        Some(match mode & libc::S_IFMT {
            libc::S_IFREG | 0 => Kind::File,
            libc::S_IFDIR => Kind::Directory,
            libc::S_IFLNK => Kind::Symlink,
            libc::S_IFIFO => Kind::Fifo,
            libc::S_IFSOCK => Kind::Socket,
            libc::S_IFCHR => Kind::CharDevice,
            libc::S_IFBLK => Kind::BlockDevice,
            _ => return None,
        })
    }
}

/// The rank of a file (paper 3, Table 1).
pub type Rank = u8;

/// How a file's data is chunked now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Chunking {
    /// Written plainly, not deduplicated (rank 0).
    Plain,
    /// Deduplicated with big chunks (rank 1).
    Big,
    /// Deduplicated with small chunks (ranks 2 and 3).
    Small,
}

impl Chunking {
    fn from_code(code: u8) -> Option<Chunking> {
        Some(match code {
            0 => Chunking::Plain,
            1 => Chunking::Big,
            2 => Chunking::Small,
            _ => return None,
        })
    }
}

/// POSIX attributes. Times are nanoseconds since the epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attributes {
    pub kind: Kind,
    /// Permission bits with setuid, setgid and sticky (no file-type bits).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    pub rdev: u32,
    pub atime_ns: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub birth_ns: i64,
}

/// The I/O monitor's record of a file (paper 3, Table 3) and its place in the rank queues.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Monitor {
    /// Last read or write, nanoseconds since the epoch.
    pub access_ns: i64,
    /// Last write (data or size).
    pub modify_ns: i64,
    /// Reads that started where the previous read of the file ended.
    pub sequential_reads: u64,
    /// Other reads.
    pub random_reads: u64,
    pub rank: Rank,
    pub chunking: Option<Chunking>,
    /// Position in its rank queue: a larger stamp is more recently used.
    pub stamp: u64,
}

/// The chunk of an extent whose bytes a repair recorded as lost: reads of it fail (EIO,
/// naming the file and range) until the range is written again, punched or truncated away.
/// It holds no reference.
pub const LOST_CHUNK: ChunkId = u64::MAX;

/// One mapped byte range of a file; see the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub chunk: ChunkId,
    /// Where the range starts within the chunk.
    pub chunk_offset: u32,
    pub length: u32,
    /// The chunk was written plainly (not fingerprinted): it awaits deduplication.
    pub plain: bool,
}

impl Extent {
    /// A lost range of `length` bytes ([`LOST_CHUNK`]).
    pub fn lost(length: u32) -> Extent {
        assert!(length > 0, "extents are never empty");
        Extent {
            chunk: LOST_CHUNK,
            chunk_offset: 0,
            length,
            plain: false,
        }
    }

    /// True when a repair recorded this range's bytes as lost.
    pub fn is_lost(&self) -> bool {
        self.chunk == LOST_CHUNK
    }

    /// The part of this extent (which starts at file offset `start`) within `[from, to)`, as
    /// its new start and extent. Neither end may fall outside the extent.
    pub fn slice(&self, start: u64, from: u64, to: u64) -> (u64, Extent) {
        let end = start + self.length as u64;
        assert!(
            start <= from && from < to && to <= end,
            "slice within the extent"
        );
        let skip = (from - start) as u32;
        (
            from,
            Extent {
                chunk: self.chunk,
                chunk_offset: self.chunk_offset + skip,
                length: (to - from) as u32,
                plain: self.plain,
            },
        )
    }
}

/// One inode in memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inode {
    pub attributes: Attributes,
    pub monitor: Monitor,
    /// Symbolic link target.
    pub target: Vec<u8>,
    /// File data: file offset -> extent, non-overlapping.
    pub extents: BTreeMap<u64, Extent>,
    /// Directory entries: name -> inode.
    pub entries: BTreeMap<Vec<u8>, Ino>,
    /// The parent of a directory (itself for the root).
    pub parent: Ino,
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl Inode {
    /// A new inode with no data, entries or xattrs.
    pub fn new(attributes: Attributes, parent: Ino) -> Inode {
        Inode {
            attributes,
            monitor: Monitor {
                access_ns: attributes.mtime_ns,
                modify_ns: attributes.mtime_ns,
                chunking: (attributes.kind == Kind::File).then_some(Chunking::Plain),
                ..Monitor::default()
            },
            target: Vec::new(),
            extents: BTreeMap::new(),
            entries: BTreeMap::new(),
            parent,
            xattrs: BTreeMap::new(),
        }
    }

    /// Bytes of data mapped (holes excluded).
    pub fn mapped_bytes(&self) -> u64 {
        self.extents
            .values()
            .map(|extent| extent.length as u64)
            .sum()
    }

    /// Bytes of data written plainly and awaiting deduplication.
    pub fn plain_bytes(&self) -> u64 {
        self.extents
            .values()
            .filter(|extent| extent.plain)
            .map(|extent| extent.length as u64)
            .sum()
    }
}

/// Encoding helpers, little-endian.
pub(crate) fn put_u32(out: &mut Vec<u8>, value: u32) {
    out.extend_from_slice(&value.to_le_bytes());
}

pub(crate) fn put_u64(out: &mut Vec<u8>, value: u64) {
    out.extend_from_slice(&value.to_le_bytes());
}

pub(crate) fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_u32(out, bytes.len() as u32);
    out.extend_from_slice(bytes);
}

pub(crate) fn take_bytes(reader: &mut ByteReader<'_>) -> Option<Vec<u8>> {
    let length = reader.u32()? as usize;
    Some(reader.take(length)?.to_vec())
}

pub(crate) fn take_i64(reader: &mut ByteReader<'_>) -> Option<i64> {
    reader.u64().map(|value| value as i64)
}

/// Encodes attributes, monitor and symlink target (everything but the maps).
pub(crate) fn put_inode_head(out: &mut Vec<u8>, inode: &Inode) {
    let a = &inode.attributes;
    out.push(a.kind.code());
    for value in [a.mode, a.uid, a.gid, a.nlink, a.rdev] {
        put_u32(out, value);
    }
    put_u64(out, a.size);
    for value in [a.atime_ns, a.mtime_ns, a.ctime_ns, a.birth_ns] {
        put_u64(out, value as u64);
    }
    let m = &inode.monitor;
    put_u64(out, m.access_ns as u64);
    put_u64(out, m.modify_ns as u64);
    put_u64(out, m.sequential_reads);
    put_u64(out, m.random_reads);
    out.push(m.rank);
    out.push(m.chunking.map_or(255, |chunking| chunking as u8));
    put_u64(out, m.stamp);
    put_u64(out, inode.parent);
    put_bytes(out, &inode.target);
}

/// Decodes what [`put_inode_head`] wrote, as an inode with empty maps.
pub(crate) fn take_inode_head(reader: &mut ByteReader<'_>) -> Option<Inode> {
    let kind = Kind::from_code(reader.take(1)?[0])?;
    let attributes = Attributes {
        kind,
        mode: reader.u32()?,
        uid: reader.u32()?,
        gid: reader.u32()?,
        nlink: reader.u32()?,
        rdev: reader.u32()?,
        size: reader.u64()?,
        atime_ns: take_i64(reader)?,
        mtime_ns: take_i64(reader)?,
        ctime_ns: take_i64(reader)?,
        birth_ns: take_i64(reader)?,
    };
    let monitor = Monitor {
        access_ns: take_i64(reader)?,
        modify_ns: take_i64(reader)?,
        sequential_reads: reader.u64()?,
        random_reads: reader.u64()?,
        rank: reader.take(1)?[0],
        chunking: match reader.take(1)?[0] {
            255 => None,
            code => Some(Chunking::from_code(code)?),
        },
        stamp: reader.u64()?,
    };
    let parent = reader.u64()?;
    let target = take_bytes(reader)?;
    Some(Inode {
        attributes,
        monitor,
        target,
        extents: BTreeMap::new(),
        entries: BTreeMap::new(),
        parent,
        xattrs: BTreeMap::new(),
    })
}

pub(crate) fn put_extent(out: &mut Vec<u8>, offset: u64, extent: &Extent) {
    put_u64(out, offset);
    put_u64(out, extent.chunk);
    put_u32(out, extent.chunk_offset);
    put_u32(out, extent.length);
    out.push(extent.plain as u8);
}

pub(crate) fn take_extent(reader: &mut ByteReader<'_>) -> Option<(u64, Extent)> {
    let offset = reader.u64()?;
    let extent = Extent {
        chunk: reader.u64()?,
        chunk_offset: reader.u32()?,
        length: reader.u32()?,
        plain: reader.take(1)?[0] != 0,
    };
    Some((offset, extent))
}

/// Encodes a whole inode (for checkpoints).
pub(crate) fn put_inode(out: &mut Vec<u8>, inode: &Inode) {
    put_inode_head(out, inode);
    put_u64(out, inode.extents.len() as u64);
    for (offset, extent) in &inode.extents {
        put_extent(out, *offset, extent);
    }
    put_u64(out, inode.entries.len() as u64);
    for (name, child) in &inode.entries {
        put_bytes(out, name);
        put_u64(out, *child);
    }
    put_u64(out, inode.xattrs.len() as u64);
    for (name, value) in &inode.xattrs {
        put_bytes(out, name);
        put_bytes(out, value);
    }
}

/// Decodes what [`put_inode`] wrote.
pub(crate) fn take_inode(reader: &mut ByteReader<'_>) -> Option<Inode> {
    let mut inode = take_inode_head(reader)?;
    for _ in 0..reader.u64()? {
        let (offset, extent) = take_extent(reader)?;
        inode.extents.insert(offset, extent);
    }
    for _ in 0..reader.u64()? {
        let name = take_bytes(reader)?;
        inode.entries.insert(name, reader.u64()?);
    }
    for _ in 0..reader.u64()? {
        let name = take_bytes(reader)?;
        inode.xattrs.insert(name, take_bytes(reader)?);
    }
    Some(inode)
}

impl Inode {
    /// This inode without its maps (extents, entries, xattrs): what an `InodeSet` change
    /// carries.
    pub fn head(&self) -> Inode {
        Inode {
            attributes: self.attributes,
            monitor: self.monitor,
            target: self.target.clone(),
            extents: BTreeMap::new(),
            entries: BTreeMap::new(),
            parent: self.parent,
            xattrs: BTreeMap::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: an inode with every map filled encodes and decodes to itself. Method: round trip.
    #[test]
    fn inode_round_trip() {
        let attributes = Attributes {
            kind: Kind::File,
            mode: 0o4755,
            uid: 1000,
            gid: 100,
            nlink: 2,
            size: 12345,
            rdev: 0,
            atime_ns: -5,
            mtime_ns: 1_700_000_000_123_456_789,
            ctime_ns: 7,
            birth_ns: 8,
        };
        let mut inode = Inode::new(attributes, 9);
        inode.monitor.rank = 2;
        inode.monitor.chunking = Some(Chunking::Small);
        inode.target = b"\xff/target".to_vec();
        inode.extents.insert(
            4096,
            Extent {
                chunk: 77,
                chunk_offset: 12,
                length: 100,
                plain: true,
            },
        );
        inode.entries.insert(b"name\xfe".to_vec(), 3);
        inode.xattrs.insert(b"user.a".to_vec(), b"value".to_vec());
        let mut bytes = Vec::new();
        put_inode(&mut bytes, &inode);
        let mut reader = ByteReader::new(&bytes);
        assert_eq!(take_inode(&mut reader), Some(inode));
        assert!(reader.is_empty());
    }
}
