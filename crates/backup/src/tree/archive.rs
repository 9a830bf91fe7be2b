//! A directory backup as a POSIX pax tar archive (`backup restore SERIES -`), for `tar x`.
//!
//! Entries follow the tree's order (a directory before what it holds, so `tar x` creates
//! them in order), the backed-up directory itself first as `./`. Each entry is a ustar header
//! preceded by a pax extended header (`x`) with what ustar cannot hold exactly:
//!
//! - `mtime` and `atime` with nanoseconds, for every entry;
//! - `path` and `linkpath` for names longer than the ustar fields allow. Names are written as
//!   the bytes the backup stores, UTF-8 or not, which GNU tar takes as they are (it does not
//!   know the `hdrcharset=BINARY` record that would say so, and warns about it);
//! - `uid` and `gid` above the ustar limit (2097151); no user or group names, as the backup
//!   keeps numeric owners only (`tar x` as root then sets the numeric owner);
//! - `SCHILY.xattr.NAME` for each extended attribute, as GNU tar writes and reads them
//!   (extracted with `tar x --xattrs`).
//!
//! A regular file with holes is written in GNU's pax sparse format 1.0 (`GNU.sparse.*`
//! records and a map of its data extents before the data), which GNU tar extracts with the
//! holes kept; other readers extract the map and data as a file named `GNUSparseFile.0/NAME`.
//! A hard link is a link entry to its file's path; FIFOs and devices are their own entry
//! types.
//!
//! The archive is written as the content stream arrives, in order and without seeking: each
//! file's headers, then its bytes. The end-of-archive blocks are written only by
//! [`ArchiveWriter::finish`], so an archive cut short by a failed restore ends in the middle
//! of an entry and `tar` reports it, rather than extracting a partial tree silently.

use std::io::{self, Write};

use tar::{EntryType, Header};

use super::{EntryKind, Extent, Tree, TreeEntry};

/// Size of a tar block; headers and data are padded to it.
const BLOCK_BYTES: usize = 512;
/// Largest owner id a ustar header holds (7 octal digits).
const USTAR_ID_MAX: u32 = 0o7777777;
/// Largest time a ustar header holds (11 octal digits).
const USTAR_TIME_MAX: i64 = 0o77777777777;
/// Lengths of the ustar name, prefix and link name fields.
const USTAR_NAME_BYTES: usize = 100;
const USTAR_PREFIX_BYTES: usize = 155;

static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

/// Writes a tree and its content stream as a pax archive; see the module documentation.
pub struct ArchiveWriter<W: Write> {
    out: W,
    tree: Tree,
    /// Index of the next entry whose headers are not written yet.
    next_entry: usize,
    /// The file whose data is being written.
    current: Option<FileData>,
    bytes_written: u64,
}

/// Progress through the data of one regular file.
struct FileData {
    stream_start: u64,
    extents: Vec<Extent>,
    size: u64,
    /// Written as GNU sparse 1.0 (only the extents) rather than whole (holes as zeros).
    sparse: bool,
    /// Stream bytes of the file received so far.
    received: u64,
    /// Whole files: file bytes written so far, holes included.
    file_position: u64,
    /// Bytes of the entry's data area written so far (for the final padding).
    data_written: u64,
}

impl FileData {
    fn stream_bytes(&self) -> u64 {
        self.extents.iter().map(|extent| extent.length).sum()
    }
}

/// A pax extended header's records, each `LENGTH KEY=VALUE\n` with LENGTH counting itself.
fn pax_records(records: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (key, value) in records {
        let rest = key.len() + value.len() + 3; // space, '=' and newline
        let mut digits = 1;
        while (rest + digits).to_string().len() > digits {
            digits += 1;
        }
        out.extend_from_slice((rest + digits).to_string().as_bytes());
        out.push(b' ');
        out.extend_from_slice(key);
        out.push(b'=');
        out.extend_from_slice(value);
        out.push(b'\n');
    }
    out
}

/// A time as pax writes it: seconds, a point and nine digits of nanoseconds (for a time
/// before 1970, the negative decimal value: -1.5 is half a second before -1).
fn pax_time((seconds, nanoseconds): (i64, u32)) -> Vec<u8> {
    let nanoseconds = nanoseconds.min(999_999_999);
    if seconds >= 0 || nanoseconds == 0 {
        format!("{seconds}.{nanoseconds:09}").into_bytes()
    } else {
        format!("-{}.{:09}", -(seconds + 1), 1_000_000_000 - nanoseconds).into_bytes()
    }
}

