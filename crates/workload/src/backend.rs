//! The seam between the workload and a machine: the `Backend` trait.
//!
//! A backend executes the statements that change the machine and reports its
//! counters when asked; [`run_stream`] drives it through a workload as its
//! statements come (from a [`crate::parse::Statements`] stream, or a parsed
//! [`Workload`] with [`run`]), taking snapshots and checking `expect` lines.
//! `run`, `diff`, `compare` and the tests are all consumers of the same
//! [`Observation`], so a backend never formats output.

use crate::ast::{Errno, Pos, Signal};
use crate::gone::{Gone, Last};
use crate::observation::{ExpectOutcome, FailedCall, Kill, Observation, Reading, Snapshot};
use crate::parse::{open, stream_file, ParseError, MAX_LINE};
use crate::stmt::{self, Stmt, StmtKind, Workload};
use std::borrow::Borrow;
use std::collections::HashMap;
use std::fmt;
use std::io::{BufRead, Read};
use std::path::Path;

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
    /// The machine cannot run this workload now, for a reason that is its
    /// state, not the workload's (a 1 GiB HugeTLB pool the kernel could not
    /// fill: memory too fragmented): the run stops, and `diff` and the
    /// scenario tests report the workload as skipped with the reason.
    Unavailable,
    /// The kernel killed process `proc` with `signal` during the statement
    /// (SIGBUS: a HugeTLB fault with no page in the pool). The backend has
    /// retired the process as `exit` does (its last counters are in the
    /// `Gone` it was given): the run goes on, and `expect signal` can check it.
    Killed { proc: String, signal: Signal },
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

impl BackendError {
    /// The machine cannot run the workload now; `reason` says why, as one
    /// sentence (`the kernel gave 1 of 2 1 GiB pages`).
    pub fn unavailable(stmt: &Stmt, reason: impl fmt::Display) -> Self {
        BackendError {
            pos: stmt.pos,
            kind: BackendErrorKind::Unavailable,
            message: format!("cannot run on this machine now: {reason}"),
        }
    }

    /// Process `proc` was killed by `signal` during the statement; `message`
    /// says how, for people (`b was killed by SIGBUS`).
    pub fn killed(stmt: &Stmt, proc: &str, signal: Signal, message: impl Into<String>) -> Self {
        BackendError {
            pos: stmt.pos,
            kind: BackendErrorKind::Killed {
                proc: proc.to_string(),
                signal,
            },
            message: message.into(),
        }
    }
}

/// An error that stopped a run, as `file:line:col: message`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RunError {
    /// The workload is wrong at a statement that had not run yet: a streamed
    /// run finds it when it gets there, after the statements before it ran.
    #[error(transparent)]
    Parse(#[from] ParseError),
    /// The backend could not execute a statement (or read its counters).
    #[error("{file}:{}:{}: {}", .error.pos.line, .error.pos.col, .error.message)]
    Backend { file: String, error: BackendError },
}

impl RunError {
    /// Whether the run stopped at a statement the backend does not execute
    /// ([`BackendErrorKind::Unsupported`]: a model-only `machine memory=` or
    /// `fragment` on the kernel).
    pub fn is_unsupported(&self) -> bool {
        matches!(
            self,
            RunError::Backend {
                error: BackendError {
                    kind: BackendErrorKind::Unsupported,
                    ..
                },
                ..
            }
        )
    }

    /// Whether the run stopped because the machine cannot run the workload
    /// now ([`BackendErrorKind::Unavailable`]): a skip, not a failure.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            RunError::Backend {
                error: BackendError {
                    kind: BackendErrorKind::Unavailable,
                    ..
                },
                ..
            }
        )
    }
}

/// What a backend may need to know about a whole workload before its first
/// statement, which a streamed run has not read yet: gathered from a parsed
/// workload ([`Lookahead::of`]) or by a cheap first pass over the text
/// ([`Lookahead::scan`]), for backends that ask ([`Backend::needs_lookahead`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lookahead {
    /// The workload has a `reclaim` statement.
    pub reclaims: bool,
}

impl Lookahead {
    pub fn of(stmts: &[Stmt]) -> Lookahead {
        Lookahead {
            reclaims: stmts.iter().any(|s| s.kind == StmtKind::Reclaim),
        }
    }

