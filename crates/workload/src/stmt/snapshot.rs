//! `snapshot <label>`: every counter read and kept under a label.

use crate::ast::Name;
use crate::checker::{issue, Checker, Issue, Part};
use crate::line::Line;
use crate::text::{quote, valid_name, ParseError};
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub label: Name,
}

const USAGE: &str = "snapshot <label>";

impl Snapshot {
    pub(crate) fn parse(l: &mut Line<'_>) -> Result<Snapshot, ParseError> {
        let t = l.arg(1, "label", USAGE)?;
        let label = l.name(t, "snapshot")?;
        l.mark(Part::Label, t.col);
        l.no_more(2, USAGE)?;
        Ok(Snapshot { label })
    }

    pub(crate) fn check(&self, c: &mut Checker, line: u32) -> Result<(), Issue> {
        let label = &self.label;
        if !valid_name(label) {
            return Err(issue(
                Part::Label,
                format!("bad snapshot label {}", quote(label)),
            ));
        }
        if label == "end" {
            return Err(issue(
                Part::Label,
                "snapshot label 'end' is reserved for the end of the workload",
            ));
        }
        if let Some(first) = c.snapshots.get(label) {
            return Err(issue(
                Part::Label,
                format!("snapshot {} already taken (at line {first})", quote(label)),
            ));
        }
        c.snapshots.insert(label.clone(), line);
        Ok(())
    }
}

impl fmt::Display for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "snapshot {}", self.label)
    }
}
