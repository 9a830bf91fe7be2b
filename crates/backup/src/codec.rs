//! The binary records of the backup store (recipes, segments, containers, trees): the core's
//! little-endian fields ([`onecopy_core::bytes`]), then a CRC-32C of the bytes before it,
//! checked by [`Decoder::new_checked`] before any field is read.

use onecopy_core::bytes::{u32_at, ByteReader, ByteWriter};
use onecopy_core::fingerprint::{Fingerprint, FINGERPRINT_BYTES};

use crate::error::{BackupError, Result};

/// Appends fields to a record ([`ByteWriter`]), then its checksum.
#[derive(Default)]
pub(crate) struct Encoder {
    writer: ByteWriter,
}

impl Encoder {
    pub fn with_capacity(capacity: usize) -> Self {
        Encoder {
            writer: ByteWriter::with_capacity(capacity),
        }
    }
    /// Appends bytes as they are (a magic number).
    pub fn raw(&mut self, value: &[u8]) {
        self.writer.bytes(value);
    }
    pub fn u8(&mut self, value: u8) {
        self.writer.u8(value);
    }
    pub fn u32(&mut self, value: u32) {
        self.writer.u32(value);
    }
    pub fn u64(&mut self, value: u64) {
        self.writer.u64(value);
    }
    pub fn i64(&mut self, value: i64) {
        self.writer.i64(value);
    }
    pub fn fingerprint(&mut self, value: &Fingerprint) {
        self.writer.bytes(&value.0);
    }
    /// An unsigned LEB128 integer ([`ByteWriter::varint`]).
    pub fn varint(&mut self, value: u64) {
        self.writer.varint(value);
    }
    /// A length-prefixed byte string.
    pub fn blob(&mut self, value: &[u8]) {
        self.u32(u32::try_from(value.len()).expect("blobs are under 4 GiB"));
        self.writer.bytes(value);
    }
    /// Bytes so far.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.writer.len()
    }
    /// Appends the CRC-32C of everything so far and returns the record.
    pub fn finish(mut self) -> Vec<u8> {
        let checksum = crc32c::crc32c(self.writer.as_slice());
        self.u32(checksum);
        self.writer.into_bytes()
    }
}

/// Reads fields ([`ByteReader`]); every read fails with a [`BackupError::Corrupt`] naming
/// the record.
pub(crate) struct Decoder<'a> {
    reader: ByteReader<'a>,
    what: &'a str,
}

impl<'a> Decoder<'a> {
    /// Checks the trailing CRC-32C of `bytes` and reads the fields before it.
    pub fn new_checked(bytes: &'a [u8], what: &'a str) -> Result<Self> {
        if bytes.len() < 4 {
            return Err(BackupError::corrupt(what, "too short"));
        }
        let (body, tail) = bytes.split_at(bytes.len() - 4);
        let stored = u32_at(tail, 0);
        if crc32c::crc32c(body) != stored {
            return Err(BackupError::corrupt(what, "checksum mismatch"));
        }
        Ok(Decoder {
            reader: ByteReader::new(body),
            what,
        })
    }

    fn truncated<T>(&self, field: Option<T>) -> Result<T> {
        field.ok_or_else(|| BackupError::corrupt(self.what, "truncated"))
    }
    fn take(&mut self, count: usize) -> Result<&'a [u8]> {
        let field = self.reader.take(count);
        self.truncated(field)
    }
    pub fn u8(&mut self) -> Result<u8> {
        let field = self.reader.u8();
        self.truncated(field)
    }
    pub fn u32(&mut self) -> Result<u32> {
        let field = self.reader.u32();
        self.truncated(field)
    }
    pub fn u64(&mut self) -> Result<u64> {
        let field = self.reader.u64();
        self.truncated(field)
    }
    pub fn i64(&mut self) -> Result<i64> {
        let field = self.reader.i64();
        self.truncated(field)
    }
    pub fn fingerprint(&mut self) -> Result<Fingerprint> {
        Ok(Fingerprint(
            self.take(FINGERPRINT_BYTES)?.try_into().expect("32"),
        ))
    }
    /// An integer written by [`Encoder::varint`]; rejects forms that are truncated or do not
    /// fit a `u64` (more than 10 bytes, or bits past the 64th).
    pub fn varint(&mut self) -> Result<u64> {
        match self.reader.varint() {
            Some(value) => Ok(value),
            None => self.invalid("integer truncated, longer than 10 bytes or past 64 bits"),
        }
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
        if self.reader.is_empty() {
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
            assert_eq!(encoder.len(), length, "{value}");
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
            encoder.raw(bytes);
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
