//! `hugelab scan`: the huge pages of running processes — thpmaps's shape
//! figures per VMA (or rolled up), the utilization of every large folio and
//! what the deferred split shrinker would give back. Live tool: uses only
//! the kernel crate's readers.
//!
//! [`ScanReport::compute`] works every figure out once (each process's
//! shape, report and rank); [`ScanReport::render`] and
//! [`ScanReport::to_json`] only print them.

use crate::table;
use anyhow::{bail, Result};
use clap::Args;
use hugelab_kernel::scan::{self, shape::Shape, ProcessScan, ScanOptions, VmaScan};
use hugelab_workload::tunables::MAX_PTES_LIMIT;
use hugelab_workload::units::{PAGE_KB, PAGE_SHIFT, PMD_SHIFT};
use hugelab_workload::utilization::{
    utilization_report, FolioUse, ShrinkerSettings, UtilizationReport, DEFAULT_BUCKETS,
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
    /// else every one; in --json only when given). Not with --rollup.
    #[arg(long, value_name = "N")]
    top: Option<usize>,
    /// Print every VMA's figures (default: the 10 VMAs of each process with
    /// the most THP memory). Not with --rollup.
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
    /// Predict the deferred split shrinker's under-used splits at this
    /// max_ptes_none instead of the machine's.
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
    let cont_orders = check_args(&args)?;
    hugelab_kernel::guard::require_root(
        "hugelab scan needs root: page frame numbers in /proc/PID/pagemap, /proc/kpageflags and other processes' /proc/PID/mem are root-only",
    )?;
    let mut settings = scan::shrinker_settings()?;
    settings.max_ptes_none = args.max_ptes_none.unwrap_or(settings.max_ptes_none);
    let scanned = scan_processes(&args, &cont_orders)?;
    let report = ScanReport::compute(&args, scanned, settings, &cont_orders);
    if let Some(path) = &args.svg {
        report.write_svg(path)?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report.to_json())?);
    } else {
        print!("{}", report.render());
    }
    Ok(ExitCode::SUCCESS)
}

/// The argument checks that need no root: one sentence each. Returns the
/// `--cont` orders.
fn check_args(args: &ScanArgs) -> Result<Vec<u32>> {
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
    if args.rollup {
        if let Some(flag) = [(args.top.is_some(), "--top"), (args.vmas, "--vmas")]
            .iter()
            .find_map(|&(given, flag)| given.then_some(flag))
        {
            bail!("{flag} chooses what is printed per process, and --rollup prints one summary over every process: drop one of the two");
        }
    }
    if let Some(n) = args
        .max_ptes_none
        .filter(|&n| u64::from(n) > MAX_PTES_LIMIT)
    {
        bail!("--max-ptes-none {n}: the kernel accepts 0 to {MAX_PTES_LIMIT}");
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
    Ok(cont_orders)
}

/// What was scanned, and how many processes `--all` or `--cgroup` skipped.
struct Scanned {
    scans: Vec<ProcessScan>,
    /// Processes that exited during the scan.
    gone: u64,
    /// Processes the kernel refused to let us read.
    denied: u64,
    /// `--pid`: every process asked for is scanned or it is an error.
    strict: bool,
}

/// Scans the processes the arguments select.
fn scan_processes(args: &ScanArgs, cont_orders: &[u32]) -> Result<Scanned> {
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
        cont_orders: cont_orders.to_vec(),
        range: None,
    };
    let mut out = Scanned {
        scans: Vec::new(),
        gone: 0,
        denied: 0,
        strict,
    };
    for pid in pids {
        match scan::scan_process(pid, &opts) {
            Ok(s) if !strict && s.vmas.is_empty() => {}
            Ok(s) => out.scans.push(s),
            Err(e) if !strict && scan::is_gone(&e) => out.gone += 1,
            Err(e) if !strict && scan::is_denied(&e) => out.denied += 1,
            Err(e) if scan::is_gone(&e) => {
                bail!("process {pid} does not exist or exited during the scan ({e})")
            }
            Err(e) => bail!("scanning process {pid}: {e}"),
        }
    }
    Ok(out)
}

/// VMAs of a process printed without --vmas.
const DEFAULT_VMAS: usize = 10;
/// Processes printed by --all without --top.
const DEFAULT_TOP: usize = 10;

/// One scanned process with what is computed from it once: its shape, its
/// utilization report (none without contents) and its rank.
struct Process {
    scan: ProcessScan,
    shape: Shape,
    report: Option<UtilizationReport>,
    /// What the shrinker would give back, kB (0 without contents).
    freed_kb: u64,
    /// Zero-filled memory in its large folios, kB (0 without contents).
    zero_filled_kb: u64,
    /// Its memory in large folios, kB.
    thp_kb: u64,
}

