//! `expect`: a counter (or a sum of several) against a number, the errno of
//! the statement before, or the signal that killed its process.

use crate::ast::{CmpOp, Errno, Signal};
use crate::checker::{issue, stmt_issue, Checker, Gone, Issue, Part};
use crate::line::{parse_int, Line};
use crate::observation::{ERRNO, SIGNAL};
use crate::text::{quote, valid_counter, ParseError};
use std::fmt;

/// `expect <counter> [+ <counter>]... <op> <value>`: a counter, or the
/// sum of several, against a number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expect {
    /// The counters summed, in the order written; at least one.
    pub counters: Vec<String>,
    pub op: CmpOp,
    pub value: i64,
}

/// `expect errno == <ERRNO>|0`: the outcome of the statement before it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpectErrno {
    pub errno: Errno,
}

/// `expect signal == <SIGNAL>|0`: whether the process of the statement
/// before it was killed by that signal (0: it was not killed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpectSignal {
    pub signal: Signal,
}

const USAGE: &str =
    "expect <counter> [+ <counter>]... ==|<=|>= <value>, or expect errno == <ERRNO>|0, or expect signal == <SIGNAL>|0";

/// One of the three `expect` statements, as [`parse`] read it.
pub(crate) enum Parsed {
    Expect(Expect),
    Errno(ExpectErrno),
    Signal(ExpectSignal),
}

/// `expect ...`: one of the three `expect` statements, by what it compares.
pub(crate) fn parse(l: &mut Line<'_>) -> Result<Parsed, ParseError> {
    // `expect C [+ C]... OP V`: counters joined by `+` tokens.
    let mut counters = Vec::new();
    let mut i = 1;
    let o = loop {
        let c = l.arg(i, "counter", USAGE)?;
        if !valid_counter(c.text) {
            let hint = if c.text.contains('+') {
                "; a sum is written with spaces around each +, like vmstat.a + vmstat.b"
            } else {
                ""
            };
            return Err(l.err(
                c.col,
                format!(
                    "bad counter name {}; expected a dotted name of [A-Za-z0-9_.-] like vmstat.thp_fault_alloc{hint}",
                    quote(c.text)
                ),
            ));
        }
        l.mark(Part::Counter(counters.len()), c.col);
        counters.push(c.text.to_string());
        let o = l.arg(i + 1, "comparison", USAGE)?;
        if o.text != "+" {
            break o;
        }
        i += 2;
    };
    let op = match o.text {
        "==" => CmpOp::Eq,
        "<=" => CmpOp::Le,
        ">=" => CmpOp::Ge,
        _ => {
            return Err(l.err(
                o.col,
                format!(
                    "unknown comparison {}; expected one of ==, <=, >= (or + between counters)",
                    quote(o.text)
                ),
            ))
        }
    };
    let v = l.arg(i + 2, "value", USAGE)?;
    let outcome = match counters.as_slice() {
        [one] if one == ERRNO || one == SIGNAL => Some(one.as_str()),
        _ => None,
    };
    if let Some(what) = outcome {
        if op != CmpOp::Eq {
            let what = if what == ERRNO {
                "an errno"
            } else {
                "a signal"
            };
            return Err(l.err(o.col, format!("{what} is compared with == only")));
        }
        l.no_more(i + 3, USAGE)?;
        return if what == ERRNO {
            let errno = Errno::from_name(v.text).ok_or_else(|| {
                let names: Vec<&str> = Errno::known_names().collect();
                l.err(
                    v.col,
                    format!(
                        "unknown errno {}; expected 0 (success) or one of {}",
                        quote(v.text),
                        names.join(", ")
                    ),
                )
            })?;
            Ok(Parsed::Errno(ExpectErrno { errno }))
        } else {
            let signal = Signal::from_name(v.text).ok_or_else(|| {
                let names: Vec<&str> = Signal::known_names().collect();
                l.err(
                    v.col,
                    format!(
                        "unknown signal {}; expected 0 (not killed) or one of {}",
                        quote(v.text),
                        names.join(", ")
                    ),
                )
            })?;
            Ok(Parsed::Signal(ExpectSignal { signal }))
        };
    }
    if let Some(pos) = counters.iter().position(|c| c == ERRNO || c == SIGNAL) {
        return Err(l.err(
            l.toks[1 + 2 * pos].col,
            format!(
                "{} is an outcome, not a counter: it cannot be summed",
                counters[pos]
            ),
        ));
    }
    let value = parse_int(v.text).map_err(|m| l.err(v.col, m))?;
    l.no_more(i + 3, USAGE)?;
    Ok(Parsed::Expect(Expect {
        counters,
        op,
        value,
    }))
}

impl Expect {
    pub(crate) fn check(&self, c: &mut Checker, _: u32) -> Result<(), Issue> {
        if self.counters.is_empty() {
            return Err(stmt_issue("expect needs a counter"));
        }
        for (i, counter) in self.counters.iter().enumerate() {
            if !valid_counter(counter) {
                return Err(issue(
                    Part::Counter(i),
                    format!("bad counter name {}", quote(counter)),
                ));
            }
            c.counter(counter, Part::Counter(i))?;
        }
        Ok(())
    }
}

impl ExpectErrno {
    pub(crate) fn check(&self, c: &mut Checker, _: u32) -> Result<(), Issue> {
        if c.last_call.is_none() {
            return Err(stmt_issue(
                "expect errno checks the statement before it, and there is none",
            ));
        }
        Ok(())
    }
}

impl ExpectSignal {
    /// The statement before it must have a process; a signal other than 0
    /// says that process was killed there, so it is gone from then on, as
    /// after `exit` (its name is free again).
    pub(crate) fn check(&self, c: &mut Checker, _: u32) -> Result<(), Issue> {
        let signal = self.signal;
        let Some((line, proc)) = c.last_call.clone() else {
            return Err(stmt_issue(
                "expect signal checks the process of the statement before it, and there is none",
            ));
        };
        let Some(proc) = proc else {
            return Err(stmt_issue(format!(
                "expect signal checks the process of the statement before it, and the one at line {line} runs in no process"
            )));
        };
        if signal == Signal::NONE {
            return Ok(());
        }
        // A `<proc> exit` before it: the process is already gone.
        // Killed by a signal: the whole thread group is.
        let group = c.thread_group(&proc)?;
        c.end_threads(&group);
        let p = c.live(&group)?;
        p.exited = Some(line);
        p.killed = Some(signal);
        let how = "gone with its process, which was killed";
        for (name, _) in std::mem::take(&mut p.regions) {
            p.gone.insert(name, Gone { line, how });
        }
        Ok(())
    }
}

impl fmt::Display for Expect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "expect {} {} {}",
            self.counters.join(" + "),
            self.op,
            self.value
        )
    }
}

impl fmt::Display for ExpectErrno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "expect errno == {}", self.errno)
    }
}

impl fmt::Display for ExpectSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "expect signal == {}", self.signal)
    }
}
