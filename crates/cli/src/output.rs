//! Output helpers shared by commands: progress bars and JSON printing.

use indicatif::{ProgressBar, ProgressStyle};

/// A byte-count progress bar on standard error, hidden when standard error is not a terminal
/// so that scripts and logs stay clean.
pub fn byte_progress(total_bytes: u64, message: &str) -> ProgressBar {
    let bar = ProgressBar::new(total_bytes);
    bar.set_style(
        ProgressStyle::with_template(
            "{msg} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("valid template"),
    );
    bar.set_message(message.to_string());
    bar
}

/// Prints a value as pretty JSON on standard output.
pub fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}
