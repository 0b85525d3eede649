//! `hugelab utilization`: how full the large folios are at a point of a
//! workload, why they exist, and what the under-used THP shrinker would give
//! back at the next `reclaim` (the report of `hugelab_workload::utilization`).
//!
//! The workload runs up to its `snapshot NAME` statement (default: its end)
//! on a backend, which is then scanned for its large folios. The scan is a
//! closure ([`report_at_snapshot`]), so the kernel backend can scan its agent
//! processes at the same point; only the model is wired here.

use crate::table;
use anyhow::{bail, Context, Result};
use clap::Args;
use hugelab_model::thp_utilization::Scope;
use hugelab_model::Model;
use hugelab_workload::utilization::{
    utilization_report, FolioUse, ShrinkerSettings, UtilizationReport, DEFAULT_BUCKETS,
    MAX_PTES_NONE_OFF,
};
use hugelab_workload::{parse_file, run, Observation, StmtKind, Workload};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Args)]
pub struct UtilizationArgs {
    /// The workload file (.hlw).
    file: PathBuf,
    /// Stop at this `snapshot` statement (default: the end of the workload).
    #[arg(long)]
    snapshot: Option<String>,
    /// Only this process (default: every process, each on its own).
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
    /// Predict at this khugepaged/max_ptes_none instead of the workload's.
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=i64::from(MAX_PTES_NONE_OFF)))]
    max_ptes_none: Option<u32>,
}

/// What a backend's scan at the snapshot found.
pub struct Scan {
    pub folios: Vec<FolioUse>,
    /// The shrinker settings in force at the snapshot.
    pub settings: ShrinkerSettings,
}

/// The workload's statements before the `snapshot` labelled `snapshot`
/// (`None` or `end`: all of them).
pub fn until_snapshot(workload: &Workload, snapshot: Option<&str>) -> Result<Workload> {
    let label = match snapshot {
        None | Some("end") => return Ok(workload.clone()),
        Some(label) => label,
    };
    let labels: Vec<&str> = workload
        .stmts
        .iter()
        .filter_map(|s| match &s.kind {
            StmtKind::Snapshot { label } => Some(label.as_str()),
            _ => None,
        })
        .collect();
    let at = workload
        .stmts
        .iter()
        .position(|s| matches!(&s.kind, StmtKind::Snapshot { label: l } if l == label));
    let Some(at) = at else {
        let known = if labels.is_empty() {
            "it has none but the implicit 'end'".to_string()
        } else {
            let quoted: Vec<String> = labels.iter().map(|l| format!("'{l}'")).collect();
            format!("its snapshots are {} and 'end'", quoted.join(", "))
        };
        bail!("{} has no snapshot named '{label}': {known}", workload.file);
    };
    Ok(Workload {
        file: workload.file.clone(),
        stmts: workload.stmts[..at].to_vec(),
    })
}

/// Runs `workload` up to `snapshot` through `scan` (which runs the part it is
/// given on its backend and scans the backend then) and builds the report,
/// at the scanned settings unless `max_ptes_none` overrides them.
pub fn report_at_snapshot(
    workload: &Workload,
    snapshot: Option<&str>,
    max_ptes_none: Option<u32>,
    buckets: usize,
    scan: impl FnOnce(&Workload) -> Result<Scan>,
) -> Result<UtilizationReport> {
    let part = until_snapshot(workload, snapshot)?;
    let Scan {
        folios,
        mut settings,
    } = scan(&part)?;
    if let Some(n) = max_ptes_none {
        settings.max_ptes_none = n;
    }
    Ok(utilization_report(&folios, settings, buckets))
}

/// Failed `expect` lines before the snapshot, as warnings (the report is
/// printed all the same).
fn warn_failed_expects(obs: &Observation) {
    for e in obs.failed_expects() {
        let actual = e
            .actual
            .map_or("not reported by this backend".to_string(), |a| e.show(a));
        eprintln!(
            "hugelab: warning: {}:{}:{}: expect {} {} {} failed: actual {actual}",
            obs.workload,
            e.line,
            e.col,
            e.counter,
            e.op,
            e.show(e.expected)
        );
    }
}

/// "snapshot 'NAME'" or "the end", for messages.
fn describe_snapshot(snapshot: Option<&str>) -> String {
    snapshot.map_or("the end".to_string(), |s| format!("snapshot '{s}'"))
}

