//! Reverse-map accounting: mapcounts of folios and pages, and the anon
//! statistics that follow them (NR_ANON_MAPPED, NR_ANON_THPS, per-size nr_anon).
//!
//! Follows Linux 6.18 `mm/rmap.c` with CONFIG_PAGE_MAPCOUNT=y: `_entire_mapcount`
//! counts PMD mappings, each page's `_mapcount` its PTE mappings, and
//! `_nr_pages_mapped` the pages mapped by at least one PTE. Simplifications: no
//! anon_vma chains (the model finds mappings by walking page tables), no
//! `_large_mapcount` or MM_ID tracking yet.

use crate::huge_memory::deferred_split_folio;
use crate::mm_types::{pg, Pfn, HPAGE_PMD_NR};
use crate::vmstat::MthpStat;
use crate::Machine;

/// Folio-level fields overlaid on the first tail pages (see mm_types).
#[inline]
pub fn folio_entire_mapcount(m: &Machine, folio: Pfn) -> u32 {
    m.zone.memmap.page(Pfn(folio.0 + 1)).private
}

#[inline]
pub fn folio_nr_pages_mapped(m: &Machine, folio: Pfn) -> u32 {
    m.zone.memmap.page(Pfn(folio.0 + 2)).private
}

#[inline]
pub fn folio_ref_count(m: &Machine, folio: Pfn) -> u32 {
    m.zone.memmap.page(folio).private
}

/// folio_add_new_anon_rmap(RMAP_EXCLUSIVE): a freshly allocated folio gets its
/// first mapping — by one PMD when `pmd`, else by one PTE per page.
pub fn folio_add_new_anon_rmap(m: &mut Machine, folio: Pfn, order: u32, pmd: bool) {
    let nr = 1u64 << order;
    let pages = m.zone.memmap.pages_mut(folio, nr);
    for page in pages.iter_mut() {
        page.set(pg::ANON | pg::ANON_EXCLUSIVE);
        if !pmd {
            page.mapcount = 1;
        }
    }
    if order > 0 {
        pages[1].private = u32::from(pmd);
        pages[2].private = if pmd { 0 } else { nr as u32 };
        m.stat.mod_mthp_stat(order, MthpStat::NrAnon, 1);
    }
    pages[0].private = if pmd { 1 } else { nr as u32 };
    m.stat.nr_anon_mapped += nr as i64;
    if pmd {
        m.stat.nr_anon_thps += nr as i64;
    }
}

/// folio_add_anon_rmap_ptes on an already mapped folio (the PMD split path):
/// `nr` pages from `page` gain a PTE mapping and a reference each.
pub fn folio_add_anon_rmap_ptes(m: &mut Machine, folio: Pfn, page: Pfn, nr: u64) {
    let memmap = &mut m.zone.memmap;
    let mut newly = 0;
    for p in memmap.pages_mut(page, nr) {
        p.mapcount += 1;
        newly += u32::from(p.mapcount == 1);
    }
    memmap.page_mut(Pfn(folio.0 + 2)).private += newly;
    memmap.page_mut(folio).private += nr as u32;
    // Pages already mapped by a PMD were counted in NR_ANON_MAPPED then.
    if folio_entire_mapcount(m, folio) == 0 {
        m.stat.nr_anon_mapped += i64::from(newly);
    }
}

/// folio_remove_rmap_pmd + the reference the PMD held. Returns true when the
/// folio's last reference went and it must be freed.
pub fn folio_remove_rmap_pmd(m: &mut Machine, folio: Pfn) -> bool {
    let memmap = &mut m.zone.memmap;
    let entire = &mut memmap.page_mut(Pfn(folio.0 + 1)).private;
    debug_assert!(*entire > 0, "PMD unmap of a folio with no PMD mapping");
    *entire -= 1;
    if *entire == 0 {
        m.stat.nr_anon_thps -= HPAGE_PMD_NR as i64;
        let pte_mapped = u64::from(folio_nr_pages_mapped(m, folio));
        let unmapped = HPAGE_PMD_NR - pte_mapped;
        m.stat.nr_anon_mapped -= unmapped as i64;
        if unmapped > 0 && unmapped < HPAGE_PMD_NR {
            deferred_split_folio(m, folio, true);
        }
    }
    folio_put_refs(m, folio, 1)
}

/// folio_remove_rmap_ptes + the references the PTEs held: `nr` consecutive
/// pages from `page` lose one PTE mapping each. Queues the folio for deferred
/// split when it is left partially mapped. Returns true when the folio must be freed.
pub fn folio_remove_rmap_ptes(m: &mut Machine, folio: Pfn, page: Pfn, nr: u64) -> bool {
    let memmap = &mut m.zone.memmap;
    let order = memmap.page(folio).order();
    let mut last = 0u32;
    for p in memmap.pages_mut(page, nr) {
        debug_assert!(p.mapcount > 0, "PTE unmap of an unmapped page");
        p.mapcount -= 1;
        last += u32::from(p.mapcount == 0);
    }
    if order == 0 {
        m.stat.nr_anon_mapped -= i64::from(last);
    } else {
        let mapped = &mut memmap.page_mut(Pfn(folio.0 + 2)).private;
        *mapped -= last;
        let still_mapped = *mapped;
        // Pages still covered by a PMD mapping stay counted.
        let newly_unmapped = if folio_entire_mapcount(m, folio) == 0 {
            last
        } else {
            0
        };
        m.stat.nr_anon_mapped -= i64::from(newly_unmapped);
        if newly_unmapped > 0 && still_mapped > 0 {
            deferred_split_folio(m, folio, true);
        }
    }
    folio_put_refs(m, folio, nr as u32)
}

/// folio_put_refs: drops references; true when none are left.
pub fn folio_put_refs(m: &mut Machine, folio: Pfn, refs: u32) -> bool {
    let head = m.zone.memmap.page_mut(folio);
    debug_assert!(head.private >= refs, "refcount underflow on {folio}");
    head.private -= refs;
    head.private == 0
}
