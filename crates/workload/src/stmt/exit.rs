//! `<proc> exit`: the process exits (kernel/exit.c), its address space torn
//! down; its name and its regions' names are free again.

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
