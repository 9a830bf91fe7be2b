//! The lab report: one Markdown page with every figure the lab draws, the paper's number
//! beside ours, and one line on why they differ.
//!
//! Terms: a *part* is one lab command (`paper1`, `paper2`, `paper3`, `paper5`, `trace`); a
//! *result directory* is a subdirectory of the report's directory named after its part
//! (`paper1`) or a variant of it (`paper1-cache4m`: the same command with other options).
//!
//! How the page is made ([`render`]):
//!
//! 1. list the result directories of each part; the one named exactly after the part is its
//!    *primary* directory, else the first variant by name (`paper3-quick`);
//! 2. for every figure (`.svg`, `.png`) in the primary directory, by name: the image, then for
//!    the figures the report knows, a table of the paper's numbers beside ours, read from the
//!    directory's `results.json`, and one line on why they differ; a figure the report does
//!    not know (a new one) appears with its file name, so a new figure is never left out;
//! 3. the variants' figures and summaries are listed below their part;
//! 4. when `lab all` made the directory, its record of the runs ([`RUNS_FILE`]: command,
//!    seconds, outcome per part) closes the page.
//!
//! What is not guaranteed: numbers are read from `results.json` by field name, so a field
//! that is missing (an older or newer format) shows as "n/a" rather than failing the page.
//! The page holds no time stamp and no host detail beyond what the results hold, so the same
//! directories always give the same page (a test checks the committed `docs/lab/README.md`).

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use onecopy_core::error::IoContext;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::Result;
use crate::results::{read_json, write_text};

/// The report's file name inside its directory.
pub const REPORT_FILE: &str = "README.md";

/// The record `lab all` keeps of its runs, inside the report's directory.
pub const RUNS_FILE: &str = "lab-all.json";

/// One part's run by `lab all`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PartRun {
    /// The part (`paper1`, ..., `trace`).
    pub part: String,
    /// The command line that ran it, as a user would type it.
    pub command: String,
    /// Wall-clock seconds it took.
    pub seconds: f64,
    /// `ok`, or the error that stopped it.
    pub outcome: String,
}

/// A part of the lab: its directory name, its title and its section of docs/LAB.md.
#[derive(Clone, Copy, Debug)]
pub struct Part {
    /// The name of its command and of its primary result directory.
    pub name: &'static str,
    /// The heading of its section in the report.
    pub title: &'static str,
    /// The anchor of its section in docs/LAB.md.
    pub lab_anchor: &'static str,
    /// The paper's evaluation figures and tables this part does not draw, each with why.
    pub gaps: &'static [(&'static str, &'static str)],
    /// Sections of the primary directory's summary.md, by the start of their heading,
    /// copied into the report: the paper's tables the part measures but draws no figure of.
    pub tables: &'static [&'static str],
}

/// Every part, in the order of the report.
pub const PARTS: [Part; 6] = [
    Part {
        name: "paper1",
        title: "Paper 1: file-system hints for inline block deduplication",
        lab_anchor: "paper-1",
        gaps: &[
            (
                "Figs. 5.5 and 5.6 (NILFS2: empty files in one directory, a directory tree)",
                "NILFS2 is a kernel module this machine cannot load; the deferred deduplication \
                 that stands in for its dedup-on-GC is measured in Figs. 5.7-5.8",
            ),
            (
                "Table 5.2's NILFS2 column",
                "NILFS2, as above; the ext3 column is measured",
            ),
            (
                "Figs. 2.1-4.4 and Table 4.1",
                "the storage stack, the design, the device mapper, on-disk layouts and lines of \
                 code: no measurement to reproduce",
            ),
        ],
        tables: &[],
    },
    Part {
        name: "paper2",
        title: "Paper 2: RevDedup, reverse deduplication for backups",
        lab_anchor: "paper-2",
        gaps: &[(
            "Figs. 1-3 and Table 1",
            "the design (operations, reverse deduplication, reference management) and the \
             parameters of the synthetic data sets, which the lab's generator takes (docs/LAB.md)",
        )],
        tables: &[],
    },
    Part {
        name: "paper3",
        title: "Paper 3: selective offline deduplication on the file system face",
        lab_anchor: "paper-3-selective-offline-deduplication-on-the-file-system-face",
        gaps: &[
            (
                "Table 5, Figs. 12 and 13 (a desktop user's and a developer's two weeks)",
                "the paper's users' files and their access traces are not public; the real-world \
                 workload here is successive releases of a source tree",
            ),
            (
                "Fig. 14 as a CDF (read response times of the rank-1 files, desktop user)",
                "the releases workload's rank-1 files are few; their sequential read \
                 throughput per system stands in the Table 6 section instead",
            ),
            (
                "Fig. 8 (file sizes of the synthetic workloads)",
                "the generator draws sizes from a skewed distribution of its own (docs/LAB.md); not drawn",
            ),
            (
                "Figs. 1, 2, 4-7 and Tables 1-3",
                "the design (layouts, ranks, queues, the ranking algorithm and its parameters): \
                 no measurement to reproduce",
            ),
        ],
        tables: &["Table 4", "Table 6 and Fig. 14"],
    },
    Part {
        name: "trace",
        title: "Paper 4 §4.1: content-addressed read cache (trace replay)",
        lab_anchor: "paper-4-41-content-addressed-read-cache-trace-replay",
        gaps: &[(
            "Figs. 5-7",
            "the architecture, the content cache's data structure and the scratch spaces: no \
             measurement to reproduce",
        )],
        tables: &[],
    },
    Part {
        name: "paper4",
        title: "Paper 4 §4.2-4.5: replica retrieval, selective duplication, I/O deduplication \
                (HDD model)",
        lab_anchor: "paper-4-42-45-replica-retrieval-and-selective-duplication-hdd-model",
        gaps: &[(
            "Table 2 (static similarity of the traced disks)",
            "it needs the traced systems' disk images, which are not public; Fig. 3's copies per \
             block read are measured on the trace's own content instead",
        )],
        tables: &[],
    },
    Part {
        name: "paper5",
        title: "Paper 5: deduplication on flash",
        lab_anchor: "paper-5-deduplication-on-flash-flash-mode",
        gaps: &[],
        tables: &[],
    },
];

/// One row of a figure's table: what is compared, the paper's value, ours.
struct Comparison {
    measure: String,
    paper: String,
    ours: String,
}

fn row(
    measure: impl Into<String>,
    paper: impl Into<String>,
    ours: impl Into<String>,
) -> Comparison {
    Comparison {
        measure: measure.into(),
        paper: paper.into(),
        ours: ours.into(),
    }
}

/// A figure the report knows: its file, caption, comparison and the reason for the gap.
struct KnownFigure {
    part: &'static str,
    file: &'static str,
    caption: &'static str,
    compare: fn(&Value) -> Vec<Comparison>,
    why: &'static str,
}

