//! Consistency checks of the whole model, in the spirit of CONFIG_DEBUG_VM's
//! VM_BUG_ON_FOLIO: the page tables of every process are walked and what
//! they map is compared with the folio metadata and the counters.
//!
//! Checked: each page's PTE mapcount and each large folio's entire mapcount
//! and `_nr_pages_mapped` equal the mappings found; every folio's refcount
//! equals its mappings plus its pins; NR_ANON_MAPPED, NR_ANON_THPS and each
//! mm's MM_ANONPAGES equal what is mapped; page-table pages counted in
//! NR_PAGETABLE equal the tables found; allocated frames (folios, tables,
//! the huge zero folio) plus free frames equal the zone's frames.
//! Slow (a full walk): for tests, not for benchmarks.

use crate::memory::page_folio;
use crate::mm_types::{pg, Pfn, HPAGE_PMD_NR, PMD_SIZE};
use crate::pgtable::Pmd;
use crate::rmap::{self, GUP_PIN_COUNTING_BIAS};
use crate::Model;
use std::collections::{BTreeMap, BTreeSet};

/// Every broken invariant, one sentence each; empty when all hold.
pub fn check(model: &Model) -> Vec<String> {
    let m = &model.machine;
    let mut bad = Vec::new();
    let mut pte_maps: BTreeMap<Pfn, u32> = BTreeMap::new();
    let mut pmd_maps: BTreeMap<Pfn, u32> = BTreeMap::new();
    let mut tables = 0i64;
    for (name, task) in &model.tasks {
        let mm = &task.mm;
        let mut rss = 0u64;
        tables += (mm.pmd_tables.len() + mm.pud_tables.len()) as i64;
        for (index, pmd) in mm.pmds.range(0..=u64::MAX) {
            tables += 1;
            match pmd {
                Pmd::Huge { pfn, .. } => {
                    *pmd_maps.entry(*pfn).or_default() += 1;
                    rss += HPAGE_PMD_NR;
                }
                Pmd::HugeZero { .. } => {}
                Pmd::Table(t) => {
                    for pte in t.ptes.iter() {
                        if let Some(pfn) = pte.pfn() {
                            *pte_maps.entry(pfn).or_default() += 1;
                            rss += 1;
                        }
                    }
                }
            }
            if mm
                .vmas_in(index * PMD_SIZE, (index + 1) * PMD_SIZE)
                .is_empty()
            {
                bad.push(format!(
                    "{name}: a page table at {:#x} with no VMA",
                    index * PMD_SIZE
                ));
            }
        }
        if rss != mm.anon_rss {
            bad.push(format!(
                "{name}: MM_ANONPAGES {} but {rss} pages mapped",
                mm.anon_rss
            ));
        }
    }
    let mut pins: BTreeMap<Pfn, u32> = BTreeMap::new();
    for pin in &model.pins {
        for page in &pin.pages {
            *pins.entry(page_folio(m, *page)).or_default() += 1;
        }
    }
    let mut folios: BTreeSet<Pfn> = pins.keys().copied().collect();
    folios.extend(pmd_maps.keys().copied());
    folios.extend(pte_maps.keys().map(|p| page_folio(m, *p)));
    let (mut anon_mapped, mut anon_thps, mut frames) = (0i64, 0i64, 0u64);
    for &folio in &folios {
        let head = m.zone.memmap.page(folio);
        if !head.test(pg::HEAD) || head.test(pg::BUDDY) {
            bad.push(format!("{folio} is mapped or pinned but is no folio"));
            continue;
        }
        let order = head.order();
        let nr = 1u64 << order;
        frames += nr;
        let entire = pmd_maps.get(&folio).copied().unwrap_or(0);
        let mut ptes = 0u64;
        let mut mapped_pages = 0u32;
        for i in 0..nr {
            let page = Pfn(folio.0 + i);
            let found = pte_maps.get(&page).copied().unwrap_or(0);
            let stored = u32::from(m.zone.memmap.page(page).mapcount);
            if found != stored {
                bad.push(format!("{page}: mapcount {stored} but {found} PTEs map it"));
            }
            ptes += u64::from(found);
            mapped_pages += u32::from(found > 0);
            anon_mapped += i64::from(found > 0 || entire > 0);
        }
        if order > 0 {
            if rmap::folio_entire_mapcount(m, folio) != entire {
                bad.push(format!(
                    "{folio}: entire mapcount {} but {entire} PMDs map it",
                    rmap::folio_entire_mapcount(m, folio)
                ));
            }
            if rmap::folio_nr_pages_mapped(m, folio) != mapped_pages {
                bad.push(format!(
                    "{folio}: nr_pages_mapped {} but {mapped_pages} pages are PTE-mapped",
                    rmap::folio_nr_pages_mapped(m, folio)
                ));
            }
            if entire > 0 {
                anon_thps += nr as i64;
            }
        }
        let pinned = pins.get(&folio).copied().unwrap_or(0);
        let pin_refs = if order > 0 {
            pinned
        } else {
            pinned * GUP_PIN_COUNTING_BIAS
        };
        let expected = ptes + u64::from(entire) + u64::from(pin_refs);
        let refs = u64::from(rmap::folio_ref_count(m, folio));
        if refs != expected {
            bad.push(format!(
                "{folio}: refcount {refs} but {expected} mappings and pins"
            ));
        }
    }
    if anon_mapped != m.stat.nr_anon_mapped {
        bad.push(format!(
            "NR_ANON_MAPPED {} but {anon_mapped} pages mapped",
            m.stat.nr_anon_mapped
        ));
    }
    if anon_thps != m.stat.nr_anon_thps {
        bad.push(format!(
            "NR_ANON_THPS {} but {anon_thps} pages PMD-mapped",
            m.stat.nr_anon_thps
        ));
    }
    // Each PMD entry holds one table page: its PTE table or the deposited one.
    if tables != m.stat.nr_pagetable {
        bad.push(format!(
            "NR_PAGETABLE {} but {tables} tables found",
            m.stat.nr_pagetable
        ));
    }
    let zero = m.huge_zero_folio.map_or(0, |_| HPAGE_PMD_NR);
    let used = frames + tables as u64 + zero;
    let total = m.zone.spanned_pages();
    if used + m.zone.nr_free_pages() != total {
        bad.push(format!(
            "{used} frames in use and {} free, but the zone has {total}",
            m.zone.nr_free_pages()
        ));
    }
    bad
}

