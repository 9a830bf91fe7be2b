//! [`ChunkerSpec`]: the textual name of a chunker and its sizes, as given on the command line
//! and kept in configuration.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::fastcdc::FastCdcChunker;
use super::fixed::{FixedChunker, FIXED_BYTES_MAX, FIXED_BYTES_MIN};
use super::rabin::{RabinChunker, WINDOW_BYTES};
use super::segment::{RollingHash, SegmentChunker};
use super::{Chunker, CHUNK_BYTES_LIMIT, SEGMENT_BYTES_LIMIT};
use crate::units::parse_size;
use crate::{Error, Result};

/// Smallest average chunk size of the content-defined chunkers.
pub const CDC_AVERAGE_BYTES_MIN: usize = 256;
/// Largest average chunk size of the content-defined chunkers.
pub const CDC_AVERAGE_BYTES_MAX: usize = 4 << 20;
/// Smallest minimum chunk size of the content-defined chunkers: the rolling hash window must
/// fit before the first possible cut.
pub const CDC_MIN_BYTES_FLOOR: usize = 64;

const _: () = assert!(CDC_MIN_BYTES_FLOOR >= WINDOW_BYTES);
const _: () = assert!(CDC_AVERAGE_BYTES_MAX * 4 <= CHUNK_BYTES_LIMIT);
const _: () = assert!(FIXED_BYTES_MAX <= CHUNK_BYTES_LIMIT);

/// Minimum, average and maximum sizes of content-defined chunks or segments.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SizeRange {
    pub bytes_min: usize,
    pub bytes_average: usize,
    pub bytes_max: usize,
}

/// A chunker and its sizes. Text form (sizes in bytes or with units, `8KiB`):
///
/// - `fixed:SIZE`: a power of two from 512 B to 4 MiB.
/// - `fastcdc:AVERAGE` or `fastcdc:MIN/AVERAGE/MAX`: defaults `AVERAGE/4` and `AVERAGE*4`.
/// - `rabin:AVERAGE` or `rabin:MIN/AVERAGE/MAX`: defaults `AVERAGE/2` and `AVERAGE*2`.
/// - `segment:SEGMENT_AVERAGE/CHUNK_AVERAGE`: two-level Rabin chunking, min/max half and twice.
/// - `segment-gear:SEGMENT_AVERAGE/CHUNK_AVERAGE`: the same with the gear hash.
///
/// Averages are powers of two from 256 B to 4 MiB; minimums are at least 64 B; maximums at most
/// 16 MiB. [`Display`](fmt::Display) prints the canonical form, which parses back to the same
/// spec: sizes in bytes (whole mebibytes as `4MiB`), and the short form when min and max are the
/// defaults, so `fixed:4096` and `fastcdc:8192` print as given. Serde uses the same text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChunkerSpec {
    Fixed {
        chunk_bytes: usize,
    },
    FastCdc(SizeRange),
    Rabin(SizeRange),
    Segment {
        segment: SizeRange,
        chunk: SizeRange,
        hash: RollingHash,
    },
}

const SYNTAX_HELP: &str = "use fixed:SIZE, fastcdc:AVERAGE, fastcdc:MIN/AVERAGE/MAX, \
     rabin:AVERAGE, rabin:MIN/AVERAGE/MAX, segment:SEGMENT_AVERAGE/CHUNK_AVERAGE or \
     segment-gear:SEGMENT_AVERAGE/CHUNK_AVERAGE, with sizes in bytes or units (e.g. fixed:4096, fastcdc:8KiB, segment:4MiB/4KiB)";

impl ChunkerSpec {
    /// Builds a fresh chunker (one per stream: see [`Chunker`]).
    pub fn build(&self) -> Box<dyn Chunker> {
        match *self {
            ChunkerSpec::Fixed { chunk_bytes } => Box::new(FixedChunker::new(chunk_bytes)),
            ChunkerSpec::FastCdc(sizes) => Box::new(FastCdcChunker::new(sizes)),
            ChunkerSpec::Rabin(sizes) => Box::new(RabinChunker::new(sizes)),
            ChunkerSpec::Segment {
                segment,
                chunk,
                hash,
            } => Box::new(SegmentChunker::with_hash(segment, chunk, hash)),
        }
    }

    /// The longest chunk the built chunker produces.
    pub fn chunk_bytes_max(&self) -> usize {
        match *self {
            ChunkerSpec::Fixed { chunk_bytes } => chunk_bytes,
            ChunkerSpec::FastCdc(sizes) | ChunkerSpec::Rabin(sizes) => sizes.bytes_max,
            ChunkerSpec::Segment { chunk, .. } => chunk.bytes_max,
        }
    }

