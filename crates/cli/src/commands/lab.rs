//! `onecopy lab`: run the experiments that reproduce the papers (see docs/LAB.md).

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use onecopy_core::units::{parse_duration_ns, parse_size};
use onecopy_lab::paper1::{
    self, Paper1Options, Scale, UniquenessScale, Workload, PAPER_LATENCIES_NS,
};
use onecopy_lab::paper2::peers::Tool;
use onecopy_lab::paper2::{self, Dataset, Paper2Options};
use onecopy_lab::peers::{self, PeerDataset, PeersOptions};
use onecopy_lab::report::{self, PartRun};
use onecopy_lab::trace::read_trace;
use onecopy_lab::trace_replay::{run_trace_experiment, CACHE_BLOCKS_DEFAULT};

use crate::Cli;

#[derive(Args, Debug)]
pub struct LabArgs {
    #[command(subcommand)]
    pub experiment: LabCommand,
}

#[derive(Subcommand, Debug)]
pub enum LabCommand {
    /// Paper 1 §5: file-system hints for inline deduplication on a kernel ext4 (needs root,
    /// nbdfuse, fuse3, e2fsprogs and util-linux).
    Paper1(Paper1Args),
    /// Paper 2 §4: RevDedup against conventional deduplication on synthetic image series
    /// (SG1-SG5, GP) and typescript releases, and restic and borg on the same releases (needs
    /// e2fsprogs, curl, tar, restic, borgbackup and /usr/bin/time).
    Paper2(Paper2Args),
    /// Paper 3 §5 (first measurement): dedup ratio and sequential read throughput against
    /// the chunk size on the file system face (Fig. 3), and the I/O monitor's cost.
    Paper3(Paper3Args),
    /// Paper 4 §4.2-4.5: dynamic replica retrieval, selective duplication and all of I/O
    /// deduplication by a timed replay of the FIU mail trace and synthetic days over a
    /// hard-disk model, with the block engine's read planner, ARC of days and duplication plan
    /// (Figs. 10, 11, Table 3), and the content cache's lookup and insertion costs (Figs. 12,
    /// 13).
    Paper4(Paper4Args),
    /// Paper 5 §5: repeated writes of small and large files with and without deduplication
    /// (Figs. 1-3) and the LFU index cache's size against hit rate and throughput (§3.6), on
    /// the block device's flash mode.
    Paper5(Paper5Args),
    /// The backup store against restic, borg, rustic and bupstash on the typescript releases
    /// and snapshots of a Debian system's /usr, in one run: sizes, backup, unchanged-backup,
    /// restore and deletion times, reads and peak memory, and issue 21's goals (needs rsync,
    /// curl, tar, /usr/bin/time, restic, borgbackup; debootstrap and root to make the Debian
    /// snapshots; installs rustic and bupstash with cargo when missing).
    Peers(PeersArgs),
    /// Paper 4 §4.1: replay a block trace with content digests (FIU format) through content-
    /// and sector-addressed caches, ARC and LRU, simulated and through the engine.
    Trace(TraceArgs),
    /// Every part above in turn (their quick modes with --quick), each into a subdirectory of
    /// --out, then the one-page report of all their figures (README.md in --out).
    All(AllArgs),
    /// Only write the report (README.md) from the result directories already in --out.
    Report(ReportArgs),
}

