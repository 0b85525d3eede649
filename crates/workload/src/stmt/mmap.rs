//! `<proc> mmap <region> <size> [align=] [hugetlb=] [shared] [file=] [offset=]
//! [prot=] [at=] [populate] [stack] [growsdown] [initial=]`: a new region
//! (mm/mmap.c `mmap`; with `hugetlb=`, a MAP_HUGETLB mapping; with `file=`, a
//! MAP_PRIVATE mapping of that file of the workload from `offset=`; with
//! `at=`, at that address exactly, as MAP_FIXED_NOREPLACE places it;
//! `populate` is MAP_POPULATE, `stack` MAP_STACK, `growsdown` a
//! MAP_GROWSDOWN stack whose VMA is at first the region's top `initial`
//! bytes and grows down on faults).

use crate::ast::{HugetlbSize, Name, Prot, Size};
use crate::checker::{issue, Checker, Issue, Part, Region};
use crate::line::{flag, opt, parse_prot, Line, OptSpec};
use crate::mapped::Mapped;
use crate::placement::{MMAP_MIN_ADDR, TASK_SIZE};
use crate::text::{quote, valid_file_name, valid_name, ParseError};
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mmap {
    pub proc: Name,
    pub region: Name,
    pub size: Size,
    pub align: Option<Size>,
    pub hugetlb: Option<HugetlbSize>,
    pub shared: bool,
    /// `file=`: a MAP_PRIVATE mapping of this file of the workload (files
    /// are global to the workload: every process mapping a name maps the
    /// same page cache), instead of anonymous memory.
    pub file: Option<Name>,
    /// `offset=`: where in the file the mapping starts (bytes, a multiple
    /// of the base page; only with `file=`).
    pub offset: Option<Size>,
    pub prot: Option<Prot>,
    /// `at=`: the region's start address (MAP_FIXED_NOREPLACE), instead of
    /// the placement rule's.
    pub at: Option<u64>,
    /// MAP_POPULATE: the mapping's pages faulted in by the mmap itself.
    pub populate: bool,
    /// MAP_STACK (VM_NOHUGEPAGE in Linux 6.18).
    pub stack: bool,
    /// MAP_GROWSDOWN: the region is the most the stack reaches; its VMA is at
    /// first the top `initial` bytes (one base page if not given).
    pub growsdown: bool,
    /// `initial=`: the bytes mapped at first of a `growsdown` region.
    pub initial: Option<Size>,
}

const USAGE: &str = "<proc> mmap <region> <size> [align=<size>] [hugetlb=2M|1G] [shared] \
                     [file=<name>] [offset=<size>] [prot=rw|r|none|rx|rwx|x] [at=<hex address>] \
                     [populate] [stack] [growsdown] [initial=<size>]";
const OPTS: &[OptSpec; 11] = &[
    opt("align", "<size>"),
    opt("hugetlb", "2M|1G"),
    flag("shared"),
    opt("file", "<name>"),
    opt("offset", "<size>"),
    opt("prot", "rw|r|none|rx|rwx|x"),
    opt("at", "<hex address>"),
    flag("populate"),
    flag("stack"),
    flag("growsdown"),
    opt("initial", "<size>"),
];

/// `0x7e0000200000` (hex digits with `0x`; `_` separators allowed).
pub(crate) fn parse_addr(text: &str) -> Option<u64> {
    let digits = text.strip_prefix("0x")?.replace('_', "");
    if digits.is_empty() {
        return None;
    }
    u64::from_str_radix(&digits, 16).ok()
}

