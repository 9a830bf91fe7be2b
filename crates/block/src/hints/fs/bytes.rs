//! Bounds-checked reads of little- and big-endian integers from untrusted bytes.
//!
//! Every parser in this module reads through these helpers, so a field that lies past the end
//! of a buffer yields `None` instead of a panic.

/// Reads a little-endian `u16` at `offset`, or `None` when the buffer is too short.
pub(crate) fn le16(bytes: &[u8], offset: usize) -> Option<u16> {
    let field = bytes.get(offset..offset.checked_add(2)?)?;
    Some(u16::from_le_bytes([field[0], field[1]]))
}

/// Reads a little-endian `u32` at `offset`, or `None` when the buffer is too short.
pub(crate) fn le32(bytes: &[u8], offset: usize) -> Option<u32> {
    let field = bytes.get(offset..offset.checked_add(4)?)?;
    Some(u32::from_le_bytes([field[0], field[1], field[2], field[3]]))
}

/// Reads a big-endian `u16` at `offset`, or `None` when the buffer is too short.
pub(crate) fn be16(bytes: &[u8], offset: usize) -> Option<u16> {
    let field = bytes.get(offset..offset.checked_add(2)?)?;
    Some(u16::from_be_bytes([field[0], field[1]]))
}

/// Reads a big-endian `u32` at `offset`, or `None` when the buffer is too short.
pub(crate) fn be32(bytes: &[u8], offset: usize) -> Option<u32> {
    let field = bytes.get(offset..offset.checked_add(4)?)?;
    Some(u32::from_be_bytes([field[0], field[1], field[2], field[3]]))
}

/// Reads a big-endian `u64` at `offset`, or `None` when the buffer is too short.
pub(crate) fn be64(bytes: &[u8], offset: usize) -> Option<u64> {
    let field = bytes.get(offset..offset.checked_add(8)?)?;
    let mut array = [0u8; 8];
    array.copy_from_slice(field);
    Some(u64::from_be_bytes(array))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: integer readers decode both byte orders and refuse reads past the end.
    #[test]
    fn readers_decode_and_refuse_short_buffers() {
        let bytes = [0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08];
        assert_eq!(le16(&bytes, 0), Some(0x0201));
        assert_eq!(be16(&bytes, 0), Some(0x0102));
        assert_eq!(le32(&bytes, 4), Some(0x0807_0605));
        assert_eq!(be32(&bytes, 4), Some(0x0506_0708));
        assert_eq!(be64(&bytes, 0), Some(0x0102_0304_0506_0708));
        assert_eq!(le32(&bytes, 5), None);
        assert_eq!(be64(&bytes, 1), None);
        assert_eq!(le16(&bytes, usize::MAX), None);
    }
}
