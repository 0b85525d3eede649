//! `hugelab scan`: the huge pages of running processes — thpmaps's shape
//! figures per VMA (or rolled up), the utilization of every large folio and
//! what the under-used THP shrinker would give back. Live tool: uses only
//! the kernel crate's readers.

use crate::table;
use anyhow::{bail, Result};
use clap::Args;
use hugelab_kernel::scan::{self, shape::Shape, ProcessScan, ScanOptions};
use hugelab_workload::units::{PAGE_SHIFT, PAGE_SIZE, PMD_SHIFT};
use hugelab_workload::utilization::{
    utilization_report, FolioUse, UtilizationReport, DEFAULT_BUCKETS,
};
use hugelab_workload::Size;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args)]
pub struct ScanArgs {
    /// Process to scan (repeatable).
    #[arg(long = "pid", value_name = "PID")]
    pids: Vec<i32>,
    /// Scan every process of this cgroup directory and its descendants.
    #[arg(long, value_name = "PATH")]
    cgroup: Option<PathBuf>,
    /// Scan every process of the machine.
    #[arg(long)]
    all: bool,
    /// One summary over everything scanned instead of one per process.
    #[arg(long)]
    rollup: bool,
    /// Show only the N processes that waste most (default with --all: 10;
    /// else every one; in --json only when given).
    #[arg(long, value_name = "N")]
    top: Option<usize>,
    /// Print every VMA's figures (default: the 10 VMAs of each process with
    /// the most THP memory).
    #[arg(long)]
    vmas: bool,
    /// Print every figure as JSON.
    #[arg(long)]
    json: bool,
    /// Also count aligned contiguous blocks of this size (thpmaps --cont), e.g. 64K.
    #[arg(long = "cont", value_name = "SIZE")]
    cont: Vec<Size>,
    /// Buckets of the utilization histogram.
    #[arg(long, default_value_t = DEFAULT_BUCKETS)]
    buckets: usize,
    /// Predict the under-used shrinker at this max_ptes_none instead of the machine's.
    #[arg(long, value_name = "N")]
    max_ptes_none: Option<u32>,
    /// Only the shape (thpmaps's figures): skip reading page contents.
    #[arg(long)]
    shape_only: bool,
    /// Draw the utilization histogram into this SVG file (needs page
    /// contents: not with --shape-only).
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
}

