//! What a check of the backup store found, in the shape a repair acts on: the findings with
//! their problems, the verdicts on containers, the reference counts the recipes hold, and the
//! verification of one stored chunk. [`crate::check`] produces it and [`crate::repair`] consumes
//! it; this module imports neither.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use onecopy_core::check::{FaceReport, Finding};
use onecopy_core::container::{
    codec, ChunkHeader, ChunkLocation, ContainerId, ContainerStore, CHUNK_HEADER_BYTES,
};
use onecopy_core::fingerprint::{Fingerprint, Fingerprinter};
use onecopy_core::Error as CoreError;

use crate::frames::{frame_fingerprint, whole_frame};
use crate::segment::{SegmentContainer, SegmentId, SegmentRecord};
use crate::series::BackupId;

/// The face's name in reports.
pub const FACE: &str = "backup";

/// What a repair does about a finding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Problem {
    /// A container file no record names: removed.
    LeftoverContainer(ContainerId),
    /// A temporary file of an interrupted command: removed.
    LeftoverFile(String),
    /// The segment index: rebuilt from the catalog.
    Index,
    /// Reference counts, segment heads or container records: rebuilt from primary records.
    DerivedCatalog,
    /// A backup record its series does not list: listed again.
    UnlistedBackup(BackupId),
    /// A series record that does not decode: rebuilt from its backups' records.
    DamagedSeries(String),
    /// A damaged container (missing, structure or chunk bytes): rewritten from what is
    /// intact, damaged chunks taken from intact copies elsewhere or marked lost.
    Container(ContainerId),
    /// Damaged primary records nothing can rebuild: recorded as a loss.
    Unrepairable,
    /// Damage to the catalog's header that did not stop it from opening (a commit slot of
    /// the commit before, bytes redb leaves zero): the next commit rewrites the header.
    CatalogHeader,
    /// A loss an earlier repair recorded: nothing to do.
    Recorded,
}

/// A frame a segment record places in a container, with the stored chunks it holds.
#[derive(Clone, Debug)]
pub(crate) struct PlacedFrame {
    pub segment: SegmentId,
    pub location: ChunkLocation,
    /// The fingerprint its record header carries, when every byte of the frame is a stored
    /// chunk's (the fingerprints of chunks removed since it was written are not recorded).
    pub fingerprint: Option<Fingerprint>,
    /// Its stored chunks: (index, fingerprint, offset in the frame, raw bytes).
    pub chunks: Vec<(u32, Fingerprint, u32, u32)>,
}

impl PlacedFrame {
    /// The frames of `record` (segment `segment`) that hold stored chunks.
    pub fn of_segment(
        segment: SegmentId,
        record: &SegmentRecord,
        fingerprinter: &Fingerprinter,
    ) -> Vec<PlacedFrame> {
        record
            .frame_chunks()
            .into_iter()
            .enumerate()
            .filter(|(_, chunks)| !chunks.is_empty())
            .map(|(number, chunks)| PlacedFrame {
                segment,
                location: record.frames[number],
                fingerprint: whole_frame(record, number as u32).map(|whole| {
                    frame_fingerprint(
                        fingerprinter,
                        whole.iter().map(|(_, fingerprint)| fingerprint),
                    )
                }),
                chunks: chunks
                    .into_iter()
                    .map(|(index, place)| {
                        let chunk = &record.chunks[index as usize];
                        (index, chunk.fingerprint, place.within, chunk.raw_bytes)
                    })
                    .collect(),
            })
            .collect()
    }
}

/// What the check found wrong with one container.
#[derive(Clone, Debug, Default)]
pub(crate) struct ContainerVerdict {
    /// The file does not exist.
    pub missing: bool,
    /// Damage to the file's structure (size, header, trailer, record headers): the chunks
    /// may be intact, but the container must be rewritten.
    pub structure: Vec<String>,
    /// Chunks whose bytes are damaged (every stored chunk of a damaged frame), with the
    /// frame's offset and what is wrong.
    pub damaged: BTreeMap<(SegmentId, u32), (u32, String)>,
    /// The time stamp in the trailer, when it reads.
    pub trailer_timestamp: Option<u64>,
    pub chunks_verified: u64,
    pub bytes_verified: u64,
}

