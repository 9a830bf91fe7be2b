//! Fingerprints: names of chunks derived from their content.
//!
//! A [`Fingerprint`] is always 32 bytes; algorithms with shorter digests (MD5, SHA-1, xxh3-128)
//! fill the leading bytes and leave the rest zero, so one fixed-size key type serves every
//! index. BLAKE3-256 is the default. xxh3-128 and CRC-32C are *weak* fingerprints (paper 5
//! §3.5): fast but not collision resistant, so a match must be confirmed by comparing the
//! chunk's bytes with the stored chunk before it is trusted ([`FingerprintAlgorithm::is_weak`]).
//!
//! CRC-32C is paper 5's truly weak hash: 32 bits, so distinct chunks collide often enough
//! that the chunk store chains every chunk sharing one (`chunk_store::chains`). Its
//! fingerprint spreads the 32 bits over the first 16 bytes with two bijective mixers, because
//! the index, its filter and its cache take their hash bits from those bytes and need them
//! uniform; two fingerprints are equal exactly when the CRCs are.
//!
//! Many small chunks are fingerprinted faster together than one by one:
//! [`FingerprintAlgorithm::hash_batch`] spreads BLAKE3 over 16 AVX-512 lanes across inputs
//! ([`blake3_lanes`]; docs/BENCHMARKS.md gives the speeds), and
//! [`FingerprintAlgorithm::hash_batch_parallel`] adds the rayon pool (both cores).
//!
//! A [`Fingerprinter`] is an algorithm as a store uses it: an encrypted store keys its BLAKE3
//! with a secret derived from its sealing key, so that its fingerprints say nothing about
//! content to anyone without the key (no guess of a file can be confirmed by hashing it).

pub mod blake3_lanes;

use std::fmt;
use std::str::FromStr;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use zeroize::Zeroizing;

use crate::{Error, Result};

/// Bytes in every [`Fingerprint`], whatever the algorithm.
pub const FINGERPRINT_BYTES: usize = 32;

/// Input bytes per task of [`FingerprintAlgorithm::hash_batch_parallel`]: large enough that
/// scheduling a task (about a microsecond) costs little next to hashing it.
pub const PARALLEL_GROUP_BYTES: usize = 256 << 10;

/// The content name of a chunk or segment.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Fingerprint(pub [u8; FINGERPRINT_BYTES]);

impl Fingerprint {
    /// The fingerprint of nothing: used as "no fingerprint" in fixed-size records.
    pub const ZERO: Fingerprint = Fingerprint([0; FINGERPRINT_BYTES]);

    /// The first eight bytes as an integer. Fingerprints are uniformly distributed, so this is
    /// a good hash for tables and filters (no need to hash a hash again).
    #[inline]
    pub fn prefix_u64(&self) -> u64 {
        u64::from_le_bytes(self.0[..8].try_into().expect("8 bytes"))
    }

    /// The bytes as lowercase hexadecimal.
    pub fn to_hex(&self) -> String {
        let mut text = String::with_capacity(FINGERPRINT_BYTES * 2);
        for byte in self.0 {
            text.push_str(&format!("{byte:02x}"));
        }
        text
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", &self.to_hex()[..16])
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// A fingerprint function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum FingerprintAlgorithm {
    /// BLAKE3 with a 256-bit digest: the default, cryptographic and fastest on this hardware.
    #[default]
    Blake3,
    /// SHA-256 (uses SHA-NI where the CPU has it).
    Sha256,
    /// SHA-1, as paper 2's prototype uses.
    Sha1,
    /// MD5, as paper 1's prototype and the FIU traces use.
    Md5,
    /// xxh3-128: a weak fingerprint whose matches must be confirmed byte by byte (paper 5).
    Xxh3,
    /// CRC-32C: paper 5's 32-bit weak hash; collisions are expected and resolved by comparing
    /// bytes along a chain of the chunks sharing it.
    Crc32c,
}

impl FingerprintAlgorithm {
    /// Every algorithm, for tests and `--help` text.
    pub const ALL: [FingerprintAlgorithm; 6] = [
        FingerprintAlgorithm::Blake3,
        FingerprintAlgorithm::Sha256,
        FingerprintAlgorithm::Sha1,
        FingerprintAlgorithm::Md5,
        FingerprintAlgorithm::Xxh3,
        FingerprintAlgorithm::Crc32c,
    ];

