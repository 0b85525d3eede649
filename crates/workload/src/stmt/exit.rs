//! `<task> exit`: a thread exits (kernel/exit.c `do_exit`: the address
//! space stays with the process), or the process does (`do_group_exit`:
//! its threads end, its address space is torn down); the names of what
//! ended are free again.

use crate::ast::Name;
use crate::checker::{Checker, Gone, Issue};
use crate::line::Line;
use crate::text::ParseError;
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exit {
    pub proc: Name,
}

const USAGE: &str = "<proc> exit";

impl Exit {
    pub(crate) fn parse(l: &mut Line<'_>, proc: Name) -> Result<Exit, ParseError> {
        l.no_more(2, USAGE)?;
        Ok(Exit { proc })
    }

    pub(crate) fn check(&self, c: &mut Checker, line: u32) -> Result<(), Issue> {
        if c.threads.remove(&self.proc).is_some() {
            return Ok(());
        }
        c.live(&self.proc)?;
        c.end_threads(&self.proc);
        let p = c.live(&self.proc)?;
        p.exited = Some(line);
        let how = "gone with its process, which exited";
        for (name, _) in std::mem::take(&mut p.regions) {
            p.gone.insert(name, Gone { line, how });
        }
        Ok(())
    }
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} exit", self.proc)
    }
}