pub fn main(args: ScanArgs) -> Result<ExitCode> {
    let sources = usize::from(!args.pids.is_empty())
        + usize::from(args.cgroup.is_some())
        + usize::from(args.all);
    if sources != 1 {
        bail!("say what to scan: --pid P (repeatable), --cgroup PATH or --all (exactly one)");
    }
    if args.buckets == 0 {
        bail!("--buckets must be at least 1");
    }
    if args.shape_only && args.svg.is_some() {
        bail!("--svg draws the utilization histogram, which needs the page contents that --shape-only does not read: drop one of the two");
    }
    if args.top == Some(0) {
        bail!("--top must be at least 1");
    }
    let mut cont_orders = Vec::new();
    for s in &args.cont {
        let pages = s.0 >> PAGE_SHIFT;
        if s.0 == 0
            || s.0 & ((1 << PAGE_SHIFT) - 1) != 0
            || !pages.is_power_of_two()
            || s.0 > 1 << PMD_SHIFT
        {
            bail!("--cont {s}: the size must be a power-of-two number of pages, at most the PMD size (2M)");
        }
        cont_orders.push(pages.trailing_zeros());
    }
    hugelab_kernel::guard::require_root(
        "hugelab scan needs root: page frame numbers in /proc/PID/pagemap, /proc/kpageflags and other processes' /proc/PID/mem are root-only",
    )?;
    if let Some(n) = args.max_ptes_none.filter(|&n| n > 511) {
        bail!("--max-ptes-none {n}: the kernel accepts 0 to 511");
    }
    let mut settings = scan::shrinker_settings()?;
    settings.max_ptes_none = args.max_ptes_none.unwrap_or(settings.max_ptes_none);
    let strict = !args.pids.is_empty();
    let pids = if strict {
        // A pid given twice is one process: scanning it twice would count
        // its memory twice.
        let mut pids = Vec::with_capacity(args.pids.len());
        for &p in &args.pids {
            if pids.contains(&p) {
                eprintln!("hugelab: note: --pid {p} was given more than once; it is scanned once");
            } else {
                pids.push(p);
            }
        }
        pids
    } else if let Some(cg) = &args.cgroup {
        scan::cgroup_pids(cg)?
    } else {
        let me = std::process::id() as i32;
        scan::all_pids()?.into_iter().filter(|&p| p != me).collect()
    };
    let opts = ScanOptions {
        content: !args.shape_only,
        cont_orders: cont_orders.clone(),
        range: None,
    };
    let mut scans = Vec::new();
    let (mut gone, mut denied) = (0, 0);
    for pid in pids {
        match scan::scan_process(pid, &opts) {
            Ok(s) if !strict && s.vmas.is_empty() => {}
            Ok(s) => scans.push(s),
            Err(e) if !strict && scan::is_gone(&e) => gone += 1,
            Err(e) if !strict && scan::is_denied(&e) => denied += 1,
            Err(e) if scan::is_gone(&e) => {
                bail!("process {pid} does not exist or exited during the scan ({e})")
            }
            Err(e) => bail!("scanning process {pid}: {e}"),
        }
    }
    let report_of = |folios: &mut dyn Iterator<Item = &FolioUse>| {
        utilization_report(folios, settings, args.buckets)
    };
    let rollup_report = report_of(&mut scans.iter().flat_map(|s| s.folios.iter()));
    let what = match (&args.cgroup, args.all) {
        (Some(cg), _) => format!("cgroup {}", cg.display()),
        (None, true) => "all processes".to_string(),
        _ => scans
            .iter()
            .map(|s| format!("{} ({})", s.pid, s.comm))
            .collect::<Vec<_>>()
            .join(", "),
    };
    if let Some(path) = &args.svg {
        let title = match (scans.len(), strict) {
            (1, true) => format!("scan of process {what}"),
            (_, true) => format!("scan of processes {what}"),
            (n, false) => format!("scan of {what}, {n} process(es)"),
        };
        crate::utilization_view::write_svg(&title, &[("scan", &rollup_report)], path)?;
    }
    // Without contents there is no utilization: no report, no histogram.
    let reports: Vec<Option<UtilizationReport>> = scans
        .iter()
        .map(|s| (!args.shape_only).then(|| report_of(&mut s.folios.iter())))
        .collect();
    // The processes ranked by waste, the largest first.
    let mut order: Vec<usize> = (0..scans.len()).collect();
    order.sort_by_key(|&i| {
        (
            std::cmp::Reverse(waste(reports[i].as_ref(), &scans[i], &cont_orders)),
            scans[i].pid,
        )
    });
    let top = args.top.or((args.all && !args.json).then_some(DEFAULT_TOP));
    let shown = top.unwrap_or(usize::MAX).min(order.len());
    let left_out = order.len() - shown;
    order.truncate(shown);
    if args.json {
        // Every process unless --top is given.
        let left_out = if args.top.is_some() { left_out } else { 0 };
        let procs: Vec<Value> = order
            .iter()
            .map(|&i| {
                let s = &scans[i];
                let mut p = json!({
                    "pid": s.pid,
                    "comm": s.comm,
                    "shape": shape_json(&s.shape(&cont_orders)),
                    "unclassified_kb": s.unclassified_kb(),
                    "zero_page_kb": s.zero_page_kb(),
                    "folio_pages": s.folio_pages,
                });
                if !args.rollup {
                    p["vmas"] = s
                        .vmas
                        .iter()
                        .map(|v| {
                            let mut j = serde_json::to_value(&v.vma).unwrap_or(Value::Null);
                            j["shape"] = shape_json(&v.shape);
                            j["unclassified_kb"] = v.unclassified_kb.into();
                            j["zero_page_kb"] = v.zero_page_kb.into();
                            j
                        })
                        .collect();
                    if let Some(r) = &reports[i] {
                        p["utilization"] = serde_json::to_value(r).unwrap_or(Value::Null);
                    }
                }
                p
            })
            .collect();
        let mut out = json!({
            "content_read": !args.shape_only,
            "processes": procs,
            "processes_left_out": left_out,
            "exited_during_scan": gone,
            "not_readable": denied,
        });
        if args.rollup {
            let shape = rollup_shape(&scans, &cont_orders);
            out["rollup"] = json!({
                "shape": shape_json(&shape),
                "unclassified_kb": scans.iter().map(ProcessScan::unclassified_kb).sum::<u64>(),
                "zero_page_kb": scans.iter().map(ProcessScan::zero_page_kb).sum::<u64>(),
            });
            if !args.shape_only {
                out["rollup"]["utilization"] = serde_json::to_value(&rollup_report)?;
            }
        }
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(ExitCode::SUCCESS);
    }
    if args.rollup {
        // The conclusion first: the shrinker's verdict and the histogram,
        // then thpmaps's figures.
        let shape = rollup_shape(&scans, &cont_orders);
        println!("rollup of {} process(es): {what}\n", scans.len());
        if !args.shape_only {
            print!(
                "{}",
                crate::utilization_view::render_table(&rollup_report, &format!("rollup of {what}"))
            );
            println!();
        }
        print!("{}", shape_table(&shape));
        unclassified_note(scans.iter().map(ProcessScan::unclassified_kb).sum());
    } else {
        if scans.len() > 1 {
            print!(
                "{}",
                ranking(&scans, &reports, &order, &cont_orders, args.shape_only)
            );
            if left_out > 0 {
                println!(
                    "{left_out} more process(es) waste less and are left out (--top N shows N)."
                );
            }
            println!();
        }
        for &i in &order {
            let s = &scans[i];
            if args.shape_only {
                println!("process {} ({})\n", s.pid, s.comm);
            }
            // What the shrinker would do and the histogram, then the
            // process's figures, then its VMAs'.
            if let Some(r) = &reports[i] {
                print!(
                    "{}",
                    crate::utilization_view::render_table(
                        r,
                        &format!("process {} ({})", s.pid, s.comm)
                    )
                );
                println!();
            }
            print!("{}", shape_table(&s.shape(&cont_orders)));
            unclassified_note(s.unclassified_kb());
            print!("{}", vma_rows(s, args.vmas));
            println!();
        }
    }
    if gone > 0 {
        println!("{gone} process(es) exited during the scan and are not counted.");
    }
    if denied > 0 {
        println!("{denied} process(es) refused to be read (EACCES/EPERM, e.g. another namespace's init) and are not counted.");
    }
    Ok(ExitCode::SUCCESS)
}

