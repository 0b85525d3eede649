//! `<proc> mmap <region> <size> [align=] [hugetlb=] [shared] [prot=]`: a new
//! region (mm/mmap.c `mmap`; with `hugetlb=`, a MAP_HUGETLB mapping).

use crate::ast::{HugetlbSize, Name, Prot, Size};
use crate::checker::{issue, Checker, Issue, Part, Region};
use crate::line::{flag, opt, parse_prot, Line, OptSpec};
use crate::mapped::Mapped;
use crate::text::{quote, valid_name, ParseError};
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mmap {
    pub proc: Name,
    pub region: Name,
    pub size: Size,
    pub align: Option<Size>,
    pub hugetlb: Option<HugetlbSize>,
    pub shared: bool,
    pub prot: Option<Prot>,
}

const USAGE: &str =
    "<proc> mmap <region> <size> [align=<size>] [hugetlb=2M|1G] [shared] [prot=rw|r|none]";
const OPTS: &[OptSpec; 4] = &[
    opt("align", "<size>"),
    opt("hugetlb", "2M|1G"),
    flag("shared"),
    opt("prot", "rw|r|none"),
];

impl Mmap {
    pub(crate) fn parse(l: &mut Line<'_>, proc: Name) -> Result<Mmap, ParseError> {
        let r = l.arg(2, "region name", USAGE)?;
        let region = l.name(r, "region")?;
        l.mark(Part::Region, r.col);
        let s = l.arg(3, "size", USAGE)?;
        let size = l.size_at(s.text, s.col)?;
        l.mark(Part::Size, s.col);
        let opts = l.options(4, "mmap", OPTS)?;
        let align = match opts[0] {
            Some(v) => {
                l.mark(Part::Align, v.col);
                Some(l.size_at(v.text, v.col)?)
            }
            None => None,
        };
        let hugetlb = match opts[1] {
            Some(v) => {
                let s = l.size_at(v.text, v.col)?;
                Some(match s.0 {
                    0x20_0000 => HugetlbSize::Size2M,
                    0x4000_0000 => HugetlbSize::Size1G,
                    _ => {
                        return Err(l.err(
                            v.col,
                            format!("bad hugetlb size {}; expected 2M or 1G", quote(v.text)),
                        ));
                    }
                })
            }
            None => None,
        };
        let prot = match opts[3] {
            Some(v) => Some(parse_prot(l, v)?),
            None => None,
        };
        Ok(Mmap {
            proc,
            region,
            size,
            align,
            hugetlb,
            shared: opts[2].is_some(),
            prot,
        })
    }

    pub(crate) fn check(&self, c: &mut Checker, line: u32) -> Result<(), Issue> {
        let Mmap {
            proc,
            region,
            size,
            align,
            hugetlb,
            ..
        } = self;
        let base = c.base();
        let p = c.live(proc)?;
        if !valid_name(region) {
            return Err(issue(
                Part::Region,
                format!("bad region name {}", quote(region)),
            ));
        }
        if let Some(r) = p.regions.get(region) {
            return Err(issue(
                Part::Region,
                format!(
                    "region {} of process {} already exists (mapped at line {})",
                    quote(region),
                    quote(proc),
                    r.line
                ),
            ));
        }
        if size.0 == 0 {
            return Err(issue(Part::Size, "mmap size must be nonzero"));
        }
        if size.0 % base.0 != 0 {
            return Err(issue(
                Part::Size,
                format!("mmap size {size} is not a multiple of the base page ({base})"),
            ));
        }
        if let Some(h) = hugetlb {
            let hsize = h.bytes();
            if size.0 % hsize.0 != 0 {
                return Err(issue(
                    Part::Size,
                    format!(
                        "mmap size {size} is not a multiple of its hugetlb page size ({hsize})"
                    ),
                ));
            }
        }
        if let Some(a) = align {
            if !a.0.is_power_of_two() || a.0 < base.0 {
                return Err(issue(
                    Part::Align,
                    format!("align={a} must be a power of two of at least the base page ({base})"),
                ));
            }
        }
        p.gone.remove(region);
        p.regions.insert(
            region.clone(),
            Region {
                size: size.0,
                line,
                mapped: Mapped::whole(size.0),
            },
        );
        Ok(())
    }
}

impl fmt::Display for Mmap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} mmap {} {}", self.proc, self.region, self.size)?;
        if let Some(a) = self.align {
            write!(f, " align={a}")?;
        }
        if let Some(h) = self.hugetlb {
            write!(f, " hugetlb={h}")?;
        }
        if self.shared {
            f.write_str(" shared")?;
        }
        if let Some(p) = self.prot {
            write!(f, " prot={p}")?;
        }
        Ok(())
    }
}
