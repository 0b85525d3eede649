//! `hugelab scan`: the huge pages of running processes — thpmaps's shape
//! figures per VMA (or rolled up), the utilization of every large folio and
//! what the deferred split shrinker would give back. Live tool: uses only
//! the kernel crate's readers.
//!
//! Laid out as `bench` is: this file takes the arguments; the kernel
//! crate's `scan::report` scans the processes they select
//! ([`scan_selected`]), works every figure out once ([`ScanReport::compute`]:
//! each process's shape, report and rank) and writes the JSON (the Python
//! package's `scan` shares all of that); `scan_print.rs` prints the text and
//! SVG.

use crate::scan_print;
use anyhow::{bail, Result};
use clap::Args;
use hugelab_kernel::scan::report::{self, scan_selected, Choices, ScanReport, Selection};
use hugelab_kernel::scan::{self, ScanOptions};
use hugelab_workload::tunables::MAX_PTES_LIMIT;
use hugelab_workload::units::{PAGE_SHIFT, PMD_SHIFT};
use hugelab_workload::utilization::DEFAULT_BUCKETS;
use hugelab_workload::Size;
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
    report::require_root()?;
    let mut settings = scan::shrinker_settings()?;
    settings.max_ptes_none = args.max_ptes_none.unwrap_or(settings.max_ptes_none);
    let opts = ScanOptions {
        content: !args.shape_only,
        cont_orders: cont_orders.clone(),
        range: None,
        threads: 0,
        pace: None,
    };
    let scanned = scan_selected(&args.selection(), &opts)?;
    for p in &scanned.repeated {
        eprintln!("hugelab: note: --pid {p} was given more than once; it is scanned once");
    }
    let report = ScanReport::compute(&args.choices(), scanned, settings, &cont_orders);
    if let Some(path) = &args.svg {
        scan_print::write_svg(&report, path)?;
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report::to_json(&report))?
        );
    } else {
        print!("{}", scan_print::render(&report));
    }
    Ok(ExitCode::SUCCESS)
}

/// Processes printed by --all without --top.
const DEFAULT_TOP: usize = 10;

impl ScanArgs {
    /// The processes the arguments select.
    fn selection(&self) -> Selection {
        match (&self.cgroup, self.all) {
            (Some(cg), _) => Selection::Cgroup(cg.clone()),
            (None, true) => Selection::All,
            (None, false) => Selection::Pids(self.pids.clone()),
        }
    }

    /// What the arguments choose of the report.
    fn choices(&self) -> Choices<'_> {
        Choices {
            cgroup: self.cgroup.as_deref(),
            all: self.all,
            content: !self.shape_only,
            buckets: self.buckets,
            rollup: self.rollup || self.svg.is_some(),
            top: self.top.or((self.all && !self.json).then_some(DEFAULT_TOP)),
            top_given: self.top.is_some(),
            all_vmas: self.vmas,
        }
    }
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
