//! `reclaim`: memory pressure as `echo 2 > /proc/sys/vm/drop_caches` applies
//! it, which is what the kernel backend does: every slab shrinker runs
//! until it frees little more (drop_slab). Two matter to anonymous THPs,
//! both in `huge_memory`: the deferred split shrinker (`deferred_split_scan`,
//! with the under-used THP check) and the huge zero folio's
//! (`shrink_huge_zero_folio_scan`).
//!
//! Follows Linux 6.18 `mm/vmscan.c` (drop_slab, shrink_slab), as
//! `drop_caches_sysctl_handler` (fs/drop_caches.c) calls it. Simplifications:
//! one node, and drop_caches walks every memcg's shrinkers alike, so
//! shrink_slab is one call of each shrinker; each
//! shrinker walks its whole queue in one call, which is what drop_slab's
//! repeated batches amount to when nothing fails; a split that fails (a
//! pinned folio) is tried once per `reclaim` here, while drop_slab retries it
//! as long as other shrinkers free enough, which is why
//! thp_split_page_failed is an attempt count that `diff` treats as a bound;
//! page reclaim itself (LRU, swap) is not run: drop_caches does not run it
//! either.
//!
//! `reclaim_pages` is what MADV_PAGEOUT calls: `shrink_folio_list` on the
//! folios it isolated, as Linux 6.18 `mm/vmscan.c` runs it on a machine
//! WITHOUT swap (the development VMs have none):
//! - a lazily-freed folio (anon, !swapbacked: MADV_FREE) is unmapped
//!   (`try_to_unmap_lazyfree`, mm/rmap.c `try_to_unmap_one`) and freed,
//!   counting PGLAZYFREED, unless a mapping was written again since
//!   MADV_FREE (its PTE or PMD dirty) or PG_dirty is set: then the folio is
//!   swapbacked again, stays mapped, and is activated. A PMD mapping is split
//!   first (thp_split_pmd): the source has `unmap_huge_pmd_locked` discard
//!   a clean PMD-mapped lazyfree THP whole, but this machine's 6.18.44
//!   splits the PMD and then discards the PTE-mapped folio (both measured:
//!   thp_split_pmd +1 with pglazyfreed +512, and +1 for a re-dirtied one
//!   that stays);
//! - a swapbacked anon folio needs swap space, which `folio_alloc_swap`
//!   never finds: an order-0 folio is activated; a large one is split
//!   (`split_folio_to_list`, zero-filled pages to the zero page), counting
//!   thp_swpout_fallback (PMD size) and the size's swpout_fallback, and its
//!   pieces are activated (activate_locked_split). A pinned folio is kept; a
//!   large one that cannot be split is activated. A partially mapped
//!   large folio is split before the swap attempt (no fallback counted);
//! - what changes with swap (not modelled): `folio_alloc_swap` succeeds, a
//!   large folio goes out whole when a swap device takes its size (zram:
//!   thp_swpout, swpout) else is split as above and its pieces go out
//!   (pswpout), each mapping becomes a swap entry (MM_SWAPENTS), and MADV_FREE
//!   drops the swap entries of its range (`free_swap_and_cache_nr`) and
//!   clears a folio's swap cache (`folio_free_swap`) before marking it.
//!
//! `shrink_lazyfree` is the entry for other reclaim in the model (memcg
//! limit reclaim, `try_to_free_mem_cgroup_pages`, which memcontrol_charge
//! calls; see memcontrol for what it leaves out): it runs `shrink_folio_list` on lazily-freed folios that
//! a filter accepts, until enough pages are reclaimed; they are the only anon
//! folios reclaim can free without swap.

use crate::huge_memory::{
    deferred_split_scan, shrink_huge_zero_folio_scan, split_folio, split_huge_pmd,
};
use crate::memcontrol::{MemcgId, SWAP_CLUSTER_MAX};
use crate::mm_types::{pg, MmId, MmStruct, Pfn, HPAGE_PMD_ORDER, PAGE_SIZE, PMD_SIZE};
use crate::mms::MmList;
use crate::page_alloc::free_folio;
use crate::pgtable::{Pmd, Pte};
use crate::rmap;
use crate::swap::{self, folio_set_active, folio_test_lazyfree};
use crate::vmstat::{MthpStat, VmEvent};
use crate::Machine;
use std::collections::VecDeque;

/// drop_slab: the shrinkers that concern anonymous memory, in turn (the
/// deferred split shrinker's rmap walks reach every mm of the machine).
pub fn drop_slab(m: &mut Machine) {
    m.with_mms(None, deferred_split_scan);
    shrink_huge_zero_folio_scan(m);
}