    /// Bytes of the [`Fingerprint`] the algorithm fills (the rest is zero). CRC-32C fills 16
    /// bytes with a spread of its 32 bits.
    pub fn digest_bytes(self) -> usize {
        match self {
            FingerprintAlgorithm::Blake3 | FingerprintAlgorithm::Sha256 => 32,
            FingerprintAlgorithm::Sha1 => 20,
            FingerprintAlgorithm::Md5
            | FingerprintAlgorithm::Xxh3
            | FingerprintAlgorithm::Crc32c => 16,
        }
    }

    /// Bits of information in a fingerprint: what decides how often distinct chunks collide.
    pub fn strength_bits(self) -> u32 {
        match self {
            FingerprintAlgorithm::Crc32c => 32,
            other => other.digest_bytes() as u32 * 8,
        }
    }

    /// True when equal fingerprints do not prove equal content, so a match must be confirmed
    /// by comparing bytes with the stored chunk. Weak fingerprints fill at most 16 bytes.
    pub fn is_weak(self) -> bool {
        matches!(
            self,
            FingerprintAlgorithm::Xxh3 | FingerprintAlgorithm::Crc32c
        )
    }

    /// The fingerprint of `data`.
    pub fn hash(self, data: &[u8]) -> Fingerprint {
        let mut out = [0u8; FINGERPRINT_BYTES];
        match self {
            FingerprintAlgorithm::Blake3 => out.copy_from_slice(blake3::hash(data).as_bytes()),
            FingerprintAlgorithm::Sha256 => {
                use sha2::Digest;
                out.copy_from_slice(&sha2::Sha256::digest(data));
            }
            FingerprintAlgorithm::Sha1 => {
                use sha1::Digest;
                out[..20].copy_from_slice(&sha1::Sha1::digest(data));
            }
            FingerprintAlgorithm::Md5 => {
                use md5::Digest;
                out[..16].copy_from_slice(&md5::Md5::digest(data));
            }
            FingerprintAlgorithm::Xxh3 => {
                let digest = xxhash_rust::xxh3::xxh3_128(data);
                out[..16].copy_from_slice(&digest.to_le_bytes());
            }
            FingerprintAlgorithm::Crc32c => return crc32c_fingerprint(crc32c::crc32c(data)),
        }
        Fingerprint(out)
    }

    /// Fingerprints many independent inputs on the calling thread; `out[i]` receives the
    /// fingerprint of `inputs[i]`, exactly as [`hash`](Self::hash) gives it. For BLAKE3 on a
    /// CPU with AVX-512, the 1 KiB chunks of inputs between 1 KiB and 16 KiB are compressed 16 at
    /// a time across SIMD lanes ([`blake3_lanes`]), which is several times faster than hashing
    /// 4 KiB inputs one by one.
    pub fn hash_batch(self, inputs: &[&[u8]], out: &mut [Fingerprint]) {
        assert_eq!(inputs.len(), out.len(), "one output per input");
        if self == FingerprintAlgorithm::Blake3 {
            blake3_lanes::hash_batch(None, inputs, out);
            return;
        }
        for (input, slot) in inputs.iter().zip(out.iter_mut()) {
            *slot = self.hash(input);
        }
    }

    /// Like [`hash_batch`](Self::hash_batch), on every thread of the rayon pool (both cores
    /// here). Inputs are split into groups of about [`PARALLEL_GROUP_BYTES`] so that small
    /// inputs do not drown in scheduling costs.
    pub fn hash_batch_parallel(self, inputs: &[&[u8]], out: &mut [Fingerprint]) {
        assert_eq!(inputs.len(), out.len(), "one output per input");
        let total_bytes: usize = inputs.iter().map(|input| input.len()).sum();
        let average_bytes = total_bytes / inputs.len().max(1);
        let group_len = (PARALLEL_GROUP_BYTES / average_bytes.max(1)).clamp(1, inputs.len().max(1));
        inputs
            .par_chunks(group_len)
            .zip(out.par_chunks_mut(group_len))
            .for_each(|(inputs, out)| self.hash_batch(inputs, out));
    }

