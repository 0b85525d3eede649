//! `<proc> fork <child>`: a child with a copy of the parent's address space
//! (kernel/fork.c); it inherits the parent's regions.

use crate::ast::Name;
use crate::checker::{Checker, Issue, Part, Process};
use crate::line::Line;
use crate::text::ParseError;
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fork {
    pub proc: Name,
    pub child: Name,
}

const USAGE: &str = "<proc> fork <child>";

impl Fork {
    pub(crate) fn parse(l: &mut Line<'_>, proc: Name) -> Result<Fork, ParseError> {
        let c = l.arg(2, "child process name", USAGE)?;
        let child = l.new_proc_name(c)?;
        l.mark(Part::Child, c.col);
        l.no_more(3, USAGE)?;
        Ok(Fork { proc, child })
    }

    pub(crate) fn check(&self, c: &mut Checker, line: u32) -> Result<(), Issue> {
        let regions = c.live(&self.proc)?.regions.clone();
        c.new_process(&self.child, Part::Child)?;
        c.insert_process(&self.child, Process::new("forked", line, regions));
        Ok(())
    }
}

impl fmt::Display for Fork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} fork {}", self.proc, self.child)
    }
}
