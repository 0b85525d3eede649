//! `<proc> madvise <range> <ADVICE>`: advice on a range (mm/madvise.c
//! `madvise`).

use crate::ast::{Advice, Name, Range};
use crate::checker::{Checker, Issue};
use crate::line::Line;
use crate::text::{quote, ParseError};
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Madvise {
    pub proc: Name,
    pub range: Range,
    pub advice: Advice,
}

const USAGE: &str = "<proc> madvise <range> \
     HUGEPAGE|NOHUGEPAGE|DONTNEED|FREE|COLLAPSE|PAGEOUT|COLD|POPULATE_READ|POPULATE_WRITE";

impl Madvise {
    pub(crate) fn parse(l: &mut Line<'_>, proc: Name) -> Result<Madvise, ParseError> {
        let range = l.range_arg(2, USAGE)?;
        let a = l.arg(3, "advice", USAGE)?;
        let advice = Advice::ALL
            .iter()
            .copied()
            .find(|adv| adv.name().eq_ignore_ascii_case(a.text))
            .ok_or_else(|| {
                l.err(
                    a.col,
                    format!(
                        "unknown advice {}; expected one of HUGEPAGE, NOHUGEPAGE, DONTNEED, FREE, COLLAPSE, PAGEOUT, COLD, POPULATE_READ, POPULATE_WRITE",
                        quote(a.text)
                    ),
                )
            })?;
        l.no_more(4, USAGE)?;
        Ok(Madvise {
            proc,
            range,
            advice,
        })
    }

    pub(crate) fn check(&self, c: &mut Checker, _: u32) -> Result<(), Issue> {
        c.range(&self.proc, &self.range, true).map(drop)
    }
}

impl fmt::Display for Madvise {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} madvise {} {}", self.proc, self.range, self.advice)
    }
}
