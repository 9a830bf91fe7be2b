//! Properties every chunker must have: sizes within bounds, determinism, averages near the
//! configured ones, resynchronisation after an insertion, and streaming equal to in-memory.

use std::io::{self, Read};

use proptest::prelude::*;

use super::{ChunkReader, ChunkerSpec, SliceChunks};

/// Pseudo-random bytes from a seed (splitmix64), so tests need no stored data.
pub(crate) fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed;
    let mut bytes = Vec::with_capacity(len + 8);
    while bytes.len() < len {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut mixed = state;
        mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        bytes.extend_from_slice(&(mixed ^ (mixed >> 31)).to_le_bytes());
    }
    bytes.truncate(len);
    bytes
}

/// (offset, length, ends_segment) of every chunk of `data`.
fn cuts(spec: &ChunkerSpec, data: &[u8]) -> Vec<(u64, usize, bool)> {
    SliceChunks::new(spec.build(), data)
        .map(|chunk| (chunk.offset, chunk.data.len(), chunk.ends_segment))
        .collect()
}

fn spec(text: &str) -> ChunkerSpec {
    text.parse().unwrap()
}

/// Goal: chunks tile the input and respect min/max (all but the last chunk), and the same
/// input gives the same chunks; method: chunk random data with every kind of chunker.
#[test]
fn sizes_within_bounds_and_deterministic() {
    let data = random_bytes(1, 3 << 20);
    for (text, min, max) in [
        ("fixed:4096", 4096, 4096),
        ("fastcdc:8192", 2048, 32768),
        ("fastcdc:1024/4096/8192", 1024, 8192),
        ("rabin:8192", 4096, 16384),
        ("rabin:100/1024/3000", 100, 3000),
        ("segment:256KiB/4KiB", 1, 8192),
        ("segment-gear:256KiB/4KiB", 1, 8192),
    ] {
        let spec = spec(text);
        let chunks = cuts(&spec, &data);
        assert_eq!(chunks, cuts(&spec, &data), "{text} is not deterministic");
        let mut expected_offset = 0u64;
        for (index, &(offset, len, _)) in chunks.iter().enumerate() {
            assert_eq!(
                offset, expected_offset,
                "{text}: chunks must tile the input"
            );
            expected_offset += len as u64;
            assert!(len <= max, "{text}: chunk of {len} bytes");
            if index + 1 < chunks.len() {
                assert!(len >= min, "{text}: chunk of {len} bytes");
            }
        }
        assert_eq!(expected_offset, data.len() as u64);
    }
}

/// Goal: on random data the average chunk (and segment) size is within 20% of the configured
/// average; method: chunk 16 MiB of random bytes and divide.
#[test]
fn averages_near_configured() {
    let data = random_bytes(2, 16 << 20);
    for (text, average) in [
        ("fastcdc:8192", 8192.0),
        ("fastcdc:1024", 1024.0),
        ("fastcdc:64KiB", 65536.0),
        ("rabin:8192", 8192.0),
        ("rabin:1024", 1024.0),
        ("segment:256KiB/4KiB", 4096.0),
        ("segment-gear:256KiB/4KiB", 4096.0),
    ] {
        let chunks = cuts(&spec(text), &data);
        let measured = data.len() as f64 / chunks.len() as f64;
        assert!(
            (measured / average - 1.0).abs() < 0.2,
            "{text}: average chunk {measured:.0} bytes"
        );
    }
    for text in ["segment:256KiB/4KiB", "segment-gear:256KiB/4KiB"] {
        let segments = cuts(&spec(text), &data)
            .iter()
            .filter(|&&(_, _, ends_segment)| ends_segment)
            .count();
        let measured = data.len() as f64 / segments as f64;
        assert!(
            (measured / 262144.0 - 1.0).abs() < 0.2,
            "{text}: average segment {measured:.0} bytes"
        );
    }
}

/// Goal: segments are runs of whole chunks within the segment min/max and the last chunk ends
/// a segment; method: sum chunk lengths between `ends_segment` flags on random data.
#[test]
fn segments_within_bounds() {
    let data = random_bytes(3, 8 << 20);
    for text in ["segment:256KiB/4KiB", "segment-gear:256KiB/4KiB"] {
        let chunks = cuts(&spec(text), &data);
        assert!(chunks.last().unwrap().2, "the stream's end ends a segment");
        let mut segment_bytes = 0;
        let mut segments = Vec::new();
        for (_, len, ends_segment) in chunks {
            segment_bytes += len;
            if ends_segment {
                segments.push(segment_bytes);
                segment_bytes = 0;
            }
        }
        let (last, whole) = segments.split_last().unwrap();
        assert!(*last <= 512 << 10);
        for &bytes in whole {
            assert!(
                (128 << 10..=512 << 10).contains(&bytes),
                "{text}: segment of {bytes} bytes"
            );
        }
    }
}

