//! A conformance suite for [`Export`] implementations: every export (the memory export here,
//! the engine's volumes elsewhere) can join it in one line and be checked against the
//! contracts the server relies on.
//!
//! [`check_export`] destroys the export's contents: pass a scratch export. It only issues
//! requests the server itself would pass on (nonempty, in range, aligned to the minimum block
//! size), and checks:
//! 1. size and block size are stable;
//! 2. data written (with and without FUA) reads back, also across the preferred block size;
//! 3. write-zeroes, with and without hole punching, reads back as zeroes; a fast-only
//!    write-zeroes either zeroes or refuses with [`ExportError::FastZeroUnsupported`] without
//!    changing the contents;
//! 4. trim followed by a write reads back the write;
//! 5. block status covers at least one byte from the requested offset, and every extent it
//!    marks as zero reads as zeroes;
//! 6. flush and cache succeed;
//! 7. writes from several threads to disjoint blocks all read back;
//! 8. cache of data just written, of zeroed and trimmed ranges, of a range that starts off
//!    the preferred block size, and the same again after a flush, succeeds and leaves every
//!    byte as it was (an export may keep recent writes and flushed data in different places,
//!    and cache must handle both).
//!
//! Read-only exports get checks 1, 5 and 6 only.

use std::fmt::Display;

use crate::export::{AllocationExtent, Export, ExportError, ZeroOptions};

/// Bytes of each zero extent that are read back to confirm the zero flag.
const ZERO_CHECK_BYTES_MAX: u64 = 16 << 20;

/// A broken contract, described for a test failure message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("export conformance: {0}")]
pub struct ConformanceFailure(pub String);

fn ensure(condition: bool, message: impl Display) -> Result<(), ConformanceFailure> {
    if condition {
        Ok(())
    } else {
        Err(ConformanceFailure(message.to_string()))
    }
}

fn call<T>(result: Result<T, ExportError>, what: &str) -> Result<T, ConformanceFailure> {
    result.map_err(|error| ConformanceFailure(format!("{what} failed: {error}")))
}

/// Deterministic bytes that differ per `seed`, never all zero.
fn pattern(bytes: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..bytes)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state as u8) | 1
        })
        .collect()
}