const KNOWN_FIGURES: &[KnownFigure] = &[
    KnownFigure {
        part: "paper1",
        file: "paper1-uniqueness.svg",
        caption: "Table 5.1: distinct chunks of a new ext3 and ext4 before and after empty files \
                  in one directory",
        compare: paper1_uniqueness,
        why: "each ext inode (256 bytes) carries its own number and times, so two fit in a \
              512-byte chunk and every chunk of a written inode table is new, as the paper found \
              (1,000,000 inodes fill 500,000 chunks; the directory adds the rest); a new file \
              system is nearly all zeros in both, ours with more distinct chunks mostly because \
              today's mkfs reserves descriptor blocks for resizing (without them: 93). At 4 KiB \
              the same metadata is as large a share of the volume",
    },
    KnownFigure {
        part: "paper1",
        file: "paper1-metadata.svg",
        caption: "Fig. 5.1: empty files created in one directory, ops/s with and without hints",
        compare: paper1_metadata,
        why: "the hints remove every on-disk index lookup and nothing else in our stack is slow, \
              so the speed-up grows with the injected latency far past the paper's (whose disk \
              writes cost 200-300 µs); 4 KiB blocks give metadata more weight in the dedup ratio",
    },
    KnownFigure {
        part: "paper1",
        file: "paper1-tree.svg",
        caption: "Fig. 5.2: empty files created and deleted at once in a directory tree, creates/s \
                  and deletes/s with and without hints",
        compare: paper1_tree,
        why: "as for Fig. 5.1: every lookup the hints remove is a checkpoint write of journaled \
              metadata, the only slow thing in our stack, so the gain follows the injected \
              latency; creates and deletes share one journal, so they gain alike",
    },
    KnownFigure {
        part: "paper1",
        file: "paper1-journal.svg",
        caption: "Fig. 5.3: appends with fsync, ordered journal, ops/s with and without hints",
        compare: paper1_journal,
        why: "our Bloom filter answers the new journal blocks without I/O; the disk lookups left \
              are the duplicate data blocks, which no hint covers",
    },
    KnownFigure {
        part: "paper1",
        file: "paper1-data-journal.svg",
        caption: "Fig. 5.4: appends to many files with fsync, data=journal, ops/s and CPU per \
                  append with and without hints",
        compare: paper1_data_journal,
        why: "without hints every data block is fingerprinted twice (its journal copy, then its \
              checkpoint) and the checkpoint copy is a duplicate that the filter cannot exclude; \
              with hints the journal copy is stored without either. Our fingerprint (BLAKE3 on \
              4 KiB) costs about a microsecond where the paper's MD5 on eight 512-byte chunks was \
              the bottleneck, so the CPU saved is a smaller share of ours",
    },
    KnownFigure {
        part: "paper1",
        file: "paper1-copy.svg",
        caption: "Table 5.2: copy time with and without the prefetch hint",
        compare: paper1_copy,
        why: "prefetch is free in onecopy (a read block's fingerprint is in its chunk record) \
              where the paper paid the index latency per prefetch",
    },
    KnownFigure {
        part: "paper1",
        file: "paper1-file-server.svg",
        caption: "Figs. 5.7-5.8: filebench's fileserver, ops/s and CPU per operation without \
                  hints, with hints, and with hints and deferred deduplication (the paper's NILFS2 \
                  with dedup-on-GC)",
        compare: paper1_fileserver,
        why: "the paper's ext3 run was CPU-bound on MD5 of 512-byte chunks with 50 threads on 24 \
              cores; ours hashes 4 KiB with BLAKE3 on 2 shared cores, and the lookups left are \
              the duplicate data blocks, which hints do not cover. Deferred deduplication moves \
              all lookups out of the run into the pass, as NILFS2's garbage collection did; \
              NILFS2 itself is not in this kernel, so ext4 stands in",
    },
    KnownFigure {
        part: "paper2",
        file: "table2-unique-throughput.svg",
        caption: "Table 2: backup and restore throughput on unique data, beside this machine's \
                  limits measured in the same run",
        compare: paper2_unique,
        why: PAPER2_UNIQUE_WHY,
    },
    KnownFigure {
        part: "paper2",
        file: "fig4-storage-saving.svg",
        caption: "Fig. 4: storage saving after the last backup",
        compare: paper2_saving,
        why: "20 weeks (4 with --quick) instead of 78 repeat fewer versions, on images of 384 MiB \
              (64 MiB) instead of 8 GB, and typescript releases stand in for the paper's VM \
              images",
    },
    KnownFigure {
        part: "paper2",
        file: "fig5-backup-throughput.svg",
        caption: "Fig. 5 and Table 3: backup throughput and the second SG1 backup's index time",
        compare: paper2_backup,
        why: "our throughputs include chunking and fingerprinting (the paper precomputed them), \
              so the chunker and the CPU set the ceiling, not the disk. Table 3's write column is \
              reversed (Conv writes faster than RevDedup here, slower in the paper) because \
              packing costs us about the same per byte in both modes plus a few microseconds per \
              segment, and Conv writes several times fewer bytes (it deduplicates the 4 KiB \
              chunks RevDedup rewrites as whole segments): the rows above give both. The paper's \
              Conv paid far more per small segment than ours does, and its data writes included \
              the disk, which ours leave to the background writeback and the seal",
    },
    KnownFigure {
        part: "paper2",
        file: "fig6-restore-throughput.svg",
        caption: "Fig. 6: restore throughput by backup",
        compare: paper2_restore,
        why: "the virtual disk's host cache makes fragmented reads cheap, so Conv's penalty for \
              new backups is much smaller than on the paper's RAID. For GP's newest backup RevDedup \
              reads the same bytes as Conv in a third of the reads from fewer containers, and \
              both spend the same processor time (rows above): the restore is mostly CRC checks, \
              copies and the lab's BLAKE3 check of the stream, not seeks, so the read pattern \
              buys less than on the paper's disks, and which mode restores it faster changes from \
              run to run",
    },
    KnownFigure {
        part: "paper2",
        file: "fig7-reverse-throughput.svg",
        caption: "Fig. 7: reverse deduplication throughput, SG1",
        compare: paper2_reverse,
        why: "reverse deduplication reads only the segments that changed, and reads are cheap on \
              this disk",
    },
    KnownFigure {
        part: "paper2",
        file: "fig8-prefetch.svg",
        caption: "Fig. 8: restore throughput with and without prefetching, SG1",
        compare: paper2_prefetch,
        why: "prefetching hides disk latency, and this virtual disk has little; the gains vary \
              between runs by about ten points",
    },
    KnownFigure {
        part: "paper2",
        file: "fig9-live-window.svg",
        caption: "Fig. 9: live window length against saving and restore throughput, SG1",
        compare: paper2_live_window,
        why:
            "our windows are 1, 2 and 4 backups of 20 (4 with --quick) where the paper's are 1, 5 \
              and 17 of 78, and fragmentation is nearly free on this disk",
    },
    KnownFigure {
        part: "paper2",
        file: "fig10-deletion.svg",
        caption: "Fig. 10: deleting backups by time stamps and by mark and sweep, SG1: one by one \
                  (a), the n oldest at once (b), the oldest of a growing store (c)",
        compare: paper2_deletion,
        why: "the paper gives no numbers in its text; the shape is the finding: by time stamps \
              small for one backup and for many, mark and sweep paying one scan of every \
              container (the sweep) plus a mark that grows with the backups deleted. Our mark is \
              the same metadata step as the time-stamp deletion, which already drops the \
              containers that died, so our sweep reads every container but rewrites few",
    },
    KnownFigure {
        part: "paper2",
        file: "peers-typescript.svg",
        caption: "onecopy, restic and borg on the typescript releases (the issue's goals)",
        compare: paper2_goals,
        why: "not in the paper: the goals compare onecopy's backup store with the tools a user \
              would otherwise choose",
    },
    KnownFigure {
        part: "paper3",
        file: "paper3-fig3.svg",
        caption: "Fig. 3: dedup ratio and sequential read throughput against the chunk size",
        compare: no_rows,
        why: PAPER3_WHY,
    },
    KnownFigure {
        part: "paper3",
        file: "paper3-fig9.svg",
        caption: "Fig. 9: read response times, synthetic workload with a high dedup ratio",
        compare: no_rows,
        why: PAPER3_WHY,
    },
    KnownFigure {
        part: "paper3",
        file: "paper3-fig10.svg",
        caption: "Fig. 10: read response times, synthetic workload with a low dedup ratio",
        compare: no_rows,
        why: PAPER3_WHY,
    },
    KnownFigure {
        part: "paper3",
        file: "paper3-fig11.svg",
        caption: "Fig. 11: sequential read throughput against dedup ratio of the sequentially \
                  read files",
        compare: no_rows,
        why: PAPER3_WHY,
    },
    KnownFigure {
        part: "paper3",
        file: "paper3-fig15.svg",
        caption: "Fig. 15: the I/O monitor's cost to whole programs (paper: under 7% for the \
                  disk-intensive ones)",
        compare: no_rows,
        why: PAPER3_WHY,
    },
    KnownFigure {
        part: "paper3",
        file: "paper3-fig16-17.svg",
        caption: "Figs. 16 and 17: interference of the offline deduplication with a running \
                  workload",
        compare: no_rows,
        why: PAPER3_WHY,
    },
    KnownFigure {
        part: "trace",
        file: "paper4-cache.svg",
        caption: "Figs. 8-9: read and write hits of sector- and content-addressed caches, ARC \
                  and LRU",
        compare: trace_cache,
        why: "the FIU mail excerpt holds 10,000 requests, not the paper's weeks of web-vm: its \
              repeated reads re-read the address just read, so content addressing adds read hits \
              only where content repeats at other addresses, which here is in writes",
    },
    KnownFigure {
        part: "trace",
        file: "paper4-workload.svg",
        caption: "Table 1, Figs. 2-4: locations against contents, reuse distances by sector and \
                  by content, copies per block read, content read again in the next interval",
        compare: trace_workload,
        why: "the excerpt is 23 seconds of one day where the paper measured weeks: its repeated \
              reads re-read the page just read, so content comes back later than its sector for \
              reads (not sooner, as in the paper), and no content comes back after the first \
              interval; writes show the paper's direction. A trace shows only the locations it \
              touches, so copies per block read is a lower bound of the paper's disk-wide count",
    },
    KnownFigure {
        part: "paper4",
        file: "paper4-fig10.svg",
        caption: "Fig. 10: per-request disk read time without and with dynamic replica \
                  retrieval (no cache, no duplication)",
        compare: paper4_fig10,
        why: PAPER4_WHY,
    },
    KnownFigure {
        part: "paper4",
        file: "paper4-fig11.svg",
        caption: "Fig. 11: per-request disk read time with selective duplication added",
        compare: paper4_fig11,
        why: PAPER4_WHY,
    },
    KnownFigure {
        part: "paper4",
        file: "paper4-table3.svg",
        caption: "Table 3: total disk read time, the vanilla system (sector cache) against I/O \
                  deduplication (content cache, replica retrieval, selective duplication)",
        compare: paper4_table3,
        why: "with the paper's 200 MB the cache holds most of a synthetic day (about 80% of \
              reads hit a sector cache, where the paper calls mail cache-unfriendly), so the \
              content cache adds 1-3% of hits, mostly inside runs (fewer blocks, hardly fewer \
              positionings), and duplicates are almost never read from the disk; with the cache \
              scaled to the day, duplication adds 1-2 points; replica retrieval gives most of \
              the gain (docs/LAB.md)",
    },
    KnownFigure {
        part: "paper4",
        file: "paper4-fig12.svg",
        caption: "Fig. 12: the content cache's lookup cost against its size",
        compare: paper4_fig12,
        why: "nanoseconds on this machine against the paper's cycles on a 2 GHz Pentium 4; our \
              tables size themselves, so the paper's bucket-count panel has no counterpart; \
              BLAKE3 of 4 KiB takes about 1.5 µs where the paper's MD5 took 100,000 cycles",
    },
    KnownFigure {
        part: "paper4",
        file: "paper4-fig13.svg",
        caption: "Fig. 13: the content cache's insertion cost against its size",
        compare: paper4_fig13,
        why: "as for Fig. 12; an insertion into a full cache evicts, and copies 4 KiB into \
              its slot",
    },
    KnownFigure {
        part: "paper5",
        file: "paper5-fig1.svg",
        caption: "Fig. 1: a 10-block file written 15 times, with and without deduplication",
        compare: paper5_small,
        why: "the first write creates a container, the later ones only hash, compare and remap, \
              as in YAFFS2; absolute times are not comparable with the paper's emulator",
    },
    KnownFigure {
        part: "paper5",
        file: "paper5-fig2.svg",
        caption: "Fig. 2: an 800-block file written 15 times, with and without deduplication",
        compare: paper5_large,
        why:
            "on RAM and a cached virtual disk, reading 800 blocks back to compare them costs about \
              what storing them does; the NAND model in results.csv adds the emulator's costs",
    },
    KnownFigure {
        part: "paper5",
        file: "paper5-fig3.svg",
        caption: "Fig. 3: 15 writes of a 1000-block file, bytes stored and time",
        compare: paper5_fig3,
        why: "the paper's Fig. 3 lost its axes in our copy (only \"1.18\" survives), so there is \
              no number to put beside ours",
    },
    KnownFigure {
        part: "paper5",
        file: "paper5-cache.svg",
        caption: "§3.6: LFU index cache size against hit rate and throughput",
        compare: paper5_cache,
        why: "under uniform random rewrites no policy beats the fraction of the index cached, so \
              the cache matches the whole index only when it holds nearly all of it, as the paper \
              found",
    },
];

/// Why Table 2's ratios differ from the paper's.
const PAPER2_UNIQUE_WHY: &str = "the paper timed its writes with fingerprints computed before \
     the run; ours chunk, fingerprint and CRC-check every byte on two cores. The raw write is one \
     write and one fdatasync of the whole file, while the store starts each container's \
     writeback as it fills, which can overlap the disk with its processing (not timed apart), \
     so it can pass the raw write; the raw read is the host's cache of the virtual disk, which needs almost no \
     processor. What the store costs is its CPU seconds per GB (summary.md); the raw rates vary \
     between runs by up to 2x, so only ratios within a run mean anything";

