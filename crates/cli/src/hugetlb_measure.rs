//! `hugelab hugetlb measure`: seed 003's experiment on the machine at hand.
//! For each HugeTLB size, grows the pool to N pages and shrinks it back,
//! with `vm.hugetlb_optimize_vmemmap` off and on, timing both writes and
//! reading the memmap and free-page counters around them
//! (`hugelab_kernel::hugetlb`); `hugetlb_measure_report` turns the cycles
//! into figures beside the model's and the seed's.
//!
//! Everything is checked before anything changes; the pool and the sysctl
//! change only through the settings guard, which puts them back on every
//! ending (`hugelab settings restore` after SIGKILL).

use crate::hugetlb_measure_report::{report, Report};
use crate::table::human;
use anyhow::{bail, Result};
use clap::Args;
use hugelab_kernel::guard::{require_root, SettingsGuard};
use hugelab_kernel::hugetlb::{self, HVO};
use hugelab_kernel::memcg::RESERVE_BYTES;
use hugelab_kernel::{damon, sysfs};
use hugelab_workload::Size;
use serde::Serialize;
use std::process::ExitCode;

const SIZE_2M: u64 = 2 << 20;
const SIZE_1G: u64 = 1 << 30;

#[derive(Args)]
pub struct MeasureArgs {
    /// The pool size each grow writes (default: 1024 for 2M, 2 for 1G).
    #[arg(long, value_name = "N")]
    pages: Option<u64>,
    /// Measured cycles per HVO setting.
    #[arg(long, value_name = "R", default_value_t = 5)]
    repeat: u32,
    /// Warm-up cycles per HVO setting, run first and left out of the figures.
    #[arg(long, default_value_t = 1)]
    warmup: u32,
    /// One HugeTLB size, 2M or 1G; both when left out (1G where this kernel
    /// has it).
    #[arg(long)]
    size: Option<Size>,
    /// Print every cycle and the figures as JSON.
    #[arg(long)]
    json: bool,
    /// Print what would be changed and measured, change nothing.
    #[arg(long)]
    dry_run: bool,
}

/// One size to measure, checked.
pub struct Planned {
    pub size: u64,
    pub size_kb: u64,
    /// nr_hugepages now.
    pub original: u64,
    /// The size each grow writes.
    pub target: u64,
}

impl Planned {
    pub fn bytes_needed(&self) -> u64 {
        (self.target - self.original) * self.size
    }
}

pub fn main(args: MeasureArgs) -> Result<ExitCode> {
    if args.repeat == 0 {
        bail!("--repeat must be at least 1");
    }
    if args.pages == Some(0) {
        bail!("--pages must be at least 1");
    }
    let (sizes, not_offered) = sizes(args.size)?;
    let (available, _) = hugetlb::mem_available()?;
    let mut plans = Vec::new();
    for size in sizes {
        let size_kb = size >> 10;
        let target = args.pages.unwrap_or(if size == SIZE_1G { 2 } else { 1024 });
        let original = hugetlb::pool_pages(size_kb)?;
        if original >= target {
            bail!(
                "the {} pool already holds {original} pages: ask for more than that with --pages",
                Size(size)
            );
        }
        let p = Planned {
            size,
            size_kb,
            original,
            target,
        };
        if p.bytes_needed() + RESERVE_BYTES > available {
            bail!(
                "{} more pages of {} ({}) and a margin of {} do not fit in this machine's MemAvailable of {}: ask for fewer with --pages",
                target - original,
                Size(size),
                human(p.bytes_needed()),
                human(RESERVE_BYTES),
                human(available)
            );
        }
        plans.push(p);
    }
    if args.dry_run {
        let plan = DryRun::new(&plans, &not_offered, args.warmup, args.repeat, available);
        if args.json {
            println!("{}", serde_json::to_string_pretty(&plan)?);
        } else {
            print!("{}", plan.render());
        }
        return Ok(ExitCode::SUCCESS);
    }
    require_root(
        "hugelab hugetlb measure needs root: it resizes HugeTLB pools and sets vm.hugetlb_optimize_vmemmap",
    )?;
    for p in &plans {
        hugetlb::check_writable(p.size_kb)?;
    }
    let mut guard = SettingsGuard::acquire()?;
    let mut runs = Vec::new();
    for p in &plans {
        runs.push(hugetlb::measure_pool(
            &mut guard,
            p.size_kb,
            p.target,
            args.warmup,
            args.repeat,
        )?);
    }
    guard.restore()?;
    let report: Report = report(
        runs,
        not_offered,
        args.warmup,
        args.repeat,
        guard.journaled(),
    );
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.render());
    }
    Ok(ExitCode::SUCCESS)
}

