//! Passwords and the sealed storage of the backup store.
//!
//! A password comes from `--password-file FILE` (or `ONECOPY_PASSWORD_FILE`), else from
//! `ONECOPY_PASSWORD`, else from a prompt on the terminal; a command without any of these
//! fails with a message naming them. A repository's first key is made when the encrypted
//! backup store is first used (or by `init` when a password is given there).

use std::io::{BufRead, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Args;
use onecopy_core::check::{CheckOptions, Finding, FindingKind};
use onecopy_core::keys::{KdfCost, KeyRing, MasterKey};
use onecopy_core::repository::{Encryption, Repository};
use onecopy_core::storage::{SealedStorage, Storage};

use crate::Cli;

/// `--password-file`, offered by the commands that open an encrypted backup store.
#[derive(Args, Debug, Default)]
pub struct PasswordArgs {
    /// File whose first line is the repository's password [default: ONECOPY_PASSWORD, or a
    /// prompt on the terminal].
    #[arg(
        id = "password_file",
        long = "password-file",
        global = true,
        env = "ONECOPY_PASSWORD_FILE",
        value_name = "FILE"
    )]
    pub file: Option<PathBuf>,
}

const PASSWORD_VARIABLE: &str = "ONECOPY_PASSWORD";

/// The password of an existing key.
pub fn password(cli: &Cli) -> anyhow::Result<String> {
    if let Some(password) = given_password(cli)? {
        return Ok(password);
    }
    let repository = cli.repository_path();
    prompt(&format!(
        "password of repository {}: ",
        repository.display()
    ))?
    .ok_or_else(|| {
        anyhow::anyhow!(
            "the repository's backup store is encrypted: give its password with \
             {PASSWORD_VARIABLE}, --password-file FILE, or run the command in a terminal"
        )
    })
}

/// A new password: from `file` when given, else from the usual sources, else asked twice on
/// the terminal.
pub fn new_password(cli: &Cli, file: Option<&Path>) -> anyhow::Result<String> {
    if let Some(file) = file {
        return read_password_file(file);
    }
    if let Some(password) = given_password(cli)? {
        return Ok(password);
    }
    let Some(first) = prompt("new password: ")? else {
        bail!(
            "a new password is needed: give it with {PASSWORD_VARIABLE}, --password-file FILE, \
             or run the command in a terminal"
        );
    };
    let second = prompt("the same password again: ")?.unwrap_or_default();
    if first != second {
        bail!("the two passwords differ; nothing was changed");
    }
    Ok(first)
}

/// The password from `--password-file` or the environment, if either is given.
fn given_password(cli: &Cli) -> anyhow::Result<Option<String>> {
    if let Some(file) = cli.password_file() {
        return read_password_file(file).map(Some);
    }
    Ok(std::env::var(PASSWORD_VARIABLE).ok())
}

fn read_password_file(path: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the password file {}", path.display()))?;
    Ok(text.lines().next().unwrap_or_default().to_string())
}

/// Asks on the terminal without echo; `None` when there is no terminal.
fn prompt(question: &str) -> anyhow::Result<Option<String>> {
    let Ok(terminal) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
    else {
        return Ok(None);
    };
    let fd = terminal.as_raw_fd();
    // SAFETY: termios is plain data; tcgetattr fills it for a valid descriptor.
    let mut original: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open for the lifetime of `terminal`.
    if unsafe { libc::tcgetattr(fd, &mut original) } != 0 {
        return Ok(None);
    }
    let mut silent = original;
    silent.c_lflag &= !libc::ECHO;
    silent.c_lflag |= libc::ECHONL;
    (&terminal).write_all(question.as_bytes())?;
    // SAFETY: as above; the original settings are restored below on every path.
    unsafe { libc::tcsetattr(fd, libc::TCSANOW, &silent) };
    let mut line = String::new();
    let read = std::io::BufReader::new(&terminal).read_line(&mut line);
    // SAFETY: as above.
    unsafe { libc::tcsetattr(fd, libc::TCSANOW, &original) };
    read.context("reading the password from the terminal")?;
    Ok(Some(line.trim_end_matches(['\n', '\r']).to_string()))
}

/// Whether a command may make the repository's first key when it has none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FirstKey {
    /// Yes: the command creates the backup store when missing.
    Create,
    /// No: the command only reads or checks.
    Refuse,
}

/// The backup store's storage: sealed with the repository's master key (unlocked with the
/// password, or made now for a store not yet created), or plain for a repository made with
/// `--insecure-no-encryption`.
pub fn backup_storage(
    cli: &Cli,
    repository: &Repository,
    first_key: FirstKey,
) -> anyhow::Result<Arc<dyn Storage>> {
    let plain = repository.face_storage("backup")?;
    Ok(match sealing(cli, repository, &plain, first_key)? {
        Some(sealed) => sealed,
        None => plain,
    })
}

