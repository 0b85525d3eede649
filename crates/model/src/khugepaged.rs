//! khugepaged: registration, and the scan that collapses PTE-mapped ranges
//! of anonymous memory into PMD THPs.
//!
//! Follows Linux 6.18 `mm/khugepaged.c`:
//! - `khugepaged_enter_vma` registers an mm (`__khugepaged_enter`) when a VMA
//!   becomes eligible for the PMD order under khugepaged's rules
//!   (TVA_KHUGEPAGED, which also needs the VMA to hold an aligned 2 MiB block).
//! - The `khugepaged` statement is `khugepaged_do_scan` run until every
//!   registered mm has been scanned to its end (`khugepaged_scan_mm_slot`):
//!   each aligned 2 MiB range of each eligible VMA goes through
//!   `hpage_collapse_scan_pmd` and, when it qualifies, `collapse_huge_page`.
//!   Nothing happens while the PMD size is disabled (the thread is stopped).
//! - MADV_COLLAPSE (`madvise_collapse`) runs the same scan and collapse at
//!   once over the advised range, without khugepaged's limits.
//!
//! Deliberate simplifications:
//! - The kernel backend lets khugepaged make at least two full passes; a range
//!   that fails its checks is counted (`thp_scan_exceed_*`) once per pass
//!   there and once here, which `hugelab diff` treats as a bound.
//! - The anon_vma condition (a VMA without an anon_vma, which only read
//!   faults touched, is eligible neither for registration nor for the scan)
//!   is not modelled: such a VMA maps at most the zero page, so nothing is
//!   collapsed either way, but the model's scan of its zero-page PTEs counts
//!   thp_scan_exceed_none_pte where the kernel skips the VMA.
//! - No swap (max_ptes_swap never applies), every mapped page counts as young (referenced), no NUMA node
//!   choice, synchronous allocation with no alloc_sleep back-off.

use crate::huge_memory::{deferred_split_folio, thp_vma_allowable_orders, thp_vma_suitable_order};
use crate::memory::zap_pte_range;
use crate::mm_types::{page_folio, pg, HPAGE_PMD_NR, HPAGE_PMD_ORDER, PMD_SIZE, PTRS_PER_PTE};
use crate::mmap::{MmStruct, Vma};
use crate::page_alloc::alloc_folio;
use crate::pgtable::Pmd;
use crate::rmap;
use crate::vmstat::VmEvent;
use crate::Machine;
use hugelab_workload::{ThpEnabled, ThpSizeEnabled};

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

/// hugepage_pmd_enabled: whether the khugepaged thread runs at all.
pub fn hugepage_pmd_enabled(m: &Machine) -> bool {
    match m.thp.size_enabled[HPAGE_PMD_ORDER as usize] {
        ThpSizeEnabled::Always | ThpSizeEnabled::Madvise => true,
        ThpSizeEnabled::Inherit => m.thp.enabled != ThpEnabled::Never,
        ThpSizeEnabled::Never => false,
    }
}

/// khugepaged_do_scan until every registered mm was scanned to its end.
pub fn khugepaged_do_scan<'a>(m: &mut Machine, mms: impl Iterator<Item = &'a mut MmStruct>) {
    if !hugepage_pmd_enabled(m) {
        return;
    }
    for mm in mms.filter(|mm| mm.khugepaged_registered) {
        khugepaged_scan_mm_slot(m, mm);
    }
}

/// khugepaged_scan_mm_slot: every aligned 2 MiB range of every VMA that is
/// still eligible (hugepage_vma_revalidate).
fn khugepaged_scan_mm_slot(m: &mut Machine, mm: &mut MmStruct) {
    let vmas: Vec<Vma> = mm.vmas.values().copied().collect();
    for vma in vmas {
        if thp_vma_allowable_orders(&m.thp, mm, &vma, 1 << HPAGE_PMD_ORDER) == 0 {
            continue;
        }
        let mut haddr = vma.start.next_multiple_of(PMD_SIZE);
        while haddr + PMD_SIZE <= vma.end {
            if hpage_collapse_scan_pmd(m, mm, haddr, true) == Scan::Succeed {
                collapse_huge_page(m, mm, &vma, haddr, true);
            }
            haddr += PMD_SIZE;
        }
    }
}

