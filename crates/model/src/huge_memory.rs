//! Transparent huge pages for anonymous memory, the splitting half: the
//! huge zero folio and its shrinker, fork and zap of a PMD mapping,
//! split_huge_pmd, split_folio (also as debugfs `split_huge_pages` asks for
//! it), the deferred split shrinker and the under-used THP check, and the
//! gfp flags of a THP fault.
//!
//! Follows Linux 6.18 `mm/huge_memory.c` (`vma_thp_gfp_mask`,
//! `copy_huge_pmd`, `zap_huge_pmd`, `mm_get_huge_zero_folio`,
//! `mm_put_huge_zero_folio`, `shrink_huge_zero_folio_scan`,
//! `__split_huge_pmd_locked`, `split_huge_page_to_list_to_order`,
//! `split_huge_pages_pid`, `deferred_split_scan`, `thp_underused`). The rest
//! of that file is elsewhere, by layer: the order helpers in `huge_mm` (with
//! include/linux/huge_mm.h), the deferred split queue in `deferred_split`
//! (rmap and the free path call it, below any split), the PMD faults in
//! `huge_memory_fault` (they charge memcgs, whose reclaim splits: above
//! this file).
//!
//! Simplifications: no userfaultfd, no NUMA (one deferred split queue; a
//! memcg's queue is its part of it, see memcontrol);
//! `defrag` is stored but the allocator has no compaction to apply it with;
//! the vendor knob `anon_beside_full` is stored and must be 0 (the model
//! refuses 1); folios are split to order 0 only (debugfs's new_order is not
//! offered); split_folio finds the PMDs and the zero-filled pages it remaps
//! to the zero page by `rmap::rmap_walk_anon`; a page's content is one bit, all zero or not
//! (`pg::ZEROED`), which is what thp_underused and that remap look at; the
//! shrinkers run only from `vmscan::drop_slab` and walk their whole queue in
//! one call.

use crate::deferred_split::folio_unqueue_deferred_split;
use crate::gfp::Gfp;
use crate::huge_mm::ThpSettings;
use crate::mm_types::{
    pg, Fault, MmStruct, Pfn, Vma, HPAGE_PMD_NR, HPAGE_PMD_ORDER, PAGE_SIZE, PMD_SIZE,
};
use crate::mms::MmList;
use crate::page_alloc::free_folio;
use crate::pgtable::{Pmd, Pte, PteTable};
use crate::rmap;
use crate::sparse::page_folio;
use crate::syscall::{mm_id_of, resolve_range_no_hugetlb};
use crate::vmstat::{MthpStat, VmEvent};
use crate::Machine;
use hugelab_workload::ThpDefrag;
use hugelab_workload::{BackendError, Range, Stmt};

/// What a PMD-level fault handler tells `__handle_mm_fault`.
pub enum PmdFault {
    Done,
    /// VM_FAULT_FALLBACK: continue at the PTE level.
    Fallback,
}

/// copy_huge_pmd: fork shares a PMD mapping with the child, write-protected
/// on both sides, with a page table deposited for the child. A THP that
/// the parent may have pinned is not shared: the parent's PMD is split and
/// the caller copies the range PTE by PTE (-EAGAIN), which copies the
/// exclusive pages.
pub fn copy_huge_pmd(
    m: &mut Machine,
    dst: &mut MmStruct,
    src: &mut MmStruct,
    index: u64,
) -> Result<PmdFault, Fault> {
    let pgtable = m.pte_alloc_one()?;
    match src.pmds.get(&index) {
        Some(Pmd::HugeZero { .. }) => {
            // Never allocates: the parent holds the folio.
            mm_get_huge_zero_folio(m, dst);
            dst.pmds.insert(index, Pmd::HugeZero { deposit: pgtable });
            Ok(PmdFault::Done)
        }
        Some(Pmd::Huge { pfn, dirty, .. }) => {
            let (folio, dirty) = (*pfn, *dirty);
            let maybe_pinned = src.has_pinned && rmap::folio_maybe_dma_pinned(m, folio);
            if rmap::folio_try_dup_anon_rmap_pmd(m, folio, dst.mm_id, src.mm_id, maybe_pinned)
                .is_err()
            {
                m.pte_free(pgtable);
                split_huge_pmd(m, src, index * PMD_SIZE);
                return Ok(PmdFault::Fallback);
            }
            if let Some(Pmd::Huge { writable, .. }) = src.pmds.get_mut(&index) {
                *writable = false;
            }
            m.stat.add_mm_anon(&mut dst.anon_rss, HPAGE_PMD_NR);
            dst.pmds.insert(
                index,
                Pmd::Huge {
                    pfn: folio,
                    writable: false,
                    dirty,
                    deposit: pgtable,
                },
            );
            Ok(PmdFault::Done)
        }
        _ => unreachable!("copy_huge_pmd on a PMD that is not huge"),
    }
}

