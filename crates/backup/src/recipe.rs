//! Recipes: how to rebuild a backup's byte stream (paper 2 §3.1).
//!
//! A backup's stream is a sequence of chunks; the *ordinal* of a chunk is its position in that
//! sequence (zero chunks included) and never changes for the life of the backup. The recipe
//! says where each chunk is, in one of two forms:
//!
//! - A **live** recipe (backups in the live window) lists *segment references*: each names a
//!   segment of the store and stands for all its chunks, in order.
//! - An **archival** recipe (after reverse deduplication) lists one *chunk reference* per
//!   chunk: **direct** (chunk `index` of segment `segment`, stored in a container), **indirect**
//!   (the chunk with ordinal `ordinal` of the *following* backup of the same series, which may
//!   itself be indirect: a chain that ends at a direct reference), or **zero** (a null chunk,
//!   never stored and regenerated on read).
//!
//! **Format.** A recipe is stored in catalog table `recipes` as *parts* of at most
//! [`PART_ENTRIES_MAX`] entries under key `backup id << 20 | part number`, so that an
//! archival chunk's ordinal gives its part and position by division. Each part is:
//!
//! ```text
//! magic "RCP2" | kind u8 (1 live, 2 archival) | entry count u32 | entries | crc32c u32
//! live entry:      segment id varint | chunk count varint | raw bytes varint
//! archival entry:  0 u8 | raw bytes varint                                  (zero)
//!                  1 u8 | raw bytes varint | segment id varint | index varint (direct)
//!                  2 u8 | ordinal step zigzag varint                         (indirect)
//!                  3 u8 | count varint | ordinal step zigzag varint          (indirect run)
//! ```
//!
//! `varint` is unsigned LEB128 ([`crate::codec`]). An indirect reference stores its ordinal
//! as the step from the ordinal the previous indirect reference of the part would be followed
//! by (the first one's predecessor is taken as -1), zigzag-encoded. A run stands for `count`
//! (2 or more) indirect references whose ordinals follow each other, the first one stored as a
//! step: reverse deduplication mostly finds runs of chunks that also follow each other in the
//! next backup (every chunk of a segment both backups hold), so an unchanged backup's archival
//! recipe costs a few bytes per segment. An indirect reference keeps no size: the chunk it
//! resolves to has one. The entry count of a part counts references, runs expanded.

use onecopy_core::catalog::{CatalogView, CatalogWrite, IdTable};

use crate::codec::{Decoder, Encoder};
use crate::error::{BackupError, Result};
use crate::segment::SegmentId;

/// Catalog table of recipe parts.
pub(crate) const RECIPES: IdTable = IdTable("recipes");
/// Entries in one recipe part.
pub const PART_ENTRIES_MAX: usize = 1 << 16;
/// Bits of a recipe key that number the part.
const PART_BITS: u32 = 20;
/// Magic of recipe parts.
const MAGIC: &[u8; 4] = b"RCP2";
const KIND_LIVE: u8 = 1;
const KIND_ARCHIVAL: u8 = 2;

/// One segment of a live recipe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentReference {
    pub segment: SegmentId,
    pub chunk_count: u32,
    pub raw_bytes: u64,
}

/// One chunk of an archival recipe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkReference {
    /// A null chunk of `raw_bytes` zeros.
    Zero { raw_bytes: u32 },
    /// Chunk `index` of segment `segment`.
    Direct {
        raw_bytes: u32,
        segment: SegmentId,
        index: u32,
    },
    /// The chunk with this ordinal in the following backup of the series (its size is that
    /// chunk's).
    Indirect { ordinal: u64 },
}

/// A whole recipe in memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Recipe {
    Live(Vec<SegmentReference>),
    Archival(Vec<ChunkReference>),
}

/// Where a chunk of a live recipe is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LivePosition {
    pub segment: SegmentId,
    pub index: u32,
}

impl Recipe {
    /// Chunks in the backup.
    pub fn chunk_count(&self) -> u64 {
        match self {
            Recipe::Live(entries) => entries.iter().map(|entry| entry.chunk_count as u64).sum(),
            Recipe::Archival(entries) => entries.len() as u64,
        }
    }

    /// Parts the recipe is stored in.
    pub fn part_count(&self) -> u32 {
        let entries = match self {
            Recipe::Live(entries) => entries.len(),
            Recipe::Archival(entries) => entries.len(),
        };
        entries.div_ceil(PART_ENTRIES_MAX) as u32
    }