/// Paper 3's results change shape as its lab grows, so its numbers are left to its summary.
const PAPER3_WHY: &str = "the numbers beside the paper's, and the reasons they differ, are in the \
                          part's summary.md and LAB.md's paper 3 section";

fn no_rows(_results: &Value) -> Vec<Comparison> {
    Vec::new()
}

/// Writes the report of `directory` to `directory/README.md`; returns its path.
pub fn write_report(directory: &Path) -> Result<PathBuf> {
    let text = render(directory)?;
    let path = directory.join(REPORT_FILE);
    write_text(&path, &text)?;
    Ok(path)
}

/// Reads the record of `lab all`'s runs in `directory`, or an empty one.
pub fn read_runs(directory: &Path) -> Result<Vec<PartRun>> {
    let path = directory.join(RUNS_FILE);
    if path.exists() {
        read_json(&path)
    } else {
        Ok(Vec::new())
    }
}

/// The report of the result directories in `directory`, as Markdown.
pub fn render(directory: &Path) -> Result<String> {
    let runs = read_runs(directory)?;
    let lab_link = lab_document_link(directory);
    let mut page = String::new();
    page.push_str("# Lab report\n\n");
    let _ = writeln!(
        page,
        "Every figure the lab draws, with the paper's numbers beside ours where the paper gives \
         them. This page is generated from the result directories beside it (`onecopy lab \
         report --out DIR` redraws it, `onecopy lab all --out DIR` reruns everything and redraws \
         it); how each experiment works and the full discussion of every gap are in {lab_link}.\n"
    );
    for part in PARTS {
        render_part(&mut page, directory, part, &runs, &lab_link)?;
    }
    render_runs(&mut page, &runs);
    Ok(page)
}

/// `[docs/LAB.md](relative path)` when LAB.md is found above `directory`, else the plain name.
fn lab_document_link(directory: &Path) -> String {
    let mut relative = PathBuf::new();
    let absolute = fs::canonicalize(directory).unwrap_or_else(|_| directory.to_path_buf());
    for ancestor in absolute.ancestors() {
        if ancestor.join("LAB.md").is_file() {
            return format!("[docs/LAB.md]({})", relative.join("LAB.md").display());
        }
        if ancestor.join("docs/LAB.md").is_file() {
            return format!("[docs/LAB.md]({})", relative.join("docs/LAB.md").display());
        }
        relative.push("..");
    }
    "docs/LAB.md".to_string()
}

/// The result directories of `part` in `directory`: the primary first, then the variants.
pub fn result_directories(directory: &Path, part: &str) -> Result<Vec<String>> {
    let mut names = Vec::new();
    let entries = match fs::read_dir(directory) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(names),
        Err(error) => {
            return Err(crate::LabError::io(
                format!("listing {}", directory.display()),
                error,
            ))
        }
    };
    for entry in entries {
        let entry = entry.context_io(|| format!("listing {}", directory.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let belongs = name == part || name.starts_with(&format!("{part}-"));
        if belongs && entry.path().is_dir() {
            names.push(name);
        }
    }
    names.sort();
    if let Some(position) = names.iter().position(|name| name == part) {
        let primary = names.remove(position);
        names.insert(0, primary);
    }
    Ok(names)
}

/// The figure files (`.svg`, `.png`) of a result directory, by name.
pub fn figure_files(directory: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in
        fs::read_dir(directory).context_io(|| format!("listing {}", directory.display()))?
    {
        let entry = entry.context_io(|| format!("listing {}", directory.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".svg") || name.ends_with(".png") {
            names.push(name);
        }
    }
    names.sort_by_key(|name| figure_order(name));
    Ok(names)
}

/// Sorts `fig10` after `fig9`: by the text before the first number, then by the number.
fn figure_order(name: &str) -> (String, u64, String) {
    let start = name.find(|character: char| character.is_ascii_digit());
    let Some(start) = start else {
        return (name.to_string(), 0, String::new());
    };
    // Skip the paper's own number in `paperN-...` so the figure number decides.
    let (prefix, rest) = name.split_at(start);
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let after = &rest[digits.len()..];
    if prefix.ends_with("paper") {
        let (inner_prefix, number, tail) = figure_order(after);
        return (format!("{prefix}{digits}{inner_prefix}"), number, tail);
    }
    (
        prefix.to_string(),
        digits.parse().unwrap_or(0),
        after.to_string(),
    )
}

fn render_part(
    page: &mut String,
    directory: &Path,
    part: Part,
    runs: &[PartRun],
    lab_link: &str,
) -> Result<()> {
    let _ = writeln!(page, "## {}\n", part.title);
    let names = result_directories(directory, part.name)?;
    let run = runs.iter().find(|run| run.part == part.name);
    if let Some(run) = run {
        let _ = writeln!(
            page,
            "Made by `{}` in {:.0} s{}.\n",
            run.command,
            run.seconds,
            if run.outcome == "ok" {
                String::new()
            } else {
                format!(", which failed: {}", run.outcome)
            }
        );
    }
    let Some((primary, variants)) = names.split_first() else {
        let _ = writeln!(
            page,
            "No result directory `{}` here: run `onecopy lab {}` with `--out` pointing here.\n",
            part.name, part.name
        );
        render_gaps(page, part);
        return Ok(());
    };
    let primary_path = directory.join(primary);
    let results = read_results_value(&primary_path);
    let summary = if primary_path.join("summary.md").is_file() {
        format!(", tables in [{primary}/summary.md]({primary}/summary.md)")
    } else {
        String::new()
    };
    let _ = writeln!(
        page,
        "Results in [{primary}/]({primary}/){summary}; discussion in {}.\n",
        section_link(lab_link, part.lab_anchor)
    );
    if let Err(problem) = &results {
        let _ = writeln!(page, "The numbers below are missing: {problem}.\n");
    }
    let empty = Value::Null;
    let results = results.as_ref().unwrap_or(&empty);
    let mut figures = figure_files(&primary_path)?;
    // The known figures in the paper's order, then any other by its number.
    figures.sort_by_key(|file| {
        KNOWN_FIGURES
            .iter()
            .filter(|figure| figure.part == part.name)
            .position(|figure| figure.file == file)
            .unwrap_or(usize::MAX)
    });
    if figures.is_empty() {
        let _ = writeln!(page, "No figure in `{primary}/`.\n");
    }
    for file in &figures {
        render_figure(page, primary, file, part.name, results);
    }
    render_tables(page, &primary_path, part)?;
    render_gaps(page, part);
    if !variants.is_empty() {
        let _ = writeln!(page, "### Other runs of this part\n");
        for variant in variants {
            let variant_path = directory.join(variant);
            let links: Vec<String> = figure_files(&variant_path)?
                .iter()
                .map(|file| format!("[{file}]({variant}/{file})"))
                .collect();
            let summary = if variant_path.join("summary.md").is_file() {
                format!("[summary]({variant}/summary.md)")
            } else {
                format!("[results]({variant}/)")
            };
            let figures = if links.is_empty() {
                String::new()
            } else {
                format!("; figures {}", links.join(", "))
            };
            let _ = writeln!(page, "- `{variant}/`: {summary}{figures}");
        }
        page.push('\n');
    }
    Ok(())
}

/// The sections of the part's summary.md named in [`Part::tables`], as they are there, one
/// heading level down; a section that is missing is said to be.
fn render_tables(page: &mut String, primary: &Path, part: Part) -> Result<()> {
    if part.tables.is_empty() {
        return Ok(());
    }
    let path = primary.join("summary.md");
    let summary = if path.is_file() {
        fs::read_to_string(&path).context_io(|| format!("reading {}", path.display()))?
    } else {
        String::new()
    };
    for start in part.tables {
        let heading = format!("## {start}");
        let Some(at) = summary.find(&heading) else {
            let _ = writeln!(
                page,
                "### {start}\n\nNot in `summary.md`: run the part again.\n"
            );
            continue;
        };
        let section = &summary[at..];
        let end = section[heading.len()..]
            .find("\n## ")
            .map_or(section.len(), |end| end + heading.len() + 1);
        let _ = writeln!(page, "#{}", section[..end].trim_end());
        page.push('\n');
    }
    Ok(())
}

/// The paper's figures and tables this part does not draw, and why.
fn render_gaps(page: &mut String, part: Part) {
    if part.gaps.is_empty() {
        return;
    }
    let _ = writeln!(page, "### Not reproduced here, and why\n");
    for (what, why) in part.gaps {
        let _ = writeln!(page, "- {what}: {why}.");
    }
    page.push('\n');
}

/// A link to `anchor` in LAB.md, or the document's plain name when it was not found.
fn section_link(lab_link: &str, anchor: &str) -> String {
    match lab_link.strip_suffix(')') {
        Some(without) => format!("{without}#{anchor})"),
        None => lab_link.to_string(),
    }
}

fn read_results_value(directory: &Path) -> std::result::Result<Value, String> {
    let path = directory.join("results.json");
    if !path.is_file() {
        return Err(format!("{} is not there", path.display()));
    }
    read_json::<Value>(&path).map_err(|error| error.to_string())
}

fn render_figure(page: &mut String, directory: &str, file: &str, part: &str, results: &Value) {
    let known = KNOWN_FIGURES
        .iter()
        .find(|figure| figure.part == part && figure.file == file);
    let caption = match known {
        Some(figure) => figure.caption.to_string(),
        None => generic_caption(file),
    };
    let _ = writeln!(page, "### {caption}\n");
    let _ = writeln!(page, "![{file}]({directory}/{file})\n");
    let Some(figure) = known else {
        let _ = writeln!(
            page,
            "`{directory}/{file}`; its numbers are in `{directory}/summary.md` and the \
             discussion beside the paper's in LAB.md.\n"
        );
        return;
    };
    let rows = (figure.compare)(results);
    if !rows.is_empty() {
        page.push_str("| measure | paper | ours |\n| --- | --- | --- |\n");
        for row in rows {
            let _ = writeln!(page, "| {} | {} | {} |", row.measure, row.paper, row.ours);
        }
        page.push('\n');
    }
    let _ = writeln!(page, "Why they differ: {}.\n", figure.why);
}

/// "Fig. 9" for `paper3-fig9.svg`, "Figs. 16-17" for `paper3-fig16-17.svg`, else the name.
fn generic_caption(file: &str) -> String {
    let stem = file.rsplit_once('.').map_or(file, |(stem, _)| stem);
    match stem.split_once("fig") {
        Some((_, numbers)) if numbers.starts_with(|c: char| c.is_ascii_digit()) => {
            let numbers = numbers
                .split('-')
                .take_while(|part| !part.is_empty() && part.chars().all(|c| c.is_ascii_digit()));
            let numbers: Vec<&str> = numbers.collect();
            let label = if numbers.len() > 1 { "Figs." } else { "Fig." };
            format!("{label} {} (`{file}`)", numbers.join("-"))
        }
        _ => format!("`{file}`"),
    }
}

fn render_runs(page: &mut String, runs: &[PartRun]) {
    if runs.is_empty() {
        return;
    }
    page.push_str("## How this directory was made\n\n");
    page.push_str("| part | command | seconds | outcome |\n| --- | --- | --- | --- |\n");
    let mut total = 0.0;
    for run in runs {
        total += run.seconds;
        let _ = writeln!(
            page,
            "| {} | `{}` | {:.0} | {} |",
            run.part,
            run.command,
            run.seconds,
            run.outcome.replace('|', "\\|").replace('\n', " ")
        );
    }
    let _ = writeln!(page, "| all | | {total:.0} | |\n");
}

// Reading results.json tolerantly.

fn list<'a>(value: &'a Value, key: &str) -> &'a [Value] {
    value
        .get(key)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn text<'a>(value: &'a Value, key: &str) -> &'a str {
    value.get(key).and_then(Value::as_str).unwrap_or("")
}

