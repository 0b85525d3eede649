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
//! Per large folio, also: no MM-ID slot (`_mm_id`, `_mm_id_mapcount`)
//! counts more mappings than its MM holds, and a folio mapped by two MMs is
//! marked shared (folio_maybe_mapped_shared has no false negatives); a page
//! marked PageAnonExclusive is mapped once (for a PMD-mapped folio, its head:
//! the model marks every page of a new PMD folio, the kernel only the head);
//! no MM-ID entry outlives its large folio; the deferred split queue holds
//! exactly the folios flagged as queued, a partially mapped folio is queued
//! and really partially mapped; the per-size nr_anon and
//! nr_anon_partially_mapped equal the folios found.
//! The reverse map: a large folio's `_large_mapcount` equals its mappings;
//! each of its pages is mapped only at its folio's index (plus the page's
//! offset) and only by mms its anon_vma's tree reaches, so rmap walks miss
//! nothing; each anon_vma counts the large folios pointing at it, is linked
//! both ways with its parent, and is marked live exactly while its mm is.
//! The task list and the mm table (see `mms`): every task's mm exists, and
//! every mm in the table has a task (an mm whose last task exited is torn
//! down and freed; threads share one mm).
//! Each process's cached readings (`reading_cache`), where still taken as
//! fresh, equal a fresh computation.
//! With no process left, every frame but the huge zero folio is free.
//! Slow (a full walk): for tests and `--check`, not for benchmarks.

use crate::mm_types::{page_folio, pg, Pfn, HPAGE_PMD_NR, HPAGE_PMD_ORDER, PAGE_SIZE, PMD_SIZE};
use crate::pgtable::Pmd;
use crate::rmap::{self, MmId, GUP_PIN_COUNTING_BIAS, MM_ID_DUMMY};
use crate::vmstat::MthpStat;
use crate::Model;
use std::collections::{BTreeMap, BTreeSet};

