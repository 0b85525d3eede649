//! `<proc> pin|unpin <range>`: a long-term pin taken and dropped
//! (mm/gup.c `pin_user_pages` with FOLL_LONGTERM, `unpin_user_pages`).

use crate::ast::{Name, Range};
use crate::checker::{Checker, Issue};
use crate::line::Line;
use crate::text::ParseError;
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pin {
    pub proc: Name,
    pub range: Range,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unpin {
    pub proc: Name,
    pub range: Range,
}

const USAGE_PIN: &str = "<proc> pin <range>";
const USAGE_UNPIN: &str = "<proc> unpin <range>";

impl Pin {
    pub(crate) fn parse(l: &mut Line<'_>, proc: Name) -> Result<Pin, ParseError> {
        let range = l.range_arg(2, USAGE_PIN)?;
        l.no_more(3, USAGE_PIN)?;
        Ok(Pin { proc, range })
    }

    pub(crate) fn check(&self, c: &mut Checker, _: u32) -> Result<(), Issue> {
        c.range(&self.proc, &self.range, true).map(drop)
    }
}

impl Unpin {
    pub(crate) fn parse(l: &mut Line<'_>, proc: Name) -> Result<Unpin, ParseError> {
        let range = l.range_arg(2, USAGE_UNPIN)?;
        l.no_more(3, USAGE_UNPIN)?;
        Ok(Unpin { proc, range })
    }

    pub(crate) fn check(&self, c: &mut Checker, _: u32) -> Result<(), Issue> {
        c.range(&self.proc, &self.range, true).map(drop)
    }
}

impl fmt::Display for Pin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} pin {}", self.proc, self.range)
    }
}

impl fmt::Display for Unpin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} unpin {}", self.proc, self.range)
    }
}
