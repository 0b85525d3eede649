//! The arguments `run` and `diff` share: how the counters are printed and
//! which workload files run, with what checks. Their help is `run`'s;
//! `diff` says in its own words what differs for it (one JSON document,
//! the compared counters, each file run once per backend).

use clap::Args;
use std::path::PathBuf;

/// How the counters are printed.
#[derive(Args)]
pub struct CounterOutput {
    /// Print JSON instead of tables: JSON Lines, one compact document per
    /// workload, each on its own line (one workload: one JSON document).
    #[arg(long)]
    pub json: bool,
    /// Show every counter, not only those that are non-zero somewhere.
    #[arg(long)]
    pub all: bool,
}

/// The workload files to run, and whether the model checks itself.
#[derive(Args)]
pub struct WorkloadFiles {
    /// Check the model's invariants after every statement (slower): mapcounts
    /// against page tables, refcounts against mappings and pins, the anon and
    /// page-table counters, and that every frame is free or accounted for.
    #[arg(long)]
    pub check: bool,
    /// Workload files (.hlw, or compressed: .hlw.gz, .hlw.zst), each read
    /// as a stream: a statement runs as soon as it is read and checked.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
}
