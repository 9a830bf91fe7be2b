//! `onecopy key list|add|remove|passwd`: the passwords that open an encrypted repository.
//!
//! Every password wraps the same master key, so adding, removing or changing one rewrites
//! only a key file; no sealed file changes. The backup face's lock serialises these commands
//! with the commands that open the store.

use std::path::PathBuf;

use anyhow::bail;
use clap::{Args, Subcommand};
use onecopy_core::keys::{KdfCost, KeyRing};
use onecopy_core::repository::{Encryption, Repository};
use serde::Serialize;

use crate::keys::{create_first_key, new_password, password};
use crate::output::print_json;
use crate::Cli;

#[derive(Args, Debug)]
pub struct KeyArgs {
    #[command(flatten)]
    pub repository: crate::RepositoryArgs,
    #[command(flatten)]
    pub password: crate::keys::PasswordArgs,
    #[command(subcommand)]
    pub command: KeyCommand,
}

#[derive(Subcommand, Debug)]
pub enum KeyCommand {
    /// List the keys (one per password): id, when and where each was made.
    List {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Add a password (the current one, from the usual sources, opens the repository first).
    Add {
        /// File whose first line is the new password [default: asked twice on the terminal].
        #[arg(long, value_name = "FILE")]
        new_password_file: Option<PathBuf>,
    },
    /// Remove a key; the key that opened the repository and the last key are refused.
    Remove {
        /// The key's id (from `onecopy key list`).
        id: String,
    },
    /// Change the password: add a key for the new one, then remove the current key.
    Passwd {
        /// File whose first line is the new password [default: asked twice on the terminal].
        #[arg(long, value_name = "FILE")]
        new_password_file: Option<PathBuf>,
    },
}

#[derive(Serialize)]
struct KeyListing {
    id: String,
    created: u64,
    host: String,
    user: String,
    current: bool,
}

pub fn run(cli: &Cli, args: &KeyArgs) -> anyhow::Result<()> {
    // On object storage the keys are objects: they come into the cache's mirror of the
    // repository, change there, and go back.
    let Some(url) = crate::backup_face::object_url(cli)? else {
        let repository = Repository::open(&cli.repository_path())?;
        let _lock = repository.lock_face_waiting("backup", "onecopy key", cli.lock_wait()?)?;
        return run_on(cli, args, &repository);
    };
    let remote = crate::backup_face::connect(&url)?;
    let repository = Repository::open(&remote.mirror())?;
    run_on(cli, args, &repository)?;
    remote.push_keys()?;
    Ok(())
}

fn run_on(cli: &Cli, args: &KeyArgs, repository: &Repository) -> anyhow::Result<()> {
    if repository.config().encryption == Encryption::None {
        bail!(
            "repository {} was made with --insecure-no-encryption: it has no keys",
            repository.path().display()
        );
    }
    let ring = KeyRing::open(repository.path())?;
    if ring.list()?.is_empty() {
        // A repository whose backup store was never used has no key yet: `key add` and
        // `key passwd` make the first one.
        match &args.command {
            KeyCommand::Add { new_password_file } | KeyCommand::Passwd { new_password_file } => {
                create_first_key(cli, &ring, new_password_file.as_deref())?;
                return Ok(());
            }
            KeyCommand::List { json: true } => return print_json(&Vec::<KeyListing>::new()),
            KeyCommand::List { json: false } => {
                println!("no keys yet: the first backup (or `onecopy key add`) makes one");
                return Ok(());
            }
            KeyCommand::Remove { id } => bail!("there is no key {id}: the repository has none"),
        }
    }
    let (master, current) = ring.unlock(&password(cli)?)?;
    match &args.command {
        KeyCommand::List { json } => {
            let keys: Vec<KeyListing> = ring
                .list()?
                .into_iter()
                .map(|key| KeyListing {
                    current: key.id == current.id,
                    id: key.id,
                    created: key.created,
                    host: key.host,
                    user: key.user,
                })
                .collect();
            if *json {
                return print_json(&keys);
            }
            println!(
                "{:<2}{:<18}{:<22}{:<16}user",
                "", "id", "created (UTC)", "host"
            );
            for key in keys {
                println!(
                    "{:<2}{:<18}{:<22}{:<16}{}",
                    if key.current { "*" } else { "" },
                    key.id,
                    onecopy_core::units::format_time(key.created.saturating_mul(1_000_000_000)),
                    key.host,
                    key.user
                );
            }
        }
        KeyCommand::Add { new_password_file } => {
            let new = new_password(cli, new_password_file.as_deref())?;
            let key = ring.add(&master, &new, KdfCost::default())?;
            println!("added key {}", key.id);
        }
        KeyCommand::Remove { id } => {
            if *id == current.id {
                bail!(
                    "key {id} is the one that opened the repository; remove it with another \
                     password, or change it with `onecopy key passwd`"
                );
            }
            ring.remove(id)?;
            println!("removed key {id}");
        }
        KeyCommand::Passwd { new_password_file } => {
            let new = new_password(cli, new_password_file.as_deref())?;
            let key = ring.add(&master, &new, KdfCost::default())?;
            ring.remove(&current.id)?;
            println!(
                "changed the password: key {} replaces key {}",
                key.id, current.id
            );
        }
    }
    Ok(())
}