#[derive(Args, Debug)]
pub struct AllArgs {
    /// Directory for the report; each part writes into the subdirectory of its name
    /// (paper1, paper2, paper3, paper4, paper5, trace).
    #[arg(long, value_name = "DIR", default_value = "lab-results")]
    pub out: PathBuf,
    /// Every part in its quick mode: about ten minutes on two cores.
    #[arg(long)]
    pub quick: bool,
    /// Parts to run, comma separated: paper1, paper2, paper3, paper4, paper5, trace [default:
    /// all].
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub parts: Vec<String>,
    /// The FIU trace the trace and paper4 parts replay [default: shared/traces/fiu-mail-day1-excerpt.trace
    /// in the current directory or one above it].
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Where the parts make their temporary repositories and mounts [default: the system
    /// temporary directory].
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct ReportArgs {
    /// Directory holding the result directories (paper1, paper2-*, ...); README.md is
    /// written there.
    #[arg(long, value_name = "DIR", default_value = "lab-results")]
    pub out: PathBuf,
}

#[derive(Args, Debug)]
pub struct TraceArgs {
    /// The trace: `timestamp_ns pid process lba size R|W major minor md5...` per line.
    pub file: PathBuf,
    /// Directory for results.json, results.csv and paper4-cache.svg.
    #[arg(long, value_name = "DIR", default_value = "lab-results/trace")]
    pub out: PathBuf,
    /// Cache sizes in blocks, comma separated [default: 32,64,128,256,512,1024,2048].
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub cache_blocks: Vec<usize>,
    /// Fraction of the trace that only warms the caches (paper 4: the first of two weeks).
    #[arg(long, default_value_t = 0.5)]
    pub warmup: f64,
}

#[derive(Args, Debug)]
pub struct Paper1Args {
    /// Directory for results.json, results.csv, summary.md and the SVG figures.
    #[arg(long, value_name = "DIR", default_value = "lab-results/paper1")]
    pub out: PathBuf,
    /// Small scale, two latencies (100us, 1ms), one run per cell: a smoke test of a few
    /// minutes.
    #[arg(long)]
    pub quick: bool,
    /// Where each run's temporary repository and mount point are made [default: the system
    /// temporary directory]; a tmpfs here removes the host disk from the measurement.
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// What to run, comma separated: uniqueness (Table 5.1), metadata, tree, journal,
    /// data-journal, copy, file-server [default: all].
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub workloads: Vec<String>,
    /// Injected on-disk index latencies, comma separated [default: 10us,100us,500us,1ms,10ms].
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub latencies: Vec<String>,
    /// Index cache policies of every workload, comma separated [default: the paper's: lru
    /// and arc for metadata, lru for the others].
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub policies: Vec<String>,
    /// Runs of every cell of the matrix [default: 3 as in the paper, quick: 1].
    #[arg(long)]
    pub repetitions: Option<u32>,
    /// Memory budget of the index entry cache [default: 256KiB, quick: 32KiB].
    #[arg(long, value_name = "SIZE")]
    pub index_cache: Option<String>,
    /// Tree copied to warm the cache and copied by the copy workload [default: /usr/share].
    #[arg(long, value_name = "DIR")]
    pub warm_source: Option<PathBuf>,
    /// Bytes copied from the warm-up tree [default: 48MiB, quick: 8MiB].
    #[arg(long, value_name = "SIZE")]
    pub warm_size: Option<String>,
    /// Empty files of the metadata workload [default: 100000, quick: 10000].
    #[arg(long, value_name = "N")]
    pub files: Option<u64>,
    /// Names of the tree workload's file set; a quarter of them are created and a quarter
    /// deleted [default: 300000, quick: 10000].
    #[arg(long, value_name = "N")]
    pub tree_files: Option<u64>,
    /// Appends of the journal workload [default: 40000, quick: 1000].
    #[arg(long, value_name = "N")]
    pub appends: Option<u64>,
    /// Appends of the data-journal workload [default: 20000, quick: 1000].
    #[arg(long, value_name = "N")]
    pub data_journal_appends: Option<u64>,
    /// Iterations of each file-server thread [default: 160, quick: 10].
    #[arg(long, value_name = "N")]
    pub fileserver_iterations: Option<u64>,
    /// Empty files of Table 5.1 [default: 1000000 as in the paper, quick: 100000].
    #[arg(long, value_name = "N")]
    pub uniqueness_files: Option<u64>,
    /// Copy runs with hints on use every hint source, not only prefetch as in paper 1.
    #[arg(long)]
    pub copy_all_hints: bool,
    /// Only redraw the figures, summary.md and results.csv from the results.json in --out.
    #[arg(long)]
    pub replot: bool,
}

pub fn run(_cli: &Cli, args: &LabArgs) -> anyhow::Result<()> {
    run_experiment(&args.experiment)
}

fn run_experiment(experiment: &LabCommand) -> anyhow::Result<()> {
    match experiment {
        LabCommand::Paper1(paper1_args) => run_paper1(paper1_args),
        LabCommand::Paper2(paper2_args) => run_paper2(paper2_args),
        LabCommand::Paper3(paper3_args) => run_paper3(paper3_args),
        LabCommand::Paper4(paper4_args) => run_paper4(paper4_args),
        LabCommand::Paper5(paper5_args) => run_paper5(paper5_args),
        LabCommand::Peers(peers_args) => run_peers(peers_args),
        LabCommand::Trace(trace_args) => run_trace(trace_args),
        LabCommand::All(all_args) => run_all(all_args),
        LabCommand::Report(report_args) => {
            let path = report::write_report(&report_args.out)?;
            println!("{}", path.display());
            Ok(())
        }
    }
}

/// One part's command line, parsed as `onecopy lab` would parse it, so `all` runs each part
/// exactly as its own command does, with every option the part has at its default.
#[derive(Parser, Debug)]
#[command(name = "onecopy lab")]
struct PartCommandLine {
    #[command(subcommand)]
    experiment: LabCommand,
}

/// The file name of the FIU mail excerpt the trace part replays by default.
const TRACE_EXCERPT: &str = "shared/traces/fiu-mail-day1-excerpt.trace";

fn run_all(args: &AllArgs) -> anyhow::Result<()> {
    let all_parts: Vec<&str> = report::PARTS.iter().map(|part| part.name).collect();
    let parts: Vec<String> = if args.parts.is_empty() {
        all_parts.iter().map(ToString::to_string).collect()
    } else {
        for part in &args.parts {
            anyhow::ensure!(
                all_parts.contains(&part.as_str()),
                "part {part:?}: use {}",
                all_parts.join(", ")
            );
        }
        args.parts.clone()
    };
    // The trace is found before anything runs, so a missing file does not surface after the
    // long parts.
    let trace = if parts.iter().any(|part| part == "trace" || part == "paper4") {
        Some(match &args.trace {
            Some(file) => file.clone(),
            None => find_trace_excerpt()?,
        })
    } else {
        None
    };
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    // Records of parts not run now stay: their directories are still there and in the report.
    let mut runs = report::read_runs(&args.out)?;
    let mut failed = Vec::new();
    for part in &parts {
        let command_line = part_command_line(part, args, trace.as_deref());
        let shown = std::iter::once("onecopy lab".to_string())
            .chain(command_line.iter().map(|word| shell_word(word)))
            .collect::<Vec<_>>()
            .join(" ");
        eprintln!("lab all: {shown}");
        let parsed = PartCommandLine::try_parse_from(
            std::iter::once("onecopy lab".to_string()).chain(command_line),
        )
        .with_context(|| format!("parsing the command line of {part}"))?;
        let start = std::time::Instant::now();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run_experiment(&parsed.experiment)
        }));
        let seconds = start.elapsed().as_secs_f64();
        let outcome = match outcome {
            Ok(Ok(())) => "ok".to_string(),
            Ok(Err(error)) => format!("{error:#}"),
            Err(_) => "panicked (see the message above)".to_string(),
        };
        eprintln!("lab all: {part} took {seconds:.0} s: {outcome}");
        if outcome != "ok" {
            failed.push(part.clone());
        }
        runs.retain(|run| run.part != *part);
        runs.push(PartRun {
            part: part.clone(),
            command: shown,
            seconds,
            outcome,
        });
        runs.sort_by_key(|run| all_parts.iter().position(|name| *name == run.part));
        onecopy_lab::results::write_json(&args.out.join(report::RUNS_FILE), &runs)?;
    }
    let path = report::write_report(&args.out)?;
    println!("{}", path.display());
    anyhow::ensure!(
        failed.is_empty(),
        "lab all: {} failed (the report lists why)",
        failed.join(", ")
    );
    Ok(())
}