#[cfg(test)]
mod tests {
    use super::check;
    use crate::mm_types::Pfn;
    use crate::pgtable::Pmd;
    use crate::Model;
    use hugelab_workload::{parse, Backend};

    fn forked_64k() -> Model {
        let text = "set transparent_hugepage/hugepages-64kB/enabled always\n\
                    spawn a\na mmap buf 64K align=64K\na write buf\na fork b\nb write buf:4K\n";
        let w = parse("t.hlw", text).unwrap();
        let mut model = Model::default();
        for stmt in &w.stmts {
            model.execute(stmt).unwrap();
        }
        model
    }

    #[test]
    fn a_consistent_model_passes() {
        assert_eq!(check(&forked_64k()), Vec::<String>::new());
    }

    #[test]
    fn a_broken_mapcount_is_caught() {
        let mut model = forked_64k();
        let pfn = match model.tasks["a"].mm.pmds.range(0..=u64::MAX).next() {
            Some((_, Pmd::Table(t))) => t.ptes.iter().find_map(|p| p.pfn()).unwrap(),
            _ => panic!("a has a PTE table"),
        };
        model.machine.zone.memmap.page_mut(Pfn(pfn.0 + 1)).mapcount += 1;
        let broken = check(&model);
        assert!(
            broken
                .iter()
                .any(|b| b.contains("mapcount 3 but 2 PTEs map it")),
            "{broken:?}"
        );
    }
}
