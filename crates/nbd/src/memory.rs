//! [`MemoryExport`]: a sparse export held in memory, for tests and for measuring the
//! protocol's own overhead.
//!
//! The export is divided into *pages* of [`MemoryExport::PAGE_BYTES`]; a page is allocated on
//! its first write and freed again by a trim or a hole-punching write-zeroes that covers it
//! whole. Unallocated pages read as zeroes and are reported by block status as hole and zero,
//! so clients can see holes appear after trims. Pages are spread over
//! [`MemoryExport::SHARDS`] independently locked maps so that concurrent requests on
//! different pages rarely contend.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::RwLock;

use crate::export::{AllocationExtent, BlockSize, Export, ExportError, ZeroOptions};

type Page = Box<[u8]>;
type PageMap = HashMap<u64, Page, BuildHasherDefault<PageIndexHasher>>;

/// Hashes page indexes with one multiplication: page indexes are not chosen by an adversary
/// who could force collisions, and SipHash would cost more than the page copy it guards.
#[derive(Default)]
struct PageIndexHasher(u64);

impl Hasher for PageIndexHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0 << 8 | u64::from(byte)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u64(&mut self, value: u64) {
        let product = value.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        // Fold the well-mixed high bits into the low bits the table indexes with; pages of
        // one shard share their low bits.
        self.0 = product ^ (product >> 29);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A sparse in-memory export. Contents are lost when it is dropped; flush does nothing and
/// is global, so `CAN_MULTI_CONN` is advertised.
pub struct MemoryExport {
    size_bytes: u64,
    block_size: BlockSize,
    read_only: bool,
    shards: Box<[RwLock<PageMap>]>,
    allocated_pages: AtomicUsize,
}

impl MemoryExport {
    /// Allocation granularity, and the granularity of reported holes.
    pub const PAGE_BYTES: u64 = 4096;
    /// Number of independently locked page maps.
    pub const SHARDS: usize = 64;
    /// Largest range one block status call examines; the client asks again for the rest.
    pub const BLOCK_STATUS_SCAN_BYTES_MAX: u64 = 1 << 30;

    /// An empty (all zero, all hole) writable export of `size_bytes` with the default block
    /// size constraints.
    pub fn new(size_bytes: u64) -> MemoryExport {
        MemoryExport {
            size_bytes,
            block_size: BlockSize::DEFAULT,
            read_only: false,
            shards: (0..Self::SHARDS)
                .map(|_| RwLock::new(PageMap::default()))
                .collect(),
            allocated_pages: AtomicUsize::new(0),
        }
    }

    /// Replaces the advertised block size constraints.
    pub fn with_block_size(mut self, block_size: BlockSize) -> MemoryExport {
        self.block_size = block_size;
        self
    }

    /// Makes the export read-only (or writable again).
    pub fn with_read_only(mut self, read_only: bool) -> MemoryExport {
        self.read_only = read_only;
        self
    }

    /// Number of pages currently holding data.
    pub fn allocated_pages(&self) -> usize {
        self.allocated_pages.load(Ordering::Relaxed)
    }

    fn shard(&self, page: u64) -> &RwLock<PageMap> {
        &self.shards[(page % Self::SHARDS as u64) as usize]
    }

    /// Calls `visit(page, offset_in_page, bytes, position_in_range)` for each page piece of
    /// `offset .. offset + length`.
    fn for_each_piece(offset: u64, length: u64, mut visit: impl FnMut(u64, usize, usize, usize)) {
        let end = offset + length;
        let mut position = offset;
        while position < end {
            let page = position / Self::PAGE_BYTES;
            let within = position % Self::PAGE_BYTES;
            let bytes = (Self::PAGE_BYTES - within).min(end - position);
            visit(
                page,
                within as usize,
                bytes as usize,
                (position - offset) as usize,
            );
            position += bytes;
        }
    }

    fn check_range(&self, offset: u64, length: u64) {
        // The server validates every request; a bad range here is a bug in the caller.
        assert!(length > 0, "empty range");
        assert!(
            offset
                .checked_add(length)
                .is_some_and(|end| end <= self.size_bytes),
            "range {offset}+{length} outside export of {} bytes",
            self.size_bytes
        );
    }

