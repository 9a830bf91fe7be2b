//! Saving a filter in a page-store area and loading it back.
//!
//! Layout of the area: page 0 is a header (below); pages 1.. hold the filter's words, little
//! endian, [`WORDS_PER_PAGE`] per page. Saving writes only the pages changed since the last
//! save, then the header. The header names the *change count* of the on-disk index the
//! filter matches; a filter whose count differs from the index's at open (because the owner
//! checkpointed without saving the filter, or the index changed afterwards) is stale and is
//! rebuilt from the index instead of being trusted.
//!
//! Header: magic `OCFILTR1` | kind u32 | hash parameter u32 | capacity u64 | target rate f64 |
//! len u64 | units u64 | stash tag u32 | 0u32 | stash bucket u64 | change count u64 |
//! word count u64 (all little endian).

use super::{Filter, FilterKind, FilterShape, WORDS_PER_PAGE};
use crate::bytes::{u32_at, u64_at};
use crate::pages::{AreaId, PageStore};
use crate::Result;

const MAGIC: &[u8; 8] = b"OCFILTR1";
const HEADER_BYTES: usize = 80;

/// Writes the changed pages of `filter` and its header to `area`.
pub(crate) fn save(
    filter: &mut Filter,
    pages: &mut PageStore,
    area: AreaId,
    change_count: u64,
) -> Result<()> {
    let dirty = filter.words_mut().take_dirty_pages();
    let words = filter.words().as_slice();
    for page in dirty {
        let start = page * WORDS_PER_PAGE;
        let end = (start + WORDS_PER_PAGE).min(words.len());
        // Whole pages (zeros past the last word): the old content need not be read.
        let target = pages.overwrite(area, page as u64 + 1)?;
        for (slot, word) in words[start..end].iter().enumerate() {
            target[slot * 8..slot * 8 + 8].copy_from_slice(&word.to_le_bytes());
        }
    }
    let shape = filter.shape();
    let mut header = Vec::with_capacity(HEADER_BYTES);
    header.extend_from_slice(MAGIC);
    header.extend_from_slice(&shape.kind.code().to_le_bytes());
    header.extend_from_slice(&shape.hash_parameter.to_le_bytes());
    header.extend_from_slice(&shape.capacity.to_le_bytes());
    header.extend_from_slice(&shape.target_false_positive_rate.to_le_bytes());
    header.extend_from_slice(&shape.len.to_le_bytes());
    header.extend_from_slice(&shape.units.to_le_bytes());
    header.extend_from_slice(&shape.stash_tag.to_le_bytes());
    header.extend_from_slice(&0u32.to_le_bytes());
    header.extend_from_slice(&shape.stash_bucket.to_le_bytes());
    header.extend_from_slice(&change_count.to_le_bytes());
    header.extend_from_slice(&(words.len() as u64).to_le_bytes());
    assert_eq!(header.len(), HEADER_BYTES);
    // Page 0 holds the header alone: rewritten whole, it need not be read (nor be intact).
    pages.overwrite(area, 0)?[..HEADER_BYTES].copy_from_slice(&header);
    Ok(())
}

/// The filter saved in `area` if it matches `change_count`; `None` when there is none, it is
/// stale, or its header does not describe a valid filter (it is derived data, so the caller
/// rebuilds it).
pub(crate) fn load(
    pages: &mut PageStore,
    area: AreaId,
    change_count: u64,
) -> Result<Option<Filter>> {
    let header = pages.read(area, 0)?;
    if &header[..8] != MAGIC {
        return Ok(None);
    }
    let Some(kind) = FilterKind::from_code(u32_at(header, 8)) else {
        return Ok(None);
    };
    let shape = FilterShape {
        kind,
        hash_parameter: u32_at(header, 12),
        capacity: u64_at(header, 16),
        target_false_positive_rate: f64::from_bits(u64_at(header, 24)),
        len: u64_at(header, 32),
        units: u64_at(header, 40),
        stash_tag: u32_at(header, 48),
        stash_bucket: u64_at(header, 56),
    };
    let saved_change_count = u64_at(header, 64);
    let word_count = u64_at(header, 72);
    let page_count = pages.page_count(area);
    let words_stored = page_count.saturating_sub(1) * WORDS_PER_PAGE as u64;
    if saved_change_count != change_count || word_count > words_stored {
        return Ok(None);
    }
    let mut words = Vec::with_capacity(word_count as usize);
    let mut page = 1;
    while (words.len() as u64) < word_count {
        let take = (word_count as usize - words.len()).min(WORDS_PER_PAGE);
        pages.read_once(area, page, |content| {
            words.extend(
                content[..take * 8]
                    .chunks_exact(8)
                    .map(|bytes| u64_at(bytes, 0)),
            )
        })?;
        page += 1;
    }
    Ok(Filter::restore(shape, words))
}