impl ContainerVerdict {
    pub fn is_damaged(&self) -> bool {
        self.missing || !self.structure.is_empty() || !self.damaged.is_empty()
    }
}

/// What a check found, with what a repair needs to act on it.
pub(crate) struct Inspection {
    pub findings: Vec<(Finding, Problem)>,
    pub checked: BTreeMap<String, u64>,
    /// Damaged containers, by id.
    pub containers: BTreeMap<ContainerId, ContainerVerdict>,
    /// Frames holding stored chunks, by container, from the segment records.
    pub placed: HashMap<ContainerId, Vec<PlacedFrame>>,
    /// The container records that decode.
    pub container_records: HashMap<ContainerId, SegmentContainer>,
    /// False when some recipe could not be read: counts from the recipes are then lower
    /// bounds, and a repair never lowers a recorded count.
    pub counts_complete: bool,
}

impl Inspection {
    pub fn push(&mut self, finding: Finding, problem: Problem) {
        self.findings.push((finding, problem));
    }

    pub fn count(&mut self, kind: &str, count: u64) {
        *self.checked.entry(kind.to_string()).or_default() += count;
    }

    /// The report of these findings.
    pub fn report(&self, repaired: bool) -> FaceReport {
        let mut report = FaceReport::new(FACE);
        report.checked = self.checked.clone();
        for (finding, _) in &self.findings {
            report.push(finding.clone());
        }
        report.repaired = repaired;
        report
    }
}

/// The repository-relative name of a file of the face.
pub(crate) fn face_path(name: &str) -> String {
    format!("{FACE}/{name}")
}

/// How check names a container.
pub(crate) fn container_object(containers: &ContainerStore, id: ContainerId) -> String {
    format!("container {id:016x} ({})", face_path(&containers.name(id)))
}

/// The reference counts the recipes hold.
#[derive(Default)]
pub(crate) struct ReferenceCounts {
    /// Live recipe references per segment.
    pub live: HashMap<SegmentId, u32>,
    /// Direct references per chunk.
    pub direct: HashMap<(SegmentId, u32), u32>,
    /// Backups (labels) referencing each segment.
    pub users: HashMap<SegmentId, BTreeSet<String>>,
    /// False when some recipe could not be read.
    pub complete: bool,
}

impl ReferenceCounts {
    pub fn users_of(&self, segment: SegmentId) -> Vec<String> {
        self.users
            .get(&segment)
            .map(|users| users.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// The fields of `frame`'s record header in `data` that differ from the catalog, if any (its
/// fingerprint only when the catalog knows it).
pub(crate) fn record_header_differs(data: &[u8], frame: &PlacedFrame) -> Option<String> {
    let start = frame.location.header_offset() as usize;
    let Some(bytes) = data.get(start..start + CHUNK_HEADER_BYTES) else {
        return Some("past the end of the file".to_string());
    };
    let Some(header) = ChunkHeader::parse(bytes) else {
        return Some("the header's own checksum".to_string());
    };
    let expected = frame
        .location
        .header(frame.fingerprint.unwrap_or(header.fingerprint));
    let differing = header.differences(&expected);
    (!differing.is_empty()).then(|| differing.join(", "))
}

/// Checks one frame's stored bytes in `data` (CRC, decompression) and the fingerprint of each
/// of its stored chunks; returns the raw bytes of its chunks, or what is wrong.
pub(crate) fn verify_frame(
    data: &[u8],
    frame: &PlacedFrame,
    fingerprinter: &Fingerprinter,
) -> std::result::Result<Vec<u8>, String> {
    let location = frame.location;
    let start = location.offset as usize;
    let Some(stored) = data.get(start..start + location.stored_bytes as usize) else {
        return Err("its bytes lie past the end of the file".to_string());
    };
    let raw = codec::decode_to_vec(&location, stored).map_err(|error| match error {
        CoreError::Corrupt { detail, .. } => detail,
        other => other.to_string(),
    })?;
    for &(index, fingerprint, within, raw_bytes) in &frame.chunks {
        let bytes = &raw[within as usize..(within + raw_bytes) as usize];
        if fingerprinter.hash(bytes) != fingerprint {
            return Err(format!(
                "chunk {index}'s bytes do not have the recorded fingerprint"
            ));
        }
    }
    Ok(raw)
}
