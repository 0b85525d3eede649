//! The hugelab workload language (`.hlw`), the observation schema and the
//! `Backend` trait both backends implement. Depends on nothing of ours.
//!
//! Each statement is one struct in its own file under [`stmt`], with its own
//! parse, check and print; every place that matches on a statement (parser,
//! checker, printer, the backends) is a thin table of one line per statement
//! to that code, with no catch-all arm, so the compiler names every table a
//! new statement must join (see [`stmt`]).
//!
//! The files are layered, each using only those below it: [`text`] (errors,
//! quoting, names) → `units`, `tunables`, `counters`, [`ast`] (the values) →
//! `line` (a line's tokens), `checker` (what exists so far) → [`stmt`] (the
//! statements) → [`check`], [`parse`], [`print`] (the tables) → [`backend`]
//! (running them).

pub mod ast;
pub mod backend;
pub mod bound;
pub mod check;
mod checker;
pub mod counters;
pub mod errno;
pub mod gone;
pub mod layout;
mod line;
pub mod mapped;
pub mod observation;
pub mod parse;
pub mod placement;
pub mod prelude;
pub mod print;
pub mod recorded;
pub mod signal;
pub mod smaps;
pub mod source;
pub mod stmt;
pub mod text;
pub mod tunables;
pub mod units;
pub mod utilization;

pub use ast::*;
pub use backend::{
    run, run_file, run_file_counted, run_stream, Backend, BackendError, BackendErrorKind,
    Lookahead, RunError,
};
pub use counters::CounterKind;
pub use observation::{
    Counters, ExpectOutcome, FailedCall, Kill, Observation, Reading, Snapshot, ERRNO, SIGNAL,
};
pub use parse::{
    open, open_bytes, parse, parse_file, stream_bytes, stream_file, Bytes, ParseError, SizeError,
    Statements,
};
pub use stmt::{Stmt, StmtKind, Workload};