/// The number at a dotted `path` ("timing.seconds").
fn number(value: &Value, path: &str) -> Option<f64> {
    path.split('.')
        .try_fold(value, |value, key| value.get(key))
        .and_then(Value::as_f64)
}

fn mean(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let (sum, count) = values
        .into_iter()
        .filter(|value| value.is_finite())
        .fold((0.0, 0usize), |(sum, count), value| {
            (sum + value, count + 1)
        });
    (count > 0).then(|| sum / count as f64)
}

fn median(mut values: Vec<f64>) -> Option<f64> {
    values.retain(|value| value.is_finite());
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    Some(values[values.len() / 2])
}

fn ratio_text(value: Option<f64>) -> String {
    value.map_or("n/a".to_string(), |value| format!("{value:.2}x"))
}

fn percent_text(value: Option<f64>) -> String {
    value.map_or("n/a".to_string(), |value| format!("{value:.1}%"))
}

fn change_text(value: Option<f64>) -> String {
    value.map_or("n/a".to_string(), |value| format!("{value:+.1}%"))
}

fn fixed(value: Option<f64>, digits: usize) -> String {
    value.map_or("n/a".to_string(), |value| format!("{value:.digits$}"))
}

fn latency_text(latency_ns: f64) -> String {
    if latency_ns >= 1e6 {
        format!("{} ms", latency_ns / 1e6)
    } else {
        format!("{} µs", latency_ns / 1e3)
    }
}

// Paper 1.

/// The setup of a paper 1 run: `off`, `on` or `deferred`.
fn paper1_setup(run: &Value) -> &'static str {
    let flag = |key: &str| run.get(key).and_then(Value::as_bool).unwrap_or(false);
    match (flag("hints"), flag("deferred")) {
        (false, _) => "off",
        (true, false) => "on",
        (true, true) => "deferred",
    }
}

/// A measure of one paper 1 run, by name: a field, or one derived as the lab derives it.
fn paper1_measure(run: &Value, measure: &str) -> Option<f64> {
    let pass = run.get("deferred_pass").filter(|pass| !pass.is_null());
    match measure {
        "cpu_per_operation" => {
            let cpu = |key: &str| number(run, &format!("cpu.{key}"));
            let total = cpu("process")? + cpu("nbdfuse")? - cpu("injected_wait_busy")?;
            Some(total.max(0.0) * 1e6 / number(run, "operations")?)
        }
        "final_dedup_ratio" => pass
            .and_then(|pass| number(pass, "dedup_ratio"))
            .or_else(|| number(run, "dedup_ratio")),
        "final_stored_bytes" => pass
            .and_then(|pass| number(pass, "stored_bytes"))
            .or_else(|| number(run, "stored_bytes")),
        "creates_per_second" | "deletes_per_second" => {
            let name = &measure[..6];
            list(run, "kinds")
                .iter()
                .find(|kind| text(kind, "name") == name)
                .and_then(|kind| Some(number(kind, "operations")? / number(kind, "seconds")?))
        }
        field => number(run, field),
    }
}

/// The distinct (policy, latency) cells of `workload`, in the order of the runs.
fn paper1_cells(results: &Value, workload: &str) -> Vec<(String, f64)> {
    let mut cells: Vec<(String, f64)> = Vec::new();
    for run in list(results, "runs") {
        if text(run, "workload") != workload {
            continue;
        }
        let cell = (
            text(run, "policy").to_string(),
            number(run, "latency_ns").unwrap_or(f64::NAN),
        );
        if !cells.contains(&cell) {
            cells.push(cell);
        }
    }
    cells.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    cells
}

fn paper1_mean(
    results: &Value,
    workload: &str,
    cell: Option<&(String, f64)>,
    setup: &str,
    measure: &str,
) -> Option<f64> {
    mean(
        list(results, "runs")
            .iter()
            .filter(|run| text(run, "workload") == workload)
            .filter(|run| {
                cell.is_none_or(|cell| {
                    text(run, "policy") == cell.0 && number(run, "latency_ns") == Some(cell.1)
                })
            })
            .filter(|run| paper1_setup(run) == setup)
            .filter_map(|run| paper1_measure(run, measure)),
    )
}

/// Per cell: `setup` against hints off for `measure`, as `setup / off` (or `off / setup` when
/// `inverse`), beside the paper's number for the cell's latency.
#[allow(clippy::too_many_arguments)]
fn paper1_ratios(
    results: &Value,
    workload: &str,
    label: &str,
    setup: &str,
    measure: &str,
    inverse: bool,
    paper: impl Fn(f64) -> String,
) -> Vec<Comparison> {
    paper1_cells(results, workload)
        .iter()
        .map(|cell| {
            let off = paper1_mean(results, workload, Some(cell), "off", measure);
            let other = paper1_mean(results, workload, Some(cell), setup, measure);
            let ratio = match (off, other) {
                (Some(off), Some(other)) if inverse && other > 0.0 => Some(off / other),
                (Some(off), Some(other)) if !inverse && off > 0.0 => Some(other / off),
                _ => None,
            };
            row(
                format!(
                    "{label}, {}, {}",
                    cell.0.to_uppercase(),
                    latency_text(cell.1)
                ),
                paper(cell.1),
                ratio_text(ratio),
            )
        })
        .collect()
}

/// The dedup ratio without and with hints over all runs of `workload`.
fn paper1_dedup_row(results: &Value, workload: &str, setup: &str, paper: &str) -> Comparison {
    let off = paper1_mean(results, workload, None, "off", "final_dedup_ratio");
    let on = paper1_mean(results, workload, None, setup, "final_dedup_ratio");
    row(
        format!(
            "dedup ratio without / {}",
            if setup == "on" {
                "with hints"
            } else {
                "with hints and the deferred pass"
            }
        ),
        paper,
        format!("{} / {}", fixed(off, 2), fixed(on, 2)),
    )
}

/// Bytes stored with hints against without, over all runs of `workload`.
fn paper1_space_row(results: &Value, workload: &str, paper: &str) -> Comparison {
    let off = paper1_mean(results, workload, None, "off", "final_stored_bytes");
    let on = paper1_mean(results, workload, None, "on", "final_stored_bytes");
    let change = match (off, on) {
        (Some(off), Some(on)) if off > 0.0 => Some(100.0 * (on / off - 1.0)),
        _ => None,
    };
    row(
        "disk space with hints against without",
        paper,
        change_text(change),
    )
}

fn paper1_uniqueness(results: &Value) -> Vec<Comparison> {
    let mut rows = Vec::new();
    for record in list(results, "uniqueness") {
        let file_system = text(record, "file_system");
        let chunk = number(record, "after.chunk_bytes").unwrap_or(f64::NAN);
        let census = |phase: &str| {
            let distinct = number(record, &format!("{phase}.distinct"))?;
            let chunks = number(record, &format!("{phase}.chunks"))?;
            Some(format!(
                "{} ({:.3}%)",
                thousands(distinct),
                100.0 * distinct / chunks
            ))
        };
        let paper = |before: bool| match (file_system, chunk as u64) {
            ("ext3", 512) if before => "43 (0.002%)".to_string(),
            ("ext3", 512) => "548,623 (26%)".to_string(),
            _ => "not measured (NILFS2 at 512 B: 22 before, 309,842 or 14% after)".to_string(),
        };
        let files = number(record, "files").map_or("n/a".into(), thousands);
        rows.push(row(
            format!("{file_system}, {chunk} B chunks: distinct after mkfs"),
            paper(true),
            census("before").unwrap_or("n/a".into()),
        ));
        rows.push(row(
            format!("{file_system}, {chunk} B chunks: distinct after {files} empty files"),
            paper(false),
            census("after").unwrap_or("n/a".into()),
        ));
    }
    rows
}