/// The arguments after `onecopy lab` that run `part` into its subdirectory of `args.out`.
fn part_command_line(part: &str, args: &AllArgs, trace: Option<&std::path::Path>) -> Vec<String> {
    let out = args.out.join(part).display().to_string();
    let mut words = vec![part.to_string()];
    if part == "trace" {
        let trace = trace.expect("the trace file is found before the parts run");
        words.push(trace.display().to_string());
        // The whole excerpt is measured: with the paper's first half as warm-up, no read
        // hit remains in the second half of so short a trace (docs/LAB.md, paper 4).
        words.extend(["--warmup".to_string(), "0".to_string()]);
    } else if part == "paper4" {
        let trace = trace.expect("the trace file is found before the parts run");
        words.extend(["--trace".to_string(), trace.display().to_string()]);
        if args.quick {
            words.push("--quick".to_string());
        }
    } else {
        if args.quick {
            words.push("--quick".to_string());
        }
        if let Some(work_dir) = &args.work_dir {
            words.extend(["--work-dir".to_string(), work_dir.display().to_string()]);
        }
    }
    words.extend(["--out".to_string(), out]);
    words
}

/// The FIU mail excerpt in `shared/traces/` of the current directory or one above it.
fn find_trace_excerpt() -> anyhow::Result<PathBuf> {
    let current = std::env::current_dir().context("reading the current directory")?;
    current
        .ancestors()
        .map(|directory| directory.join(TRACE_EXCERPT))
        .find(|path| path.is_file())
        .with_context(|| {
            format!(
                "no {TRACE_EXCERPT} in {} or above it: give the FIU trace with --trace FILE, \
                 or leave the trace part out with --parts",
                current.display()
            )
        })
}

