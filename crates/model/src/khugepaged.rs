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
//!   `khugepaged_scan_mm_slot` counts the progress toward pages_to_scan and
//!   moves the scan cursor; the passes that time (`sleep`) brings, with
//!   their budget and the cursor carried between them, are in
//!   [`crate::khugepaged_thread`].
//! - MADV_COLLAPSE (`madvise_collapse`) runs the same scan and collapse at
//!   once over the advised range, without khugepaged's limits, and reports
//!   the last failing scan result as an errno (`madvise_collapse_errno`).
//! - The scan counts, per PTE, the pages whose folio is maybe mapped shared
//!   (`folio_maybe_mapped_shared`: a small folio mapped more than once, a
//!   large one mapped by more than one MM), so every PTE of a shared large
//!   folio counts; khugepaged fails once that count exceeds max_ptes_shared.
//!   Since 6.18 (Dev Jain, "mm: Drop all references of writable and
//!   SCAN_PAGE_RO") no writable PTE is needed: a range that fork left
//!   write-protected in the parent is collapsed too.
//! - `__collapse_huge_page_isolate` repeats the none/zero, shared and
//!   refcount checks under the mmap write lock with the same counts; nothing
//!   can change in between here, so the scan's verdict stands for both.
//!
//! Deliberate simplifications:
//! - The kernel backend lets khugepaged make at least two full passes; a range
//!   that fails its checks is counted (`thp_scan_exceed_*`) once per pass
//!   there and once here, which `hugelab diff` treats as a bound.
//! - The anon_vma condition of registration (a VMA with no anon_vma is not
//!   eligible under TVA_KHUGEPAGED) is not modelled: MADV_HUGEPAGE registers
//!   the mm even before the first write. The scan and MADV_COLLAPSE do skip
//!   or refuse such a VMA (only read faults, mapping the zero page).
//! - One pass: a range that only becomes collapsible after a later mm in the
//!   list was collapsed (it stopped sharing pages with it) waits for the next
//!   `khugepaged` statement, where the kernel backend's second pass may
//!   already take it.
//! - The mm list (`khugepaged_scan.mm_head`) is in the order of the task
//!   list (by process name, see `mms`), not in the order of registration.
//! - No swap (max_ptes_swap never applies), every mapped page counts as young (referenced), no NUMA node
//!   choice. The `khugepaged` statement does not back off after a failed
//!   allocation (the paced passes do: alloc_sleep_millisecs).
//!
//! With tracing on (`hugelab explain`), every range scanned, every VMA
//! passed over and MADV_COLLAPSE's return are recorded
//! ([`crate::trace::CollapseStep`]); the counts are kept in locals either
//! way, so tracing off costs one branch per range.

use crate::deferred_split::deferred_split_folio;
use crate::gfp::Gfp;
use crate::huge_mm::{thp_vma_allowable_orders, thp_vma_suitable_order, ThpSettings};
use crate::memory_zap::zap_pte_range;
use crate::mm_types::{
    MmId, MmStruct, Vma, HPAGE_PMD_NR, HPAGE_PMD_ORDER, PMD_SIZE, PTRS_PER_PTE, PUD_SIZE,
};
use crate::pgtable::Pmd;
use crate::rmap;
use crate::sparse::page_folio;
use crate::thp_utilization::{copy_content, set_folio_cause, FolioCause};
use crate::trace::{CollapseStep, Collapser, Scan, ScanCounts, VmaVerdict};
use crate::vmstat::VmEvent;
use crate::Machine;
use hugelab_workload::{Errno, ThpEnabled};

/// khugepaged_enter_vma: register `mm` if `vma` could hold a PMD THP.
pub fn khugepaged_enter_vma(m: &mut Machine, mm: &mut MmStruct, vma: &Vma) {
    if mm.khugepaged_registered {
        return;
    }
    let pmd = 1 << HPAGE_PMD_ORDER;
    if vma_holds_pmd(vma) && thp_vma_allowable_orders(&m.thp, mm, vma, pmd) != 0 {
        mm.khugepaged_registered = true;
    }
}

