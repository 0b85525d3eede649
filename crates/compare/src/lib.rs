//! Workloads on the model, computed once for the `hugelab` command and the
//! Python package: `compare` (and `predict`'s and `bench`'s settings),
//! `explain` and `utilization`'s model side.
//!
//! - [`setting`]: a setting (`NAME:TUNABLE=VALUE,...`), parsed as `set`
//!   statements, and a workload run under it on a backend, the workload's own
//!   prelude `set`s of the setting's tunables dropped (docs/language.md,
//!   "Settings over a workload");
//! - [`compare`]: the workload under each setting on a fresh model, the
//!   compared snapshot's counters per setting, the summary in the terms of
//!   the multi-size THP series' tables, and the notes on identical columns;
//! - [`explain`]: each statement's faults grouped by their chain of
//!   decisions, its collapses by outcome (`explain`, `predict --why`);
//! - [`utilization`]: a workload run up to a snapshot, its folios scanned
//!   and reported (`utilization` on the model);
//! - [`machine`]: a machine shape (`memory=`, `fragment=`) as the
//!   statements that make it, run before the workload.
//!
//! The model is pure and the CLI prints; this crate runs and computes, so
//! that the CLI's tables and the Python package's DataFrames hold the same
//! figures.

pub mod compare;
pub mod explain;
pub mod machine;
pub mod setting;
pub mod utilization;

pub use compare::{compare, run_on_model, Comparison, StmtStream, Summary};
pub use setting::{parse_setting, parse_settings, Setting};
