//! `hugelab explain FILE.hlw[:LINE]`: why each fault of a statement got
//! the folio size it got, and what each collapse (`khugepaged`,
//! `MADV_COLLAPSE`) scanned and why each range collapsed or not. The
//! workload runs on the model with its tracepoints on
//! (hugelab_model::trace); each statement's faults are grouped by their
//! chain of decisions, its collapsed ranges by their outcome, each decision
//! named after the kernel function that takes it (`hugelab_compare::explain`,
//! shared with the Python package). A totals line comes first ("3376
//! faults: 48 got 64K, 3328 got 4K; 208 fell back"), then the table (or
//! `--json`).

use crate::table::plural;
use anyhow::{bail, Result};
use clap::Args;
pub(crate) use hugelab_compare::explain::{explain, Explained, Explaining};
use hugelab_compare::explain::{CollapseGroup, Totals};
use hugelab_model::trace::CollapseStep;
use hugelab_workload::stream_file;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args)]
pub struct ExplainArgs {
    /// The workload, with the line of one statement (`FILE.hlw:12`) or
    /// without (every statement that faults).
    target: String,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
}

/// "3376 faults: 48 got 64K, 3328 got 4K; 208 fell back", and "3 PMD
/// ranges scanned: 2 collapsed into 2M THPs, 1 SCAN_EXCEED_NONE_PTE".
fn lines(t: &Totals, faults: u64) -> Vec<String> {
    let mut out = Vec::new();
    if faults > 0 {
        let got: Vec<String> = t.got.iter().map(|((_, w), n)| format!("{n} {w}")).collect();
        let mut s = format!("{}: {}", plural(faults, "fault", "faults"), got.join(", "));
        if t.fell_back > 0 {
            s.push_str(&format!("; {} fell back", t.fell_back));
        }
        out.push(s);
    }
    if t.ranges > 0 {
        let mut parts = vec![format!("{} collapsed into 2M THPs", t.collapsed)];
        parts.extend(t.not_collapsed.iter().map(|(r, n)| format!("{n} {r}")));
        out.push(format!(
            "{} scanned: {}",
            plural(t.ranges, "PMD range", "PMD ranges"),
            parts.join(", ")
        ));
    }
    out
}

/// `FILE:LINE` split, when FILE exists and LINE is a number.
fn target(arg: &str) -> Result<(PathBuf, Option<u32>)> {
    if let Some((file, line)) = arg.rsplit_once(':') {
        if let Ok(line) = line.parse::<u32>() {
            if std::path::Path::new(file).exists() {
                return Ok((file.into(), Some(line)));
            }
        }
    }
    if !std::path::Path::new(arg).exists() {
        bail!("{arg}: no such workload file");
    }
    Ok((arg.into(), None))
}

/// The table people read.
pub fn render(file: &str, explained: &[Explained]) -> String {
    let mut s = String::new();
    if explained.is_empty() {
        s.push_str(&format!("{file}: no statement faults\n"));
    }
    let mut all = Totals::default();
    let mut faults = 0;
    for e in explained {
        s.push_str(&format!("{file}:{}  {}\n", e.line, e.statement));
        all.add(&e.totals);
        faults += e.faults;
        for line in lines(&e.totals, e.faults) {
            s.push_str(&format!("  {line}\n"));
        }
        if !e.collapses.is_empty() {
            s.push_str(&render_collapses(&e.collapses));
        }
        if e.groups.is_empty() {
            if e.collapses.is_empty() {
                s.push_str("  no faults: every access found its page mapped\n");
            }
            s.push('\n');
            continue;
        }
        s.push_str(&format!("  {:>7}  {:<24}  decisions\n", "faults", "at"));
        for g in &e.groups {
            let at = if g.first == g.last {
                g.first.clone()
            } else {
                format!("{} .. {}", g.first, g.last)
            };
            let kind = if g.write { "write" } else { "read" };
            for (i, step) in g.chain.iter().enumerate() {
                if i == 0 {
                    s.push_str(&format!("  {:>7}  {:<24}  {kind}: {step}\n", g.faults, at));
                } else {
                    s.push_str(&format!("  {:>7}  {:<24}  {step}\n", "", ""));
                }
            }
        }
        s.push('\n');
    }
    if explained.len() > 1 {
        let lines = lines(&all, faults);
        if !lines.is_empty() {
            s.push_str(&format!(
                "total over {} statements: {}\n",
                explained.len(),
                lines.join("; ")
            ));
        }
    }
    s
}

/// The collapse table: ranges (or a whole VMA, or the call's return) and
/// what decided.
fn render_collapses(groups: &[CollapseGroup]) -> String {
    let mut s = format!("  {:>7}  {:<28}  collapse\n", "ranges", "at");
    for g in groups {
        let (n, at) = if g.ranges == 0 {
            (String::new(), String::new())
        } else if g.first == g.last {
            (g.ranges.to_string(), g.first.clone())
        } else {
            (g.ranges.to_string(), format!("{} .. {}", g.first, g.last))
        };
        let by = match &g.step {
            CollapseStep::Range { by, .. } => format!("{}: ", by.name()),
            _ => String::new(),
        };
        for (i, step) in g.chain.iter().enumerate() {
            if i == 0 {
                s.push_str(&format!("  {n:>7}  {at:<28}  {by}{step}\n"));
            } else {
                s.push_str(&format!("  {:>7}  {:<28}  {step}\n", "", ""));
            }
        }
    }
    s
}

pub fn main(args: ExplainArgs) -> Result<ExitCode> {
    let (file, line) = target(&args.target)?;
    let name = file.display().to_string();
    let run = explain(&name, stream_file(&file)?, line)?;
    if let Some(err) = run.stopped {
        // What ran is explained; the reason the run stopped follows it.
        eprintln!("{name}: the run stopped: {err}");
    }
    let explained = run.explained;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&explained)?);
    } else {
        print!("{}", render(&file.display().to_string(), &explained));
    }
    Ok(ExitCode::SUCCESS)
}