/// __thp_vma_allowable_orders outside the fault path: some aligned PMD block
/// must fit between vm_start and vm_end.
///
/// No kernel function: the fit check __thp_vma_allowable_orders makes outside the fault path, split out for the trace.
fn vma_holds_pmd(vma: &Vma) -> bool {
    let first = vma.start.next_multiple_of(PMD_SIZE);
    first + PMD_SIZE <= vma.end && thp_vma_suitable_order(vma, first, HPAGE_PMD_ORDER)
}

/// hugepage_pmd_enabled: whether the khugepaged thread runs at all.
pub fn hugepage_pmd_enabled(m: &Machine) -> bool {
    m.thp.size_enabled[HPAGE_PMD_ORDER as usize].resolve(m.thp.enabled) != ThpEnabled::Never
}

/// The `khugepaged` statement: khugepaged_do_scan until every registered mm
/// of the machine was scanned to its end, in the order of the task list (see
/// the module doc), without pages_to_scan's budget. The paced passes of
/// `sleep` are in [`crate::khugepaged_thread`].
pub fn khugepaged_do_scan(m: &mut Machine) {
    if !hugepage_pmd_enabled(m) {
        m.trace_collapse(|| CollapseStep::Stopped);
        return;
    }
    for id in khugepaged_mm_head(m) {
        let mut address = 0;
        // Each collapse drops the mmap lock and ends the visit: the next
        // visit goes on from the cursor.
        while !m.with_mm(id, |m, mm| {
            khugepaged_scan_mm_slot(m, mm, &mut address, u64::MAX).done
        }) {}
    }
}

/// khugepaged_scan.mm_head: the registered mms, in the order of the task
/// list (see the module doc).
pub fn khugepaged_mm_head(m: &Machine) -> Vec<MmId> {
    m.mm_ids_by_task()
        .into_iter()
        .filter(|id| m.mms.get(*id).is_some_and(|mm| mm.khugepaged_registered))
        .collect()
}

/// What one visit of khugepaged_scan_mm_slot did.
pub struct SlotScan {
    /// The progress it made toward pages_to_scan: 1 for taking the mm, 1
    /// per VMA passed over, HPAGE_PMD_NR per PMD range scanned.
    pub progress: u64,
    /// Every VMA was scanned (`vma == NULL` at the end): the cursor moves to
    /// the next mm.
    pub done: bool,
    /// The last range's result, if it scanned one
    /// (SCAN_ALLOC_HUGE_PAGE_FAIL makes khugepaged back off).
    pub result: Option<Scan>,
}

/// khugepaged_scan_mm_slot: the VMAs of `mm` from `address` (the cursor,
/// moved as ranges are scanned) on, until the mm's end, `pages` of progress,
/// or a collapse attempt (collapse_huge_page drops the mmap lock, which ends
/// the visit). A VMA khugepaged may not collapse (hugepage_vma_revalidate's
/// checks) costs 1; an mm with THP disabled is left at once.
pub fn khugepaged_scan_mm_slot(
    m: &mut Machine,
    mm: &mut MmStruct,
    address: &mut u64,
    pages: u64,
) -> SlotScan {
    let mut out = SlotScan {
        progress: 1,
        done: true,
        result: None,
    };
    // hpage_collapse_test_exit_or_disable: MMF_DISABLE_THP.
    if mm.thp_disabled {
        return out;
    }
    let vmas: Vec<Vma> = mm
        .vmas
        .values()
        .filter(|v| v.end > *address)
        .copied()
        .collect();
    for vma in vmas {
        // __thp_vma_allowable_orders under TVA_KHUGEPAGED.
        let allowed = thp_vma_allowable_orders(&m.thp, mm, &vma, 1 << HPAGE_PMD_ORDER) != 0;
        if vma_passed_over(m, Collapser::Khugepaged, mm, &vma, allowed) {
            out.progress += 1;
            continue;
        }
        let (hstart, hend) = (
            vma.start.next_multiple_of(PMD_SIZE),
            vma.end & !(PMD_SIZE - 1),
        );
        if *address > hend {
            out.progress += 1;
            continue;
        }
        *address = (*address).max(hstart);
        while *address < hend {
            let haddr = *address;
            let (scan, counts) = hpage_collapse_scan_pmd(m, mm, haddr, true);
            let mut collapse = None;
            out.result = Some(scan);
            if scan == Scan::Succeed {
                collapse = Some(collapse_huge_page(m, mm, &vma, haddr, true));
                out.result = collapse;
            }
            trace_range(m, Collapser::Khugepaged, mm, haddr, scan, counts, collapse);
            *address += PMD_SIZE;
            out.progress += HPAGE_PMD_NR;
            if collapse.is_some() || out.progress >= pages {
                out.done = false;
                return out;
            }
        }
    }
    out
}

