//! `onecopy init`: create a repository, or accept the one already there.
//!
//! Running `init` on an existing repository of this format succeeds and changes nothing, so
//! that setup scripts (and the README's first command) can run twice. What cannot be
//! honoured is refused: another format, `--flash` for a block device created without it, or
//! `--insecure-no-encryption` for a repository created encrypted (and the other way round).
//!
//! The backup store is encrypted unless `--insecure-no-encryption` is given. Its first key is
//! made here when a password is given (`--password-file`, `ONECOPY_PASSWORD`); otherwise the
//! first command that uses the backup store asks for one.

use clap::Args;

use onecopy_block::{BlockConfig, Engine, RuntimeOptions};
use onecopy_core::fingerprint::FingerprintAlgorithm;
use onecopy_core::keys::KeyRing;
use onecopy_core::repository::{Encryption, Repository};

use crate::Cli;

#[derive(Args, Debug)]
pub struct InitArgs {
    #[command(flatten)]
    pub repository: crate::RepositoryArgs,
    #[command(flatten)]
    pub password: crate::keys::PasswordArgs,
    /// Store the backup store's files unencrypted (anyone who can read the repository's files
    /// can read the backups).
    #[arg(long)]
    pub insecure_no_encryption: bool,
    /// Flash mode for the block device (paper 5): weak fingerprints confirmed by
    /// comparing bytes, which suits media with cheap random reads.
    #[arg(long)]
    pub flash: bool,
    /// The weak fingerprint of flash mode: `xxh3` (128 bits) or `crc32c` (paper 5's 32-bit
    /// hash; chunks sharing one are chained and told apart by their bytes).
    #[arg(long, requires = "flash", default_value = "xxh3", value_parser = parse_weak_fingerprint)]
    pub flash_fingerprint: FingerprintAlgorithm,
}

fn parse_weak_fingerprint(text: &str) -> Result<FingerprintAlgorithm, String> {
    let algorithm: FingerprintAlgorithm = text.parse().map_err(|error| format!("{error}"))?;
    if !algorithm.is_weak() {
        return Err(format!(
            "{algorithm} is not a weak fingerprint; flash mode uses xxh3 or crc32c"
        ));
    }
    Ok(algorithm)
}

pub fn run(cli: &Cli, args: &InitArgs) -> anyhow::Result<()> {
    let path = cli.repository_path();
    let encryption = if args.insecure_no_encryption {
        Encryption::None
    } else {
        Encryption::Aes256Gcm
    };
    let (repository, created) = match Repository::init_with(&path, encryption) {
        Ok(repository) => (repository, true),
        // Opening checks the format, so a repository this onecopy cannot use is an error.
        Err(onecopy_core::Error::AlreadyExists(_)) => (Repository::open(&path)?, false),
        Err(error) => return Err(error.into()),
    };
    match (repository.config().encryption, encryption) {
        (Encryption::Aes256Gcm, Encryption::None) => anyhow::bail!(
            "repository {} exists and is encrypted; --insecure-no-encryption applies only to a \
             new repository",
            path.display()
        ),
        (Encryption::None, Encryption::Aes256Gcm) => anyhow::bail!(
            "repository {} exists unencrypted (made with --insecure-no-encryption); pass that \
             flag to use it, or choose another directory for an encrypted repository",
            path.display()
        ),
        _ => {}
    }
    let password_given =
        cli.password_file().is_some() || std::env::var_os("ONECOPY_PASSWORD").is_some();
    if encryption == Encryption::Aes256Gcm && password_given {
        let _lock = repository.lock_face("backup", "init")?;
        let ring = KeyRing::open(repository.path())?;
        if ring.list()?.is_empty() {
            crate::keys::create_first_key(cli, &ring, None)?;
        }
    }
    if args.flash {
        // A block device already created keeps its configuration; opening it with another
        // one is refused with a message saying so.
        let _lock = repository.lock_face("block", "init")?;
        let engine = Engine::open(
            repository.face_storage("block")?,
            Some(BlockConfig::flash_with(args.flash_fingerprint)),
            RuntimeOptions::default(),
        )?;
        engine.shutdown()?;
    }
    println!(
        "{} repository {} at {}{}",
        if created {
            "created"
        } else {
            "using the existing"
        },
        repository.config().id,
        path.display(),
        if args.flash {
            format!(" (flash mode, {} fingerprints)", args.flash_fingerprint)
        } else {
            String::new()
        }
    );
    if encryption == Encryption::None {
        eprintln!("onecopy: warning: the backup store of this repository is not encrypted");
    }
    Ok(())
}
