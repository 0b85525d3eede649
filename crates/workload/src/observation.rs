//! The observation schema: what a backend reports and where.
//!
//! Counter names, kinds and units are those of the registry
//! ([`crate::counters`]). A backend reports every counter it models; a counter
//! it does not model is absent, never zero. A statement whose system call
//! failed is listed with its errno in [`Observation::failed_calls`], one
//! during which the kernel killed a process with the signal in
//! [`Observation::kills`].

use crate::ast::{CmpOp, Errno, Pos, Signal};
use serde::Serialize;
use std::collections::BTreeMap;

/// Counter name → value, sorted by name so that output is deterministic.
pub type Counters = BTreeMap<String, i64>;

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
    /// Of the `unknown` counters, those whose change since the snapshot
    /// before (or the start) the backend still knows: no window between
    /// the two was disturbed for them. A deterministic workload's change is
    /// the same in every run, so `diff` may add it to the value another run
    /// read at the snapshot before.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub changes: Counters,
}

/// The counters of a backend at one point, with those it has but could not
/// read reliably there. Taken once after a statement and used for every
/// `snapshot` and `expect` until the next statement runs.
///
/// What regions and processes leave behind when they go is not in it but in
/// [`crate::gone::Gone`], which `expect` falls back to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reading {
    pub counters: Counters,
    /// Counter → why it is unknown. Never also in `counters`.
    pub unknown: BTreeMap<String, String>,
    /// Of the `unknown` counters, those whose change since the latest
    /// [`crate::Backend::mark`] is known (see [`Snapshot::changes`]).
    pub changes: Counters,
}

impl Reading {
    /// Whether this reading has `counter`, as a number or as unknown.
    pub fn has(&self, counter: &str) -> bool {
        self.counters.contains_key(counter) || self.unknown.contains_key(counter)
    }
}

/// A statement whose system call failed: the workload went on after it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FailedCall {
    pub line: u32,
    pub col: u32,
    /// The statement as written (canonical form).
    pub statement: String,
    pub errno: Errno,
    /// What the backend said about it.
    pub message: String,
}

/// A statement during which a process was killed by a signal: the process
/// is gone from then on, as after `exit`, and the workload went on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Kill {
    pub line: u32,
    pub col: u32,
    /// The statement as written (canonical form).
    pub statement: String,
    /// The process that was killed.
    pub process: String,
    pub signal: Signal,
    /// What the backend said about it.
    pub message: String,
}

/// The outcome of one `expect` statement.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ExpectOutcome {
    pub line: u32,
    pub col: u32,
    /// The counter, or the sum as written (`vmstat.a + vmstat.b`), or
    /// `errno` or `signal`.
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
    pub fn evaluate(pos: Pos, counter: &str, op: CmpOp, expected: i64, reading: &Reading) -> Self {
        let actual = reading.counters.get(counter).copied();
        let unknown = reading.unknown.get(counter).cloned();
        Self::evaluate_value(pos, counter, op, expected, actual, unknown)
    }

    /// `expect counter op expected` against `actual` (`None`: not
    /// reported), or against nothing when the backend could not read it
    /// (`unknown`, with why).
    pub fn evaluate_value(
        pos: Pos,
        counter: &str,
        op: CmpOp,
        expected: i64,
        actual: Option<i64>,
        unknown: Option<String>,
    ) -> Self {
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
            unknown,
        }
    }

    /// `expect errno == E` against the errno of the statement before it.
    pub fn evaluate_errno(pos: Pos, expected: Errno, actual: Errno) -> Self {
        ExpectOutcome {
            line: pos.line,
            col: pos.col,
            counter: ERRNO.to_string(),
            op: CmpOp::Eq.symbol(),
            expected: expected.0.into(),
            actual: Some(actual.0.into()),
            passed: expected == actual,
            unknown: None,
        }
    }

    /// `expect signal == S` against the signal that killed the process of
    /// the statement before it (0: it was not killed).
    pub fn evaluate_signal(pos: Pos, expected: Signal, actual: Signal) -> Self {
        ExpectOutcome {
            line: pos.line,
            col: pos.col,
            counter: SIGNAL.to_string(),
            op: CmpOp::Eq.symbol(),
            expected: expected.0.into(),
            actual: Some(actual.0.into()),
            passed: expected == actual,
            unknown: None,
        }
    }

    /// A value of this expectation as people read it: errnos and signals by name.
    /// `file:line:col: expect C OP V failed: actual A`, for a failed one.
    pub fn failure(&self, file: &str) -> String {
        let actual = self
            .actual
            .map_or("not reported by this backend".to_string(), |a| self.show(a));
        format!(
            "{file}:{}:{}: expect {} {} {} failed: actual {actual}",
            self.line,
            self.col,
            self.counter,
            self.op,
            self.show(self.expected)
        )
    }

    pub fn show(&self, v: i64) -> String {
        if self.counter == ERRNO {
            Errno(v as i32).name()
        } else if self.counter == SIGNAL {
            Signal(v as i32).name()
        } else {
            v.to_string()
        }
    }
}

/// The pseudo-counter of `expect errno`.
pub const ERRNO: &str = "errno";

/// The pseudo-counter of `expect signal`.
pub const SIGNAL: &str = "signal";

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
    /// Statements whose system call failed, in order.
    pub failed_calls: Vec<FailedCall>,
    /// Statements during which a process was killed by a signal, in order.
    pub kills: Vec<Kill>,
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