/// Whether `vma` cannot hold a collapse, checked in
/// __thp_vma_allowable_orders' order: the tunables and vetoes (`allowed`,
/// which differ between khugepaged and MADV_COLLAPSE), room for an aligned
/// 2M range, then an anon_vma (a VMA with only read faults, which map the
/// zero page, has none). The reason is recorded when tracing.
///
/// No kernel function: the VMA checks khugepaged_scan_mm_slot and madvise_collapse both make, with their trace.
fn vma_passed_over(
    m: &mut Machine,
    by: Collapser,
    mm: &MmStruct,
    vma: &Vma,
    allowed: bool,
) -> bool {
    let verdict = if !allowed {
        VmaVerdict::NotAllowed
    } else if !vma_holds_pmd(vma) {
        VmaVerdict::NoAlignedRange
    } else if !vma.anon_vma {
        VmaVerdict::NoAnonVma
    } else {
        return false;
    };
    m.trace_collapse(|| CollapseStep::Vma {
        by,
        mm_id: mm.mm_id,
        start: vma.start,
        end: vma.end,
        verdict,
    });
    true
}

/// Records a range's scan and collapse, when tracing.
fn trace_range(
    m: &mut Machine,
    by: Collapser,
    mm: &MmStruct,
    haddr: u64,
    scan: Scan,
    counts: Option<ScanCounts>,
    collapse: Option<Scan>,
) {
    if m.tracing() {
        let gfp = khugepaged_gfp(&m.thp, by == Collapser::Khugepaged);
        m.trace_collapse(|| CollapseStep::Range {
            by,
            mm_id: mm.mm_id,
            haddr,
            scan,
            counts,
            collapse: collapse.map(|r| (gfp, r)),
        });
    }
}

/// hpage_collapse_scan_pmd: whether the PTE table at `haddr` qualifies.
/// For khugepaged, too many none or zero-page PTEs (max_ptes_none) or PTEs of
/// maybe-shared folios (max_ptes_shared) fail with their event counted:
/// `count > max` fails, so max is the largest count that collapses.
/// MADV_COLLAPSE (`khugepaged == false`) applies neither limit. Neither needs
/// a writable PTE (6.18 has no SCAN_PAGE_RO). With the result, what the
/// PTE loop counted before it stopped (`None` when the PMD alone decided).
fn hpage_collapse_scan_pmd(
    m: &mut Machine,
    mm: &MmStruct,
    haddr: u64,
    khugepaged: bool,
) -> (Scan, Option<ScanCounts>) {
    let t = match mm.pmds.get(&(haddr / PMD_SIZE)) {
        Some(Pmd::Table(t)) => t,
        Some(_) => return (Scan::PmdMapped, None),
        // find_pmd_or_thp_or_none: mm_find_pmd needs the PUD entry (a PMD
        // table for this GiB); below it, check_pmd_state finds pmd_none.
        None if mm.pmd_tables.contains_key(&(haddr / PUD_SIZE)) => return (Scan::PmdNone, None),
        None => return (Scan::PmdNull, None),
    };
    let k = &m.thp.khugepaged;
    let mut c = ScanCounts {
        ptes: 0,
        none_or_zero: 0,
        shared: 0,
        max_ptes_none: khugepaged.then_some(k.max_ptes_none),
        max_ptes_shared: khugepaged.then_some(k.max_ptes_shared),
    };
    for pte in t.ptes.iter().take(PTRS_PER_PTE) {
        c.ptes += 1;
        let Some(pfn) = pte.pfn() else {
            c.none_or_zero += 1;
            if khugepaged && c.none_or_zero > k.max_ptes_none {
                m.stat.count_vm_event(VmEvent::ThpScanExceedNonePte);
                return (Scan::ExceedNonePte, Some(c));
            }
            continue;
        };
        // A page counts as shared when any part of its folio is.
        let folio = page_folio(m, pfn);
        if rmap::folio_maybe_mapped_shared(m, folio) {
            c.shared += 1;
            if khugepaged && c.shared > k.max_ptes_shared {
                m.stat.count_vm_event(VmEvent::ThpScanExceedSharePte);
                return (Scan::ExceedSharedPte, Some(c));
            }
        }
        // A reference no mapping explains: a GUP pin.
        if !rmap::folio_refs_all_mappings(m, folio) {
            return (Scan::PageCount, Some(c));
        }
    }
    (Scan::Succeed, Some(c))
}

