//! `<proc> brk <region> <new-size> [at=<addr>]`: the heap (mm/mmap.c
//! `brk`). The first `brk` of a region gives the start of the brk area
//! (`mm->start_brk`) with `at=` and creates the region, of any size (0: nothing
//! mapped yet); each later one moves the break to `start + new-size`. The
//! region's size is the break.

use crate::ast::{Name, Size};
use crate::checker::{issue, Checker, Issue, Part, Region};
use crate::line::{opt, Line, OptSpec};
use crate::mapped::Mapped;
use crate::placement::TASK_SIZE;
use crate::stmt::mmap::check_at;
use crate::text::{quote, valid_name, ParseError};
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Brk {
    pub proc: Name,
    pub region: Name,
    /// The new break, as bytes from the start of the brk area.
    pub size: Size,
    /// The start of the brk area (`mm->start_brk`): the first `brk` of a
    /// region only.
    pub at: Option<u64>,
}

const USAGE: &str = "<proc> brk <region> <new-size> [at=<hex address>]";
const OPTS: &[OptSpec; 1] = &[opt("at", "<hex address>")];

impl Brk {
    pub(crate) fn parse(l: &mut Line<'_>, proc: Name) -> Result<Brk, ParseError> {
        let r = l.arg(2, "region name", USAGE)?;
        let region = l.name(r, "region")?;
        l.mark(Part::Region, r.col);
        let s = l.arg(3, "size", USAGE)?;
        let size = l.size_at(s.text, s.col)?;
        l.mark(Part::Size, s.col);
        let opts = l.options(4, "brk", OPTS)?;
        let at = super::mmap::at_option(l, opts[0])?;
        Ok(Brk {
            proc,
            region,
            size,
            at,
        })
    }

    pub(crate) fn check(&self, c: &mut Checker, line: u32) -> Result<(), Issue> {
        let Brk {
            proc,
            region,
            size,
            at,
        } = self;
        let base = c.base().0;
        let p = c.live(proc)?;
        if !valid_name(region) {
            return Err(issue(
                Part::Region,
                format!("bad region name {}", quote(region)),
            ));
        }
        let mapped = |start: u64| -> Result<Mapped, Issue> {
            match start.checked_add(size.0) {
                Some(end) if end <= TASK_SIZE => Ok(Mapped::whole(size.0.next_multiple_of(base))),
                _ => Err(issue(
                    Part::Size,
                    format!(
                        "brk {:#x} from {start:#x} ends above the user address-space limit ({TASK_SIZE:#x})",
                        size.0
                    ),
                )),
            }
        };
        if let Some(r) = p.regions.get_mut(region) {
            let Some(start) = r.brk else {
                return Err(issue(
                    Part::Region,
                    format!(
                        "region {} of process {} is not a heap made by brk (mapped at line {})",
                        quote(region),
                        quote(proc),
                        r.line
                    ),
                ));
            };
            if at.is_some() {
                return Err(issue(
                    Part::At,
                    format!(
                        "at= gives the start of a new brk area; heap {} exists since line {}, so this brk only moves its break",
                        quote(region),
                        r.line
                    ),
                ));
            }
            r.mapped = mapped(start)?;
            r.size = size.0;
            return Ok(());
        }
        let Some(at) = at else {
            return Err(issue(
                Part::Region,
                format!(
                    "the first brk of heap {} needs at=<hex address>, the start of its brk area",
                    quote(region)
                ),
            ));
        };
        let mapped = mapped(*at)?;
        check_at(*at, size.0.next_multiple_of(base), base, false, false)?;
        p.gone.remove(region);
        p.regions.insert(
            region.clone(),
            Region {
                size: size.0,
                line,
                mapped,
                brk: Some(*at),
            },
        );
        Ok(())
    }
}

impl fmt::Display for Brk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} brk {} {}", self.proc, self.region, self.size)?;
        if let Some(a) = self.at {
            write!(f, " at={a:#x}")?;
        }
        Ok(())
    }
}
