//! The published catalog: snapshots and deltas.
//!
//! Each commit publishes catalog generation N as one object, `FACE/catalog/<N>`, in one of two
//! forms:
//!
//! - a **snapshot**: the whole catalog file;
//! - a **delta**: what the command wrote to the catalog file (byte ranges, the shortest length
//!   it truncated the file to, its final length), to apply to generation N-1.
//!
//! Every delta names the snapshot its chain starts from, so a client that needs generation N
//! reads that snapshot and every delta after it, or, when its cache holds generation C of the
//! same chain, only the deltas after C. A commit publishes a snapshot when the chain's deltas
//! would outweigh its snapshot ([`prefer_snapshot`]), and then removes every older generation:
//! a client joining later downloads at most about twice the catalog, and a commit uploads what
//! the command changed, not the whole catalog.
//!
//! The catalog's bytes are sealed per block by the layer above (docs/DESIGN.md, "Encryption
//! at rest"); a delta carries sealed bytes only, so it reveals no more than a snapshot does.
//!
//! Object format, inside one zstd frame with its content checksum:
//!
//! ```text
//! magic "OCCATLOG" | kind u8 (0 snapshot, 1 delta) | generation u64
//! snapshot: length u64 | the file's bytes
//! delta:    snapshot generation u64 | truncated to u64 (u64::MAX: never truncated)
//!           | final length u64 | range count u32 | per range: offset u64, length u32, bytes
//! ```

use std::collections::BTreeMap;

use onecopy_core::bytes::{ByteReader, ByteWriter};
use onecopy_core::storage::StorageFile;
use onecopy_core::{Error as CoreError, Result as CoreResult};

const MAGIC: &[u8; 8] = b"OCCATLOG";
const KIND_SNAPSHOT: u8 = 0;
const KIND_DELTA: u8 = 1;
/// The zstd level of published catalogs: the fastest, since a commit waits for it.
const LEVEL: i32 = 1;
/// Bytes of one range at most: its length is a u32.
const RANGE_BYTES_MAX: u64 = 1 << 30;

/// One published generation of a catalog.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Published {
    Snapshot {
        generation: u64,
        bytes: Vec<u8>,
    },
    Delta {
        generation: u64,
        /// The snapshot the chain of this delta starts from.
        snapshot: u64,
        changes: Delta,
    },
}

/// What one command did to the catalog file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Delta {
    /// The shortest length the file was truncated to, if it was.
    pub truncated_to: Option<u64>,
    /// The file's length at the end.
    pub length: u64,
    /// The written ranges' offsets and final contents, in offset order, disjoint.
    pub ranges: Vec<(u64, Vec<u8>)>,
}

impl Published {
    pub fn generation(&self) -> u64 {
        match self {
            Published::Snapshot { generation, .. } | Published::Delta { generation, .. } => {
                *generation
            }
        }
    }

    /// The generation of the snapshot this generation's chain starts from.
    pub fn snapshot(&self) -> u64 {
        match self {
            Published::Snapshot { generation, .. } => *generation,
            Published::Delta { snapshot, .. } => *snapshot,
        }
    }

    /// The object's bytes.
    pub fn encode(&self) -> CoreResult<Vec<u8>> {
        let mut writer = ByteWriter::default();
        writer.bytes(MAGIC);
        match self {
            Published::Snapshot { generation, bytes } => {
                writer.u8(KIND_SNAPSHOT);
                writer.u64(*generation);
                writer.u64(bytes.len() as u64);
                writer.bytes(bytes);
            }
            Published::Delta {
                generation,
                snapshot,
                changes,
            } => {
                assert!(snapshot < generation, "a delta follows its snapshot");
                writer.u8(KIND_DELTA);
                writer.u64(*generation);
                writer.u64(*snapshot);
                writer.u64(changes.truncated_to.unwrap_or(u64::MAX));
                writer.u64(changes.length);
                writer.u32(u32::try_from(changes.ranges.len()).expect("ranges fit a u32"));
                for (offset, data) in &changes.ranges {
                    writer.u64(*offset);
                    writer.u32(u32::try_from(data.len()).expect("a range fits a u32"));
                    writer.bytes(data);
                }
            }
        }
        compress(writer.as_slice())
    }