/// Goal: a maximum-size segment cut truncates the current chunk at exactly the segment maximum;
/// method: zero bytes never match the pattern, so every segment is cut at its maximum.
#[test]
fn zero_data_cuts_segments_at_maximum() {
    let data = vec![0u8; 3 << 20];
    let chunks = cuts(&spec("segment:256KiB/4KiB"), &data);
    let mut segment_bytes = 0;
    for (_, len, ends_segment) in chunks {
        segment_bytes += len;
        if ends_segment {
            assert_eq!(segment_bytes, 512 << 10);
            segment_bytes = 0;
        }
    }
}

/// A reader that returns at most the next of a cycle of read sizes per call.
struct ChoppyReader<'a> {
    data: &'a [u8],
    sizes: Vec<usize>,
    calls: usize,
}

impl Read for ChoppyReader<'_> {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        let limit = self.sizes[self.calls % self.sizes.len()];
        self.calls += 1;
        let len = limit.min(buffer.len()).min(self.data.len());
        buffer[..len].copy_from_slice(&self.data[..len]);
        self.data = &self.data[len..];
        Ok(len)
    }
}

const PROPERTY_SPECS: [&str; 7] = [
    "fixed:512",
    "fixed:4096",
    "fastcdc:1024",
    "rabin:1024",
    "rabin:256/1024/2048",
    "segment:16KiB/1KiB",
    "segment-gear:16KiB/1KiB",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Goal: streaming gives exactly the in-memory chunks whatever the read sizes and buffer;
    /// method: random data, read sizes and buffer sizes for every chunker.
    #[test]
    fn streaming_equals_in_memory(
        seed in any::<u64>(),
        len in 0usize..300_000,
        read_sizes in prop::collection::vec(1usize..70_000, 1..8),
        spec_index in 0..PROPERTY_SPECS.len(),
        buffer_extra in 0usize..100_000,
    ) {
        let spec = spec(PROPERTY_SPECS[spec_index]);
        let data = random_bytes(seed, len);
        let expected = cuts(&spec, &data);
        let reader = ChoppyReader { data: &data, sizes: read_sizes, calls: 0 };
        let chunker = spec.build();
        let buffer_bytes = chunker.chunk_bytes_max() + buffer_extra;
        let mut stream = ChunkReader::with_buffer_bytes(reader, chunker, buffer_bytes);
        let mut streamed = Vec::new();
        while let Some(chunk) = stream.next_chunk().unwrap() {
            let offset = chunk.offset as usize;
            prop_assert_eq!(chunk.data, &data[offset..offset + chunk.data.len()]);
            streamed.push((chunk.offset, chunk.data.len(), chunk.ends_segment));
        }
        prop_assert_eq!(streamed, expected);
    }

    /// Goal: content-defined chunkers resynchronise after an insertion: all chunks that start
    /// well past the insertion are the old chunks shifted; method: insert random bytes near
    /// the start of a random buffer and compare the chunk lists' common suffix.
    #[test]
    fn insertion_changes_only_nearby_chunks(
        seed in any::<u64>(),
        position in 0usize..8192,
        inserted in prop::collection::vec(any::<u8>(), 1..200),
        spec_index in 2..PROPERTY_SPECS.len(),
    ) {
        let spec = spec(PROPERTY_SPECS[spec_index]);
        // Segments reach 32 KiB and must resynchronise too, so allow a few of them.
        let resync_bytes_limit = 128 << 10;
        let old = random_bytes(seed, 512 << 10);
        let mut new = old[..position].to_vec();
        new.extend_from_slice(&inserted);
        new.extend_from_slice(&old[position..]);
        let shift = inserted.len() as u64;
        let old_cuts = cuts(&spec, &old);
        let new_cuts = cuts(&spec, &new);
        // Chunks ending before the insertion are unchanged.
        let before = old_cuts.iter().take_while(|cut| cut.0 + cut.1 as u64 <= position as u64).count();
        prop_assert_eq!(&old_cuts[..before], &new_cuts[..before]);
        // Every chunk of the new stream starting past the limit is an old chunk, shifted.
        let old_set: std::collections::HashSet<_> = old_cuts.iter().map(|&(offset, len, ends)| (offset + shift, len, ends)).collect();
        for cut in new_cuts.iter().filter(|cut| cut.0 >= (position + resync_bytes_limit) as u64) {
            prop_assert!(old_set.contains(cut), "{} did not resynchronise: {:?}", spec, cut);
        }
    }
}
