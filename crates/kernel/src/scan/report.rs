//! The figures of `hugelab scan` (and of the Python package's `scan`),
//! worked out once before any is printed: which processes are scanned
//! ([`scan_selected`]), each one's shape, utilization report and rank, which
//! are shown, the rollup over all of them ([`ScanReport::compute`]), and
//! every figure as JSON ([`to_json`], `hugelab scan --json`'s document). The
//! CLI prints them as text or SVG.

use super::{all_pids, cgroup_pids, has_exited, is_denied, is_gone, scan_process};
use super::{shape::Shape, ProcessScan, ScanOptions, VmaScan};
use crate::error::{KernelError, Result};
use hugelab_workload::units::PAGE_KB;
use hugelab_workload::utilization::{
    utilization_report, FolioUse, ShrinkerSettings, UtilizationReport,
};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// Why a scan needs root, as the refusal says it.
pub const NEEDS_ROOT: &str = "hugelab scan needs root: page frame numbers in /proc/PID/pagemap, /proc/kpageflags and other processes' /proc/PID/mem are root-only";

/// Refuses, in [`NEEDS_ROOT`]'s words, unless this is root.
pub fn require_root() -> Result<()> {
    crate::guard::require_root(NEEDS_ROOT)
}

/// The processes to scan.
pub enum Selection {
    /// These (a pid given twice is scanned once): each must be scanned.
    Pids(Vec<i32>),
    /// Every process of this cgroup directory and its descendants.
    Cgroup(PathBuf),
    /// Every process of the machine but this one.
    All,
}

/// Scans the processes `what` selects. With [`Selection::Pids`], a process
/// that does not exist or cannot be read is an error; otherwise it is
/// counted (exited, not readable) and left out.
pub fn scan_selected(what: &Selection, opts: &ScanOptions) -> Result<Scanned> {
    let strict = matches!(what, Selection::Pids(_));
    let mut repeated = Vec::new();
    let pids = match what {
        Selection::Pids(given) => {
            // A pid given twice is one process: scanning it twice would
            // count its memory twice.
            let mut pids = Vec::with_capacity(given.len());
            for &p in given {
                if pids.contains(&p) {
                    repeated.push(p);
                } else {
                    pids.push(p);
                }
            }
            pids
        }
        Selection::Cgroup(cg) => cgroup_pids(cg)?,
        Selection::All => {
            let me = std::process::id() as i32;
            all_pids()?.into_iter().filter(|&p| p != me).collect()
        }
    };
    let mut out = Scanned {
        scans: Vec::new(),
        gone: 0,
        denied: 0,
        strict,
        repeated,
    };
    for pid in pids {
        match scan_process(pid, opts) {
            // No memory: a kernel thread, or a process that exited after
            // the listing and is a zombie now (counted as exited).
            Ok(s) if !strict && s.vmas.is_empty() => out.gone += u64::from(has_exited(pid)),
            Ok(s) => out.scans.push(s),
            Err(e) if !strict && is_gone(&e) => out.gone += 1,
            Err(e) if !strict && is_denied(&e) => out.denied += 1,
            Err(e) if is_gone(&e) => {
                return Err(KernelError::Refused(format!(
                    "process {pid} does not exist or exited during the scan ({e})"
                )))
            }
            Err(e) => return Err(KernelError::Refused(format!("scanning process {pid}: {e}"))),
        }
    }
    Ok(out)
}

/// What was scanned, and how many processes `--all` or `--cgroup` skipped.
pub struct Scanned {
    pub scans: Vec<ProcessScan>,
    /// Processes that exited during the scan.
    pub gone: u64,
    /// Processes the kernel refused to let us read.
    pub denied: u64,
    /// `--pid`: every process asked for is scanned or it is an error.
    pub strict: bool,
    /// Pids given more than once (each scanned once).
    pub repeated: Vec<i32>,
}

/// What the arguments choose of the report.
pub struct Choices<'a> {
    /// `--cgroup`: the cgroup scanned.
    pub cgroup: Option<&'a Path>,
    /// `--all`: every process of the machine was scanned.
    pub all: bool,
    /// The page contents were read (not `--shape-only`).
    pub content: bool,
    /// Buckets of the utilization histograms.
    pub buckets: usize,
    /// The summary over every process is computed (`--rollup`, `--svg`).
    pub rollup: bool,
    /// How many processes are shown, the largest waste first (all: `None`).
    pub top: Option<usize>,
    /// `--top` was given (`--json` is cut only then).
    pub top_given: bool,
    /// `--vmas`: every VMA is printed.
    pub all_vmas: bool,
}