    /// The name used on the command line and in stored configuration.
    pub fn name(self) -> &'static str {
        match self {
            FingerprintAlgorithm::Blake3 => "blake3",
            FingerprintAlgorithm::Sha256 => "sha256",
            FingerprintAlgorithm::Sha1 => "sha1",
            FingerprintAlgorithm::Md5 => "md5",
            FingerprintAlgorithm::Xxh3 => "xxh3",
            FingerprintAlgorithm::Crc32c => "crc32c",
        }
    }
}

/// The fingerprint of a chunk whose CRC-32C is `crc`: bytes 0..8 and 8..16 are two bijective
/// mixes of it (the finaliser of MurmurHash3, on two different injections of the 32 bits into
/// 64), so they look uniform and independent to the index, while equal fingerprints still mean
/// equal CRCs.
pub fn crc32c_fingerprint(crc: u32) -> Fingerprint {
    let mut out = [0u8; FINGERPRINT_BYTES];
    out[..8].copy_from_slice(&mix64(u64::from(crc)).to_le_bytes());
    out[8..16].copy_from_slice(&mix64(u64::from(crc) << 32 | 0x5bd1_e995).to_le_bytes());
    Fingerprint(out)
}

/// A bijection of u64 whose every output bit depends on every input bit.
fn mix64(mut value: u64) -> u64 {
    value ^= value >> 33;
    value = value.wrapping_mul(0xff51_afd7_ed55_8ccd);
    value ^= value >> 33;
    value = value.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    value ^ (value >> 33)
}

impl fmt::Display for FingerprintAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A fingerprint function as a store uses it: an algorithm and, for an encrypted store, the
/// key of its keyed BLAKE3.
#[derive(Clone)]
pub struct Fingerprinter {
    algorithm: FingerprintAlgorithm,
    key: Option<Zeroizing<[u8; 32]>>,
}

impl fmt::Debug for Fingerprinter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fingerprinter")
            .field("algorithm", &self.algorithm)
            .field("keyed", &self.key.is_some())
            .finish()
    }
}

impl Fingerprinter {
    /// `algorithm` unkeyed.
    pub fn unkeyed(algorithm: FingerprintAlgorithm) -> Fingerprinter {
        Fingerprinter {
            algorithm,
            key: None,
        }
    }

    /// `algorithm` keyed with `key` when one is given. Only BLAKE3 has a keyed mode.
    pub fn new(
        algorithm: FingerprintAlgorithm,
        key: Option<Zeroizing<[u8; 32]>>,
    ) -> Result<Fingerprinter> {
        if key.is_some() && algorithm != FingerprintAlgorithm::Blake3 {
            return Err(Error::InvalidArgument(format!(
                "fingerprint {} has no keyed mode; an encrypted store fingerprints with keyed \
                 blake3",
                algorithm.name()
            )));
        }
        Ok(Fingerprinter { algorithm, key })
    }

    pub fn algorithm(&self) -> FingerprintAlgorithm {
        self.algorithm
    }

    pub fn is_keyed(&self) -> bool {
        self.key.is_some()
    }

    /// The fingerprint of `data`.
    pub fn hash(&self, data: &[u8]) -> Fingerprint {
        match &self.key {
            None => self.algorithm.hash(data),
            Some(key) => Fingerprint(*blake3::keyed_hash(key, data).as_bytes()),
        }
    }

    /// Fingerprints many independent inputs on the calling thread, as
    /// [`FingerprintAlgorithm::hash_batch`] does (keyed inputs take the same SIMD lanes).
    pub fn hash_batch(&self, inputs: &[&[u8]], out: &mut [Fingerprint]) {
        match &self.key {
            None => self.algorithm.hash_batch(inputs, out),
            Some(key) => {
                assert_eq!(inputs.len(), out.len(), "one output per input");
                blake3_lanes::hash_batch(Some(key), inputs, out);
            }
        }
    }
}

