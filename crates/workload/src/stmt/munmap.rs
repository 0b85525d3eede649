//! `<proc> munmap <range>`: part or all of a region unmapped (mm/mmap.c
//! `munmap`); a region fully unmapped is gone and its name free again.

use crate::ast::{Name, Range};
use crate::checker::{Checker, Gone, Issue};
use crate::line::Line;
use crate::text::ParseError;
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Munmap {
    pub proc: Name,
    pub range: Range,
}

const USAGE: &str = "<proc> munmap <range>";

impl Munmap {
    pub(crate) fn parse(l: &mut Line<'_>, proc: Name) -> Result<Munmap, ParseError> {
        let range = l.range_arg(2, USAGE)?;
        l.no_more(3, USAGE)?;
        Ok(Munmap { proc, range })
    }

    pub(crate) fn check(&self, c: &mut Checker, line: u32) -> Result<(), Issue> {
        let Munmap { proc, range } = self;
        let (start, end) = c.range(proc, range, true)?;
        let p = c.live(proc)?;
        let r = p.regions.get_mut(&range.region).expect("range() found it");
        r.mapped.unmap(start, end);
        if r.mapped.is_empty() {
            p.regions.remove(&range.region);
            p.gone.insert(
                range.region.clone(),
                Gone {
                    line,
                    how: "fully unmapped",
                },
            );
        }
        Ok(())
    }
}

impl fmt::Display for Munmap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} munmap {}", self.proc, self.range)
    }
}
