//! Repository keys: one random master key, wrapped once per password by a key that Argon2id
//! derives from that password.
//!
//! ```text
//! <repository>/keys/<id>   one JSON file per password (mode 0600):
//!   { "id", "created" (unix seconds), "host", "user",
//!     "kdf": { "algorithm": "argon2id", "memory_kib", "iterations", "parallelism", "salt" },
//!     "wrapped": hex(nonce [12] | AES-256-GCM(master key [32]) | tag [16]) }
//! ```
//!
//! The wrapping's associated data is `"onecopy key" | id`, so a wrapped key moved to another
//! key file does not open. Changing a password writes a new key file and removes the old one;
//! the master key, and so every sealed file, stays the same. Keys the master key derives
//! (BLAKE3 `derive_key`, one context string per purpose) never touch the disk.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use crate::storage::sealed::SealingKey;
use crate::storage::{read_all, write_atomically, LocalStorage, Storage};
use crate::{Error, Result};

/// The directory of a repository that holds its keys.
pub const KEYS_DIRECTORY: &str = "keys";
const MASTER_KEY_BYTES: usize = 32;
const TAG_BYTES: usize = 16;
const WRAPPED_BYTES: usize = NONCE_LEN + MASTER_KEY_BYTES + TAG_BYTES;
const SALT_BYTES: usize = 32;
const KEY_ID_BYTES: usize = 8;

/// The secret every other key of a repository derives from.
pub struct MasterKey(Zeroizing<[u8; MASTER_KEY_BYTES]>);

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MasterKey(..)")
    }
}

impl MasterKey {
    /// A new random master key.
    pub fn generate() -> Result<MasterKey> {
        let mut bytes = Zeroizing::new([0u8; MASTER_KEY_BYTES]);
        random(&mut *bytes)?;
        Ok(MasterKey(bytes))
    }

    /// The key that seals the files of one face (`face` names it, e.g. "backup").
    pub fn sealing_key(&self, face: &str) -> SealingKey {
        let context = format!("onecopy 2026-11-25 sealed storage of face {face}");
        let derived = Zeroizing::new(blake3::derive_key(&context, &*self.0));
        SealingKey::from_bytes(&derived)
    }
}

/// Argon2id's cost parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KdfCost {
    pub memory_kib: u32,
    pub iterations: u32,
    pub parallelism: u32,
}

impl Default for KdfCost {
    /// RFC 9106's second recommended choice: 64 MiB, 3 passes, 4 lanes. The lanes run on
    /// separate threads, so every core a machine has shortens an unlock without making a
    /// guess any cheaper for an attacker; its time per unlock is in docs/BENCHMARKS.md
    /// ("Encryption").
    fn default() -> KdfCost {
        KdfCost {
            memory_kib: 64 * 1024,
            iterations: 3,
            parallelism: 4,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct KdfRecord {
    algorithm: String,
    #[serde(flatten)]
    cost: KdfCost,
    salt: String,
}

/// One key file: the master key wrapped for one password.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyFile {
    pub id: String,
    pub created: u64,
    pub host: String,
    pub user: String,
    kdf: KdfRecord,
    wrapped: String,
}

/// The keys of one repository.
#[derive(Debug)]
pub struct KeyRing {
    storage: Arc<dyn Storage>,
    directory: PathBuf,
}

impl KeyRing {
    /// The key ring in `<repository>/keys` (created when missing, mode 0700).
    pub fn open(repository: &Path) -> Result<KeyRing> {
        let directory = repository.join(KEYS_DIRECTORY);
        Ok(KeyRing {
            storage: Arc::new(LocalStorage::create(&directory)?),
            directory,
        })
    }

    /// Where the keys live, for messages.
    pub fn directory(&self) -> &Path {
        &self.directory
    }

    /// Every key file, oldest first. A file that is not a key file is corrupt.
    pub fn list(&self) -> Result<Vec<KeyFile>> {
        let mut keys = Vec::new();
        for name in self.storage.list("")? {
            if name.ends_with(".tmp") {
                continue;
            }
            let bytes = read_all(&*self.storage, &name)?;
            let key: KeyFile = serde_json::from_slice(&bytes).map_err(|error| {
                Error::corrupt(
                    format!("key file {}", self.directory.join(&name).display()),
                    error.to_string(),
                )
            })?;
            keys.push(key);
        }
        keys.sort_by(|a, b| (a.created, &a.id).cmp(&(b.created, &b.id)));
        Ok(keys)
    }

    /// Wraps `master` for `password` in a new key file; returns it.
    pub fn add(&self, master: &MasterKey, password: &str, cost: KdfCost) -> Result<KeyFile> {
        if password.is_empty() {
            return Err(Error::InvalidArgument(
                "an empty password protects nothing; choose another".to_string(),
            ));
        }
        let mut id_bytes = [0u8; KEY_ID_BYTES];
        random(&mut id_bytes)?;
        let id = hex(&id_bytes);
        let mut salt = [0u8; SALT_BYTES];
        random(&mut salt)?;
        let wrapping = derive(password, &salt, cost)?;
        let mut nonce = [0u8; NONCE_LEN];
        random(&mut nonce)?;
        let mut sealed = Zeroizing::new(master.0.to_vec());
        let tag = wrapping
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(associated_data(&id)),
                &mut sealed,
            )
            .expect("sealing the master key");
        let mut wrapped = nonce.to_vec();
        wrapped.extend_from_slice(&sealed);
        wrapped.extend_from_slice(tag.as_ref());
        let key = KeyFile {
            id: id.clone(),
            created: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |elapsed| elapsed.as_secs()),
            host: host_name(),
            user: std::env::var("USER").unwrap_or_default(),
            kdf: KdfRecord {
                algorithm: "argon2id".to_string(),
                cost,
                salt: hex(&salt),
            },
            wrapped: hex(&wrapped),
        };
        let json = serde_json::to_vec_pretty(&key).expect("key files serialise");
        write_atomically(&*self.storage, &id, &json)?;
        Ok(key)
    }

