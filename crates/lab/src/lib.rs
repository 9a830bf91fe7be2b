//! The lab: experiments that reproduce the papers on onecopy, and the tools they share.
//!
//! - [`mount`]: a real kernel file system on an onecopy volume inside one process (engine,
//!   NBD server, nbdfuse, loop device, mkfs, mount), torn down in order whatever happens;
//! - [`cpu`]: processor time of the process, a thread and a child, for CPU per operation;
//! - [`results`]: `results.json` / `results.csv` writing and a snapshot of the host's load;
//! - [`plot`]: SVG figures (grouped bars, lines, axes, legends) with no dependencies;
//! - [`paper1`]: paper 1 §5, file-system hints for inline deduplication (metadata, directory
//!   tree, journal, data journal, copy and file-server workloads at injected index latencies,
//!   LRU and ARC, hints on and off, deferred deduplication; the uniqueness of metadata);
//! - [`paper2`]: paper 2 §4, RevDedup against conventional deduplication on synthetic and
//!   real backup series, and [`paper2::peers`]: restic and borg run on the same series.
//! - [`paper3`]: paper 3 §5, selective offline deduplication on the file system face
//!   (Figs. 3, 9 to 11, 14 to 17 and Tables 4 and 6, on file systems mounted through FUSE);
//! - [`paper4`]: paper 4 §4.2-4.5, dynamic replica retrieval, selective duplication and all
//!   three techniques of I/O deduplication by a timed replay of the FIU mail trace and
//!   synthetic days over a hard-disk model, run by the block engine's replica planner (Figs.
//!   10, 11, Table 3), and the content cache's costs (Figs. 12, 13);
//! - [`paper5`]: paper 5 §5, deduplication on flash: repeated writes of small and large files
//!   with and without deduplication (Figs. 1-3) and the LFU index cache's size (§3.6) on the
//!   block engine's flash mode;
//! - [`peers`]: the backup store against restic, borg, rustic and bupstash on the typescript
//!   releases and on snapshots of a Debian system's /usr, in one run (issue 21's goals);
//! - [`trace`]: block traces with content digests (the FIU format of paper 4);
//! - [`trace_analysis`]: paper 4 §2, the duplication a trace shows (Table 1, Figs. 2-4);
//! - [`trace_replay`]: paper 4 §4.1, content- vs sector-addressed caches over a trace.
//!
//! An experiment is a function from options to files in an output directory; the `onecopy
//! lab` command only parses arguments and prints progress. [`report`] gathers the figures of
//! every experiment's output directory in one page, the paper's numbers beside ours.

pub mod cpu;
pub mod error;
pub mod mount;
pub mod paper1;
pub mod paper2;
pub mod paper3;
pub mod paper4;
pub mod paper5;
pub mod peers;
pub mod plot;
pub mod report;
pub mod results;
pub mod trace;
pub mod trace_analysis;
pub mod trace_replay;

pub use error::{LabError, Result};
