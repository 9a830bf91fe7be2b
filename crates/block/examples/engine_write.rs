//! Measures the engine's write path without the network: sequential 1 MiB writes of unique
//! data into a volume on a local directory. Usage: `engine_write DIR [GiB]`.

use std::sync::Arc;
use std::time::Instant;

use onecopy_block::{Engine, HintSettings, RuntimeOptions};
use onecopy_core::storage::{LocalStorage, Storage};

fn main() {
    let mut arguments = std::env::args().skip(1);
    let directory = arguments.next().expect("usage: engine_write DIR [GiB]");
    let gibibytes: u64 = arguments
        .next()
        .map_or(2, |text| text.parse().expect("GiB"));
    let storage: Arc<dyn Storage> = Arc::new(LocalStorage::create(&directory).unwrap());
    let engine = Engine::open(storage, None, RuntimeOptions::default()).unwrap();
    let volume = engine
        .create_volume(
            "bench",
            (gibibytes + 1) << 30,
            4096,
            HintSettings::default(),
        )
        .unwrap();
    let mut data = vec![0u8; 1 << 20];
    let mut state = 0x1234_5678_9abc_def1u64;
    let start = Instant::now();
    let mut last = Instant::now();
    for index in 0..(gibibytes << 10) {
        for word in data.chunks_exact_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            word.copy_from_slice(&state.to_le_bytes());
        }
        engine.write(volume.id, index << 20, &data, false).unwrap();
        if index % 256 == 255 {
            let seconds = last.elapsed().as_secs_f64();
            println!("{} MiB: {:.0} MB/s", index + 1, 256.0 * 1.048576 / seconds);
            last = Instant::now();
        }
    }
    engine.flush().unwrap();
    let seconds = start.elapsed().as_secs_f64();
    println!("total {:.0} MB/s", (gibibytes << 30) as f64 / seconds / 1e6);
    println!(
        "{}",
        serde_json::to_string_pretty(&engine.stats().requests).unwrap()
    );
}
