//! `hugelab run`: runs workloads and prints their counters per snapshot.

use crate::kernel_limit::{kernel_run, print_dry_run, KernelLimitArgs};
use crate::table;
use crate::table::plural;
use crate::workload_args::{CounterOutput, WorkloadFiles};
use anyhow::Result;
use clap::{Args, ValueEnum};
use hugelab_model::Model;
use hugelab_workload::{counters, run_file_counted, Observation};
use std::collections::BTreeSet;
use std::path::Path;
use std::process::ExitCode;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum BackendName {
    /// The executable model of Linux 6.18.
    Model,
    /// The real kernel of this machine (needs root and writable sysfs).
    Kernel,
}

#[derive(Args)]
pub struct RunArgs {
    /// Which machine runs the workload.
    #[arg(long, value_enum, default_value = "model")]
    backend: BackendName,
    #[command(flatten)]
    output: CounterOutput,
    /// Show only these counters in the tables, zeros included (repeat;
    /// names as `hugelab counters` lists them, as `compare --counter`).
    #[arg(long = "counter", value_name = "NAME")]
    counters: Vec<String>,
    #[command(flatten)]
    limits: KernelLimitArgs,
    #[command(flatten)]
    workloads: WorkloadFiles,
}

/// Runs one workload file on the model (default tunables; with `check`, the
/// invariants checked after every statement) or on the kernel: what it
/// observed and how many statements it read.
fn observe(
    backend: BackendName,
    file: &Path,
    check: bool,
    limits: &KernelLimitArgs,
) -> Result<(Observation, u64)> {
    Ok(match backend {
        BackendName::Model if check => {
            run_file_counted(&mut Model::default().with_invariant_checks(), file)?
        }
        BackendName::Model => run_file_counted(&mut Model::default(), file)?,
        BackendName::Kernel => kernel_run(file, limits, |k| Ok(run_file_counted(k, file)?))?,
    })
}

/// What `run` totals over its files.
#[derive(Default)]
struct Totals {
    files: u64,
    snapshots: u64,
    statements: u64,
    passed: u64,
    failed: u64,
    unknown: u64,
}

impl Totals {
    fn add(&mut self, obs: &Observation, statements: u64) {
        let passed = obs.expects.iter().filter(|e| e.passed).count() as u64;
        let unknown = obs.unknown_expects().count() as u64;
        self.files += 1;
        self.snapshots += obs.snapshots.len() as u64;
        self.statements += statements;
        self.passed += passed;
        self.unknown += unknown;
        self.failed += obs.expects.len() as u64 - passed - unknown;
    }

    /// One line: "total: 3 files, 7 snapshots, 120 statements (invariants
    /// checked after each); expectations: 12 passed, 1 failed, 0 not checked
    /// (unknown)".
    fn line(&self, check: bool) -> String {
        format!(
            "total: {}, {}, {}{}; expectations: {} passed, {} failed, {} not checked (unknown)\n",
            plural(self.files, "file", "files"),
            plural(self.snapshots, "snapshot", "snapshots"),
            plural(self.statements, "statement", "statements"),
            if check {
                " (invariants checked after each)"
            } else {
                ""
            },
            self.passed,
            self.failed,
            self.unknown
        )
    }
}

pub fn main(args: RunArgs) -> Result<ExitCode> {
    if args.workloads.check && matches!(args.backend, BackendName::Kernel) {
        anyhow::bail!(
            "--check checks the model's own invariants; it works with --backend model only"
        );
    }
    for name in &args.counters {
        if counters::lookup(name).is_none() {
            anyhow::bail!("--counter: {}", counters::unknown_counter_message(name));
        }
    }
    if args.limits.dry_run {
        if !matches!(args.backend, BackendName::Kernel) {
            anyhow::bail!(
                "--dry-run shows what a kernel run would make; it works with --backend kernel only"
            );
        }
        print_dry_run(&args.workloads.files, &args.limits)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut failed = false;
    let mut totals = Totals::default();
    for file in &args.workloads.files {
        let (obs, statements) = observe(args.backend, file, args.workloads.check, &args.limits)?;
        totals.add(&obs, statements);
        if args.output.json {
            // JSON Lines: one document per workload, on one line.
            println!("{}", serde_json::to_string(&obs)?);
        } else {
            print!("{}", render(&obs, args.output.all, &args.counters));
        }
        for e in obs.failed_expects() {
            failed = true;
            eprintln!("{}", e.failure(&obs.workload));
        }
    }
    if !args.output.json && (args.workloads.files.len() > 1 || args.workloads.check) {
        print!("{}", totals.line(args.workloads.check));
    }
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// One table per workload: a row per counter, a column per snapshot; with
/// `only`, just those counters, in that order, zeros included.
fn render(obs: &Observation, all: bool, only: &[String]) -> String {
    let names: Vec<&String> = if only.is_empty() {
        let all_names: BTreeSet<&String> = obs
            .snapshots
            .iter()
            .flat_map(|s| s.counters.keys().chain(s.unknown.keys()))
            .collect();
        all_names.into_iter().collect()
    } else {
        only.iter().collect()
    };
    let mut header = vec!["counter".to_string()];
    header.extend(obs.snapshots.iter().map(|s| s.label.clone()));
    let rows: Vec<Vec<String>> = names
        .into_iter()
        .filter_map(|name| {
            let values: Vec<Option<i64>> = obs
                .snapshots
                .iter()
                .map(|s| s.counters.get(name).copied())
                .collect();
            let unknown = obs.snapshots.iter().any(|s| s.unknown.contains_key(name));
            if !all && only.is_empty() && !unknown && values.iter().all(|v| v.unwrap_or(0) == 0) {
                return None;
            }
            let mut row = vec![name.clone()];
            row.extend(obs.snapshots.iter().zip(&values).map(|(s, v)| match v {
                Some(v) => v.to_string(),
                None if s.unknown.contains_key(name) => "unknown".to_string(),
                None => "-".to_string(),
            }));
            Some(row)
        })
        .collect();
    let passed = obs.expects.iter().filter(|e| e.passed).count();
    let unknown = obs.unknown_expects().count();
    let reasons: BTreeSet<&String> = obs
        .snapshots
        .iter()
        .flat_map(|s| s.unknown.values())
        .collect();
    let mut notes = String::new();
    for c in &obs.failed_calls {
        notes.push_str(&format!(
            "line {}: {}: {}; the workload went on\n",
            c.line, c.statement, c.message
        ));
    }
    for k in &obs.kills {
        notes.push_str(&format!(
            "line {}: {}: {}; the workload went on\n",
            k.line, k.statement, k.message
        ));
    }
    for r in reasons {
        notes.push_str(&format!("unknown: {r}\n"));
    }
    format!(
        "# {} ({} backend)\n{}{notes}expectations: {} passed, {} failed, {} not checked (unknown)\n\n",
        obs.workload,
        obs.backend,
        table::render(&header, &rows),
        passed,
        obs.expects.len() - passed - unknown,
        unknown
    )
}
