//! madvise: MADV_HUGEPAGE, MADV_NOHUGEPAGE and MADV_DONTNEED.
//!
//! Follows Linux 6.18 `mm/madvise.c` and `hugepage_madvise` in
//! `mm/khugepaged.c`: MADV_HUGEPAGE sets VM_HUGEPAGE (clearing VM_NOHUGEPAGE) and
//! registers the mm with khugepaged; MADV_NOHUGEPAGE does the reverse; both split
//! and merge VMAs like mprotect. MADV_DONTNEED zaps the range's pages (splitting
//! a PMD THP it only partly covers); with CONFIG_PT_RECLAIM (x86_64 default, as
//! on the development machines) it also frees every PTE table whose whole
//! 2 MiB range it covered and left empty (`zap_details.reclaim_pt`,
//! mm/pt_reclaim.c), so a later fault there can take a PMD THP again.
//!
//! MADV_COLLAPSE is `khugepaged::madvise_collapse`, in mm/khugepaged.c as in
//! the kernel.
//!
//! Not modelled yet: FREE, PAGEOUT, COLD (the model refuses them).

use crate::khugepaged::khugepaged_enter_vma;
use crate::memory::zap_page_range;
use crate::mm_types::PMD_SIZE;
use crate::mmap::{update_vma_flags, MmStruct, Vma};
use crate::pgtable::Pmd;
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
        let (lo, hi) = (vma.start.max(start), vma.end.min(end));
        zap_page_range(m, mm, lo, hi);
        reclaim_pt(m, mm, lo, hi);
    }
    covered >= end
}

/// The PT_RECLAIM step of zap_pte_range: a PTE table whose 2 MiB range lies
/// wholly inside the zapped range, and which holds no entry any more, is
/// cleared from its PMD and freed.
fn reclaim_pt(m: &mut Machine, mm: &mut MmStruct, start: u64, end: u64) {
    let first = start.div_ceil(PMD_SIZE);
    let last = end / PMD_SIZE;
    for index in first..last {
        if let Some(Pmd::Table(t)) = mm.pmds.get(&index) {
            if t.is_empty() {
                if let Some(Pmd::Table(t)) = mm.pmds.remove(&index) {
                    m.pte_free(t.page);
                }
            }
        }
    }
}
