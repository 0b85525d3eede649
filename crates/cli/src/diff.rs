//! `hugelab diff`: each workload on the model and on this machine's kernel,
//! every counter both report side by side, every mismatch marked.
//!
//! The model starts from the machine's current tunables, so that a workload
//! that sets only some of them means the same on both sides. A counter the
//! kernel backend could not read reliably is `unknown`, never a number. A few
//! kernel counters count attempts rather than outcomes, or depend on state the
//! workload does not control; they are compared as bounds, declared below with
//! the reason.

use crate::run::run_kernel;
use crate::table;
use anyhow::{Context, Result};
use clap::Args;
use hugelab_kernel::sysfs;
use hugelab_model::Model;
use hugelab_workload::{
    parse_file, run, Backend, BackendErrorKind, ExpectOutcome, Observation, Pos, Stmt, StmtKind,
};
use serde::Serialize;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args)]
pub struct DiffArgs {
    /// Print one JSON document for all workloads instead of tables.
    #[arg(long)]
    json: bool,
    /// Show every compared counter, zeros included.
    #[arg(long)]
    all: bool,
    /// Check the model's invariants after every statement (slower).
    #[arg(long)]
    check: bool,
    /// Workload files (.hlw).
    #[arg(required = true)]
    files: Vec<PathBuf>,
}

#[derive(Clone, Copy, Serialize)]
#[serde(rename_all = "snake_case")]
enum BoundKind {
    /// The kernel may count more than the model.
    KernelAtLeastModel,
    /// The kernel may count less than the model.
    KernelAtMostModel,
}

struct Bound {
    /// The counter's name, `*` standing for one dot-separated part.
    pattern: &'static str,
    kind: BoundKind,
    why: &'static str,
}

const BOUNDS: &[Bound] = &[
    Bound {
        pattern: "vmstat.thp_split_page_failed",
        kind: BoundKind::KernelAtLeastModel,
        why: "counts split attempts, and drop_caches retries the deferred-split shrinker a varying number of times",
    },
    Bound {
        pattern: "mthp.*.split_failed",
        kind: BoundKind::KernelAtLeastModel,
        why: "counts split attempts, and drop_caches retries the deferred-split shrinker a varying number of times",
    },
    Bound {
        pattern: "vmstat.thp_scan_exceed_none_pte",
        kind: BoundKind::KernelAtLeastModel,
        why: "khugepaged counts a range that fails its checks once per pass, and the kernel backend lets it make at least two full passes where the model makes one",
    },
    Bound {
        pattern: "vmstat.thp_scan_exceed_share_pte",
        kind: BoundKind::KernelAtLeastModel,
        why: "khugepaged counts a range that fails its checks once per pass, and the kernel backend lets it make at least two full passes where the model makes one",
    },
    Bound {
        pattern: "vmstat.thp_zero_page_alloc",
        kind: BoundKind::KernelAtMostModel,
        why: "the huge zero folio may already exist on the machine (it lives until a shrinker frees it), so the kernel allocates it at most as often as the model",
    },
];

fn bound_for(counter: &str) -> Option<&'static Bound> {
    BOUNDS.iter().find(|b| {
        let parts: Vec<&str> = counter.split('.').collect();
        let pat: Vec<&str> = b.pattern.split('.').collect();
        parts.len() == pat.len() && parts.iter().zip(&pat).all(|(c, p)| *p == "*" || c == p)
    })
}

#[derive(Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Verdict {
    Match,
    Mismatch,
    WithinBound,
    Unknown,
}

