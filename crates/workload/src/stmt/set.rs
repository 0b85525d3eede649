//! `set <tunable> <value>`: a kernel tunable written (which tunables and
//! values exist is [`crate::tunables`]'s business).

use crate::ast::{SetValue, Tunable};
use crate::checker::{stmt_issue, Checker, Issue};
use crate::line::Line;
use crate::text::ParseError;
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Set {
    pub tunable: Tunable,
    pub value: SetValue,
}

const USAGE: &str = "set <tunable> <value>";

impl Set {
    pub(crate) fn parse(l: &mut Line<'_>) -> Result<Set, ParseError> {
        let t = l.arg(1, "tunable", USAGE)?;
        let tunable = t.text.parse::<Tunable>().map_err(|m| l.err(t.col, m))?;
        let v = l.arg(2, "value", USAGE)?;
        let value = tunable.parse_value(v.text).map_err(|m| l.err(v.col, m))?;
        l.no_more(3, USAGE)?;
        Ok(Set { tunable, value })
    }

    pub(crate) fn check(&self, _: &mut Checker, _: u32) -> Result<(), Issue> {
        let Set { tunable, value } = self;
        let size_ok = match tunable {
            Tunable::ThpSizeEnabled { size_kb }
            | Tunable::HugetlbNrHugepages { size_kb }
            | Tunable::HugetlbNrOvercommit { size_kb } => {
                *size_kb >= 8 && size_kb.is_power_of_two()
            }
            _ => true,
        };
        if !size_ok {
            return Err(stmt_issue(format!(
                "bad page size in tunable {tunable}; expected a power of two of at least 8 (kB)"
            )));
        }
        tunable.check_value(value).map_err(stmt_issue)
    }
}

impl fmt::Display for Set {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "set {} {}", self.tunable, self.value)
    }
}
