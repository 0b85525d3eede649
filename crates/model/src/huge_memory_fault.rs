//! The THP fault paths: a fault on an empty PMD that may hold a PMD THP
//! (or the huge zero folio), and write faults on a PMD mapping.
//!
//! Follows Linux 6.18 `mm/huge_memory.c` (`do_huge_pmd_anonymous_page`,
//! `vma_alloc_anon_folio_pmd`, `map_anon_folio_pmd`, `do_huge_zero_wp_pmd`,
//! `do_huge_pmd_wp_page`). The fault half of that file, in a module of its
//! own: a fault charges its folio to a memcg, and the charge may reclaim,
//! which splits folios (`huge_memory`, the other half); the faults sit above
//! the charge, the splits below it.

use crate::deferred_split::deferred_split_folio;
use crate::huge_memory::{mm_get_huge_zero_folio, split_huge_pmd, vma_thp_gfp_mask, PmdFault};
use crate::huge_mm::thp_vma_suitable_order;
use crate::mm_types::{pg, Fault, MmStruct, Pfn, Vma, HPAGE_PMD_NR, HPAGE_PMD_ORDER, PMD_SIZE};
use crate::page_alloc::free_folio;
use crate::pgtable::Pmd;
use crate::rmap;
use crate::trace::Step;
use crate::vmstat::{Counted, MthpStat, VmEvent};
use crate::Machine;

/// do_huge_pmd_anonymous_page: a fault on an empty PMD of a VMA allowed the PMD order.
pub fn do_huge_pmd_anonymous_page(
    m: &mut Machine,
    mm: &mut MmStruct,
    vma: &Vma,
    addr: u64,
    write: bool,
) -> Result<PmdFault, Fault> {
    let haddr = addr & !(PMD_SIZE - 1);
    let suitable = thp_vma_suitable_order(vma, haddr, HPAGE_PMD_ORDER);
    m.trace(|| Step::Suitable {
        orders: u32::from(suitable) << HPAGE_PMD_ORDER,
        unsuitable: u32::from(!suitable) << HPAGE_PMD_ORDER,
    });
    if !suitable {
        return Ok(PmdFault::Fallback);
    }
    mm.anon_vma_prepare(addr);
    crate::khugepaged::khugepaged_enter_vma(m, mm, vma);
    if !write && m.thp.use_zero_page {
        m.trace(|| Step::ZeroPage { huge: true });
        let deposit = m.pte_alloc_one()?;
        if mm_get_huge_zero_folio(m, mm).is_none() {
            m.pte_free(deposit);
            m.stat.count_vm_event(VmEvent::ThpFaultFallback);
            m.trace(|| Step::Fallback {
                order: HPAGE_PMD_ORDER,
                counters: vec![
                    Counted::Vm(VmEvent::ThpZeroPageAllocFailed),
                    Counted::Vm(VmEvent::ThpFaultFallback),
                ],
            });
            return Ok(PmdFault::Fallback);
        }
        mm.pmds.insert(haddr / PMD_SIZE, Pmd::HugeZero { deposit });
        return Ok(PmdFault::Done);
    }
    let Some(folio) = vma_alloc_anon_folio_pmd(m, mm, vma) else {
        return Ok(PmdFault::Fallback);
    };
    let deposit = match m.pte_alloc_one() {
        Ok(d) => d,
        Err(e) => {
            free_folio(m, folio);
            return Err(e);
        }
    };
    map_anon_folio_pmd(m, mm, vma, folio, haddr, deposit);
    Ok(PmdFault::Done)
}

/// vma_alloc_anon_folio_pmd: an order-9 folio, zeroed and charged to the
/// mm's memcg, or None after counting the fallback (and, when the charge
/// failed, the charge fallback too).
fn vma_alloc_anon_folio_pmd(m: &mut Machine, mm: &mut MmStruct, vma: &Vma) -> Option<Pfn> {
    let gfp = vma_thp_gfp_mask(&m.thp, vma);
    let order = HPAGE_PMD_ORDER;
    let Some(folio) = crate::page_alloc::vma_alloc_folio(m, Some(&mut *mm), gfp, order) else {
        m.stat.count_vm_event(VmEvent::ThpFaultFallback);
        m.stat.count_mthp_stat(order, MthpStat::AnonFaultFallback);
        m.trace(|| Step::Fallback {
            order,
            counters: vec![
                Counted::Vm(VmEvent::ThpFaultFallback),
                Counted::Mthp(MthpStat::AnonFaultFallback),
            ],
        });
        return None;
    };
    let mm_id = mm.mm_id;
    if crate::memcontrol_charge::mem_cgroup_charge(m, Some(mm), mm_id, folio, order, gfp).is_err() {
        free_folio(m, folio);
        m.stat.count_vm_event(VmEvent::ThpFaultFallback);
        m.stat.count_vm_event(VmEvent::ThpFaultFallbackCharge);
        m.stat.count_mthp_stat(order, MthpStat::AnonFaultFallback);
        m.stat
            .count_mthp_stat(order, MthpStat::AnonFaultFallbackCharge);
        m.trace(|| Step::Fallback {
            order,
            counters: vec![
                Counted::Vm(VmEvent::ThpFaultFallback),
                Counted::Vm(VmEvent::ThpFaultFallbackCharge),
                Counted::Mthp(MthpStat::AnonFaultFallback),
                Counted::Mthp(MthpStat::AnonFaultFallbackCharge),
            ],
        });
        return None;
    }
    Some(folio)
}