/// madvise_collapse_errno: the errno MADV_COLLAPSE returns for the last
/// failing result.
fn madvise_collapse_errno(r: Scan) -> Errno {
    match r {
        // No memory for the THP.
        Scan::AllocHugePageFail => Errno::ENOMEM,
        // Too many none PTEs, which MADV_COLLAPSE meets only in a
        // userfaultfd-armed VMA, or a memcg charge failed.
        Scan::ExceedNonePte | Scan::CgroupChargeFail => Errno::EBUSY,
        // "Resource temporary unavailable - trying again might succeed"
        // (a pinned page; also SCAN_PAGE_LOCK, SCAN_PAGE_LRU,
        // SCAN_DEL_PAGE_LRU, SCAN_PAGE_FILLED, which the model does not meet).
        Scan::PageCount => Errno::EAGAIN,
        // The range cannot be collapsed; trying again would not help.
        Scan::Succeed | Scan::PmdNull | Scan::PmdNone | Scan::PmdMapped | Scan::ExceedSharedPte => {
            Errno::EINVAL
        }
    }
}

/// madvise_collapse over `[start, end)`, one VMA after the other
/// (madvise_walk_vmas, which stops at the first VMA that fails).
///
/// A VMA must be eligible (TVA_FORCED_COLLAPSE: whatever the sysfs THP
/// settings say, but never VM_NOHUGEPAGE or a process with THP disabled, and
/// only with an anon_vma and room for an aligned 2 MiB block), else EINVAL.
/// Then every aligned 2 MiB range in it is scanned and collapsed now. A range
/// already mapped by a PMD counts as done; a few failures let the loop go on
/// to the next range (SCAN_PMD_NULL, SCAN_PAGE_COUNT, ...), any other ends it
/// (SCAN_PMD_NONE: an empty range next to populated ones; SCAN_ALLOC_HUGE_PAGE_FAIL).
/// The call succeeds iff every range ends up PMD-mapped; otherwise the last
/// failure decides the errno (madvise_collapse_errno). khugepaged's
/// pages_collapsed is not counted.
pub fn madvise_collapse(
    m: &mut Machine,
    mm: &mut MmStruct,
    start: u64,
    end: u64,
) -> Result<(), Errno> {
    let result = madvise_collapse_vmas(m, mm, start, end);
    if m.tracing() {
        let (last_fail, errno) = match result {
            Ok(()) => (None, None),
            Err((e, r)) => (r, Some(e)),
        };
        m.trace_collapse(|| CollapseStep::Return {
            mm_id: mm.mm_id,
            last_fail,
            errno,
        });
    }
    result.map_err(|(e, _)| e)
}

