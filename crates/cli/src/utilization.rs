//! `hugelab utilization`: how full the large folios are at a point of a
//! workload, why they exist, and what the deferred split shrinker would give
//! back at the next `reclaim` (the report of `hugelab_workload::utilization`).
//!
//! The workload runs, as a stream, up to its `snapshot NAME` statement
//! (default: its end) on a backend ([`run_until`]), which is then scanned for
//! its large folios: the model's folios (`hugelab_compare::utilization`,
//! shared with the Python package), or the kernel backend's agent
//! processes, scanned live at the same point.

use crate::kernel_limit::KernelLimitArgs;
use crate::utilization_view;
use anyhow::{bail, Context, Result};
use clap::Args;
use hugelab_compare::utilization::{describe_snapshot, report, reports_json, Reports, Scan};
use hugelab_kernel::scan::{self, ScanOptions};
use hugelab_kernel::KernelBackend;
use hugelab_model::thp_utilization::Scope;
use hugelab_workload::utilization::{UtilizationReport, DEFAULT_BUCKETS, MAX_PTES_NONE_OFF};
use hugelab_workload::{open, stream_file, Backend, Lookahead, Observation};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Args)]
pub struct UtilizationArgs {
    /// The workload file (.hlw, .hlw.gz, .hlw.zst), read as a stream up to
    /// the snapshot.
    file: PathBuf,
    /// Stop at this `snapshot` statement (default: the end of the workload).
    #[arg(long)]
    snapshot: Option<String>,
    /// Only this process (default: every process, each on its own, then
    /// their total).
    #[arg(long)]
    proc: Option<String>,
    /// Only this region of the process given with --proc.
    #[arg(long, requires = "proc")]
    region: Option<String>,
    /// Also show the never-written memory by cause and folio size (always in --json).
    #[arg(long)]
    why: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Also draw the histograms into this SVG file.
    #[arg(long)]
    svg: Option<PathBuf>,
    /// Buckets per folio size (the seed's 10 by default).
    #[arg(long, default_value_t = DEFAULT_BUCKETS as u16, value_parser = clap::value_parser!(u16).range(1..=512))]
    buckets: u16,
    /// Where to run the workload: the model, this machine's kernel (root;
    /// its processes are scanned live at the snapshot), or both side by side.
    #[arg(long, value_enum, default_value_t = Where::Model)]
    backend: Where,
    /// Predict at this khugepaged/max_ptes_none instead of the workload's.
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=i64::from(MAX_PTES_NONE_OFF)))]
    max_ptes_none: Option<u32>,
    #[command(flatten)]
    limits: KernelLimitArgs,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Where {
    Model,
    Kernel,
    Both,
}

/// Runs the workload file at `path` on `backend` as a stream, up to its
/// `snapshot` statement labelled `snapshot` (`hugelab_compare::utilization::run_until`).
pub fn run_until(
    backend: &mut dyn Backend,
    path: &Path,
    snapshot: Option<&str>,
) -> Result<Observation> {
    let stmts = stream_file(path)?;
    let file = stmts.file().to_string();
    let ahead = if backend.needs_lookahead() {
        Lookahead::scan(&file, open(path)?)?
    } else {
        Lookahead::default()
    };
    hugelab_compare::utilization::run_until(backend, &file, stmts, &ahead, snapshot)
}

/// Failed `expect` lines before the snapshot, as warnings (the report is
/// printed all the same).
fn warn_failed_expects(obs: &Observation) {
    for e in obs.failed_expects() {
        eprintln!("hugelab: warning: {}", e.failure(&obs.workload));
    }
}

/// The model's scan (`hugelab_compare::utilization::scan_model`) of the
/// workload at `path`, its failed `expect` lines said as warnings.
fn scan_model(path: &Path, snapshot: Option<&str>, scope: Scope<'_>) -> Result<Scan> {
    let stmts = stream_file(path)?;
    let file = stmts.file().to_string();
    let (scan, obs) = hugelab_compare::utilization::scan_model(&file, stmts, snapshot, scope)?;
    warn_failed_expects(&obs);
    Ok(scan)
}

