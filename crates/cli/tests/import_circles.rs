//! No module of any crate imports a module that imports it back, directly or through others:
//! shared types live in leaf modules, so each module can be read and changed knowing only
//! what is below it (see scripts/import-circles.py).

use std::path::Path;
use std::process::Command;

/// Goal: no crate of the workspace has an import circle between its modules. Method: run
/// scripts/import-circles.py on every crate's sources.
#[test]
fn no_import_circles() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut sources: Vec<_> = std::fs::read_dir(&crates)
        .expect("the crates directory is readable")
        .map(|entry| entry.expect("a directory entry").path().join("src"))
        .filter(|source| source.is_dir())
        .collect();
    sources.sort();
    assert!(sources.len() >= 7, "found only {sources:?}");
    let output = Command::new("python3")
        .arg(crates.join("../scripts/import-circles.py"))
        .args(&sources)
        .output()
        .expect("running python3 (install it: apt-get install python3)");
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