/// madvise_collapse's walk; an error comes with the result it is from.
///
/// No kernel function: madvise_collapse's loop over the VMAs, split out so the result and its error come back together.
fn madvise_collapse_vmas(
    m: &mut Machine,
    mm: &mut MmStruct,
    start: u64,
    end: u64,
) -> Result<(), (Errno, Option<Scan>)> {
    for vma in mm.vmas_in(start, end) {
        // TVA_FORCED_COLLAPSE: only the vetoes.
        let allowed = !crate::huge_mm::vma_thp_disabled(mm, &vma);
        if vma_passed_over(m, Collapser::MadviseCollapse, mm, &vma, allowed) {
            return Err((Errno::EINVAL, None));
        }
        let hstart = vma.start.max(start).next_multiple_of(PMD_SIZE);
        let hend = vma.end.min(end) & !(PMD_SIZE - 1);
        let (mut thps, mut last_fail) = (0u64, None);
        let mut haddr = hstart;
        while haddr < hend {
            let (scan, counts) = hpage_collapse_scan_pmd(m, mm, haddr, false);
            let mut result = scan;
            let mut collapse = None;
            if scan == Scan::Succeed {
                result = collapse_huge_page(m, mm, &vma, haddr, false);
                collapse = Some(result);
            }
            trace_range(
                m,
                Collapser::MadviseCollapse,
                mm,
                haddr,
                scan,
                counts,
                collapse,
            );
            match result {
                Scan::Succeed | Scan::PmdMapped => thps += 1,
                // The whitelisted results: go on with the next range.
                Scan::PmdNull | Scan::PageCount => last_fail = Some(result),
                Scan::PmdNone
                | Scan::ExceedNonePte
                | Scan::ExceedSharedPte
                | Scan::AllocHugePageFail
                | Scan::CgroupChargeFail => {
                    last_fail = Some(result);
                    break;
                }
            }
            haddr += PMD_SIZE;
        }
        if hstart < hend && thps != (hend - hstart) / PMD_SIZE {
            // thps falls short only after a failure.
            let last = last_fail.unwrap_or(Scan::Succeed);
            return Err((madvise_collapse_errno(last), Some(last)));
        }
    }
    Ok(())
}

/// collapse_huge_page: a new PMD THP with the contents of the range (zero
/// where nothing or the zero page was mapped), the old pages unmapped and
/// freed, and the range's PTE table kept as the THP's deposited table.
/// Fails only when no THP can be allocated (SCAN_ALLOC_HUGE_PAGE_FAIL).
fn collapse_huge_page(
    m: &mut Machine,
    mm: &mut MmStruct,
    vma: &Vma,
    haddr: u64,
    khugepaged: bool,
) -> Scan {
    let gfp = khugepaged_gfp(&m.thp, khugepaged);
    let Some(folio) = crate::page_alloc::folio_alloc(m, Some(mm), gfp, HPAGE_PMD_ORDER) else {
        m.stat.count_vm_event(VmEvent::ThpCollapseAllocFailed);
        return Scan::AllocHugePageFail;
    };
    m.stat.count_vm_event(VmEvent::ThpCollapseAlloc);
    // alloc_charge_folio: thp_collapse_alloc is counted before the charge.
    let mm_id = mm.mm_id;
    let order = HPAGE_PMD_ORDER;
    if crate::memcontrol_charge::mem_cgroup_charge(m, Some(&mut *mm), mm_id, folio, order, gfp)
        .is_err()
    {
        crate::page_alloc::free_folio(m, folio);
        return Scan::CgroupChargeFail;
    }
    let index = haddr / PMD_SIZE;
    // __collapse_huge_page_copy: the old page copied into each subpage, if
    // any (none and zero-page PTEs become zero-filled, never-written pages).
    let old: Vec<Option<crate::mm_types::Pfn>> = match mm.pmds.get(&index) {
        Some(Pmd::Table(t)) => t.ptes.iter().map(|pte| pte.pfn()).collect(),
        _ => unreachable!("collapse of a range without a PTE table"),
    };
    for (i, page) in old.iter().enumerate() {
        if let Some(page) = page {
            copy_content(m, *page, crate::mm_types::Pfn(folio.0 + i as u64));
        }
    }
    zap_pte_range(m, mm, index, haddr, haddr + PMD_SIZE);
    let Some(Pmd::Table(table)) = mm.pmds.remove(&index) else {
        unreachable!("the PTE table went away during collapse");
    };
    let pgoff = vma.linear_page_index(haddr);
    rmap::folio_add_new_anon_rmap(m, folio, HPAGE_PMD_ORDER, true, mm.mm_id, pgoff);
    let cause = if khugepaged {
        FolioCause::Khugepaged
    } else {
        FolioCause::MadviseCollapse
    };
    set_folio_cause(m, folio, cause);
    m.stat.add_mm_anon(&mut mm.anon_rss, HPAGE_PMD_NR);
    mm.pmds.insert(
        index,
        Pmd::Huge {
            pfn: folio,
            writable: vma.flags & Vma::VM_WRITE != 0,
            dirty: true,
            deposit: table.page,
        },
    );
    deferred_split_folio(m, folio, false);
    if khugepaged {
        m.stat.khugepaged_pages_collapsed += 1;
    }
    Scan::Succeed
}