/// reclaim_pages: the isolated folios go through shrink_folio_list (with
/// ignore_references, as MADV_PAGEOUT asks); the number of pages freed.
pub fn reclaim_pages(m: &mut Machine, mms: &mut MmList, folios: Vec<Pfn>) -> u64 {
    shrink_folio_list(m, mms, folios)
}

/// shrink_folio_list without swap (see the module doc); the number of pages
/// freed.
pub fn shrink_folio_list(m: &mut Machine, mms: &mut MmList, folios: Vec<Pfn>) -> u64 {
    let mut list = VecDeque::from(folios);
    let mut reclaimed = 0;
    while let Some(folio) = list.pop_front() {
        let order = m.zone.memmap.page(folio).order();
        let nr = 1u64 << order;
        if !folio_test_lazyfree(m, folio) {
            if rmap::folio_maybe_dma_pinned(m, folio) {
                continue; // keep_locked
            }
            if order == 0 {
                folio_set_active(m, folio); // folio_alloc_swap failed
                continue;
            }
            if !rmap::folio_refs_all_mappings(m, folio) {
                folio_set_active(m, folio); // !can_split_folio
                continue;
            }
            let head = m.zone.memmap.page(folio);
            let partially_mapped = head.test(pg::DEFERRED) && head.test(pg::PARTIALLY_MAPPED);
            if !split_folio(m, mms, folio) {
                folio_set_active(m, folio);
                continue;
            }
            if !partially_mapped {
                // folio_alloc_swap failed: "fallback to swap normal pages".
                if order == HPAGE_PMD_ORDER {
                    m.stat.count_vm_event(VmEvent::ThpSwpoutFallback);
                }
                m.stat.count_mthp_stat(order, MthpStat::SwpoutFallback);
            }
            // The head is order 0 now and fails folio_alloc_swap
            // (activate_locked_split); the tails follow on the list and fail
            // it too. Pages the split freed are gone.
            for i in 0..nr {
                let page = Pfn(folio.0 + i);
                if m.zone.memmap.page(page).mapcount == 0 {
                    continue;
                }
                if i == 0 || partially_mapped {
                    folio_set_active(m, page);
                } else {
                    list.push_back(page);
                }
            }
            continue;
        }
        if rmap::folio_mapcount(m, folio) > 0 && try_to_unmap_lazyfree(m, mms, folio) {
            folio_set_active(m, folio); // still mapped
            continue;
        }
        if rmap::folio_ref_count(m, folio) != 0 {
            continue; // folio_ref_freeze fails: keep
        }
        m.stat.count_vm_events(VmEvent::PgLazyfreed, nr);
        reclaimed += nr;
        free_folio(m, folio);
    }
    reclaimed
}

/// try_to_unmap of a lazily-freed folio (mm/rmap.c `try_to_unmap_one`, its
/// MADV_FREE branch): in each mm that maps it, a PMD mapping is split (see
/// the module doc), then the folio's PTEs there, one batch
/// (`folio_unmap_pte_batch`), are cleared if none is dirty and the folio is
/// not PG_dirty and holds no reference besides its mappings. A dirty batch
/// makes the folio dirty and swapbacked again and stops the walk; an extra
/// reference (a pin) stops it too. True when the folio is still mapped.
///
/// Named for try_to_unmap's MADV_FREE branch, the only one the model needs.
pub fn try_to_unmap_lazyfree(m: &mut Machine, mms: &mut MmList, folio: Pfn) -> bool {
    let order = m.zone.memmap.page(folio).order();
    let nr = 1usize << order;
    let walk: Vec<rmap::AvcVisit> = if order > 0 {
        rmap::anon_vma_interval_tree_foreach(m, mms, folio)
    } else {
        // A small folio has no anon_vma in the model: every mm of the fork
        // family of the mm that marked it, at the address it was marked at.
        let e = m.lru.get(folio);
        let mut ids = Vec::new();
        m.anon_vmas.tree(m.anon_vmas.root(e.mm), &mut ids);
        ids.retain(|id| m.anon_vmas.get(*id).is_some_and(|av| av.mm_alive));
        let (start, end, addr) = (e.addr, e.addr + PAGE_SIZE, e.addr);
        ids.into_iter()
            .map(|mm| rmap::AvcVisit {
                mm,
                start,
                end,
                addr,
            })
            .collect()
    };
    for v in walk {
        let Some(mm) = mms.get_mut(v.mm) else {
            continue;
        };
        let index = v.addr / PMD_SIZE;
        let huge = matches!(mm.pmds.get(&index), Some(Pmd::Huge { pfn, .. }) if *pfn == folio);
        if huge && v.holds_pmd() {
            split_huge_pmd(m, mm, v.addr);
        }
        for (index, first, lo, hi) in v.pte_spans(nr) {
            if !unmap_lazyfree_ptes(m, mm, v.mm, folio, index, first, lo..hi) {
                return true;
            }
        }
    }
    rmap::folio_mapcount(m, folio) > 0
}