    /// A pass over workload text that parses nothing: a line whose first
    /// word is `reclaim` counts as a `reclaim` statement (were the line bad,
    /// or the workload to stop before it, the backend prepared for nothing).
    /// Reads the text in memory bounded by the longest line it keeps.
    pub fn scan(file: &str, mut reader: impl BufRead) -> Result<Lookahead, ParseError> {
        let mut ahead = Lookahead::default();
        let mut line = Vec::with_capacity(256);
        loop {
            line.clear();
            let n = (&mut reader)
                .take(MAX_LINE as u64)
                .read_until(b'\n', &mut line)
                .map_err(|e| ParseError {
                    file: file.to_string(),
                    line: 0,
                    col: 0,
                    message: format!("cannot read: {e}"),
                })?;
            if n == 0 {
                return Ok(ahead);
            }
            let code = line.split(|&b| b == b'#').next().unwrap_or(&[]);
            let first = code
                .split(|&b| matches!(b, b' ' | b'\t' | b'\r' | b'\n'))
                .find(|word| !word.is_empty());
            if first == Some(b"reclaim") {
                ahead.reclaims = true;
            }
        }
    }
}

/// A machine that executes workload statements: the model or the real kernel.
///
/// [`run`] pushes statements in through [`Backend::execute`] and pulls one
/// [`Reading`] after a statement when a `snapshot` or `expect` needs it; the
/// reading is reused until the next statement executes, so a backend is read
/// at most once per statement however many lines check it. A backend that
/// can read one counter cheaply ([`Backend::read_counter`]) is asked for
/// just the counter of an `expect` instead.
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
    /// statement: the last values of names that later readings no longer
    /// have, and that `expect` lines may still ask for. [`run`] calls this
    /// one, with everything gone so far. The default executes and adds
    /// nothing.
    fn execute_retiring(&mut self, stmt: &Stmt, gone: &mut Gone) -> Result<(), BackendError> {
        let _ = gone;
        self.execute(stmt)
    }

    /// Every counter this backend reports as of now, and those it has but
    /// cannot read reliably. Names are the registry's ([`crate::counters`]).
    fn read(&mut self) -> Result<Reading, BackendError>;

    /// A snapshot was taken: a reading's [`Reading::changes`] are from here
    /// on. True when the backend's readings say changes (then the runner
    /// takes a new reading for what follows); the default says none.
    fn mark(&mut self) -> bool {
        false
    }

    /// One counter as of now, for an `expect` with no reading taken since
    /// the last statement: a [`Reading`] holding that counter (as a number
    /// or as unknown) or nothing when the backend does not report it.
    /// `None` when the backend can only read everything at once (the
    /// default): [`run`] then takes a whole reading. A backend whose readings
    /// are expensive answers this for the price of one counter, so an
    /// `expect` costs what it checks, not what the machine holds.
    fn read_counter(&mut self, _name: &str) -> Option<Result<Reading, BackendError>> {
        None
    }

    /// Called once before the first statement, with what the whole
    /// workload holds (a [`Lookahead`]).
    fn prepare(&mut self, _ahead: &Lookahead) -> Result<(), BackendError> {
        Ok(())
    }

    /// Whether [`Backend::prepare`] needs a true [`Lookahead`]: a run from a
    /// file ([`run_file`]) then reads it twice, once for the lookahead and
    /// once for its statements. Without, it is the default one.
    fn needs_lookahead(&self) -> bool {
        false
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

/// Runs a parsed workload to its end on `backend` (see [`run_stream`]).
pub fn run(backend: &mut dyn Backend, workload: &Workload) -> Result<Observation, RunError> {
    let ahead = Lookahead::of(&workload.stmts);
    run_stream(
        backend,
        &workload.file,
        &ahead,
        workload.stmts.iter().map(Ok),
    )
}

/// Runs a workload file (plain, `.gz` or `.zst`) on `backend` as a stream:
/// each statement runs as soon as it is parsed and checked, and memory does
/// not grow with the file (see [`crate::parse::Statements`]). A backend that
/// [needs a lookahead](Backend::needs_lookahead) gets one from a first pass.
pub fn run_file(backend: &mut dyn Backend, path: &Path) -> Result<Observation, RunError> {
    run_file_counted(backend, path).map(|(obs, _)| obs)
}

/// [`run_file`], and how many statements it read (snapshots and
/// expectations included).
pub fn run_file_counted(
    backend: &mut dyn Backend,
    path: &Path,
) -> Result<(Observation, u64), RunError> {
    let stmts = stream_file(path)?;
    let ahead = if backend.needs_lookahead() {
        Lookahead::scan(stmts.file(), open(path)?)?
    } else {
        Lookahead::default()
    };
    let file = stmts.file().to_string();
    let mut read = 0u64;
    let counted = stmts.inspect(|s| read += u64::from(s.is_ok()));
    let obs = run_stream(backend, &file, &ahead, counted)?;
    Ok((obs, read))
}

/// Runs statements on `backend` as they come, to the end of `stmts`.
/// Snapshots are taken at every `snapshot` statement and at the end (label
/// `end`); `expect` lines are evaluated against the counters at their place
/// (those of a region or process that is gone: against their last values,
/// which snapshots do not show), `expect errno` and `expect signal` against
/// the outcome of the statement before it. A failed expectation, a failed
/// system call and a process killed by a signal do not stop the run; a
/// statement the backend cannot execute does, and so does an error in
/// `stmts` (a parse or check error of a streamed workload, found when the
/// run gets to it: the statements before it have run).
///
/// A killed process is gone, as after `exit`. The checker learns it from an
/// `expect signal == <SIGNAL>` right after the statement (and then frees its
/// name); a statement that names a killed process no such line declared
/// stops the run with a message saying so. When an `expect signal ==
/// <SIGNAL>` finds the process alive, the expectation fails and the process
/// is ended as by `exit`, so that what follows finds it gone, as it says.
///
/// `backend.prepare` gets `ahead`; `file` names the workload in errors and
/// in the observation. Nothing is kept per statement but the observation's
/// own snapshots, expectations, failed calls and kills.
pub fn run_stream<S: Borrow<Stmt>>(
    backend: &mut dyn Backend,
    file: &str,
    ahead: &Lookahead,
    stmts: impl IntoIterator<Item = Result<S, ParseError>>,
) -> Result<Observation, RunError> {
    let wrap = |error| RunError::Backend {
        file: file.to_string(),
        error,
    };
    backend.prepare(ahead).map_err(wrap)?;
    let mut run = Run {
        obs: Observation {
            backend: backend.name().to_string(),
            workload: file.to_string(),
            snapshots: Vec::new(),
            expects: Vec::new(),
            failed_calls: Vec::new(),
            kills: Vec::new(),
        },
        backend,
        reading: None,
        gone: Gone::default(),
        last: Outcome::default(),
        undeclared: HashMap::new(),
    };
    let mut end = Pos::default();
    for stmt in stmts {
        let stmt = stmt?;
        let stmt: &Stmt = stmt.borrow();
        end = stmt.pos;
        run.stmt(stmt).map_err(wrap)?;
    }
    let r = current(run.backend, &mut run.reading).map_err(|mut e| {
        e.pos = end;
        wrap(e)
    })?;
    run.obs.snapshots.push(Snapshot {
        label: "end".to_string(),
        line: None,
        counters: r.counters.clone(),
        unknown: r.unknown.clone(),
        changes: r.changes.clone(),
    });
    Ok(run.obs)
}

/// A run between two statements: the observation so far and what the
/// statements after need of those before.
struct Run<'b> {
    backend: &'b mut dyn Backend,
    obs: Observation,
    /// The reading as of now, if one was taken since the last statement
    /// that ran something.
    reading: Option<Reading>,
    /// What gone regions and processes left: counters no reading has any more.
    gone: Gone,
    /// The outcome of the last statement that ran something.
    last: Outcome,
    /// Processes killed that no `expect signal` has declared: the checker
    /// still takes them as alive. Name → (line, signal).
    undeclared: HashMap<String, (u32, Signal)>,
}

