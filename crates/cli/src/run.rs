//! `hugelab run`: runs workloads and prints their counters per snapshot.

use crate::table;
use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use hugelab_kernel::KernelBackend;
use hugelab_model::Model;
use hugelab_workload::{run_file, Observation};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
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
    /// Print one JSON document per workload instead of tables.
    #[arg(long)]
    json: bool,
    /// Show every counter, not only those that are non-zero somewhere.
    #[arg(long)]
    all: bool,
    /// Check the model's invariants after every statement (slower): mapcounts
    /// against page tables, refcounts against mappings and pins, the anon and
    /// page-table counters, and that every frame is free or accounted for.
    #[arg(long)]
    check: bool,
    /// Workload files (.hlw, or compressed: .hlw.gz, .hlw.zst), each read
    /// as a stream: a statement runs as soon as it is read and checked.
    #[arg(required = true)]
    files: Vec<PathBuf>,
}

/// Runs one workload file on the model (default tunables; with `check`, the
/// invariants checked after every statement) or on the kernel.
fn observe(backend: BackendName, file: &Path, check: bool) -> Result<Observation> {
    Ok(match backend {
        BackendName::Model if check => {
            run_file(&mut Model::default().with_invariant_checks(), file)?
        }
        BackendName::Model => run_file(&mut Model::default(), file)?,
        BackendName::Kernel => run_kernel(file)?,
    })
}

/// Runs a workload file on this machine's kernel; every tunable is restored
/// after, also when the run stopped at an error.
pub fn run_kernel(file: &Path) -> Result<Observation> {
    let exe = std::env::current_exe().context("cannot find the hugelab binary for the agents")?;
    let mut kernel = KernelBackend::new(exe)?;
    let obs = run_file(&mut kernel, file);
    kernel.finish()?;
    Ok(obs?)
}

pub fn main(args: RunArgs) -> Result<ExitCode> {
    if args.check && matches!(args.backend, BackendName::Kernel) {
        anyhow::bail!(
            "--check checks the model's own invariants; it works with --backend model only"
        );
    }
    let mut failed = false;
    for file in &args.files {
        let obs = observe(args.backend, file, args.check)?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&obs)?);
        } else {
            print!("{}", render(&obs, args.all));
        }
        for e in obs.failed_expects() {
            failed = true;
            eprintln!("{}", e.failure(&obs.workload));
        }
    }
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// One table per workload: a row per counter, a column per snapshot.
fn render(obs: &Observation, all: bool) -> String {
    let names: BTreeSet<&String> = obs
        .snapshots
        .iter()
        .flat_map(|s| s.counters.keys().chain(s.unknown.keys()))
        .collect();
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
            if !all && !unknown && values.iter().all(|v| v.unwrap_or(0) == 0) {
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
