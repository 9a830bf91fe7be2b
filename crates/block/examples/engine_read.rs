//! Measures the engine's read path without the network: unique data written once, then read
//! back in 128 KiB requests with the content cache off, under a device profile of the read
//! planner. Usage: `engine_read DIR [GiB] [none|ssd|hdd]`.

use std::sync::Arc;
use std::time::Instant;

use onecopy_block::replicas::device::DeviceProfile;
use onecopy_block::{Engine, HintSettings, RuntimeOptions};
use onecopy_core::storage::{LocalStorage, Storage};

const REQUEST_BYTES: usize = 128 << 10;

fn main() {
    let mut arguments = std::env::args().skip(1);
    let directory = arguments
        .next()
        .expect("usage: engine_read DIR [GiB] [none|ssd|hdd]");
    let gibibytes: u64 = arguments
        .next()
        .map_or(1, |text| text.parse().expect("GiB"));
    let profile: DeviceProfile = arguments
        .next()
        .map_or(DeviceProfile::Ssd, |text| text.parse().expect("a profile"));
    let storage: Arc<dyn Storage> = Arc::new(LocalStorage::create(&directory).unwrap());
    let mut runtime = RuntimeOptions {
        content_cache_bytes: 0,
        ..RuntimeOptions::default()
    };
    runtime.replicas.device_profile = profile;
    let engine = Engine::open(storage, None, runtime).unwrap();
    let volume = engine
        .create_volume("bench", gibibytes << 30, 4096, HintSettings::none())
        .unwrap();
    let mut data = vec![0u8; 1 << 20];
    let mut state = 0x1234_5678_9abc_def1u64;
    for index in 0..(gibibytes << 10) {
        for word in data.chunks_exact_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            word.copy_from_slice(&state.to_le_bytes());
        }
        engine.write(volume.id, index << 20, &data, false).unwrap();
    }
    engine.flush().unwrap();
    let mut out = vec![0u8; REQUEST_BYTES];
    let start = Instant::now();
    for offset in (0..gibibytes << 30).step_by(REQUEST_BYTES) {
        engine.read(volume.id, offset, &mut out).unwrap();
    }
    let seconds = start.elapsed().as_secs_f64();
    println!(
        "profile {profile}: read {:.0} MB/s",
        (gibibytes << 30) as f64 / seconds / 1e6
    );
}
