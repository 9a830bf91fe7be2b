//! Block traces with content digests, in the FIU format (Koller and Rangaswami, paper 4).
//!
//! One request per line, space separated:
//!
//! ```text
//! timestamp_ns pid process lba size R|W major minor md5...
//! ```
//!
//! `lba` and `size` count 512-byte sectors. The digests cover the request's content at one of
//! two *granularities*: one MD5 per 4 KiB page (the web, mail and webvm traces) or one per
//! 512-byte sector (the homes trace). The granularity is told by the count: `size / 8`
//! digests means pages, `size` digests means sectors (a one-sector request with one digest is
//! read as a sector). Each request is split into *blocks* of its granularity, each with an
//! address (in blocks of that size) and a digest.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use onecopy_core::error::IoContext;

use crate::error::{LabError, Result};

/// Sectors per 4 KiB page.
const SECTORS_PER_PAGE: u64 = 8;
/// Most sectors one request may cover (a sanity limit: 64 MiB).
pub const REQUEST_SECTORS_MAX: u64 = 1 << 17;

/// Read or write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    Read,
    Write,
}

/// What one digest covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Granularity {
    /// One digest per 4 KiB page.
    Page,
    /// One digest per 512-byte sector.
    Sector,
}

impl Granularity {
    /// Bytes one digest covers.
    pub fn block_bytes(self) -> u32 {
        match self {
            Granularity::Page => 4096,
            Granularity::Sector => 512,
        }
    }
}

/// An MD5 digest of one block.
pub type Digest = [u8; 16];

/// One request of a trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceRecord {
    pub timestamp_ns: u64,
    pub pid: u32,
    pub process: String,
    /// First sector.
    pub lba: u64,
    /// Length in sectors.
    pub sectors: u64,
    pub operation: Operation,
    pub major: u32,
    pub minor: u32,
    pub granularity: Granularity,
    /// One digest per block, in address order.
    pub digests: Vec<Digest>,
}

impl TraceRecord {
    /// The blocks of the request: (address in blocks of the granularity, digest).
    pub fn blocks(&self) -> impl Iterator<Item = (u64, &Digest)> + '_ {
        let first = match self.granularity {
            Granularity::Page => self.lba / SECTORS_PER_PAGE,
            Granularity::Sector => self.lba,
        };
        self.digests
            .iter()
            .enumerate()
            .map(move |(index, digest)| (first + index as u64, digest))
    }
}

/// Parses one line; `None` for blank lines and `#` comments.
pub fn parse_line(line: &str) -> std::result::Result<Option<TraceRecord>, String> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return Ok(None);
    }
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.len() < 9 {
        return Err(format!(
            "expected at least 9 fields (timestamp pid process lba size R|W major minor md5), found {}",
            fields.len()
        ));
    }
    let number = |index: usize, name: &str| -> std::result::Result<u64, String> {
        fields[index]
            .parse::<u64>()
            .map_err(|_| format!("{name} {:?} is not a number", fields[index]))
    };
    let small = |index: usize, name: &str| -> std::result::Result<u32, String> {
        u32::try_from(number(index, name)?).map_err(|_| format!("{name} is too large"))
    };
    let operation = match fields[5] {
        "R" | "r" => Operation::Read,
        "W" | "w" => Operation::Write,
        other => return Err(format!("operation {other:?} is neither R nor W")),
    };
    let lba = number(3, "lba")?;
    let sectors = number(4, "size")?;
    if sectors == 0 || sectors > REQUEST_SECTORS_MAX {
        return Err(format!(
            "size {sectors} is outside 1..={REQUEST_SECTORS_MAX} sectors"
        ));
    }
    let digests = fields[8..]
        .iter()
        .map(|text| parse_digest(text))
        .collect::<std::result::Result<Vec<Digest>, String>>()?;
    let count = digests.len() as u64;
    let granularity = if count == sectors {
        Granularity::Sector
    } else if sectors % SECTORS_PER_PAGE == 0
        && lba % SECTORS_PER_PAGE == 0
        && count == sectors / SECTORS_PER_PAGE
    {
        Granularity::Page
    } else {
        return Err(format!(
            "{count} digests fit neither one per sector ({sectors}) nor one per aligned 4 KiB page"
        ));
    };
    Ok(Some(TraceRecord {
        timestamp_ns: number(0, "timestamp")?,
        pid: small(1, "pid")?,
        process: fields[2].to_string(),
        lba,
        sectors,
        operation,
        major: small(6, "major")?,
        minor: small(7, "minor")?,
        granularity,
        digests,
    }))
}

fn parse_digest(text: &str) -> std::result::Result<Digest, String> {
    if text.len() != 32 {
        return Err(format!("digest {text:?} is not 32 hexadecimal digits"));
    }
    let mut digest = [0u8; 16];
    for (index, byte) in digest.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * index..2 * index + 2], 16)
            .map_err(|_| format!("digest {text:?} is not hexadecimal"))?;
    }
    Ok(digest)
}

/// Reads a whole trace; the error names the file and line of the first bad record.
pub fn read_trace(path: &Path) -> Result<Vec<TraceRecord>> {
    let text =
        fs::read_to_string(path).context_io(|| format!("reading trace {}", path.display()))?;
    parse_trace(&text, path)
}

