//! Little-endian byte codecs: how every on-disk format of onecopy reads and writes its
//! integers (container headers, the page store's manifest, chunk-store records and changes,
//! the journal, the fingerprint index, the backup store's records).
//!
//! - [`ByteReader`] reads fields in order from a slice. A slice too short for the field, or a
//!   malformed variable-length integer, reads as `None`: the caller knows what it was decoding
//!   and names it in its error.
//! - [`ByteWriter`] appends the same fields to a vector.
//! - [`u16_at`], [`u32_at`], [`u64_at`] read a field at a fixed offset of a record whose
//!   length the caller has already checked; a short slice there is a programmer error and
//!   panics.
//! - [`le16`], [`le32`], [`le64`], [`be16`], [`be32`], [`be64`] read a field at an offset of
//!   bytes onecopy did not write (the file systems the block device's hints parse, in either
//!   byte order): a field past the end reads as `None`, never as a panic.
//!
//! Variable-length integers ([`ByteWriter::varint`]) are unsigned LEB128: seven bits per
//! byte, low bits first, the high bit set on every byte but the last (one byte below 128, at
//! most ten).
//!
//! Not provided: checksums (each format places its own CRC-32C), signed variable-length
//! integers, and the NBD protocol's big-endian fields (the nbd crate knows nothing of the
//! engine and does not depend on it).

/// Reads little-endian fields in order from a byte slice; a short slice reads as `None`.
#[derive(Clone, Debug)]
pub struct ByteReader<'a> {
    bytes: &'a [u8],
}

impl<'a> ByteReader<'a> {
    /// A reader at the start of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        ByteReader { bytes }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.bytes.len()
    }

    /// True when every byte was read.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The next `count` bytes.
    pub fn take(&mut self, count: usize) -> Option<&'a [u8]> {
        if self.bytes.len() < count {
            return None;
        }
        let (head, tail) = self.bytes.split_at(count);
        self.bytes = tail;
        Some(head)
    }

    /// The next `N` bytes as an array.
    pub fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    pub fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }

    pub fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.array()?))
    }

    pub fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.array()?))
    }

    pub fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.array()?))
    }

    pub fn i64(&mut self) -> Option<i64> {
        Some(i64::from_le_bytes(self.array()?))
    }

    /// An integer written by [`ByteWriter::varint`]; `None` when it is truncated, longer than
    /// ten bytes, or has bits past the 64th.
    pub fn varint(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.u8()?;
            let bits = u64::from(byte & 0x7f);
            if shift == 63 && bits > 1 {
                return None;
            }
            value |= bits << shift;
            if byte & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }
}

/// Appends little-endian fields to a byte vector, the counterpart of [`ByteReader`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ByteWriter {
    bytes: Vec<u8>,
}

impl ByteWriter {
    /// An empty writer with room for `capacity` bytes.
    pub fn with_capacity(capacity: usize) -> Self {
        ByteWriter {
            bytes: Vec::with_capacity(capacity),
        }
    }

    /// The bytes written so far.
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// True when nothing was written.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The bytes written.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    /// Appends raw bytes.
    pub fn bytes(&mut self, value: &[u8]) {
        self.bytes.extend_from_slice(value);
    }

    pub fn u8(&mut self, value: u8) {
        self.bytes.push(value);
    }

    pub fn u16(&mut self, value: u16) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }

    pub fn u32(&mut self, value: u32) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }

    pub fn u64(&mut self, value: u64) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }

    pub fn i64(&mut self, value: i64) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }

    /// An unsigned LEB128 integer (see the module documentation).
    pub fn varint(&mut self, mut value: u64) {
        while value >= 0x80 {
            self.bytes.push(value as u8 | 0x80);
            value >>= 7;
        }
        self.bytes.push(value as u8);
    }
}

/// The `u16` at byte `at` of `bytes`. Panics when `bytes` is too short: the caller checks a
/// record's length before reading its fields.
#[inline]
pub fn u16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(bytes[at..at + 2].try_into().expect("2 bytes"))
}

/// The `u32` at byte `at` of `bytes` (see [`u16_at`]).
#[inline]
pub fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

/// The `u64` at byte `at` of `bytes` (see [`u16_at`]).
#[inline]
pub fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// The `N` bytes at `at`, or `None` when `bytes` ends before them.
#[inline]
fn field<const N: usize>(bytes: &[u8], at: usize) -> Option<[u8; N]> {
    bytes.get(at..at.checked_add(N)?)?.try_into().ok()
}