impl Run<'_> {
    /// One statement: a snapshot or an expectation is taken here, every
    /// other statement runs on the backend.
    fn stmt(&mut self, stmt: &Stmt) -> Result<(), BackendError> {
        match &stmt.kind {
            StmtKind::Snapshot(stmt::Snapshot { label }) => {
                let r = current(self.backend, &mut self.reading)?;
                self.obs.snapshots.push(Snapshot {
                    label: label.clone(),
                    line: Some(stmt.pos.line),
                    counters: r.counters.clone(),
                    unknown: r.unknown.clone(),
                    changes: r.changes.clone(),
                });
                // The next snapshot's changes are from here: a reading
                // taken before the mark would say them from the last one.
                if self.backend.mark() {
                    self.reading = None;
                }
            }
            StmtKind::Expect(e) => self.expect(stmt.pos, e)?,
            StmtKind::ExpectErrno(stmt::ExpectErrno { errno: expected }) => {
                self.obs.expects.push(ExpectOutcome::evaluate_errno(
                    stmt.pos,
                    *expected,
                    self.last.errno,
                ));
            }
            StmtKind::ExpectSignal(e) => self.expect_signal(stmt.pos, e)?,
            _ => self.execute(stmt)?,
        }
        Ok(())
    }

    /// `expect <counter> [+ <counter>]... <op> <value>`
    fn expect(&mut self, pos: Pos, e: &stmt::Expect) -> Result<(), BackendError> {
        let stmt::Expect {
            counters,
            op,
            value,
        } = e;
        let outcome = match counters.as_slice() {
            [counter] => {
                let one = match self.reading {
                    Some(_) => None,
                    None => self.backend.read_counter(counter).transpose()?,
                };
                let r = match &one {
                    Some(one) => one,
                    None => current(self.backend, &mut self.reading)?,
                };
                let (actual, unknown) = term(r, &self.gone, counter);
                ExpectOutcome::evaluate_value(pos, counter, *op, *value, actual, unknown)
            }
            terms => {
                let r = current(self.backend, &mut self.reading)?;
                let (actual, unknown) = sum(r, &self.gone, terms);
                let text = terms.join(" + ");
                ExpectOutcome::evaluate_value(pos, &text, *op, *value, actual, unknown)
            }
        };
        self.obs.expects.push(outcome);
        Ok(())
    }

    /// `expect signal == <SIGNAL>|0`
    fn expect_signal(&mut self, pos: Pos, e: &stmt::ExpectSignal) -> Result<(), BackendError> {
        let expected = e.signal;
        self.obs.expects.push(ExpectOutcome::evaluate_signal(
            pos,
            expected,
            self.last.signal,
        ));
        if let (true, Some(proc)) = (expected != Signal::NONE, &self.last.proc) {
            // The checker takes the process as gone from here on.
            if self.undeclared.remove(proc).is_none() && self.last.signal == Signal::NONE {
                self.reading = None;
                let exit = Stmt {
                    pos,
                    kind: StmtKind::Exit(stmt::Exit { proc: proc.clone() }),
                };
                self.backend.execute_retiring(&exit, &mut self.gone)?;
            }
        }
        Ok(())
    }

    /// A statement that runs something: its failed call or kill is recorded.
    fn execute(&mut self, stmt: &Stmt) -> Result<(), BackendError> {
        if let Some((proc, (line, signal))) = stmt
            .kind
            .process()
            .and_then(|p| self.undeclared.get_key_value(p))
        {
            return Err(BackendError::failed(
                stmt.pos,
                format!(
                    "process '{proc}' was killed by {signal} at line {line}; a workload that expects it says `expect signal == {signal}` right after that line, and then no longer names '{proc}' (or gives the name to a new process)"
                ),
            ));
        }
        self.reading = None;
        self.last = Outcome {
            proc: stmt.kind.process().map(str::to_string),
            ..Outcome::default()
        };
        match self.backend.execute_retiring(stmt, &mut self.gone) {
            Ok(()) => {}
            Err(BackendError {
                kind: BackendErrorKind::Errno(e),
                message,
                ..
            }) => {
                self.obs.failed_calls.push(FailedCall {
                    line: stmt.pos.line,
                    col: stmt.pos.col,
                    statement: stmt.kind.to_string(),
                    errno: e,
                    message,
                });
                self.last.errno = e;
            }
            Err(BackendError {
                kind: BackendErrorKind::Killed { proc, signal },
                message,
                ..
            }) => {
                self.obs.kills.push(Kill {
                    line: stmt.pos.line,
                    col: stmt.pos.col,
                    statement: stmt.kind.to_string(),
                    process: proc.clone(),
                    signal,
                    message,
                });
                if self.last.proc.as_deref() == Some(proc.as_str()) {
                    self.last.signal = signal;
                }
                self.undeclared.insert(proc, (stmt.pos.line, signal));
            }
            Err(e) => return Err(e),
        }
        Ok(())
    }
}