/// `1234567` as `1,234,567`.
fn thousands(value: f64) -> String {
    let digits = format!("{:.0}", value);
    let mut grouped = String::new();
    for (position, digit) in digits.chars().enumerate() {
        if position > 0 && (digits.len() - position).is_multiple_of(3) && digit.is_ascii_digit() {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    grouped
}

fn paper1_cpu_rows(
    results: &Value,
    workload: &str,
    setup: &str,
    paper: impl Fn(f64) -> String,
) -> Vec<Comparison> {
    let label = if setup == "on" {
        "CPU per operation with hints against without"
    } else {
        "CPU per operation deferred against without hints"
    };
    paper1_ratios(
        results,
        workload,
        label,
        setup,
        "cpu_per_operation",
        false,
        paper,
    )
}

fn paper1_metadata(results: &Value) -> Vec<Comparison> {
    let mut rows = paper1_ratios(
        results,
        "metadata",
        "speed-up with hints",
        "on",
        "operations_per_second",
        false,
        |latency| {
            if latency >= 1e7 {
                "2x".to_string()
            } else {
                "1.18x-1.50x".to_string()
            }
        },
    );
    rows.extend(paper1_cpu_rows(results, "metadata", "on", |_| {
        "not given".into()
    }));
    rows.push(paper1_dedup_row(
        results,
        "metadata",
        "on",
        "1.41 / 1.17 (ext3)",
    ));
    rows
}

fn paper1_tree(results: &Value) -> Vec<Comparison> {
    let mut rows = paper1_ratios(
        results,
        "tree",
        "creates/s with hints against without",
        "on",
        "creates_per_second",
        false,
        |latency| match latency {
            l if l <= 1e4 => "1.18x".to_string(),
            l if l >= 1e7 => "over 1.5x".to_string(),
            _ => "between".to_string(),
        },
    );
    rows.extend(paper1_ratios(
        results,
        "tree",
        "deletes/s with hints against without",
        "on",
        "deletes_per_second",
        false,
        |latency| match latency {
            l if l <= 1e4 => "1.15x".to_string(),
            l if l >= 1e7 => "about 2x".to_string(),
            _ => "between".to_string(),
        },
    ));
    rows.extend(paper1_cpu_rows(results, "tree", "on", |_| {
        "not given".into()
    }));
    rows.push(paper1_dedup_row(
        results,
        "tree",
        "on",
        "1.42 / 1.17 (ext3)",
    ));
    rows
}

fn paper1_journal(results: &Value) -> Vec<Comparison> {
    let mut rows = paper1_ratios(
        results,
        "journal",
        "speed-up with hints",
        "on",
        "operations_per_second",
        false,
        |latency| {
            if latency >= 5e5 {
                "about 1.15x".to_string()
            } else {
                "0.98x-0.99x".to_string()
            }
        },
    );
    rows.extend(paper1_cpu_rows(results, "journal", "on", |_| {
        "not given".into()
    }));
    rows.push(paper1_space_row(results, "journal", "+6%"));
    rows
}

fn paper1_data_journal(results: &Value) -> Vec<Comparison> {
    let mut rows = paper1_ratios(
        results,
        "data-journal",
        "speed-up with hints",
        "on",
        "operations_per_second",
        false,
        |_| "2x-3x".to_string(),
    );
    rows.extend(paper1_cpu_rows(results, "data-journal", "on", |latency| {
        if latency <= 1e4 {
            "0.2x (80% fewer cycles)".to_string()
        } else if latency >= 1e7 {
            "0.5x (50% fewer cycles)".to_string()
        } else {
            "between 0.2x and 0.5x".to_string()
        }
    }));
    rows.push(paper1_space_row(results, "data-journal", "+2%"));
    rows
}

/// Paper 1 Table 5.2, ext3 with LRU: copy minutes without and with the prefetch hint.
const PAPER1_COPY_MINUTES: [(f64, f64, f64); 5] = [
    (1e4, 0.74, 0.65),
    (1e5, 1.91, 1.15),
    (5e5, 4.25, 3.13),
    (1e6, 8.73, 6.55),
    (1e7, 78.28, 58.09),
];

fn paper1_copy(results: &Value) -> Vec<Comparison> {
    let mut rows = paper1_ratios(
        results,
        "copy",
        "speed-up with hints",
        "on",
        "elapsed_seconds",
        true,
        |latency| {
            PAPER1_COPY_MINUTES
                .iter()
                .find(|(paper_latency, _, _)| *paper_latency == latency)
                .map_or("n/a".to_string(), |(_, without, with)| {
                    format!("{:.2}x ({without} / {with} min, ext3)", without / with)
                })
        },
    );
    rows.extend(paper1_cpu_rows(results, "copy", "on", |_| {
        "not given".into()
    }));
    rows
}

fn paper1_fileserver(results: &Value) -> Vec<Comparison> {
    let mut rows = paper1_ratios(
        results,
        "file-server",
        "speed-up with hints (Fig. 5.7)",
        "on",
        "operations_per_second",
        false,
        |latency| {
            if latency >= 1e7 {
                "about 1x (both bound by lookups)".to_string()
            } else {
                "1.35x-1.40x where CPU-bound".to_string()
            }
        },
    );
    rows.extend(paper1_cpu_rows(results, "file-server", "on", |_| {
        "0.88x-0.90x (10-12% fewer cycles)".to_string()
    }));
    rows.extend(paper1_ratios(
        results,
        "file-server",
        "speed-up with hints and deferred dedup (Fig. 5.8)",
        "deferred",
        "operations_per_second",
        false,
        |latency| {
            if latency >= 1e7 {
                "over 2x (NILFS2, dedup on GC)".to_string()
            } else if latency <= 1e4 {
                "below 1x (NILFS2 metadata deduplicates)".to_string()
            } else {
                "not given".to_string()
            }
        },
    ));
    rows.extend(paper1_cpu_rows(results, "file-server", "deferred", |_| {
        "about 1x (NILFS2 serialises writes)".to_string()
    }));
    rows.push(paper1_space_row(results, "file-server", "+6.3% (ext3)"));
    rows.push(paper1_dedup_row(
        results,
        "file-server",
        "deferred",
        "not measured (GC ran hourly)",
    ));
    let pass = mean(
        list(results, "runs")
            .iter()
            .filter(|run| text(run, "workload") == "file-server")
            .filter_map(|run| number(run, "deferred_pass.seconds")),
    );
    let run = paper1_mean(results, "file-server", None, "deferred", "elapsed_seconds");
    rows.push(row(
        "deferred pass against the run it follows, mean over latencies",
        "not measured",
        match (pass, run) {
            (Some(pass), Some(run)) => format!("{pass:.1} s after {run:.1} s"),
            _ => "n/a".to_string(),
        },
    ));
    rows
}

// Paper 2.

fn dataset<'a>(results: &'a Value, name: &str) -> Option<&'a Value> {
    list(results, "datasets")
        .iter()
        .find(|dataset| text(dataset, "dataset") == name)
}

/// The space record of `store` after its last week.
fn last_space<'a>(dataset: &'a Value, store: &str) -> Option<&'a Value> {
    list(dataset, "space")
        .iter()
        .filter(|record| text(record, "store") == store)
        .max_by_key(|record| number(record, "week").unwrap_or(0.0) as u64)
}

/// Percent of non-null bytes not stored: after reverse deduplication, or inline only.
fn saving_percent(record: &Value, inline: bool) -> Option<f64> {
    let logical = number(record, "logical_bytes")? - number(record, "zero_bytes")?;
    let stored = if inline {
        number(record, "inline_stored_bytes")?
    } else {
        number(record, "space.container_bytes")?
    };
    (logical > 0.0).then(|| 100.0 * (1.0 - stored / logical))
}

fn final_saving(results: &Value, dataset_name: &str, store: &str, inline: bool) -> Option<f64> {
    let record = last_space(dataset(results, dataset_name)?, store)?;
    saving_percent(record, inline)
}

const SYNTHETIC: [&str; 5] = ["sg1", "sg2", "sg3", "sg4", "sg5"];

fn range_text(values: &[f64], format: fn(Option<f64>) -> String) -> String {
    if values.is_empty() {
        return "n/a".to_string();
    }
    let low = format(Some(values.iter().copied().fold(f64::INFINITY, f64::min)));
    let high = format(Some(
        values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    ));
    if low == high {
        low
    } else {
        format!("{low} to {high}")
    }
}

fn paper2_saving(results: &Value) -> Vec<Comparison> {
    let synthetic = |store: &str, inline: bool| -> Vec<f64> {
        SYNTHETIC
            .iter()
            .filter_map(|name| final_saving(results, name, store, inline))
            .collect()
    };
    vec![
        row(
            "SG1-5, RevDedup 4 MiB segments",
            "93.6-97.0%",
            range_text(&synthetic("rev-4M", false), percent_text),
        ),
        row(
            "SG1-5, Conv",
            "comparable to RevDedup",
            range_text(&synthetic("conv", false), percent_text),
        ),
        row(
            "SG1-5, segment-level inline only, 8 MiB segments",
            "56.5-68.9%",
            range_text(&synthetic("rev-8M", true), percent_text),
        ),
        row(
            "GP, RevDedup 4 MiB / Conv",
            "in the figure only",
            format!(
                "{} / {}",
                percent_text(final_saving(results, "gp", "rev-4M", false)),
                percent_text(final_saving(results, "gp", "conv", false))
            ),
        ),
        row(
            "real series (paper: VM images; ours: typescript), RevDedup / Conv",
            "96.3-97.1% / 98.3%",
            format!(
                "{} / {}",
                percent_text(final_saving(results, "typescript", "rev-4M", false)),
                percent_text(final_saving(results, "typescript", "conv", false))
            ),
        ),
    ]
}

/// Mean MB/s of `logical_bytes / timing.seconds` over the records of `key` that pass `keep`.
fn mean_rate(dataset: &Value, key: &str, keep: impl Fn(&Value) -> bool) -> Option<f64> {
    mean(
        list(dataset, key)
            .iter()
            .filter(|record| keep(record))
            .filter_map(|record| {
                let seconds = number(record, "timing.seconds")?;
                (seconds > 0.0)
                    .then(|| number(record, "logical_bytes").unwrap_or(0.0) / 1e6 / seconds)
            }),
    )
}

fn version(record: &Value) -> u64 {
    number(record, "version").unwrap_or(0.0) as u64
}