/// mm_get_huge_zero_folio: the shared huge zero folio, allocated on first use;
/// each mm that maps it holds one reference (MMF_HUGE_ZERO_FOLIO).
pub(crate) fn mm_get_huge_zero_folio(m: &mut Machine, mm: &mut MmStruct) -> Option<Pfn> {
    if mm.huge_zero_ref {
        return m.huge_zero_folio;
    }
    let folio = match m.huge_zero_folio {
        Some(folio) => folio,
        // GFP_TRANSHUGE & ~__GFP_MOVABLE.
        None => match m
            .zone
            .alloc_pages_mt(HPAGE_PMD_ORDER, crate::mmzone::MigrateType::Unmovable)
        {
            Some(folio) => {
                m.stat.count_vm_event(VmEvent::ThpZeroPageAlloc);
                m.huge_zero_folio = Some(folio);
                m.huge_zero_refcount = 1; // the shrinker's base reference
                folio
            }
            None => {
                m.stat.count_vm_event(VmEvent::ThpZeroPageAllocFailed);
                return None;
            }
        },
    };
    m.huge_zero_refcount += 1;
    mm.huge_zero_ref = true;
    Some(folio)
}

/// mm_put_huge_zero_folio, at exit of an mm that mapped it.
pub fn mm_put_huge_zero_folio(m: &mut Machine, mm: &mut MmStruct) {
    if std::mem::take(&mut mm.huge_zero_ref) {
        m.huge_zero_refcount -= 1;
    }
}

/// shrink_huge_zero_folio_scan: frees the huge zero folio when no mm maps
/// it any more (only the shrinker's own reference is left); the next huge
/// zero fault allocates it again (thp_zero_page_alloc).
pub fn shrink_huge_zero_folio_scan(m: &mut Machine) {
    if m.huge_zero_refcount == 1 {
        if let Some(folio) = m.huge_zero_folio.take() {
            m.huge_zero_refcount = 0;
            m.zone.free_pages(folio, HPAGE_PMD_ORDER);
        }
    }
}

/// split_huge_pmd at `haddr`: the PMD becomes a table of PTEs mapping the same
/// folio (or the zero page). The folio itself is not split and stays whole.
pub fn split_huge_pmd(m: &mut Machine, mm: &mut MmStruct, haddr: u64) {
    let index = haddr / PMD_SIZE;
    let Some(pmd) = mm.pmds.remove(&index) else {
        return;
    };
    let table = match pmd {
        Pmd::Table(table) => table,
        Pmd::HugeZero { deposit } => {
            let mut table = PteTable::new(deposit);
            table.ptes.fill(Pte::ZERO);
            m.stat.count_vm_event(VmEvent::ThpSplitPmd);
            table
        }
        Pmd::Huge {
            pfn,
            writable,
            dirty,
            deposit,
        } => {
            let mut table = PteTable::new(deposit);
            for (i, pte) in table.ptes.iter_mut().enumerate() {
                *pte = Pte::new(Pfn(pfn.0 + i as u64), writable);
            }
            if dirty {
                // __split_huge_pmd_locked: a dirty PMD dirties the folio.
                crate::swap::folio_mark_dirty(m, pfn);
            } else {
                table.pte_mkclean(0, crate::mm_types::PTRS_PER_PTE);
            }
            // The head's PageAnonExclusive speaks for the PMD mapping; the
            // PTEs inherit it page by page.
            let exclusive = m.zone.memmap.page(pfn).test(pg::ANON_EXCLUSIVE);
            rmap::folio_add_anon_rmap_ptes(m, pfn, pfn, HPAGE_PMD_NR, mm.mm_id, exclusive);
            // Not the last reference: the PTEs just took theirs.
            rmap::folio_remove_rmap_pmd(m, pfn, mm.mm_id);
            m.stat.count_vm_event(VmEvent::ThpSplitPmd);
            table
        }
    };
    mm.pmds.insert(index, Pmd::Table(table));
}