/// The outcome of a scan (`enum scan_result`, the cases the model meets).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scan {
    Succeed,
    /// No PTE table: nothing mapped here (SCAN_PMD_NULL).
    PmdNull,
    /// Already a PMD mapping (SCAN_PMD_MAPPED).
    PmdMapped,
    ExceedNonePte,
    ExceedSharedPte,
    /// No writable PTE (SCAN_PAGE_RO).
    PageRo,
    /// A folio with references beyond its mappings (SCAN_PAGE_COUNT).
    PageCount,
}

/// hpage_collapse_scan_pmd: whether the PTE table at `haddr` qualifies.
/// For khugepaged, too many none or zero-page PTEs (max_ptes_none) or
/// shared pages (max_ptes_shared) fail with their event counted; MADV_COLLAPSE
/// (`khugepaged == false`) applies neither limit. Both need a writable PTE.
fn hpage_collapse_scan_pmd(m: &mut Machine, mm: &MmStruct, haddr: u64, khugepaged: bool) -> Scan {
    let t = match mm.pmds.get(&(haddr / PMD_SIZE)) {
        Some(Pmd::Table(t)) => t,
        Some(_) => return Scan::PmdMapped,
        None => return Scan::PmdNull,
    };
    let k = &m.thp.khugepaged;
    let (mut none_or_zero, mut shared, mut writable) = (0u64, 0u64, false);
    for pte in t.ptes.iter().take(PTRS_PER_PTE) {
        let Some(pfn) = pte.pfn() else {
            none_or_zero += 1;
            if khugepaged && none_or_zero > k.max_ptes_none {
                m.stat.count_vm_event(VmEvent::ThpScanExceedNonePte);
                return Scan::ExceedNonePte;
            }
            continue;
        };
        writable |= pte.is_writable();
        // A page counts as shared when any part of its folio is.
        let folio = page_folio(m, pfn);
        if rmap::folio_maybe_mapped_shared(m, folio) {
            shared += 1;
            if khugepaged && shared > k.max_ptes_shared {
                m.stat.count_vm_event(VmEvent::ThpScanExceedSharePte);
                return Scan::ExceedSharedPte;
            }
        }
        // A reference no mapping explains: a GUP pin.
        if !rmap::folio_refs_all_mappings(m, folio) {
            return Scan::PageCount;
        }
    }
    if writable {
        Scan::Succeed
    } else {
        Scan::PageRo
    }
}

/// Why MADV_COLLAPSE failed, as madvise(2) reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CollapseError {
    /// EINVAL: the VMA may not hold a THP, or a range could not be collapsed.
    Inval,
    /// ENOMEM: no memory for the THP (SCAN_ALLOC_HUGE_PAGE_FAIL).
    NoMem,
}

/// madvise_collapse over `[start, end)`: every aligned 2 MiB range of every
/// VMA there is collapsed now, whatever the sysfs THP settings say
/// (TVA_FORCED_COLLAPSE) but never in a VM_NOHUGEPAGE VMA or a process with
/// THP disabled; a range already mapped by a PMD counts as done, an empty one
/// (no PTE table) as failed. khugepaged's pages_collapsed is not counted.
pub fn madvise_collapse(
    m: &mut Machine,
    mm: &mut MmStruct,
    start: u64,
    end: u64,
) -> Result<(), CollapseError> {
    let vmas = mm.vmas_in(start, end);
    let mut result = Ok(());
    for vma in vmas {
        if crate::huge_memory::vma_thp_disabled(mm, &vma) {
            return Err(CollapseError::Inval);
        }
        let hstart = vma.start.max(start).next_multiple_of(PMD_SIZE);
        let hend = vma.end.min(end) & !(PMD_SIZE - 1);
        let mut haddr = hstart;
        while haddr < hend {
            match hpage_collapse_scan_pmd(m, mm, haddr, false) {
                Scan::Succeed => {
                    if !collapse_huge_page(m, mm, &vma, haddr, false) {
                        return Err(CollapseError::NoMem);
                    }
                }
                Scan::PmdMapped => {}
                // Whitelisted: go on, but the call fails in the end.
                Scan::PmdNull => result = Err(CollapseError::Inval),
                Scan::PageRo | Scan::ExceedNonePte | Scan::ExceedSharedPte | Scan::PageCount => {
                    return Err(CollapseError::Inval)
                }
            }
            haddr += PMD_SIZE;
        }
    }
    result
}

