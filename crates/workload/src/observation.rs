//! The observation schema: what a backend reports and where.
//!
//! Counter names mirror the kernel files they are read from (DESIGN.md, table
//! "Counter names"): `vmstat.<name>`, `mthp.<size>.<stat>`, `meminfo.<field>`,
//! `smaps.<proc>.<field>`, `smaps.<proc>.<region>.<field>`,
//! `folios.<proc>.<region>.<size>[.pmd|.pte]`, `hugetlb.<size>.<file>`,
//! `memcg.<cg>.<file>`, `stat.<proc>.minflt` (the faults the process's
//! accesses took, /proc/PID/stat) and `khugepaged.pages_collapsed`. Event counters are deltas since the workload started;
//! gauges are absolute. A backend reports every counter it models; a counter it
//! does not model is absent, never zero.

use crate::ast::{CmpOp, Pos};
use serde::Serialize;
use std::collections::BTreeMap;

/// Counter name → value, sorted by name so that output is deterministic.
pub type Counters = BTreeMap<String, i64>;

/// Whether a counter counts events (reported as a delta over the workload) or
/// is a gauge (reported as its current value).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CounterKind {
    Event,
    Gauge,
}

/// The kind of a counter, from its name. Events are the kernel's event counters
/// (`thp_*`, `pgfault`, per-size `anon_fault_*`, `split*`, `swp*`); everything
/// else (nr_*, meminfo, smaps, folios, pools) is a gauge.
pub fn counter_kind(name: &str) -> CounterKind {
    let leaf = name.rsplit('.').next().unwrap_or(name);
    let event = match name.split('.').next() {
        Some("vmstat") => !leaf.starts_with("nr_"),
        Some("mthp") => !leaf.starts_with("nr_"),
        // /proc/PID/stat minflt and khugepaged's pages_collapsed.
        Some("stat") | Some("khugepaged") => true,
        _ => false,
    };
    if event {
        CounterKind::Event
    } else {
        CounterKind::Gauge
    }
}

/// The counters at one point of the workload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Snapshot {
    pub label: String,
    /// Where the `snapshot` statement is; `None` for the implicit `end`.
    pub line: Option<u32>,
    pub counters: Counters,
    /// Counters the backend has but could not read reliably here, with why
    /// (a kernel reading disturbed by another process, kpageflags reading 0...).
    /// They are absent from `counters`: unknown is not a number.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub unknown: BTreeMap<String, String>,
}

/// The outcome of one `expect` statement.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ExpectOutcome {
    pub line: u32,
    pub col: u32,
    pub counter: String,
    pub op: &'static str,
    pub expected: i64,
    /// `None` when the backend does not report this counter.
    pub actual: Option<i64>,
    pub passed: bool,
    /// Why the counter could not be read, when the backend has it but not
    /// reliably: the expectation is then neither passed nor failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unknown: Option<String>,
}

impl ExpectOutcome {
    pub fn evaluate(
        pos: Pos,
        counter: &str,
        op: CmpOp,
        expected: u64,
        counters: &Counters,
        unknown: &BTreeMap<String, String>,
    ) -> Self {
        let expected = i64::try_from(expected).unwrap_or(i64::MAX);
        let actual = counters.get(counter).copied();
        let passed = actual.is_some_and(|a| match op {
            CmpOp::Eq => a == expected,
            CmpOp::Le => a <= expected,
            CmpOp::Ge => a >= expected,
        });
        ExpectOutcome {
            line: pos.line,
            col: pos.col,
            counter: counter.to_string(),
            op: op.symbol(),
            expected,
            actual,
            passed,
            unknown: unknown.get(counter).cloned(),
        }
    }
}

impl CmpOp {
    pub fn symbol(self) -> &'static str {
        match self {
            CmpOp::Eq => "==",
            CmpOp::Le => "<=",
            CmpOp::Ge => ">=",
        }
    }
}

/// Everything one backend reported for one workload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Observation {
    pub backend: String,
    pub workload: String,
    pub snapshots: Vec<Snapshot>,
    pub expects: Vec<ExpectOutcome>,
}

impl Observation {
    /// Expectations that failed: not passed, and not on an unknown counter.
    pub fn failed_expects(&self) -> impl Iterator<Item = &ExpectOutcome> {
        self.expects
            .iter()
            .filter(|e| !e.passed && e.unknown.is_none())
    }

    /// Expectations on counters the backend could not read reliably.
    pub fn unknown_expects(&self) -> impl Iterator<Item = &ExpectOutcome> {
        self.expects.iter().filter(|e| e.unknown.is_some())
    }

    pub fn snapshot(&self, label: &str) -> Option<&Snapshot> {
        self.snapshots.iter().find(|s| s.label == label)
    }
}
