//! `hugelab scan`: the huge pages of running processes — thpmaps's shape
//! figures per VMA (or rolled up), the utilization of every large folio and
//! what the under-used THP shrinker would give back. Live tool: uses only
//! the kernel crate's readers.

use crate::table;
use anyhow::{bail, Result};
use clap::Args;
use hugelab_kernel::scan::{self, shape::Shape, ProcessScan, ScanOptions};
use hugelab_workload::units::{PAGE_SHIFT, PMD_SHIFT};
use hugelab_workload::utilization::{utilization_report, FolioUse, DEFAULT_BUCKETS};
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
    /// One summary over everything scanned instead of one per VMA.
    #[arg(long)]
    rollup: bool,
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
    /// Draw the utilization histogram into this SVG file.
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
    if let Some(path) = &args.svg {
        crate::utilization_view::write_svg(&[("scan", &rollup_report)], path)?;
    }
    if args.json {
        let procs: Vec<Value> = scans
            .iter()
            .map(|s| {
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
                    if !args.shape_only {
                        p["utilization"] = serde_json::to_value(report_of(&mut s.folios.iter()))
                            .unwrap_or(Value::Null);
                    }
                }
                p
            })
            .collect();
        let mut out = json!({
            "content_read": !args.shape_only,
            "processes": procs,
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
        let shape = rollup_shape(&scans, &cont_orders);
        let what = match (&args.cgroup, args.all) {
            (Some(cg), _) => format!("cgroup {}", cg.display()),
            (None, true) => "all processes".to_string(),
            _ => scans
                .iter()
                .map(|s| format!("{} ({})", s.pid, s.comm))
                .collect::<Vec<_>>()
                .join(", "),
        };
        println!("rollup of {} process(es): {what}\n", scans.len());
        print!("{}", shape_table(&shape));
        unclassified_note(scans.iter().map(ProcessScan::unclassified_kb).sum());
        if !args.shape_only {
            println!();
            print!(
                "{}",
                crate::utilization_view::render_table(&rollup_report, &format!("rollup of {what}"))
            );
        }
    } else {
        for s in &scans {
            println!("process {} ({})\n", s.pid, s.comm);
            let mut rows = Vec::new();
            for v in &s.vmas {
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
            if rows.is_empty() {
                println!("no THP memory\n");
            } else {
                let header = ["VMA", "figure", "kB", "%"].map(String::from);
                print!("{}", table::render_text(&header, &rows));
            }
            if !args.shape_only {
                println!();
                print!(
                    "{}",
                    crate::utilization_view::render_table(
                        &report_of(&mut s.folios.iter()),
                        &format!("process {} ({})", s.pid, s.comm)
                    )
                );
            }
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
