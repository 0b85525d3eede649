//! The page allocator: folios allocated from the zone and freed to it
//! (`alloc_folio`, `free_folio`), and the allocation slow path for user
//! folios (`vma_alloc_folio`), which may compact (`compaction`).
//!
//! Follows Linux 6.18 `mm/page_alloc.c` (`__alloc_pages_slowpath`,
//! `__alloc_pages_direct_compact`) and alloc_pages_mpol's first
//! THISNODE|NORETRY try for a PMD order (mm/mempolicy.c): see
//! `vma_alloc_folio`. The zone's free lists themselves (`__rmqueue`,
//! `__free_one_page`) are `mmzone`, below compaction, which works on them;
//! the simplifications of both are these.
//!
//! Deliberate simplifications:
//! - one node, one zone (ZONE_NORMAL), two migratetypes (MIGRATE_UNMOVABLE:
//!   page tables, the huge zero folio, the `fragment` generator's pages;
//!   MIGRATE_MOVABLE: everything else, HugeTLB and HVO's vmemmap pages
//!   included), no per-cpu page lists (frees merge at once), no watermarks,
//!   watermark boosting or lowmem reserves: an allocation fails only when no
//!   free block of a sufficient order exists;
//! - no global direct reclaim, kswapd or global OOM killer (memcg limit
//!   reclaim and the memcg OOM killer are modelled, `memcontrol_charge`): the
//!   slow path does not discard lazily-freed folios or run the deferred
//!   split shrinker, which the kernel's direct reclaim would (the only
//!   anon memory reclaimable without swap); its retry loops (`should_reclaim_retry`,
//!   `should_compact_retry`, which need reclaim progress) end at once; a
//!   non-costly order that the kernel would hand to `__alloc_pages_may_oom`
//!   fails;
//! - memory never touched is not on any free list: it sits above `frontier` as
//!   MAX_PAGE_ORDER blocks (MIGRATE_MOVABLE, behind every listed movable
//!   block, as boot memory is freed to the lists' tails) and is carved off
//!   when the free lists run dry, so the model of a 1 TiB machine costs
//!   nothing before it is used (the kernel's deferred struct page init does
//!   the same with its memmap);
//! - free lists are LIFO stacks (the kernel adds freed pages at the head and
//!   allocates from the head). Taking a block out of the middle of its list
//!   (a merge with a freed buddy, `del_page_from_free_list`) moves the top
//!   block into its slot: each free block's head page records its slot (the
//!   kernel links `page->buddy_list` instead), so a free and every merge it
//!   makes cost O(1) and the lists never hold stale entries. A claimed
//!   pageblock's free blocks go to the tail of their new list
//!   (`move_to_free_list`), which costs the length of that list.

use crate::compaction::{try_to_compact_pages, wakeup_kcompactd, CompactPriority, CompactStatus};
use crate::deferred_split::folio_unqueue_deferred_split;
use crate::gfp::Gfp;
use crate::mm_types::{pg, MmStruct, Pfn, HPAGE_PMD_ORDER};
use crate::mms::MmList;
use crate::mmzone::PAGE_ALLOC_COSTLY_ORDER;
use crate::trace::Step;
use crate::vmstat::{MthpStat, VmEvent};
use crate::Machine;

/// folio_alloc with __GFP_ZERO (`__alloc_pages`, `prep_new_page`,
/// `prep_compound_page`): a folio of `order`, its pages zero-filled, not
/// mapped and with no reference yet (rmap's folio_add_new_anon_rmap gives
/// it the first), or None when no free block is large enough.
pub fn alloc_folio(m: &mut Machine, order: u32) -> Option<Pfn> {
    let pfn = m.zone.alloc_pages(order)?;
    let nr = 1u64 << order;
    let pages = m.zone.memmap.pages_mut(pfn, nr);
    pages[0].init(pg::HEAD | pg::ZEROED, order);
    for page in &mut pages[1..] {
        // A tail keeps its folio's order: page_folio finds the head from it.
        page.init(pg::TAIL | pg::ZEROED, order);
    }
    Some(pfn)
}

/// vma_alloc_folio (`__alloc_pages` for a user folio): the buddy allocator's
/// fast path, and the slow path `gfp` allows when it finds no free block.
/// `mm` is the faulting (or collapsing) mm, taken out of the machine's
/// table: with the table, what compaction may migrate pages of.
///
/// A PMD-order allocation goes through alloc_pages_mpol (mm/mempolicy.c,
/// CONFIG_NUMA with the default policy) as on the development kernels: first
/// `gfp | __GFP_THISNODE | __GFP_NORETRY`, and only when that fails and
/// `gfp` allows direct reclaim, `gfp` itself (the model has one node).
pub fn vma_alloc_folio(
    m: &mut Machine,
    mm: Option<&mut MmStruct>,
    gfp: Gfp,
    order: u32,
) -> Option<Pfn> {
    m.with_mms(mm, |m, mms| {
        let first = if order == HPAGE_PMD_ORDER {
            Gfp {
                noretry: true,
                ..gfp
            }
        } else {
            gfp
        };
        let folio = alloc_pages(m, mms, first, order);
        if folio.is_none() && order == HPAGE_PMD_ORDER && gfp.direct_reclaim {
            return alloc_pages(m, mms, gfp, order);
        }
        folio
    })
}