/// The model's scan: runs `part` (the workload up to `snapshot`) on a fresh
/// model, then lists the folios of `scope`.
fn scan_model(part: &Workload, snapshot: Option<&str>, scope: Scope<'_>) -> Result<Scan> {
    let mut model = Model::default();
    let obs = run(&mut model, part)?;
    warn_failed_expects(&obs);
    let folios = model
        .folio_uses(scope)
        .with_context(|| format!("{} at {}", part.file, describe_snapshot(snapshot)))?;
    Ok(Scan {
        folios,
        settings: model.shrinker_settings(),
    })
}

pub fn main(args: UtilizationArgs) -> Result<ExitCode> {
    let workload = parse_file(&args.file)?;
    let scope = match (&args.proc, &args.region) {
        (Some(proc), Some(region)) => Scope::Region { proc, region },
        (Some(proc), None) => Scope::Process(proc),
        _ => Scope::All,
    };
    let snapshot = args.snapshot.as_deref();
    let report = report_at_snapshot(
        &workload,
        snapshot,
        args.max_ptes_none,
        usize::from(args.buckets),
        |part| scan_model(part, snapshot, scope),
    )?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let title = format!(
            "{} at {} (model), {}",
            workload.file,
            describe_snapshot(snapshot),
            describe_scope(scope)
        );
        print!("{}", render_table_minimal(&report, &title));
        if args.why {
            print!("{}", render_why(&report));
        }
    }
    if let Some(svg) = &args.svg {
        write_svg_pending(&[("model", &report)], svg)?;
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

/// TODO(utilization_view): replace with `utilization_view::write_svg` when
/// crates/cli/src/utilization_view.rs is merged.
fn write_svg_pending(_reports: &[(&str, &UtilizationReport)], path: &Path) -> Result<()> {
    bail!(
        "cannot write {}: --svg is not available in this build yet (utilization_view is not merged)",
        path.display()
    )
}

/// TODO(utilization_view): replace with `utilization_view::render_table`
/// when crates/cli/src/utilization_view.rs is merged. A histogram per folio
/// size, then the shrinker's predicted give-back.
fn render_table_minimal(r: &UtilizationReport, title: &str) -> String {
    let mut out = format!("# {title}\n");
    if r.sizes.is_empty() {
        out.push_str("no large folios\n");
    }
    for s in &r.sizes {
        let full = s.folios() - s.partial_folios;
        out.push_str(&format!(
            "\n{}kB folios: {} fully mapped ({} by a PMD), {} partially mapped\n",
            s.size_kb, full, s.pmd_mapped, s.partial_folios
        ));
        let header = ["pages in use", "folios", "zero-filled pages"].map(String::from);
        let rows: Vec<Vec<String>> = s
            .buckets
            .iter()
            .map(|b| {
                vec![
                    format!("{}-{}", b.lo, b.hi),
                    b.folios.to_string(),
                    b.zero_pages.to_string(),
                ]
            })
            .collect();
        out.push_str(&table::render(&header, &rows));
        if s.partial_folios > 0 {
            out.push_str(&format!(
                "partially mapped: {} folios, {} pages mapped, {} of them zero-filled\n",
                s.partial_folios, s.partial_mapped_pages, s.partial_zero_pages
            ));
        }
    }
    let g = &r.give_back;
    out.push_str(&format!(
        "\nat the next reclaim (max_ptes_none {}, shrink_underused {}): {} under-used THPs split ({} kB zero-filled), {} partially mapped folios split ({} kB zero-filled): Rss -{} kB\n",
        r.settings.max_ptes_none,
        u8::from(r.settings.shrink_underused),
        g.underused_folios,
        g.underused_kb,
        g.partial_folios,
        g.partial_kb,
        g.rss_kb()
    ));
    out.push_str(
        "(assumes every candidate is still on the deferred split queue and nothing is pinned)\n",
    );
    out
}

/// The bloat section: never-written memory by cause and folio size.
fn render_why(r: &UtilizationReport) -> String {
    let header = ["cause", "folio size", "folios", "never written kB"].map(String::from);
    let mut rows: Vec<Vec<String>> = r
        .bloat
        .iter()
        .map(|b| {
            vec![
                b.cause.name().to_string(),
                format!("{}kB", b.size_kb),
                b.folios.to_string(),
                b.never_written_kb.to_string(),
            ]
        })
        .collect();
    rows.push(vec![
        "total".to_string(),
        String::new(),
        r.bloat.iter().map(|b| b.folios).sum::<u64>().to_string(),
        r.bloat
            .iter()
            .map(|b| b.never_written_kb)
            .sum::<u64>()
            .to_string(),
    ]);
    format!(
        "\nnever-written memory in large folios, by why the folio exists:\n{}",
        table::render(&header, &rows)
    )
}