    /// Encodes the recipe as parts.
    pub(crate) fn encode_parts(&self) -> Vec<Vec<u8>> {
        match self {
            Recipe::Live(entries) => entries
                .chunks(PART_ENTRIES_MAX)
                .map(|part| {
                    let mut encoder = Encoder::with_capacity(part.len() * 8 + 16);
                    header(&mut encoder, KIND_LIVE, part.len());
                    for entry in part {
                        encoder.varint(entry.segment);
                        encoder.varint(entry.chunk_count.into());
                        encoder.varint(entry.raw_bytes);
                    }
                    encoder.finish()
                })
                .collect(),
            Recipe::Archival(entries) => entries
                .chunks(PART_ENTRIES_MAX)
                .map(|part| {
                    let mut encoder = Encoder::with_capacity(part.len() * 4 + 16);
                    header(&mut encoder, KIND_ARCHIVAL, part.len());
                    let mut expected_ordinal = 0u64;
                    let mut at = 0;
                    while at < part.len() {
                        let entry = part[at];
                        at += 1;
                        match entry {
                            ChunkReference::Zero { raw_bytes } => {
                                encoder.u8(0);
                                encoder.varint(raw_bytes.into());
                            }
                            ChunkReference::Direct {
                                raw_bytes,
                                segment,
                                index,
                            } => {
                                encoder.u8(1);
                                encoder.varint(raw_bytes.into());
                                encoder.varint(segment);
                                encoder.varint(index.into());
                            }
                            ChunkReference::Indirect { ordinal } => {
                                let mut count = 1u64;
                                while at < part.len()
                                    && part[at]
                                        == (ChunkReference::Indirect {
                                            ordinal: ordinal.wrapping_add(count),
                                        })
                                {
                                    count += 1;
                                    at += 1;
                                }
                                if count == 1 {
                                    encoder.u8(2);
                                } else {
                                    encoder.u8(3);
                                    encoder.varint(count);
                                }
                                encoder.varint(zigzag(ordinal.wrapping_sub(expected_ordinal)));
                                expected_ordinal = ordinal.wrapping_add(count);
                            }
                        }
                    }
                    encoder.finish()
                })
                .collect(),
        }
    }

    /// Stores the recipe of backup `backup`, replacing `previous_parts` parts of an older
    /// form. Returns the number of parts written.
    pub(crate) fn store(
        &self,
        write: &mut CatalogWrite,
        backup: u64,
        previous_parts: u32,
    ) -> Result<u32> {
        let parts = self.encode_parts();
        for (number, bytes) in parts.iter().enumerate() {
            write.put_id(RECIPES, part_key(backup, number as u32), bytes)?;
        }
        for number in parts.len() as u32..previous_parts {
            write.remove_id(RECIPES, part_key(backup, number))?;
        }
        Ok(parts.len() as u32)
    }

    /// Removes the `parts` parts of backup `backup`.
    pub(crate) fn remove(write: &mut CatalogWrite, backup: u64, parts: u32) -> Result<()> {
        for number in 0..parts {
            write.remove_id(RECIPES, part_key(backup, number))?;
        }
        Ok(())
    }

    /// Loads the recipe of backup `backup`, which has `parts` parts.
    pub(crate) fn load(view: &impl CatalogView, backup: u64, parts: u32) -> Result<Recipe> {
        let mut live = Vec::new();
        let mut archival = Vec::new();
        let mut kind = None;
        for number in 0..parts {
            let what = format!("recipe part {number} of backup {backup}");
            let bytes = view
                .get_id(RECIPES, part_key(backup, number))?
                .ok_or_else(|| BackupError::corrupt(&what, "missing"))?;
            let part_kind = decode_part(&bytes, &what, &mut live, &mut archival)?;
            if kind.is_some_and(|kind| kind != part_kind) {
                return Err(BackupError::corrupt(&what, "parts of different kinds"));
            }
            kind = Some(part_kind);
        }
        Ok(match kind {
            Some(KIND_ARCHIVAL) => Recipe::Archival(archival),
            _ => Recipe::Live(live),
        })
    }

    /// For a live recipe: prefix sums of chunk counts, so that [`Recipe::live_position`] finds
    /// the segment holding an ordinal by binary search.
    pub fn live_starts(&self) -> Vec<u64> {
        let Recipe::Live(entries) = self else {
            return Vec::new();
        };
        let mut starts = Vec::with_capacity(entries.len());
        let mut next = 0u64;
        for entry in entries {
            starts.push(next);
            next += entry.chunk_count as u64;
        }
        starts
    }

