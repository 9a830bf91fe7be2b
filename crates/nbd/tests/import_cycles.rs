//! The crate's modules import each other without circles (see scripts/import-cycles.py).

use std::path::Path;
use std::process::Command;

/// Goal: no module of this crate imports a module that imports it back, directly or through
/// others. Method: run scripts/import-cycles.py on the crate's sources.
#[test]
fn no_import_circles() {
    let crate_directory = Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = crate_directory.join("../../scripts/import-cycles.py");
    let output = Command::new("python3")
        .arg(&script)
        .arg(crate_directory.join("src"))
        .output()
        .expect("running python3 (install it: apt-get install python3)");
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