/// `word` quoted for a POSIX shell when it holds anything but plain characters.
fn shell_word(word: &str) -> String {
    let plain =
        |character: char| character.is_ascii_alphanumeric() || "-_./,=:@%+".contains(character);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

#[derive(Args, Debug)]
pub struct Paper3Args {
    /// Directory for results.json, the CSV tables, summary.md and the figures
    /// (paper3-fig3.svg, paper3-fig9.svg, paper3-fig10.svg, paper3-fig11.svg,
    /// paper3-fig15.svg, paper3-fig16-17.svg).
    #[arg(long, value_name = "DIR", default_value = "lab-results/paper3")]
    pub out: PathBuf,
    /// Smaller data sets, a run of at most three minutes: Fig. 3 on 16 files of 4 MiB
    /// instead of 64 of 8 MiB, the workloads of Table 4 of 64 MiB (files up to 8 MiB)
    /// instead of 512 MiB (up to 32 MiB), Table 6 on 6 releases of 6 MiB instead of 12 of
    /// 64 MiB, Fig. 15 on 24 MiB of /usr/include instead of all of it, Figs. 16 and 17 with
    /// 256 MiB served and pending (512 MiB without --quick).
    #[arg(long)]
    pub quick: bool,
    /// Where the temporary repositories and mounts are made [default: the system temporary
    /// directory].
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// The cache of `onecopy lab paper2`: its downloaded typescript releases are the
    /// real-world series of Table 6 when at least two are there (nothing is downloaded;
    /// otherwise the series is made from /usr/include) [default: the user's cache
    /// directory/onecopy-lab].
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
}

fn run_paper3(args: &Paper3Args) -> anyhow::Result<()> {
    let cache_directory = match &args.cache_dir {
        Some(directory) => directory.clone(),
        None => dirs::cache_dir()
            .unwrap_or_else(std::env::temp_dir)
            .join("onecopy-lab"),
    };
    let options = onecopy_lab::paper3::Paper3Options {
        out: args.out.clone(),
        quick: args.quick,
        work_dir: args.work_dir.clone(),
        cache_directory: Some(cache_directory),
    };
    for path in onecopy_lab::paper3::run(&options)? {
        println!("wrote {}", path.display());
    }
    Ok(())
}

#[derive(Args, Debug)]
pub struct Paper4Args {
    /// Directory for results.json, results.csv, summary.md and the SVG figures.
    #[arg(long, value_name = "DIR", default_value = "lab-results/paper4")]
    pub out: PathBuf,
    /// 3 synthetic days of 40,000 requests instead of 7 of 200,000, and smaller caches for
    /// Figs. 12 and 13: under a minute.
    #[arg(long)]
    pub quick: bool,
    /// The FIU trace to replay and to take the synthetic days' statistics from [default:
    /// shared/traces/fiu-mail-day1-excerpt.trace in the current directory or one above it].
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Synthetic days [default: 7, quick: 3].
    #[arg(long, value_name = "N")]
    pub days: Option<u32>,
    /// Block requests of each synthetic day [default: 200000, quick: 40000].
    #[arg(long, value_name = "N")]
    pub requests_per_day: Option<u64>,
    /// Scratch space of selective duplication, in 4 KiB blocks for all ten copies.
    #[arg(long, value_name = "N", default_value_t = onecopy_lab::paper4::SCRATCH_BLOCKS)]
    pub scratch_blocks: u64,
}

fn run_paper4(args: &Paper4Args) -> anyhow::Result<()> {
    let trace = match &args.trace {
        Some(file) => file.clone(),
        None => find_trace_excerpt()?,
    };
    let mut options = onecopy_lab::paper4::Paper4Options::new(args.out.clone(), trace, args.quick);
    if let Some(days) = args.days {
        options.days = days;
    }
    if let Some(requests) = args.requests_per_day {
        options.requests_per_day = requests;
    }
    options.scratch_blocks = args.scratch_blocks;
    for path in onecopy_lab::paper4::run(&options).context("running paper 4's replays")? {
        println!("wrote {}", path.display());
    }
    Ok(())
}

#[derive(Args, Debug)]
pub struct Paper5Args {
    /// Directory for results.json, results.csv, cache.csv, summary.md and the SVG figures.
    #[arg(long, value_name = "DIR", default_value = "lab-results/paper5")]
    pub out: PathBuf,
    /// 3 repetitions and an index of 8192 blocks instead of 5 and 65536: under two minutes.
    #[arg(long)]
    pub quick: bool,
    /// Where the temporary repositories are made [default: the system temporary directory];
    /// a tmpfs here removes the host disk from the measurement.
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// Runs of every series of Figs. 1 to 3 [default: 5, quick: 3].
    #[arg(long, value_name = "N")]
    pub repetitions: Option<usize>,
}

fn run_paper5(args: &Paper5Args) -> anyhow::Result<()> {
    let mut options = onecopy_lab::paper5::Paper5Options::new(
        args.out.clone(),
        args.quick,
        args.work_dir.clone(),
    );
    if let Some(repetitions) = args.repetitions {
        options.repetitions = repetitions;
    }
    for path in onecopy_lab::paper5::run(&options)? {
        println!("wrote {}", path.display());
    }
    Ok(())
}

fn run_trace(args: &TraceArgs) -> anyhow::Result<()> {
    let records = read_trace(&args.file)?;
    let cache_blocks = if args.cache_blocks.is_empty() {
        CACHE_BLOCKS_DEFAULT.to_vec()
    } else {
        args.cache_blocks.clone()
    };
    let written = run_trace_experiment(&args.file, &records, &cache_blocks, args.warmup, &args.out)
        .context("replaying the trace")?;
    for path in written {
        println!("{}", path.display());
    }
    Ok(())
}

fn run_paper1(args: &Paper1Args) -> anyhow::Result<()> {
    if args.replot {
        let results = paper1::read_results(&args.out.join("results.json"))?;
        let table = args.out.join("results.csv");
        paper1::results_table(&results.runs).write(&table)?;
        println!("{}", table.display());
        for path in paper1::figures::write_figures(&args.out, &results)? {
            println!("{}", path.display());
        }
        return Ok(());
    }
    let options = paper1_options(args)?;
    eprintln!(
        "paper 1: {}{} runs, results in {}",
        if options.uniqueness.is_some() {
            "Table 5.1, then "
        } else {
            ""
        },
        options.run_count(),
        options.output_directory.display()
    );
    let written = paper1::run_experiment(&options, &mut |line| eprintln!("{line}"))
        .context("running paper 1's experiment")?;
    for path in written {
        println!("{}", path.display());
    }
    Ok(())
}

/// The name of Table 5.1 in `--workloads`.
const UNIQUENESS: &str = "uniqueness";

fn paper1_options(args: &Paper1Args) -> anyhow::Result<Paper1Options> {
    let mut scale = if args.quick {
        Scale::quick()
    } else {
        Scale::full()
    };
    let mut uniqueness = if args.quick {
        UniquenessScale::quick()
    } else {
        UniquenessScale::full()
    };
    if let Some(size) = &args.index_cache {
        scale.index_cache_bytes = parse_size(size)?;
    }
    if let Some(source) = &args.warm_source {
        scale.warm_source = source.clone();
    }
    if let Some(size) = &args.warm_size {
        scale.warm_bytes = parse_size(size)?;
    }
    if let Some(files) = args.files {
        scale.metadata_files = files;
    }
    if let Some(files) = args.tree_files {
        scale.tree_files = files;
        scale.tree_operations = files / 4;
    }
    if let Some(appends) = args.appends {
        scale.journal_appends = appends;
    }
    if let Some(appends) = args.data_journal_appends {
        scale.data_journal_appends = appends;
    }
    if let Some(iterations) = args.fileserver_iterations {
        scale.fileserver_iterations = iterations;
    }
    if let Some(files) = args.uniqueness_files {
        uniqueness.files = files;
    }
    scale.copy_all_hints = args.copy_all_hints;
    let (workloads, run_uniqueness) = if args.workloads.is_empty() {
        (Workload::ALL.to_vec(), true)
    } else {
        let workloads = args
            .workloads
            .iter()
            .filter(|name| !name.eq_ignore_ascii_case(UNIQUENESS))
            .map(|name| name.parse())
            .collect::<Result<_, _>>()?;
        let run_uniqueness = args
            .workloads
            .iter()
            .any(|name| name.eq_ignore_ascii_case(UNIQUENESS));
        (workloads, run_uniqueness)
    };
    let latencies_ns = if !args.latencies.is_empty() {
        args.latencies
            .iter()
            .map(|text| parse_duration_ns(text))
            .collect::<Result<_, _>>()?
    } else if args.quick {
        vec![100_000, 1_000_000]
    } else {
        PAPER_LATENCIES_NS.to_vec()
    };
    let policies = if args.policies.is_empty() {
        None
    } else {
        Some(
            args.policies
                .iter()
                .map(|name| name.parse())
                .collect::<Result<_, _>>()?,
        )
    };
    Ok(Paper1Options {
        output_directory: args.out.clone(),
        work_directory: args.work_dir.clone().unwrap_or_else(std::env::temp_dir),
        workloads,
        latencies_ns,
        policies,
        repetitions: args.repetitions.unwrap_or(if args.quick { 1 } else { 3 }),
        scale,
        uniqueness: run_uniqueness.then_some(uniqueness),
    })
}

#[derive(Args, Debug)]
pub struct Paper2Args {
    /// Directory for results.json, the CSV tables, summary.md and the SVG figures.
    #[arg(long, value_name = "DIR", default_value = "lab-results/paper2")]
    pub out: PathBuf,
    /// Small images, few weeks and releases: a smoke test of a few minutes.
    #[arg(long)]
    pub quick: bool,
    /// Datasets, comma separated: sg1, sg2, sg3, sg4, sg5, gp, typescript [default: all].
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub series: Vec<String>,
    /// Tools compared on the typescript series, comma separated: onecopy, restic, borg,
    /// rustic, bupstash, or none [default: onecopy, restic, borg].
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub peers: Vec<String>,
    /// Where stores, images and peer repositories are made [default: the system temporary
    /// directory]; removed at the end.
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// Where downloaded releases are kept between runs [default: ~/.cache/onecopy-lab].
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Tree the base image's files are copied from.
    #[arg(long, value_name = "DIR", default_value = "/usr")]
    pub base_source: PathBuf,
    /// Size of each synthetic image [default: 384MiB, quick: 64MiB].
    #[arg(long, value_name = "SIZE")]
    pub image_size: Option<String>,
    /// Bytes of files in the base image [default: 128MiB, quick: 16MiB].
    #[arg(long, value_name = "SIZE")]
    pub content_size: Option<String>,
    /// Weekly backups of SG1-SG5 [default: 20, quick: 4].
    #[arg(long, value_name = "N")]
    pub weeks: Option<u32>,
    /// Series of GP [default: 4, quick: 2].
    #[arg(long, value_name = "N")]
    pub group_series: Option<u32>,
    /// Weekly backups of each GP series [default: 10, quick: 3].
    #[arg(long, value_name = "N")]
    pub group_weeks: Option<u32>,
    /// Typescript releases [default: 24, quick: 4].
    #[arg(long, value_name = "N")]
    pub releases: Option<usize>,
    /// Runs of every dataset and of the unique-data test, which the figures average with
    /// the lowest and highest run as error bars [default: 5 as in the paper, quick: 2].
    #[arg(long, value_name = "N")]
    pub repetitions: Option<u32>,
    /// Unique data written and read back per run for Table 2, or 0 to skip it [default:
    /// 256MiB, quick: 32MiB].
    #[arg(long, value_name = "SIZE")]
    pub unique_size: Option<String>,
    /// Runs of the unique-data test [default: --repetitions].
    #[arg(long, value_name = "N")]
    pub unique_runs: Option<u32>,
    /// Prefix of the typescript versions forming the series.
    #[arg(long, value_name = "TEXT", default_value = paper2::typescript::VERSION_PREFIX_DEFAULT)]
    pub release_prefix: String,
    /// Threads reading containers during restores [default: the number of cores].
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Only redraw the figures, tables and summary from the results.json in --out.
    #[arg(long)]
    pub replot: bool,
}

fn run_paper2(args: &Paper2Args) -> anyhow::Result<()> {
    if args.replot {
        let results = paper2::read_results(&args.out.join("results.json"))?;
        for path in paper2::write_outputs(&args.out, &results)? {
            println!("{}", path.display());
        }
        return Ok(());
    }
    let mut scale = if args.quick {
        paper2::Scale::quick()
    } else {
        paper2::Scale::full()
    };
    if let Some(size) = &args.image_size {
        scale.image_bytes = parse_size(size)?;
    }
    if let Some(size) = &args.content_size {
        scale.content_bytes = parse_size(size)?;
    }
    if let Some(weeks) = args.weeks {
        scale.weeks = weeks;
    }
    if let Some(series) = args.group_series {
        scale.group_series = series;
    }
    if let Some(weeks) = args.group_weeks {
        scale.group_weeks = weeks;
    }
    if let Some(releases) = args.releases {
        scale.releases = releases;
    }
    if let Some(repetitions) = args.repetitions {
        anyhow::ensure!(repetitions >= 1, "--repetitions: give 1 or more");
        scale.repetitions = repetitions;
    }
    if let Some(size) = &args.unique_size {
        scale.unique_bytes = parse_size(size)?;
    }
    if let Some(runs) = args.unique_runs {
        anyhow::ensure!(runs >= 1, "--unique-runs: give 1 or more");
        scale.unique_runs = runs;
    }
    let datasets: Vec<Dataset> = if args.series.is_empty() {
        Dataset::ALL.to_vec()
    } else {
        args.series
            .iter()
            .map(|name| name.parse())
            .collect::<Result<_, _>>()?
    };
    let peers: Vec<Tool> = match args.peers.as_slice() {
        [] => vec![Tool::Onecopy, Tool::Restic, Tool::Borg],
        [none] if none == "none" => Vec::new(),
        names => names
            .iter()
            .map(|name| name.parse())
            .collect::<Result<_, _>>()?,
    };
    let cache_directory = match &args.cache_dir {
        Some(directory) => directory.clone(),
        None => dirs::cache_dir()
            .unwrap_or_else(std::env::temp_dir)
            .join("onecopy-lab"),
    };
    let options = Paper2Options {
        output_directory: args.out.clone(),
        work_directory: args.work_dir.clone().unwrap_or_else(std::env::temp_dir),
        cache_directory,
        base_source: args.base_source.clone(),
        datasets,
        scale,
        peers,
        onecopy_executable: std::env::current_exe().context("finding the onecopy executable")?,
        release_prefix: args.release_prefix.clone(),
        read_threads: args
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |count| count.get())),
    };
    let names = |names: Vec<String>| {
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    };
    eprintln!(
        "paper 2: datasets {}; peers {}; results in {}",
        names(options.datasets.iter().map(ToString::to_string).collect()),
        names(options.peers.iter().map(ToString::to_string).collect()),
        options.output_directory.display()
    );
    let written = paper2::run_experiment(&options, &mut |line| eprintln!("{line}"))
        .context("running paper 2's experiment")?;
    for path in written {
        println!("{}", path.display());
    }
    Ok(())
}

