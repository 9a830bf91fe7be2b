//! Little-endian encoding helpers for the binary records (recipes, segments, containers,
//! trees). Every binary record ends with a CRC-32C of the bytes before it, checked by
//! [`Decoder::new_checked`] before any field is read.

use onecopy_core::fingerprint::{Fingerprint, FINGERPRINT_BYTES};

use crate::error::{BackupError, Result};

/// Appends fields to a byte vector.
#[derive(Default)]
pub(crate) struct Encoder {
    pub bytes: Vec<u8>,
}

impl Encoder {
    pub fn with_capacity(capacity: usize) -> Self {
        Encoder {
            bytes: Vec::with_capacity(capacity),
        }
    }
    pub fn u8(&mut self, value: u8) {
        self.bytes.push(value);
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
    pub fn fingerprint(&mut self, value: &Fingerprint) {
        self.bytes.extend_from_slice(&value.0);
    }
    /// An unsigned LEB128 integer: 7 bits per byte, low bits first, the high bit set on every
    /// byte but the last (1 byte below 128, at most 10).
    pub fn varint(&mut self, mut value: u64) {
        while value >= 0x80 {
            self.bytes.push(value as u8 | 0x80);
            value >>= 7;
        }
        self.bytes.push(value as u8);
    }
    /// A length-prefixed byte string.
    pub fn blob(&mut self, value: &[u8]) {
        self.u32(u32::try_from(value.len()).expect("blobs are under 4 GiB"));
        self.bytes.extend_from_slice(value);
    }
    /// Appends the CRC-32C of everything so far and returns the record.
    pub fn finish(mut self) -> Vec<u8> {
        let checksum = crc32c::crc32c(&self.bytes);
        self.u32(checksum);
        self.bytes
    }
}

/// Reads fields; every read fails with a [`BackupError::Corrupt`] naming the record.
pub(crate) struct Decoder<'a> {
    bytes: &'a [u8],
    position: usize,
    what: &'a str,
}

impl<'a> Decoder<'a> {
    /// Checks the trailing CRC-32C of `bytes` and reads the fields before it.
    pub fn new_checked(bytes: &'a [u8], what: &'a str) -> Result<Self> {
        if bytes.len() < 4 {
            return Err(BackupError::corrupt(what, "too short"));
        }
        let (body, tail) = bytes.split_at(bytes.len() - 4);
        let stored = u32::from_le_bytes(tail.try_into().expect("4 bytes"));
        if crc32c::crc32c(body) != stored {
            return Err(BackupError::corrupt(what, "checksum mismatch"));
        }
        Ok(Decoder {
            bytes: body,
            position: 0,
            what,
        })
    }

    fn take(&mut self, count: usize) -> Result<&'a [u8]> {
        let end = self
            .position
            .checked_add(count)
            .filter(|&end| end <= self.bytes.len())
            .ok_or_else(|| BackupError::corrupt(self.what, "truncated"))?;
        let slice = &self.bytes[self.position..end];
        self.position = end;
        Ok(slice)
    }
    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    pub fn i64(&mut self) -> Result<i64> {
        Ok(i64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    pub fn fingerprint(&mut self) -> Result<Fingerprint> {
        Ok(Fingerprint(
            self.take(FINGERPRINT_BYTES)?.try_into().expect("32"),
        ))
    }
    /// An integer written by [`Encoder::varint`]; rejects forms that do not fit a
    /// `u64` (more than 10 bytes, or bits past the 64th).
    pub fn varint(&mut self) -> Result<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.u8()?;
            let bits = u64::from(byte & 0x7f);
            if shift == 63 && bits > 1 {
                return self.invalid("integer overflows 64 bits");
            }
            value |= bits << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        self.invalid("integer longer than 10 bytes")
    }
    /// A [`varint`](Self::varint) that must fit 32 bits.
    pub fn varint_u32(&mut self) -> Result<u32> {
        let value = self.varint()?;
        u32::try_from(value).or_else(|_| self.invalid(format!("{value} does not fit 32 bits")))
    }
    pub fn blob(&mut self) -> Result<&'a [u8]> {
        let length = self.u32()? as usize;
        self.take(length)
    }
    /// Fails unless every byte was read.
    pub fn finish(self) -> Result<()> {
        if self.position == self.bytes.len() {
            Ok(())
        } else {
            Err(BackupError::corrupt(self.what, "trailing bytes"))
        }
    }
    /// Fails with a corrupt-record error about `detail`.
    pub fn invalid<T>(&self, detail: impl Into<String>) -> Result<T> {
        Err(BackupError::corrupt(self.what, detail))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: fields round-trip and any flipped byte is caught by the checksum.
    #[test]
    fn round_trip_and_corruption() {
        let mut encoder = Encoder::default();
        encoder.u8(7);
        encoder.u64(1 << 40);
        encoder.blob(b"name");
        let mut bytes = encoder.finish();
        let mut decoder = Decoder::new_checked(&bytes, "test").unwrap();
        assert_eq!(decoder.u8().unwrap(), 7);
        assert_eq!(decoder.u64().unwrap(), 1 << 40);
        assert_eq!(decoder.blob().unwrap(), b"name");
        decoder.finish().unwrap();
        bytes[3] ^= 1;
        assert!(Decoder::new_checked(&bytes, "test").is_err());
    }

    /// Goal: integers of every width round-trip through the variable-length form in the
    /// fewest bytes, and malformed forms are errors, not wrong values.
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
            let mut encoder = Encoder::default();
            encoder.varint(value);
            assert_eq!(encoder.bytes.len(), length, "{value}");
            let bytes = encoder.finish();
            let mut decoder = Decoder::new_checked(&bytes, "test").unwrap();
            assert_eq!(decoder.varint().unwrap(), value);
            decoder.finish().unwrap();
        }
        let malformed: [&[u8]; 3] = [
            &[0x80],                                                       // truncated
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02], // past 64 bits
            &[
                0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00,
            ], // 11 bytes
        ];
        for bytes in malformed {
            let mut encoder = Encoder::default();
            encoder.bytes.extend_from_slice(bytes);
            let record = encoder.finish();
            let mut decoder = Decoder::new_checked(&record, "test").unwrap();
            assert!(decoder.varint().is_err(), "{bytes:?}");
        }
        let mut encoder = Encoder::default();
        encoder.varint(1 << 32);
        let record = encoder.finish();
        assert!(Decoder::new_checked(&record, "test")
            .unwrap()
            .varint_u32()
            .is_err());
    }
}