/// Parses trace text (`path` only names it in errors).
pub fn parse_trace(text: &str, path: &Path) -> Result<Vec<TraceRecord>> {
    let mut records = Vec::new();
    for (index, line) in text.lines().enumerate() {
        match parse_line(line) {
            Ok(Some(record)) => records.push(record),
            Ok(None) => {}
            Err(detail) => {
                return Err(LabError::Trace {
                    path: PathBuf::from(path),
                    line: index + 1,
                    detail,
                })
            }
        }
    }
    Ok(records)
}

/// One block access of a trace, with dense address and content numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    pub operation: Operation,
    /// Dense number of the block address.
    pub address: u64,
    /// Dense number of the content digest.
    pub content: u64,
    /// The first 8 bytes of the digest, to make the synthetic block.
    pub digest_prefix: u64,
}

/// A trace as block accesses.
#[derive(Clone, Debug)]
pub struct Accesses {
    pub accesses: Vec<Access>,
    pub block_bytes: u32,
    pub distinct_addresses: u64,
    pub distinct_contents: u64,
}

/// Splits requests into block accesses and numbers addresses and digests densely.
pub fn accesses_of(records: &[TraceRecord]) -> Result<Accesses> {
    let Some(first) = records.first() else {
        return Err(LabError::InvalidOption("the trace has no records".into()));
    };
    let granularity = first.granularity;
    let mut addresses: HashMap<u64, u64> = HashMap::new();
    let mut contents: HashMap<Digest, u64> = HashMap::new();
    let mut accesses = Vec::new();
    for record in records {
        if record.granularity != granularity {
            return Err(LabError::InvalidOption(
                "the trace mixes per-page and per-sector digests".into(),
            ));
        }
        for (address, digest) in record.blocks() {
            let next_address = addresses.len() as u64;
            let next_content = contents.len() as u64;
            accesses.push(Access {
                operation: record.operation,
                address: *addresses.entry(address).or_insert(next_address),
                content: *contents.entry(*digest).or_insert(next_content),
                digest_prefix: u64::from_le_bytes(digest[..8].try_into().expect("8 bytes")),
            });
        }
    }
    Ok(Accesses {
        accesses,
        block_bytes: granularity.block_bytes(),
        distinct_addresses: addresses.len() as u64,
        distinct_contents: contents.len() as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE_LINE: &str =
        "89966811921625 4257 nfsd 488846200 8 W 6 0 2c4787c7671c2f638777c4ab72859ce1";

    /// Goal: a real line of the mail trace parses to one page; method: check every field.
    #[test]
    fn page_record_parses() {
        let record = parse_line(PAGE_LINE).unwrap().unwrap();
        assert_eq!(record.timestamp_ns, 89966811921625);
        assert_eq!(record.pid, 4257);
        assert_eq!(record.process, "nfsd");
        assert_eq!(record.operation, Operation::Write);
        assert_eq!(record.granularity, Granularity::Page);
        let blocks: Vec<_> = record.blocks().collect();
        assert_eq!(blocks.len(), 1);
        assert_eq!(blocks[0].0, 488846200 / 8);
        assert_eq!(blocks[0].1[0], 0x2c);
        assert_eq!(blocks[0].1[15], 0xe1);
    }

    /// Goal: multi-page and per-sector requests split into blocks at the right addresses.
    #[test]
    fn pages_and_sectors_split() {
        let a = "0123456789abcdef0123456789abcdef";
        let b = "fedcba9876543210fedcba9876543210";
        let pages = parse_line(&format!("1 2 p 16 16 R 8 1 {a} {b}"))
            .unwrap()
            .unwrap();
        assert_eq!(pages.granularity, Granularity::Page);
        let addresses: Vec<u64> = pages.blocks().map(|(address, _)| address).collect();
        assert_eq!(addresses, vec![2, 3]);
        let sectors = parse_line(&format!("1 2 p 5 2 R 8 1 {a} {b}"))
            .unwrap()
            .unwrap();
        assert_eq!(sectors.granularity, Granularity::Sector);
        let addresses: Vec<u64> = sectors.blocks().map(|(address, _)| address).collect();
        assert_eq!(addresses, vec![5, 6]);
        let one = parse_line(&format!("1 2 p 3 1 W 8 1 {a}"))
            .unwrap()
            .unwrap();
        assert_eq!(one.granularity, Granularity::Sector);
    }

    /// Goal: malformed lines are refused with a reason; blank lines and comments are skipped.
    #[test]
    fn bad_lines_are_refused() {
        let a = "0123456789abcdef0123456789abcdef";
        assert_eq!(parse_line("   ").unwrap(), None);
        assert_eq!(parse_line("# comment").unwrap(), None);
        for bad in [
            format!("1 2 p 16 8 X 8 1 {a}"),
            format!("1 2 p 16 8 R 8 1 {}", &a[..30]),
            format!("1 2 p 16 8 R 8 1 {a} {a}"),
            format!("1 2 p 4 8 R 8 1 {a}"),
            format!("x 2 p 16 8 R 8 1 {a}"),
            format!("1 2 p 16 0 R 8 1 {a}"),
            "1 2 p 16 8 R 8 1".to_string(),
            format!("1 2 p 16 8 R 8 1 {}", "zz".repeat(16)),
        ] {
            assert!(parse_line(&bad).is_err(), "{bad}");
        }
        let error = parse_trace(&format!("{PAGE_LINE}\nbad line\n"), Path::new("t")).unwrap_err();
        assert!(error.to_string().starts_with("t:2:"), "{error}");
    }
}