/// try_to_unmap_lazyfree's work in one PTE table of `mm` (at PMD `index`)
/// for the folio's pages `pages`, the first of which sits at PTE `first`: false when the walk must stop there (a dirty PTE or folio made
/// the folio dirty and swapbacked again, or an extra reference keeps it).
///
/// No kernel function: the body of try_to_unmap_one's loop for one page table.
fn unmap_lazyfree_ptes(
    m: &mut Machine,
    mm: &mut MmStruct,
    id: MmId,
    folio: Pfn,
    index: u64,
    first: usize,
    pages: std::ops::Range<usize>,
) -> bool {
    let Some(Pmd::Table(t)) = mm.pmds.get_mut(&index) else {
        return true;
    };
    // Page i of the folio is at PTE `first + (i - base)`.
    let base = pages.start;
    let at = |i: usize| first + (i - base);
    let mapped: Vec<usize> = pages
        .filter(|&i| t.ptes[at(i)].pfn() == Some(Pfn(folio.0 + i as u64)))
        .collect();
    if mapped.is_empty() {
        return true;
    }
    let dirty = mapped.iter().any(|&i| t.pte_dirty(at(i)));
    if dirty || swap::folio_test_dirty(m, folio) {
        swap::folio_mark_dirty(m, folio);
        swap::folio_set_swapbacked(m, folio);
        return false;
    }
    if !rmap::folio_refs_all_mappings(m, folio) {
        return false;
    }
    for &i in &mapped {
        t.ptes[at(i)] = Pte::NONE;
    }
    // One run per stretch of consecutive pages.
    let mut k = 0;
    while k < mapped.len() {
        let mut len = 1;
        while k + len < mapped.len() && mapped[k + len] == mapped[k] + len {
            len += 1;
        }
        let page = Pfn(folio.0 + mapped[k] as u64);
        rmap::folio_remove_rmap_ptes(m, folio, page, len as u64, id);
        k += len;
    }
    m.stat.sub_mm_anon(&mut mm.anon_rss, mapped.len() as u64);
    true
}

/// Reclaim of lazily-freed folios for the rest of the model (memcg limit
/// reclaim): `shrink_folio_list` on the lazily-freed folios that `filter`
/// accepts (by pfn order), taken until they hold `nr_to_reclaim` pages.
/// Returns the pages freed: fewer when some were written again since
/// MADV_FREE (they become swapbacked and active instead), or pinned.
/// Without swap, LRU reclaim (memcg limit reclaim included) scans no anon
/// list (`can_reclaim_anon_pages` is false), but lazily-freed folios are on
/// the file list and are scanned there; this takes them in pfn order, not
/// LRU order, and as MADV_PAGEOUT does (ignore_references): the kernel's
/// `folio_check_references` would first keep one whose PTE is young (read
/// since MADV_FREE), and the model has no accessed bit.
/// It unmaps pages of whichever processes map the folios, so the statement
/// that calls it must forget every process's cached readings
/// (`reading_cache::Touches::Everything`), not only its own family's.
///
/// No kernel function: shrink_folio_list limited to lazily-freed folios, the only ones the model reclaims.
pub fn shrink_lazyfree(
    m: &mut Machine,
    mms: &mut MmList,
    nr_to_reclaim: u64,
    mut filter: impl FnMut(&Machine, Pfn) -> bool,
) -> u64 {
    let mut list = Vec::new();
    let mut pages = 0;
    for (folio, e) in m.lru.entries() {
        if pages >= nr_to_reclaim {
            break;
        }
        if e.flags & swap::LAZYFREE == 0 || !filter(m, folio) {
            continue;
        }
        pages += 1u64 << m.zone.memmap.page(folio).order();
        list.push(folio);
    }
    shrink_folio_list(m, mms, list)
}

/// try_to_free_mem_cgroup_pages without swap: the memcg's lazily-freed
/// folios are discarded (up to nr_to_reclaim = max(nr, SWAP_CLUSTER_MAX)
/// pages) and, if that falls short, the deferred split shrinker runs on the
/// memcg's queue. Returns the pages reclaimed from the LRU (nr_reclaimed;
/// what the shrinker frees is not counted there for memcg reclaim).
pub fn try_to_free_mem_cgroup_pages(
    m: &mut Machine,
    mm: Option<&mut MmStruct>,
    memcg: MemcgId,
    nr: u64,
) -> u64 {
    m.with_mms(mm, |m, mms| shrink_memcg(m, mms, memcg, nr))
}

