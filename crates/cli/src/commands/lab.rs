//! `onecopy lab`: run the experiments that reproduce the papers (see docs/LAB.md).

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};

use onecopy_core::index::cache::CachePolicy;
use onecopy_core::units::{parse_duration_ns, parse_size};
use onecopy_lab::paper1::{self, Paper1Options, Scale, Workload, PAPER_LATENCIES_NS};

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
}

#[derive(Args, Debug)]
pub struct Paper1Args {
    /// Directory for results.json, results.csv, summary.md and the SVG figures.
    #[arg(long, value_name = "DIR", default_value = "lab-results/paper1")]
    pub out: PathBuf,
    /// Small scale and two latencies (100us, 1ms): a smoke test of a few minutes.
    #[arg(long)]
    pub quick: bool,
    /// Where each run's temporary repository and mount point are made [default: the system
    /// temporary directory]; a tmpfs here removes the host disk from the measurement.
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// Workloads to run, comma separated: metadata, journal, copy [default: all].
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub workloads: Vec<String>,
    /// Injected on-disk index latencies, comma separated [default: 10us,100us,500us,1ms,10ms].
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub latencies: Vec<String>,
    /// Index cache policies, comma separated [default: lru,arc].
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub policies: Vec<String>,
    /// Runs of every cell of the matrix.
    #[arg(long, default_value_t = 1)]
    pub repetitions: u32,
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
    /// Appends of the journal workload [default: 20000, quick: 1000].
    #[arg(long, value_name = "N")]
    pub appends: Option<u64>,
    /// Only redraw the figures and summary from the results.json in --out.
    #[arg(long)]
    pub replot: bool,
}

pub fn run(_cli: &Cli, args: &LabArgs) -> anyhow::Result<()> {
    match &args.experiment {
        LabCommand::Paper1(paper1_args) => run_paper1(paper1_args),
    }
}

fn run_paper1(args: &Paper1Args) -> anyhow::Result<()> {
    if args.replot {
        let results = paper1::read_results(&args.out.join("results.json"))?;
        for path in paper1::figures::write_figures(&args.out, &results.runs)? {
            println!("{}", path.display());
        }
        return Ok(());
    }
    let options = paper1_options(args)?;
    eprintln!(
        "paper 1: {} runs, results in {}",
        options.workloads.len()
            * options.latencies_ns.len()
            * options.policies.len()
            * 2
            * options.repetitions as usize,
        options.output_directory.display()
    );
    let written = paper1::run_experiment(&options, &mut |line| eprintln!("{line}"))
        .context("running paper 1's experiment")?;
    for path in written {
        println!("{}", path.display());
    }
    Ok(())
}

fn paper1_options(args: &Paper1Args) -> anyhow::Result<Paper1Options> {
    let mut scale = if args.quick {
        Scale::quick()
    } else {
        Scale::full()
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
    if let Some(appends) = args.appends {
        scale.journal_appends = appends;
    }
    let workloads = if args.workloads.is_empty() {
        Workload::ALL.to_vec()
    } else {
        args.workloads
            .iter()
            .map(|name| name.parse())
            .collect::<Result<_, _>>()?
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
        vec![CachePolicy::Lru, CachePolicy::Arc]
    } else {
        args.policies
            .iter()
            .map(|name| name.parse())
            .collect::<Result<_, _>>()?
    };
    Ok(Paper1Options {
        output_directory: args.out.clone(),
        work_directory: args.work_dir.clone().unwrap_or_else(std::env::temp_dir),
        workloads,
        latencies_ns,
        policies,
        repetitions: args.repetitions,
        scale,
    })
}