/// The sizes to measure, and the sizes left out because this kernel has no
/// pool of them (said in the output).
fn sizes(asked: Option<Size>) -> Result<(Vec<u64>, Vec<String>)> {
    let exists = |size: u64| hugetlb::pool_dir(size >> 10).exists();
    match asked {
        Some(s) => {
            let size = s.bytes();
            if size != SIZE_2M && size != SIZE_1G {
                bail!("--size {s} is not a HugeTLB size hugelab measures: 2M or 1G");
            }
            if !exists(size) {
                bail!(
                    "this kernel has no {s} HugeTLB pages ({} does not exist)",
                    hugetlb::pool_dir(size >> 10).display()
                );
            }
            Ok((vec![size], Vec::new()))
        }
        None => {
            let (have, lack): (Vec<u64>, Vec<u64>) =
                [SIZE_2M, SIZE_1G].into_iter().partition(|&s| exists(s));
            if have.is_empty() {
                bail!("this kernel has no 2M or 1G HugeTLB pages (no /sys/kernel/mm/hugepages/hugepages-*kB)");
            }
            Ok((
                have,
                lack.into_iter().map(|s| Size(s).to_string()).collect(),
            ))
        }
    }
}

/// `--dry-run`: what would be changed and measured. `--json` prints it as
/// it is; [`DryRun::render`] is the text.
#[derive(Serialize)]
struct DryRun {
    dry_run: bool,
    sizes: Vec<PlannedPool>,
    /// Sizes this kernel has no pool of.
    not_measured: Vec<String>,
    warmup: u32,
    repeat: u32,
    mem_available_bytes: u64,
    /// `vm.hugetlb_optimize_vmemmap` now (null when it cannot be read).
    hugetlb_optimize_vmemmap: Option<String>,
    /// Why it cannot be read.
    #[serde(skip)]
    hvo_unreadable: Option<String>,
    /// The DAMON kdamonds the settings guard turns off for the measurement.
    damon: Vec<damon::Planned>,
    /// Why they cannot be listed.
    #[serde(skip_serializing_if = "Option::is_none")]
    damon_unreadable: Option<String>,
}

#[derive(Serialize)]
struct PlannedPool {
    size: String,
    size_bytes: u64,
    /// The pool's tunable (`hugepages/hugepages-2048kB/nr_hugepages`).
    pool: String,
    now: u64,
    target: u64,
    bytes_needed: u64,
}

impl DryRun {
    fn new(
        plans: &[Planned],
        not_offered: &[String],
        warmup: u32,
        repeat: u32,
        available: u64,
    ) -> Self {
        let hvo = sysfs::read_tunable(&HVO);
        let damon = damon::planned();
        DryRun {
            dry_run: true,
            sizes: plans
                .iter()
                .map(|p| PlannedPool {
                    size: Size(p.size).to_string(),
                    size_bytes: p.size,
                    pool: hugetlb::pool(p.size_kb).path(),
                    now: p.original,
                    target: p.target,
                    bytes_needed: p.bytes_needed(),
                })
                .collect(),
            not_measured: not_offered.to_vec(),
            warmup,
            repeat,
            mem_available_bytes: available,
            hvo_unreadable: hvo.as_ref().err().map(|e| format!("unreadable: {e}")),
            hugetlb_optimize_vmemmap: hvo.ok(),
            damon_unreadable: damon.as_ref().err().map(|e| e.to_string()),
            damon: damon.unwrap_or_default(),
        }
    }

    fn render(&self) -> String {
        let (warmup, repeat) = (self.warmup, self.repeat);
        let mut out = String::from("dry run: nothing is changed\n\n");
        for p in &self.sizes {
            out.push_str(&format!(
                "{}: {} {} -> {} -> {}, {warmup} warm-up and {repeat} measured cycles with vm.hugetlb_optimize_vmemmap 0, as many with 1, interleaved (0 then 1); needs {} of the {} MemAvailable\n",
                p.size,
                p.pool,
                p.now,
                p.target,
                p.now,
                human(p.bytes_needed),
                human(self.mem_available_bytes),
            ));
        }
        for s in &self.not_measured {
            out.push_str(&format!(
                "{s}: not measured, this kernel has no pool of it\n"
            ));
        }
        out.push_str(
            "\neach cycle: fold vmstat (/proc/sys/vm/stat_refresh) and read nr_memmap_pages, nr_memmap_boot_pages, nr_free_pages and MemFree; \
             time the write of the target to nr_hugepages and read it back; read; time the write of the old size; read; \
             then read, sleep as long as the grow took, and read again (the idle drift)\n",
        );
        out.push_str(&crate::bench::damon_lines(
            &self.damon,
            self.damon_unreadable.as_deref(),
        ));
        let hvo = self
            .hugetlb_optimize_vmemmap
            .as_ref()
            .or(self.hvo_unreadable.as_ref())
            .map_or("", String::as_str);
        let kdamonds = if self.damon.is_empty() {
            ""
        } else {
            ", every kdamond above on again"
        };
        out.push_str(&format!(
            "then every pool above back to its size now{kdamonds} and vm.hugetlb_optimize_vmemmap back to {hvo}\n"
        ));
        out
    }
}