/// try_to_free_mem_cgroup_pages's work, with every mm reachable.
fn shrink_memcg(m: &mut Machine, mms: &mut MmList, memcg: MemcgId, nr: u64) -> u64 {
    // lazyfree discard: see vmscan (shrink_folio_list frees the memcg's
    // clean lazily-freed anonymous folios; their pages count in
    // nr_reclaimed). shrink_lruvec runs before shrink_slab.
    let nr_to_reclaim = nr.max(SWAP_CLUSTER_MAX);
    let nr_reclaimed = crate::vmscan::shrink_lazyfree(m, mms, nr_to_reclaim, |m, f| {
        m.memcg.folio_memcg(f) == Some(memcg)
    });
    // The shrinker's scan count (its queue length >> priority) reaches a
    // memcg's few queued folios only at the lowest priorities, which
    // do_try_to_free_pages gets to only while the LRU falls short.
    if nr_reclaimed < nr_to_reclaim {
        deferred_split_scan_memcg(m, mms, memcg);
    }
    nr_reclaimed
}

/// deferred_split_scan on the memcg's queue: the folios of the queue
/// charged to `memcg`, in queue order. A folio some mm of whose fork family
/// is not reachable (the child `fork` is building) stays queued.
///
/// Named for deferred_split_scan with sc->memcg set; the kernel has one function for both queues.
fn deferred_split_scan_memcg(m: &mut Machine, mms: &mut MmList, memcg: MemcgId) {
    let mine: Vec<Pfn> = m
        .deferred_split_queue
        .iter()
        .filter(|&f| m.memcg.folio_memcg(f) == Some(memcg))
        .filter(|&f| {
            let walk = crate::rmap::rmap_walk_anon(m, f);
            walk.iter().all(|id| mms.get_mut(*id).is_some())
        })
        .collect();
    if mine.is_empty() {
        return;
    }
    m.deferred_split_queue.remove_all(&mine);
    crate::huge_memory::deferred_split_scan_folios(m, mms, mine);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Model;

    /// Two PMD THPs lazily freed, the second written again.
    fn model() -> Model {
        let text = "set transparent_hugepage/enabled always\n\
                    spawn a\n\
                    a mmap r 4M\n\
                    a write r\n\
                    a madvise r FREE\n\
                    a write r+2M:4K\n";
        let w = hugelab_workload::parse("t.hlw", text).expect("parses");
        let mut model = Model::default().with_invariant_checks();
        hugelab_workload::run(&mut model, &w).expect("runs");
        model
    }

    fn shrink(model: &mut Model, nr: u64, filter: impl FnMut(&Machine, Pfn) -> bool) -> u64 {
        let m = &mut model.machine;
        m.with_mms(None, |m, mms| shrink_lazyfree(m, mms, nr, filter))
    }

    #[test]
    fn shrink_lazyfree_discards_clean_folios_and_keeps_written_ones() {
        let mut model = model();
        assert_eq!(model.machine.stat.event(VmEvent::PgLazyfree), 1024);
        let freed = shrink(&mut model, u64::MAX, |_, _| true);
        assert_eq!(freed, 512);
        assert_eq!(model.machine.stat.event(VmEvent::PgLazyfreed), 512);
        // The written THP is swapbacked again, active and dirty: nothing
        // lazily freed is left, and a second pass frees nothing.
        assert!(model
            .machine
            .lru
            .entries()
            .iter()
            .all(|(_, e)| e.flags == swap::ACTIVE | swap::DIRTY));
        assert_eq!(shrink(&mut model, u64::MAX, |_, _| true), 0);
        assert_eq!(model.machine.mm_of("a").unwrap().anon_rss, 512);
        // The statement that reclaims forgets every process's readings.
        model.reading_cache = Default::default();
        let broken = crate::debug_vm::check(&model);
        assert!(broken.is_empty(), "{broken:?}");
    }

    #[test]
    fn shrink_lazyfree_takes_only_what_the_filter_accepts_and_stops_at_the_target() {
        let mut model = model();
        assert_eq!(shrink(&mut model, u64::MAX, |_, _| false), 0);
        // One folio is enough for a target of one page.
        let mut seen = 0;
        shrink(&mut model, 1, |_, _| {
            seen += 1;
            true
        });
        assert_eq!(seen, 1);
        assert_eq!(model.machine.stat.event(VmEvent::PgLazyfree), 1024);
    }
}
