//! What every kernel run of a workload file (`run`, `diff`, `utilization
//! --backend kernel`) decides before anything changes: what the workload
//! can need at most (`hugelab_workload::bound`, a first pass over the
//! file), whether that fits this machine's MemAvailable (less the
//! reserve the machine keeps), and the limit of the memory cgroup its
//! agents run in. A workload that cannot fit is refused with the figures
//! in one sentence, before the settings lock is even taken; `--force`
//! runs it anyway, still inside a group limited to what MemAvailable
//! allows, so that what goes wrong OOM-kills only its own agents.
//!
//! A workload read from a pipe cannot be read twice: it has no bound, and
//! its limit comes from MemAvailable alone (the run says so).

use crate::table::human;
use anyhow::{bail, Context, Result};
use clap::Args;
use hugelab_kernel::memcg::{self, RESERVE_BYTES};
use hugelab_kernel::KernelBackend;
use hugelab_workload::bound::{self, Bound};
use hugelab_workload::units::parse_size;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

/// How a kernel run is limited.
#[derive(Args, Clone, Debug, Default)]
pub struct KernelLimitArgs {
    /// Run a workload on the kernel even when what it can need at most
    /// does not fit this machine's MemAvailable (its memory cgroup is then
    /// limited to MemAvailable less a 1 GiB reserve).
    #[arg(long)]
    pub force: bool,
    /// The limit of the memory cgroup the workload's processes run in on
    /// the kernel (a size: 512M, 2G), instead of what the workload can
    /// need at most plus a margin.
    #[arg(long, value_name = "SIZE", value_parser = parse_limit)]
    pub memory_limit: Option<u64>,
    /// On the kernel: print what each workload can need at most and the
    /// memory cgroup its run would make, with its limit, then stop
    /// (nothing is changed, nothing runs).
    #[arg(long)]
    pub dry_run: bool,
}

fn parse_limit(s: &str) -> Result<u64, String> {
    match parse_size(s) {
        Ok(0) => Err("the limit must be above 0".to_string()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// What a kernel run of one workload file is allowed.
#[derive(Debug)]
pub struct Plan {
    /// None for a workload that cannot be read twice (a pipe).
    pub bound: Option<Bound>,
    /// MemAvailable now, bytes.
    pub available: u64,
    /// The run's memory cgroup limit, bytes.
    pub limit: u64,
}

impl Plan {
    /// Everything the workload can need with the margin, if it has a bound.
    pub fn need(&self) -> Option<u64> {
        self.bound.map(|b| b.total().saturating_add(b.margin()))
    }
}

/// Whether `file` can be read twice (not a pipe, socket or terminal).
fn rereadable(file: &Path) -> bool {
    std::fs::metadata(file).is_ok_and(|m| {
        let t = m.file_type();
        !(t.is_fifo() || t.is_socket() || t.is_char_device())
    })
}

/// Decides a kernel run of `file` (see the module doc): an error with the
/// figures when it cannot fit and `--force` was not given.
pub fn plan(file: &Path, args: &KernelLimitArgs) -> Result<Plan> {
    let bound = if rereadable(file) {
        Some(bound::of_file(file)?)
    } else {
        None
    };
    let (available, _) = hugelab_kernel::hugetlb::mem_available()?;
    let usable = available.saturating_sub(RESERVE_BYTES);
    let mut plan = Plan {
        bound,
        available,
        limit: usable.max(256 << 20),
    };
    match (plan.bound, plan.need()) {
        (Some(b), Some(need)) if need > usable => {
            if !args.force {
                bail!(
                    "{} needs up to {} (regions {}, hugetlb pools {}, margin {}) but this machine has {} available (MemAvailable {} less {} kept): refused (--force runs it anyway)",
                    file.display(),
                    human(need),
                    human(b.regions),
                    human(b.pools),
                    human(b.margin()),
                    human(usable),
                    human(available),
                    human(RESERVE_BYTES)
                );
            }
        }
        (Some(_), Some(need)) => plan.limit = need,
        _ => eprintln!(
            "hugelab: {} cannot be read twice, so what it needs is not known before it runs: its memory cgroup is limited to MemAvailable less {} ({})",
            file.display(),
            human(RESERVE_BYTES),
            human(plan.limit)
        ),
    }
    if let Some(limit) = args.memory_limit {
        plan.limit = limit;
    }
    Ok(plan)
}

/// `run` on a kernel backend for the workload `file`, planned ([`plan`])
/// first, and finished (tunables restored, memory cgroups removed)
/// whatever `run` returned.
pub(crate) fn kernel_run<T>(
    file: &Path,
    args: &KernelLimitArgs,
    run: impl FnOnce(&mut KernelBackend) -> Result<T>,
) -> Result<T> {
    kernel_run_planned(&plan(file, args)?, run)
}

/// [`kernel_run`] of a workload already planned.
pub(crate) fn kernel_run_planned<T>(
    plan: &Plan,
    run: impl FnOnce(&mut KernelBackend) -> Result<T>,
) -> Result<T> {
    let exe = std::env::current_exe().context("cannot find the hugelab binary for the agents")?;
    let mut kernel = KernelBackend::with_memory_limit(exe, plan.limit)?;
    let obs = run(&mut kernel);
    kernel.finish()?;
    obs
}

/// `--dry-run`: each file's plan and the group it would make, one line
/// each; an error (the refusal) for one that cannot fit.
pub fn print_dry_run<'a>(
    files: impl IntoIterator<Item = &'a std::path::PathBuf>,
    args: &KernelLimitArgs,
) -> Result<()> {
    let (dir, limit_file) = memcg::run_group_path().context(
        "this machine has no memory cgroup controller (neither v2 nor v1 is mounted): a kernel run needs one",
    )?;
    for file in files {
        let plan = plan(file, args)?;
        let needs = match (plan.bound, plan.need()) {
            (Some(b), Some(need)) => format!(
                "needs up to {} (regions {}, hugetlb pools {}, margin {})",
                human(need),
                human(b.regions),
                human(b.pools),
                human(b.margin())
            ),
            _ => "cannot be read twice (no bound)".to_string(),
        };
        println!(
            "{}: {needs}; MemAvailable {}; would run in memory cgroup {} with {} {} ({} bytes)",
            file.display(),
            human(plan.available),
            dir.display(),
            limit_file,
            human(plan.limit),
            plan.limit
        );
    }
    Ok(())
}