/// thp_underused: more zero-filled subpages than max_ptes_none allows
/// (max_ptes_none = 511 turns the check off).
pub fn thp_underused(m: &Machine, folio: Pfn) -> bool {
    let max_none = m.thp.khugepaged.max_ptes_none;
    if max_none >= HPAGE_PMD_NR - 1 {
        return false;
    }
    let nr = 1u64 << m.zone.memmap.page(folio).order();
    let zero = m
        .zone
        .memmap
        .pages(folio, nr)
        .iter()
        .filter(|p| p.test(pg::ZEROED))
        .count() as u64;
    zero > max_none
}

/// split_folio (split_huge_page_to_list_to_order to order 0) of an anonymous
/// folio: unmap_folio's walk (`rmap::try_to_migrate`) may queue it as
/// partially mapped on the way (split_deferred; the split takes it off the
/// queue again); its PMD mappings are split (thp_split_pmd), then every page
/// becomes a folio of its own, keeping its PTE mappings; pages no longer
/// mapped are freed. Zero-filled pages are mapped to the shared zero page
/// instead and freed: `__folio_split` passes RMP_USE_SHARED_ZEROPAGE to
/// remap_page after every successful anon split, so
/// try_to_map_unused_to_zeropage runs for each mapped subpage, whichever
/// path asked for the split. Fails, counting thp_split_page_failed and the
/// size's split_failed, when someone holds a reference that no mapping
/// explains (can_split_folio: a pin); returns whether it split.
pub fn split_folio(m: &mut Machine, mms: &mut MmList, folio: Pfn) -> bool {
    let order = m.zone.memmap.page(folio).order();
    let nr = 1u64 << order;
    if !rmap::folio_refs_all_mappings(m, folio) {
        if order == HPAGE_PMD_ORDER {
            m.stat.count_vm_event(VmEvent::ThpSplitPageFailed);
        }
        m.stat.count_mthp_stat(order, MthpStat::SplitFailed);
        return false;
    }
    // unmap_folio: the kernel's walk unmaps the folio mapping by mapping,
    // which may queue it as partially mapped for a moment.
    rmap::try_to_migrate(m, mms, folio);
    // The mappings are found through the folio's anon_vma and index: in
    // each VMA of its fork family that covers its page offsets, the one
    // place its pages can be there (vma_address).
    let walk = rmap::anon_vma_interval_tree_foreach(m, mms, folio);
    if rmap::folio_entire_mapcount(m, folio) > 0 {
        for v in walk.iter().filter(|v| v.holds_pmd()) {
            let Some(mm) = mms.get_mut(v.mm) else {
                continue;
            };
            let index = v.addr / PMD_SIZE;
            if matches!(mm.pmds.get(&index), Some(Pmd::Huge { pfn, .. }) if *pfn == folio) {
                split_huge_pmd(m, mm, v.addr);
            }
        }
    }
    // The new order-0 folios have no MM-ID slots: a stale entry would make a
    // large folio later allocated here look shared.
    m.folio_mm_ids.remove(&folio);
    let any_zeroed = m
        .zone
        .memmap
        .pages(folio, nr)
        .iter()
        .any(|p| p.test(pg::ZEROED));
    if any_zeroed {
        for v in &walk {
            let Some(mm) = mms.get_mut(v.mm) else {
                continue;
            };
            let mut dropped = 0u64;
            // One table, unless the VMA's part of the folio crosses a PMD boundary.
            for (index, first, lo, hi) in v.pte_spans(nr as usize) {
                let Some(Pmd::Table(t)) = mm.pmds.get_mut(&index) else {
                    continue;
                };
                for (i, pte) in (lo..hi).zip(t.ptes[first..first + hi - lo].iter_mut()) {
                    let pfn = Pfn(folio.0 + i as u64);
                    if pte.pfn() != Some(pfn) {
                        continue;
                    }
                    let page = m.zone.memmap.page_mut(pfn);
                    if page.test(pg::ZEROED) {
                        *pte = Pte::ZERO;
                        page.mapcount -= 1;
                        m.stat.nr_anon_mapped -= i64::from(page.mapcount == 0);
                        dropped += 1;
                    }
                }
            }
            m.stat.sub_mm_anon(&mut mm.anon_rss, dropped);
        }
    }
    let anon_vma = m.zone.memmap.folio_ext(folio).anon_vma;
    m.anon_vmas.put_folio(anon_vma);
    if order == HPAGE_PMD_ORDER {
        m.stat.count_vm_event(VmEvent::ThpSplitPage);
    }
    m.stat.count_mthp_stat(order, MthpStat::Split);
    m.stat.mod_mthp_stat(order, MthpStat::NrAnon, -1);
    folio_unqueue_deferred_split(m, folio, order);
    // Off the queue already when the shrinker splits it, but still flagged.
    let head = m.zone.memmap.page_mut(folio);
    if head.test(pg::PARTIALLY_MAPPED) {
        head.clear(pg::PARTIALLY_MAPPED);
        m.stat
            .mod_mthp_stat(order, MthpStat::NrAnonPartiallyMapped, -1);
    }
    // The new folios inherit the head's LRU flags (see swap), PG_dirty
    // included, which splitting a dirty PMD mapping above may have set.
    let lru = m.lru.get(folio);
    m.lru.forget(folio);
    crate::memcontrol::split_page_memcg(m, folio, nr);
    for i in 0..nr {
        let pfn = Pfn(folio.0 + i);
        let page = m.zone.memmap.page_mut(pfn);
        // The pieces keep their content and whether the workload wrote
        // them; the head's cause goes (order-0 folios have none).
        let keep = [pg::ANON, pg::ANON_EXCLUSIVE, pg::ZEROED, pg::WRITTEN]
            .into_iter()
            .filter(|f| page.test(*f))
            .fold(0, |a, f| a | f);
        let mapcount = page.mapcount;
        page.init(pg::HEAD | keep, 0);
        page.mapcount = mapcount;
        // Each PTE mapping holds a reference on the page's new folio.
        page.private = u32::from(mapcount);
        if mapcount == 0 {
            crate::memcontrol::mem_cgroup_uncharge(m, pfn);
            m.zone.free_pages(pfn, 0);
        } else {
            crate::swap::split_folio_lru(m, lru, pfn, i);
        }
    }
    true
}

