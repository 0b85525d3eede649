//! `cgroup <cg> [memory.max=<size>]`: a memory cgroup (mm/memcontrol.c).

use crate::ast::{Name, Size};
use crate::checker::{issue, Checker, Issue, Part};
use crate::line::{opt, Line, OptSpec};
use crate::text::{quote, valid_name, ParseError};
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cgroup {
    pub cgroup: Name,
    pub memory_max: Option<Size>,
}

const USAGE: &str = "cgroup <cg> [memory.max=<size>]";
const OPTS: &[OptSpec; 1] = &[opt("memory.max", "<size>")];

impl Cgroup {
    pub(crate) fn parse(l: &mut Line<'_>) -> Result<Cgroup, ParseError> {
        let t = l.arg(1, "cgroup name", USAGE)?;
        let cgroup = l.name(t, "cgroup")?;
        l.mark(Part::Cgroup, t.col);
        let opts = l.options(2, "cgroup", OPTS)?;
        let memory_max = match opts[0] {
            Some(v) if v.text == "max" => None,
            Some(v) => Some(l.size_at(v.text, v.col)?),
            None => None,
        };
        Ok(Cgroup { cgroup, memory_max })
    }

    pub(crate) fn check(&self, c: &mut Checker, line: u32) -> Result<(), Issue> {
        let cgroup = &self.cgroup;
        if !valid_name(cgroup) {
            return Err(issue(
                Part::Cgroup,
                format!("bad cgroup name {}", quote(cgroup)),
            ));
        }
        if let Some(first) = c.cgroups.get(cgroup) {
            return Err(issue(
                Part::Cgroup,
                format!("cgroup {} already exists (at line {first})", quote(cgroup)),
            ));
        }
        c.cgroups.insert(cgroup.clone(), line);
        Ok(())
    }
}

impl fmt::Display for Cgroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cgroup {}", self.cgroup)?;
        if let Some(m) = self.memory_max {
            write!(f, " memory.max={m}")?;
        }
        Ok(())
    }
}