    /// The segment and index of chunk `ordinal` of a live recipe (`starts` from
    /// [`Recipe::live_starts`]); `None` when the ordinal is out of range.
    pub fn live_position(&self, starts: &[u64], ordinal: u64) -> Option<LivePosition> {
        let Recipe::Live(entries) = self else {
            return None;
        };
        let slot = starts
            .partition_point(|&start| start <= ordinal)
            .checked_sub(1)?;
        let index = ordinal - starts[slot];
        let entry = entries[slot];
        (index < entry.chunk_count as u64).then_some(LivePosition {
            segment: entry.segment,
            index: index as u32,
        })
    }
}

fn header(encoder: &mut Encoder, kind: u8, entries: usize) {
    encoder.raw(MAGIC);
    encoder.u8(kind);
    encoder.u32(entries as u32);
}

fn decode_part(
    bytes: &[u8],
    what: &str,
    live: &mut Vec<SegmentReference>,
    archival: &mut Vec<ChunkReference>,
) -> Result<u8> {
    let mut decoder = Decoder::new_checked(bytes, what)?;
    let magic = [decoder.u8()?, decoder.u8()?, decoder.u8()?, decoder.u8()?];
    if &magic != MAGIC {
        return decoder.invalid("bad magic");
    }
    let kind = decoder.u8()?;
    let count = decoder.u32()? as usize;
    if count > PART_ENTRIES_MAX {
        return decoder.invalid(format!("{count} entries exceed the part limit"));
    }
    match kind {
        KIND_LIVE => {
            for _ in 0..count {
                live.push(SegmentReference {
                    segment: decoder.varint()?,
                    chunk_count: decoder.varint_u32()?,
                    raw_bytes: decoder.varint()?,
                });
            }
        }
        KIND_ARCHIVAL => {
            let mut expected_ordinal = 0u64;
            let mut decoded = 0usize;
            while decoded < count {
                let tag = decoder.u8()?;
                match tag {
                    0 => archival.push(ChunkReference::Zero {
                        raw_bytes: decoder.varint_u32()?,
                    }),
                    1 => archival.push(ChunkReference::Direct {
                        raw_bytes: decoder.varint_u32()?,
                        segment: decoder.varint()?,
                        index: decoder.varint_u32()?,
                    }),
                    2 | 3 => {
                        let run = if tag == 3 { decoder.varint()? } else { 1 };
                        if run == 0 || (tag == 3 && run < 2) || run > (count - decoded) as u64 {
                            return decoder.invalid(format!(
                                "a run of {run} references where {} are left",
                                count - decoded
                            ));
                        }
                        let ordinal = expected_ordinal.wrapping_add(unzigzag(decoder.varint()?));
                        archival.extend((0..run).map(|step| ChunkReference::Indirect {
                            ordinal: ordinal.wrapping_add(step),
                        }));
                        expected_ordinal = ordinal.wrapping_add(run);
                        decoded += run as usize - 1;
                    }
                    _ => return decoder.invalid(format!("unknown reference tag {tag}")),
                }
                decoded += 1;
            }
        }
        _ => return decoder.invalid(format!("unknown recipe kind {kind}")),
    }
    decoder.finish()?;
    Ok(kind)
}

/// Maps a step of either sign to an unsigned integer, small steps to small values
/// (0, -1, 1, -2, ... to 0, 1, 2, 3, ...), in two's complement so that every `u64` step
/// round-trips.
fn zigzag(step: u64) -> u64 {
    (step << 1) ^ ((step as i64 >> 63) as u64)
}

fn unzigzag(value: u64) -> u64 {
    (value >> 1) ^ (value & 1).wrapping_neg()
}

