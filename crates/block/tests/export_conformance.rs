//! The block device's own NBD export ([`EngineExports`] and its volumes) through the NBD
//! crate's conformance suite for exports, which includes CACHE after writes and after a flush.

use std::sync::Arc;

use onecopy_block::export::EngineExports;
use onecopy_block::{Engine, HintSettings, RuntimeOptions};
use onecopy_core::storage::{SimulatedStorage, Storage};
use onecopy_nbd::conformance::check_export;
use onecopy_nbd::ExportCatalog;

fn engine(content_cache_bytes: u64) -> Arc<Engine> {
    let runtime = RuntimeOptions {
        content_cache_bytes,
        // Small limits so that checkpoints happen while the suite runs.
        checkpoint_journal_bytes: 64 << 10,
        checkpoint_dirty_pages: 64,
        ..RuntimeOptions::default()
    };
    let storage: Arc<dyn Storage> = Arc::new(SimulatedStorage::new());
    Engine::open(storage, None, runtime).expect("engine opens")
}

/// Goal: every volume export of the engine passes the export conformance suite, whatever
/// holds the data a CACHE request names (the content cache, the open container's buffer, or
/// container files). Method: volumes of 4096- and 512-byte blocks on engines with the content
/// cache off, small, and large; run `check_export` on the export the catalog opens.
#[test]
fn volume_exports_pass_the_conformance_suite() {
    for content_cache_bytes in [0, 64 << 10, 64 << 20] {
        let engine = engine(content_cache_bytes);
        for (name, block_bytes) in [("four-k", 4096), ("sectors", 512)] {
            engine
                .create_volume(name, 64 << 20, block_bytes, HintSettings::default())
                .expect("volume created");
        }
        let catalog = EngineExports::new(Arc::clone(&engine));
        assert_eq!(catalog.list().len(), 2);
        for name in ["four-k", "sectors"] {
            let export = catalog.open(name).expect("the volume is exported");
            if let Err(failure) = check_export(export.as_ref()) {
                panic!("volume {name}, content cache {content_cache_bytes} bytes: {failure}");
            }
        }
        engine.shutdown().expect("clean shutdown");
    }
}