    fn zero_range(&self, offset: u64, length: u64, may_punch_hole: bool) {
        Self::for_each_piece(offset, length, |page, within, bytes, _| {
            let mut shard = self.shard(page).write();
            let whole = bytes as u64 == Self::PAGE_BYTES;
            if whole && may_punch_hole {
                if shard.remove(&page).is_some() {
                    self.allocated_pages.fetch_sub(1, Ordering::Relaxed);
                }
                return;
            }
            match shard.get_mut(&page) {
                Some(data) => data[within..within + bytes].fill(0),
                None if may_punch_hole => {}
                None => {
                    shard.insert(page, vec![0; Self::PAGE_BYTES as usize].into_boxed_slice());
                    self.allocated_pages.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
}

impl Export for MemoryExport {
    fn size(&self) -> u64 {
        self.size_bytes
    }

    fn block_size(&self) -> BlockSize {
        self.block_size
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn flush_is_global(&self) -> bool {
        true
    }

    fn read(&self, offset: u64, buffer: &mut [u8]) -> Result<(), ExportError> {
        self.check_range(offset, buffer.len() as u64);
        Self::for_each_piece(offset, buffer.len() as u64, |page, within, bytes, at| {
            let target = &mut buffer[at..at + bytes];
            match self.shard(page).read().get(&page) {
                Some(data) => target.copy_from_slice(&data[within..within + bytes]),
                None => target.fill(0),
            }
        });
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8], _fua: bool) -> Result<(), ExportError> {
        self.check_range(offset, data.len() as u64);
        assert!(!self.read_only, "write reached a read-only export");
        Self::for_each_piece(offset, data.len() as u64, |page, within, bytes, at| {
            let source = &data[at..at + bytes];
            let mut shard = self.shard(page).write();
            let target = shard.entry(page).or_insert_with(|| {
                self.allocated_pages.fetch_add(1, Ordering::Relaxed);
                vec![0; Self::PAGE_BYTES as usize].into_boxed_slice()
            });
            target[within..within + bytes].copy_from_slice(source);
        });
        Ok(())
    }

    fn flush(&self) -> Result<(), ExportError> {
        Ok(())
    }

    fn trim(&self, offset: u64, length: u64, _fua: bool) -> Result<(), ExportError> {
        self.check_range(offset, length);
        assert!(!self.read_only, "trim reached a read-only export");
        self.zero_range(offset, length, true);
        Ok(())
    }

    fn write_zeroes(
        &self,
        offset: u64,
        length: u64,
        options: ZeroOptions,
    ) -> Result<(), ExportError> {
        self.check_range(offset, length);
        assert!(!self.read_only, "write-zeroes reached a read-only export");
        // Zeroing memory is always faster than receiving the same bytes over the network,
        // so a fast-only request is honoured.
        self.zero_range(offset, length, options.may_punch_hole);
        Ok(())
    }

    fn block_status(
        &self,
        offset: u64,
        length: u64,
        extents: &mut Vec<AllocationExtent>,
    ) -> Result<(), ExportError> {
        self.check_range(offset, length);
        let length = length.min(Self::BLOCK_STATUS_SCAN_BYTES_MAX);
        let first = extents.len();
        Self::for_each_piece(offset, length, |page, _, bytes, _| {
            let hole = !self.shard(page).read().contains_key(&page);
            let count = extents.len();
            match extents.last_mut() {
                Some(last) if count > first && last.hole == hole => last.length += bytes as u64,
                _ => extents.push(AllocationExtent {
                    length: bytes as u64,
                    hole,
                    zero: hole,
                }),
            }
        });
        Ok(())
    }

    fn cache(&self, offset: u64, length: u64) -> Result<(), ExportError> {
        self.check_range(offset, length);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the memory export passes the export conformance suite, writable and read-only.
    #[test]
    fn conformance() {
        crate::conformance::check_export(&MemoryExport::new(64 << 20)).expect("writable");
        let read_only = MemoryExport::new(64 << 20).with_read_only(true);
        crate::conformance::check_export(&read_only).expect("read-only");
        let large_blocks = MemoryExport::new(64 << 20)
            .with_block_size(BlockSize::new(4096, 65536, 1 << 20).expect("valid"));
        crate::conformance::check_export(&large_blocks).expect("4 KiB minimum");
    }

    // Goal: data written across page boundaries reads back, and untouched bytes read as zero.
    #[test]
    fn write_read_across_pages() {
        let export = MemoryExport::new(64 << 10);
        let data: Vec<u8> = (0..10_000u32).map(|value| (value % 251) as u8).collect();
        export.write(1000, &data, false).expect("write");
        let mut back = vec![0xff; 12_000];
        export.read(0, &mut back).expect("read");
        assert!(back[..1000].iter().all(|&byte| byte == 0));
        assert_eq!(&back[1000..11_000], &data[..]);
        assert!(back[11_000..].iter().all(|&byte| byte == 0));
        assert_eq!(export.allocated_pages(), 3);
    }

    // Goal: trim frees whole pages and zeroes partial ones; block status reports the holes.
    #[test]
    fn trim_makes_holes() {
        let export = MemoryExport::new(16 << 10);
        export.write(0, &[7; 16 << 10], false).expect("write");
        export.trim(2048, 8192, false).expect("trim");
        assert_eq!(export.allocated_pages(), 3);
        let mut extents = Vec::new();
        export
            .block_status(0, 16 << 10, &mut extents)
            .expect("status");
        let expected = [(4096, false), (4096, true), (8192, false)];
        let got: Vec<(u64, bool)> = extents.iter().map(|e| (e.length, e.hole)).collect();
        assert_eq!(got, expected);
        let mut back = vec![0xff; 16 << 10];
        export.read(0, &mut back).expect("read");
        assert!(back[..2048].iter().all(|&byte| byte == 7));
        assert!(back[2048..10240].iter().all(|&byte| byte == 0));
        assert!(back[10240..].iter().all(|&byte| byte == 7));
    }

    // Goal: write-zeroes without hole punching allocates pages that read as zero.
    #[test]
    fn write_zeroes_without_holes_allocates() {
        let export = MemoryExport::new(8192);
        let options = ZeroOptions {
            may_punch_hole: false,
            ..ZeroOptions::default()
        };
        export.write_zeroes(0, 8192, options).expect("zero");
        assert_eq!(export.allocated_pages(), 2);
        let mut extents = Vec::new();
        export
            .block_status(4096, 4096, &mut extents)
            .expect("status");
        assert_eq!(
            extents,
            vec![AllocationExtent {
                length: 4096,
                hole: false,
                zero: false
            }]
        );
    }
}
