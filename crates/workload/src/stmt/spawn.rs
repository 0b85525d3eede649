//! `spawn <proc> [cgroup=<cg>]`: a new process with an empty address space.

use crate::ast::Name;
use crate::checker::{issue, list, Checker, Issue, Part, Process};
use crate::line::{opt, Line, OptSpec};
use crate::text::{quote, ParseError};
use std::collections::BTreeMap;
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spawn {
    pub proc: Name,
    pub cgroup: Option<Name>,
}

const USAGE: &str = "spawn <proc> [cgroup=<cg>]";
const OPTS: &[OptSpec; 1] = &[opt("cgroup", "<cg>")];

impl Spawn {
    pub(crate) fn parse(l: &mut Line<'_>) -> Result<Spawn, ParseError> {
        let t = l.arg(1, "process name", USAGE)?;
        let proc = l.new_proc_name(t)?;
        l.mark(Part::Proc, t.col);
        let opts = l.options(2, "spawn", OPTS)?;
        let cgroup = match opts[0] {
            Some(v) => {
                l.mark(Part::Cgroup, v.col);
                Some(l.name(v, "cgroup")?)
            }
            None => None,
        };
        Ok(Spawn { proc, cgroup })
    }

    pub(crate) fn check(&self, c: &mut Checker, line: u32) -> Result<(), Issue> {
        c.new_process(&self.proc, Part::Proc)?;
        if let Some(cg) = &self.cgroup {
            if !c.cgroups.contains_key(cg) {
                let hint = if c.cgroups.is_empty() {
                    "no cgroup has been declared".to_string()
                } else {
                    format!("cgroups so far: {}", list(c.cgroups.keys()))
                };
                return Err(issue(
                    Part::Cgroup,
                    format!("unknown cgroup {}; {hint}", quote(cg)),
                ));
            }
        }
        c.insert_process(&self.proc, Process::new("spawned", line, BTreeMap::new()));
        Ok(())
    }
}

impl fmt::Display for Spawn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "spawn {}", self.proc)?;
        if let Some(cg) = &self.cgroup {
            write!(f, " cgroup={cg}")?;
        }
        Ok(())
    }
}
