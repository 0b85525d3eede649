//! khugepaged registration.
//!
//! Follows Linux 6.18 `mm/khugepaged.c`: `khugepaged_enter_vma` registers an mm
//! with khugepaged (`__khugepaged_enter`) when a VMA becomes eligible for the PMD
//! order under khugepaged's rules (TVA_KHUGEPAGED, which also needs the VMA to
//! be large enough for an aligned 2 MiB block). Only registration is modelled so
//! far: scanning and collapse come with the `khugepaged` statement.

use crate::huge_memory::{thp_vma_allowable_orders, thp_vma_suitable_order};
use crate::mm_types::{HPAGE_PMD_ORDER, PMD_SIZE};
use crate::mmap::{MmStruct, Vma};
use crate::Machine;

/// khugepaged_enter_vma: register `mm` if `vma` could hold a PMD THP.
pub fn khugepaged_enter_vma(m: &mut Machine, mm: &mut MmStruct, vma: &Vma) {
    if mm.khugepaged_registered {
        return;
    }
    let pmd = 1 << HPAGE_PMD_ORDER;
    let fits = {
        // __thp_vma_allowable_orders outside the fault path: some aligned PMD
        // block must fit between vm_start and vm_end.
        let first = vma.start.next_multiple_of(PMD_SIZE);
        first + PMD_SIZE <= vma.end && thp_vma_suitable_order(vma, first, HPAGE_PMD_ORDER)
    };
    if fits && thp_vma_allowable_orders(&m.thp, mm, vma, pmd) != 0 {
        mm.khugepaged_registered = true;
    }
}
