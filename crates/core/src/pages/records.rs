//! Fixed-size records laid over an area.

use super::{AreaId, PageStore, PAGE_BYTES};
use crate::Result;

/// An array of fixed-size records stored in one area of a [`PageStore`]. Records never span
/// pages; record `i` lives in page `i / records_per_page`.
#[derive(Clone, Copy, Debug)]
pub struct RecordArea {
    area: AreaId,
    record_bytes: usize,
    records_per_page: u64,
}

impl RecordArea {
    /// Records of `record_bytes` bytes in `area`.
    pub fn new(area: AreaId, record_bytes: usize) -> Self {
        assert!(record_bytes > 0 && record_bytes <= PAGE_BYTES);
        RecordArea {
            area,
            record_bytes,
            records_per_page: (PAGE_BYTES / record_bytes) as u64,
        }
    }

    /// Records that fit one page.
    pub fn records_per_page(&self) -> u64 {
        self.records_per_page
    }

    /// The bytes of record `index` (zeros if never written).
    pub fn get<'a>(&self, pages: &'a mut PageStore, index: u64) -> Result<&'a [u8]> {
        let (page, start) = self.locate(index);
        let page = pages.read(self.area, page)?;
        Ok(&page[start..start + self.record_bytes])
    }

    /// The bytes of record `index` if its page is in memory, without loading it or counting
    /// it as used: for warming ([`PageStore::resident`]).
    pub fn resident<'a>(&self, pages: &'a PageStore, index: u64) -> Option<&'a [u8]> {
        let (page, start) = self.locate(index);
        let page = pages.resident(self.area, page)?;
        Some(&page[start..start + self.record_bytes])
    }

    /// The bytes of record `index` for modification.
    pub fn get_mut<'a>(&self, pages: &'a mut PageStore, index: u64) -> Result<&'a mut [u8]> {
        let (page, start) = self.locate(index);
        let page = pages.write(self.area, page)?;
        Ok(&mut page[start..start + self.record_bytes])
    }

    fn locate(&self, index: u64) -> (u64, usize) {
        let page = index / self.records_per_page;
        let start = (index % self.records_per_page) as usize * self.record_bytes;
        (page, start)
    }
}