/// Puts `name` in the ustar name and prefix fields if it fits, returning whether it did.
fn set_ustar_name(header: &mut Header, name: &[u8]) -> bool {
    let ustar = header.as_ustar_mut().expect("a ustar header");
    if name.len() <= USTAR_NAME_BYTES {
        ustar.name[..name.len()].copy_from_slice(name);
        return true;
    }
    // Split at a slash: the prefix before it, the name after it (not empty).
    let split = name
        .iter()
        .enumerate()
        .filter(|&(index, &byte)| {
            byte == b'/'
                && index <= USTAR_PREFIX_BYTES
                && name.len() - index - 1 <= USTAR_NAME_BYTES
                && index + 1 < name.len()
        })
        .map(|(index, _)| index)
        .next();
    let Some(split) = split else {
        return false;
    };
    ustar.prefix[..split].copy_from_slice(&name[..split]);
    ustar.name[..name.len() - split - 1].copy_from_slice(&name[split + 1..]);
    true
}

/// Puts the first bytes of `name` in the ustar name field, for a header whose real name is
/// in a pax record (readers that ignore pax still get something recognisable).
fn set_truncated_name(header: &mut Header, name: &[u8]) {
    let ustar = header.as_ustar_mut().expect("a ustar header");
    let length = name.len().min(USTAR_NAME_BYTES);
    ustar.name[..length].copy_from_slice(&name[..length]);
}

/// The last component of a path (the path itself at the top).
fn file_name(path: &[u8]) -> &[u8] {
    path.rsplit(|&byte| byte == b'/').next().unwrap_or(path)
}

/// The extents of a file and whether it has holes (then it is written sparse).
fn file_layout(entry: &TreeEntry) -> Option<(u64, u64, Vec<Extent>, bool)> {
    match &entry.kind {
        EntryKind::File {
            size,
            stream_offset,
            extents,
        } => {
            let data: u64 = extents.iter().map(|extent| extent.length).sum();
            Some((*size, *stream_offset, extents.clone(), data < *size))
        }
        _ => None,
    }
}

/// The sparse map of GNU's format 1.0: the number of regions, then each region's offset and
/// length, one decimal number per line, padded with zeros to a whole block. A file that ends
/// in a hole ends with an empty region at its size, so `tar x` sets the size.
fn sparse_map(size: u64, extents: &[Extent]) -> Vec<u8> {
    let mut regions: Vec<(u64, u64)> = extents
        .iter()
        .map(|extent| (extent.offset, extent.length))
        .collect();
    if extents
        .last()
        .is_none_or(|last| last.offset + last.length < size)
    {
        regions.push((size, 0));
    }
    let mut map = format!("{}\n", regions.len());
    for (offset, length) in regions {
        map.push_str(&format!("{offset}\n{length}\n"));
    }
    let mut map = map.into_bytes();
    map.resize(map.len().div_ceil(BLOCK_BYTES) * BLOCK_BYTES, 0);
    map
}

impl<W: Write> ArchiveWriter<W> {
    /// An archive of `tree` (validated by the caller: [`Tree::validate`]) written to `out`.
    pub fn new(out: W, tree: Tree) -> Self {
        assert!(
            tree.entries
                .first()
                .is_some_and(|root| root.path.is_empty()),
            "a validated tree starts with its root"
        );
        ArchiveWriter {
            out,
            tree,
            next_entry: 0,
            current: None,
            bytes_written: 0,
        }
    }