/// __folio_alloc: one `__alloc_pages` of a user folio, without
/// alloc_pages_mpol's first try (khugepaged's and MADV_COLLAPSE's
/// alloc_charge_folio). `mm` as for `vma_alloc_folio`.
pub fn folio_alloc(
    m: &mut Machine,
    mm: Option<&mut MmStruct>,
    gfp: Gfp,
    order: u32,
) -> Option<Pfn> {
    m.with_mms(mm, |m, mms| alloc_pages(m, mms, gfp, order))
}

/// __alloc_pages: get_page_from_freelist, then __alloc_pages_slowpath.
fn alloc_pages(m: &mut Machine, mms: &mut MmList, gfp: Gfp, order: u32) -> Option<Pfn> {
    let folio = alloc_folio(m, order);
    m.trace(|| Step::Alloc {
        order,
        gfp,
        ok: folio.is_some(),
    });
    folio.or_else(|| alloc_pages_slowpath(m, mms, gfp, order))
}

/// __alloc_pages_slowpath for a user folio of `order` > 0 (order-0 user
/// pages never fail in the model short of OOM):
/// - `__GFP_KSWAPD_RECLAIM` wakes kswapd, which has nothing to reclaim in
///   the model (no swap, no page cache) and on going back to sleep wakes
///   kcompactd for the order (`wake_all_kswapds` -> `kswapd_try_to_sleep`
///   -> `wakeup_kcompactd`);
/// - a costly order (> PAGE_ALLOC_COSTLY_ORDER) that may block tries async
///   compaction first; with __GFP_NORETRY it gives up there when compaction
///   was skipped or deferred, else keeps the async priority;
/// - then direct reclaim (nothing to reclaim in the model) and direct
///   compaction at `compact_priority` (sync-light unless kept async), and
///   the allocation fails: __GFP_NORETRY, or a costly order without
///   __GFP_RETRY_MAYFAIL, stops here; a non-costly order would retry while
///   reclaim makes progress (`should_reclaim_retry`, `should_compact_retry`
///   need it, and the model's never does) and then try the OOM killer
///   (`__alloc_pages_may_oom`), which the model does not have: it fails.
fn alloc_pages_slowpath(m: &mut Machine, mms: &mut MmList, gfp: Gfp, order: u32) -> Option<Pfn> {
    let costly = order > PAGE_ALLOC_COSTLY_ORDER;
    if gfp.kswapd_reclaim {
        wakeup_kcompactd(m, order);
    }
    let mut prio = CompactPriority::SyncLight;
    if gfp.direct_reclaim && costly {
        let (folio, result) = alloc_pages_direct_compact(m, mms, order, CompactPriority::Async);
        if folio.is_some() {
            return folio;
        }
        if gfp.noretry {
            if matches!(result, CompactStatus::Skipped | CompactStatus::Deferred) {
                return None;
            }
            prio = CompactPriority::Async;
        }
    }
    if !gfp.direct_reclaim {
        return None;
    }
    alloc_pages_direct_compact(m, mms, order, prio).0
}

/// __alloc_pages_direct_compact: try_to_compact_pages, then the free
/// lists; counts compact_stall, and compact_success or compact_fail,
/// unless compaction was skipped.
fn alloc_pages_direct_compact(
    m: &mut Machine,
    mms: &mut MmList,
    order: u32,
    prio: CompactPriority,
) -> (Option<Pfn>, CompactStatus) {
    if order == 0 {
        return (None, CompactStatus::Skipped);
    }
    let result = try_to_compact_pages(m, mms, order, prio);
    m.trace(|| Step::Compact {
        order,
        sync: prio != CompactPriority::Async,
        result: result.result(),
    });
    if result == CompactStatus::Skipped {
        return (None, result);
    }
    m.stat.count_vm_event(VmEvent::CompactStall);
    let folio = alloc_folio(m, order);
    if folio.is_some() {
        m.zone.compact.compaction_defer_reset(order, true);
        m.stat.count_vm_event(VmEvent::CompactSuccess);
    } else {
        m.stat.count_vm_event(VmEvent::CompactFail);
    }
    (folio, result)
}

/// The end of folio_put for a folio whose last reference went: `__folio_put`
/// (mm/swap.c) takes it off the deferred split queue, `free_pages_prepare`
/// drops the size's nr_anon, and the buddy allocator takes the pages back.
/// The model keeps a large folio's MM-ID slots beside the memmap: they go
/// too, and its anon_vma loses the folio's reference.
///
/// Not named __folio_put: with no per-cpu lists, it is the whole free, called also where the kernel frees a folio otherwise.
pub fn free_folio(m: &mut Machine, folio: Pfn) {
    let head = *m.zone.memmap.page(folio);
    let order = head.order();
    m.lru.forget(folio);
    if order > 0 {
        folio_unqueue_deferred_split(m, folio, order);
        m.folio_mm_ids.remove(&folio);
        if head.test(pg::ANON) {
            m.stat.mod_mthp_stat(order, MthpStat::NrAnon, -1);
            let anon_vma = m.zone.memmap.folio_ext(folio).anon_vma;
            m.anon_vmas.put_folio(anon_vma);
        }
    }
    crate::memcontrol::mem_cgroup_uncharge(m, folio);
    m.zone.free_pages(folio, order);
}
