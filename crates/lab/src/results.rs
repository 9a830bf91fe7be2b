//! Writing experiment results: JSON documents, CSV tables, and a snapshot of the host.
//!
//! Every experiment writes `results.json` (everything, including parameters and the host) and
//! `results.csv` (one row per run, for spreadsheets and quick plots). A [`CsvTable`] is built
//! from named columns; each row must have one cell per column. The [`HostSnapshot`] records
//! what could make timings noisy: the load average before and after each run (our machines
//! are shared), the CPU count and the kernel.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use onecopy_core::error::IoContext;
use serde::{Deserialize, Serialize};

use crate::error::{LabError, Result};

/// A table with named columns, written as RFC 4180 CSV.
#[derive(Clone, Debug, Default)]
pub struct CsvTable {
    columns: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl CsvTable {
    /// An empty table with these columns.
    pub fn new(columns: &[&str]) -> CsvTable {
        assert!(!columns.is_empty(), "a table needs columns");
        CsvTable {
            columns: columns.iter().map(|name| name.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row; it must have one cell per column.
    pub fn push(&mut self, row: Vec<String>) {
        assert_eq!(
            row.len(),
            self.columns.len(),
            "a row needs one cell per column ({:?})",
            self.columns
        );
        self.rows.push(row);
    }

    /// Rows so far.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// True when no row was pushed.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The table as CSV text: a header line, then one line per row.
    pub fn to_csv(&self) -> String {
        let mut text = String::new();
        for row in std::iter::once(&self.columns).chain(&self.rows) {
            let cells: Vec<String> = row.iter().map(|cell| csv_cell(cell)).collect();
            let _ = writeln!(text, "{}", cells.join(","));
        }
        text
    }

    /// Writes the table to `path`.
    pub fn write(&self, path: &Path) -> Result<()> {
        write_text(path, &self.to_csv())
    }
}

/// Quotes a cell when it holds a comma, a quote or a line break.
fn csv_cell(cell: &str) -> String {
    if cell.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", cell.replace('"', "\"\""))
    } else {
        cell.to_string()
    }
}

/// A number as a CSV cell: integers without a fraction, others with up to six digits, and an
/// empty cell for NaN.
pub fn number_cell(value: f64) -> String {
    if !value.is_finite() {
        String::new()
    } else if value == value.trunc() && value.abs() < 1e15 {
        format!("{}", value as i64)
    } else {
        let text = format!("{value:.6}");
        text.trim_end_matches('0').to_string()
    }
}

/// Writes `value` as pretty JSON to `path`.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(|error| {
        LabError::io(
            format!("serialising {}", path.display()),
            std::io::Error::other(error),
        )
    })?;
    write_text(path, &(text + "\n"))
}

/// Reads the JSON document at `path` (written by [`write_json`]).
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let text = fs::read_to_string(path).context_io(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).map_err(|error| {
        LabError::io(
            format!("parsing {}", path.display()),
            std::io::Error::other(error),
        )
    })
}

/// Removes the directory tree at `path`; one that is not there is not an error.
pub fn remove_directory_if_present(path: &Path) -> Result<()> {
    match fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(LabError::io(format!("removing {}", path.display()), error)),
    }
}

/// Writes `text` to `path`, creating the parent directory.
pub fn write_text(path: &Path, text: &str) -> Result<()> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).context_io(|| format!("creating {}", parent.display()))?;
    }
    Ok(fs::write(path, text).context_io(|| format!("writing {}", path.display()))?)
}

/// Creates `path` and its missing parents.
pub fn create_directory(path: &Path) -> Result<()> {
    Ok(fs::create_dir_all(path).context_io(|| format!("creating {}", path.display()))?)
}

/// What the host was doing, taken before or after a run.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct HostSnapshot {
    /// Load averages over 1, 5 and 15 minutes (`/proc/loadavg`); zeros if unreadable.
    pub load_average: [f64; 3],
    /// Online CPUs.
    pub cpus: usize,
    /// `uname -r`-like kernel release (`/proc/sys/kernel/osrelease`).
    pub kernel: String,
}

impl HostSnapshot {
    /// The state of the host now.
    pub fn take() -> HostSnapshot {
        let load_average = fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|text| parse_load_average(&text))
            .unwrap_or_default();
        HostSnapshot {
            load_average,
            cpus: std::thread::available_parallelism().map_or(0, |count| count.get()),
            kernel: fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|text| text.trim().to_string())
                .unwrap_or_default(),
        }
    }
}

/// The one-minute load average (0 if unreadable).
pub fn load_average() -> f64 {
    fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| parse_load_average(&text))
        .map_or(0.0, |averages| averages[0])
}

/// The three load averages at the start of a `/proc/loadavg` line.
pub fn parse_load_average(text: &str) -> Option<[f64; 3]> {
    let mut fields = text.split_whitespace().map(str::parse::<f64>);
    Some([
        fields.next()?.ok()?,
        fields.next()?.ok()?,
        fields.next()?.ok()?,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: CSV quoting follows RFC 4180; method: cells with commas, quotes and newlines.
    #[test]
    fn csv_quotes_special_cells() {
        let mut table = CsvTable::new(&["name", "value"]);
        table.push(vec!["plain".into(), "1".into()]);
        table.push(vec!["a,b".into(), "say \"hi\"".into()]);
        table.push(vec!["two\nlines".into(), String::new()]);
        assert_eq!(
            table.to_csv(),
            "name,value\nplain,1\n\"a,b\",\"say \"\"hi\"\"\"\n\"two\nlines\",\n"
        );
        assert_eq!(table.len(), 3);
    }

    /// Goal: a row with the wrong number of cells is a programmer error; method: push one.
    #[test]
    #[should_panic(expected = "one cell per column")]
    fn csv_rejects_short_rows() {
        let mut table = CsvTable::new(&["a", "b"]);
        table.push(vec!["only one".into()]);
    }

    /// Goal: numbers print without noise; method: integers, fractions, NaN.
    #[test]
    fn numbers_print_cleanly() {
        assert_eq!(number_cell(42.0), "42");
        assert_eq!(number_cell(1.5), "1.5");
        assert_eq!(number_cell(0.1234567), "0.123457");
        assert_eq!(number_cell(f64::NAN), "");
    }

    /// Goal: load averages parse from a real /proc/loadavg line and garbage is refused.
    #[test]
    fn load_average_parses() {
        assert_eq!(
            parse_load_average("8.18 8.27 7.45 3/412 12345\n"),
            Some([8.18, 8.27, 7.45])
        );
        assert_eq!(parse_load_average("x y z"), None);
        assert_eq!(parse_load_average("1.0 2.0"), None);
    }

    /// Goal: JSON and CSV land on disk, parent directories included; method: write to a
    /// temporary directory and read back.
    #[test]
    fn files_are_written() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("nested").join("results.json");
        write_json(&path, &HostSnapshot::take()).unwrap();
        let back: HostSnapshot = serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
        assert!(back.cpus >= 1);
        let mut table = CsvTable::new(&["x"]);
        table.push(vec!["1".into()]);
        let csv = directory.path().join("results.csv");
        table.write(&csv).unwrap();
        assert_eq!(fs::read_to_string(csv).unwrap(), "x\n1\n");
    }
}
