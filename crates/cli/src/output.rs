//! Output helpers shared by commands: progress bars, JSON printing and error messages.

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

/// The first error of the engine core in an error's chain: a core error itself, or the one
/// the block device's error carries.
pub fn core_error(error: &anyhow::Error) -> Option<&onecopy_core::Error> {
    error.chain().find_map(|cause| {
        cause.downcast_ref::<onecopy_core::Error>().or_else(|| {
            cause
                .downcast_ref::<onecopy_block::BlockError>()
                .and_then(onecopy_block::BlockError::core)
        })
    })
}

/// An error and its causes as one line, each said once. The crates' error types put their
/// source's text in their own message (`reading X: No such file or directory`) and also
/// return it as `source()` for programs that inspect it, so a cause whose text already ends
/// the message is left out instead of being printed a second time.
pub fn error_message(error: &anyhow::Error) -> String {
    let mut message = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if message.ends_with(&text) {
            continue;
        }
        if !message.is_empty() {
            message.push_str(": ");
        }
        message.push_str(&text);
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: an I/O error's text appears once, and context added around it is kept.
    /// Method: wrap an OS error in a core error, then in anyhow context, and format it.
    #[test]
    fn error_message_says_each_cause_once() {
        let source = std::io::Error::from_raw_os_error(libc::ENOENT);
        let core = onecopy_core::Error::io("reading /nonexistent", source);
        let error = anyhow::Error::new(core).context("opening the backup source");
        let message = error_message(&error);
        assert_eq!(
            message.matches("os error 2").count(),
            1,
            "the OS error is repeated: {message}"
        );
        assert!(message.starts_with("opening the backup source: reading /nonexistent: "));
    }
}
