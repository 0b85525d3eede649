//! The seam between the workload and a machine: the `Backend` trait.
//!
//! A backend executes the statements that change the machine and reports its
//! counters when asked; [`run`] drives it through a workload, taking snapshots
//! and checking `expect` lines. `run`, `diff`, `compare` and the tests are all
//! consumers of the same [`Observation`], so a backend never formats output.

use crate::ast::{Errno, Pos, Stmt, StmtKind, Workload};
use crate::observation::{ExpectOutcome, FailedCall, Observation, Reading, Snapshot};
use std::fmt;

/// Why a backend could not execute a statement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendErrorKind {
    /// The statement is valid but this backend does not (yet) execute it:
    /// the run stops.
    Unsupported,
    /// The machine could not run the statement at all (an agent died, a
    /// kernel file could not be read, a process touched memory it has not
    /// mapped): the run stops.
    Failed,
    /// The system call the statement stands for returned this errno, as a
    /// program would see it: the run goes on, and `expect errno` can check it.
    Errno(Errno),
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

    /// The statement's system call failed with `errno`; `message` says which
    /// call, for people (`madvise(MADV_COLLAPSE) failed: EAGAIN`).
    pub fn errno(stmt: &Stmt, errno: Errno, message: impl fmt::Display) -> Self {
        BackendError {
            pos: stmt.pos,
            kind: BackendErrorKind::Errno(errno),
            message: format!("{message}: {errno}"),
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
///
/// [`run`] pushes statements in through [`Backend::execute`] and pulls one
/// [`Reading`] after a statement when a `snapshot` or `expect` needs it; the
/// reading is reused until the next statement executes, so a backend is read
/// at most once per statement however many lines check it.
pub trait Backend {
    /// Short name used in output and errors (`model`, `kernel`).
    fn name(&self) -> &str;

    /// Executes one statement. Never called with `snapshot` or `expect`.
    /// A failed system call is `Err` with [`BackendErrorKind::Errno`], after
    /// the backend has accounted for whatever the call did before failing.
    fn execute(&mut self, stmt: &Stmt) -> Result<(), BackendError>;

    /// Executes one statement as [`Backend::execute`] does and, when it ends
    /// a region (a `munmap` after which nothing of it is mapped) or a
    /// process (`exit`), adds to `gone` their counters as of right after the
    /// statement ([`Reading::absorb`]): the last values of names that later
    /// readings no longer have, and that `expect` lines may still ask for.
    /// [`run`] calls this one, with everything gone so far. The default
    /// executes and adds nothing.
    fn execute_retiring(&mut self, stmt: &Stmt, gone: &mut Reading) -> Result<(), BackendError> {
        let _ = gone;
        self.execute(stmt)
    }

    /// Every counter this backend reports as of now, and those it has but
    /// cannot read reliably. Names are the registry's ([`crate::counters`]).
    fn read(&mut self) -> Result<Reading, BackendError>;

    /// Called once before the first statement, with the whole workload.
    fn prepare(&mut self, _workload: &Workload) -> Result<(), BackendError> {
        Ok(())
    }
}

/// The reading of now: the one taken since the last statement, or a new one.
fn current<'r>(
    backend: &mut dyn Backend,
    reading: &'r mut Option<Reading>,
) -> Result<&'r Reading, BackendError> {
    if reading.is_none() {
        let r = backend.read()?;
        debug_assert_eq!(
            r.counters
                .keys()
                .chain(r.unknown.keys())
                .find(|name| crate::counters::lookup(name).is_none()),
            None,
            "{} reports a counter the registry does not describe",
            backend.name()
        );
        *reading = Some(r);
    }
    Ok(reading.as_ref().expect("just set"))
}

/// Runs a workload to its end on `backend`. Snapshots are taken at every
/// `snapshot` statement and at the end (label `end`); `expect` lines are
/// evaluated against the counters at their place (those of a region or
/// process that is gone: against their last values, which snapshots do not
/// show), `expect errno` against the outcome of the statement before it. A
/// failed expectation or a failed system call does not stop the run; a
/// statement the backend cannot execute does.
pub fn run(backend: &mut dyn Backend, workload: &Workload) -> Result<Observation, RunError> {
    let mut obs = Observation {
        backend: backend.name().to_string(),
        workload: workload.file.clone(),
        snapshots: Vec::new(),
        expects: Vec::new(),
        failed_calls: Vec::new(),
    };
    let wrap = |error| RunError {
        file: workload.file.clone(),
        error,
    };
    backend.prepare(workload).map_err(wrap)?;
    let mut end = Pos::default();
    let mut reading: Option<Reading> = None;
    // What gone regions and processes left: counters no reading has any more.
    let mut gone = Reading::default();
    let mut errno = Errno::OK;
    for stmt in &workload.stmts {
        end = stmt.pos;
        match &stmt.kind {
            StmtKind::Snapshot { label } => {
                let r = current(backend, &mut reading).map_err(wrap)?;
                obs.snapshots.push(Snapshot {
                    label: label.clone(),
                    line: Some(stmt.pos.line),
                    counters: r.counters.clone(),
                    unknown: r.unknown.clone(),
                });
            }
            StmtKind::Expect { counter, op, value } => {
                let r = current(backend, &mut reading).map_err(wrap)?;
                let r = if r.has(counter) { r } else { &gone };
                obs.expects
                    .push(ExpectOutcome::evaluate(stmt.pos, counter, *op, *value, r));
            }
            StmtKind::ExpectErrno { errno: expected } => {
                obs.expects
                    .push(ExpectOutcome::evaluate_errno(stmt.pos, *expected, errno));
            }
            _ => {
                reading = None;
                errno = match backend.execute_retiring(stmt, &mut gone) {
                    Ok(()) => Errno::OK,
                    Err(BackendError {
                        kind: BackendErrorKind::Errno(e),
                        message,
                        ..
                    }) => {
                        obs.failed_calls.push(FailedCall {
                            line: stmt.pos.line,
                            col: stmt.pos.col,
                            statement: stmt.kind.to_string(),
                            errno: e,
                            message,
                        });
                        e
                    }
                    Err(e) => return Err(wrap(e)),
                };
            }
        }
    }
    let r = current(backend, &mut reading).map_err(|mut e| {
        e.pos = end;
        wrap(e)
    })?;
    obs.snapshots.push(Snapshot {
        label: "end".to_string(),
        line: None,
        counters: r.counters.clone(),
        unknown: r.unknown.clone(),
    });
    Ok(obs)
}