impl Process {
    /// The ranking key, the largest waste first: what the shrinker would
    /// give back, then zero-filled memory in large folios, then THP memory
    /// (all there is without contents).
    fn rank(&self) -> impl Ord {
        (
            std::cmp::Reverse([self.freed_kb, self.zero_filled_kb, self.thp_kb]),
            self.scan.pid,
        )
    }

    fn title(&self) -> String {
        format!("process {} ({})", self.scan.pid, self.scan.comm)
    }
}

/// Everything `scan` prints, computed before any of it is printed.
struct ScanReport {
    /// The processes shown, ranked.
    shown: Vec<Process>,
    /// Processes `--top` (or `--all`'s default) left out.
    left_out: usize,
    /// Over every process scanned: with `--rollup` (and for `--svg`).
    rollup: Option<Rollup>,
    /// What was scanned, for titles: the cgroup, "all processes" or the
    /// processes.
    what: String,
    scanned: usize,
    gone: u64,
    denied: u64,
    strict: bool,
    content: bool,
    /// `--top` was given (`--json` is cut only then).
    top_given: bool,
    all_vmas: bool,
}

/// The summary over every process scanned.
struct Rollup {
    shape: Shape,
    report: Option<UtilizationReport>,
    unclassified_kb: u64,
    zero_page_kb: u64,
}

impl ScanReport {
    fn compute(
        args: &ScanArgs,
        scanned: Scanned,
        settings: ShrinkerSettings,
        cont_orders: &[u32],
    ) -> ScanReport {
        let content = !args.shape_only;
        let report_of = |folios: &mut dyn Iterator<Item = &FolioUse>| {
            utilization_report(folios, settings, args.buckets)
        };
        let what = match (&args.cgroup, args.all) {
            (Some(cg), _) => format!("cgroup {}", cg.display()),
            (None, true) => "all processes".to_string(),
            _ => scanned
                .scans
                .iter()
                .map(|s| format!("{} ({})", s.pid, s.comm))
                .collect::<Vec<_>>()
                .join(", "),
        };
        let rollup = (args.rollup || args.svg.is_some()).then(|| Rollup {
            shape: {
                let mut shape = Shape::new(cont_orders);
                for s in &scanned.scans {
                    shape.add(&s.shape(cont_orders));
                }
                shape
            },
            report: content
                .then(|| report_of(&mut scanned.scans.iter().flat_map(|s| s.folios.iter()))),
            unclassified_kb: scanned.scans.iter().map(ProcessScan::unclassified_kb).sum(),
            zero_page_kb: scanned.scans.iter().map(ProcessScan::zero_page_kb).sum(),
        });
        let scanned_n = scanned.scans.len();
        let mut procs: Vec<Process> = scanned
            .scans
            .into_iter()
            .map(|scan| {
                let shape = scan.shape(cont_orders);
                let report = content.then(|| report_of(&mut scan.folios.iter()));
                Process {
                    freed_kb: report.as_ref().map_or(0, |r| r.give_back.freed_kb()),
                    zero_filled_kb: report.as_ref().map_or(0, zero_filled_kb),
                    thp_kb: shape.thp_kb(),
                    scan,
                    shape,
                    report,
                }
            })
            .collect();
        procs.sort_by_key(Process::rank);
        let top = args.top.or((args.all && !args.json).then_some(DEFAULT_TOP));
        let shown = top.unwrap_or(usize::MAX).min(procs.len());
        let left_out = procs.len() - shown;
        procs.truncate(shown);
        ScanReport {
            shown: procs,
            left_out,
            rollup,
            what,
            scanned: scanned_n,
            gone: scanned.gone,
            denied: scanned.denied,
            strict: scanned.strict,
            content,
            top_given: args.top.is_some(),
            all_vmas: args.vmas,
        }
    }

    /// The utilization histogram of everything scanned, into `path`.
    fn write_svg(&self, path: &std::path::Path) -> Result<()> {
        let Some(report) = self.rollup.as_ref().and_then(|r| r.report.as_ref()) else {
            bail!("--svg needs the page contents");
        };
        let title = match (self.scanned, self.strict) {
            (1, true) => format!("scan of process {}", self.what),
            (_, true) => format!("scan of processes {}", self.what),
            (n, false) => format!(
                "scan of {}, {}",
                self.what,
                table::plural(n as u64, "process", "processes")
            ),
        };
        crate::utilization_view::write_svg(&title, &[("scan", report)], path)
    }

