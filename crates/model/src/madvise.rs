//! madvise.
//!
//! Follows Linux 6.18 `mm/madvise.c` and `hugepage_madvise` in
//! `mm/khugepaged.c`: MADV_HUGEPAGE sets VM_HUGEPAGE (clearing VM_NOHUGEPAGE) and
//! registers the mm with khugepaged; MADV_NOHUGEPAGE does the reverse; both split
//! and merge VMAs like mprotect. MADV_DONTNEED zaps the range's pages (splitting
//! a PMD THP it only partly covers) and keeps the page tables.
//!
//! Not modelled yet: FREE, COLLAPSE, PAGEOUT, COLD (the model refuses them).

use crate::khugepaged::khugepaged_enter_vma;
use crate::memory::zap_page_range;
use crate::mmap::{update_vma_flags, MmStruct, Vma};
use crate::Machine;

/// MADV_HUGEPAGE / MADV_NOHUGEPAGE over `[start, end)`; false if part is unmapped.
pub fn hugepage_madvise(
    m: &mut Machine,
    mm: &mut MmStruct,
    start: u64,
    end: u64,
    hugepage: bool,
) -> bool {
    let (set, clear) = if hugepage {
        (Vma::VM_HUGEPAGE, Vma::VM_NOHUGEPAGE)
    } else {
        (Vma::VM_NOHUGEPAGE, Vma::VM_HUGEPAGE)
    };
    let covered = update_vma_flags(m, mm, start, end, |flags| (flags & !clear) | set);
    if hugepage {
        for vma in mm.vmas_in(start, end) {
            khugepaged_enter_vma(m, mm, &vma);
        }
    }
    covered
}

/// MADV_DONTNEED over `[start, end)`; false if part is unmapped.
pub fn madvise_dontneed(m: &mut Machine, mm: &mut MmStruct, start: u64, end: u64) -> bool {
    let mut covered = start;
    for vma in mm.vmas_in(start, end) {
        covered = if vma.start <= covered {
            vma.end
        } else {
            covered
        };
        zap_page_range(m, mm, vma.start.max(start), vma.end.min(end));
    }
    covered >= end
}