/// What the last statement that ran something did: its errno, and the
/// signal that killed its own process (0: none).
#[derive(Default)]
struct Outcome {
    proc: Option<String>,
    errno: Errno,
    signal: Signal,
}

/// One counter as of now: its value, or why it is unknown; neither when
/// the backend does not report it. A counter of a region or process that is
/// gone is its last value.
fn term(r: &Reading, gone: &Gone, counter: &str) -> (Option<i64>, Option<String>) {
    if !r.has(counter) {
        match gone.get(counter) {
            Some(Last::Value(v)) => return (Some(v), None),
            Some(Last::Unknown(why)) => return (None, Some(why.to_string())),
            None => {}
        }
    }
    (
        r.counters.get(counter).copied(),
        r.unknown.get(counter).cloned(),
    )
}

/// The sum of `terms` as of now: unknown when one of them is (with why),
/// not reported when one of them is not.
fn sum(r: &Reading, gone: &Gone, terms: &[String]) -> (Option<i64>, Option<String>) {
    let mut total: i64 = 0;
    let mut missing = false;
    for t in terms {
        match term(r, gone, t) {
            (_, Some(why)) => return (None, Some(format!("{t}: {why}"))),
            (Some(v), None) => total = total.saturating_add(v),
            (None, None) => missing = true,
        }
    }
    (if missing { None } else { Some(total) }, None)
}