/// The little-endian `u16` at `at`, or `None` when `bytes` is too short.
pub fn le16(bytes: &[u8], at: usize) -> Option<u16> {
    field(bytes, at).map(u16::from_le_bytes)
}

/// The little-endian `u32` at `at`, or `None` when `bytes` is too short.
pub fn le32(bytes: &[u8], at: usize) -> Option<u32> {
    field(bytes, at).map(u32::from_le_bytes)
}

/// The little-endian `u64` at `at`, or `None` when `bytes` is too short.
pub fn le64(bytes: &[u8], at: usize) -> Option<u64> {
    field(bytes, at).map(u64::from_le_bytes)
}

/// The big-endian `u16` at `at`, or `None` when `bytes` is too short.
pub fn be16(bytes: &[u8], at: usize) -> Option<u16> {
    field(bytes, at).map(u16::from_be_bytes)
}

/// The big-endian `u32` at `at`, or `None` when `bytes` is too short.
pub fn be32(bytes: &[u8], at: usize) -> Option<u32> {
    field(bytes, at).map(u32::from_be_bytes)
}

/// The big-endian `u64` at `at`, or `None` when `bytes` is too short.
pub fn be64(bytes: &[u8], at: usize) -> Option<u64> {
    field(bytes, at).map(u64::from_be_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: every field written reads back in order, and a short slice reads as `None`
    /// without consuming anything. Method: write one of each, read them, then read past the
    /// end.
    #[test]
    fn fields_round_trip() {
        let mut writer = ByteWriter::default();
        writer.u8(7);
        writer.u16(0xbeef);
        writer.u32(0xdead_beef);
        writer.u64(1 << 40);
        writer.i64(-5);
        writer.varint(300);
        writer.bytes(b"xyz");
        let bytes = writer.into_bytes();
        assert_eq!(u16_at(&bytes, 1), 0xbeef);
        assert_eq!(u32_at(&bytes, 3), 0xdead_beef);
        assert_eq!(u64_at(&bytes, 7), 1 << 40);
        let mut reader = ByteReader::new(&bytes);
        assert_eq!(reader.u8(), Some(7));
        assert_eq!(reader.u16(), Some(0xbeef));
        assert_eq!(reader.u32(), Some(0xdead_beef));
        assert_eq!(reader.u64(), Some(1 << 40));
        assert_eq!(reader.i64(), Some(-5));
        assert_eq!(reader.varint(), Some(300));
        assert_eq!(reader.remaining(), 3);
        assert_eq!(reader.u32(), None, "three bytes are not a u32");
        assert_eq!(reader.take(3), Some(&b"xyz"[..]));
        assert!(reader.is_empty());
    }

    /// Goal: the checked readers decode both byte orders and refuse reads past the end,
    /// even at offsets near `usize::MAX`. Method: known bytes, then short reads.
    #[test]
    fn checked_fields_in_both_orders() {
        let bytes = [0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08];
        assert_eq!(le16(&bytes, 0), Some(0x0201));
        assert_eq!(be16(&bytes, 0), Some(0x0102));
        assert_eq!(le32(&bytes, 4), Some(0x0807_0605));
        assert_eq!(be32(&bytes, 4), Some(0x0506_0708));
        assert_eq!(le64(&bytes, 0), Some(0x0807_0605_0403_0201));
        assert_eq!(be64(&bytes, 0), Some(0x0102_0304_0506_0708));
        assert_eq!(le32(&bytes, 5), None);
        assert_eq!(be64(&bytes, 1), None);
        assert_eq!(le16(&bytes, usize::MAX), None);
    }

    /// Goal: variable-length integers of every width take the fewest bytes and malformed
    /// forms read as `None`, never as a wrong value. Method: boundary values and three
    /// malformed encodings.
    #[test]
    fn varints() {
        let values = [
            0,
            1,
            127,
            128,
            16_383,
            16_384,
            u32::MAX as u64,
            1 << 56,
            u64::MAX,
        ];
        let lengths = [1, 1, 1, 2, 2, 3, 5, 9, 10];
        for (&value, &length) in values.iter().zip(&lengths) {
            let mut writer = ByteWriter::default();
            writer.varint(value);
            assert_eq!(writer.len(), length, "{value}");
            let mut reader = ByteReader::new(writer.as_slice());
            assert_eq!(reader.varint(), Some(value));
            assert!(reader.is_empty());
        }
        let malformed: [&[u8]; 3] = [
            &[0x80],                                                       // truncated
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02], // past 64 bits
            &[
                0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00,
            ], // 11 bytes
        ];
        for bytes in malformed {
            assert_eq!(ByteReader::new(bytes).varint(), None, "{bytes:?}");
        }
    }
}
