//! One file per command: its arguments and how its result is printed.

pub mod analyze;
pub mod backup;
pub mod check;
pub mod fs;
pub mod init;
pub mod key;
pub mod lab;
pub mod serve;
pub mod volume;
