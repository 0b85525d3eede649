//! The printing of `hugelab scan`'s [`ScanReport`]: the text, conclusion
//! first ([`render`]), and the utilization histogram of everything scanned
//! as SVG ([`write_svg`]). They compute nothing: the kernel crate's
//! `scan::report` did (and writes the JSON).

use crate::table;
use anyhow::{bail, Result};
use hugelab_kernel::scan::report::{Process, ScanReport};
use hugelab_kernel::scan::{shape::Shape, ProcessScan};
use std::path::Path;

/// VMAs of a process printed without --vmas.
const DEFAULT_VMAS: usize = 10;

fn process_title(p: &Process) -> String {
    format!("process {} ({})", p.scan.pid, p.scan.comm)
}

/// The utilization histogram of everything scanned, into `path`.
pub fn write_svg(scan: &ScanReport, path: &Path) -> Result<()> {
    let Some(report) = scan.rollup.as_ref().and_then(|r| r.report.as_ref()) else {
        bail!("--svg needs the page contents");
    };
    let title = match (scan.scanned, scan.strict) {
        (1, true) => format!("scan of process {}", scan.what),
        (_, true) => format!("scan of processes {}", scan.what),
        (n, false) => format!(
            "scan of {}, {}",
            scan.what,
            table::plural(n as u64, "process", "processes")
        ),
    };
    crate::utilization_view::write_svg(&title, &[("scan", report)], path)
}

/// The text, conclusion first.
pub fn render(scan: &ScanReport) -> String {
    let mut out = String::new();
    if let Some(r) = &scan.rollup {
        // The shrinker's verdict and the histogram, then thpmaps's
        // figures.
        let n = table::plural(scan.scanned as u64, "process", "processes");
        out += &format!("rollup of {n}: {}\n\n", scan.what);
        if let Some(u) = &r.report {
            let title = format!("rollup of {}", scan.what);
            out += &crate::utilization_view::render_table(u, &title);
            out += "\n";
        }
        out += &shape_table(&r.shape);
        out += &unclassified_note(r.unclassified_kb);
    } else {
        if scan.scanned > 1 {
            out += &ranking(scan);
            out += "\n";
        }
        for p in &scan.shown {
            // What the shrinker would do and the histogram, then the
            // process's figures, then its VMAs'.
            match &p.report {
                Some(r) => {
                    out += &crate::utilization_view::render_table(r, &process_title(p));
                    out += "\n";
                }
                None => out += &format!("{}\n\n", process_title(p)),
            }
            out += &shape_table(&p.shape);
            out += &unclassified_note(p.scan.unclassified_kb());
            out += &vma_rows(&p.scan, scan.all_vmas);
            out += "\n";
        }
    }
    let processes = |n: u64| table::plural(n, "process", "processes");
    if scan.gone > 0 {
        out += &format!(
            "{} exited during the scan and {} not counted.\n",
            processes(scan.gone),
            if scan.gone == 1 { "is" } else { "are" }
        );
    }
    if scan.denied > 0 {
        out += &format!(
            "{} refused to be read (EACCES/EPERM, e.g. another namespace's init) and {} not counted.\n",
            processes(scan.denied),
            if scan.denied == 1 { "is" } else { "are" }
        );
    }
    out
}

/// The processes shown, largest waste first, one row each, and how
/// many more there are.
fn ranking(scan: &ScanReport) -> String {
    let mut header = vec!["pid".to_string(), "comm".to_string()];
    let one = scan.left_out == 1;
    let (intro, less) = if scan.content {
        header.push("shrinker gives back (kB)".into());
        header.push("zero-filled in large folios (kB)".into());
        (
            "ranked by what the deferred split shrinker would give back, then by zero-filled memory in large folios",
            if one { "wastes less" } else { "waste less" },
        )
    } else {
        (
            "ranked by THP memory (--shape-only reads no contents, so no waste)",
            if one {
                "has less THP memory"
            } else {
                "have less THP memory"
            },
        )
    };
    header.push("THP memory (kB)".into());
    let rows: Vec<Vec<String>> = scan
        .shown
        .iter()
        .map(|p| {
            let mut row = vec![p.scan.pid.to_string(), p.scan.comm.clone()];
            if scan.content {
                row.push(p.freed_kb.to_string());
                row.push(p.zero_filled_kb.to_string());
            }
            row.push(p.thp_kb.to_string());
            row
        })
        .collect();
    let mut out = format!(
        "{} scanned, {intro}:\n{}",
        table::plural(scan.scanned as u64, "process", "processes"),
        table::render_aligned(&header, &rows, 2)
    );
    if scan.left_out > 0 {
        let more = table::plural(scan.left_out as u64, "more process", "more processes");
        let are = if one { "is" } else { "are" };
        out += &format!("{more} {less} and {are} left out (--top N shows N).\n");
    }
    out
}

/// The figures of a process's VMAs: every one with --vmas, else the
/// DEFAULT_VMAS with the most THP memory (in address order) and a line on
/// how many more there are.
fn vma_rows(s: &ProcessScan, all: bool) -> String {
    let with_thp: Vec<_> = s
        .vmas
        .iter()
        .filter(|v| v.shape.thp_kb() > 0 || v.unclassified_kb > 0)
        .collect();
    if with_thp.is_empty() {
        return String::new();
    }
    let mut shown = with_thp.clone();
    if !all && shown.len() > DEFAULT_VMAS {
        shown.sort_by_key(|v| std::cmp::Reverse(v.shape.thp_kb() + v.unclassified_kb));
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
    let unclassified_only = with_thp.iter().filter(|v| v.shape.thp_kb() == 0).count();
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

fn unclassified_note(kb: u64) -> String {
    if kb == 0 {
        return String::new();
    }
    format!("{kb} kB of mapped memory could not be classified: /proc/kpageflags reads 0 for it (whole 2 MiB blocks on some VMs); it is counted in no figure above.\n")
}