#[derive(Serialize)]
struct Row {
    snapshot: String,
    counter: String,
    model: i64,
    kernel: Option<i64>,
    verdict: Verdict,
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

#[derive(Serialize)]
struct FailedExpect {
    backend: String,
    #[serde(flatten)]
    outcome: ExpectOutcome,
}

#[derive(Serialize)]
struct WorkloadDiff {
    workload: String,
    rows: Vec<Row>,
    failed_expects: Vec<FailedExpect>,
}

#[derive(Default, Serialize)]
struct Totals {
    workloads: usize,
    compared: usize,
    mismatches: usize,
    within_bound: usize,
    unknown: usize,
    failed_expects: usize,
}

pub fn main(args: DiffArgs) -> Result<ExitCode> {
    let mut diffs = Vec::new();
    let mut totals = Totals::default();
    for file in &args.files {
        let workload = parse_file(file)?;
        let mut model = model_from_machine()?;
        if args.check {
            model = model.with_invariant_checks();
        }
        let model_obs = run(&mut model, &workload)?;
        let kernel_obs =
            run_kernel(&workload).with_context(|| format!("{}: kernel backend", workload.file))?;
        let d = compare(&model_obs, &kernel_obs);
        totals.workloads += 1;
        for r in &d.rows {
            totals.compared += 1;
            match r.verdict {
                Verdict::Mismatch => totals.mismatches += 1,
                Verdict::WithinBound => totals.within_bound += 1,
                Verdict::Unknown => totals.unknown += 1,
                Verdict::Match => {}
            }
        }
        totals.failed_expects += d.failed_expects.len();
        if !args.json {
            print!("{}", render(&d, args.all));
        }
        diffs.push(d);
    }
    if args.json {
        let doc = serde_json::json!({ "workloads": diffs, "totals": totals });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        println!(
            "{} workloads, {} counters compared: {} mismatches, {} within declared bounds, {} unknown on the kernel; {} failed expectations",
            totals.workloads,
            totals.compared,
            totals.mismatches,
            totals.within_bound,
            totals.unknown,
            totals.failed_expects
        );
    }
    Ok(if totals.mismatches > 0 || totals.failed_expects > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// A model whose tunables are this machine's current values. Tunables the
/// model does not model (sysctls, hugetlb pools) are left out.
fn model_from_machine() -> Result<Model> {
    let mut model = Model::default();
    for tunable in sysfs::known_tunables() {
        let text = sysfs::read_tunable(&tunable)?;
        let value = tunable
            .parse_value(&text)
            .map_err(|e| anyhow::anyhow!("{}: {e}", sysfs::tunable_file(&tunable).display()))?;
        let stmt = Stmt {
            pos: Pos::default(),
            kind: StmtKind::Set { tunable, value },
        };
        match model.execute(&stmt) {
            Ok(()) => {}
            Err(e) if e.kind == BackendErrorKind::Unsupported => {}
            Err(e) => anyhow::bail!(
                "the model cannot start from this machine's {stmt}: {}",
                e.message
            ),
        }
    }
    Ok(model)
}

fn compare(model: &Observation, kernel: &Observation) -> WorkloadDiff {
    let mut rows = Vec::new();
    for ms in &model.snapshots {
        let Some(ks) = kernel.snapshots.iter().find(|k| k.label == ms.label) else {
            continue;
        };
        for (name, &m) in &ms.counters {
            let (kernel, verdict, note) = match (ks.counters.get(name), ks.unknown.get(name)) {
                (Some(&k), _) if k == m => (Some(k), Verdict::Match, None),
                (Some(&k), _) => match bound_for(name) {
                    Some(b) if within(b.kind, m, k) => {
                        (Some(k), Verdict::WithinBound, Some(b.why.to_string()))
                    }
                    _ => (Some(k), Verdict::Mismatch, None),
                },
                (None, Some(why)) => (None, Verdict::Unknown, Some(why.clone())),
                (None, None) => continue,
            };
            rows.push(Row {
                snapshot: ms.label.clone(),
                counter: name.clone(),
                model: m,
                kernel,
                verdict,
                note,
            });
        }
    }
    let failed_expects = [model, kernel]
        .iter()
        .flat_map(|o| {
            o.failed_expects().map(|e| FailedExpect {
                backend: o.backend.clone(),
                outcome: e.clone(),
            })
        })
        .collect();
    WorkloadDiff {
        workload: model.workload.clone(),
        rows,
        failed_expects,
    }
}

fn within(kind: BoundKind, model: i64, kernel: i64) -> bool {
    match kind {
        BoundKind::KernelAtLeastModel => kernel >= model,
        BoundKind::KernelAtMostModel => kernel <= model,
    }
}

fn render(d: &WorkloadDiff, all: bool) -> String {
    let header: Vec<String> = ["snapshot", "counter", "model", "kernel", ""]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let rows: Vec<Vec<String>> = d
        .rows
        .iter()
        .filter(|r| all || r.verdict != Verdict::Match || r.model != 0)
        .map(|r| {
            vec![
                r.snapshot.clone(),
                r.counter.clone(),
                r.model.to_string(),
                r.kernel.map_or("unknown".to_string(), |k| k.to_string()),
                match r.verdict {
                    Verdict::Match => String::new(),
                    Verdict::Mismatch => "MISMATCH".to_string(),
                    Verdict::WithinBound => "within bound".to_string(),
                    Verdict::Unknown => "unknown".to_string(),
                },
            ]
        })
        .collect();
    let mismatches = d
        .rows
        .iter()
        .filter(|r| r.verdict == Verdict::Mismatch)
        .count();
    let mut out = format!("# {}\n{}", d.workload, table::render(&header, &rows));
    let mut notes: Vec<&String> = d.rows.iter().filter_map(|r| r.note.as_ref()).collect();
    notes.sort();
    notes.dedup();
    for n in notes {
        out.push_str(&format!("note: {n}\n"));
    }
    for f in &d.failed_expects {
        let e = &f.outcome;
        out.push_str(&format!(
            "{}:{}:{}: expect {} {} {} failed on the {}: actual {}\n",
            d.workload,
            e.line,
            e.col,
            e.counter,
            e.op,
            e.expected,
            f.backend,
            e.actual
                .map_or("not reported".to_string(), |a| a.to_string())
        ));
    }
    out.push_str(&format!(
        "{} counters compared, {mismatches} mismatches\n\n",
        d.rows.len()
    ));
    out
}