/// One scanned process with what is computed from it once: its shape, its
/// utilization report (none without contents) and its rank.
pub struct Process {
    pub scan: ProcessScan,
    pub shape: Shape,
    pub report: Option<UtilizationReport>,
    /// What the shrinker would give back, kB (0 without contents).
    pub freed_kb: u64,
    /// Zero-filled memory in its large folios, kB (0 without contents).
    pub zero_filled_kb: u64,
    /// Its memory in large folios, kB.
    pub thp_kb: u64,
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
}

/// Everything `scan` prints, computed before any of it is printed.
pub struct ScanReport {
    /// The processes shown, ranked.
    pub shown: Vec<Process>,
    /// Processes `--top` (or `--all`'s default) left out.
    pub left_out: usize,
    /// Over every process scanned: with `--rollup` (and for `--svg`).
    pub rollup: Option<Rollup>,
    /// What was scanned, for titles: the cgroup, "all processes" or the
    /// processes.
    pub what: String,
    pub scanned: usize,
    pub gone: u64,
    pub denied: u64,
    pub strict: bool,
    pub content: bool,
    /// `--top` was given (`--json` is cut only then).
    pub top_given: bool,
    pub all_vmas: bool,
}

/// The summary over every process scanned.
pub struct Rollup {
    pub shape: Shape,
    pub report: Option<UtilizationReport>,
    pub unclassified_kb: u64,
    pub zero_page_kb: u64,
}

impl ScanReport {
    pub fn compute(
        choices: &Choices,
        scanned: Scanned,
        settings: ShrinkerSettings,
        cont_orders: &[u32],
    ) -> ScanReport {
        let content = choices.content;
        let report_of = |folios: &mut dyn Iterator<Item = &FolioUse>| {
            utilization_report(folios, settings, choices.buckets)
        };
        let what = match (choices.cgroup, choices.all) {
            (Some(cg), _) => format!("cgroup {}", cg.display()),
            (None, true) => "all processes".to_string(),
            _ => scanned
                .scans
                .iter()
                .map(|s| format!("{} ({})", s.pid, s.comm))
                .collect::<Vec<_>>()
                .join(", "),
        };
        let rollup = choices.rollup.then(|| Rollup {
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
        let shown = choices.top.unwrap_or(usize::MAX).min(procs.len());
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
            top_given: choices.top_given,
            all_vmas: choices.all_vmas,
        }
    }
}

fn zero_filled_kb(r: &UtilizationReport) -> u64 {
    r.sizes.iter().map(|z| z.zero_pages()).sum::<u64>() * PAGE_KB
}

pub fn to_json(scan: &ScanReport) -> Value {
    let procs: Vec<Value> = scan
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
                // The ranking's figures (0 without contents but thp_kb).
                "thp_kb": p.thp_kb,
                "zero_filled_kb": p.zero_filled_kb,
                "freed_kb": p.freed_kb,
            });
            if scan.rollup.is_none() {
                j["vmas"] = s.vmas.iter().map(vma_json).collect();
                if let Some(r) = &p.report {
                    j["utilization"] = serde_json::to_value(r).unwrap_or(Value::Null);
                }
            }
            j
        })
        .collect();
    let mut out = json!({
        "content_read": scan.content,
        "processes": procs,
        // Every process unless --top is given.
        "processes_left_out": if scan.top_given { scan.left_out } else { 0 },
        "exited_during_scan": scan.gone,
        "not_readable": scan.denied,
    });
    if let Some(r) = &scan.rollup {
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

fn vma_json(v: &VmaScan) -> Value {
    let mut j = serde_json::to_value(&v.vma).unwrap_or(Value::Null);
    j["shape"] = shape_json(&v.shape);
    j["unclassified_kb"] = v.unclassified_kb.into();
    j["zero_page_kb"] = v.zero_page_kb.into();
    j
}

fn shape_json(s: &Shape) -> Value {
    let mut m = serde_json::Map::new();
    for (label, kb, _) in s.labels() {
        m.insert(label, kb.into());
    }
    Value::Object(m)
}
