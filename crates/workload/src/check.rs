//! The semantic pass: does a syntactically valid workload make sense?
//!
//! It walks the statements in order, tracking processes (spawned, forked,
//! exited), their regions (name → size and what of it is still mapped; a fork
//! child inherits its parent's), cgroups, snapshot labels and the machine's
//! base page (`crate::checker`), so that a backend can take every name,
//! range and size it is given at face value.
//!
//! Names are those of things that exist now: a region fully unmapped (by one
//! `munmap` or several) and a process that exited are gone, and their names
//! can be used again. What they were is remembered only so that an `expect`
//! may still name their counters (the backends keep the last values) and so
//! that messages can say where a name went.
//!
//! It also re-checks what the parser guarantees (names, tunable values, nonzero
//! lengths...), so that an AST built in code — a generator, a test — is held
//! to the same rules: a workload that passes [`check`] prints to text that
//! parses back to the same statements.
//!
//! This module is a thin table from statement to its own `check`, in its
//! file under [`crate::stmt`].

use crate::checker::{Checker, Issue};
use crate::stmt::{Stmt, StmtKind, Workload};
use crate::text::ParseError;

/// Checks one statement against everything before it, then records its effect.
pub(crate) fn stmt(c: &mut Checker, stmt: &Stmt) -> Result<(), Issue> {
    let line = stmt.pos.line;
    match &stmt.kind {
        StmtKind::Set(_) | StmtKind::Machine(_) | StmtKind::Cgroup(_) => {}
        other => {
            if c.started.is_none() {
                c.started = Some((line, other.keyword()));
            }
        }
    }
    if !stmt.kind.checks() {
        c.last_call = Some((line, stmt.kind.process().map(str::to_string)));
    }
    match &stmt.kind {
        StmtKind::Set(s) => s.check(c, line),
        StmtKind::Machine(s) => s.check(c, line),
        StmtKind::Cgroup(s) => s.check(c, line),
        StmtKind::Spawn(s) => s.check(c, line),
        StmtKind::Mmap(s) => s.check(c, line),
        StmtKind::Munmap(s) => s.check(c, line),
        StmtKind::Mprotect(s) => s.check(c, line),
        StmtKind::Mremap(s) => s.check(c, line),
        StmtKind::Madvise(s) => s.check(c, line),
        StmtKind::Brk(s) => s.check(c, line),
        StmtKind::Read(s) => s.check(c, line),
        StmtKind::Write(s) => s.check(c, line),
        StmtKind::Special(s) => s.check(c, line),
        StmtKind::Pin(s) => s.check(c, line),
        StmtKind::Unpin(s) => s.check(c, line),
        StmtKind::Fork(s) => s.check(c, line),
        StmtKind::ThpDisable(s) => s.check(c, line),
        StmtKind::Thread(s) => s.check(c, line),
        StmtKind::Exit(s) => s.check(c, line),
        StmtKind::Exec(s) => s.check(c, line),
        StmtKind::Split(s) => s.check(c, line),
        StmtKind::Khugepaged | StmtKind::Reclaim | StmtKind::Sleep(_) => Ok(()),
        StmtKind::Fragment(s) => s.check(c, line),
        StmtKind::Snapshot(s) => s.check(c, line),
        StmtKind::Expect(s) => s.check(c, line),
        StmtKind::ExpectErrno(s) => s.check(c, line),
        StmtKind::ExpectSignal(s) => s.check(c, line),
    }
}

/// Checks a whole workload (see the module doc). Errors point at the
/// offending statement's start: an AST keeps no token columns; [`crate::parse`]
/// runs the same pass and points at the token itself.
pub fn check(w: &Workload) -> Result<(), ParseError> {
    let mut checker = Checker::new();
    for s in &w.stmts {
        stmt(&mut checker, s).map_err(|i| ParseError {
            file: w.file.clone(),
            line: s.pos.line,
            col: s.pos.col,
            message: i.message,
        })?;
    }
    Ok(())
}