fn paper2_backup(results: &Value) -> Vec<Comparison> {
    let Some(sg1) = dataset(results, "sg1") else {
        return Vec::new();
    };
    let backup_rate = |store: &str| {
        mean_rate(sg1, "backups", |record| {
            text(record, "store") == store && version(record) >= 2
        })
    };
    let index_seconds = |store: &str| {
        list(sg1, "backups")
            .iter()
            .find(|record| text(record, "store") == store && version(record) == 2)
            .and_then(|record| number(record, "index_seconds"))
    };
    let drop = match (backup_rate("rev-1M"), backup_rate("rev-8M")) {
        (Some(small), Some(large)) if small > 0.0 => Some(100.0 * (large / small - 1.0)),
        _ => None,
    };
    let runs: Vec<String> = list(results, "datasets")
        .iter()
        .filter(|dataset| ["sg1", "gp", "typescript"].contains(&text(dataset, "dataset")))
        .map(|dataset| {
            format!(
                "{} {}",
                text(dataset, "dataset"),
                number(dataset, "runs").unwrap_or(1.0)
            )
        })
        .collect();
    vec![
        row(
            "runs averaged per point (Figs. 5-10; error bars span the lowest and highest run)",
            "5",
            runs.join(", "),
        ),
        row(
            "SG1 backup MB/s from week 2, RevDedup 4 MiB / Conv",
            "RevDedup above Conv (4x the raw write rate at first)",
            format!(
                "{} / {}",
                fixed(backup_rate("rev-4M"), 0),
                fixed(backup_rate("conv"), 0)
            ),
        ),
        row(
            "SG1 backup throughput, segments 1 MiB to 8 MiB",
            "-38%",
            change_text(drop),
        ),
        row(
            "Table 3: index lookup seconds, second SG1 backup, Conv / RevDedup 4 MiB",
            "2.562 / 0.012 s",
            format!(
                "{} / {} s",
                fixed(index_seconds("conv"), 4),
                fixed(index_seconds("rev-4M"), 4)
            ),
        ),
        row(
            "Table 3: data write seconds (packing), Conv / RevDedup 4 MiB",
            "0.961 / 0.617 s",
            format!(
                "{} / {} s",
                fixed(second_backup(sg1, "conv", "write_seconds"), 4),
                fixed(second_backup(sg1, "rev-4M", "write_seconds"), 4)
            ),
        ),
        row(
            "Table 3: what was written, Conv / RevDedup 4 MiB: new MiB, new segments",
            "not given",
            format!(
                "{} MiB, {} / {} MiB, {}",
                fixed(
                    second_backup(sg1, "conv", "new_stored_bytes").map(|bytes| bytes / 1048576.0),
                    1
                ),
                fixed(second_backup(sg1, "conv", "segments_new"), 0),
                fixed(
                    second_backup(sg1, "rev-4M", "new_stored_bytes").map(|bytes| bytes / 1048576.0),
                    1
                ),
                fixed(second_backup(sg1, "rev-4M", "segments_new"), 0)
            ),
        ),
        row(
            "Table 3: write time per new MiB, Conv / RevDedup 4 MiB",
            "not given",
            format!(
                "{} / {} ms",
                fixed(write_per_mebibyte(sg1, "conv"), 2),
                fixed(write_per_mebibyte(sg1, "rev-4M"), 2)
            ),
        ),
    ]
}

/// Mean over runs of `field` of the second backup of `store` in `dataset`.
fn second_backup(dataset: &Value, store: &str, field: &str) -> Option<f64> {
    mean(
        list(dataset, "backups")
            .iter()
            .filter(|record| text(record, "store") == store && version(record) == 2)
            .filter_map(|record| number(record, field)),
    )
}

/// Milliseconds of packing per MiB written by the second backup of `store`.
fn write_per_mebibyte(dataset: &Value, store: &str) -> Option<f64> {
    let seconds = second_backup(dataset, store, "write_seconds")?;
    let bytes = second_backup(dataset, store, "new_stored_bytes")?;
    (bytes > 0.0).then(|| 1e3 * seconds / (bytes / 1048576.0))
}

/// Restore MB/s of `store`'s backup `version` in `dataset` (no prefetching; mean of series).
fn restore_rate(dataset: &Value, store: &str, wanted: u64, prefetch: bool) -> Option<f64> {
    mean_rate(dataset, "restores", |record| {
        text(record, "store") == store
            && version(record) == wanted
            && record.get("prefetch").and_then(Value::as_bool) == Some(prefetch)
    })
}

fn last_version(dataset: &Value) -> u64 {
    list(dataset, "restores")
        .iter()
        .map(version)
        .max()
        .unwrap_or(0)
}

fn paper2_restore(results: &Value) -> Vec<Comparison> {
    let mut rows = Vec::new();
    for (name, paper) in [("sg1", "5x"), ("gp", "4x")] {
        let Some(dataset) = dataset(results, name) else {
            continue;
        };
        let last = last_version(dataset);
        let conv_last = restore_rate(dataset, "conv", last, false);
        let rev_last = restore_rate(dataset, "rev-4M", last, false);
        let ratio = match (rev_last, conv_last) {
            (Some(rev), Some(conv)) if conv > 0.0 => Some(rev / conv),
            _ => None,
        };
        rows.push(row(
            format!(
                "{}: newest backup, RevDedup 4 MiB against Conv",
                name.to_uppercase()
            ),
            paper,
            ratio_text(ratio),
        ));
    }
    if let Some(sg1) = dataset(results, "sg1") {
        let first = restore_rate(sg1, "conv", 1, false);
        let last = restore_rate(sg1, "conv", last_version(sg1), false);
        let change = match (first, last) {
            (Some(first), Some(last)) if first > 0.0 => Some(100.0 * (last / first - 1.0)),
            _ => None,
        };
        rows.push(row(
            "SG1: Conv, newest backup against the first",
            "-86% (week 2 to 78)",
            change_text(change),
        ));
    }
    if let Some(gp) = dataset(results, "gp") {
        let last = last_version(gp);
        let newest = |store: &str, field: &str| {
            mean(
                list(gp, "restores")
                    .iter()
                    .filter(|record| {
                        text(record, "store") == store
                            && version(record) == last
                            && record.get("prefetch").and_then(Value::as_bool) == Some(false)
                    })
                    .filter_map(|record| number(record, field)),
            )
        };
        let per_run = |store: &str| -> Vec<f64> {
            let mut runs: std::collections::BTreeMap<u64, Vec<f64>> = Default::default();
            for record in list(gp, "restores").iter().filter(|record| {
                text(record, "store") == store
                    && version(record) == last
                    && record.get("prefetch").and_then(Value::as_bool) == Some(false)
            }) {
                if let (Some(bytes), Some(seconds)) = (
                    number(record, "logical_bytes"),
                    number(record, "timing.seconds"),
                ) {
                    runs.entry(number(record, "run").unwrap_or(0.0) as u64)
                        .or_default()
                        .push(bytes / 1e6 / seconds);
                }
            }
            runs.into_values().filter_map(mean).collect()
        };
        let range = |store: &str| range_text(&per_run(store), |value| fixed(value, 0));
        rows.push(row(
            "GP newest, MB/s per run (lowest-highest), Conv / RevDedup 4 MiB",
            "RevDedup 4x Conv",
            format!("{} / {}", range("conv"), range("rev-4M")),
        ));
        rows.push(row(
            "GP newest, per restore: CPU s / wall s, Conv; RevDedup 4 MiB",
            "not given",
            format!(
                "{} / {}; {} / {}",
                fixed(newest("conv", "timing.cpu_seconds"), 3),
                fixed(newest("conv", "timing.seconds"), 3),
                fixed(newest("rev-4M", "timing.cpu_seconds"), 3),
                fixed(newest("rev-4M", "timing.seconds"), 3)
            ),
        ));
        rows.push(row(
            "GP newest, per restore: containers, reads, MiB read, Conv; RevDedup 4 MiB",
            "Conv reads more containers (fragmentation)",
            format!(
                "{}, {}, {}; {}, {}, {}",
                fixed(newest("conv", "containers_read"), 0),
                fixed(newest("conv", "reads"), 0),
                fixed(
                    newest("conv", "read_bytes").map(|bytes| bytes / 1048576.0),
                    0
                ),
                fixed(newest("rev-4M", "containers_read"), 0),
                fixed(newest("rev-4M", "reads"), 0),
                fixed(
                    newest("rev-4M", "read_bytes").map(|bytes| bytes / 1048576.0),
                    0
                )
            ),
        ));
    }
    rows
}

fn paper2_reverse(results: &Value) -> Vec<Comparison> {
    let Some(sg1) = dataset(results, "sg1") else {
        return Vec::new();
    };
    let rate = |store: &str| mean_rate(sg1, "reverses", |record| text(record, "store") == store);
    vec![row(
        "SG1 reverse deduplication MB/s, 1 / 4 / 8 MiB segments",
        "at least about half the raw read/write rate (about 1 GB/s raw)",
        format!(
            "{} / {} / {}",
            fixed(rate("rev-1M"), 0),
            fixed(rate("rev-4M"), 0),
            fixed(rate("rev-8M"), 0)
        ),
    )]
}

fn paper2_prefetch(results: &Value) -> Vec<Comparison> {
    let Some(sg1) = dataset(results, "sg1") else {
        return Vec::new();
    };
    let gain = |store: &str| {
        let rate = |prefetch: bool| {
            mean_rate(sg1, "restores", |record| {
                text(record, "store") == store
                    && record.get("prefetch").and_then(Value::as_bool) == Some(prefetch)
            })
        };
        match (rate(false), rate(true)) {
            (Some(without), Some(with)) if without > 0.0 => Some(100.0 * (with / without - 1.0)),
            _ => None,
        }
    };
    vec![
        row(
            "gain of prefetching, Conv",
            "+23.9%",
            change_text(gain("conv")),
        ),
        row(
            "gain of prefetching, RevDedup 4 MiB",
            "+45.8%",
            change_text(gain("rev-4M")),
        ),
    ]
}

fn paper2_live_window(results: &Value) -> Vec<Comparison> {
    let saving = |store: &str| final_saving(results, "sg1", store, false);
    vec![row(
        "SG1 saving, live window 1 / 2 / 4 backups (paper: 1 / 17, mean over weeks)",
        "96.6% / 93.2%",
        format!(
            "{} / {} / {}",
            percent_text(saving("rev-4M")),
            percent_text(saving("rev-4M-lw2")),
            percent_text(saving("rev-4M-lw4"))
        ),
    )]
}

