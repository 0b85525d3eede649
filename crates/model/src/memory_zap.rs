//! Tearing mappings down: `zap_page_range` over a range of an mm, for
//! munmap, MADV_DONTNEED, exit, the OOM killer's victim and khugepaged's
//! collapse.
//!
//! Follows Linux 6.18 `mm/memory.c` (`zap_page_range_single`,
//! `unmap_page_range`, which splits a PMD it only partly covers, and
//! `zap_pte_range`: a folio's PTEs in batches, `folio_pte_batch`, a small
//! folio's PTE inline), with `zap_huge_pmd` in `huge_memory`. The unmap
//! half of that file, in a module of its own: a fault's memcg charge may
//! kill a process, whose teardown runs through here, so the zap sits below
//! the faults (`memory`).

use crate::huge_memory::{split_huge_pmd, zap_huge_pmd};
use crate::internal::folio_pte_batch;
use crate::mm_types::{MmId, MmStruct, Pfn, PMD_SIZE};
use crate::page_alloc::free_folio;
use crate::pgtable::{pte_index, Pmd, Pte};
use crate::rmap;
use crate::sparse::page_folio;
use crate::Machine;

/// Whether a whole PMD-sized slot lies in `[start, end)`.
fn covers_slot(start: u64, end: u64, index: u64) -> bool {
    start <= index * PMD_SIZE && (index + 1) * PMD_SIZE <= end
}

/// zap_page_range_single / unmap_page_range over `[start, end)`: removes every
/// mapping, splitting PMDs that are only partly covered, and frees folios whose
/// last reference goes. Page tables stay (free_pgtables decides about them).
///
/// Named for zap_page_range (since 6.3 zap_page_range_single, and unmap_vmas at exit), over any range.
pub fn zap_page_range(m: &mut Machine, mm: &mut MmStruct, start: u64, end: u64) {
    let first = start / PMD_SIZE;
    let last = (end - 1) / PMD_SIZE;
    let indexes: Vec<u64> = mm.pmds.range(first..=last).map(|(i, _)| i).collect();
    for index in indexes {
        let whole = covers_slot(start, end, index);
        match mm.pmds.get(&index) {
            Some(Pmd::Huge { .. }) | Some(Pmd::HugeZero { .. }) if !whole => {
                split_huge_pmd(m, mm, index * PMD_SIZE);
            }
            _ => {}
        }
        match mm.pmds.get(&index) {
            Some(Pmd::Huge { .. }) | Some(Pmd::HugeZero { .. }) => zap_huge_pmd(m, mm, index),
            Some(Pmd::Table(_)) => {
                let lo = start.max(index * PMD_SIZE);
                let hi = end.min((index + 1) * PMD_SIZE);
                zap_pte_range(m, mm, index, lo, hi);
            }
            None => {}
        }
    }
}

/// zap_pte_range: clears the PTEs of `[lo, hi)` in one table, removing the
/// rmap of each folio in one batch (folio_remove_rmap_ptes), so that a folio
/// unmapped whole is never seen as partially mapped.
pub(crate) fn zap_pte_range(m: &mut Machine, mm: &mut MmStruct, index: u64, lo: u64, hi: u64) {
    let Some(Pmd::Table(t)) = mm.pmds.get_mut(&index) else {
        unreachable!("zap_pte_range without a table");
    };
    let mut i = pte_index(lo);
    let end = pte_index(hi - 1) + 1;
    let (mut unmapped, mut small_unmapped) = (0u64, 0i64);
    // Small folios freed here at consecutive pfns, freed as one run (the
    // kernel batches its frees too, in mmu_gather).
    let mut run = (Pfn(0), 0u64);
    while i < end {
        let pte = std::mem::replace(&mut t.ptes[i], Pte::NONE);
        let Some(pfn) = pte.pfn() else {
            i += 1;
            continue;
        };
        // A small folio (the exit hot path): its one page is the folio.
        let page = m.zone.memmap.page_mut(pfn);
        if !page.test(crate::mm_types::pg::ANON) {
            // A page cache page (filemap): the page cache keeps it; a
            // dirty PTE dirties it (zap_present_folio_ptes).
            if t.pte_dirty(i) {
                page.set(crate::mm_types::pg::DIRTY);
            }
            crate::filemap::folio_remove_file_rmap_pte(m, pfn);
            i += 1;
            continue;
        }
        if page.is_small_folio() {
            debug_assert!(page.mapcount > 0 && page.private > 0);
            page.mapcount -= 1;
            page.private -= 1;
            small_unmapped += i64::from(page.mapcount == 0);
            unmapped += 1;
            if page.private == 0 {
                crate::memcontrol::mem_cgroup_uncharge(m, pfn);
                // free_folio of a small folio is the buddy free alone
                // (and forgetting its LRU state, if it has one).
                m.lru.forget(pfn);
                if run.1 > 0 && run.0 .0 + run.1 == pfn.0 {
                    run.1 += 1;
                } else {
                    m.zone.free_pages_run(run.0, run.1);
                    run = (pfn, 1);
                }
            }
            i += 1;
            continue;
        }
        m.zone.free_pages_run(run.0, run.1);
        run.1 = 0;
        t.ptes[i] = pte;
        let nr = zap_present_folio_ptes(m, &mut t.ptes[i..end], pfn, mm.mm_id);
        unmapped += nr as u64;
        i += nr;
    }
    m.zone.free_pages_run(run.0, run.1);
    m.stat.sub_mm_anon(&mut mm.anon_rss, unmapped);
    m.stat.nr_anon_mapped -= small_unmapped;
}

/// zap_present_folio_ptes: the PTEs of one large folio from `ptes[0]` (which
/// maps `pfn`) cleared in one batch; returns how many. Out of line: the
/// order-0 loop above is the exit hot path and keeps its registers.
#[inline(never)]
fn zap_present_folio_ptes(m: &mut Machine, ptes: &mut [Pte], pfn: Pfn, mm_id: MmId) -> usize {
    let folio = page_folio(m, pfn);
    let nr = folio_pte_batch(m, folio, ptes, ptes.len());
    ptes[..nr].fill(Pte::NONE);
    if rmap::folio_remove_rmap_ptes(m, folio, pfn, nr as u64, mm_id) {
        free_folio(m, folio);
    }
    nr
}
