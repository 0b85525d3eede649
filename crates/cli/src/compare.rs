//! `hugelab compare`: one workload under several settings, one table — rows
//! are counters, a column per setting and the change against the first, in the
//! shape of the tables of seed 000 (multi-size THP).

use crate::table;
use anyhow::{bail, Context, Result};
use clap::Args;
use hugelab_model::Model;
use hugelab_workload::{parse, parse_file, run, Counters, Workload};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::ExitCode;

const BUILTIN: &str = include_str!("../workloads/builtin.hlw");

/// The seed's configurations: 4K pages only, then 16K, 32K+16K, 64K+32K+16K
/// small-order THP, then PMD THP.
const SEED_SETTINGS: &[&str] = &[
    "4K:transparent_hugepage/enabled=never",
    "16K:transparent_hugepage/enabled=never,transparent_hugepage/hugepages-16kB/enabled=always",
    "32K+16K:transparent_hugepage/enabled=never,transparent_hugepage/hugepages-16kB/enabled=always,transparent_hugepage/hugepages-32kB/enabled=always",
    "64K+32K+16K:transparent_hugepage/enabled=never,transparent_hugepage/hugepages-16kB/enabled=always,transparent_hugepage/hugepages-32kB/enabled=always,transparent_hugepage/hugepages-64kB/enabled=always",
    "PMD:transparent_hugepage/enabled=always",
];

#[derive(Args)]
pub struct CompareArgs {
    /// A setting: NAME:TUNABLE=VALUE,TUNABLE=VALUE... (repeat for each column;
    /// the first is the baseline). Default: the configurations of seed 000.
    #[arg(long = "setting", value_name = "NAME:TUNABLE=VALUE,...")]
    settings: Vec<String>,
    /// The snapshot to compare. Default: the workload's first snapshot, else `end`.
    #[arg(long)]
    snapshot: Option<String>,
    /// Show every counter: zeros too, and the per-region `smaps.*` and `folios.*`
    /// rows that are hidden by default.
    #[arg(long)]
    all: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// The workload (.hlw). Default: a built-in compiler-like workload.
    file: Option<PathBuf>,
}

struct Setting {
    name: String,
    workload: Workload,
}

/// Parses `NAME:TUNABLE=VALUE,...` into `set` statements, checked by the
/// workload parser like any other.
fn parse_setting(spec: &str) -> Result<Setting> {
    let (name, assignments) = spec
        .split_once(':')
        .with_context(|| format!("--setting '{spec}': expected NAME:TUNABLE=VALUE,..."))?;
    if name.is_empty() {
        bail!("--setting '{spec}': the setting needs a name before ':'");
    }
    let mut text = String::new();
    for assignment in assignments.split(',').filter(|a| !a.is_empty()) {
        let (tunable, value) = assignment
            .split_once('=')
            .with_context(|| format!("--setting '{spec}': '{assignment}' is not TUNABLE=VALUE"))?;
        text.push_str(&format!("set {tunable} {value}\n"));
    }
    let workload = parse(&format!("--setting {name}"), &text)?;
    Ok(Setting {
        name: name.to_string(),
        workload,
    })
}

pub fn main(args: CompareArgs) -> Result<ExitCode> {
    let workload = match &args.file {
        Some(file) => parse_file(file)?,
        None => parse("builtin.hlw", BUILTIN)?,
    };
    let specs: Vec<String> = if args.settings.is_empty() {
        SEED_SETTINGS.iter().map(|s| s.to_string()).collect()
    } else {
        args.settings.clone()
    };
    let settings = specs
        .iter()
        .map(|s| parse_setting(s))
        .collect::<Result<Vec<_>>>()?;
    let label = args.snapshot.clone().unwrap_or_else(|| {
        workload
            .stmts
            .iter()
            .find_map(|s| match &s.kind {
                hugelab_workload::StmtKind::Snapshot { label } => Some(label.clone()),
                _ => None,
            })
            .unwrap_or_else(|| "end".to_string())
    });
    let mut columns: Vec<(String, Counters)> = Vec::new();
    for setting in &settings {
        let mut combined = setting.workload.clone();
        combined.file = workload.file.clone();
        combined.stmts.extend(workload.stmts.iter().cloned());
        let mut model = Model::default();
        let obs = run(&mut model, &combined)
            .with_context(|| format!("under setting {}", setting.name))?;
        let snap = obs
            .snapshot(&label)
            .with_context(|| format!("the workload has no snapshot '{label}'"))?;
        columns.push((setting.name.clone(), snap.counters.clone()));
    }
    if args.json {
        let doc: serde_json::Map<String, serde_json::Value> = columns
            .iter()
            .map(|(name, c)| (name.clone(), serde_json::to_value(c).unwrap_or_default()))
            .collect();
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(ExitCode::SUCCESS);
    }
    print!("{}", render(&workload.file, &label, &columns, args.all));
    Ok(ExitCode::SUCCESS)
}

/// Per-region rows (`folios.*`, `smaps.<proc>.<region>.<field>`): many, and
/// summed up by the per-process and system-wide rows.
fn is_per_region(name: &str) -> bool {
    name.starts_with("folios.") || (name.starts_with("smaps.") && name.split('.').count() == 4)
}

fn change(base: i64, v: i64) -> String {
    if base == 0 {
        return if v == 0 { "0.0%".into() } else { "n/a".into() };
    }
    format!("{:+.1}%", (v - base) as f64 * 100.0 / base as f64)
}

fn render(file: &str, label: &str, columns: &[(String, Counters)], all: bool) -> String {
    let names: BTreeSet<&String> = columns.iter().flat_map(|(_, c)| c.keys()).collect();
    let mut header = vec!["counter".to_string()];
    header.extend(columns.iter().map(|(n, _)| n.clone()));
    header.extend(
        columns
            .iter()
            .skip(1)
            .map(|(n, _)| format!("{n} vs {}", columns[0].0)),
    );
    let mut rows = Vec::new();
    for name in names {
        let values: Vec<i64> = columns
            .iter()
            .map(|(_, c)| c.get(name).copied().unwrap_or(0))
            .collect();
        if !all && (values.iter().all(|v| *v == 0) || is_per_region(name)) {
            continue;
        }
        let mut row = vec![name.clone()];
        row.extend(values.iter().map(i64::to_string));
        row.extend(values.iter().skip(1).map(|v| change(values[0], *v)));
        rows.push(row);
    }
    format!(
        "# {file} at snapshot '{label}', model backend\n{}",
        table::render(&header, &rows)
    )
}