/// The value of an `at=<hex address>` option (mmap, mremap, brk), its
/// column marked for the checker's errors.
pub(crate) fn at_option(
    l: &mut Line<'_>,
    v: Option<crate::line::Tok<'_>>,
) -> Result<Option<u64>, ParseError> {
    let Some(v) = v else {
        return Ok(None);
    };
    l.mark(Part::At, v.col);
    parse_addr(v.text).map(Some).ok_or_else(|| {
        l.err(
            v.col,
            format!(
                "bad address {}; expected a hex address such as 0x7e0000200000",
                quote(v.text)
            ),
        )
    })
}

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
        let file = match opts[3] {
            Some(v) if valid_file_name(v.text) => {
                l.mark(Part::File, v.col);
                Some(v.text.to_string())
            }
            Some(v) => {
                return Err(l.err(
                    v.col,
                    format!(
                        "bad file name {}; expected [A-Za-z0-9_][A-Za-z0-9_.+-]* (no '/')",
                        quote(v.text)
                    ),
                ))
            }
            None => None,
        };
        let offset = match opts[4] {
            Some(v) => {
                l.mark(Part::Offset, v.col);
                Some(l.size_at(v.text, v.col)?)
            }
            None => None,
        };
        let prot = match opts[5] {
            Some(v) => Some(parse_prot(l, v)?),
            None => None,
        };
        let at = at_option(l, opts[6])?;
        let initial = match opts[10] {
            Some(v) => {
                l.mark(Part::Initial, v.col);
                Some(l.size_at(v.text, v.col)?)
            }
            None => None,
        };
        for (i, name) in [(7, "populate"), (8, "stack"), (9, "growsdown")] {
            if let Some(t) = opts[i] {
                l.mark(Part::Flag(name), t.col);
            }
        }
        Ok(Mmap {
            proc,
            region,
            size,
            align,
            hugetlb,
            shared: opts[2].is_some(),
            file,
            offset,
            prot,
            at,
            populate: opts[7].is_some(),
            stack: opts[8].is_some(),
            growsdown: opts[9].is_some(),
            initial,
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
            // No region of the user address space is aligned to more than
            // its size: mmap could only fail (ENOMEM), and the placement's
            // arithmetic (twice the alignment) would overflow.
            if a.0 > crate::placement::TASK_SIZE {
                return Err(issue(
                    Part::Align,
                    format!(
                        "align={a} is larger than the user address space ({})",
                        Size(TASK_SIZE + crate::units::PAGE_SIZE)
                    ),
                ));
            }
        }
        check_file(self, base.0)?;
        if let Some(at) = self.at {
            check_at(at, size.0, base.0, align.is_some(), hugetlb.is_some())?;
        }
        self.check_flags(base)?;
        p.gone.remove(region);
        p.regions.insert(
            region.clone(),
            Region {
                size: size.0,
                line,
                mapped: Mapped::whole(size.0),
                brk: None,
            },
        );
        Ok(())
    }
}

impl Mmap {
    /// `populate`, `stack`, `growsdown` and `initial=`: what they exclude,
    /// and the initial part of a stack.
    fn check_flags(&self, base: Size) -> Result<(), Issue> {
        let first = [
            (self.populate, "populate"),
            (self.stack, "stack"),
            (self.growsdown, "growsdown"),
        ]
        .into_iter()
        .find_map(|(on, name)| on.then_some(name));
        if let (Some(_), Some(flag)) = (self.hugetlb, first) {
            return Err(issue(
                Part::Flag(flag),
                format!("{flag} is for anonymous memory; with hugetlb= it is not supported yet"),
            ));
        }
        if self.populate && self.prot == Some(Prot::None) {
            return Err(issue(
                Part::Flag("populate"),
                "populate of a prot=none mapping is not supported: there is nothing it could fault in",
            ));
        }
        if self.growsdown && self.shared {
            return Err(issue(
                Part::Flag("growsdown"),
                "growsdown is a private stack; shared is not supported with it",
            ));
        }
        match (self.growsdown, self.initial) {
            (false, Some(_)) => Err(issue(
                Part::Initial,
                "initial= is the first VMA of a growsdown stack; it needs growsdown",
            )),
            (true, Some(i)) if i.0 == 0 || i.0 % base.0 != 0 || i.0 > self.size.0 => Err(issue(
                Part::Initial,
                format!(
                    "initial={i} must be a nonzero multiple of the base page ({base}) of at most the size ({})",
                    self.size
                ),
            )),
            _ => Ok(()),
        }
    }