    fn to_json(&self) -> Value {
        let procs: Vec<Value> = self
            .shown
            .iter()
            .map(|p| {
                let s = &p.scan;
                let mut j = json!({
                    "pid": s.pid,
                    "comm": s.comm,
                    "shape": shape_json(&p.shape),
                    "unclassified_kb": s.unclassified_kb(),
                    "zero_page_kb": s.zero_page_kb(),
                    "folio_pages": s.folio_pages,
                });
                if self.rollup.is_none() {
                    j["vmas"] = s.vmas.iter().map(vma_json).collect();
                    if let Some(r) = &p.report {
                        j["utilization"] = serde_json::to_value(r).unwrap_or(Value::Null);
                    }
                }
                j
            })
            .collect();
        let mut out = json!({
            "content_read": self.content,
            "processes": procs,
            // Every process unless --top is given.
            "processes_left_out": if self.top_given { self.left_out } else { 0 },
            "exited_during_scan": self.gone,
            "not_readable": self.denied,
        });
        if let Some(r) = &self.rollup {
            out["rollup"] = json!({
                "shape": shape_json(&r.shape),
                "unclassified_kb": r.unclassified_kb,
                "zero_page_kb": r.zero_page_kb,
            });
            if let Some(u) = &r.report {
                out["rollup"]["utilization"] = serde_json::to_value(u).unwrap_or(Value::Null);
            }
        }
        out
    }

    /// The text, conclusion first.
    fn render(&self) -> String {
        let mut out = String::new();
        if let Some(r) = &self.rollup {
            // The shrinker's verdict and the histogram, then thpmaps's
            // figures.
            let n = table::plural(self.scanned as u64, "process", "processes");
            out += &format!("rollup of {n}: {}\n\n", self.what);
            if let Some(u) = &r.report {
                let title = format!("rollup of {}", self.what);
                out += &crate::utilization_view::render_table(u, &title);
                out += "\n";
            }
            out += &shape_table(&r.shape);
            out += &unclassified_note(r.unclassified_kb);
        } else {
            if self.scanned > 1 {
                out += &self.ranking();
                out += "\n";
            }
            for p in &self.shown {
                // What the shrinker would do and the histogram, then the
                // process's figures, then its VMAs'.
                match &p.report {
                    Some(r) => {
                        out += &crate::utilization_view::render_table(r, &p.title());
                        out += "\n";
                    }
                    None => out += &format!("{}\n\n", p.title()),
                }
                out += &shape_table(&p.shape);
                out += &unclassified_note(p.scan.unclassified_kb());
                out += &vma_rows(&p.scan, self.all_vmas);
                out += "\n";
            }
        }
        let processes = |n: u64| table::plural(n, "process", "processes");
        if self.gone > 0 {
            out += &format!(
                "{} exited during the scan and {} not counted.\n",
                processes(self.gone),
                if self.gone == 1 { "is" } else { "are" }
            );
        }
        if self.denied > 0 {
            out += &format!(
                "{} refused to be read (EACCES/EPERM, e.g. another namespace's init) and {} not counted.\n",
                processes(self.denied),
                if self.denied == 1 { "is" } else { "are" }
            );
        }
        out
    }

    /// The processes shown, largest waste first, one row each, and how
    /// many more there are.
    fn ranking(&self) -> String {
        let mut header = vec!["pid".to_string(), "comm".to_string()];
        let one = self.left_out == 1;
        let (intro, less) = if self.content {
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
        let rows: Vec<Vec<String>> = self
            .shown
            .iter()
            .map(|p| {
                let mut row = vec![p.scan.pid.to_string(), p.scan.comm.clone()];
                if self.content {
                    row.push(p.freed_kb.to_string());
                    row.push(p.zero_filled_kb.to_string());
                }
                row.push(p.thp_kb.to_string());
                row
            })
            .collect();
        let mut out = format!(
            "{} scanned, {intro}:\n{}",
            table::plural(self.scanned as u64, "process", "processes"),
            table::render_aligned(&header, &rows, 2)
        );
        if self.left_out > 0 {
            let more = table::plural(self.left_out as u64, "more process", "more processes");
            let are = if one { "is" } else { "are" };
            out += &format!("{more} {less} and {are} left out (--top N shows N).\n");
        }
        out
    }
}

fn zero_filled_kb(r: &UtilizationReport) -> u64 {
    r.sizes.iter().map(|z| z.zero_pages()).sum::<u64>() * PAGE_KB
}

fn vma_json(v: &VmaScan) -> Value {
    let mut j = serde_json::to_value(&v.vma).unwrap_or(Value::Null);
    j["shape"] = shape_json(&v.shape);
    j["unclassified_kb"] = v.unclassified_kb.into();
    j["zero_page_kb"] = v.zero_page_kb.into();
    j
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

fn unclassified_note(kb: u64) -> String {
    if kb == 0 {
        return String::new();
    }
    format!("{kb} kB of mapped memory could not be classified: /proc/kpageflags reads 0 for it (whole 2 MiB blocks on some VMs); it is counted in no figure above.\n")
}