    /// Decodes object `what`; `Err` says what is wrong with it.
    pub fn decode(what: &str, object: &[u8]) -> CoreResult<Published> {
        let corrupt = |detail: String| CoreError::Corrupt {
            what: what.to_string(),
            detail,
        };
        let plain = zstd::stream::decode_all(object)
            .map_err(|error| corrupt(format!("not a valid catalog frame: {error}")))?;
        let short = || corrupt("the catalog object ends early".to_string());
        let mut reader = ByteReader::new(&plain);
        if reader.take(MAGIC.len()) != Some(MAGIC.as_slice()) {
            return Err(corrupt("not a published catalog (wrong magic)".to_string()));
        }
        let kind = reader.u8().ok_or_else(short)?;
        let generation = reader.u64().ok_or_else(short)?;
        let published = match kind {
            KIND_SNAPSHOT => {
                let length = reader.u64().ok_or_else(short)?;
                let bytes = reader
                    .take(usize::try_from(length).map_err(|_| short())?)
                    .ok_or_else(short)?
                    .to_vec();
                Published::Snapshot { generation, bytes }
            }
            KIND_DELTA => {
                let snapshot = reader.u64().ok_or_else(short)?;
                let truncated_to = Some(reader.u64().ok_or_else(short)?).filter(|&t| t != u64::MAX);
                let length = reader.u64().ok_or_else(short)?;
                let count = reader.u32().ok_or_else(short)?;
                let mut ranges = Vec::new();
                let mut end = 0;
                for _ in 0..count {
                    let offset = reader.u64().ok_or_else(short)?;
                    let size = reader.u32().ok_or_else(short)?;
                    let data = reader.take(size as usize).ok_or_else(short)?.to_vec();
                    if offset < end || offset + size as u64 > length {
                        return Err(corrupt(format!(
                            "range at {offset} of {size} bytes overlaps another or passes the \
                             final length {length}"
                        )));
                    }
                    end = offset + size as u64;
                    ranges.push((offset, data));
                }
                if snapshot >= generation {
                    return Err(corrupt(format!(
                        "delta of generation {generation} names snapshot {snapshot}"
                    )));
                }
                Published::Delta {
                    generation,
                    snapshot,
                    changes: Delta {
                        truncated_to,
                        length,
                        ranges,
                    },
                }
            }
            other => return Err(corrupt(format!("unknown kind {other}"))),
        };
        if !reader.is_empty() {
            return Err(corrupt(format!(
                "{} bytes after the end of the catalog object",
                reader.remaining()
            )));
        }
        Ok(published)
    }
}

impl Delta {
    /// Applies the command's changes to `file`, which holds the generation before.
    pub fn apply(&self, file: &dyn StorageFile) -> CoreResult<()> {
        if let Some(truncated_to) = self.truncated_to {
            if truncated_to < file.len()? {
                file.set_len(truncated_to)?;
            }
        }
        for (offset, data) in &self.ranges {
            file.write_at(*offset, data)?;
        }
        file.set_len(self.length)
    }
}

/// Whether a commit publishes a snapshot instead of a delta of `delta_bytes`, when the chain
/// holds a snapshot of `snapshot_bytes` and deltas of `chain_bytes` (object sizes): once the
/// deltas would outweigh the snapshot, a snapshot replaces the chain, so that a client
/// joining reads at most about twice the catalog.
pub fn prefer_snapshot(snapshot_bytes: u64, chain_bytes: u64, delta_bytes: u64) -> bool {
    chain_bytes + delta_bytes > snapshot_bytes
}

/// What a command wrote to a published file since its session began (recorded by the
/// storage as the writes happen).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Written byte ranges, start to end: disjoint and not touching.
    written: BTreeMap<u64, u64>,
    /// The shortest length the file was truncated to.
    truncated_to: Option<u64>,
    /// The file was created, replaced or removed as a whole: only a snapshot describes it.
    pub replaced: bool,
}

impl Changes {
    /// Records a write of `length` bytes at `offset`.
    pub fn write(&mut self, offset: u64, length: u64) {
        if length == 0 {
            return;
        }
        let mut start = offset;
        let mut end = offset + length;
        // Merge every range that overlaps or touches [start, end).
        let touching: Vec<(u64, u64)> = self
            .written
            .range(..=end)
            .rev()
            .take_while(|&(_, &range_end)| range_end >= start)
            .map(|(&range_start, &range_end)| (range_start, range_end))
            .collect();
        for (range_start, range_end) in touching {
            self.written.remove(&range_start);
            start = start.min(range_start);
            end = end.max(range_end);
        }
        self.written.insert(start, end);
    }

    /// Records a change of the file's length to `length`: bytes past it are gone (a later
    /// extension reads zeros there).
    pub fn set_len(&mut self, length: u64) {
        self.truncated_to = Some(self.truncated_to.map_or(length, |t| t.min(length)));
        let cut: Vec<(u64, u64)> = self
            .written
            .range(..)
            .filter(|&(_, &end)| end > length)
            .map(|(&start, &end)| (start, end))
            .collect();
        for (start, _) in cut {
            let end = self.written.remove(&start).expect("listed above");
            debug_assert!(end > length);
            if start < length {
                self.written.insert(start, length);
            }
        }
    }

    /// Nothing was written, truncated or replaced.
    pub fn is_empty(&self) -> bool {
        self.written.is_empty() && self.truncated_to.is_none() && !self.replaced
    }

