//! `split <proc> <range>`: every THP mapped in the range split (the debugfs
//! `split_huge_pages` of mm/huge_memory.c).

use crate::ast::{Name, Range};
use crate::checker::{Checker, Issue, Part};
use crate::line::Line;
use crate::text::ParseError;
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Split {
    pub proc: Name,
    pub range: Range,
}

const USAGE: &str = "split <proc> <range>";

impl Split {
    pub(crate) fn parse(l: &mut Line<'_>) -> Result<Split, ParseError> {
        let t = l.arg(1, "process name", USAGE)?;
        let proc = l.name(t, "process")?;
        l.mark(Part::Proc, t.col);
        let range = l.range_arg(2, USAGE)?;
        l.no_more(3, USAGE)?;
        Ok(Split { proc, range })
    }

    pub(crate) fn check(&self, c: &mut Checker, _: u32) -> Result<(), Issue> {
        c.range(&self.proc, &self.range, true).map(drop)
    }
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "split {} {}", self.proc, self.range)
    }
}