/// map_anon_folio_pmd: installs a new exclusive THP, counts the fault and
/// queues the THP for the under-used shrinker.
fn map_anon_folio_pmd(
    m: &mut Machine,
    mm: &mut MmStruct,
    vma: &Vma,
    folio: Pfn,
    haddr: u64,
    deposit: Pfn,
) {
    let writable = vma.flags & Vma::VM_WRITE != 0;
    let pgoff = vma.linear_page_index(haddr);
    rmap::folio_add_new_anon_rmap(m, folio, HPAGE_PMD_ORDER, true, mm.mm_id, pgoff);
    crate::thp_utilization::set_folio_cause(m, folio, crate::thp_utilization::FolioCause::Fault);
    m.stat.add_mm_anon(&mut mm.anon_rss, HPAGE_PMD_NR);
    mm.pmds.insert(
        haddr / PMD_SIZE,
        Pmd::Huge {
            pfn: folio,
            writable,
            dirty: true,
            deposit,
        },
    );
    m.stat.count_vm_event(VmEvent::ThpFaultAlloc);
    m.trace(|| Step::Mapped {
        order: HPAGE_PMD_ORDER,
    });
    m.stat
        .count_mthp_stat(HPAGE_PMD_ORDER, MthpStat::AnonFaultAlloc);
    // A fresh PMD THP is a candidate for the underused shrinker, from either
    // fault path: the 6.18 stable updates since December 2025 carry upstream
    // 2a1351cd ("mm/huge_memory: add pmd folio to ds_queue in
    // do_huge_zero_wp_pmd()"), which moved the queueing here from
    // __do_huge_pmd_anonymous_page (the kernel backend's 6.18.44 has it).
    deferred_split_folio(m, folio, false);
}

/// do_huge_zero_wp_pmd: a write to the huge zero page. Allocates a THP for the
/// whole range (6.13+); when that fails, splits the zero PMD so the write is
/// retried at the PTE level.
pub fn do_huge_zero_wp_pmd(
    m: &mut Machine,
    mm: &mut MmStruct,
    vma: &Vma,
    addr: u64,
) -> Result<PmdFault, Fault> {
    let haddr = addr & !(PMD_SIZE - 1);
    let Some(Pmd::HugeZero { deposit }) = mm.pmds.get(&(haddr / PMD_SIZE)) else {
        unreachable!("do_huge_zero_wp_pmd on a PMD that is not the huge zero page");
    };
    let deposit = *deposit;
    m.trace(|| Step::Wp {
        huge: true,
        zero: true,
        reused: false,
    });
    match vma_alloc_anon_folio_pmd(m, mm, vma) {
        Some(folio) => {
            // Queued for the under-used shrinker by map_anon_folio_pmd (the
            // first 6.18 releases, before upstream 2a1351cd, did not).
            map_anon_folio_pmd(m, mm, vma, folio, haddr, deposit);
            Ok(PmdFault::Done)
        }
        None => {
            split_huge_pmd(m, mm, haddr);
            Ok(PmdFault::Fallback)
        }
    }
}

/// do_huge_pmd_wp_page: a write to a write-protected PMD-mapped THP (after
/// fork). Reused in place when exclusive (PageAnonExclusive on the head, or
/// only the PMD's own reference left); otherwise the PMD is split and the
/// write retried at the PTE level, where do_wp_page copies the one page.
pub fn do_huge_pmd_wp_page(m: &mut Machine, mm: &mut MmStruct, addr: u64) -> PmdFault {
    let index = addr / PMD_SIZE;
    let Some(Pmd::Huge { pfn, .. }) = mm.pmds.get(&index) else {
        unreachable!("do_huge_pmd_wp_page on a PMD that is not a THP");
    };
    let folio = *pfn;
    let exclusive = m.zone.memmap.page(folio).test(pg::ANON_EXCLUSIVE);
    if exclusive || rmap::folio_ref_count(m, folio) == 1 {
        m.zone.memmap.page_mut(folio).set(pg::ANON_EXCLUSIVE);
        if let Some(Pmd::Huge { writable, .. }) = mm.pmds.get_mut(&index) {
            *writable = true;
        }
        m.trace(|| Step::Wp {
            huge: true,
            zero: false,
            reused: true,
        });
        return PmdFault::Done;
    }
    m.trace(|| Step::Wp {
        huge: true,
        zero: false,
        reused: false,
    });
    split_huge_pmd(m, mm, index * PMD_SIZE);
    PmdFault::Fallback
}