/// Runs the suite described in the module documentation. The export needs room for at least
/// 8 preferred blocks plus 64 minimum blocks; smaller exports fail with a message.
pub fn check_export(export: &dyn Export) -> Result<(), ConformanceFailure> {
    let size = export.size();
    let block_size = export.block_size();
    let block = u64::from(block_size.minimum_bytes()).max(512);
    let preferred = u64::from(block_size.preferred_bytes());
    ensure(
        size >= 8 * preferred + 64 * block,
        format!("export of {size} bytes is too small for the suite"),
    )?;
    ensure(export.size() == size, "size changed between calls")?;
    ensure(
        export.block_size() == block_size,
        "block size changed between calls",
    )?;

    check_block_status(export, 0, size.min(u64::from(u32::MAX)))?;
    call(export.flush(), "flush")?;
    call(export.cache(0, block), "cache")?;
    if export.read_only() {
        return Ok(());
    }

    let read = |offset: u64, length: u64| -> Result<Vec<u8>, ConformanceFailure> {
        let mut buffer = vec![0xee; length as usize];
        call(export.read(offset, &mut buffer), "read")?;
        Ok(buffer)
    };

    // 2. Writes read back, at an offset not aligned to the preferred size, so the data
    //    straddles preferred blocks. Requests stay within the maximum payload.
    let offset = preferred + block;
    let data = pattern(preferred as usize, 1);
    call(export.write(offset, &data, false), "write")?;
    ensure(
        read(offset, preferred)? == data,
        "written data did not read back",
    )?;
    let fua_data = pattern(block as usize, 2);
    call(export.write(0, &fua_data, true), "write with FUA")?;
    ensure(read(0, block)? == fua_data, "FUA write did not read back")?;
    check_block_status(export, 0, 4 * preferred)?;

    // 3. Write-zeroes in every mode.
    for (index, may_punch_hole) in [(0u64, true), (1, false)] {
        let at = 4 * preferred + index * preferred;
        call(
            export.write(at, &pattern(preferred as usize, 3 + index), false),
            "write",
        )?;
        let options = ZeroOptions {
            fua: index == 1,
            may_punch_hole,
            fast_only: false,
        };
        call(export.write_zeroes(at, preferred, options), "write-zeroes")?;
        ensure(
            read(at, preferred)?.iter().all(|&byte| byte == 0),
            format!("write-zeroes (may_punch_hole {may_punch_hole}) did not read as zeroes"),
        )?;
        check_block_status(export, at, preferred)?;
    }
    let at = 6 * preferred;
    let before = pattern(preferred as usize, 5);
    call(export.write(at, &before, false), "write")?;
    let fast = ZeroOptions {
        fua: false,
        may_punch_hole: true,
        fast_only: true,
    };
    match export.write_zeroes(at, preferred, fast) {
        Ok(()) => ensure(
            read(at, preferred)?.iter().all(|&byte| byte == 0),
            "fast write-zeroes succeeded but did not zero",
        )?,
        Err(ExportError::FastZeroUnsupported) => ensure(
            read(at, preferred)? == before,
            "refused fast write-zeroes changed the contents",
        )?,
        Err(error) => return Err(ConformanceFailure(format!("fast write-zeroes: {error}"))),
    }

    // 4. Trim, then a write over part of the trimmed range.
    call(export.trim(preferred, 2 * preferred, false), "trim")?;
    let after_trim = pattern(block as usize, 6);
    call(
        export.write(preferred, &after_trim, false),
        "write after trim",
    )?;
    ensure(
        read(preferred, block)? == after_trim,
        "write after trim did not read back",
    )?;
    check_block_status(export, 0, 8 * preferred)?;
    call(export.flush(), "flush")?;

    // 7. Concurrent writers on disjoint blocks.
    let base = 8 * preferred;
    let threads = 4u64;
    let blocks_per_thread = 16u64;
    std::thread::scope(|scope| {
        for thread in 0..threads {
            scope.spawn(move || {
                for index in 0..blocks_per_thread {
                    let number = thread * blocks_per_thread + index;
                    let data = pattern(block as usize, 100 + number);
                    // Failures surface in the read-back check below.
                    let _ = export.write(base + number * block, &data, false);
                }
            });
        }
    });
    for number in 0..threads * blocks_per_thread {
        ensure(
            read(base + number * block, block)? == pattern(block as usize, 100 + number),
            format!("concurrent write of block {number} did not read back"),
        )?;
    }

    // 8. Cache after writes, before and after a flush.
    let written = threads * blocks_per_thread * block;
    let minimum = u64::from(block_size.minimum_bytes());
    let everything = base + written;
    let before = read(0, everything)?;
    for stage in ["after writes", "after a flush"] {
        if stage == "after a flush" {
            call(export.flush(), "flush")?;
        }
        let ranges = [
            (base, written),
            (base + minimum, 4 * block),
            (4 * preferred, 2 * preferred),
            (preferred, 2 * preferred),
            (0, everything),
        ];
        for (offset, length) in ranges {
            let length = length.min(u64::from(block_size.maximum_bytes()));
            call(
                export.cache(offset, length),
                &format!("cache of {length} bytes at {offset} {stage}"),
            )?;
        }
        ensure(
            read(0, everything)? == before,
            format!("cache {stage} changed the contents"),
        )?;
    }
    Ok(())
}

