//! The seam between the workload and a machine: the `Backend` trait.
//!
//! A backend executes the statements that change the machine and reports its
//! counters when asked; [`run`] drives it through a workload, taking snapshots
//! and checking `expect` lines. `run`, `diff`, `compare` and the tests are all
//! consumers of the same [`Observation`], so a backend never formats output.

use crate::ast::{Pos, Stmt, StmtKind, Workload};
use crate::observation::{Counters, ExpectOutcome, Observation, Snapshot};
use std::collections::BTreeMap;
use std::fmt;

/// Why a backend could not execute a statement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendErrorKind {
    /// The statement is valid but this backend does not (yet) execute it.
    Unsupported,
    /// The statement failed on this machine (ENOMEM, EINVAL, out of memory...).
    Failed,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendError {
    pub pos: Pos,
    pub kind: BackendErrorKind,
    pub message: String,
}

impl BackendError {
    pub fn unsupported(stmt: &Stmt, backend: &str, what: impl fmt::Display) -> Self {
        BackendError {
            pos: stmt.pos,
            kind: BackendErrorKind::Unsupported,
            message: format!("{what} is not supported by the {backend} backend yet"),
        }
    }

    pub fn failed(pos: Pos, message: impl Into<String>) -> Self {
        BackendError {
            pos,
            kind: BackendErrorKind::Failed,
            message: message.into(),
        }
    }
}

/// An error of a whole run, carrying the workload's file name for `file:line:col`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{}:{}: {}", .error.pos.line, .error.pos.col, .error.message)]
pub struct RunError {
    pub file: String,
    pub error: BackendError,
}

/// A machine that executes workload statements: the model or the real kernel.
pub trait Backend {
    /// Short name used in output and errors (`model`, `kernel`).
    fn name(&self) -> &str;

    /// Executes one statement. Never called with `snapshot` or `expect`, which
    /// [`run`] handles through [`Backend::counters`].
    fn execute(&mut self, stmt: &Stmt) -> Result<(), BackendError>;

    /// Every counter this backend reports, as of now.
    fn counters(&mut self) -> Result<Counters, BackendError>;

    /// Called once before the first statement, with the whole workload.
    fn prepare(&mut self, _workload: &Workload) -> Result<(), BackendError> {
        Ok(())
    }

    /// Counters this backend has but cannot read reliably right now, with the
    /// reason; asked right after [`Backend::counters`]. None by default.
    fn unknown(&mut self) -> BTreeMap<String, String> {
        BTreeMap::new()
    }
}

/// Runs a workload to its end on `backend`. Snapshots are taken at every
/// `snapshot` statement and at the end (label `end`); `expect` lines are
/// evaluated against the counters at their place. A failed expectation does
/// not stop the run; a statement the backend cannot execute does.
pub fn run(backend: &mut dyn Backend, workload: &Workload) -> Result<Observation, RunError> {
    let mut obs = Observation {
        backend: backend.name().to_string(),
        workload: workload.file.clone(),
        snapshots: Vec::new(),
        expects: Vec::new(),
    };
    let wrap = |error| RunError {
        file: workload.file.clone(),
        error,
    };
    backend.prepare(workload).map_err(wrap)?;
    let mut end = Pos::default();
    for stmt in &workload.stmts {
        end = stmt.pos;
        match &stmt.kind {
            StmtKind::Snapshot { label } => {
                let counters = backend.counters().map_err(wrap)?;
                obs.snapshots.push(Snapshot {
                    label: label.clone(),
                    line: Some(stmt.pos.line),
                    counters,
                    unknown: backend.unknown(),
                });
            }
            StmtKind::Expect { counter, op, value } => {
                let counters = backend.counters().map_err(wrap)?;
                let unknown = backend.unknown();
                obs.expects.push(ExpectOutcome::evaluate(
                    stmt.pos, counter, *op, *value, &counters, &unknown,
                ));
            }
            _ => backend.execute(stmt).map_err(wrap)?,
        }
    }
    let counters = backend.counters().map_err(|mut e| {
        e.pos = end;
        wrap(e)
    })?;
    obs.snapshots.push(Snapshot {
        label: "end".to_string(),
        line: None,
        counters,
        unknown: backend.unknown(),
    });
    Ok(obs)
}
