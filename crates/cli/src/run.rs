//! `hugelab run`: runs workloads and prints their counters per snapshot.

use crate::table;
use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use hugelab_model::Model;
use hugelab_workload::{parse_file, run, Observation};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum BackendName {
    /// The executable model of Linux 6.18.
    Model,
    /// The real kernel of this machine (needs root; not built yet).
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
    /// Workload files (.hlw).
    #[arg(required = true)]
    files: Vec<PathBuf>,
}

pub fn main(args: RunArgs) -> Result<ExitCode> {
    if let BackendName::Kernel = args.backend {
        bail!("the kernel backend is not built yet; use --backend model");
    }
    let mut failed = false;
    for file in &args.files {
        let workload = parse_file(file)?;
        let mut model = Model::default();
        let obs = run(&mut model, &workload)?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&obs)?);
        } else {
            print!("{}", render(&obs, args.all));
        }
        for e in obs.failed_expects() {
            failed = true;
            let actual = e
                .actual
                .map_or("not reported by this backend".to_string(), |a| {
                    a.to_string()
                });
            eprintln!(
                "{}:{}:{}: expect {} {} {} failed: actual {actual}",
                obs.workload, e.line, e.col, e.counter, e.op, e.expected
            );
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
        .flat_map(|s| s.counters.keys())
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
            if !all && values.iter().all(|v| v.unwrap_or(0) == 0) {
                return None;
            }
            let mut row = vec![name.clone()];
            row.extend(
                values
                    .iter()
                    .map(|v| v.map_or("-".to_string(), |v| v.to_string())),
            );
            Some(row)
        })
        .collect();
    let passed = obs.expects.iter().filter(|e| e.passed).count();
    format!(
        "# {} ({} backend)\n{}expectations: {} passed, {} failed\n\n",
        obs.workload,
        obs.backend,
        table::render(&header, &rows),
        passed,
        obs.expects.len() - passed
    )
}