/// VMAs of a process printed without --vmas.
const DEFAULT_VMAS: usize = 10;
/// Processes printed by --all without --top.
const DEFAULT_TOP: usize = 10;

/// What a process wastes, for ranking: what the shrinker would give back,
/// then the zero-filled memory of its large folios, then its THP memory
/// (all there is without contents), in kB.
fn waste(report: Option<&UtilizationReport>, s: &ProcessScan, cont_orders: &[u32]) -> [u64; 3] {
    let thp = thp_kb(&s.shape(cont_orders));
    match report {
        Some(r) => [r.give_back.freed_kb(), zero_filled_kb(r), thp],
        None => [0, 0, thp],
    }
}

fn zero_filled_kb(r: &UtilizationReport) -> u64 {
    r.sizes.iter().map(|z| z.zero_pages()).sum::<u64>() * (PAGE_SIZE / 1024)
}

/// Memory in large folios (PMD- or PTE-mapped), anon and file: thpmaps's
/// thp figures without the --cont ones, which count the same memory again.
fn thp_kb(s: &Shape) -> u64 {
    [&s.anon, &s.file]
        .iter()
        .map(|t| {
            let pages: u64 = t.aligned.iter().chain(&t.unaligned).sum::<u64>() + t.partial;
            t.pmd_kb + pages * (PAGE_SIZE / 1024)
        })
        .sum()
}

/// The processes shown, largest waste first, one row each.
fn ranking(
    scans: &[ProcessScan],
    reports: &[Option<UtilizationReport>],
    order: &[usize],
    cont_orders: &[u32],
    shape_only: bool,
) -> String {
    let mut header = vec!["pid".to_string(), "comm".to_string()];
    let intro = if shape_only {
        "ranked by THP memory (--shape-only reads no contents, so no waste)"
    } else {
        header.push("shrinker gives back (kB)".into());
        header.push("zero-filled in large folios (kB)".into());
        "ranked by what the under-used THP shrinker would give back, then by zero-filled memory in large folios"
    };
    header.push("THP memory (kB)".into());
    let rows: Vec<Vec<String>> = order
        .iter()
        .map(|&i| {
            let s = &scans[i];
            let mut row = vec![s.pid.to_string(), s.comm.clone()];
            if let Some(r) = &reports[i] {
                row.push(r.give_back.freed_kb().to_string());
                row.push(zero_filled_kb(r).to_string());
            }
            row.push(thp_kb(&s.shape(cont_orders)).to_string());
            row
        })
        .collect();
    format!(
        "{} process(es) scanned, {intro}:\n{}",
        scans.len(),
        table::render_aligned(&header, &rows, 2)
    )
}