impl FromStr for FingerprintAlgorithm {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        FingerprintAlgorithm::ALL
            .into_iter()
            .find(|algorithm| algorithm.name().eq_ignore_ascii_case(text))
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "unknown fingerprint {text:?}; choose blake3, sha256, sha1, md5, xxh3 or crc32c"
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a keyed fingerprinter computes BLAKE3's keyed hash, one input or a batch at a
    /// time, differs from the unkeyed one, and exists for BLAKE3 only; method: the official
    /// test vector for the empty input, then 4 KiB blocks against `blake3::keyed_hash`.
    #[test]
    fn keyed_fingerprints() {
        let key = Zeroizing::new(*b"whats the Elvish word for friend");
        let keyed =
            Fingerprinter::new(FingerprintAlgorithm::Blake3, Some(key.clone())).expect("blake3");
        assert_eq!(
            keyed.hash(b"").to_hex(),
            "92b2b75604ed3c761f9d6f62392c8a9227ad0ea3f09573e783f1498a4ed60d26"
        );
        let blocks: Vec<Vec<u8>> = (0..40u8).map(|seed| vec![seed; 4096]).collect();
        let inputs: Vec<&[u8]> = blocks.iter().map(Vec::as_slice).collect();
        let mut out = vec![Fingerprint::ZERO; inputs.len()];
        keyed.hash_batch(&inputs, &mut out);
        let plain = Fingerprinter::unkeyed(FingerprintAlgorithm::Blake3);
        for (input, fingerprint) in inputs.iter().zip(&out) {
            assert_eq!(fingerprint.0, *blake3::keyed_hash(&key, input).as_bytes());
            assert_eq!(*fingerprint, keyed.hash(input));
            assert_ne!(*fingerprint, plain.hash(input));
        }
        assert!(Fingerprinter::new(FingerprintAlgorithm::Sha256, Some(key)).is_err());
    }

    /// Goal: each algorithm matches a published test vector for "abc" and pads with zeros.
    #[test]
    fn known_answers() {
        let abc = b"abc";
        assert!(FingerprintAlgorithm::Sha256
            .hash(abc)
            .to_hex()
            .starts_with("ba7816bf8f01cfea414140de5dae2223"));
        assert!(FingerprintAlgorithm::Sha1
            .hash(abc)
            .to_hex()
            .starts_with("a9993e364706816aba3e25717850c26c9cd0d89d000000"));
        assert!(FingerprintAlgorithm::Md5
            .hash(abc)
            .to_hex()
            .starts_with("900150983cd24fb0d6963f7d28e17f72000000"));
        assert!(FingerprintAlgorithm::Blake3
            .hash(abc)
            .to_hex()
            .starts_with("6437b3ac38465133ffb63b75273a8db5"));
        for algorithm in FingerprintAlgorithm::ALL {
            let fingerprint = algorithm.hash(abc);
            assert!(fingerprint.0[algorithm.digest_bytes()..]
                .iter()
                .all(|&b| b == 0));
            assert_eq!(
                algorithm.name().parse::<FingerprintAlgorithm>().unwrap(),
                algorithm
            );
            assert!(!algorithm.is_weak() || algorithm.digest_bytes() <= 16);
        }
    }

    /// Goal: a CRC-32C fingerprint is equal exactly when the CRCs are, and carries the CRC
    /// of the data ("123456789" has the published check value 0xe3069283). Method: compare
    /// with the crc32c crate and with neighbouring CRCs.
    #[test]
    fn crc32c_fingerprint_spreads_the_crc() {
        let algorithm = FingerprintAlgorithm::Crc32c;
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(
            algorithm.hash(b"123456789"),
            crc32c_fingerprint(0xe306_9283)
        );
        assert_eq!(algorithm.strength_bits(), 32);
        let fingerprints: std::collections::HashSet<Fingerprint> =
            (0..4096u32).map(crc32c_fingerprint).collect();
        assert_eq!(
            fingerprints.len(),
            4096,
            "distinct CRCs, distinct fingerprints"
        );
        // Neighbouring CRCs differ in about half the bits of both halves.
        let (a, b) = (crc32c_fingerprint(1), crc32c_fingerprint(2));
        let differing = (a.prefix_u64() ^ b.prefix_u64()).count_ones();
        assert!((16..=48).contains(&differing), "{differing} bits differ");
        assert!(a.0[16..].iter().all(|&byte| byte == 0));
    }
}
