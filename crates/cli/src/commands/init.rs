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
    if let Some(url) = crate::backup_face::object_url(cli)? {
        return init_remote(cli, args, &url, encryption);
    }
    let (repository, created) = match Repository::init_with(&path, encryption) {
        Ok(repository) => (repository, true),
        // Opening checks the format, so a repository this onecopy cannot use is an error.
        Err(onecopy_core::Error::AlreadyExists(_)) => (Repository::open(&path)?, false),
        Err(error) => return Err(error.into()),
    };
    check_encryption(&repository, encryption, &path.display().to_string())?;
    if encryption == Encryption::Aes256Gcm && password_given(cli) {
        let _lock = repository.lock_face("backup", "init")?;
        make_first_key(cli, &repository)?;
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

/// `--insecure-no-encryption` must match an existing repository.
fn check_encryption(
    repository: &Repository,
    encryption: Encryption,
    location: &str,
) -> anyhow::Result<()> {
    match (repository.config().encryption, encryption) {
        (Encryption::Aes256Gcm, Encryption::None) => anyhow::bail!(
            "repository {location} exists and is encrypted; --insecure-no-encryption applies \
             only to a new repository"
        ),
        (Encryption::None, Encryption::Aes256Gcm) => anyhow::bail!(
            "repository {location} exists unencrypted (made with --insecure-no-encryption); \
             pass that flag to use it, or choose another location for an encrypted repository"
        ),
        _ => Ok(()),
    }
}

fn password_given(cli: &Cli) -> bool {
    cli.password_file().is_some() || std::env::var_os("ONECOPY_PASSWORD").is_some()
}

/// Makes the first key when the repository has none.
fn make_first_key(cli: &Cli, repository: &Repository) -> anyhow::Result<()> {
    let ring = KeyRing::open(repository.path())?;
    if ring.list()?.is_empty() {
        crate::keys::create_first_key(cli, &ring, None)?;
    }
    Ok(())
}

/// `init` of a repository on object storage: made in the cache's mirror, then published
/// (keys first, the configuration last, created only if no repository is there). The block
/// device and the file system keep their repositories in directories.
fn init_remote(
    cli: &Cli,
    args: &InitArgs,
    url: &onecopy_remote::ObjectUrl,
    encryption: Encryption,
) -> anyhow::Result<()> {
    if args.flash {
        anyhow::bail!(
            "--flash configures the block device, whose repository is a directory; object \
             storage holds backups only"
        );
    }
    let remote = onecopy_remote::RemoteRepository::connect(url, &crate::backup_face::cache_root())?;
    let created = if remote.exists()? {
        remote.pull_root()?;
        let repository = Repository::open(&remote.mirror())?;
        check_encryption(&repository, encryption, &url.to_string())?;
        false
    } else {
        // A mirror left from a repository removed from the store is stale.
        let mirror = remote.mirror();
        if mirror.exists() {
            std::fs::remove_dir_all(&mirror)?;
        }
        let repository = Repository::init_with(&mirror, encryption)?;
        // The first key is made here, never by a later command: clients on several hosts
        // making one each would seal with different master keys.
        if encryption == Encryption::Aes256Gcm {
            make_first_key(cli, &repository)?;
        }
        remote.publish_new()?;
        true
    };
    let repository = Repository::open(&remote.mirror())?;
    println!(
        "{} repository {} at {url}",
        if created {
            "created"
        } else {
            "using the existing"
        },
        repository.config().id,
    );
    if encryption == Encryption::None {
        eprintln!("onecopy: warning: the backup store of this repository is not encrypted");
    }
    Ok(())
}
