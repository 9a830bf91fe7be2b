//! The real series: successive builds of the npm package `typescript`, unpacked.
//!
//! The versions are the registry's nightly builds of one release line (by default
//! `5.8.0-dev.*`, 41 nightlies from November 2024 to February 2025). A nightly's version ends
//! in its build date (`5.8.0-dev.20241106`), so sorting the names of one line sorts the builds
//! by date. The version list comes from the registry's abbreviated package document
//! (`curl`, no npm needed) and is kept in the cache directory (`versions.json`), so later runs
//! need no network; each tarball is fetched once with `curl` and unpacked with `tar` into
//! `trees/<version>/package`.
//! A nightly differs from the previous one in small regions of a few large JavaScript files,
//! which is the kind of change a backup series sees.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use onecopy_core::error::IoContext;

use super::peers::run_plain;
use crate::error::{LabError, Result};
use crate::results::create_directory;

/// The npm package of the real series.
pub const PACKAGE: &str = "typescript";
/// The npm registry the releases come from.
pub const REGISTRY: &str = "https://registry.npmjs.org";
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
    let mut selected: Vec<String> = versions
        .into_iter()
        .filter(|version| version.starts_with(prefix))
        .collect();
    selected.sort();
    selected.truncate(count);
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
                // Download next to the final name and rename, so an interrupted download
                // is never taken for a tarball.
                let partial = tarball.with_extension("tgz.partial");
                run_plain(
                    Command::new("curl")
                        .args([
                            "--fail",
                            "--silent",
                            "--show-error",
                            "--location",
                            "--output",
                        ])
                        .arg(&partial)
                        .arg(format!("{REGISTRY}/{PACKAGE}/-/{PACKAGE}-{version}.tgz")),
                    "curl (tarball)",
                )?;
                fs::rename(&partial, &tarball)
                    .context_io(|| format!("renaming {} into place", partial.display()))?;
            }
            // Unpack next to the final place and rename, so an interrupted run leaves no
            // half-unpacked tree behind.
            let partial = directory.join("trees").join(format!("{version}.partial"));
            if partial.exists() {
                fs::remove_dir_all(&partial)
                    .context_io(|| format!("removing {}", partial.display()))?;
            }
            create_directory(&partial)?;
            run_plain(
                Command::new("tar")
                    .arg("xzf")
                    .arg(&tarball)
                    .arg("-C")
                    .arg(&partial),
                "tar xzf",
            )?;
            if tree.exists() {
                fs::remove_dir_all(&tree).context_io(|| format!("removing {}", tree.display()))?;
            }
            fs::rename(&partial, &tree)
                .context_io(|| format!("renaming {} into place", partial.display()))?;
        }
        releases.push(Release {
            version,
            tree: package,
        });
    }
    Ok(releases)
}

/// The package's version names (unordered), from the cache or the registry.
fn versions(directory: &Path, log: &mut dyn FnMut(&str)) -> Result<Vec<String>> {
    let cached = directory.join("versions.json");
    if let Ok(text) = fs::read_to_string(&cached) {
        return serde_json::from_str(&text).map_err(|error| LabError::Command {
            command: format!("reading {}", cached.display()),
            detail: format!("unexpected content ({error}); delete the file to fetch it again"),
        });
    }
    log(&format!("listing the versions of {PACKAGE} ({REGISTRY})"));
    let url = format!("{REGISTRY}/{PACKAGE}");
    let text = run_plain(
        Command::new("curl")
            .args([
                "--fail",
                "--silent",
                "--show-error",
                "--location",
                "--header",
            ])
            // The abbreviated document: versions without readmes, a fraction of the size.
            .arg("Accept: application/vnd.npm.install-v1+json")
            .arg(&url),
        "curl (package document)",
    )?;
    let document: serde_json::Value =
        serde_json::from_str(&text).map_err(|error| LabError::Command {
            command: format!("curl {url}"),
            detail: format!("unexpected output: {error}"),
        })?;
    let versions: Vec<String> = document
        .get("versions")
        .and_then(|versions| versions.as_object())
        .ok_or_else(|| LabError::Command {
            command: format!("curl {url}"),
            detail: "the package document has no \"versions\" object".to_string(),
        })?
        .keys()
        .cloned()
        .collect();
    let list = serde_json::to_string(&versions).expect("a list of strings serializes");
    fs::write(&cached, list).context_io(|| format!("writing {}", cached.display()))?;
    Ok(versions)
}
