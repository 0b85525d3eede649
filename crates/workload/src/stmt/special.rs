//! `<proc> special <mapping>[+<offset>][:<len>]`: the process reads pages
//! of a special mapping exec gave it (mm/mmap.c `_install_special_mapping`):
//! `vdso` (the vDSO's text, arch/x86/entry/vdso/vma.c), `vvar` and
//! `vvar_vclock` (its data, lib/vdso/datastore.c and vma.c, VM_PFNMAP).
//! Every process has them from `spawn` and again, fresh, after `exec`; they
//! are not regions (no statement maps, unmaps or advises them), and they
//! are named by these reserved words, which are not identifiers of the
//! recording (`[vdso]`). An offset is within the mapping, wherever it is:
//! a recording and its replay have their vDSO at different addresses.
//!
//! The sizes and the pages that can be read are those of x86-64 Linux 6.18
//! ([`SPECIAL_MAPPINGS`]): a read of a page whose fault handler raises
//! SIGBUS (the time-namespace page outside a time namespace, the Hyper-V
//! clock page) is refused by the checker.

use crate::ast::{Name, Range};
use crate::checker::{issue, Checker, Issue, Part};
use crate::line::Line;
use crate::text::{quote, ParseError};
use crate::units::PAGE_SIZE;
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Special {
    pub proc: Name,
    /// The mapping (`vdso`, `vvar`, `vvar_vclock`) and the pages of it.
    pub range: Range,
}

/// A special mapping: its name in a workload, its name in /proc/PID/maps,
/// its size in pages and the pages a read may fault (bit i: page i).
#[derive(Clone, Copy, Debug)]
pub struct SpecialMapping {
    pub name: &'static str,
    pub maps_name: &'static str,
    pub pages: u64,
    pub readable: u64,
    /// VM_PFNMAP: fork copies its PTEs (copy_page_range, vma_needs_copy);
    /// the vDSO text has no anon_vma and no VM_PFNMAP, so fork leaves its
    /// PTEs to fault again.
    pub pfnmap: bool,
}

/// x86-64, Linux 6.18: `[vvar]` is the time page, the time-namespace page
/// (SIGBUS outside a time namespace), the random-number page and one more
/// (SIGBUS); `[vvar_vclock]` the pvclock page (a KVM guest's kvm-clock)
/// and the Hyper-V page (SIGBUS elsewhere); `[vdso]` two pages of text.
pub const SPECIAL_MAPPINGS: [SpecialMapping; 3] = [
    SpecialMapping {
        name: "vdso",
        maps_name: "[vdso]",
        pages: 2,
        readable: 0b11,
        pfnmap: false,
    },
    SpecialMapping {
        name: "vvar",
        maps_name: "[vvar]",
        pages: 4,
        readable: 0b0101,
        pfnmap: true,
    },
    SpecialMapping {
        name: "vvar_vclock",
        maps_name: "[vvar_vclock]",
        pages: 2,
        readable: 0b01,
        pfnmap: true,
    },
];

/// The special mapping named `name` in a workload.
pub fn special_mapping(name: &str) -> Option<(usize, &'static SpecialMapping)> {
    SPECIAL_MAPPINGS
        .iter()
        .enumerate()
        .find(|(_, m)| m.name == name)
}

const USAGE: &str = "<proc> special <vdso|vvar|vvar_vclock>[+<offset>][:<len>]";

impl Special {
    pub(crate) fn parse(l: &mut Line<'_>, proc: Name) -> Result<Special, ParseError> {
        let range = l.range_arg(2, USAGE)?;
        l.no_more(3, USAGE)?;
        Ok(Special { proc, range })
    }

    /// The index of the mapping in [`SPECIAL_MAPPINGS`] and its first and
    /// last-plus-one page; an error sentence for a range outside it.
    pub fn pages(&self) -> Result<(usize, u64, u64), String> {
        let Some((i, m)) = special_mapping(&self.range.region) else {
            return Err(format!(
                "unknown special mapping {}; expected vdso, vvar or vvar_vclock",
                quote(&self.range.region)
            ));
        };
        let (start, end) = self.range.resolve(0, m.pages * PAGE_SIZE)?;
        if start % PAGE_SIZE != 0 || end % PAGE_SIZE != 0 || start == end {
            return Err(format!(
                "range {} is not whole pages of {}",
                self.range, m.name
            ));
        }
        Ok((i, start / PAGE_SIZE, end / PAGE_SIZE))
    }

    pub(crate) fn check(&self, c: &mut Checker, _: u32) -> Result<(), Issue> {
        c.live_ref(&self.proc)?;
        let (i, first, end) = self.pages().map_err(|e| issue(Part::Range, e))?;
        let m = &SPECIAL_MAPPINGS[i];
        if let Some(p) = (first..end).find(|p| m.readable & (1 << p) == 0) {
            return Err(issue(
                Part::Range,
                format!(
                    "page {} of {} faults with SIGBUS on x86-64 Linux 6.18 (no time namespace, no Hyper-V clock); it cannot be read",
                    p, m.name
                ),
            ));
        }
        Ok(())
    }
}

impl fmt::Display for Special {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} special {}", self.proc, self.range)
    }
}