/// Block status from `offset` covers at least one byte, and extents marked zero read as
/// zeroes (checked up to the requested length).
fn check_block_status(
    export: &dyn Export,
    offset: u64,
    length: u64,
) -> Result<(), ConformanceFailure> {
    let mut extents: Vec<AllocationExtent> = Vec::new();
    call(
        export.block_status(offset, length, &mut extents),
        "block status",
    )?;
    ensure(
        extents.first().is_some_and(|extent| extent.length > 0),
        format!("block status at {offset} returned no extent covering the first byte"),
    )?;
    let end = offset + length;
    let mut position = offset;
    for extent in extents.iter().take_while(|extent| extent.length > 0) {
        if position >= end {
            break;
        }
        let checked = extent.length.min(end - position);
        if extent.zero {
            // Read in bounded pieces, and only the start of a large extent, so that a huge
            // fresh volume does not make the suite read gigabytes.
            let piece_max = u64::from(export.block_size().maximum_bytes()).min(1 << 20);
            let verified_end = position + checked.min(ZERO_CHECK_BYTES_MAX);
            let mut at = position;
            while at < verified_end {
                let piece = (verified_end - at).min(piece_max);
                let mut buffer = vec![0xee; piece as usize];
                call(export.read(at, &mut buffer), "read of a zero extent")?;
                ensure(
                    buffer.iter().all(|&byte| byte == 0),
                    format!("extent at {position} is reported zero but reads nonzero"),
                )?;
                at += piece;
            }
        }
        position += checked;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::BlockSize;
    use crate::memory::MemoryExport;

    /// A memory export with one chosen defect.
    struct Defective {
        inner: MemoryExport,
        zeroes_do_nothing: bool,
        status_claims_zero: bool,
        cache_fails_on_data: bool,
    }

    impl Export for Defective {
        fn size(&self) -> u64 {
            self.inner.size()
        }
        fn block_size(&self) -> BlockSize {
            self.inner.block_size()
        }
        fn read_only(&self) -> bool {
            false
        }
        fn flush_is_global(&self) -> bool {
            true
        }
        fn read(&self, offset: u64, buffer: &mut [u8]) -> Result<(), ExportError> {
            self.inner.read(offset, buffer)
        }
        fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError> {
            self.inner.write(offset, data, fua)
        }
        fn flush(&self) -> Result<(), ExportError> {
            Ok(())
        }
        fn trim(&self, offset: u64, length: u64, fua: bool) -> Result<(), ExportError> {
            self.inner.trim(offset, length, fua)
        }
        fn write_zeroes(
            &self,
            offset: u64,
            length: u64,
            options: ZeroOptions,
        ) -> Result<(), ExportError> {
            if self.zeroes_do_nothing {
                return Ok(());
            }
            self.inner.write_zeroes(offset, length, options)
        }
        fn block_status(
            &self,
            offset: u64,
            length: u64,
            extents: &mut Vec<AllocationExtent>,
        ) -> Result<(), ExportError> {
            if self.status_claims_zero {
                extents.push(AllocationExtent {
                    length,
                    hole: false,
                    zero: true,
                });
                return Ok(());
            }
            self.inner.block_status(offset, length, extents)
        }
        fn cache(&self, offset: u64, length: u64) -> Result<(), ExportError> {
            let mut data = vec![0; length as usize];
            self.inner.read(offset, &mut data)?;
            if self.cache_fails_on_data && data.iter().any(|&byte| byte != 0) {
                return Err(ExportError::failed("cannot cache stored data"));
            }
            Ok(())
        }
    }

    /// Goal: the suite detects broken exports, so passing it means something. Method: one
    /// memory export per defect, each must fail the suite with a message naming it.
    #[test]
    fn detects_defects() {
        let zeroes = Defective {
            inner: MemoryExport::new(16 << 20),
            zeroes_do_nothing: true,
            status_claims_zero: false,
            cache_fails_on_data: false,
        };
        let failure = check_export(&zeroes).expect_err("ignored write-zeroes");
        assert!(failure.0.contains("write-zeroes"), "{failure}");
        let status = Defective {
            inner: MemoryExport::new(16 << 20),
            zeroes_do_nothing: false,
            status_claims_zero: true,
            cache_fails_on_data: false,
        };
        let failure = check_export(&status).expect_err("lying block status");
        assert!(failure.0.contains("reported zero"), "{failure}");
        let cache = Defective {
            inner: MemoryExport::new(16 << 20),
            zeroes_do_nothing: false,
            status_claims_zero: false,
            cache_fails_on_data: true,
        };
        let failure = check_export(&cache).expect_err("cache fails on written data");
        assert!(failure.0.contains("cache of"), "{failure}");
        let tiny = MemoryExport::new(4096);
        assert!(check_export(&tiny).is_err(), "too small for the suite");
    }
}
