//! The hugelab workload language (`.hlw`), the observation schema and the
//! `Backend` trait both backends implement. Depends on nothing of ours.

pub mod ast;
pub mod backend;
pub mod check;
pub mod counters;
pub mod errno;
pub mod gone;
pub mod mapped;
pub mod observation;
pub mod parse;
pub mod placement;
pub mod prelude;
pub mod print;
pub mod signal;
pub mod smaps;
pub mod source;
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
pub use parse::{open, parse, parse_file, stream_file, ParseError, SizeError, Statements};