    /// The master key, from the first key file `password` opens, and that key file.
    pub fn unlock(&self, password: &str) -> Result<(MasterKey, KeyFile)> {
        let keys = self.list()?;
        if keys.is_empty() {
            return Err(Error::NotFound(format!(
                "a key in {} (the repository is encrypted but has no key: restore the \
                 directory from a copy)",
                self.directory.display()
            )));
        }
        for key in keys {
            if let Some(master) = self.open_key(&key, password)? {
                return Ok((master, key));
            }
        }
        Err(Error::WrongPassword {
            keys: self.directory.display().to_string(),
        })
    }

    fn open_key(&self, key: &KeyFile, password: &str) -> Result<Option<MasterKey>> {
        let what = || format!("key file {}", self.directory.join(&key.id).display());
        let salt = unhex(&key.kdf.salt).ok_or_else(|| Error::corrupt(what(), "salt is not hex"))?;
        let wrapped =
            unhex(&key.wrapped).ok_or_else(|| Error::corrupt(what(), "wrapped key is not hex"))?;
        if key.kdf.algorithm != "argon2id" || wrapped.len() != WRAPPED_BYTES {
            return Err(Error::corrupt(
                what(),
                format!(
                    "unknown key derivation {:?} or a wrapped key of {} bytes",
                    key.kdf.algorithm,
                    wrapped.len()
                ),
            ));
        }
        let wrapping = derive(password, &salt, key.kdf.cost)?;
        let nonce: [u8; NONCE_LEN] = wrapped[..NONCE_LEN].try_into().expect("nonce");
        let mut sealed = Zeroizing::new(wrapped[NONCE_LEN..].to_vec());
        let opened = wrapping.open_in_place(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(associated_data(&key.id)),
            &mut sealed,
        );
        Ok(opened.ok().map(|bytes| {
            let mut master = Zeroizing::new([0u8; MASTER_KEY_BYTES]);
            master.copy_from_slice(bytes);
            MasterKey(master)
        }))
    }

    /// Removes key `id`; refuses to remove the last one (nothing could open the repository).
    pub fn remove(&self, id: &str) -> Result<()> {
        let keys = self.list()?;
        if !keys.iter().any(|key| key.id == id) {
            return Err(Error::NotFound(format!(
                "key {id} in {}",
                self.directory.display()
            )));
        }
        if keys.len() == 1 {
            return Err(Error::InvalidArgument(format!(
                "key {id} is the repository's only key; add another first (`onecopy key add`)"
            )));
        }
        self.storage.remove(id)?;
        self.storage.sync_directory("")
    }
}

fn associated_data(id: &str) -> Vec<u8> {
    let mut aad = b"onecopy key ".to_vec();
    aad.extend_from_slice(id.as_bytes());
    aad
}

fn derive(password: &str, salt: &[u8], cost: KdfCost) -> Result<LessSafeKey> {
    let parameters =
        argon2::Params::new(cost.memory_kib, cost.iterations, cost.parallelism, Some(32))
            .map_err(|error| Error::InvalidArgument(format!("Argon2id parameters: {error}")))?;
    let argon2 = argon2::Argon2::new(
        argon2::Algorithm::Argon2id,
        argon2::Version::V0x13,
        parameters,
    );
    let mut key = Zeroizing::new([0u8; 32]);
    let mut memory = KdfMemory::new(cost.memory_kib)?;
    argon2
        .hash_password_into_with_memory(password.as_bytes(), salt, &mut *key, memory.blocks())
        .map_err(|error| {
            Error::InvalidArgument(format!("deriving a key from the password: {error}"))
        })?;
    Ok(LessSafeKey::new(
        UnboundKey::new(&AES_256_GCM, &*key).expect("a 32-byte key"),
    ))
}