/// The kernel's scan: runs the workload at `path` up to `snapshot` on this
/// machine's kernel, then scans the workload's live processes (those of
/// `scope`) with `hugelab scan`'s reader before the backend ends them and
/// restores the tunables.
fn scan_kernel(
    path: &Path,
    snapshot: Option<&str>,
    scope: Scope<'_>,
    limits: &KernelLimitArgs,
) -> Result<Scan> {
    let plan = crate::kernel_limit::plan(path, limits)?;
    let exe = std::env::current_exe().context("cannot find the hugelab binary for the agents")?;
    let mut kernel = KernelBackend::with_memory_limit(exe, plan.limit)?;
    let obs = run_until(&mut kernel, path, snapshot)?;
    warn_failed_expects(&obs);
    let at = || format!("{} at {}", obs.workload, describe_snapshot(snapshot));
    let mut targets = Vec::new();
    for hugelab_kernel::backend::LiveProcess { name, pid, regions } in kernel.processes() {
        let range = match scope {
            Scope::All => None,
            Scope::Process(p) if p == name => None,
            Scope::Region { proc, region } if proc == name => match regions.get(region) {
                Some(&(start, len)) => Some((start, start + len)),
                None => bail!("{}: process '{proc}' has no region '{region}'", at()),
            },
            _ => continue,
        };
        targets.push((name.clone(), pid, range));
    }
    if let (true, Scope::Process(p) | Scope::Region { proc: p, .. }) = (targets.is_empty(), scope) {
        bail!(
            "{}: no process '{p}' at this point of the workload (never spawned, or exited)",
            at()
        );
    }
    targets.sort_by(|a, b| a.0.cmp(&b.0));
    let mut processes = Vec::new();
    for (name, pid, range) in targets {
        let opts = ScanOptions {
            content: true,
            cont_orders: Vec::new(),
            range,
            threads: 0,
            pace: None,
        };
        let s = scan::scan_process(pid, &opts).map_err(|e| anyhow::anyhow!("{}: {e}", at()))?;
        if s.unclassified_kb() > 0 {
            eprintln!(
                "hugelab: warning: {} kB of process {pid} could not be classified (kpageflags reads 0 there): its large folios are missing from the report",
                s.unclassified_kb()
            );
        }
        processes.push((name, s.folios));
    }
    let settings = scan::shrinker_settings()?;
    kernel.finish()?;
    Ok(Scan {
        processes,
        settings,
    })
}

pub fn main(args: UtilizationArgs) -> Result<ExitCode> {
    let scope = match (&args.proc, &args.region) {
        (Some(proc), Some(region)) => Scope::Region { proc, region },
        (Some(proc), None) => Scope::Process(proc),
        _ => Scope::All,
    };
    // Every process on its own only when the scope is every process.
    let each = matches!(scope, Scope::All);
    let snapshot = args.snapshot.as_deref();
    let mut reports: Vec<(&str, Reports)> = Vec::new();
    let buckets = usize::from(args.buckets);
    if args.limits.dry_run {
        if args.backend == Where::Model {
            bail!("--dry-run shows what a kernel run would make; it works with --backend kernel or both only");
        }
        crate::kernel_limit::print_dry_run([&args.file], &args.limits)?;
        return Ok(ExitCode::SUCCESS);
    }
    if args.backend != Where::Kernel {
        let r = report(args.max_ptes_none, buckets, each, || {
            scan_model(&args.file, snapshot, scope)
        })?;
        reports.push(("model", r));
    }
    if args.backend != Where::Model {
        let r = report(args.max_ptes_none, buckets, each, || {
            scan_kernel(&args.file, snapshot, scope, &args.limits)
        })?;
        reports.push(("kernel", r));
    }
    let at = format!(
        "{} at {}, {}",
        args.file.display(),
        describe_snapshot(snapshot),
        describe_scope(scope)
    );
    if let Some(svg) = &args.svg {
        let refs: Vec<(&str, &UtilizationReport)> =
            reports.iter().map(|(n, r)| (*n, &r.total)).collect();
        utilization_view::write_svg(&at, &refs, svg)?;
    }
    if args.json {
        // One backend's reports as reports_json makes them; both backends:
        // keyed by backend.
        let doc = |r: &Reports| reports_json(r, each);
        let out = if let [(_, r)] = reports.as_slice() {
            doc(r)?
        } else {
            let mut both = serde_json::Map::new();
            for (n, r) in &reports {
                both.insert(n.to_string(), doc(r)?);
            }
            both.into()
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(ExitCode::SUCCESS);
    }
    let show = |r: &UtilizationReport, name: &str, title: &str| {
        let mut shown = r.clone();
        if !args.why {
            shown.bloat.clear();
        } else if shown.bloat.is_empty() && name == "kernel" {
            println!("(kernel: a live scan cannot tell why a folio exists; only the model attributes never-written memory)");
        }
        print!("{}", utilization_view::render_table(&shown, title));
    };
    let file_at = format!("{} at {}", args.file.display(), describe_snapshot(snapshot));
    for (i, (name, r)) in reports.iter().enumerate() {
        if i > 0 {
            println!();
        }
        if each && r.processes.len() > 1 {
            // Each process on its own, then their total. One process: its
            // report is the total, printed once (the JSON has it twice).
            for (proc, p) in &r.processes {
                show(p, name, &format!("{file_at} ({name}), process {proc}"));
                println!();
            }
            let names: Vec<&str> = r.processes.iter().map(|(n, _)| n.as_str()).collect();
            let title = format!(
                "{file_at} ({name}), total of the {} processes ({})",
                names.len(),
                names.join(", ")
            );
            show(&r.total, name, &title);
        } else {
            let only = match r.processes.as_slice() {
                [(proc, _)] => format!(" (only process {proc})"),
                _ => String::new(),
            };
            show(
                &r.total,
                name,
                &format!("{file_at} ({name}), {}{only}", describe_scope(scope)),
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn describe_scope(scope: Scope<'_>) -> String {
    match scope {
        Scope::All => "every process".to_string(),
        Scope::Process(p) => format!("process {p}"),
        Scope::Region { proc, region } => format!("region {proc}.{region}"),
    }
}