/// collapse_huge_page: a new PMD THP with the contents of the range (zero
/// where nothing or the zero page was mapped), the old pages unmapped and
/// freed, and the range's PTE table kept as the THP's deposited table.
fn collapse_huge_page(
    m: &mut Machine,
    mm: &mut MmStruct,
    vma: &Vma,
    haddr: u64,
    khugepaged: bool,
) -> bool {
    let Some(folio) = alloc_folio(m, HPAGE_PMD_ORDER) else {
        m.stat.count_vm_event(VmEvent::ThpCollapseAllocFailed);
        return false;
    };
    m.stat.count_vm_event(VmEvent::ThpCollapseAlloc);
    let index = haddr / PMD_SIZE;
    // __collapse_huge_page_copy: which subpages receive non-zero data.
    let dirty: Vec<bool> = match mm.pmds.get(&index) {
        Some(Pmd::Table(t)) => t
            .ptes
            .iter()
            .map(|pte| {
                pte.pfn()
                    .is_some_and(|p| !m.zone.memmap.page(p).test(pg::ZEROED))
            })
            .collect(),
        _ => unreachable!("collapse of a range without a PTE table"),
    };
    zap_pte_range(m, mm, index, haddr, haddr + PMD_SIZE);
    let Some(Pmd::Table(table)) = mm.pmds.remove(&index) else {
        unreachable!("the PTE table went away during collapse");
    };
    for (i, d) in dirty.iter().enumerate() {
        if *d {
            m.zone
                .memmap
                .page_mut(crate::mm_types::Pfn(folio.0 + i as u64))
                .clear(pg::ZEROED);
        }
    }
    rmap::folio_add_new_anon_rmap(m, folio, HPAGE_PMD_ORDER, true);
    mm.anon_rss += HPAGE_PMD_NR;
    mm.pmds.insert(
        index,
        Pmd::Huge {
            pfn: folio,
            writable: vma.flags & Vma::VM_WRITE != 0,
            deposit: table.page,
        },
    );
    deferred_split_folio(m, folio, false);
    if khugepaged {
        m.stat.khugepaged_pages_collapsed += 1;
    }
    true
}

#[cfg(test)]
mod tests {
    use crate::Model;
    use hugelab_workload::{parse, run};

    /// Collapses after writing `pages` pages of one PMD range, with
    /// max_ptes_none set to `max_none`.
    fn collapses(pages: u64, max_none: u64) -> i64 {
        let text = format!(
            "set transparent_hugepage/enabled madvise\n\
             set transparent_hugepage/khugepaged/max_ptes_none {max_none}\n\
             spawn a\n\
             a mmap buf 2M align=2M\n\
             a write buf:{}K\n\
             a madvise buf HUGEPAGE\n\
             khugepaged\n",
            pages * 4
        );
        let w = parse("boundary.hlw", &text).unwrap();
        let obs = run(&mut Model::default(), &w).unwrap();
        obs.snapshot("end").unwrap().counters["vmstat.thp_collapse_alloc"]
    }

    #[test]
    fn max_ptes_none_is_the_largest_number_of_empty_ptes_that_collapse() {
        // 512 - pages none PTEs: collapse iff that is <= max_ptes_none.
        assert_eq!(collapses(256, 256), 1);
        assert_eq!(collapses(255, 256), 0);
        assert_eq!(collapses(1, 511), 1);
        assert_eq!(collapses(511, 0), 0);
        assert_eq!(collapses(512, 0), 1);
    }
}