/// The figures of a process's VMAs: every one with --vmas, else the
/// DEFAULT_VMAS with the most THP memory (in address order) and a line on
/// how many more there are.
fn vma_rows(s: &ProcessScan, all: bool) -> String {
    let with_thp: Vec<_> = s
        .vmas
        .iter()
        .filter(|v| thp_kb(&v.shape) > 0 || v.unclassified_kb > 0)
        .collect();
    if with_thp.is_empty() {
        return String::new();
    }
    let mut shown = with_thp.clone();
    if !all && shown.len() > DEFAULT_VMAS {
        shown.sort_by_key(|v| std::cmp::Reverse(thp_kb(&v.shape) + v.unclassified_kb));
        shown.truncate(DEFAULT_VMAS);
        shown.sort_by_key(|v| v.vma.start);
    }
    let mut rows = Vec::new();
    for v in &shown {
        let vma = format!(
            "{:x}-{:x} {} {}",
            v.vma.start, v.vma.end, v.vma.perms, v.vma.name
        );
        for (label, kb, pct) in nonzero(&v.shape) {
            rows.push(vec![vma.clone(), label, kb.to_string(), pct]);
        }
        if v.unclassified_kb > 0 {
            rows.push(vec![
                vma.clone(),
                "unclassified (kpageflags 0)".into(),
                v.unclassified_kb.to_string(),
                String::new(),
            ]);
        }
    }
    // Memory kpageflags reads 0 for may or may not be THP: such VMAs are
    // listed, but counted apart, so the count of VMAs with THP memory does
    // not depend on which 2 MiB blocks of the machine read 0.
    let unclassified_only = with_thp.iter().filter(|v| thp_kb(&v.shape) == 0).count();
    let also = match unclassified_only {
        0 => String::new(),
        n => format!(" and {n} with only memory kpageflags could not classify"),
    };
    let head = if shown.len() < with_thp.len() {
        format!(
            "\n{} VMAs with THP memory{also}; the {} with the most, in address order ({} more: --vmas prints every one):\n",
            with_thp.len() - unclassified_only,
            shown.len(),
            with_thp.len() - shown.len()
        )
    } else {
        format!(
            "\nby VMA ({} with THP memory{also}):\n",
            with_thp.len() - unclassified_only
        )
    };
    let header = ["VMA", "figure", "kB", "%"].map(String::from);
    head + &table::render_text(&header, &rows)
}

fn rollup_shape(scans: &[ProcessScan], cont_orders: &[u32]) -> Shape {
    let mut shape = Shape::new(cont_orders);
    for s in scans {
        shape.add(&s.shape(cont_orders));
    }
    shape
}

fn shape_json(s: &Shape) -> Value {
    let mut m = serde_json::Map::new();
    for (label, kb, _) in s.labels() {
        m.insert(label, kb.into());
    }
    Value::Object(m)
}

/// The figures that are not zero, with thpmaps's percentage.
fn nonzero(s: &Shape) -> Vec<(String, u64, String)> {
    s.labels()
        .into_iter()
        .filter(|x| x.1 > 0)
        .map(|(label, kb, anon)| {
            let total = if anon {
                s.anon_total_kb
            } else {
                s.file_total_kb
            };
            let pct = if total > 0 {
                format!("{:.0}%", 100.0 * kb as f64 / total as f64)
            } else {
                String::new()
            };
            (label, kb, pct)
        })
        .collect()
}

fn shape_table(s: &Shape) -> String {
    let rows: Vec<Vec<String>> = nonzero(s)
        .into_iter()
        .map(|(l, kb, pct)| vec![l, kb.to_string(), pct])
        .collect();
    if rows.is_empty() {
        return "no THP memory\n".to_string();
    }
    table::render(&["figure", "kB", "%"].map(String::from), &rows)
}

fn unclassified_note(kb: u64) {
    if kb > 0 {
        println!("{kb} kB of mapped memory could not be classified: /proc/kpageflags reads 0 for it (whole 2 MiB blocks on some VMs); it is counted in no figure above.");
    }
}