    fn emit(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)?;
        self.bytes_written += bytes.len() as u64;
        Ok(())
    }

    fn emit_zeros(&mut self, mut count: u64) -> io::Result<()> {
        while count > 0 {
            let piece = count.min(ZEROS.len() as u64) as usize;
            self.emit(&ZEROS[..piece])?;
            count -= piece as u64;
        }
        Ok(())
    }

    /// Zeros up to the next block boundary after `data_bytes` of data.
    fn emit_padding(&mut self, data_bytes: u64) -> io::Result<()> {
        let block = BLOCK_BYTES as u64;
        self.emit_zeros(data_bytes.div_ceil(block) * block - data_bytes)
    }

    /// Writes entry `index`'s headers; for a regular file returns what its data needs.
    fn emit_headers(&mut self, index: usize) -> io::Result<Option<FileData>> {
        let entry = &self.tree.entries[index];
        let mut name = if entry.path.is_empty() {
            b"./".to_vec()
        } else {
            entry.path.clone()
        };
        if entry.kind == EntryKind::Directory && !entry.path.is_empty() {
            name.push(b'/');
        }
        let mut records: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let mut header = Header::new_ustar();
        let mut file = None;
        let mut link: Option<&[u8]> = None;
        let (entry_type, data_bytes) = match &entry.kind {
            EntryKind::Directory => (EntryType::Directory, 0),
            EntryKind::File { .. } => {
                let (size, stream_start, extents, sparse) =
                    file_layout(entry).expect("a regular file");
                let data_bytes = if sparse {
                    let stream_bytes: u64 = extents.iter().map(|extent| extent.length).sum();
                    sparse_map(size, &extents).len() as u64 + stream_bytes
                } else {
                    size
                };
                file = Some(FileData {
                    stream_start,
                    extents,
                    size,
                    sparse,
                    received: 0,
                    file_position: 0,
                    data_written: 0,
                });
                (EntryType::Regular, data_bytes)
            }
            EntryKind::Symlink { target } => {
                link = Some(target);
                (EntryType::Symlink, 0)
            }
            EntryKind::HardLink { target } => {
                link = Some(&self.tree.entries[*target as usize].path);
                (EntryType::Link, 0)
            }
            EntryKind::Fifo => (EntryType::Fifo, 0),
            EntryKind::CharDevice { .. } => (EntryType::Char, 0),
            EntryKind::BlockDevice { .. } => (EntryType::Block, 0),
        };
        if file.as_ref().is_some_and(|file| file.sparse) {
            // GNU.sparse.name carries the name; the ustar name marks the entry for readers
            // that do not know the format.
            records.push((b"GNU.sparse.major".to_vec(), b"1".to_vec()));
            records.push((b"GNU.sparse.minor".to_vec(), b"0".to_vec()));
            records.push((b"GNU.sparse.name".to_vec(), name.clone()));
            let size = file.as_ref().expect("a file").size;
            records.push((
                b"GNU.sparse.realsize".to_vec(),
                size.to_string().into_bytes(),
            ));
            let mut marker = b"GNUSparseFile.0/".to_vec();
            marker.extend_from_slice(file_name(&name));
            set_truncated_name(&mut header, &marker);
        } else if !set_ustar_name(&mut header, &name) {
            records.push((b"path".to_vec(), name.clone()));
            set_truncated_name(&mut header, &name);
        }
        if let Some(link) = link {
            let ustar = header.as_ustar_mut().expect("a ustar header");
            if link.len() <= ustar.linkname.len() {
                ustar.linkname[..link.len()].copy_from_slice(link);
            } else {
                records.push((b"linkpath".to_vec(), link.to_vec()));
            }
        }
        header.set_mode(entry.mode & 0o7777);
        header.set_uid(u64::from(entry.uid.min(USTAR_ID_MAX)));
        header.set_gid(u64::from(entry.gid.min(USTAR_ID_MAX)));
        if entry.uid > USTAR_ID_MAX {
            records.push((b"uid".to_vec(), entry.uid.to_string().into_bytes()));
        }
        if entry.gid > USTAR_ID_MAX {
            records.push((b"gid".to_vec(), entry.gid.to_string().into_bytes()));
        }
        header.set_mtime(entry.mtime.0.clamp(0, USTAR_TIME_MAX) as u64);
        records.push((b"mtime".to_vec(), pax_time(entry.mtime)));
        records.push((b"atime".to_vec(), pax_time(entry.atime)));
        for (attribute, value) in &entry.xattrs {
            let mut key = b"SCHILY.xattr.".to_vec();
            key.extend_from_slice(attribute);
            records.push((key, value.clone()));
        }
        if let EntryKind::CharDevice { rdev } | EntryKind::BlockDevice { rdev } = entry.kind {
            let rdev = rdev as libc::dev_t;
            header.set_device_major(libc::major(rdev))?;
            header.set_device_minor(libc::minor(rdev))?;
        }
        header.set_entry_type(entry_type);
        header.set_size(data_bytes);
        header.set_cksum();

        let pax = pax_records(&records);
        let mut pax_header = Header::new_ustar();
        let mut pax_name = b"PaxHeaders/".to_vec();
        pax_name.extend_from_slice(file_name(&name));
        set_truncated_name(&mut pax_header, &pax_name);
        pax_header.set_mode(0o644);
        pax_header.set_mtime(entry.mtime.0.clamp(0, USTAR_TIME_MAX) as u64);
        pax_header.set_entry_type(EntryType::XHeader);
        pax_header.set_size(pax.len() as u64);
        pax_header.set_cksum();
        self.emit(pax_header.as_bytes())?;
        self.emit(&pax)?;
        self.emit_padding(pax.len() as u64)?;
        self.emit(header.as_bytes())?;
        if let Some(file) = &mut file {
            if file.sparse {
                let map = sparse_map(file.size, &file.extents);
                file.data_written = map.len() as u64;
                self.emit(&map)?;
            }
        }
        Ok(file)
    }

    /// Writes the entries before the next file with stream bytes, and that file's headers;
    /// false when no such file is left.
    fn start_next_file(&mut self) -> io::Result<bool> {
        while self.next_entry < self.tree.entries.len() {
            let index = self.next_entry;
            self.next_entry += 1;
            if let Some(file) = self.emit_headers(index)? {
                if file.stream_bytes() > 0 {
                    self.current = Some(file);
                    return Ok(true);
                }
                self.current = Some(file);
                self.end_file()?;
            }
        }
        Ok(false)
    }

    /// Ends the current file: the rest of a whole file's size as zeros, then padding.
    fn end_file(&mut self) -> io::Result<()> {
        let mut file = self.current.take().expect("a file is open");
        assert_eq!(
            file.received,
            file.stream_bytes(),
            "all of the file's bytes arrived"
        );
        if !file.sparse {
            let rest = file.size - file.file_position;
            self.emit_zeros(rest)?;
            file.data_written += rest;
        }
        self.emit_padding(file.data_written)
    }

    /// Writes `data`, the content stream from `stream_offset` (in order, without gaps).
    pub fn write(&mut self, mut stream_offset: u64, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            if self.current.is_none() && !self.start_next_file()? {
                return Ok(()); // Bytes after the last file belong to no file.
            }
            let file = self.current.as_ref().expect("started above");
            let position = file.stream_start + file.received;
            if stream_offset < position {
                // Bytes of no file (an earlier reading of a file that changed).
                let skip = (position - stream_offset).min(data.len() as u64);
                stream_offset += skip;
                data = &data[skip as usize..];
                continue;
            }
            assert_eq!(stream_offset, position, "the stream arrives in order");
            let mut within = file.received;
            let extent = *file
                .extents
                .iter()
                .find(|extent| {
                    if within < extent.length {
                        true
                    } else {
                        within -= extent.length;
                        false
                    }
                })
                .expect("the file has bytes left");
            let count = ((extent.length - within) as usize).min(data.len());
            let (sparse, file_position) = (file.sparse, file.file_position);
            let mut written = count as u64;
            if !sparse {
                let hole = extent.offset + within - file_position;
                self.emit_zeros(hole)?;
                written += hole;
            }
            self.emit(&data[..count])?;
            let file = self.current.as_mut().expect("started above");
            file.received += count as u64;
            file.data_written += written;
            file.file_position = extent.offset + within + count as u64;
            stream_offset += count as u64;
            data = &data[count..];
            if file.received == file.stream_bytes() {
                self.end_file()?;
            }
        }
        Ok(())
    }

    /// Writes the entries after the last file's data and the end of the archive; returns
    /// the archive's size in bytes.
    pub fn finish(mut self) -> io::Result<u64> {
        if self.current.is_some() {
            return Err(io::Error::other(
                "the backup's stream ended inside a file's contents",
            ));
        }
        if self.start_next_file()? {
            return Err(io::Error::other(
                "the backup's stream ended before a file's contents",
            ));
        }
        self.emit_zeros(2 * BLOCK_BYTES as u64)?;
        self.out.flush()?;
        Ok(self.bytes_written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: pax record lengths count themselves, across a change in their number of
    /// digits. Method: records whose lengths are 9, 10, 99 and 100 bytes.
    #[test]
    fn pax_record_lengths_count_themselves() {
        for value_bytes in [1usize, 2, 90, 91, 92, 93] {
            let records = pax_records(&[(b"k".to_vec(), vec![b'v'; value_bytes])]);
            let (length, _) = records.split_at(records.iter().position(|&b| b == b' ').unwrap());
            let length: usize = std::str::from_utf8(length).unwrap().parse().unwrap();
            assert_eq!(length, records.len(), "value of {value_bytes} bytes");
        }
    }

    /// Goal: times before 1970 with nanoseconds are written as their negative decimal value.
    #[test]
    fn pax_times() {
        assert_eq!(pax_time((5, 7)), b"5.000000007");
        assert_eq!(pax_time((-5, 0)), b"-5.000000000");
        assert_eq!(pax_time((-5, 250_000_000)), b"-4.750000000");
    }
}