    /// The chunker's kind: `fixed`, `fastcdc`, `rabin`, `segment` or `segment-gear`.
    pub fn kind(&self) -> &'static str {
        match self {
            ChunkerSpec::Fixed { .. } => "fixed",
            ChunkerSpec::FastCdc(_) => "fastcdc",
            ChunkerSpec::Rabin(_) => "rabin",
            ChunkerSpec::Segment {
                hash: RollingHash::Rabin,
                ..
            } => "segment",
            ChunkerSpec::Segment {
                hash: RollingHash::Gear,
                ..
            } => "segment-gear",
        }
    }
}

fn invalid(text: &str, why: impl fmt::Display) -> Error {
    Error::InvalidArgument(format!("chunker {text:?}: {why}"))
}

fn parse_sizes(text: &str, arguments: &str) -> Result<Vec<usize>> {
    arguments
        .split('/')
        .map(|part| {
            let bytes = parse_size(part).map_err(|error| invalid(text, error))?;
            usize::try_from(bytes).map_err(|_| invalid(text, format!("size {part:?} is too large")))
        })
        .collect()
}

fn check_average(text: &str, what: &str, bytes: usize) -> Result<()> {
    if !bytes.is_power_of_two() || !(CDC_AVERAGE_BYTES_MIN..=CDC_AVERAGE_BYTES_MAX).contains(&bytes)
    {
        return Err(invalid(
            text,
            format!("{what} {bytes} must be a power of two from {CDC_AVERAGE_BYTES_MIN} to {CDC_AVERAGE_BYTES_MAX} bytes"),
        ));
    }
    Ok(())
}

fn check_range(text: &str, sizes: SizeRange) -> Result<SizeRange> {
    check_average(text, "average", sizes.bytes_average)?;
    if sizes.bytes_min < CDC_MIN_BYTES_FLOOR {
        return Err(invalid(
            text,
            format!("minimum must be at least {CDC_MIN_BYTES_FLOOR} bytes"),
        ));
    }
    if !(sizes.bytes_min <= sizes.bytes_average && sizes.bytes_average <= sizes.bytes_max) {
        return Err(invalid(text, "sizes must satisfy MIN <= AVERAGE <= MAX"));
    }
    if sizes.bytes_max > CHUNK_BYTES_LIMIT {
        return Err(invalid(
            text,
            format!("maximum must be at most {CHUNK_BYTES_LIMIT} bytes"),
        ));
    }
    Ok(sizes)
}

fn parse_range(text: &str, arguments: &str, default: fn(usize) -> SizeRange) -> Result<SizeRange> {
    match parse_sizes(text, arguments)?.as_slice() {
        [average] => {
            check_average(text, "average", *average)?;
            check_range(text, default(*average))
        }
        [min, average, max] => check_range(
            text,
            SizeRange {
                bytes_min: *min,
                bytes_average: *average,
                bytes_max: *max,
            },
        ),
        _ => Err(invalid(text, "give AVERAGE or MIN/AVERAGE/MAX")),
    }
}

impl FromStr for ChunkerSpec {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        let Some((kind, arguments)) = text.trim().split_once(':') else {
            return Err(invalid(text, SYNTAX_HELP));
        };
        match kind.to_ascii_lowercase().as_str() {
            "fixed" => {
                let sizes = parse_sizes(text, arguments)?;
                let [chunk_bytes] = sizes.as_slice() else {
                    return Err(invalid(text, "fixed takes one size, e.g. fixed:4096"));
                };
                if !chunk_bytes.is_power_of_two()
                    || !(FIXED_BYTES_MIN..=FIXED_BYTES_MAX).contains(chunk_bytes)
                {
                    return Err(invalid(
                        text,
                        format!("fixed size must be a power of two from {FIXED_BYTES_MIN} to {FIXED_BYTES_MAX} bytes"),
                    ));
                }
                Ok(ChunkerSpec::Fixed {
                    chunk_bytes: *chunk_bytes,
                })
            }
            "fastcdc" => Ok(ChunkerSpec::FastCdc(parse_range(
                text,
                arguments,
                FastCdcChunker::default_sizes,
            )?)),
            "rabin" => Ok(ChunkerSpec::Rabin(parse_range(
                text,
                arguments,
                RabinChunker::default_sizes,
            )?)),
            "segment" | "segment-gear" => {
                let hash = if kind.eq_ignore_ascii_case("segment") {
                    RollingHash::Rabin
                } else {
                    RollingHash::Gear
                };
                let sizes = parse_sizes(text, arguments)?;
                let [segment_average, chunk_average] = sizes.as_slice() else {
                    return Err(invalid(
                        text,
                        "segment takes SEGMENT_AVERAGE/CHUNK_AVERAGE, e.g. segment:4MiB/4KiB",
                    ));
                };
                check_average(text, "chunk average", *chunk_average)?;
                if !segment_average.is_power_of_two() || *segment_average < 4 * chunk_average {
                    return Err(invalid(
                        text,
                        "segment average must be a power of two and at least 4 chunk averages",
                    ));
                }
                if segment_average * 2 > SEGMENT_BYTES_LIMIT {
                    return Err(invalid(
                        text,
                        format!(
                            "segment average must be at most {} bytes",
                            SEGMENT_BYTES_LIMIT / 2
                        ),
                    ));
                }
                let (segment, chunk) =
                    SegmentChunker::default_sizes(*segment_average, *chunk_average);
                Ok(ChunkerSpec::Segment {
                    segment,
                    chunk,
                    hash,
                })
            }
            _ => Err(invalid(
                text,
                format!("unknown chunker {kind:?}; {SYNTAX_HELP}"),
            )),
        }
    }
}