    /// The bytes at the region's top mapped by the mmap itself: all of
    /// it, or a growsdown stack's `initial` part (`base` when not given).
    pub fn mapped_at_first(&self, base: u64) -> u64 {
        if self.growsdown {
            self.initial.map_or(base, Size::bytes)
        } else {
            self.size.0
        }
    }
}

/// `file=` and `offset=`: a file mapping is neither HugeTLB nor shared (a
/// private mapping of the file), its offset is a multiple of the base page
/// and the mapping ends where a file size can (64 bits).
fn check_file(s: &Mmap, base: u64) -> Result<(), Issue> {
    let Some(file) = &s.file else {
        return match s.offset {
            Some(_) => Err(issue(
                Part::Offset,
                "offset= needs file=: it is an offset into the file mapped",
            )),
            None => Ok(()),
        };
    };
    if s.hugetlb.is_some() {
        return Err(issue(
            Part::File,
            format!("file={file} with hugetlb= is not supported: a file mapping is of the file's page cache"),
        ));
    }
    if let Some(flag) = [
        (s.populate, "populate"),
        (s.stack, "stack"),
        (s.growsdown, "growsdown"),
    ]
    .into_iter()
    .find_map(|(on, name)| on.then_some(name))
    {
        return Err(issue(
            Part::Flag(flag),
            format!("{flag} is for anonymous memory; with file= it is not supported yet"),
        ));
    }
    if s.shared {
        return Err(issue(
            Part::File,
            format!("file={file} with shared is not supported yet: file mappings are MAP_PRIVATE"),
        ));
    }
    let offset = s.offset.map_or(0, |o| o.0);
    if !offset.is_multiple_of(base) {
        return Err(issue(
            Part::Offset,
            format!("offset={offset:#x} is not a multiple of the base page ({base:#x})"),
        ));
    }
    if offset
        .checked_add(s.size.0)
        .is_none_or(|end| end > i64::MAX as u64)
    {
        return Err(issue(
            Part::Offset,
            format!(
                "offset={offset:#x} with size {} ends beyond the largest file size",
                s.size
            ),
        ));
    }
    Ok(())
}

/// What the checker can know of an `at=` address: its alignment, the
/// address-space limits and the options it excludes (whether it overlaps a
/// mapping only the backend knows: EEXIST there).
pub(crate) fn check_at(
    at: u64,
    size: u64,
    base: u64,
    align: bool,
    hugetlb: bool,
) -> Result<(), Issue> {
    if align {
        return Err(issue(
            Part::Align,
            "align= and at= exclude each other: at= already fixes the address",
        ));
    }
    if hugetlb {
        return Err(issue(
            Part::At,
            "at= with hugetlb= is not supported yet; at= maps anonymous memory only",
        ));
    }
    if !at.is_multiple_of(base) {
        return Err(issue(
            Part::At,
            format!("at={at:#x} is not a multiple of the base page ({base:#x})"),
        ));
    }
    if at < MMAP_MIN_ADDR {
        return Err(issue(
            Part::At,
            format!("at={at:#x} is below vm.mmap_min_addr's default ({MMAP_MIN_ADDR:#x})"),
        ));
    }
    if at.checked_add(size).is_none_or(|end| end > TASK_SIZE) {
        return Err(issue(
            Part::At,
            format!(
                "at={at:#x} with size {size:#x} ends above the user address-space limit ({TASK_SIZE:#x})"
            ),
        ));
    }
    Ok(())
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
        if let Some(name) = &self.file {
            write!(f, " file={name}")?;
        }
        if let Some(o) = self.offset {
            write!(f, " offset={o}")?;
        }
        if let Some(p) = self.prot {
            write!(f, " prot={p}")?;
        }
        if let Some(a) = self.at {
            write!(f, " at={a:#x}")?;
        }
        if self.populate {
            f.write_str(" populate")?;
        }
        if self.stack {
            f.write_str(" stack")?;
        }
        if self.growsdown {
            f.write_str(" growsdown")?;
        }
        if let Some(i) = self.initial {
            write!(f, " initial={i}")?;
        }
        Ok(())
    }
}