/// The memory of one derivation: anonymous pages in transparent huge pages where the kernel
/// has them, because faulting in 64 MiB of 4 KiB pages costs about as much as half the
/// derivation's own work (docs/BENCHMARKS.md, "Encryption (A/B)"). Unmapping it on drop hands
/// the pages back to the kernel, which clears them before anyone else sees them.
struct KdfMemory {
    mapping: *mut libc::c_void,
    mapped_bytes: usize,
    blocks: *mut argon2::Block,
    block_count: usize,
}

impl KdfMemory {
    const HUGE_PAGE: usize = 2 << 20;

    fn new(memory_kib: u32) -> Result<KdfMemory> {
        const _: () = assert!(std::mem::size_of::<argon2::Block>() == 1024);
        let block_count = memory_kib as usize;
        let bytes = block_count * std::mem::size_of::<argon2::Block>();
        let mapped_bytes = bytes + KdfMemory::HUGE_PAGE;
        // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
        let mapping = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped_bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if mapping == libc::MAP_FAILED {
            return Err(Error::io(
                "mapping the memory of the password's key derivation",
                std::io::Error::last_os_error(),
            ));
        }
        let start = (mapping as usize).next_multiple_of(KdfMemory::HUGE_PAGE);
        // SAFETY: [start, start + bytes) lies inside the mapping (it has a huge page to
        // spare). The advice is a hint: without huge pages the derivation is only slower.
        unsafe { libc::madvise(start as *mut libc::c_void, bytes, libc::MADV_HUGEPAGE) };
        Ok(KdfMemory {
            mapping,
            mapped_bytes,
            blocks: start as *mut argon2::Block,
            block_count,
        })
    }

    fn blocks(&mut self) -> &mut [argon2::Block] {
        // SAFETY: the range is mapped, aligned far beyond a block's alignment and zeroed by
        // the kernel (all-zero bytes are a valid block), and `&mut self` makes the slice the
        // only reference to it.
        unsafe { std::slice::from_raw_parts_mut(self.blocks, self.block_count) }
    }
}

impl Drop for KdfMemory {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once; no slice of it outlives `self`.
        unsafe { libc::munmap(self.mapping, self.mapped_bytes) };
    }
}

fn random(out: &mut [u8]) -> Result<()> {
    SystemRandom::new().fill(out).map_err(|_| {
        Error::io(
            "drawing random bytes for a key",
            std::io::Error::other("the system random number generator failed"),
        )
    })
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_string())
        .unwrap_or_default()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(text.get(at..at + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Cheap parameters: the tests check wrapping, not Argon2id's cost.
    const CHEAP: KdfCost = KdfCost {
        memory_kib: 64,
        iterations: 1,
        parallelism: 1,
    };

    /// Goal: a master key wrapped for two passwords opens with either, not with a third;
    /// removing keys keeps at least one. Method: add, unlock, remove on a temporary directory.
    #[test]
    fn keys_open_with_their_passwords_only() {
        let directory = tempfile::tempdir().unwrap();
        let ring = KeyRing::open(directory.path()).unwrap();
        let master = MasterKey::generate().unwrap();
        let first = ring.add(&master, "one", CHEAP).unwrap();
        let second = ring.add(&master, "two", CHEAP).unwrap();
        for password in ["one", "two"] {
            let (opened, _) = ring.unlock(password).unwrap();
            assert_eq!(*opened.0, *master.0);
        }
        assert!(matches!(
            ring.unlock("three").unwrap_err(),
            Error::WrongPassword { .. }
        ));
        ring.remove(&first.id).unwrap();
        assert!(ring.unlock("one").is_err());
        let error = ring.remove(&second.id).unwrap_err();
        assert!(error.to_string().contains("only key"), "{error}");
        assert!(ring.add(&master, "", CHEAP).is_err());
    }

    /// Goal: a key file whose wrapped key is changed, or moved under another id, does not
    /// open. Method: edit the JSON of a key file.
    #[test]
    fn changed_key_files_do_not_open() {
        let directory = tempfile::tempdir().unwrap();
        let ring = KeyRing::open(directory.path()).unwrap();
        let master = MasterKey::generate().unwrap();
        let key = ring.add(&master, "secret", CHEAP).unwrap();
        let path = directory.path().join(KEYS_DIRECTORY).join(&key.id);
        let mut changed = key.clone();
        let mut wrapped = unhex(&key.wrapped).unwrap();
        wrapped[NONCE_LEN + 3] ^= 1;
        changed.wrapped = hex(&wrapped);
        std::fs::write(&path, serde_json::to_vec(&changed).unwrap()).unwrap();
        assert!(matches!(
            ring.unlock("secret").unwrap_err(),
            Error::WrongPassword { .. }
        ));
        let mut moved = key.clone();
        moved.id = "0000000000000000".to_string();
        std::fs::write(&path, serde_json::to_vec(&moved).unwrap()).unwrap();
        assert!(ring.unlock("secret").is_err());
    }
}
