//! Volumes as NBD exports: the bridge between [`onecopy_nbd`] and the [`Engine`].

use std::sync::Arc;

use onecopy_core::Error;
use onecopy_nbd::{
    AllocationExtent, BlockSize, Export, ExportCatalog, ExportError, ExportInfo, WriteRequest,
    ZeroOptions,
};

use crate::engine::Engine;
use crate::error::BlockError;
use crate::volume::VolumeId;

/// Largest request payload advertised: the protocol's recommended maximum.
const REQUEST_BYTES_MAX: u32 = 32 << 20;

/// Every volume of an engine, by name.
pub struct EngineExports {
    engine: Arc<Engine>,
}

impl EngineExports {
    /// Exports for the volumes of `engine`.
    pub fn new(engine: Arc<Engine>) -> EngineExports {
        EngineExports { engine }
    }
}

impl ExportCatalog for EngineExports {
    fn list(&self) -> Vec<ExportInfo> {
        self.engine
            .volumes()
            .into_iter()
            .map(|volume| ExportInfo {
                description: format!(
                    "onecopy volume, {}, {}-byte blocks",
                    onecopy_core::units::format_size(volume.size_bytes),
                    volume.block_bytes
                ),
                name: volume.name,
            })
            .collect()
    }

    fn open(&self, name: &str) -> Option<Arc<dyn Export>> {
        let volume = self.engine.volume(name).ok()?;
        Some(Arc::new(VolumeExport {
            engine: Arc::clone(&self.engine),
            volume: volume.id,
            size: volume.size_bytes,
            block_bytes: volume.block_bytes,
        }))
    }
}

/// One volume as an NBD export.
pub struct VolumeExport {
    engine: Arc<Engine>,
    volume: VolumeId,
    size: u64,
    block_bytes: u32,
}

/// The export error for an engine error: I/O errors keep their source, so that a full disk
/// (ENOSPC, EDQUOT, EFBIG) reaches the client as ENOSPC, as does a limit of the store.
fn export_error(error: BlockError) -> ExportError {
    match error {
        BlockError::Core(Error::Io { context, source }) => ExportError::io(context, source),
        BlockError::Block {
            volume,
            block,
            source: Error::Io { context, source },
        } => ExportError::io(
            format!("block {block} of volume {volume}: {context}"),
            source,
        ),
        BlockError::Core(Error::Limit(context)) => ExportError::NoSpace { context },
        other => ExportError::failed(other),
    }
}

impl Export for VolumeExport {
    fn size(&self) -> u64 {
        self.size
    }

    fn block_size(&self) -> BlockSize {
        // Any alignment works (partial blocks are read, merged and written back), but whole
        // blocks avoid that work, so they are the preferred size.
        BlockSize::new(1, self.block_bytes, REQUEST_BYTES_MAX).expect("valid constraints")
    }

    fn read_only(&self) -> bool {
        // A device opened read-only (a disk too full to commit recovery) says so to clients.
        self.engine.mode() == crate::engine::OpenMode::ReadOnly
    }

    fn flush_is_global(&self) -> bool {
        // One journal for the whole engine: a flush covers every connection's writes.
        true
    }

    fn read(&self, offset: u64, buffer: &mut [u8]) -> Result<(), ExportError> {
        self.engine
            .read(self.volume, offset, buffer)
            .map_err(export_error)
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError> {
        self.engine
            .write(self.volume, offset, data, fua)
            .map_err(export_error)
    }

    fn write_batch(&self, writes: &[WriteRequest<'_>], results: &mut Vec<Result<(), ExportError>>) {
        let mut engine_results = Vec::with_capacity(writes.len());
        self.engine
            .write_batch(self.volume, writes, &mut engine_results);
        results.extend(
            engine_results
                .into_iter()
                .map(|result| result.map_err(export_error)),
        );
    }

    fn flush(&self) -> Result<(), ExportError> {
        self.engine.flush().map_err(export_error)
    }

    fn trim(&self, offset: u64, length: u64, fua: bool) -> Result<(), ExportError> {
        self.engine
            .trim(self.volume, offset, length, fua)
            .map_err(export_error)
    }

    fn write_zeroes(
        &self,
        offset: u64,
        length: u64,
        options: ZeroOptions,
    ) -> Result<(), ExportError> {
        // Zeroing whole blocks only drops map entries, and at most two partial blocks are
        // rewritten, so it is always faster than writing: fast-zero requests are honoured.
        self.engine
            .write_zeroes(self.volume, offset, length, options.fua)
            .map_err(export_error)
    }

    fn block_status(
        &self,
        offset: u64,
        length: u64,
        extents: &mut Vec<AllocationExtent>,
    ) -> Result<(), ExportError> {
        let found = self
            .engine
            .block_status(self.volume, offset, length)
            .map_err(export_error)?;
        extents.extend(found);
        Ok(())
    }

    fn cache(&self, offset: u64, length: u64) -> Result<(), ExportError> {
        self.engine
            .cache(self.volume, offset, length)
            .map_err(export_error)
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::Arc;

    use onecopy_nbd::protocol;

    use super::*;

    /// Goal: engine errors reach NBD clients with the errno they mean: a full disk is ENOSPC
    /// whether or not the error names a block, a store limit is ENOSPC, a failed engine and
    /// a damaged block are EIO. Method: map one error of each kind.
    #[test]
    fn engine_errors_keep_their_errno() {
        let full = || io::Error::from_raw_os_error(libc::ENOSPC);
        let cases = [
            (
                BlockError::from(Error::io("appending", full())),
                protocol::ENOSPC,
            ),
            (
                BlockError::Block {
                    volume: "disk".into(),
                    block: 3,
                    source: Error::io("appending", full()),
                },
                protocol::ENOSPC,
            ),
            (
                BlockError::from(Error::Limit("chunk ids".into())),
                protocol::ENOSPC,
            ),
            (
                BlockError::EngineFailed {
                    reason: Arc::from("a journal append failed"),
                },
                protocol::EIO,
            ),
            (
                BlockError::Block {
                    volume: "disk".into(),
                    block: 3,
                    source: Error::corrupt("data", "lost"),
                },
                protocol::EIO,
            ),
        ];
        for (error, errno) in cases {
            let text = error.to_string();
            assert_eq!(export_error(error).errno(), errno, "{text}");
        }
    }
}