#[derive(Args, Debug)]
pub struct PeersArgs {
    /// Directory for results.json, the CSV tables, summary.md and peers.svg.
    #[arg(long, value_name = "DIR", default_value = "lab-results/peers")]
    pub out: PathBuf,
    /// Datasets, comma separated: typescript, debian [default: both].
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub datasets: Vec<String>,
    /// Tools, comma separated: onecopy, restic, borg, rustic, bupstash [default: all].
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub tools: Vec<String>,
    /// Typescript releases.
    #[arg(long, value_name = "N", default_value_t = 24)]
    pub releases: usize,
    /// Prefix of the typescript versions forming the series.
    #[arg(long, value_name = "TEXT", default_value = paper2::typescript::VERSION_PREFIX_DEFAULT)]
    pub release_prefix: String,
    /// Debian suite of the system tree.
    #[arg(long, value_name = "NAME", default_value = peers::debian::SUITE_DEFAULT)]
    pub debian_suite: String,
    /// Debian mirror the system tree is made from.
    #[arg(long, value_name = "URL", default_value = peers::debian::MIRROR_DEFAULT)]
    pub debian_mirror: String,
    /// Unchanged backups and restores of the newest by every tool.
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub rounds: u32,
    /// Fail when rustic or bupstash is missing instead of installing it with `cargo install`.
    #[arg(long)]
    pub no_install: bool,
    /// Where repositories and the stage are made [default: /var/tmp]; removed at the end.
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// Where restores are made, removed after each: memory by default, so that the timings
    /// are the tools' and not a disk file system's inode allocator's.
    #[arg(long, value_name = "DIR", default_value = "/dev/shm")]
    pub restore_dir: PathBuf,
    /// Where the datasets are kept between runs [default: ~/.cache/onecopy-lab, shared with
    /// paper 2].
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Only rewrite the tables, summary and figure from the results.json in --out.
    #[arg(long)]
    pub replot: bool,
}

