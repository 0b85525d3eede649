//! `hugelab`: model, measure and tune Linux huge pages.
//!
//! The CLI is the only crate that knows the backends; it parses arguments,
//! runs workloads through `hugelab_workload::run` and prints what comes back.

mod bench;
mod bench_plot;
mod bench_record;
mod bench_report;
mod bench_stats;
mod closed_stdout;
mod compare;
mod counters;
mod diff;
mod diff_noise;
mod explain;
mod exporter;
mod hugetlb;
mod hugetlb_measure;
mod hugetlb_measure_report;
mod kernel_limit;
mod predict;
mod predict_report;
mod predict_why;
mod record;
mod record_exits;
mod record_write;
mod run;
mod scan;
mod scan_print;
mod settings;
mod settings_activity;
mod settings_meminit;
mod svg;
mod sweep;
mod sweep_pool;
mod sweep_ray;
mod table;
mod utilization;
mod utilization_view;
mod validate;
mod validate_rows;
mod workload_args;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "hugelab",
    version,
    about = "Model, measure and tune Linux huge pages"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run workloads and print their counters at each snapshot; checks `expect` lines.
    Run(run::RunArgs),
    /// Run one workload under several settings and compare the counters.
    Compare(compare::CompareArgs),
    /// A workload (normally a recording) on the model under each setting, in
    /// parallel: the figures `bench` measures, predicted.
    Predict(predict::PredictArgs),
    /// `predict` of a recording beside `bench` of the program under the same
    /// settings: predicted and measured, with the error per figure (root).
    Validate(validate::ValidateArgs),
    /// Run workloads on the model and on this machine's kernel, side by side.
    Diff(diff::DiffArgs),
    /// Why each fault of a statement got the folio size it got: the kernel's
    /// decisions, fault by fault, grouped (FILE.hlw or FILE.hlw:LINE).
    Explain(explain::ExplainArgs),
    /// List the counters hugelab knows: families, fields, kinds and units.
    Counters(counters::CountersArgs),
    /// The huge pages of running processes: shape, utilization, what the shrinker would free.
    Scan(scan::ScanArgs),
    /// Prometheus metrics of this machine's huge pages, per memory cgroup too (root).
    Exporter(exporter::ExporterArgs),
    /// How full each large folio is at a snapshot, why it exists, and what the
    /// deferred split shrinker would give back.
    Utilization(utilization::UtilizationArgs),
    /// A/B-test a command under huge-page settings, each run in its own memory cgroup.
    Bench(bench::BenchArgs),
    /// Record a command's page faults, mm syscalls and tasks as a workload (root).
    Record(record::RecordArgs),
    /// Every workload × machine shape × setting on the model, in worker
    /// processes or on a Ray cluster (--ray): a row per cell, snapshot and counter (Parquet, CSV, JSON),
    /// resumable, and a summary per workload like `compare`'s.
    Sweep(sweep::SweepArgs),
    /// Show or restore the kernel tunables hugelab changes.
    #[command(subcommand)]
    Settings(settings::SettingsCommand),
    /// HugeTLB pages: what the vmemmap optimization (HVO) saves.
    #[command(subcommand)]
    Hugetlb(hugetlb::HugetlbCommand),
}

fn main() -> ExitCode {
    // The kernel backend's process agents are this binary too; they must start
    // without allocating more than they need, so they skip argument parsing.
    let mut args = std::env::args();
    if args.nth(1).as_deref() == Some("__agent") {
        let fd = args.next().and_then(|fd| fd.parse().ok());
        let runner = args.next().and_then(|pid| pid.parse().ok());
        let after_exec = match (args.next().as_deref(), args.next().as_deref()) {
            (None, _) => Ok(None),
            (Some(hugelab_kernel::agent_task::EXEC_ARG), Some("0")) => Ok(Some(false)),
            (Some(hugelab_kernel::agent_task::EXEC_ARG), Some("1")) => Ok(Some(true)),
            _ => Err(()),
        };
        match (fd, runner, after_exec) {
            (Some(fd), Some(runner), Ok(thp)) => hugelab_kernel::agent::agent_main(fd, runner, thp),
            _ => return ExitCode::from(2),
        }
    }
    // `sweep`'s worker processes are this binary too (sweep_pool).
    if std::env::args().nth(1).as_deref() == Some(sweep_pool::WORKER_ARG) {
        return sweep_pool::worker_main();
    }
    let cli = Cli::parse();
    // A print into a closed pipe ends the process quietly, after unwinding
    // has restored the machine (see closed_stdout).
    closed_stdout::run(|| dispatch(cli))
}

fn dispatch(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Command::Run(args) => run::main(args),
        Command::Compare(args) => compare::main(args),
        Command::Predict(args) => predict::main(args),
        Command::Validate(args) => validate::main(args),
        Command::Diff(args) => diff::main(args),
        Command::Explain(args) => explain::main(args),
        Command::Counters(args) => counters::main(args),
        Command::Scan(args) => scan::main(args),
        Command::Exporter(args) => exporter::main(args),
        Command::Bench(args) => bench::main(args),
        Command::Record(args) => record::main(args),
        Command::Hugetlb(cmd) => hugetlb::main(cmd),
        Command::Settings(cmd) => settings::main(cmd),
        Command::Utilization(args) => utilization::main(args),
        Command::Sweep(args) => sweep::main(args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("hugelab: {err:#}");
            ExitCode::from(2)
        }
    }
}
