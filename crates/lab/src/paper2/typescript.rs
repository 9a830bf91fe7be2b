//! The real series: successive builds of the npm package `typescript`, unpacked.
//!
//! The versions are the registry's nightly builds of one release line (by default
//! `5.8.0-dev.*`, 41 nightlies from November 2024 to February 2025), taken in the registry's
//! publication order. The list is fetched once with `npm view typescript versions --json` and
//! kept in the cache directory (`versions.json`), so later runs need no network; each tarball
//! is fetched once with `npm pack` and unpacked with `tar` into `trees/<version>/package`.
//! A nightly differs from the previous one in small regions of a few large JavaScript files,
//! which is the kind of change a backup series sees.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::error::{LabError, Result};

/// The npm package of the real series.
pub const PACKAGE: &str = "typescript";
/// Release line whose nightly builds form the series by default.
pub const VERSION_PREFIX_DEFAULT: &str = "5.8.0-dev.";

/// One unpacked version of the series.
#[derive(Clone, Debug)]
pub struct Release {
    pub version: String,
    /// The unpacked package directory.
    pub tree: PathBuf,
}

/// Returns the first `count` versions starting with `prefix`, fetched and unpacked under
/// `cache` (kept between runs). `log` receives one line per download.
pub fn prepare(
    cache: &Path,
    prefix: &str,
    count: usize,
    log: &mut dyn FnMut(&str),
) -> Result<Vec<Release>> {
    assert!(count > 0, "a series needs a version");
    let directory = cache.join(PACKAGE);
    create_directory(&directory.join("tarballs"))?;
    create_directory(&directory.join("trees"))?;
    let versions = versions(&directory, log)?;
    let selected: Vec<String> = versions
        .into_iter()
        .filter(|version| version.starts_with(prefix))
        .take(count)
        .collect();
    if selected.len() < count {
        return Err(LabError::InvalidOption(format!(
            "the registry lists {} versions of {PACKAGE} starting with {prefix:?}; {count} were \
             asked for",
            selected.len()
        )));
    }
    let mut releases = Vec::with_capacity(count);
    for version in selected {
        let tree = directory.join("trees").join(&version);
        let package = tree.join("package");
        if !package.is_dir() {
            let tarball = directory
                .join("tarballs")
                .join(format!("{PACKAGE}-{version}.tgz"));
            if !tarball.is_file() {
                log(&format!("fetching {PACKAGE}@{version}"));
                run(
                    Command::new("npm")
                        .arg("pack")
                        .arg(format!("{PACKAGE}@{version}"))
                        .arg("--pack-destination")
                        .arg(directory.join("tarballs")),
                    "npm pack",
                )?;
            }
            // Unpack next to the final place and rename, so an interrupted run leaves no
            // half-unpacked tree behind.
            let partial = directory.join("trees").join(format!("{version}.partial"));
            if partial.exists() {
                fs::remove_dir_all(&partial).map_err(|error| {
                    LabError::io(format!("removing {}", partial.display()), error)
                })?;
            }
            create_directory(&partial)?;
            run(
                Command::new("tar")
                    .arg("xzf")
                    .arg(&tarball)
                    .arg("-C")
                    .arg(&partial),
                "tar xzf",
            )?;
            if tree.exists() {
                fs::remove_dir_all(&tree)
                    .map_err(|error| LabError::io(format!("removing {}", tree.display()), error))?;
            }
            fs::rename(&partial, &tree).map_err(|error| {
                LabError::io(format!("renaming {} into place", partial.display()), error)
            })?;
        }
        releases.push(Release {
            version,
            tree: package,
        });
    }
    Ok(releases)
}

/// The package's versions in publication order, from the cache or the registry.
fn versions(directory: &Path, log: &mut dyn FnMut(&str)) -> Result<Vec<String>> {
    let cached = directory.join("versions.json");
    let text = match fs::read_to_string(&cached) {
        Ok(text) => text,
        Err(_) => {
            log(&format!("listing the versions of {PACKAGE} (npm view)"));
            let text = run(
                Command::new("npm").args(["view", PACKAGE, "versions", "--json"]),
                "npm view",
            )?;
            fs::write(&cached, &text)
                .map_err(|error| LabError::io(format!("writing {}", cached.display()), error))?;
            text
        }
    };
    serde_json::from_str(&text).map_err(|error| LabError::Command {
        command: format!("npm view {PACKAGE} versions --json"),
        detail: format!("unexpected output: {error}"),
    })
}

fn run(command: &mut Command, what: &str) -> Result<String> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|error| LabError::Command {
            command: what.to_string(),
            detail: format!("{error} (is it installed? see scripts/setup.sh)"),
        })?;
    if !output.status.success() {
        return Err(LabError::Command {
            command: what.to_string(),
            detail: format!(
                "{}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn create_directory(path: &Path) -> Result<()> {
    fs::create_dir_all(path)
        .map_err(|error| LabError::io(format!("creating {}", path.display()), error))
}