/// alloc_hugepage_khugepaged_gfpmask: `khugepaged/defrag` picks direct
/// reclaim or none; MADV_COLLAPSE always passes GFP_TRANSHUGE.
///
/// Not alloc_hugepage_khugepaged_gfpmask: it also gives MADV_COLLAPSE's GFP_TRANSHUGE, as alloc_charge_folio chooses.
pub fn khugepaged_gfp(thp: &ThpSettings, khugepaged: bool) -> Gfp {
    if !khugepaged || thp.khugepaged.defrag != 0 {
        Gfp::TRANSHUGE
    } else {
        Gfp::TRANSHUGE_LIGHT
    }
}

#[cfg(test)]
mod tests {
    use crate::Model;
    use hugelab_workload::{parse, run, Errno};

    /// The settings every workload here starts from: PMD THP under madvise,
    /// no mTHP sizes.
    const SETTINGS: &str = "set transparent_hugepage/enabled madvise\n\
         set transparent_hugepage/hugepages-2048kB/enabled inherit\n\
         set transparent_hugepage/khugepaged/max_ptes_none 511\n";

    /// Runs `body`: the errno of the first statement that failed, if one
    /// did, and the counters at the end.
    fn run_to_failure(body: &str) -> (Option<Errno>, hugelab_workload::Counters) {
        let w = parse("test.hlw", &format!("{SETTINGS}{body}")).unwrap();
        let obs = run(&mut Model::default(), &w).unwrap();
        let failure = obs.failed_calls.first().map(|c| c.errno);
        let end = obs.snapshots.last().expect("the end snapshot");
        (failure, end.counters.clone())
    }

    /// thp_collapse_alloc after a parent wrote 2M of base pages, forked, the
    /// child wrote its first `child_pages` pages and khugepaged ran with
    /// max_ptes_shared `max_shared`.
    fn collapses_after_fork(child_pages: u64, max_shared: u64) -> i64 {
        let (failure, counters) = run_to_failure(&format!(
            "set transparent_hugepage/khugepaged/max_ptes_shared {max_shared}\n\
             spawn a\n\
             a mmap buf 2M align=2M\n\
             a write buf\n\
             a madvise buf HUGEPAGE\n\
             a fork b\n\
             b write buf:{}K\n\
             khugepaged\n",
            child_pages * 4
        ));
        assert_eq!(failure, None);
        counters["vmstat.thp_collapse_alloc"]
    }