/// Every broken invariant, one sentence each; empty when all hold.
pub fn check(model: &Model) -> Vec<String> {
    let m = &model.machine;
    let mut bad = Vec::new();
    // LRU state (swap): only folios in use have one, and a lazily-freed
    // folio is anon (it may be active: reclaim activates one it cannot
    // unmap, a pinned one, without making it swapbacked).
    for (folio, e) in m.lru.entries() {
        let p = m.zone.memmap.page(folio);
        if !p.test(crate::mm_types::pg::HEAD) || p.test(crate::mm_types::pg::BUDDY) {
            bad.push(format!("{folio} has LRU state but is no folio in use"));
        } else if e.flags & crate::swap::LAZYFREE != 0 && !p.test(crate::mm_types::pg::ANON) {
            bad.push(format!("lazily-freed {folio} is not anon"));
        }
    }
    let mut pte_maps: BTreeMap<Pfn, u32> = BTreeMap::new();
    let mut pmd_maps: BTreeMap<Pfn, u32> = BTreeMap::new();
    let mut tables = 0i64;
    // Mappings (PTEs plus PMDs) of each folio by each MM.
    let mut by_mm: BTreeMap<Pfn, BTreeMap<MmId, u64>> = BTreeMap::new();
    // Where each page of a large folio is mapped: (mm, page, address).
    let mut placed: Vec<(MmId, Pfn, u64)> = Vec::new();
    // memcontrol: every group's usage is what is charged to it, and only
    // pages in use are charged.
    for (g, usage) in crate::memcontrol::recount(m).into_iter().enumerate() {
        let group = &m.memcg.groups[g];
        if group.memory.usage != usage {
            bad.push(format!(
                "memcg {}: usage {} pages, charged pages {usage}",
                group.name, group.memory.usage
            ));
        }
    }
    for (pfn, _, _) in m.memcg.charged() {
        if m.zone.memmap.page(pfn).test(crate::mm_types::pg::BUDDY) {
            bad.push(format!("{pfn} is free but still charged to a memcg"));
        }
    }
    check_tasks(m, &mut bad);
    for mm in m.mms.iter() {
        let name = || mm_name(m, mm.mm_id);
        let mut count =
            |folio: Pfn| *by_mm.entry(folio).or_default().entry(mm.mm_id).or_default() += 1;
        let mut rss = 0u64;
        tables += (mm.pmd_tables.len() + mm.pud_tables.len()) as i64;
        for (index, pmd) in mm.pmds.range(0..=u64::MAX) {
            tables += 1;
            match pmd {
                Pmd::Huge { pfn, .. } => {
                    *pmd_maps.entry(*pfn).or_default() += 1;
                    count(*pfn);
                    placed.push((mm.mm_id, *pfn, index * PMD_SIZE));
                    rss += HPAGE_PMD_NR;
                }
                Pmd::HugeZero { .. } => {}
                Pmd::Table(t) => {
                    for (i, pte) in t.ptes.iter().enumerate() {
                        if let Some(pfn) = pte.pfn() {
                            *pte_maps.entry(pfn).or_default() += 1;
                            let folio = page_folio(m, pfn);
                            count(folio);
                            if m.zone.memmap.page(folio).order() > 0 {
                                let addr = index * PMD_SIZE + i as u64 * PAGE_SIZE;
                                placed.push((mm.mm_id, pfn, addr));
                            }
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
                    "{}: a page table at {:#x} with no VMA",
                    name(),
                    index * PMD_SIZE
                ));
            }
        }
        if rss != mm.anon_rss {
            bad.push(format!(
                "{}: MM_ANONPAGES {} but {rss} pages mapped",
                name(),
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
    let mut per_size = [(0i64, 0i64); HPAGE_PMD_ORDER as usize + 1];
    let queue: BTreeSet<Pfn> = m.deferred_split_queue.iter().collect();
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
            let large = m.zone.memmap.folio_ext(folio).large_mapcount;
            if u64::from(large) != ptes + u64::from(entire) {
                bad.push(format!(
                    "{folio}: _large_mapcount {large} but {} mappings",
                    ptes + u64::from(entire)
                ));
            }
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
        for i in 0..nr {
            let page = Pfn(folio.0 + i);
            let maps = pte_maps.get(&page).copied().unwrap_or(0) + if i == 0 { entire } else { 0 };
            // A PMD-mappable folio keeps the flag on its head while PMD-mapped.
            let meaningful = order != HPAGE_PMD_ORDER || entire == 0 || i == 0;
            if meaningful && maps > 1 && m.zone.memmap.page(page).test(pg::ANON_EXCLUSIVE) {
                bad.push(format!("{page}: PageAnonExclusive but mapped {maps} times"));
            }
        }
        if order > 0 {
            let mms = by_mm.remove(&folio).unwrap_or_default();
            check_large_folio(model, folio, &mms, &queue, &mut bad);
            per_size[order as usize].0 += 1;
            per_size[order as usize].1 += i64::from(head.test(pg::PARTIALLY_MAPPED));
        }
    }
    for folio in m.deferred_split_queue.iter() {
        let head = m.zone.memmap.page(folio);
        if !folios.contains(&folio) || head.order() < 2 || !head.test(pg::DEFERRED) {
            bad.push(format!(
                "{folio} is on the deferred split queue but is no mapped or pinned folio of order 2 or more flagged as queued"
            ));
        }
    }
    for &folio in m.folio_mm_ids.keys() {
        if !folios.contains(&folio) || m.zone.memmap.page(folio).order() == 0 {
            bad.push(format!(
                "{folio} has MM-ID slots but is no mapped large folio"
            ));
        }
    }
    for order in 2..=HPAGE_PMD_ORDER {
        let (anon, partial) = per_size[order as usize];
        for (stat, found) in [
            (MthpStat::NrAnon, anon),
            (MthpStat::NrAnonPartiallyMapped, partial),
        ] {
            let stored = m.stat.mthp_stat(order, stat);
            if stored != found {
                bad.push(format!(
                    "{}kB {}: {stored} but {found} folios found",
                    4u64 << order,
                    stat.name()
                ));
            }
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
    check_anon_vmas(model, &folios, &placed, &mut bad);
    bad.extend(
        model
            .reading_cache
            .stale(m, &m.tasks, crate::counters::process_counters),
    );
    let names: Vec<(String, &crate::mmap::MmStruct)> =
        m.mms.iter().map(|mm| (mm_name(m, mm.mm_id), mm)).collect();
    crate::hugetlb::check(m, names.iter().map(|(n, mm)| (n.as_str(), *mm)), &mut bad);
    let zero = m.huge_zero_folio.map_or(0, |_| HPAGE_PMD_NR);
    let hugetlb = m.hugetlb.frames() + m.vmemmap.zone_frames();
    let used = frames + tables as u64 + zero + hugetlb + m.unmovable_pages;
    let total = m.zone.spanned_pages();
    if used + m.zone.nr_free_pages() != total {
        bad.push(format!(
            "{used} frames in use and {} free, but the zone has {total}",
            m.zone.nr_free_pages()
        ));
    }
    bad
}

/// Every task's mm exists; every mm has a task.
fn check_tasks(m: &crate::Machine, bad: &mut Vec<String>) {
    for (name, task) in &m.tasks {
        if m.mms.get(task.mm).is_none() {
            bad.push(format!("{name}: its mm {} does not exist", task.mm));
        }
    }
    for mm in m.mms.iter() {
        if m.tasks_of(mm.mm_id).next().is_none() {
            bad.push(format!("mm {} has no task but was not torn down", mm.mm_id));
        }
    }
}

/// The name of mm `id` in messages: its first task's.
fn mm_name(m: &crate::Machine, id: MmId) -> String {
    m.tasks_of(id)
        .next()
        .map_or(format!("mm {id}"), str::to_string)
}

/// The reverse map of large folios and the anon_vma tree: see the module
/// doc. `placed` is every mapping of a page of a large folio found in the
/// page tables.
fn check_anon_vmas(
    model: &Model,
    folios: &BTreeSet<Pfn>,
    placed: &[(MmId, Pfn, u64)],
    bad: &mut Vec<String>,
) {
    let m = &model.machine;
    let mut tree = Vec::new();
    for &(mm, page, addr) in placed {
        let folio = page_folio(m, page);
        let ext = m.zone.memmap.folio_ext(folio);
        let expected = (ext.index + (page.0 - folio.0)) * PAGE_SIZE;
        if addr != expected {
            bad.push(format!(
                "{page} is mapped at {addr:#x} but its folio's index puts it at {expected:#x}"
            ));
        }
        m.anon_vmas.tree(ext.anon_vma, &mut tree);
        if !tree.contains(&mm) {
            bad.push(format!(
                "{folio} is mapped by mm {mm}, which an rmap walk from its anon_vma {} misses",
                ext.anon_vma
            ));
        }
    }
    let mut folios_of: BTreeMap<MmId, u64> = BTreeMap::new();
    for &folio in folios {
        if m.zone.memmap.page(folio).order() > 0 {
            *folios_of
                .entry(m.zone.memmap.folio_ext(folio).anon_vma)
                .or_default() += 1;
        }
    }
    let live: BTreeSet<MmId> = m.tasks.values().map(|t| t.mm).collect();
    let mut ids: Vec<MmId> = live.iter().copied().collect();
    ids.extend(folios_of.keys());
    ids.sort_unstable();
    ids.dedup();
    for id in ids {
        let Some(av) = m.anon_vmas.get(id) else {
            bad.push(format!("anon_vma {id} is in use but was freed"));
            continue;
        };
        let found = folios_of.get(&id).copied().unwrap_or(0);
        if av.folios != found {
            bad.push(format!(
                "anon_vma {id} counts {} large folios but {found} point at it",
                av.folios
            ));
        }
        if av.mm_alive != live.contains(&id) {
            bad.push(format!(
                "anon_vma {id} says its mm is {} but it is {}",
                if av.mm_alive { "alive" } else { "gone" },
                if live.contains(&id) { "alive" } else { "gone" }
            ));
        }
        if let Some(p) = av.parent {
            if !m
                .anon_vmas
                .get(p)
                .is_some_and(|pa| pa.children.contains(&id))
            {
                bad.push(format!(
                    "anon_vma {id} is not among its parent {p}'s children"
                ));
            }
        }
    }
}

/// The invariants of one large folio's MM-ID slots and deferred-split state;
/// `mms` are its mappings by each MM.
fn check_large_folio(
    model: &Model,
    folio: Pfn,
    mms: &BTreeMap<MmId, u64>,
    queue: &BTreeSet<Pfn>,
    bad: &mut Vec<String>,
) {
    let m = &model.machine;
    match m.folio_mm_ids.get(&folio) {
        Some(ids) => {
            for slot in 0..2 {
                let id = ids.mm_id[slot];
                let found = mms.get(&id).copied().unwrap_or(0);
                // It may count fewer: mappings an MM added while no slot
                // was free are never counted (the kernel's "valid corner
                // cases" in folio_sub_return_large_mapcount); never more.
                if id != MM_ID_DUMMY && ids.mapcount[slot] > found {
                    bad.push(format!(
                        "{folio}: MM-ID slot {slot} says mm {id} maps it {} times, but it does {found} times",
                        ids.mapcount[slot]
                    ));
                }
            }
            if mms.len() > 1 && !ids.shared {
                bad.push(format!(
                    "{folio}: mapped by {} MMs but not marked shared",
                    mms.len()
                ));
            }
        }
        None if mms.len() > 1 => bad.push(format!(
            "{folio}: mapped by {} MMs but has no MM-ID slots",
            mms.len()
        )),
        None => {}
    }
    let head = m.zone.memmap.page(folio);
    let queued = queue.contains(&folio);
    if queued != head.test(pg::DEFERRED) {
        bad.push(format!(
            "{folio}: deferred-split flag {} but {} the queue",
            head.test(pg::DEFERRED),
            if queued { "on" } else { "not on" }
        ));
    }
    if head.test(pg::PARTIALLY_MAPPED) {
        let nr = 1u32 << head.order();
        let entire = rmap::folio_entire_mapcount(m, folio);
        if !queued || entire > 0 || rmap::folio_nr_pages_mapped(m, folio) >= nr {
            bad.push(format!(
                "{folio}: flagged partially mapped, but queued {queued}, {entire} PMD mappings, {} of {nr} pages mapped",
                rmap::folio_nr_pages_mapped(m, folio)
            ));
        }
    }
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
        let pfn = match model
            .machine
            .mm_of("a")
            .unwrap()
            .pmds
            .range(0..=u64::MAX)
            .next()
        {
            Some((_, Pmd::Table(t))) => t.ptes.iter().find_map(|p| p.pfn()).unwrap(),
            _ => panic!("a has a PTE table"),
        };
        model.machine.zone.memmap.page_mut(Pfn(pfn.0 + 1)).mapcount += 1;
        assert_caught(&model, "mapcount 3 but 2 PTEs map it");
    }

    fn assert_caught(model: &Model, needle: &str) {
        let broken = check(model);
        assert!(broken.iter().any(|b| b.contains(needle)), "{broken:?}");
    }

    #[test]
    fn a_folio_mapped_by_two_mms_but_not_marked_shared_is_caught() {
        let mut model = forked_64k();
        let ids = model.machine.folio_mm_ids.values_mut().next();
        ids.expect("the 64K folio is mapped by a and b").shared = false;
        assert_caught(&model, "mapped by 2 MMs but not marked shared");
    }

    /// The forked 64K folio's `FolioExt`, broken by `corrupt`, is caught
    /// with a message holding `needle`.
    fn assert_ext_corruption_caught(corrupt: fn(&mut crate::mm_types::FolioExt), needle: &str) {
        let mut model = forked_64k();
        let folio = model.machine.folio_mm_ids.keys().next().copied();
        corrupt(
            model
                .machine
                .zone
                .memmap
                .folio_ext_mut(folio.expect("shared 64K folio")),
        );
        assert_caught(&model, needle);
    }

    #[test]
    fn a_folio_index_that_misplaces_its_pages_is_caught() {
        assert_ext_corruption_caught(|e| e.index += 16, "but its folio's index puts it at");
    }

    #[test]
    fn a_wrong_large_mapcount_is_caught() {
        assert_ext_corruption_caught(|e| e.large_mapcount += 1, "_large_mapcount");
    }

    #[test]
    fn a_folio_pointing_at_the_wrong_anon_vma_is_caught() {
        // The child's anon_vma: an rmap walk from it misses the parent.
        assert_ext_corruption_caught(|e| e.anon_vma += 1, "an rmap walk from its anon_vma");
    }

    #[test]
    fn with_checks_a_broken_invariant_fails_the_next_statement() {
        let mut model = forked_64k().with_invariant_checks();
        let w = parse("t.hlw", "spawn a\na mmap buf 64K\na read buf:4K\n").unwrap();
        model.execute(&w.stmts[2]).unwrap();
        let queued = crate::mm_types::Pfn(1);
        model.machine.deferred_split_queue.add_tail(queued);
        let err = model.execute(&w.stmts[2]).unwrap_err();
        assert!(
            err.message.contains("model invariant broken"),
            "{}",
            err.message
        );
        assert!(
            err.message.contains("deferred split queue"),
            "{}",
            err.message
        );
    }
}
