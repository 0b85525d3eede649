//! `hugelab.scan`: the huge pages of running processes, as `hugelab scan
//! --json` reports them. A live tool: the processes are selected, scanned
//! and reported by the kernel crate's `scan::report`, the code the command
//! runs, so the document is the command's.

use anyhow::{bail, Result};
use hugelab_kernel::scan::report::{self, scan_selected, Choices, ScanReport, Selection};
use hugelab_kernel::scan::{shrinker_settings, ScanOptions};
use hugelab_workload::tunables::MAX_PTES_LIMIT;
use pyo3::prelude::*;
use std::path::PathBuf;

/// What to scan and how to report it.
struct Asked {
    pids: Vec<i32>,
    cgroup: Option<PathBuf>,
    all: bool,
    buckets: usize,
    max_ptes_none: Option<u32>,
}

fn scan_json(asked: &Asked) -> Result<String> {
    let selection = match (&asked.pids[..], &asked.cgroup, asked.all) {
        ([_, ..], None, false) => Selection::Pids(asked.pids.clone()),
        ([], Some(cg), false) => Selection::Cgroup(cg.clone()),
        ([], None, true) => Selection::All,
        _ => bail!(
            "say what to scan: pid=P (or a list of pids), cgroup=PATH or all=True (exactly one)"
        ),
    };
    if !(1..=512).contains(&asked.buckets) {
        bail!("buckets: {} is not in 1..=512", asked.buckets);
    }
    if let Some(n) = asked
        .max_ptes_none
        .filter(|&n| u64::from(n) > MAX_PTES_LIMIT)
    {
        bail!("max_ptes_none {n}: the kernel accepts 0 to {MAX_PTES_LIMIT}");
    }
    report::require_root()?;
    let mut settings = shrinker_settings()?;
    settings.max_ptes_none = asked.max_ptes_none.unwrap_or(settings.max_ptes_none);
    let opts = ScanOptions {
        content: true,
        ..ScanOptions::default()
    };
    let scanned = scan_selected(&selection, &opts)?;
    let choices = Choices {
        cgroup: asked.cgroup.as_deref(),
        all: asked.all,
        content: true,
        buckets: asked.buckets,
        rollup: false,
        top: None,
        top_given: false,
        all_vmas: false,
    };
    let report = ScanReport::compute(&choices, scanned, settings, &[]);
    Ok(report::to_json(&report).to_string())
}

/// Scans the processes `pids`, or those of `cgroup` (a cgroup directory),
/// or every process (`all`): `hugelab scan --json`'s document.
#[pyfunction]
#[pyo3(signature = (pids, cgroup, all, buckets, max_ptes_none))]
pub fn scan(
    py: Python<'_>,
    pids: Vec<i32>,
    cgroup: Option<PathBuf>,
    all: bool,
    buckets: usize,
    max_ptes_none: Option<u32>,
) -> PyResult<String> {
    let asked = Asked {
        pids,
        cgroup,
        all,
        buckets,
        max_ptes_none,
    };
    py.detach(|| scan_json(&asked))
        .map_err(|e| crate::to_py(py, e))
}