/// A size in canonical text: whole mebibytes as `4MiB`, anything else in bytes.
struct CanonicalSize(usize);

impl fmt::Display for CanonicalSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const MEBIBYTE: usize = 1 << 20;
        if self.0 >= MEBIBYTE && self.0.is_multiple_of(MEBIBYTE) {
            write!(f, "{}MiB", self.0 / MEBIBYTE)
        } else {
            write!(f, "{}", self.0)
        }
    }
}

fn write_range(
    f: &mut fmt::Formatter<'_>,
    sizes: SizeRange,
    default: fn(usize) -> SizeRange,
) -> fmt::Result {
    if sizes == default(sizes.bytes_average) {
        write!(f, "{}", CanonicalSize(sizes.bytes_average))
    } else {
        write!(
            f,
            "{}/{}/{}",
            CanonicalSize(sizes.bytes_min),
            CanonicalSize(sizes.bytes_average),
            CanonicalSize(sizes.bytes_max)
        )
    }
}

impl fmt::Display for ChunkerSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:", self.kind())?;
        match *self {
            ChunkerSpec::Fixed { chunk_bytes } => write!(f, "{}", CanonicalSize(chunk_bytes)),
            ChunkerSpec::FastCdc(sizes) => write_range(f, sizes, FastCdcChunker::default_sizes),
            ChunkerSpec::Rabin(sizes) => write_range(f, sizes, RabinChunker::default_sizes),
            ChunkerSpec::Segment { segment, chunk, .. } => write!(
                f,
                "{}/{}",
                CanonicalSize(segment.bytes_average),
                CanonicalSize(chunk.bytes_average)
            ),
        }
    }
}

impl Serialize for ChunkerSpec {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ChunkerSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: canonical text round-trips and short forms print as given; method: parse, print,
    /// parse again for every kind.
    #[test]
    fn display_round_trips() {
        for (input, canonical) in [
            ("fixed:4096", "fixed:4096"),
            ("fixed:4KiB", "fixed:4096"),
            ("fixed:1MiB", "fixed:1MiB"),
            ("fastcdc:8192", "fastcdc:8192"),
            ("fastcdc:2048/8192/32768", "fastcdc:8192"),
            ("fastcdc:1KiB/8KiB/64KiB", "fastcdc:1024/8192/65536"),
            ("rabin:8KiB", "rabin:8192"),
            ("rabin:4096/8192/16384", "rabin:8192"),
            ("RABIN:64/256/1MiB", "rabin:64/256/1MiB"),
            ("segment:4MiB/4KiB", "segment:4MiB/4096"),
            ("segment-gear:4MiB/4KiB", "segment-gear:4MiB/4096"),
        ] {
            let spec: ChunkerSpec = input.parse().unwrap();
            assert_eq!(spec.to_string(), canonical, "{input}");
            assert_eq!(canonical.parse::<ChunkerSpec>().unwrap(), spec);
            let json = serde_json::to_string(&spec).unwrap();
            assert_eq!(json, format!("\"{canonical}\""));
            assert_eq!(serde_json::from_str::<ChunkerSpec>(&json).unwrap(), spec);
        }
    }

    /// Goal: invalid specs are rejected with a message naming what is allowed.
    #[test]
    fn invalid_specs_explain() {
        for (input, expected) in [
            ("fixed:4000", "power of two"),
            ("fixed:256", "power of two from 512"),
            ("fixed:8MiB", "power of two from 512"),
            ("fastcdc:6000", "power of two"),
            ("fastcdc:4096/2048/8192", "MIN <= AVERAGE <= MAX"),
            ("fastcdc:32/256/1024", "at least 64"),
            ("fastcdc:1/2", "AVERAGE or MIN/AVERAGE/MAX"),
            ("rabin:8192/8192/64MiB", "at most"),
            ("segment:8KiB/4KiB", "at least 4 chunk averages"),
            ("segment:64MiB/4KiB", "at most"),
            ("zstd:3", "unknown chunker"),
            ("4096", "use fixed:SIZE"),
            ("fixed:lots", "unknown unit"),
        ] {
            let error = input.parse::<ChunkerSpec>().unwrap_err().to_string();
            assert!(error.contains(expected), "{input}: {error}");
        }
    }
}