fn paper2_deletion(results: &Value) -> Vec<Comparison> {
    let Some(sg1) = dataset(results, "sg1") else {
        return Vec::new();
    };
    let seconds = |method: &str| -> Vec<f64> {
        list(sg1, "deletions")
            .iter()
            .filter(|record| text(&record["measure"], "method") == method)
            .filter_map(|record| number(record, "measure.timing.seconds"))
            .collect()
    };
    let seconds_text = |value: Option<f64>| fixed(value, 3) + " s";
    vec![
        row(
            "delete the oldest backup, by time stamps (RevDedup)",
            "very small (figure only)",
            range_text(&seconds("timestamp"), seconds_text),
        ),
        row(
            "delete the oldest backup, mark and sweep",
            "dominated by the sweep (figure only)",
            range_text(&seconds("mark-and-sweep"), seconds_text),
        ),
        row(
            "Fig. 10b: delete the n oldest at once, by time stamps, RevDedup 4 MiB, n = 1 to all \
             but the newest",
            "very small for every n (figure only)",
            batch_text(sg1, "rev-4M", "timestamp", "timing.seconds"),
        ),
        row(
            "Fig. 10b: the same by mark and sweep, RevDedup 4 MiB: mark; sweep",
            "mark grows with n, sweep about constant (figure only)",
            format!(
                "{}; {}",
                batch_text(sg1, "rev-4M", "mark-and-sweep", "metadata_seconds"),
                batch_text(sg1, "rev-4M", "mark-and-sweep", "sweep_seconds")
            ),
        ),
        row(
            "Fig. 10b: Conv by mark and sweep: mark; sweep",
            "(not in the paper)",
            format!(
                "{}; {}",
                batch_text(sg1, "conv", "mark-and-sweep", "metadata_seconds"),
                batch_text(sg1, "conv", "mark-and-sweep", "sweep_seconds")
            ),
        ),
    ]
}

/// `field` of the batch deletions of `store` by `method`, mean over runs, from the smallest
/// n to the largest: "0.010 s (n = 1) to 0.020 s (n = 19)".
fn batch_text(dataset: &Value, store: &str, method: &str, field: &str) -> String {
    let mut by_count: std::collections::BTreeMap<u64, Vec<f64>> = Default::default();
    for record in list(dataset, "batch_deletions") {
        if text(record, "store") == store && text(record, "method") == method {
            if let Some(value) = number(record, field) {
                by_count
                    .entry(number(record, "deleted").unwrap_or(0.0) as u64)
                    .or_default()
                    .push(value);
            }
        }
    }
    let (Some((first, first_values)), Some((last, last_values))) =
        (by_count.first_key_value(), by_count.last_key_value())
    else {
        return "n/a".to_string();
    };
    format!(
        "{} s (n = {first}) to {} s (n = {last})",
        fixed(mean(first_values.iter().copied()), 3),
        fixed(mean(last_values.iter().copied()), 3)
    )
}

fn paper2_unique(results: &Value) -> Vec<Comparison> {
    let Some(unique) = results.get("unique").filter(|unique| !unique.is_null()) else {
        return Vec::new();
    };
    let bytes = number(unique, "bytes").unwrap_or(0.0);
    let limit = |field: &str| {
        mean(
            list(unique, "limits")
                .iter()
                .filter_map(|run| number(run, field))
                .map(|seconds| bytes / 1e6 / seconds),
        )
    };
    let store_rate = |store: &str, field: &str| {
        mean(
            list(unique, "stores")
                .iter()
                .filter(|run| text(run, "store") == store)
                .filter_map(|run| number(run, field))
                .map(|seconds| bytes / 1e6 / seconds),
        )
    };
    let of = |value: Option<f64>, raw: Option<f64>| match (value, raw) {
        (Some(value), Some(raw)) if raw > 0.0 => format!(
            "{} of {} MB/s, {}",
            fixed(Some(value), 0),
            fixed(Some(raw), 0),
            percent_text(Some(100.0 * value / raw))
        ),
        _ => "n/a".to_string(),
    };
    let raw_write = limit("raw_write.seconds");
    let raw_read = limit("raw_read.seconds");
    vec![
        row(
            "RevDedup 4 MiB write against the raw disk write (RAID-0)",
            "1,017 of 1,060 MB/s, 95.9%",
            of(store_rate("rev-4M", "backup.seconds"), raw_write),
        ),
        row(
            "RevDedup 4 MiB read against the raw disk read (RAID-0)",
            "1,094 of 1,235 MB/s, 88.6%",
            of(store_rate("rev-4M", "restore.seconds"), raw_read),
        ),
        row(
            "Conv write; read, against the raw disk",
            "not measured",
            format!(
                "{}; {}",
                of(store_rate("conv", "backup.seconds"), raw_write),
                of(store_rate("conv", "restore.seconds"), raw_read)
            ),
        ),
        row(
            "this machine's limits: memcpy / BLAKE3 of 4 KiB pieces on one core",
            "not measured",
            format!(
                "{} / {} MB/s",
                fixed(limit("memcpy.seconds"), 0),
                fixed(limit("hash.seconds"), 0)
            ),
        ),
    ]
}

fn paper2_goals(results: &Value) -> Vec<Comparison> {
    list(results, "goals")
        .iter()
        .map(|goal| {
            let met = match goal.get("met").and_then(Value::as_bool) {
                Some(true) => "met",
                Some(false) => "**not met**",
                None => "n/a",
            };
            let peer = match text(goal, "peer") {
                "" => String::new(),
                peer => format!(" against {peer}"),
            };
            row(
                text(goal, "goal"),
                "(not in the paper)",
                format!(
                    "{}{peer} ({}): {met}",
                    text(goal, "ours"),
                    text(goal, "ratio")
                ),
            )
        })
        .collect()
}

// Paper 4 (trace).

fn trace_hits(results: &Value, addressing: &str, policy: &str, key: &str) -> Option<(u64, f64)> {
    list(results, "rows")
        .iter()
        .filter(|row| text(row, "replay") == "simulated")
        .filter(|row| text(row, "addressing") == addressing && text(row, "policy") == policy)
        .max_by_key(|row| number(row, "cache_blocks").unwrap_or(0.0) as u64)
        .and_then(|row| {
            Some((
                number(row, "cache_blocks")? as u64,
                number(row, &format!("hits.{key}"))?,
            ))
        })
}

fn trace_workload(results: &Value) -> Vec<Comparison> {
    let analysis = &results["analysis"];
    let value = |path: &str| number(analysis, path);
    let pair = |first: &str, second: &str, digits: usize| {
        format!(
            "{} / {}",
            fixed(value(first), digits),
            fixed(value(second), digits)
        )
    };
    let overlap = list(analysis, "overlap")
        .iter()
        .skip(1)
        .filter_map(Value::as_f64)
        .collect::<Vec<f64>>();
    vec![
        row(
            "locations read / contents read (Table 1)",
            "fewer contents than locations",
            pair("table1.locations_read", "table1.contents_read", 0),
        ),
        row(
            "reuse distance of reads, sector / content (Fig. 2)",
            "content shorter",
            pair("reuse.sector_reads", "reuse.content_reads", 2),
        ),
        row(
            "reuse distance of writes, sector / content (Fig. 2)",
            "content shorter",
            pair("reuse.sector_writes", "reuse.content_writes", 0),
        ),
        row(
            "copies per block read (Fig. 3)",
            "2.5 (mail, whole disk)",
            fixed(value("copies_per_block_read"), 2),
        ),
        row(
            "content read that the interval before accessed (Fig. 4)",
            "45% (mail, 3-day intervals)",
            percent_text(mean(overlap).map(|share| share * 100.0)),
        ),
    ]
}

fn trace_cache(results: &Value) -> Vec<Comparison> {
    let ratio = |key: &str| match (
        trace_hits(results, "sector", "arc", key),
        trace_hits(results, "content", "arc", key),
    ) {
        (Some((blocks, sector)), Some((_, content))) => format!(
            "{} ({} against {} at {blocks} blocks)",
            ratio_text((sector > 0.0).then(|| content / sector)),
            content,
            sector
        ),
        _ => "n/a".to_string(),
    };
    let policies = match (
        trace_hits(results, "content", "arc", "write_hits"),
        trace_hits(results, "content", "lru", "write_hits"),
    ) {
        (Some((blocks, arc)), Some((_, lru))) => {
            format!("{arc} against {lru} at {blocks} blocks")
        }
        _ => "n/a".to_string(),
    };
    vec![
        row(
            "read hits, content- against sector-addressed (ARC)",
            "up to 10x (Fig. 8, a week of web-vm)",
            ratio("read_hits"),
        ),
        row(
            "write hits, content- against sector-addressed (ARC)",
            "not given",
            ratio("write_hits"),
        ),
        row(
            "content write hits, ARC against LRU",
            "ARC ahead at small caches (Fig. 9)",
            policies,
        ),
    ]
}

// Paper 4 (timed replay on the disk model).

/// Why paper 4's replays differ from the paper, for Figs. 10 and 11.
const PAPER4_WHY: &str = "a model of the paper's disk replaces its disk, and the engine's \
                          planner (nearest copy to the head) chooses; the excerpt is 23 seconds \
                          of mail whose copies elsewhere on the disk are unknown, so the days \
                          are synthetic (the excerpt's statistics, the paper's duplication and \
                          day-to-day overlap); 87% of the excerpt's requests lie in one 5 GB \
                          area, where a block's own copy is nearer than any of ten regions \
                          spread over the disk, and 12-18% of the disk reads find their \
                          content duplicated (docs/LAB.md)";

fn paper4_run<'a>(results: &'a Value, workload: &str, setup: &str) -> Option<&'a Value> {
    list(results, "runs")
        .iter()
        .find(|run| text(run, "workload") == workload && text(run, "setup") == setup)
}

fn paper4_workloads(results: &Value) -> Vec<String> {
    list(results, "workloads")
        .iter()
        .map(|facts| text(facts, "name").to_string())
        .collect()
}

/// `field` of `setup` against `baseline` on `workload`: "a -> b ms (change)".
fn paper4_change(
    results: &Value,
    workload: &str,
    baseline: &str,
    setup: &str,
    field: &str,
    unit: &str,
) -> String {
    let value =
        |setup: &str| paper4_run(results, workload, setup).and_then(|run| number(run, field));
    match (value(baseline), value(setup)) {
        (Some(before), Some(after)) => format!(
            "{before:.2} -> {after:.2} {unit} ({})",
            change_text((before > 0.0).then(|| (after - before) / before * 100.0))
        ),
        _ => "n/a".to_string(),
    }
}

fn paper4_fig10(results: &Value) -> Vec<Comparison> {
    paper4_workloads(results)
        .iter()
        .flat_map(|workload| {
            [
                row(
                    format!("{workload}: median disk read time, replica retrieval"),
                    "at least -10% (homes -20%)",
                    paper4_change(
                        results,
                        workload,
                        "vanilla",
                        "replica retrieval",
                        "median_read_ms",
                        "ms",
                    ),
                ),
                row(
                    format!("{workload}: total disk read time, replica retrieval"),
                    "not given",
                    paper4_change(
                        results,
                        workload,
                        "vanilla",
                        "replica retrieval",
                        "total_read_s",
                        "s",
                    ),
                ),
            ]
        })
        .collect()
}