fn part_key(backup: u64, part: u32) -> u64 {
    assert!(backup < 1 << (64 - PART_BITS), "backup ids fit the key");
    assert!(part < 1 << PART_BITS, "part numbers fit the key");
    backup << PART_BITS | part as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::Decoder;

    /// Goal: both recipe forms survive encoding, across part boundaries.
    #[test]
    fn parts_round_trip() {
        let live = Recipe::Live(
            (0..PART_ENTRIES_MAX as u64 + 5)
                .map(|segment| SegmentReference {
                    segment,
                    chunk_count: 3,
                    raw_bytes: 9000,
                })
                .collect(),
        );
        let archival = Recipe::Archival(vec![
            ChunkReference::Zero { raw_bytes: 4096 },
            ChunkReference::Direct {
                raw_bytes: 5000,
                segment: 9,
                index: 2,
            },
            ChunkReference::Indirect { ordinal: 77 },
            ChunkReference::Indirect { ordinal: 78 },
            ChunkReference::Indirect { ordinal: 79 },
            ChunkReference::Indirect { ordinal: 3 },
        ]);
        for recipe in [live, archival] {
            let parts = recipe.encode_parts();
            let (mut live, mut archival) = (Vec::new(), Vec::new());
            for part in &parts {
                Decoder::new_checked(part, "part").unwrap();
                decode_part(part, "part", &mut live, &mut archival).unwrap();
            }
            let decoded = if archival.is_empty() {
                Recipe::Live(live)
            } else {
                Recipe::Archival(archival)
            };
            assert_eq!(decoded, recipe);
        }
    }

    fn decode_one(part: &[u8]) -> Result<Recipe> {
        let (mut live, mut archival) = (Vec::new(), Vec::new());
        let kind = decode_part(part, "part", &mut live, &mut archival)?;
        Ok(if kind == KIND_LIVE {
            Recipe::Live(live)
        } else {
            Recipe::Archival(archival)
        })
    }

    /// Goal: indirect ordinals round-trip whatever their order (forwards, backwards, gaps
    /// of every size, the extremes); runs of consecutive ordinals cost a byte each; a part
    /// under another magic (`RCP1`, a format that was never released) is refused.
    #[test]
    fn ordinal_steps_and_other_magic() {
        let ordinals = [
            0,
            1,
            2,
            3,
            10,
            9,
            9,
            1 << 40,
            0,
            u64::MAX,
            5,
            u64::MAX - 1,
            7,
        ];
        let mut entries: Vec<ChunkReference> = ordinals
            .iter()
            .map(|&ordinal| ChunkReference::Indirect { ordinal })
            .collect();
        entries.insert(3, ChunkReference::Zero { raw_bytes: 1 });
        entries.insert(
            6,
            ChunkReference::Direct {
                raw_bytes: u32::MAX,
                segment: u64::MAX,
                index: u32::MAX,
            },
        );
        let archival = Recipe::Archival(entries);
        let parts = archival.encode_parts();
        assert_eq!(parts.len(), 1);
        assert_eq!(decode_one(&parts[0]).unwrap(), archival);
        // A well-formed `RCP1` part: one live entry of fixed-width fields.
        let mut other_magic = Encoder::default();
        other_magic.raw(b"RCP1");
        other_magic.u8(KIND_LIVE);
        other_magic.u32(1);
        other_magic.u64(7);
        other_magic.u32(2);
        other_magic.u64(8192);
        assert!(decode_one(&other_magic.finish()).is_err());
        let live = Recipe::Live(vec![SegmentReference {
            segment: u64::MAX,
            chunk_count: u32::MAX,
            raw_bytes: u64::MAX,
        }]);
        assert_eq!(decode_one(&live.encode_parts()[0]).unwrap(), live);

        // Runs of consecutive ordinals cost a few bytes each, whatever their length, and do
        // not cross parts; a single reference costs a tag and a step.
        let runs = Recipe::Archival(
            (1000..1000 + PART_ENTRIES_MAX as u64 + 3000)
                .chain([5, 70_000, 70_001])
                .map(|ordinal| ChunkReference::Indirect { ordinal })
                .collect(),
        );
        let parts = runs.encode_parts();
        assert_eq!(parts.len(), 2);
        assert!(parts.iter().all(|part| part.len() <= 40), "{parts:?}");
        let mut decoded = Vec::new();
        for part in &parts {
            let Recipe::Archival(entries) = decode_one(part).unwrap() else {
                panic!("an archival part");
            };
            decoded.extend(entries);
        }
        assert_eq!(Recipe::Archival(decoded), runs);
        // A run longer than the part's count says, or of one reference, is refused.
        for (run, count) in [(5u64, 4u32), (1, 1)] {
            let mut lying = Encoder::default();
            lying.raw(MAGIC);
            lying.u8(KIND_ARCHIVAL);
            lying.u32(count);
            lying.u8(3);
            lying.varint(run);
            lying.varint(0);
            assert!(decode_one(&lying.finish()).is_err(), "run {run} in {count}");
        }
    }

    /// Goal: ordinals of a live recipe map to the right segment and index.
    #[test]
    fn live_positions() {
        let recipe = Recipe::Live(vec![
            SegmentReference {
                segment: 10,
                chunk_count: 2,
                raw_bytes: 1,
            },
            SegmentReference {
                segment: 11,
                chunk_count: 3,
                raw_bytes: 1,
            },
        ]);
        let starts = recipe.live_starts();
        let position = |ordinal| recipe.live_position(&starts, ordinal);
        assert_eq!(
            position(1),
            Some(LivePosition {
                segment: 10,
                index: 1
            })
        );
        assert_eq!(
            position(2),
            Some(LivePosition {
                segment: 11,
                index: 0
            })
        );
        assert_eq!(position(5), None);
    }
}
