//! The figures of `hugelab scan`, worked out once before any is printed
//! ([`ScanReport::compute`]): each process's shape, utilization report and
//! rank, which processes are shown, and the rollup over all of them.
//! `scan_print.rs` prints them as text, JSON or SVG.

use hugelab_kernel::scan::{shape::Shape, ProcessScan};
use hugelab_workload::units::PAGE_KB;
use hugelab_workload::utilization::{
    utilization_report, FolioUse, ShrinkerSettings, UtilizationReport,
};
use std::path::Path;

/// What was scanned, and how many processes `--all` or `--cgroup` skipped.
pub struct Scanned {
    pub scans: Vec<ProcessScan>,
    /// Processes that exited during the scan.
    pub gone: u64,
    /// Processes the kernel refused to let us read.
    pub denied: u64,
    /// `--pid`: every process asked for is scanned or it is an error.
    pub strict: bool,
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
