//! `onecopy lab all`: each part runs into its subdirectory, is timed and recorded, and the
//! report is written; a part that fails is reported without hiding the others.

use std::fs;
use std::process::Command;

/// A trace of six one-page requests in the FIU format; two reads repeat content.
const TRACE: &str = "\
1000 1 mail 800 8 W 6 0 2c4787c7671c2f638777c4ab72859ce1
2000 1 mail 808 8 W 6 0 88b93b628d84082186026d9da044f173
3000 1 mail 816 8 W 6 0 2c4787c7671c2f638777c4ab72859ce1
4000 1 mail 800 8 R 6 0 2c4787c7671c2f638777c4ab72859ce1
5000 1 mail 816 8 R 6 0 2c4787c7671c2f638777c4ab72859ce1
6000 1 mail 808 8 R 6 0 88b93b628d84082186026d9da044f173
";

/// Goal: `lab all` runs the parts it is given into their subdirectories and writes the
/// report with each part's command and time. Method: run it with only the trace part on a
/// six-request trace, then read the record and the report.
#[test]
fn lab_all_runs_parts_and_writes_the_report() {
    let directory = tempfile::tempdir().unwrap();
    let trace = directory.path().join("tiny.trace");
    fs::write(&trace, TRACE).unwrap();
    let out = directory.path().join("results");
    let output = Command::new(env!("CARGO_BIN_EXE_onecopy"))
        .args(["lab", "all", "--parts", "trace", "--trace"])
        .arg(&trace)
        .arg("--out")
        .arg(&out)
        .output()
        .expect("run onecopy");
    assert!(
        output.status.success(),
        "lab all failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(out.join("trace/results.json").is_file());
    assert!(out.join("trace/paper4-cache.svg").is_file());
    let runs: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(out.join("lab-all.json")).unwrap()).unwrap();
    assert_eq!(runs[0]["part"], "trace");
    assert_eq!(runs[0]["outcome"], "ok");
    let report = fs::read_to_string(out.join("README.md")).unwrap();
    assert!(report.contains("Made by `onecopy lab trace "), "{report}");
    assert!(report.contains("](trace/paper4-cache.svg)"), "{report}");
    assert!(
        report.contains("No result directory `paper1` here"),
        "{report}"
    );
}

/// Goal: a failing part is recorded with its error, the report is still written, and the
/// command exits non-zero naming the part. Method: give the trace part a file that is not a
/// trace.
#[test]
fn lab_all_reports_a_failed_part() {
    let directory = tempfile::tempdir().unwrap();
    let trace = directory.path().join("broken.trace");
    fs::write(&trace, "not a trace line\n").unwrap();
    let out = directory.path().join("results");
    let output = Command::new(env!("CARGO_BIN_EXE_onecopy"))
        .args(["lab", "all", "--parts", "trace", "--trace"])
        .arg(&trace)
        .arg("--out")
        .arg(&out)
        .output()
        .expect("run onecopy");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("trace failed"), "{stderr}");
    let report = fs::read_to_string(out.join("README.md")).unwrap();
    assert!(report.contains("which failed: "), "{report}");
}

/// Goal: an unknown part is refused before anything runs. Method: ask for part "paper9".
#[test]
fn lab_all_refuses_an_unknown_part() {
    let directory = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_onecopy"))
        .args(["lab", "all", "--parts", "paper9", "--out"])
        .arg(directory.path().join("results"))
        .output()
        .expect("run onecopy");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("paper9"), "{stderr}");
    assert!(!directory.path().join("results").exists());
}

/// Goal: `lab all` passes the trace to paper 4's part, which writes its figures, and the
/// report shows them. Method: run it with only the paper4 part, quick, on the six-request
/// trace, then read the report.
#[test]
fn lab_all_runs_paper4_on_the_trace() {
    let directory = tempfile::tempdir().unwrap();
    let trace = directory.path().join("tiny.trace");
    fs::write(&trace, TRACE).unwrap();
    let out = directory.path().join("results");
    let output = Command::new(env!("CARGO_BIN_EXE_onecopy"))
        .args(["lab", "all", "--quick", "--parts", "paper4", "--trace"])
        .arg(&trace)
        .arg("--out")
        .arg(&out)
        .output()
        .expect("run onecopy");
    assert!(
        output.status.success(),
        "lab all failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    for figure in ["fig10", "fig11", "table3", "fig12", "fig13"] {
        assert!(
            out.join(format!("paper4/paper4-{figure}.svg")).is_file(),
            "{figure}"
        );
    }
    let report = fs::read_to_string(out.join("README.md")).unwrap();
    assert!(
        report.contains("Made by `onecopy lab paper4 --trace "),
        "{report}"
    );
    assert!(report.contains("](paper4/paper4-table3.svg)"), "{report}");
}