    /// The delta these changes made to `file` (read now, after the last write).
    pub fn delta(&self, file: &dyn StorageFile) -> CoreResult<Delta> {
        assert!(!self.replaced, "a replaced file has no delta");
        let length = file.len()?;
        let mut ranges = Vec::new();
        for (&start, &end) in &self.written {
            let end = end.min(length);
            let mut offset = start;
            while offset < end {
                let size = (end - offset).min(RANGE_BYTES_MAX);
                let mut data = vec![0; size as usize];
                file.read_at(offset, &mut data)?;
                ranges.push((offset, data));
                offset += size;
            }
        }
        Ok(Delta {
            truncated_to: self.truncated_to,
            length,
            ranges,
        })
    }
}

fn compress(plain: &[u8]) -> CoreResult<Vec<u8>> {
    use std::io::Write;
    let io = |error| CoreError::io("compressing the catalog for publishing", error);
    let mut encoder = zstd::stream::Encoder::new(Vec::new(), LEVEL).map_err(io)?;
    encoder.include_checksum(true).map_err(io)?;
    encoder.write_all(plain).map_err(io)?;
    encoder.finish().map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use onecopy_core::storage::{SimulatedStorage, Storage};

    /// A deterministic byte source.
    struct Random(u64);
    impl Random {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    /// Goal: a delta made from recorded changes turns a copy of the file as it was into the
    /// file as it is, whatever the writes and truncations. Method: random writes, shrinks and
    /// extensions on one file with the changes recorded; the delta, encoded and decoded,
    /// applied to a copy of the starting file; both files compared, many rounds.
    #[test]
    fn deltas_reproduce_random_changes() {
        let storage = SimulatedStorage::new();
        let mut random = Random(0x9e37_79b9_7f4a_7c15);
        for round in 0..200 {
            let file = storage.open(&format!("f{round}"), true).unwrap();
            let copy = storage.open(&format!("c{round}"), true).unwrap();
            let start_length = random.next() % 20_000;
            let start: Vec<u8> = (0..start_length).map(|_| random.next() as u8).collect();
            file.write_at(0, &start).unwrap();
            copy.write_at(0, &start).unwrap();
            let mut changes = Changes::default();
            for _ in 0..random.next() % 12 {
                if random.next().is_multiple_of(4) {
                    let length = random.next() % 24_000;
                    file.set_len(length).unwrap();
                    changes.set_len(length);
                } else {
                    let offset = random.next() % 24_000;
                    let data: Vec<u8> = (0..random.next() % 5000)
                        .map(|_| random.next() as u8)
                        .collect();
                    file.write_at(offset, &data).unwrap();
                    changes.write(offset, data.len() as u64);
                }
            }
            let published = Published::Delta {
                generation: 2,
                snapshot: 1,
                changes: changes.delta(file.as_ref()).unwrap(),
            };
            let decoded = Published::decode("test", &published.encode().unwrap()).unwrap();
            assert_eq!(decoded, published);
            let Published::Delta { changes: delta, .. } = decoded else {
                unreachable!()
            };
            delta.apply(copy.as_ref()).unwrap();
            let read = |file: &dyn StorageFile| {
                let mut bytes = vec![0; file.len().unwrap() as usize];
                file.read_at(0, &mut bytes).unwrap();
                bytes
            };
            assert_eq!(read(copy.as_ref()), read(file.as_ref()), "round {round}");
        }
    }

    /// Goal: written ranges merge when they overlap or touch and stay apart otherwise.
    /// Method: writes in a chosen order, then the recorded ranges.
    #[test]
    fn ranges_merge_when_they_touch() {
        let mut changes = Changes::default();
        changes.write(100, 10);
        changes.write(200, 10);
        changes.write(110, 5);
        changes.write(50, 60);
        assert_eq!(
            changes
                .written
                .iter()
                .map(|(&s, &e)| (s, e))
                .collect::<Vec<_>>(),
            vec![(50, 115), (200, 210)]
        );
        changes.write(0, 1000);
        assert_eq!(changes.written.len(), 1);
        changes.set_len(500);
        assert_eq!(changes.written.get(&0), Some(&500));
        assert_eq!(changes.truncated_to, Some(500));
    }

    /// Goal: a damaged or misplaced object is refused with the object's name, never applied.
    /// Method: a flipped byte in the frame, a wrong magic, and ranges past the final length.
    #[test]
    fn damaged_objects_are_refused() {
        let published = Published::Snapshot {
            generation: 3,
            bytes: vec![7; 5000],
        };
        let mut object = published.encode().unwrap();
        let middle = object.len() / 2;
        object[middle] ^= 1;
        let error = Published::decode("backup/catalog/3", &object).unwrap_err();
        assert!(error.to_string().contains("backup/catalog/3"), "{error}");
        let error = Published::decode("x", &compress(b"NOTACATALOG").unwrap()).unwrap_err();
        assert!(error.to_string().contains("magic"), "{error}");
        let past = Published::Delta {
            generation: 2,
            snapshot: 1,
            changes: Delta {
                truncated_to: None,
                length: 10,
                ranges: vec![(8, vec![1; 4])],
            },
        };
        let error = Published::decode("x", &past.encode().unwrap()).unwrap_err();
        assert!(
            error.to_string().contains("passes the final length"),
            "{error}"
        );
    }
}
