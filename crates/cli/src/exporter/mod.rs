//! `hugelab exporter`: the machine's huge pages for Prometheus, on
//! `/metrics` (or written for node_exporter's textfile collector).
//!
//! Laid out in small parts:
//! - `figures.rs`: what one pass of the content scan found, per memory
//!   cgroup (folio sizes, the utilization histogram, the shrinker's give-back)
//!   and what the pass cost;
//! - `scan_loop.rs`: the scanner thread, which walks every process once per
//!   interval under a CPU-time budget and publishes each complete pass;
//! - `metrics.rs`: the exposition (Prometheus text format 0.0.4), names,
//!   types, units and HELP texts from the counter registry;
//! - `serve.rs`: the HTTP endpoint and the textfile writer;
//! - `dashboard_check.rs` (tests only): contrib/grafana/hugelab.json's
//!   queries against the metrics the endpoint exposes.
//!
//! The machine's counters (vmstat, mTHP stats, khugepaged, HugeTLB pools)
//! are read at each scrape, from the kernel crate's [`SystemReader`]
//! (without folding the per-cpu deltas: the exporter writes nothing); the
//! per-cgroup figures come from the last complete scan, with its age.
//! Nothing is changed on the machine, so nothing needs restoring on any
//! exit.
//!
//! [`SystemReader`]: hugelab_kernel::vmstat::SystemReader

#[cfg(test)]
mod dashboard_check;
mod figures;
mod metrics;
mod scan_loop;
mod serve;

use anyhow::{bail, Context, Result};
use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Args)]
pub struct ExporterArgs {
    /// Address and port to serve /metrics on [default: 127.0.0.1:9853]
    /// (loopback unless told otherwise; port 0 picks a free one; the address
    /// served is printed at start).
    #[arg(long, value_name = "ADDR:PORT", conflicts_with = "textfile")]
    listen: Option<String>,
    /// How often the page contents are scanned (e.g. 60s, 5m).
    #[arg(long, value_name = "DURATION", default_value = "60s")]
    interval: String,
    /// Memory cgroups are reported to this depth below the root; a deeper
    /// cgroup's processes count in its ancestor at this depth.
    #[arg(long, value_name = "N", default_value_t = 2)]
    cgroup_depth: usize,
    /// Instead of serving, write DIR/hugelab.prom (atomically) after every
    /// scan, for node_exporter's textfile collector.
    #[arg(long, value_name = "DIR")]
    textfile: Option<PathBuf>,
    /// With --textfile: write once, after the first complete scan, and end.
    #[arg(long, requires = "textfile")]
    once: bool,
    /// CPU time the exporter may use, in percent of one CPU, averaged over
    /// each scan (the scan waits between processes to keep within it).
    #[arg(long, value_name = "PCT", default_value_t = 2.0)]
    cpu_budget: f64,
}

/// The checked arguments.
pub struct Config {
    pub interval: Duration,
    pub depth: usize,
    /// CPU seconds per second.
    pub budget: f64,
}

/// Loopback, and the port the exporter is known by.
const DEFAULT_LISTEN: &str = "127.0.0.1:9853";

/// The file --textfile writes in its directory.
const TEXTFILE: &str = "hugelab.prom";

pub fn main(args: ExporterArgs) -> Result<ExitCode> {
    let (config, listen) = check_args(&args)?;
    if let Some(dir) = &args.textfile {
        serve::check_textfile_dir(dir)?;
    }
    hugelab_kernel::guard::require_root(
        "hugelab exporter needs root: page frame numbers in /proc/PID/pagemap, /proc/kpageflags and other processes' /proc/PID/mem are root-only",
    )?;
    let shared = scan_loop::start(&config).context("starting the scanner thread")?;
    match &args.textfile {
        Some(dir) => serve::write_textfiles(&shared, &config, &dir.join(TEXTFILE), args.once)?,
        None => serve::serve(&shared, &config, listen)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// The argument checks that need no root: one sentence each.
fn check_args(args: &ExporterArgs) -> Result<(Config, SocketAddr)> {
    let text = args.listen.as_deref().unwrap_or(DEFAULT_LISTEN);
    let listen: SocketAddr = text.parse().map_err(|_| {
        anyhow::anyhow!(
            "--listen {text:?} is not an address and port: give one such as 127.0.0.1:9853 (or [::1]:9853)"
        )
    })?;
    let interval = humantime::parse_duration(&args.interval).map_err(|e| {
        anyhow::anyhow!(
            "--interval {:?} is not a duration ({e}): give one such as 60s or 5m",
            args.interval
        )
    })?;
    if interval < Duration::from_secs(1) {
        bail!(
            "--interval {}: scans must be at least 1s apart",
            args.interval
        );
    }
    if !(args.cpu_budget > 0.0 && args.cpu_budget <= 100.0) {
        bail!(
            "--cpu-budget {}: give a percentage of one CPU above 0 and at most 100",
            args.cpu_budget
        );
    }
    Ok((
        Config {
            interval,
            depth: args.cgroup_depth,
            budget: args.cpu_budget / 100.0,
        },
        listen,
    ))
}