fn run_peers(args: &PeersArgs) -> anyhow::Result<()> {
    if args.replot {
        let results: peers::PeersResults =
            onecopy_lab::results::read_json(&args.out.join("results.json"))?;
        for path in peers::report::write_outputs(&args.out, &results)? {
            println!("{}", path.display());
        }
        return Ok(());
    }
    let datasets: Vec<PeerDataset> = if args.datasets.is_empty() {
        PeerDataset::ALL.to_vec()
    } else {
        args.datasets
            .iter()
            .map(|name| name.parse())
            .collect::<Result<_, _>>()?
    };
    let tools: Vec<Tool> = if args.tools.is_empty() {
        Tool::ALL.to_vec()
    } else {
        args.tools
            .iter()
            .map(|name| name.parse())
            .collect::<Result<_, _>>()?
    };
    let options = PeersOptions {
        output_directory: args.out.clone(),
        // Not /tmp, often a small tmpfs: the Debian repositories and restores take GiBs.
        work_directory: args
            .work_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from("/var/tmp")),
        restore_directory: args.restore_dir.clone(),
        cache_directory: match &args.cache_dir {
            Some(directory) => directory.clone(),
            None => dirs::cache_dir()
                .unwrap_or_else(std::env::temp_dir)
                .join("onecopy-lab"),
        },
        datasets,
        tools,
        onecopy_executable: std::env::current_exe().context("finding the onecopy executable")?,
        releases: args.releases,
        release_prefix: args.release_prefix.clone(),
        debian_suite: args.debian_suite.clone(),
        debian_mirror: args.debian_mirror.clone(),
        rounds: args.rounds,
        install_missing: !args.no_install,
    };
    std::fs::create_dir_all(&options.output_directory)
        .with_context(|| format!("creating {}", options.output_directory.display()))?;
    eprintln!(
        "peers: datasets {}; tools {}; results in {}",
        options
            .datasets
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        options
            .tools
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        options.output_directory.display()
    );
    let written = peers::run_experiment(&options, &mut |line| eprintln!("{line}"))
        .context("running the peer comparison")?;
    for path in written {
        println!("{}", path.display());
    }
    Ok(())
}