    #[test]
    fn max_ptes_shared_is_the_largest_number_of_shared_ptes_that_collapse() {
        // 512 - child_pages PTEs map pages both processes share, in each.
        assert_eq!(collapses_after_fork(100, 411), 0);
        // The parent's PTEs are all write-protected: it collapses too.
        assert_eq!(collapses_after_fork(100, 412), 2);
        assert_eq!(collapses_after_fork(100, 413), 2);
        assert_eq!(collapses_after_fork(256, 255), 0);
        assert_eq!(collapses_after_fork(256, 256), 2);
    }

    /// Base pages over `len` (THP off at fault time), then MADV_HUGEPAGE.
    fn pte_mapped(len: &str) -> String {
        format!(
            "spawn a\n\
             a mmap buf {len} align=2M\n\
             a madvise buf NOHUGEPAGE\n\
             a write buf\n\
             a madvise buf HUGEPAGE\n"
        )
    }

    #[test]
    fn madvise_collapse_of_a_pinned_range_is_eagain_until_unpin() {
        // madvise_collapse_errno(SCAN_PAGE_COUNT) = -EAGAIN.
        let (failure, counters) = run_to_failure(&format!(
            "{}a pin buf\na madvise buf COLLAPSE\n",
            pte_mapped("2M")
        ));
        assert_eq!(failure, Some(Errno::EAGAIN));
        assert_eq!(counters["vmstat.thp_collapse_alloc"], 0);
        let (failure, counters) = run_to_failure(&format!(
            "{}a pin buf\na unpin buf\na madvise buf COLLAPSE\n",
            pte_mapped("2M")
        ));
        assert_eq!(failure, None);
        assert_eq!(counters["smaps.a.buf.AnonHugePages"], 2048);
    }

    #[test]
    fn madvise_collapse_goes_on_past_a_pinned_range() {
        // SCAN_PAGE_COUNT is one of the results the loop continues after: the
        // second range is collapsed, and the call still fails with EAGAIN.
        let (failure, counters) = run_to_failure(&format!(
            "{}a pin buf:4K\na madvise buf COLLAPSE\n",
            pte_mapped("4M")
        ));
        assert_eq!(failure, Some(Errno::EAGAIN));
        assert_eq!(counters["vmstat.thp_collapse_alloc"], 1);
        assert_eq!(counters["smaps.a.buf.AnonHugePages"], 2048);
    }

    #[test]
    fn madvise_collapse_stops_at_an_empty_range_below_a_pmd_table() {
        // The PMD table exists (the other 2M faulted): SCAN_PMD_NONE, which
        // ends the loop with EINVAL before the populated range.
        let (failure, counters) = run_to_failure(
            "spawn a\n\
             a mmap buf 4M align=2M\n\
             a madvise buf NOHUGEPAGE\n\
             a write buf+2M\n\
             a madvise buf HUGEPAGE\n\
             a madvise buf COLLAPSE\n",
        );
        assert_eq!(failure, Some(Errno::EINVAL));
        assert_eq!(counters["vmstat.thp_collapse_alloc"], 0);
    }

    #[test]
    fn madvise_collapse_needs_no_writable_pte_but_an_anon_vma() {
        // 6.18 has no SCAN_PAGE_RO: a read-only range collapses.
        let (failure, counters) = run_to_failure(&format!(
            "{}a mprotect buf r\na madvise buf COLLAPSE\n",
            pte_mapped("2M")
        ));
        assert_eq!(failure, None);
        assert_eq!(counters["smaps.a.buf.AnonHugePages"], 2048);
        // Read faults map the zero page and prepare no anon_vma:
        // TVA_FORCED_COLLAPSE refuses the VMA (EINVAL).
        let (failure, counters) = run_to_failure(
            "spawn a\n\
             a mmap buf 2M align=2M\n\
             a madvise buf NOHUGEPAGE\n\
             a read buf\n\
             a madvise buf HUGEPAGE\n\
             a madvise buf COLLAPSE\n",
        );
        assert_eq!(failure, Some(Errno::EINVAL));
        assert_eq!(counters["vmstat.thp_collapse_alloc"], 0);
    }

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
        crate::end_counters(&text)["vmstat.thp_collapse_alloc"]
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
