//! `<proc> exec`: execve (fs/exec.c `begin_new_exec`): the process gets a
//! new, empty address space (the old one torn down as at exit: `mmput`), its
//! other threads end (`de_thread`) and its regions' names are free again; it
//! keeps its name, its cgroup, its `thp_disable` (MMF_INIT_MASK) and its
//! `stat.` counts.

use crate::ast::Name;
use crate::checker::{issue, Checker, Gone, Issue, Part};
use crate::line::Line;
use crate::text::{quote, ParseError};
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exec {
    pub proc: Name,
}

const USAGE: &str = "<proc> exec";

impl Exec {
    pub(crate) fn parse(l: &mut Line<'_>, proc: Name) -> Result<Exec, ParseError> {
        l.no_more(2, USAGE)?;
        Ok(Exec { proc })
    }

    pub(crate) fn check(&self, c: &mut Checker, line: u32) -> Result<(), Issue> {
        if let Some(t) = c.threads.get(&self.proc) {
            return Err(issue(
                Part::Proc,
                format!(
                    "{} is a thread of {}: exec from a thread (where the kernel makes it the group leader) is not supported; write `{} exec`",
                    quote(&self.proc),
                    quote(&t.process),
                    t.process
                ),
            ));
        }
        c.live(&self.proc)?;
        c.end_threads(&self.proc);
        let p = c.live(&self.proc)?;
        let how = "gone with its address space, which exec replaced";
        for (name, _) in std::mem::take(&mut p.regions) {
            p.gone.insert(name, Gone { line, how });
        }
        Ok(())
    }
}

impl fmt::Display for Exec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} exec", self.proc)
    }
}
