//! `reclaim`: memory pressure as `echo 2 > /proc/sys/vm/drop_caches` applies
//! it, which is what the kernel backend does: every slab shrinker runs
//! until it frees little more (drop_slab). Two matter to anonymous THPs:
//! the deferred split shrinker and the huge zero folio's.
//!
//! Follows Linux 6.18 `mm/vmscan.c` (drop_slab, shrink_slab) and
//! `mm/huge_memory.c` (deferred_split_scan, thp_underused,
//! shrink_huge_zero_folio_scan). Simplifications: one node and no memcg
//! (one queue); the queue is walked to its end in one pass, which is what
//! drop_slab's repeated batches amount to when no split fails; a split that
//! fails (a pinned folio) is tried once per `reclaim` here, while drop_slab
//! retries it as long as other shrinkers free enough, which is why
//! thp_split_page_failed is an attempt count that `diff` treats as a bound;
//! page reclaim itself (LRU, swap) is not run:
//! drop_caches does not run it either.

use crate::huge_memory::{split_folio, thp_underused};
use crate::mm_types::{pg, HPAGE_PMD_ORDER};
use crate::mmap::MmStruct;
use crate::vmstat::VmEvent;
use crate::Machine;

/// drop_slab: the shrinkers that concern anonymous memory, in turn.
pub fn drop_slab(m: &mut Machine, mms: &mut [&mut MmStruct]) {
    deferred_split_scan(m, mms);
    shrink_huge_zero_folio_scan(m);
}

/// deferred_split_scan: every queued folio leaves the queue. A partially
/// mapped one is split; one that is not is split only if thp_underused
/// (then thp_underused_split_page), else it is simply dropped from the
/// queue: the under-used check is made once. A partially mapped folio whose
/// split fails (pinned) goes back to the tail of the queue.
pub fn deferred_split_scan(m: &mut Machine, mms: &mut [&mut MmStruct]) {
    for folio in m.deferred_split_queue.drain() {
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

/// shrink_huge_zero_folio_scan: frees the huge zero folio when no mm maps
/// it any more (only the shrinker's own reference is left); the next huge
/// zero fault allocates it again (thp_zero_page_alloc).
fn shrink_huge_zero_folio_scan(m: &mut Machine) {
    if m.huge_zero_refcount == 1 {
        if let Some(folio) = m.huge_zero_folio.take() {
            m.huge_zero_refcount = 0;
            m.zone.free_pages(folio, HPAGE_PMD_ORDER);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::Model;
    use hugelab_workload::{parse, run};

    /// Under-used splits at reclaim after writing `pages` pages of one THP,
    /// with max_ptes_none 409.
    fn underused_splits(pages: u64) -> i64 {
        let text = format!(
            "set transparent_hugepage/enabled madvise\n\
             set transparent_hugepage/khugepaged/max_ptes_none 409\n\
             spawn a\n\
             a mmap buf 2M align=2M\n\
             a madvise buf HUGEPAGE\n\
             a write buf:{}K\n\
             reclaim\n",
            pages * 4
        );
        let w = parse("underused.hlw", &text).unwrap();
        let obs = run(&mut Model::default(), &w).unwrap();
        obs.snapshot("end").unwrap().counters["vmstat.thp_underused_split_page"]
    }

    #[test]
    fn underused_means_more_zero_pages_than_max_ptes_none() {
        // 512 - pages zero-filled pages: split iff that is > 409.
        assert_eq!(underused_splits(102), 1); // 410 zero pages
        assert_eq!(underused_splits(103), 0); // 409 zero pages
        assert_eq!(underused_splits(512), 0);
    }
}
