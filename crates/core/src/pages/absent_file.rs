//! A stand-in for a missing file of a store opened read-only.

use crate::storage::{Storage, StorageFile};
use crate::{Error, Result};

/// A file of a store opened read-only that does not exist: empty, and any read of it is
/// damage, as a read past the end of any file is.
#[derive(Debug)]
pub(super) struct AbsentFile {
    name: String,
    described: String,
}

impl AbsentFile {
    pub(super) fn new(name: &str, storage: &dyn Storage) -> AbsentFile {
        AbsentFile {
            name: name.to_string(),
            described: format!("{name} in {}", storage.describe()),
        }
    }

    pub(super) fn refused(&self) -> Error {
        Error::InvalidArgument(format!(
            "{} does not exist and the store is open read-only",
            self.described
        ))
    }
}

impl StorageFile for AbsentFile {
    fn len(&self) -> Result<u64> {
        Ok(0)
    }

    fn read_at(&self, offset: u64, buffer: &mut [u8]) -> Result<()> {
        if buffer.is_empty() {
            return Ok(());
        }
        Err(Error::corrupt(
            format!("file {}", self.described),
            format!(
                "{} bytes at offset {offset} are missing: the file does not exist",
                buffer.len()
            ),
        ))
    }

    fn write_at(&self, _offset: u64, _data: &[u8]) -> Result<()> {
        Err(self.refused())
    }

    fn set_len(&self, _length: u64) -> Result<()> {
        Err(self.refused())
    }

    fn sync_data(&self) -> Result<()> {
        Ok(())
    }

    fn name(&self) -> &str {
        &self.name
    }
}
