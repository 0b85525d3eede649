//! `<proc> mprotect <range> rw|r|none|rx|rwx|x`: a range's protection changed
//! (mm/mprotect.c `mprotect`).

use crate::ast::{Name, Prot, Range};
use crate::checker::{Checker, Issue};
use crate::line::{parse_prot, Line};
use crate::text::ParseError;
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mprotect {
    pub proc: Name,
    pub range: Range,
    pub prot: Prot,
}

const USAGE: &str = "<proc> mprotect <range> rw|r|none|rx|rwx|x";

impl Mprotect {
    pub(crate) fn parse(l: &mut Line<'_>, proc: Name) -> Result<Mprotect, ParseError> {
        let range = l.range_arg(2, USAGE)?;
        let p = l.arg(3, "protection", USAGE)?;
        let prot = parse_prot(l, p)?;
        l.no_more(4, USAGE)?;
        Ok(Mprotect { proc, range, prot })
    }

    pub(crate) fn check(&self, c: &mut Checker, _: u32) -> Result<(), Issue> {
        c.range(&self.proc, &self.range, true).map(drop)
    }
}

impl fmt::Display for Mprotect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} mprotect {} {}", self.proc, self.range, self.prot)
    }
}
