//! `<proc> mremap <range> <new-size> [at=<addr>] [maymove]`: a region
//! resized, in place or moved (mm/mremap.c `mremap`). The range must be the
//! whole region; afterwards the region's name names the new place and size.

use crate::ast::{Name, Range, Size};
use crate::checker::{issue, Checker, Issue, Part};
use crate::line::{flag, opt, Line, OptSpec};
use crate::mapped::Mapped;
use crate::text::{quote, ParseError};
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mremap {
    pub proc: Name,
    /// The old address and length: the whole region.
    pub range: Range,
    pub new_size: Size,
    /// `at=`: MREMAP_MAYMOVE|MREMAP_FIXED to that address.
    pub at: Option<u64>,
    /// `maymove`: MREMAP_MAYMOVE (a grown region that cannot grow in place
    /// is moved where the placement rule puts it).
    pub maymove: bool,
}

const USAGE: &str = "<proc> mremap <range> <new-size> [at=<hex address>] [maymove]";
const OPTS: &[OptSpec; 2] = &[opt("at", "<hex address>"), flag("maymove")];

impl Mremap {
    pub(crate) fn parse(l: &mut Line<'_>, proc: Name) -> Result<Mremap, ParseError> {
        let range = l.range_arg(2, USAGE)?;
        let s = l.arg(3, "new size", USAGE)?;
        let new_size = l.size_at(s.text, s.col)?;
        l.mark(Part::Size, s.col);
        let opts = l.options(4, "mremap", OPTS)?;
        let at = super::mmap::at_option(l, opts[0])?;
        Ok(Mremap {
            proc,
            range,
            new_size,
            at,
            maymove: opts[1].is_some(),
        })
    }

    pub(crate) fn check(&self, c: &mut Checker, _: u32) -> Result<(), Issue> {
        let base = c.base();
        let (start, end) = c.range(&self.proc, &self.range, true)?;
        let p = c.live(&self.proc)?;
        let r = p
            .regions
            .get_mut(&self.range.region)
            .expect("range() found it");
        if start != 0 || end != r.size {
            return Err(issue(
                Part::Range,
                format!(
                    "mremap takes a whole region: range '{}' is {} of the {} of region {}",
                    self.range,
                    Size(end - start),
                    Size(r.size),
                    quote(&self.range.region)
                ),
            ));
        }
        let new = self.new_size.0;
        if new == 0 {
            return Err(issue(Part::Size, "mremap new size must be nonzero"));
        }
        if !new.is_multiple_of(base.0) {
            return Err(issue(
                Part::Size,
                format!(
                    "mremap new size {} is not a multiple of the base page ({base})",
                    self.new_size
                ),
            ));
        }
        if let Some(at) = self.at {
            super::mmap::check_at(at, new, base.0, false, false)?;
        }
        // What the kernel does, if it succeeds: the checker cannot know
        // whether it will (a failed call leaves the region as it was on the
        // backends, which resolve ranges against what they have).
        // A shrink, or a move of the same size, keeps the holes of what
        // stays (it may cross them); a growth needs the old range to be one
        // VMA, so all of the region is mapped after it.
        if new <= r.size {
            r.mapped.unmap(new, r.size);
        } else {
            r.mapped = Mapped::whole(new);
        }
        r.size = new;
        Ok(())
    }
}

impl fmt::Display for Mremap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} mremap {} {}", self.proc, self.range, self.new_size)?;
        if let Some(a) = self.at {
            write!(f, " at={a:#x}")?;
        }
        if self.maymove {
            f.write_str(" maymove")?;
        }
        Ok(())
    }
}