/// split_huge_pages_pid: what writing `pid,start,end` to debugfs
/// `split_huge_pages` does to the process whose mm id is `target`. Walks the range a page
/// at a time (a THP is met again at each of its pages, and skipped once split);
/// the walk ends at the first address no VMA covers. A large folio that
/// can_split_folio refuses (a pin) is skipped without a split attempt, so
/// nothing is counted for it. Returns (large folios met, folios split), the
/// "split of total" the kernel logs.
pub fn split_huge_pages_pid(
    m: &mut Machine,
    mms: &mut MmList,
    target: crate::mm_types::MmId,
    start: u64,
    end: u64,
) -> (u64, u64) {
    let (mut total, mut split) = (0, 0);
    let mut addr = start & !(PAGE_SIZE - 1);
    let end = end & !(PAGE_SIZE - 1);
    while addr < end {
        let mm = mms.get_mut(target).expect("the target mm");
        if mm.find_vma(addr).is_none() {
            break;
        }
        let page = crate::pagewalk::follow_page(mm, addr);
        addr += PAGE_SIZE;
        let Some(page) = page else { continue };
        let folio = page_folio(m, page);
        if m.zone.memmap.page(folio).order() == 0 {
            continue;
        }
        total += 1;
        if !rmap::folio_refs_all_mappings(m, folio) {
            continue;
        }
        split += u64::from(split_folio(m, mms, folio));
    }
    (total, split)
}

/// deferred_split_scan: every queued folio leaves the queue. A partially
/// mapped one is split; one that is not is split only if thp_underused
/// (then thp_underused_split_page), else it is simply dropped from the
/// queue: the under-used check is made once. A partially mapped folio whose
/// split fails (pinned) goes back to the tail of the queue.
pub fn deferred_split_scan(m: &mut Machine, mms: &mut MmList) {
    let folios = m.deferred_split_queue.drain();
    deferred_split_scan_folios(m, mms, folios);
}

/// deferred_split_scan's walk over `folios`, taken off the queue already.
///
/// No kernel function: deferred_split_scan's second loop, shared with the memcg queue's scan.
pub(crate) fn deferred_split_scan_folios(m: &mut Machine, mms: &mut MmList, folios: Vec<Pfn>) {
    for folio in folios {
        m.zone.memmap.page_mut(folio).clear(pg::DEFERRED);
        let partially_mapped = m.zone.memmap.page(folio).test(pg::PARTIALLY_MAPPED);
        let underused = !partially_mapped && thp_underused(m, folio);
        if !partially_mapped && !underused {
            continue;
        }
        if split_folio(m, mms, folio) {
            if underused {
                m.stat.count_vm_event(VmEvent::ThpUnderusedSplitPage);
            }
        } else if partially_mapped {
            m.zone.memmap.page_mut(folio).set(pg::DEFERRED);
            m.deferred_split_queue.add_tail(folio);
        }
    }
}

