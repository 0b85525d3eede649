//! `<proc> read|write <range> [step=<size>] [zero]`: the process touches a
//! range, one access per step, taking the faults of mm/memory.c.

use crate::ast::{Name, Range, Size};
use crate::checker::{issue, Checker, Issue, Part};
use crate::line::{flag, opt, parse_step, Line, OptSpec};
use crate::text::ParseError;
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Read {
    pub proc: Name,
    pub range: Range,
    pub step: Option<Size>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Write {
    pub proc: Name,
    pub range: Range,
    pub step: Option<Size>,
    /// Writes zeroes (a page of zeroes may be merged back into the zero page).
    pub zero: bool,
}

const USAGE_READ: &str = "<proc> read <range> [step=<size>]";
const USAGE_WRITE: &str = "<proc> write <range> [step=<size>] [zero]";
const READ_OPTS: &[OptSpec; 1] = &[opt("step", "<size>")];
const WRITE_OPTS: &[OptSpec; 2] = &[opt("step", "<size>"), flag("zero")];

impl Read {
    pub(crate) fn parse(l: &mut Line<'_>, proc: Name) -> Result<Read, ParseError> {
        let range = l.range_arg(2, USAGE_READ)?;
        let opts = l.options(3, "read", READ_OPTS)?;
        let step = parse_step(l, opts[0])?;
        Ok(Read { proc, range, step })
    }

    pub(crate) fn check(&self, c: &mut Checker, _: u32) -> Result<(), Issue> {
        check_access(c, &self.proc, &self.range, self.step)
    }
}

impl Write {
    pub(crate) fn parse(l: &mut Line<'_>, proc: Name) -> Result<Write, ParseError> {
        let range = l.range_arg(2, USAGE_WRITE)?;
        let opts = l.options(3, "write", WRITE_OPTS)?;
        let step = parse_step(l, opts[0])?;
        Ok(Write {
            proc,
            range,
            step,
            zero: opts[1].is_some(),
        })
    }

    pub(crate) fn check(&self, c: &mut Checker, _: u32) -> Result<(), Issue> {
        check_access(c, &self.proc, &self.range, self.step)
    }
}

/// A range of any alignment, and a nonzero step.
fn check_access(c: &Checker, proc: &str, range: &Range, step: Option<Size>) -> Result<(), Issue> {
    c.range(proc, range, false)?;
    if step == Some(Size(0)) {
        return Err(issue(Part::Step, "step must be nonzero"));
    }
    Ok(())
}

impl fmt::Display for Read {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} read {}", self.proc, self.range)?;
        if let Some(s) = self.step {
            write!(f, " step={s}")?;
        }
        Ok(())
    }
}

impl fmt::Display for Write {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} write {}", self.proc, self.range)?;
        if let Some(s) = self.step {
            write!(f, " step={s}")?;
        }
        if self.zero {
            f.write_str(" zero")?;
        }
        Ok(())
    }
}