fn paper4_fig11(results: &Value) -> Vec<Comparison> {
    paper4_workloads(results)
        .iter()
        .filter(|workload| {
            paper4_run(results, workload, "replica retrieval + duplication").is_some()
        })
        .flat_map(|workload| {
            let setup = "replica retrieval + duplication";
            [
                row(
                    format!("{workload}: median disk read time, retrieval and duplication"),
                    "mail -23% (web -33%, homes -35%)",
                    paper4_change(results, workload, "vanilla", setup, "median_read_ms", "ms"),
                ),
                row(
                    format!("{workload}: total disk read time, retrieval and duplication"),
                    "not given",
                    paper4_change(results, workload, "vanilla", setup, "total_read_s", "s"),
                ),
            ]
        })
        .collect()
}

fn paper4_table3(results: &Value) -> Vec<Comparison> {
    let baseline = "vanilla, sector cache";
    paper4_workloads(results)
        .iter()
        .flat_map(|workload| {
            let mut rows = vec![row(
                format!("{workload}: total disk read time, content cache"),
                "not given",
                paper4_change(
                    results,
                    workload,
                    baseline,
                    "content cache",
                    "total_read_s",
                    "s",
                ),
            )];
            for (setup, paper) in [
                ("sector cache + replica retrieval", "not given"),
                (
                    "sector cache + replica retrieval + duplication",
                    "not given",
                ),
                (
                    "I/O deduplication",
                    "-28% to -47% over web-vm, homes and mail (mail's own not in our copy)",
                ),
            ] {
                if paper4_run(results, workload, setup).is_some() {
                    rows.push(row(
                        format!("{workload}: total disk read time, {setup}"),
                        paper,
                        paper4_change(results, workload, baseline, setup, "total_read_s", "s"),
                    ));
                }
                let small = format!("{setup}{}", crate::paper4::SMALL_CACHE);
                let small_baseline = format!("{baseline}{}", crate::paper4::SMALL_CACHE);
                if paper4_run(results, workload, &small).is_some() {
                    rows.push(row(
                        format!("{workload}: total disk read time, {small}"),
                        paper,
                        paper4_change(
                            results,
                            workload,
                            &small_baseline,
                            &small,
                            "total_read_s",
                            "s",
                        ),
                    ));
                }
            }
            rows
        })
        .collect()
}

/// The overhead figures at the largest cache measured.
fn paper4_overhead(results: &Value, rows: &[(&str, &str, &str)]) -> Vec<Comparison> {
    let largest = list(results, "overhead")
        .iter()
        .max_by_key(|point| number(point, "cache_pages").unwrap_or(0.0) as u64);
    let Some(point) = largest else {
        return Vec::new();
    };
    let pages = number(point, "cache_pages").unwrap_or(0.0);
    rows.iter()
        .map(|(measure, paper, field)| {
            row(
                format!("{measure} ({pages} pages)"),
                *paper,
                number(point, field).map_or("n/a".to_string(), |ns| format!("{ns:.0} ns")),
            )
        })
        .collect()
}

fn paper4_fig12(results: &Value) -> Vec<Comparison> {
    paper4_overhead(
        results,
        &[
            (
                "sector (name) lookup",
                "about 1,000 cycles (0.5 µs)",
                "name_lookup_ns",
            ),
            (
                "content lookup",
                "about 1,000 cycles (0.5 µs)",
                "content_lookup_ns",
            ),
            (
                "content lookup with its digest",
                "100,000 cycles more (50 µs, MD5)",
                "content_lookup_with_digest_ns",
            ),
        ],
    )
}

fn paper4_fig13(results: &Value) -> Vec<Comparison> {
    paper4_overhead(
        results,
        &[
            (
                "name insertion",
                "not in our copy of the paper's text",
                "name_insert_ns",
            ),
            (
                "content insertion",
                "not in our copy of the paper's text",
                "content_insert_ns",
            ),
            (
                "content insertion with its digest",
                "100,000 cycles more (50 µs, MD5)",
                "content_insert_with_digest_ns",
            ),
        ],
    )
}

// Paper 5.

fn paper5_series<'a>(results: &'a Value, figure: &str, mode: &str) -> Option<&'a Value> {
    list(results, "series")
        .iter()
        .find(|series| text(series, "figure") == figure && text(series, "mode") == mode)
}

/// First write and median of the later writes of a series, in µs.
fn first_and_later(series: &Value, field: &str) -> Option<(f64, f64)> {
    let points = list(series, "points");
    let (first, later) = points.split_first()?;
    let later = median(
        later
            .iter()
            .filter_map(|point| number(point, field))
            .collect(),
    )?;
    Some((number(first, field)?, later))
}

fn first_later_text((first, later): (f64, f64)) -> String {
    let unit = |micros: f64| {
        if micros >= 1000.0 {
            format!("{:.1} ms", micros / 1000.0)
        } else {
            format!("{micros:.0} µs")
        }
    };
    format!("{} / {} ({:.1})", unit(first), unit(later), first / later)
}

fn paper5_repeated(results: &Value, figure: &str, paper: &str) -> Vec<Comparison> {
    let mut rows = Vec::new();
    for (mode, label) in [
        ("dedup-crc32c", "dedup, CRC-32C"),
        ("dedup-xxh3", "dedup, xxh3"),
        ("no-dedup", "no dedup"),
    ] {
        let Some(series) = paper5_series(results, figure, mode) else {
            continue;
        };
        for (field, what) in [
            ("write_us", "write"),
            ("durable_us", "write + FLUSH"),
            ("modelled_us", "modelled on NAND"),
        ] {
            let paper = if mode == "dedup-crc32c" && field == "write_us" {
                paper
            } else {
                "not given"
            };
            rows.push(row(
                format!("{label}, {what}: first / later median (factor)"),
                paper,
                first_and_later(series, field).map_or("n/a".to_string(), first_later_text),
            ));
        }
    }
    rows
}

fn paper5_small(results: &Value) -> Vec<Comparison> {
    paper5_repeated(results, "fig1", "380 / 60 µs (6.3)")
}

fn paper5_large(results: &Value) -> Vec<Comparison> {
    paper5_repeated(results, "fig2", "805 / 395 µs (2.0)")
}

fn paper5_fig3(results: &Value) -> Vec<Comparison> {
    let series = |mode: &str| paper5_series(results, "fig3", mode);
    let field = |mode: &str, key: &str| series(mode).and_then(|series| number(series, key));
    let mebibytes = |value: Option<f64>| fixed(value.map(|bytes| bytes / 1048576.0), 1) + " MiB";
    let saving = match (
        field("dedup-crc32c", "stored_bytes_total"),
        field("no-dedup", "stored_bytes_total"),
    ) {
        (Some(dedup), Some(plain)) if plain > 0.0 => Some(100.0 * (1.0 - dedup / plain)),
        _ => None,
    };
    let times = |key: &str| match (field("dedup-crc32c", key), field("no-dedup", key)) {
        (Some(dedup), Some(plain)) if dedup > 0.0 => {
            format!("{dedup:.3} / {plain:.3} s ({:.1}x)", plain / dedup)
        }
        _ => "n/a".to_string(),
    };
    vec![
        row(
            "bytes stored, dedup / no dedup",
            "axes lost",
            format!(
                "{} / {} ({} saved)",
                mebibytes(field("dedup-crc32c", "stored_bytes_total")),
                mebibytes(field("no-dedup", "stored_bytes_total")),
                percent_text(saving)
            ),
        ),
        row(
            "writes and FLUSHes, dedup / no dedup",
            "axes lost",
            times("durable_seconds_total"),
        ),
        row(
            "modelled on NAND, dedup / no dedup",
            "axes lost",
            times("modelled_seconds_total"),
        ),
    ]
}

fn paper5_cache(results: &Value) -> Vec<Comparison> {
    let points = list(results, "cache");
    let full = points
        .iter()
        .filter(|point| number(point, "fraction").is_some_and(|fraction| fraction >= 1.0))
        .min_by(|a, b| {
            let fraction = |point: &Value| number(point, "fraction").unwrap_or(f64::NAN);
            fraction(a).total_cmp(&fraction(b))
        });
    let full_rate = full.and_then(|point| number(point, "writes_per_second"));
    points
        .iter()
        .map(|point| {
            let fraction = number(point, "fraction");
            let rate = number(point, "writes_per_second");
            let relative = match (rate, full_rate) {
                (Some(rate), Some(full)) if full > 0.0 => {
                    format!(", {} of the whole index's", ratio_text(Some(rate / full)))
                }
                _ => String::new(),
            };
            row(
                format!(
                    "cache of {} of the index: hit rate, writes/s",
                    percent_text(fraction.map(|fraction| fraction * 100.0))
                ),
                if fraction.is_some_and(|fraction| fraction >= 1.0) {
                    "as the whole index in memory"
                } else {
                    "below the whole index until a few hundred entries short"
                },
                format!(
                    "{}, {}{relative}",
                    fixed(number(point, "hit_rate"), 3),
                    fixed(rate, 0)
                ),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: figures sort by their number, not as text. Method: sort names whose figure
    /// numbers have one and two digits, with and without a paper prefix.
    #[test]
    fn figures_sort_by_number() {
        let mut names = vec![
            "paper3-fig10.svg",
            "paper3-fig9.svg",
            "paper3-fig16-17.svg",
            "paper3-fig3.svg",
        ];
        names.sort_by_key(|name| figure_order(name));
        assert_eq!(
            names,
            [
                "paper3-fig3.svg",
                "paper3-fig9.svg",
                "paper3-fig10.svg",
                "paper3-fig16-17.svg"
            ]
        );
        let mut names = vec!["fig10-deletion.svg", "fig4-storage-saving.svg"];
        names.sort_by_key(|name| figure_order(name));
        assert_eq!(names, ["fig4-storage-saving.svg", "fig10-deletion.svg"]);
    }

    /// Goal: a figure the report does not know is named by its figure number. Method:
    /// caption file names of one figure, of two, and without a number.
    #[test]
    fn unknown_figures_get_their_number() {
        assert_eq!(
            generic_caption("paper3-fig9.svg"),
            "Fig. 9 (`paper3-fig9.svg`)"
        );
        assert_eq!(
            generic_caption("paper3-fig16-17.png"),
            "Figs. 16-17 (`paper3-fig16-17.png`)"
        );
        assert_eq!(generic_caption("overview.svg"), "`overview.svg`");
    }
}