/// The `split` statement: `pid,start,end` written to debugfs
/// `split_huge_pages` (`split_huge_pages_write`); the splits' rmap walks
/// reach every mm.
pub fn sys_split(
    m: &mut Machine,
    stmt: &Stmt,
    proc: &str,
    range: &Range,
) -> Result<(), BackendError> {
    let (id, start, end) = resolve_range_no_hugetlb(m, stmt, proc, range)?;
    crate::syscall::refuse_file_range(m, stmt, id, start, end, "split")?;
    m.with_mms(None, |m, mms| split_huge_pages_pid(m, mms, id, start, end));
    Ok(())
}

/// The `thp_disable` statement: prctl(PR_SET_THP_DISABLE) sets or clears
/// MMF_DISABLE_THP_COMPLETELY on the process's mm (kernel/sys.c).
pub fn sys_prctl_thp_disable(
    m: &mut Machine,
    stmt: &Stmt,
    proc: &str,
    on: bool,
) -> Result<(), BackendError> {
    let id = mm_id_of(m, stmt, proc)?;
    m.mms.get_mut(id).expect("a task's mm").thp_disabled = on;
    Ok(())
}

/// vma_thp_gfp_mask: the flags of every THP fault allocation (PMD and mTHP
/// orders alike), from `defrag` and whether the VMA is madvised.
pub fn vma_thp_gfp_mask(thp: &ThpSettings, vma: &Vma) -> Gfp {
    let madvised = vma.flags & Vma::VM_HUGEPAGE != 0;
    let light = Gfp::TRANSHUGE_LIGHT;
    match thp.defrag {
        // Always do synchronous compaction; non-madvised VMAs do not retry.
        ThpDefrag::Always => Gfp {
            noretry: !madvised,
            ..Gfp::TRANSHUGE
        },
        // Kick kcompactd and fail quickly.
        ThpDefrag::Defer => Gfp {
            kswapd_reclaim: true,
            ..light
        },
        // Synchronous compaction if madvised, otherwise kick kcompactd.
        ThpDefrag::DeferMadvise => Gfp {
            direct_reclaim: madvised,
            kswapd_reclaim: !madvised,
            ..light
        },
        // Only do synchronous compaction if madvised.
        ThpDefrag::Madvise => Gfp {
            direct_reclaim: madvised,
            ..light
        },
        ThpDefrag::Never => light,
    }
}

/// zap_huge_pmd: removes a PMD mapping and frees its deposited page table.
pub(crate) fn zap_huge_pmd(m: &mut Machine, mm: &mut MmStruct, index: u64) {
    match mm.pmds.remove(&index) {
        Some(Pmd::Huge { pfn, deposit, .. }) => {
            m.pte_free(deposit);
            m.stat
                .sub_mm_anon(&mut mm.anon_rss, crate::mm_types::HPAGE_PMD_NR);
            if rmap::folio_remove_rmap_pmd(m, pfn, mm.mm_id) {
                free_folio(m, pfn);
            }
        }
        Some(Pmd::HugeZero { deposit }) => m.pte_free(deposit),
        other => unreachable!(
            "zap_huge_pmd on {}",
            if other.is_some() { "a table" } else { "none" }
        ),
    }
}

#[cfg(test)]
mod tests {

    /// Under-used splits at reclaim after writing `pages` pages of one THP,
    /// with max_ptes_none 409.
    fn underused_splits(pages: u64) -> i64 {
        let text = crate::one_thp_at_409(&format!("a write buf:{}K\nreclaim\n", pages * 4));
        crate::end_counters(&text)["vmstat.thp_underused_split_page"]
    }

    #[test]
    fn underused_means_more_zero_pages_than_max_ptes_none() {
        // 512 - pages zero-filled pages: split iff that is > 409.
        assert_eq!(underused_splits(102), 1); // 410 zero pages
        assert_eq!(underused_splits(103), 0); // 409 zero pages
        assert_eq!(underused_splits(512), 0);
    }
}
