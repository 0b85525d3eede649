//! `<proc> thread <name>`: a new task sharing the address space of
//! `<proc>`'s process (kernel/fork.c `copy_process` with CLONE_VM |
//! CLONE_THREAD). Statements naming the thread act on that address space:
//! regions are per mm, so the process and all its threads see the same ones.

use crate::ast::Name;
use crate::checker::{Checker, Issue, Part};
use crate::line::Line;
use crate::text::ParseError;
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Thread {
    /// The task that clones: the process, or one of its threads.
    pub proc: Name,
    /// The new thread's name (a task name, in the processes' namespace).
    pub thread: Name,
}

const USAGE: &str = "<proc> thread <name>";

impl Thread {
    pub(crate) fn parse(l: &mut Line<'_>, proc: Name) -> Result<Thread, ParseError> {
        let t = l.arg(2, "thread name", USAGE)?;
        let thread = l.new_proc_name(t)?;
        l.mark(Part::Child, t.col);
        l.no_more(3, USAGE)?;
        Ok(Thread { proc, thread })
    }

    pub(crate) fn check(&self, c: &mut Checker, line: u32) -> Result<(), Issue> {
        let group = c.thread_group(&self.proc)?;
        c.new_process(&self.thread, Part::Child)?;
        c.insert_thread(&self.thread, &group, line);
        Ok(())
    }
}

impl fmt::Display for Thread {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} thread {}", self.proc, self.thread)
    }
}