pub fn sealing(
    cli: &Cli,
    repository: &Repository,
    plain: &Arc<dyn Storage>,
    first_key: FirstKey,
) -> anyhow::Result<Option<Arc<SealedStorage>>> {
    if repository.config().encryption == Encryption::None {
        return Ok(None);
    }
    let ring = KeyRing::open(repository.path())?;
    let master = if ring.list()?.is_empty() {
        let store_exists = plain.exists(onecopy_backup::store::CATALOG_FILE)?
            || !plain
                .list(onecopy_backup::store::CONTAINERS_DIRECTORY)?
                .is_empty();
        if store_exists || first_key == FirstKey::Refuse {
            bail!(
                "the backup store of {} is encrypted but {} holds no key: restore that \
                 directory from a copy",
                repository.path().display(),
                ring.directory().display()
            );
        }
        create_first_key(cli, &ring, None)?
    } else {
        ring.unlock(&password(cli)?)?.0
    };
    Ok(Some(seal(plain, &master)))
}

/// The backup store's storage `plain` sealed with `master`.
pub fn seal(plain: &Arc<dyn Storage>, master: &MasterKey) -> Arc<SealedStorage> {
    Arc::new(SealedStorage::new(
        Arc::clone(plain),
        master.sealing_key("backup"),
        onecopy_backup::store::sealed_layout,
    ))
}

/// Makes the repository's master key and its first key file.
pub fn create_first_key(
    cli: &Cli,
    ring: &KeyRing,
    password_file: Option<&Path>,
) -> anyhow::Result<MasterKey> {
    let password = new_password(cli, password_file)?;
    let master = MasterKey::generate()?;
    let key = ring.add(&master, &password, KdfCost::default())?;
    eprintln!(
        "onecopy: the backup store is encrypted; made key {} in {}. Keep the password: without \
         it no backup can be read.",
        key.id,
        ring.directory().display()
    );
    Ok(master)
}

/// Authenticates every block of the sealed backup store's catalog and segment index, and with
/// `--read-data` of its containers too; a finding per file with blocks that fail.
pub fn verify_sealed(
    sealed: &Arc<SealedStorage>,
    options: CheckOptions,
) -> anyhow::Result<Vec<Finding>> {
    // The face's lock and logs are not sealed: only the store's own files are listed.
    let mut names: Vec<String> = sealed
        .list("")?
        .into_iter()
        .filter(|name| name.starts_with(onecopy_backup::store::CATALOG_FILE))
        .collect();
    names.extend(sealed.list("meta")?);
    if options.read_data {
        names.extend(sealed.list(onecopy_backup::store::CONTAINERS_DIRECTORY)?);
    }
    let mut findings = Vec::new();
    for name in names {
        let report = match sealed.verify_file(&name) {
            Ok(report) => report,
            Err(error) => {
                findings.push(Finding::new(
                    FindingKind::Damage,
                    format!("backup/{name}"),
                    error.to_string(),
                ));
                continue;
            }
        };
        let mut unreadable = report.unreadable_blocks;
        if !unreadable.is_empty() && name.starts_with(onecopy_backup::store::CATALOG_FILE) {
            // The catalog's pages are written copy-on-write: a block a crash tore belongs to
            // no commit, which a verified copy (unreadable blocks as zeros) shows.
            let storage: Arc<dyn Storage> = Arc::clone(sealed) as Arc<dyn Storage>;
            if let Ok(copy) = onecopy_core::catalog::Catalog::open_verified_copy(&storage, &name) {
                let unused = copy.unused_unreadable_blocks();
                let (leftover, damaged): (Vec<u64>, Vec<u64>) =
                    unreadable.iter().partition(|block| unused.contains(block));
                if !leftover.is_empty() {
                    findings.push(Finding::new(
                        FindingKind::Leftover,
                        format!("backup/{name}"),
                        format!(
                            "blocks {} (of 4 KiB) fail authentication but no committed page \
                             uses them (writes a crash interrupted); later writes of those \
                             pages replace them",
                            block_list(&leftover)
                        ),
                    ));
                }
                unreadable = damaged;
            }
        }
        if !unreadable.is_empty() {
            findings.push(Finding::new(
                FindingKind::Damage,
                format!("backup/{name}"),
                format!(
                    "blocks {} (of 4 KiB) fail authentication: changed or damaged",
                    block_list(&unreadable)
                ),
            ));
        }
        if !report.damaged_copies.is_empty() {
            findings.push(Finding::new(
                FindingKind::Leftover,
                format!("backup/{name}"),
                format!(
                    "the older copy of blocks {} fails authentication (a write a crash \
                     interrupted, or damage); they read from their newest copy, and their \
                     next write replaces the older one",
                    block_list(&report.damaged_copies)
                ),
            ));
        }
    }
    Ok(findings)
}

fn block_list(blocks: &[u64]) -> String {
    let shown: Vec<String> = blocks.iter().take(10).map(u64::to_string).collect();
    let more = blocks.len().saturating_sub(shown.len());
    if more > 0 {
        format!("{} and {more} more", shown.join(", "))
    } else {
        shown.join(", ")
    }
}
